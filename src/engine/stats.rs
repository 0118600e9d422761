//! Per-connection counters, updated by the engine thread and read by anyone.
//!
//! The field list, with each field's doc, is written once: the C ABI's
//! `rdmamig_stats` struct (src/ffi/stats.rs), which cbindgen turns into the
//! header. build.rs generates `stats_fields!` from it, which generates
//! [`Stats`], [`Counters`] and the snapshot here, and the C ABI's fill code
//! (new fields go at the end: the C struct is versioned by size).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

// `stats_fields!(callback)`: calls `callback!` with `#[doc = ...] name,` per
// counter, in order.
include!(concat!(env!("OUT_DIR"), "/stats_fields.rs"));

macro_rules! define_stats {
    ($($(#[$doc:meta])* $field:ident,)*) => {
        /// A snapshot of a connection's counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[$doc])* pub $field: u64,)*
        }

        /// The live counters behind [`Stats`].
        #[derive(Debug, Default)]
        pub struct Counters {
            $(pub $field: AtomicU64,)*
        }

        impl Counters {
            pub fn snapshot(&self) -> Stats {
                Stats { $($field: self.$field.load(Relaxed),)* }
            }
        }

        /// Number of fields in [`Stats`].
        pub const STATS_FIELDS: usize = [$(stringify!($field)),*].len();
    };
}

stats_fields!(define_stats);

/// `stats_fields!(callback)` calls `callback!` with the list of fields, in order.
pub(crate) use stats_fields;

impl Counters {
    /// Counters of a new connection: the gauges that mean "none" start at u64::MAX.
    pub fn new() -> Self {
        let c = Counters::default();
        c.pin_budget.store(u64::MAX, Relaxed);
        c.cgroup_memory_limit.store(u64::MAX, Relaxed);
        c
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub fn set(counter: &AtomicU64, n: u64) {
        counter.store(n, Relaxed);
    }

    pub fn pin(&self, bytes: u64) {
        let now = self.pinned_bytes.fetch_add(bytes, Relaxed) + bytes;
        self.pinned_bytes_peak.fetch_max(now, Relaxed);
    }

    pub fn unpin(&self, bytes: u64) {
        self.pinned_bytes.fetch_sub(bytes, Relaxed);
    }
}
