//! A connection's pollable readiness: an eventfd that the engine keeps
//! readable exactly while the connection has something for the hypervisor
//! (level-triggered), so an event loop (QEMU's main loop, epoll) can wait on
//! it instead of blocking a thread in `get` or `wait_iteration`.
//!
//! What "something" is belongs to each side (`Destination::event_fd`,
//! `Source::event_fd`); this type only mirrors a boolean the side computes
//! under its own lock, so the fd never disagrees with the state once that
//! lock is released.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use parking_lot::Mutex;

use crate::{Error, ErrorKind, Result};

/// An eventfd readable while [`Readiness::set`] was last given `true`.
pub(crate) struct Readiness {
    fd: OwnedFd,
    /// Whether the eventfd's counter is non-zero. A mutex, not an atomic, so
    /// that the flag and the counter change together whatever the caller's
    /// locking.
    ready: Mutex<bool>,
}

impl Readiness {
    pub fn new() -> Result<Readiness> {
        // Non-blocking: the engine's write and read must never wait (they
        // cannot anyway: the counter only ever goes between 0 and 1).
        // SAFETY: eventfd takes no pointers; the result is checked.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::new(ErrorKind::State, format!("cannot create the connection's event fd: {e}")));
        }
        // SAFETY: `raw` is a new file descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Readiness { fd, ready: Mutex::new(false) })
    }

    /// Makes the fd readable (`true`) or not (`false`); a no-op when it is already so.
    pub fn set(&self, ready: bool) {
        let mut now = self.ready.lock();
        if *now == ready {
            return;
        }
        let mut counter: u64 = 1;
        let buf = std::ptr::addr_of_mut!(counter).cast::<libc::c_void>();
        // An eventfd reads and writes exactly 8 bytes. Neither fails here: a
        // write of 1 to a zero counter cannot overflow, and a read is made only
        // when the counter is 1 (a read resets it to 0).
        // SAFETY: `buf` points to 8 writable bytes that live across the call.
        let n = unsafe {
            if ready {
                libc::write(self.fd.as_raw_fd(), buf, 8)
            } else {
                libc::read(self.fd.as_raw_fd(), buf, 8)
            }
        };
        debug_assert_eq!(n, 8, "eventfd {}: {}", if ready { "write" } else { "read" }, std::io::Error::last_os_error());
        *now = ready;
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(r: &Readiness) -> bool {
        let mut p = libc::pollfd { fd: r.fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; timeout 0 never waits.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        assert!(n >= 0);
        n == 1 && p.revents & libc::POLLIN != 0
    }

    #[test]
    fn the_fd_follows_the_last_set() {
        let r = Readiness::new().unwrap();
        assert!(!readable(&r));
        r.set(true);
        assert!(readable(&r));
        r.set(true);
        assert!(readable(&r), "a second set(true) keeps it readable");
        r.set(false);
        assert!(!readable(&r));
        r.set(false);
        assert!(!readable(&r));
        r.set(true);
        assert!(readable(&r));
    }
}
