//! The file descriptors of verbs objects (event and completion channels):
//! non-blocking mode, and waiting for them to become readable.

use super::error::last_errno;
use super::{Result, VerbsError};

/// Set O_NONBLOCK on a file descriptor owned by a verbs object.
pub(crate) fn set_nonblocking(fd: libc::c_int, op: &'static str) -> Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory is passed.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(VerbsError::last(op));
        }
    }
    Ok(())
}

/// Waits until `a` or `b` is readable (or `deadline` passes): which of them are.
pub(crate) fn poll_readable_either(
    a: libc::c_int,
    b: libc::c_int,
    deadline: Option<std::time::Instant>,
) -> Result<(bool, bool)> {
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let rem = d.saturating_duration_since(std::time::Instant::now());
                let ms = rem.as_millis() + u128::from(rem.subsec_nanos() % 1_000_000 != 0);
                ms.min(i32::MAX as u128) as i32
            }
        };
        let mut pfd = [
            libc::pollfd { fd: a, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: b, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two valid pollfds.
        let rc = unsafe { libc::poll(pfd.as_mut_ptr(), 2, timeout_ms) };
        if rc >= 0 {
            let ready = (pfd[0].revents != 0, pfd[1].revents != 0);
            if rc > 0 || timeout_ms == 0 || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(ready);
            }
            continue;
        }
        let e = last_errno();
        if e != libc::EINTR {
            return Err(VerbsError::new("poll", e));
        }
    }
}
/// poll(2) one fd for POLLIN until `deadline` (None = forever). Ok(true) when
/// readable (or in error/hangup state: the following read will say why),
/// Ok(false) when the deadline passed. EINTR is retried.
pub(crate) fn poll_readable(fd: libc::c_int, deadline: Option<std::time::Instant>) -> Result<bool> {
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let now = std::time::Instant::now();
                if now >= d {
                    0
                } else {
                    // Round up so we never wake just before the deadline and spin.
                    let rem = d - now;
                    let ms = rem.as_millis() + u128::from(rem.subsec_nanos() % 1_000_000 != 0);
                    ms.min(i32::MAX as u128) as i32
                }
            }
        };
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc > 0 {
            return Ok(true);
        }
        if rc == 0 {
            if timeout_ms == 0 || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(false);
            }
            continue;
        }
        let e = last_errno();
        if e != libc::EINTR {
            return Err(VerbsError::new("poll", e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_times_out() {
        let mut fds = [0; 2];
        // SAFETY: two ints for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let t = std::time::Instant::now();
        let d = t + std::time::Duration::from_millis(30);
        assert!(!poll_readable(fds[0], Some(d)).unwrap());
        assert!(t.elapsed() >= std::time::Duration::from_millis(30));
        // SAFETY: one byte from a static.
        assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
        assert!(poll_readable(fds[0], None).unwrap());
        // SAFETY: the pipe made above, closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
