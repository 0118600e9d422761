//! The hypervisor's page requests during post-copy, handed from its threads
//! to the post-copy thread.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;

use parking_lot::Mutex;

use crate::host::wake::EventFd;
use crate::Result;

/// Pages the hypervisor asks for before anything here faults on them
/// ([`Destination::postcopy_fetch`](crate::engine::Destination::postcopy_fetch)),
/// handed to the post-copy thread, which watches `wake`.
pub(crate) struct Fetches {
    queue: Mutex<Vec<Fetch>>,
    /// Requests pushed since the last `take`: spares the post-copy loop a
    /// system call and a lock per pass when there are none (nearly always).
    queued: AtomicUsize,
    wake: EventFd,
}

/// One request: `len` bytes at `offset` of RAM block `block` (its index in
/// the registry); `done` gets `()` once none of its pages is stale (dropped
/// unanswered if post-copy fails).
pub(crate) struct Fetch {
    pub block: usize,
    pub offset: u64,
    pub len: u64,
    pub done: SyncSender<()>,
}

impl Fetches {
    pub fn new() -> Result<Fetches> {
        Ok(Fetches { queue: Mutex::new(Vec::new()), queued: AtomicUsize::new(0), wake: EventFd::new()? })
    }

    /// Queue, signal, then count: a signal `take` has not drained belongs to
    /// a request counted after it, so the eventfd never stays readable with
    /// nothing counted (the loop would spin).
    pub fn push(&self, fetch: Fetch) {
        self.queue.lock().push(fetch);
        self.wake.signal();
        self.queued.fetch_add(1, Ordering::Release);
    }

    /// Moves the requests queued so far into `into`: the count is reset
    /// first, then the eventfd, then the queue is taken, so a request whose
    /// signal this drains is in the queue taken.
    pub fn take(&self, into: &mut Vec<Fetch>) {
        if self.queued.load(Ordering::Acquire) == 0 {
            return;
        }
        self.queued.store(0, Ordering::SeqCst);
        self.wake.drain();
        into.append(&mut self.queue.lock());
    }

    /// Whether requests were pushed since the last `take`.
    pub fn any(&self) -> bool {
        self.queued.load(Ordering::Acquire) != 0
    }

    pub fn fd(&self) -> RawFd {
        self.wake.fd()
    }
}
