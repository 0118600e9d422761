//! The destination's installer thread: `UFFDIO_COPY` of the background
//! pull's completed reads, so that the post-copy thread goes on posting
//! reads meanwhile (on rxe both cost CPU: about 0.6 ms to post a 64 KiB
//! read, 0.1–0.3 ms to install it; the two now run on two CPUs). Fault
//! reads are still installed by the post-copy thread itself (a faulting
//! vCPU waits for that install, and a hand-over would add a wake-up), and
//! so are background reads that complete while faults are recent: then a
//! second busy thread would compete with the fault path for a CPU (on the
//! 2-CPU rxe guest it made the fault p99 3 × worse).
//!
//! One job per completed pull slot; the slot's staging memory belongs to
//! the installer from the job until its result comes back. Results wake the
//! post-copy thread through an eventfd in the epoll set it waits on.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc::{Receiver, Sender};

use super::uffd::{Installed, Userfault};
use crate::{Error, ErrorKind, Result};

/// Pages to install from a pull slot: runs of (destination address,
/// staging address, bytes).
pub(super) struct Job {
    pub slot: usize,
    pub runs: Vec<(u64, *const u8, u64)>,
}

// SAFETY: the staging addresses point into the post-copy thread's staging
// buffer, whose slot `slot` nobody reads or writes until this job's result
// is back (the post-copy thread only reuses a slot after that), and which
// outlives the installer (joined first: `std::thread::scope`).
unsafe impl Send for Job {}

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
            // SAFETY: see `Job`; `dst` lies in a block registered with `uffd`.
            match unsafe { uffd.copy(dst, src, len, page) } {
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

/// A non-blocking eventfd.
pub(super) struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> Result<EventFd> {
        // SAFETY: flags only; a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(os_error("eventfd"));
        }
        // SAFETY: a new fd owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    pub fn signal(&self) {
        let one = 1u64;
        // SAFETY: 8 bytes from a live u64 (a full counter is not possible here).
        unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter (no-op when it is zero).
    pub fn drain(&self) {
        let mut n = 0u64;
        // SAFETY: 8 bytes into a live u64; EAGAIN when zero.
        unsafe { libc::read(self.fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

/// An epoll set of `fds` (readable), itself readable while any of them is:
/// the one extra fd the link's wait watches.
pub(super) fn epoll_of(fds: &[RawFd]) -> Result<OwnedFd> {
    // SAFETY: flags only; a new fd or -1.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(os_error("epoll_create1"));
    }
    // SAFETY: a new fd owned by nobody else.
    let ep = unsafe { OwnedFd::from_raw_fd(ep) };
    for &fd in fds {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
        // SAFETY: live fds and a valid event.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            return Err(os_error("epoll_ctl"));
        }
    }
    Ok(ep)
}

fn os_error(what: &str) -> Error {
    Error::new(ErrorKind::Verbs, format!("{what}: {}", std::io::Error::last_os_error()))
}
