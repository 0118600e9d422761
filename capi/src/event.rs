//! Event-loop integration: `rdmamig_conn_event_fd` and
//! `rdmamig_listener_event_fd`, for the calls made with `RDMAMIG_NO_WAIT` (`wait.rs`).

use std::os::fd::AsRawFd;
use std::os::raw::c_int;

use super::args::{handle, out_ref};
use super::conn::{rdmamig_conn, run};
use super::last_error::record;
use super::listener::rdmamig_listener;
use super::status::rdmamig_status;

/// Stores in `*fd_out` a file descriptor for an event loop to poll
/// (`POLLIN` / `EPOLLIN`) instead of blocking in the connection's calls.
/// It is level-triggered: readable exactly while the connection has
/// something for the caller, and the library changes it only together with
/// what the calls below report, so a loop is never woken for nothing and
/// never misses a change.
///
/// A destination's fd is readable while at least one of these holds:
/// - stream bytes wait to be read: until `rdmamig_conn_get` has taken the
///   last of them;
/// - an iteration window completed that no `rdmamig_conn_wait_iteration`
///   call has returned yet: until one returns a count that includes it
///   (`rdmamig_conn_wait_iteration(conn, 0, RDMAMIG_NO_WAIT, &done)` always
///   succeeds and does);
/// - the connection has ended (completed, unverified or failed): for good.
///
/// A source's fd is readable once the connection has failed (the
/// destination's error, a disconnect, the liveness check,
/// `rdmamig_conn_abort`), for good, and never before: every call then
/// returns the error. (An rdmamig source has nothing to read: it opens no
/// return path.)
///
/// The loop of a destination, when the fd is readable: call
/// `rdmamig_conn_get(conn, buf, len, RDMAMIG_NO_WAIT, &n)` until it returns
/// `RDMAMIG_ERR_WOULD_BLOCK` (or how the connection ended), then
/// `rdmamig_conn_wait_iteration(conn, 0, RDMAMIG_NO_WAIT, &done)`, then poll
/// again. None of these calls waits.
///
/// The fd belongs to the connection (an eventfd): do not read, write or
/// close it. It is the same fd on every call and stays valid until
/// `rdmamig_conn_close` or `rdmamig_conn_free`; remove it from an epoll set
/// before either (closing it removes it from sets it was added to). It is
/// close-on-exec.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER`; `RDMAMIG_ERR_STATE`
/// after `rdmamig_conn_close`. `*fd_out` is written only on success.
///
/// Thread safety: may run concurrently with other `const` uses of `conn`;
/// any thread may poll the fd.
#[no_mangle]
pub extern "C" fn rdmamig_conn_event_fd(conn: *const rdmamig_conn, fd_out: *mut c_int) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_event_fd";
        run(conn, F, |c| {
            let fd_out = out_ref(fd_out, F, "fd_out")?;
            *fd_out = c.event_fd(F)?.as_raw_fd();
            Ok(())
        })
    }
}

/// Stores in `*fd_out` a file descriptor for an event loop to poll
/// (`POLLIN` / `EPOLLIN`) instead of blocking in `rdmamig_listener_accept`:
/// readable while a source's connection request waits to be accepted
/// (level-triggered). Then `rdmamig_listener_accept(listener, ram,
/// RDMAMIG_NO_WAIT, &conn)` takes it; it returns `RDMAMIG_ERR_WOULD_BLOCK`
/// when there was none after all (another thread took it), or when the
/// request it took was refused (allow-list, authentication: the refusal is
/// logged, see `rdmamig_set_log_callback`). Another event of the listening
/// endpoint (a device removal) fails the accept with `RDMAMIG_ERR_CONNECT`.
///
/// The fd belongs to the listener: do not read, write or close it. It is the
/// same fd on every call and stays valid until `rdmamig_listener_free`.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER`. `*fd_out` is written
/// only on success.
///
/// Thread safety: may run concurrently with other `const` uses of
/// `listener`; any thread may poll the fd.
#[no_mangle]
pub extern "C" fn rdmamig_listener_event_fd(listener: *const rdmamig_listener, fd_out: *mut c_int) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_listener_event_fd";
        record(|| {
            let listener = handle(listener, F, "listener")?;
            *out_ref(fd_out, F, "fd_out")? = listener.event_fd().as_raw_fd();
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::{null, null_mut};

    #[test]
    fn event_fd_of_null_fails_and_writes_nothing() {
        let mut fd = -7;
        assert_eq!(rdmamig_conn_event_fd(null(), &mut fd), rdmamig_status::RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_event_fd(null(), null_mut()), rdmamig_status::RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(fd, -7, "not written on failure");
    }
}
