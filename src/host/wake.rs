//! The post-copy thread's wake-ups: eventfds (the installer's results, the
//! hypervisor's fetch requests) and the epoll set of them and the
//! userfaultfd, the one extra fd the link's wait watches.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::{Error, ErrorKind, Result};

/// A non-blocking eventfd.
pub(crate) struct EventFd(OwnedFd);

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

/// An epoll set of `fds` (readable), itself readable while any of them is.
pub(crate) fn epoll_of(fds: &[RawFd]) -> Result<OwnedFd> {
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
