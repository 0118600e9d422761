//! Library-wide functions: version, status strings, the boundary self-test.

use super::status::rdmamig_status;
use std::os::raw::c_char;

/// The library version, NUL-terminated for C.
const VERSION_C: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// The version of the library actually loaded, as "MAJOR.MINOR.PATCH" (the same
/// numbers as the `RDMAMIG_VERSION_*` macros of the header it was built with).
///
/// The string is static: never free it. Thread-safe.
#[no_mangle]
pub extern "C" fn rdmamig_version() -> *const c_char {
    ffi_boundary! {
        VERSION_C.as_ptr().cast::<c_char>()
    }
}

/// A short static description of a status value, e.g. "timed out".
///
/// `status` is a `rdmamig_status` value; any number is accepted, and values
/// this library does not know give "unknown status". Never NULL. The string is
/// static: never free it. Thread-safe.
#[no_mangle]
pub extern "C" fn rdmamig_status_str(status: u32) -> *const c_char {
    ffi_boundary! {
        match rdmamig_status::from_u32(status) {
            Some(s) => s.description().as_ptr(),
            None => c"unknown status".as_ptr(),
        }
    }
}

/// Whether `status` reports a failure: false for `RDMAMIG_OK`,
/// `RDMAMIG_END_COMPLETED` and `RDMAMIG_END_UNVERIFIED` (a migration that
/// ended without failing), true for every other value, unknown ones included.
///
/// `RDMAMIG_ERR_WOULD_BLOCK` counts as an error here, as EAGAIN does in
/// POSIX: the call did nothing. A caller that passed `RDMAMIG_NO_WAIT`
/// checks for it first. Thread-safe. Since 0.13 (node `RDMAMIG_0.13`).
#[no_mangle]
pub extern "C" fn rdmamig_status_is_error(status: u32) -> bool {
    ffi_boundary! {
        rdmamig_status::from_u32(status).is_none_or(rdmamig_status::is_error)
    }
}

/// Panics on purpose inside the panic boundary and so returns
/// `RDMAMIG_ERR_PANIC`.
///
/// It exists so that integrators can check that the boundary works in their
/// build (a library built with `panic = "abort"`, or one whose boundary is
/// broken, kills the process here instead). The panic message is printed to
/// stderr by Rust's default panic hook; rdmamig never changes the process's
/// panic hook. Thread-safe.
#[no_mangle]
pub extern "C" fn rdmamig_selftest_panic_boundary() -> rdmamig_status {
    ffi_boundary! {
        if std::hint::black_box(true) {
            panic!("rdmamig_selftest_panic_boundary: deliberate panic (this is expected)");
        }
        rdmamig_status::RDMAMIG_OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn s(p: *const c_char) -> &'static str {
        assert!(!p.is_null());
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn version_is_cargo_version() {
        assert_eq!(s(rdmamig_version()), env!("CARGO_PKG_VERSION"));
        assert_eq!(s(rdmamig_version()), rdmamig::VERSION);
    }

    #[test]
    fn status_str_known_and_unknown() {
        assert_eq!(s(rdmamig_status_str(0)), "success");
        assert_eq!(s(rdmamig_status_str(rdmamig_status::RDMAMIG_ERR_TIMEOUT as u32)), "timed out");
        assert_eq!(s(rdmamig_status_str(9999)), "unknown status");
        assert_eq!(s(rdmamig_status_str(u32::MAX)), "unknown status");
    }

    #[test]
    fn panic_is_caught() {
        assert_eq!(rdmamig_selftest_panic_boundary(), rdmamig_status::RDMAMIG_ERR_PANIC);
    }
}
