//! Error messages for C: the thread-local last error (`rdmamig_last_error_message`)
//! and the [`Failure`] plumbing the functions use to record a message before
//! returning its status. Every exported function's body (inside
//! `ffi_boundary!`) is a closure returning `Result<T, Failure>`, run by
//! [`record`] (no handle), [`record_or`] (a function returning a value rather
//! than a status) or by the connection's own recorder (`conn.rs`), which keep
//! the message and return the status. Its arguments are checked first
//! (`args`).

use std::cell::RefCell;
use std::os::raw::c_char;

use super::buffer::copy_to_c_buf;
use super::status::rdmamig_status;
use rdmamig::Error;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Makes `message` this thread's last error message.
pub(crate) fn set_last_error(message: &str) {
    LAST_ERROR.with(|last| {
        let mut last = last.borrow_mut();
        last.clear();
        last.push_str(message);
    });
}

/// A failed call: the status to return and the message to keep.
#[derive(Debug)]
pub(crate) struct Failure {
    pub status: rdmamig_status,
    pub message: String,
}

impl Failure {
    pub fn new(status: rdmamig_status, message: impl Into<String>) -> Self {
        Failure { status, message: message.into() }
    }

    /// `RDMAMIG_ERR_NULL_PARAMETER`: "`func`: `arg` is NULL".
    pub fn null(func: &str, arg: &str) -> Self {
        Self::new(rdmamig_status::RDMAMIG_ERR_NULL_PARAMETER, format!("{func}: {arg} is NULL"))
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(rdmamig_status::RDMAMIG_ERR_INVALID_ARGUMENT, message)
    }

    /// Keeps the message as this thread's last error; returns the status.
    /// Keeps the message as this thread's last error, unless the status is
    /// no failure (`RDMAMIG_ERR_WOULD_BLOCK`: the last failure stays).
    pub fn record(self) -> rdmamig_status {
        if self.is_failure() {
            set_last_error(&self.message);
        }
        self.status
    }

    pub fn is_failure(&self) -> bool {
        self.status != rdmamig_status::RDMAMIG_ERR_WOULD_BLOCK
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure { status: e.kind.into(), message: e.message }
    }
}

/// Runs `body`; on failure keeps its message as this thread's last error.
/// Returns the status (`RDMAMIG_OK`, or what `body` returned, on success).
pub(crate) fn record<S: Into<rdmamig_status>>(body: impl FnOnce() -> Result<S, Failure>) -> rdmamig_status {
    match body() {
        Ok(s) => s.into(),
        Err(f) => f.record(),
    }
}

/// [`record`] for a function that returns a value instead of a status:
/// `failed` (its documented NULL / 0 / false) on failure.
pub(crate) fn record_or<T>(failed: T, body: impl FnOnce() -> Result<T, Failure>) -> T {
    body().unwrap_or_else(|f| {
        f.record();
        failed
    })
}

/// Copies the message of the last call made on this thread that failed into
/// `buf` (of `len` bytes), `snprintf`-style: always NUL-terminated (when
/// `len > 0`), truncated if needed, and returns the full length of the
/// message, not counting the NUL. `(NULL, 0)` asks for the length.
///
/// Every failing call sets it (`rdmamig_config_*`, `rdmamig_device_probe`,
/// `rdmamig_ram_*`, `rdmamig_listener_*`, `rdmamig_connect`,
/// `rdmamig_conn_*`, the stream callbacks), including calls that fail for a
/// NULL argument and those that return NULL / 0 for it; the failures that
/// have no connection to keep their message (all but `rdmamig_conn_*`)
/// have only this. A
/// successful call does not clear it, like `errno`. Returns 0 (an empty
/// message) if no call on this thread has failed yet. A panic
/// (`RDMAMIG_ERR_PANIC`) does not set it: its message goes to stderr.
///
/// Thread-safe: each thread has its own last error.
#[no_mangle]
pub extern "C" fn rdmamig_last_error_message(buf: *mut c_char, len: usize) -> usize {
    ffi_boundary! {
        LAST_ERROR.with(|last| copy_to_c_buf(&last.borrow(), buf, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmamig::ErrorKind;

    fn last() -> String {
        let n = rdmamig_last_error_message(std::ptr::null_mut(), 0);
        let mut buf = vec![0 as c_char; n + 1];
        assert_eq!(rdmamig_last_error_message(buf.as_mut_ptr(), buf.len()), n);
        let bytes: Vec<u8> = buf[..n].iter().map(|&c| c as u8).collect();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn record_keeps_the_message_per_thread() {
        assert_eq!(record(|| Ok(())), rdmamig_status::RDMAMIG_OK);
        let s = record(|| Err::<(), _>(Failure::null("rdmamig_x", "out")));
        assert_eq!(s, rdmamig_status::RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(last(), "rdmamig_x: out is NULL");
        assert_eq!(record(|| Ok(())), rdmamig_status::RDMAMIG_OK);
        assert_eq!(last(), "rdmamig_x: out is NULL", "success does not clear it");
        std::thread::spawn(|| assert_eq!(last(), "")).join().unwrap();
        let s = record(|| Err::<(), _>(Error::new(ErrorKind::Timeout, "slow").into()));
        assert_eq!((s, last().as_str()), (rdmamig_status::RDMAMIG_ERR_TIMEOUT, "slow"));
        // A function returning a value gives its "nothing" and keeps the message too.
        assert_eq!(record_or(7u32, || Ok(3)), 3);
        assert_eq!(record_or(0u32, || Err(Failure::invalid("rdmamig_y: bad"))), 0);
        assert_eq!(last(), "rdmamig_y: bad");
    }
}
