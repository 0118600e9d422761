//! Per-connection counters, updated by the engine thread and read by anyone.
//!
//! The field list is written once, in `stats_fields!`: it generates
//! [`Stats`], [`Counters`] and the snapshot, and the C ABI's fill code takes
//! its list from `stats_fields!` too (new fields go at
//! the end: the C struct is versioned by size).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! stats_fields {
    ($callback:ident) => {
        $callback! {
            /// Bytes of guest RAM written with RDMA WRITE (source).
            bytes_written,
            /// 1 MiB chunks registered for remote access: asked for (source) or served (destination).
            chunks_registered,
            /// All-zero ranges sent (source) or applied (destination) as COMPRESS instead of written.
            zero_chunks,
            /// REGISTER_REQUEST/RESULT round trips (one per message, however many chunks it carries).
            registration_round_trips,
            /// Bytes of guest memory registered (pinned) by this side now.
            pinned_bytes,
            /// The most bytes of guest memory this side had registered at once.
            pinned_bytes_peak,
            /// Control messages sent and received, READY included.
            control_messages,
            /// Completed iteration windows (REGISTER_FINISHED sent or received).
            iterations,
            /// Total time spent inside `iteration_end`, in nanoseconds (source).
            iteration_end_ns,
            /// Device-state stream bytes sent (source) or received (destination).
            stream_bytes,
            /// The pin budget this side keeps `pinned_bytes` under (u64::MAX: unlimited).
            pin_budget,
            /// The memory limit of this process's cgroup (u64::MAX: none or unknown).
            cgroup_memory_limit,
            /// Registrations this side dropped to stay under a pin budget (source:
            /// chunks unpinned here, with the destination's registration if it can
            /// unregister; destination: registrations the source unregistered).
            unpins,
            /// Of those, registrations of ranges the hypervisor hinted "cold".
            unpins_cold,
            /// Registrations retried after the kernel refused them (ENOMEM, EPERM).
            registration_retries,
            /// Time spent waiting for pinned memory to be released before a
            /// registration could fit the budget, in nanoseconds.
            pin_wait_ns,
            /// Registrations queued for the unregistration worker and not yet deregistered.
            unregister_queue_depth,
            /// How registered memory survives `fork()` (see `ForkMode`): 0 the kernel
            /// copies pinned pages for the child, 1 rdma-core's fork support is on,
            /// 2 neither (a forked child writing shared pages can corrupt transfers).
            fork_mode,
            /// Pin-all: bytes of guest RAM pre-faulted or registered so far.
            pin_all_progress_bytes,
            /// Source: bytes written through the staging buffer, from chunks not
            /// pinned because pinning would allocate or copy their pages.
            staged_bytes,
        }
    };
}

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
