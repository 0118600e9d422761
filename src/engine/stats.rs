//! Per-connection counters, updated by the engine thread and read by anyone.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of a connection's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of guest RAM written with RDMA WRITE (source).
    pub bytes_written: u64,
    /// 1 MiB chunks registered for remote access: asked for (source) or served (destination).
    pub chunks_registered: u64,
    /// All-zero ranges sent (source) or applied (destination) as COMPRESS instead of written.
    pub zero_chunks: u64,
    /// REGISTER_REQUEST/RESULT round trips (one per message, however many chunks it carries).
    pub registration_round_trips: u64,
    /// Bytes of memory pinned (registered) by this side now, and at most.
    pub pinned_bytes: u64,
    pub pinned_bytes_peak: u64,
    /// Control messages sent and received, READY included.
    pub control_messages: u64,
    /// Completed iteration windows (REGISTER_FINISHED sent or received).
    pub iterations: u64,
    /// Total time spent inside `iteration_end`, in nanoseconds (source).
    pub iteration_end_ns: u64,
    /// Device-state stream bytes sent (source) or received (destination).
    pub stream_bytes: u64,
}

/// The live counters behind [`Stats`].
#[derive(Debug, Default)]
pub struct Counters {
    pub bytes_written: AtomicU64,
    pub chunks_registered: AtomicU64,
    pub zero_chunks: AtomicU64,
    pub registration_round_trips: AtomicU64,
    pub pinned_bytes: AtomicU64,
    pub pinned_bytes_peak: AtomicU64,
    pub control_messages: AtomicU64,
    pub iterations: AtomicU64,
    pub iteration_end_ns: AtomicU64,
    pub stream_bytes: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub fn pin(&self, bytes: u64) {
        let now = self.pinned_bytes.fetch_add(bytes, Relaxed) + bytes;
        self.pinned_bytes_peak.fetch_max(now, Relaxed);
    }

    pub fn unpin(&self, bytes: u64) {
        self.pinned_bytes.fetch_sub(bytes, Relaxed);
    }

    pub fn snapshot(&self) -> Stats {
        Stats {
            bytes_written: self.bytes_written.load(Relaxed),
            chunks_registered: self.chunks_registered.load(Relaxed),
            zero_chunks: self.zero_chunks.load(Relaxed),
            registration_round_trips: self.registration_round_trips.load(Relaxed),
            pinned_bytes: self.pinned_bytes.load(Relaxed),
            pinned_bytes_peak: self.pinned_bytes_peak.load(Relaxed),
            control_messages: self.control_messages.load(Relaxed),
            iterations: self.iterations.load(Relaxed),
            iteration_end_ns: self.iteration_end_ns.load(Relaxed),
            stream_bytes: self.stream_bytes.load(Relaxed),
        }
    }
}
