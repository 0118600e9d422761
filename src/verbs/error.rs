//! The error of every verbs/rdma_cm call: the C function and its errno.

use std::fmt;

/// A failed verbs/rdma_cm call: which function, and the errno it reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VerbsError {
    /// The C function that failed, e.g. `"ibv_reg_mr"`.
    pub op: &'static str,
    /// The errno value (always positive).
    pub errno: i32,
}

impl VerbsError {
    pub fn new(op: &'static str, errno: i32) -> Self {
        VerbsError { op, errno }
    }

    /// The error of a call that failed with -1/NULL and set `errno`.
    pub(crate) fn last(op: &'static str) -> Self {
        VerbsError::new(op, last_errno())
    }

    /// Normalise a return value of a call that returns an errno directly:
    /// providers return a positive errno, some a negative one, some -1 with
    /// `errno` set.
    pub(crate) fn from_ret(op: &'static str, ret: i32) -> Self {
        let errno = match ret {
            -1 => last_errno(),
            r if r < 0 => -r,
            r => r,
        };
        VerbsError::new(op, errno)
    }

    /// No RDMA device (none present, or the named one was not found).
    pub fn is_no_device(&self) -> bool {
        self.errno == libc::ENODEV
    }

    /// `ENOMEM` from a post: the send (or receive) queue is full. Poll for
    /// completions and post again.
    pub fn is_queue_full(&self) -> bool {
        self.errno == libc::ENOMEM
    }

    /// The errno as a `std::io::Error`.
    pub fn to_io_error(self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.errno)
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (errno {})", self.op, strerror(self.errno), self.errno)
    }
}

impl std::error::Error for VerbsError {}

impl From<VerbsError> for std::io::Error {
    fn from(e: VerbsError) -> Self {
        std::io::Error::new(e.to_io_error().kind(), e)
    }
}

pub type Result<T> = std::result::Result<T, VerbsError>;

/// The current thread's errno; never 0 (EIO instead), so an error always has a cause.
pub(crate) fn last_errno() -> i32 {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(0) | None => libc::EIO,
        Some(e) => e,
    }
}

fn strerror(errno: i32) -> String {
    let mut buf = [0 as libc::c_char; 128];
    // SAFETY: buf is writable for buf.len() bytes; the libc crate binds the
    // XSI strerror_r, which NUL-terminates on success.
    let rc = unsafe { libc::strerror_r(errno, buf.as_mut_ptr(), buf.len()) };
    if rc != 0 {
        return format!("Unknown error {errno}");
    }
    // SAFETY: NUL-terminated by strerror_r.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_display() {
        let e = VerbsError::new("ibv_reg_mr", libc::ENOMEM);
        assert_eq!(e.to_string(), "ibv_reg_mr: Cannot allocate memory (errno 12)");
        assert!(e.is_queue_full());
        assert!(!e.is_no_device());
        assert!(VerbsError::new("x", libc::ENODEV).is_no_device());
        let io: std::io::Error = e.into();
        assert_eq!(io.raw_os_error(), None);
        assert!(io.to_string().contains("ibv_reg_mr"));
    }

    #[test]
    fn from_ret_normalises() {
        assert_eq!(VerbsError::from_ret("x", libc::ENOMEM).errno, libc::ENOMEM);
        assert_eq!(VerbsError::from_ret("x", -libc::EINVAL).errno, libc::EINVAL);
    }
}
