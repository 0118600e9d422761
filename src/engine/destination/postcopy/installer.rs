//! The destination's installer thread: `UFFDIO_COPY` of the background
//! pull's completed reads, so that the post-copy thread goes on posting
//! reads meanwhile (on rxe both cost CPU, posting a read more than installing
//! it; the two now run on two CPUs). Fault
//! reads are still installed by the post-copy thread itself (a faulting
//! vCPU waits for that install, and a hand-over would add a wake-up), and
//! so are background reads that complete while faults are recent: then a
//! second busy thread would compete with the fault path for a CPU (on the
//! 2-CPU rxe guest it made the fault p99 worse: docs/benchmarks.md).
//!
//! One job per completed pull slot; the slot's staging memory belongs to
//! the installer from the job until its result comes back. Results wake the
//! post-copy thread through an eventfd in the epoll set it waits on.

use std::sync::mpsc::{Receiver, Sender};

use crate::host::uffd::{Installed, Userfault};
use crate::host::wake::EventFd;
use crate::Result;

/// Pages to install from a pull slot: runs of (destination address,
/// staging address, bytes). The staging addresses point into the post-copy
/// thread's staging buffer, whose slot `slot` nobody reads or writes until
/// this job's result is back (the post-copy thread only reuses a slot after
/// that), and which outlives the installer (joined first:
/// `std::thread::scope`).
pub(super) struct Job {
    pub slot: usize,
    pub runs: Vec<(u64, u64, u64)>,
}

/// A job's outcome: its slot, and the pages found present (not installed).
pub(super) struct Done {
    pub slot: usize,
    pub skipped: Result<u64>,
}

/// The installer's loop: until the job channel closes.
pub(super) fn run(uffd: &Userfault, page: u64, jobs: Receiver<Job>, done: Sender<Done>, wake: &EventFd) {
    for job in jobs {
        let mut skipped = Ok(0);
        for &(dst, src, len) in &job.runs {
            match uffd.copy(dst, src, len, page) {
                Ok(Installed::All) => {}
                Ok(Installed::Some { installed }) => {
                    skipped = skipped.map(|n| n + len / page - installed);
                }
                Err(e) => {
                    skipped = Err(e);
                    break;
                }
            }
        }
        if done.send(Done { slot: job.slot, skipped }).is_err() {
            return;
        }
        wake.signal();
    }
}
