//! Per-connection counters, updated by the engine thread and read by anyone.
//!
//! `stats_fields!` is the one list of the counters, each with its doc: it
//! makes [`Stats`], [`Counters`] and [`Stats::FIELDS`] here, and the C ABI
//! (capi/) generates its `rdmamig_stats` struct and fill code from
//! `Stats::FIELDS`. A new counter goes at the end of the list, and nowhere
//! else (the C struct is versioned by size).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// `stats_fields!(callback)` calls `callback!` with `#[doc = ...] name,` per
/// counter, in order: the one list of the counters.
macro_rules! stats_fields {
    ($callback:ident) => {
        $callback! {
            /// Bytes of guest RAM written with RDMA WRITE (source).
            bytes_written,
            /// 1 MiB chunks registered for remote access: asked for (source) or
            /// served (destination).
            chunks_registered,
            /// All-zero ranges sent (source) or applied (destination) as COMPRESS
            /// messages instead of being written.
            zero_chunks,
            /// REGISTER_REQUEST/RESULT round trips (one per message, however many
            /// chunks it carries); with pin-all, the RAM-blocks exchange, which
            /// registers every block.
            registration_round_trips,
            /// Bytes this side has registered (pinned) now, under its pin budget:
            /// guest memory, and its own staging and post-copy buffers.
            pinned_bytes,
            /// The most bytes this side had registered at once (as `pinned_bytes`).
            pinned_bytes_peak,
            /// Control messages sent and received, READY included.
            control_messages,
            /// Completed iteration windows (REGISTER_FINISHED sent or received).
            iterations,
            /// Total time spent inside `iteration_end` (`rdmamig_conn_iteration_end`),
            /// in nanoseconds (source).
            iteration_end_ns,
            /// Device-state stream bytes sent (source) or received (destination).
            stream_bytes,
            /// The pin budget this side keeps `pinned_bytes` under (the largest
            /// value, `UINT64_MAX`: unlimited; see `rdmamig_config_set_pin_budget`).
            pin_budget,
            /// The memory limit of this process's cgroup (the largest value,
            /// `UINT64_MAX`: none or unknown).
            cgroup_memory_limit,
            /// Registrations dropped to stay under a pin budget (source: chunks
            /// unpinned here, with the destination's registration when the peer is
            /// rdmamig; destination: registrations the source unregistered).
            unpins,
            /// Of those, registrations of ranges hinted cold (`RDMAMIG_HINT_COLD`).
            unpins_cold,
            /// Registrations retried after the kernel refused them (ENOMEM, EPERM).
            registration_retries,
            /// Time spent waiting for released memory to be deregistered before a
            /// registration fit the budget, in nanoseconds.
            pin_wait_ns,
            /// Registrations queued for the unregistration worker and not yet deregistered.
            unregister_queue_depth,
            /// How registered memory survives `fork()`: 0 the kernel copies pinned
            /// pages for the child (Linux >= 5.13), 1 rdma-core's fork support is on
            /// (`ibv_fork_init`), 2 neither: a forked child that shares registered
            /// pages can make transfers read stale memory.
            fork_mode,
            /// Pin-all: bytes of guest RAM pre-faulted or registered so far.
            pin_all_progress_bytes,
            /// Source: bytes written through the staging buffer, from chunks not
            /// pinned because pinning would allocate or copy their pages (never
            /// touched, the shared zero page, shared by KSM or with a forked child).
            staged_bytes,
        }
    };
}

macro_rules! define_stats {
    ($($(#[doc = $doc:literal])* $field:ident,)*) => {
        /// A snapshot of a connection's counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[doc = $doc])* pub $field: u64,)*
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

        impl Stats {
            /// Each counter's name and doc, in order (for interfaces that
            /// mirror [`Stats`], such as the C ABI's `rdmamig_stats`).
            pub const FIELDS: &'static [Field] = &[$(Field { name: stringify!($field), doc: concat!($($doc, "\n"),*) }),*];

            /// The counters' values, in the order of [`Stats::FIELDS`].
            pub fn values(&self) -> [u64; Self::FIELDS.len()] {
                [$(self.$field),*]
            }
        }
    };
}

stats_fields!(define_stats);

/// A counter of [`Stats`] or [`PostcopyProgress`](crate::PostcopyProgress): its name and doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub doc: &'static str,
}

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
