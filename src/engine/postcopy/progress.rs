//! Where a destination's post-copy is, and its counters.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Where a destination's post-copy is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PostcopyPhase {
    /// No POSTCOPY message yet.
    Idle = 0,
    /// The stale pages are dropped and faults are served: vCPUs may run.
    Running = 1,
    /// Every stale page is installed; POSTCOPY_DONE was sent.
    Done = 2,
}

/// A destination's post-copy progress ([`Destination::postcopy_progress`](crate::engine::Destination::postcopy_progress)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostcopyProgress {
    pub phase: PostcopyPhase,
    /// Stale pages announced by the source.
    pub pages_total: u64,
    /// Stale pages not installed yet.
    pub pages_remaining: u64,
    /// Faults served with a read of their own.
    pub faults_served: u64,
    /// Stale pages found present when they were to be installed (the guest
    /// or another install got there first): skipped, never overwritten.
    pub pages_skipped: u64,
    /// Bytes read from the source.
    pub bytes_pulled: u64,
    /// Lost connections post-copy got back (`Config::postcopy_recovery`).
    pub recoveries: u64,
}

/// The live counters behind [`PostcopyProgress`], updated by the post-copy thread.
#[derive(Default)]
pub(crate) struct Progress {
    phase: AtomicU8,
    pub pages_total: AtomicU64,
    pub pages_remaining: AtomicU64,
    pub faults_served: AtomicU64,
    pub pages_skipped: AtomicU64,
    pub bytes_pulled: AtomicU64,
    pub recoveries: AtomicU64,
}

impl Progress {
    pub fn snapshot(&self) -> PostcopyProgress {
        let phase = match self.phase.load(Ordering::Acquire) {
            0 => PostcopyPhase::Idle,
            1 => PostcopyPhase::Running,
            _ => PostcopyPhase::Done,
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PostcopyProgress {
            phase,
            pages_total: get(&self.pages_total),
            pages_remaining: get(&self.pages_remaining),
            faults_served: get(&self.faults_served),
            pages_skipped: get(&self.pages_skipped),
            bytes_pulled: get(&self.bytes_pulled),
            recoveries: get(&self.recoveries),
        }
    }

    pub(crate) fn set_phase(&self, p: PostcopyPhase) {
        self.phase.store(p as u8, Ordering::Release);
    }
}
