//! Opaque handles: the zero-sized C-visible type <-> the Rust type behind it.
//!
//! Model: rustls-ffi's `Castable`. A handle is declared as
//!
//! ```ignore
//! /// <what it is>. Thread safety: <...>.
//! pub struct rdmamig_thing {
//!     _private: [u8; 0],
//! }
//!
//! impl Castable for rdmamig_thing {
//!     type RustType = rdmamig::Thing;
//! }
//! ```
//!
//! cbindgen emits it as an incomplete struct (`typedef struct rdmamig_thing
//! rdmamig_thing;`), so C can only hold pointers to it. The pointer really points
//! to a `Box<RustType>` made by [`to_boxed_mut_ptr`] and released by
//! [`free_box`]. If a handle ever needs shared ownership across C owners, add an
//! `Arc` flavour here (rustls-ffi's `OwnershipArc`) rather than casting by hand.

use std::ffi::CStr;
use std::os::raw::c_char;

/// Ties an opaque C handle type to the Rust type its pointers point to.
pub(crate) trait Castable {
    /// The Rust value a `*mut Self` really points to (always boxed).
    type RustType;
}

/// Moves `value` to the heap and hands it to C as an opaque handle.
pub(crate) fn to_boxed_mut_ptr<C: Castable>(value: C::RustType) -> *mut C {
    Box::into_raw(Box::new(value)).cast::<C>()
}

/// Frees a handle made by [`to_boxed_mut_ptr`]. NULL is a no-op.
pub(crate) fn free_box<C: Castable>(ptr: *mut C) {
    drop(try_box_from_ptr(ptr));
}

/// Takes back ownership of a handle made by [`to_boxed_mut_ptr`]; `None` for NULL.
pub(crate) fn try_box_from_ptr<C: Castable>(ptr: *mut C) -> Option<Box<C::RustType>> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL handles of type C are only ever made by `to_boxed_mut_ptr`
    // from a `Box<C::RustType>`, and the C contract says each is freed once.
    Some(unsafe { Box::from_raw(ptr.cast::<C::RustType>()) })
}

/// Borrows the Rust value behind a handle; `None` for NULL.
pub(crate) fn try_from_ptr<'a, C: Castable>(ptr: *const C) -> Option<&'a C::RustType> {
    // SAFETY: as in `try_box_from_ptr`; the C caller keeps the handle alive and
    // does not mutate it concurrently for the duration of the call.
    unsafe { ptr.cast::<C::RustType>().as_ref() }
}

/// Mutably borrows the Rust value behind a handle; `None` for NULL.
pub(crate) fn try_from_mut_ptr<'a, C: Castable>(ptr: *mut C) -> Option<&'a mut C::RustType> {
    // SAFETY: as in `try_from_ptr`; the C contract forbids concurrent use of a
    // handle through a non-const pointer.
    unsafe { ptr.cast::<C::RustType>().as_mut() }
}

/// A C string as `&str`: `Ok(None)` for NULL, `Err(())` if it is not UTF-8.
pub(crate) fn opt_str_from_ptr<'a>(ptr: *const c_char) -> Result<Option<&'a str>, ()> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: the C caller passes a NUL-terminated string valid for the call.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map(Some).map_err(|_| ())
}

/// `(ptr, len)` as a slice; empty for `len == 0` whatever `ptr` is; `None` for
/// NULL with `len > 0`.
pub(crate) fn try_slice<'a, T>(ptr: *const T, len: usize) -> Option<&'a [T]> {
    if len == 0 {
        return Some(&[]);
    }
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the C caller passes `len` valid, initialised elements.
    Some(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// `(ptr, len)` as a mutable slice; as [`try_slice`].
pub(crate) fn try_slice_mut<'a, T>(ptr: *mut T, len: usize) -> Option<&'a mut [T]> {
    if len == 0 {
        return Some(&mut []);
    }
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the C caller passes `len` valid elements that nothing else
    // accesses during the call.
    Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// The toolkit (`last_error.rs`) on a dummy handle, as the real handles use it.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{handle, handle_mut, items, out_ref, string};
    use crate::last_error::{record, record_or, Failure};
    use crate::status::rdmamig_status::{self, *};

    pub struct rdmamig_dummy {
        _private: [u8; 0],
    }

    impl Castable for rdmamig_dummy {
        type RustType = Vec<u32>;
    }

    extern "C" fn dummy_new(panic: bool) -> *mut rdmamig_dummy {
        ffi_boundary! {
            if panic {
                panic!("test panic");
            }
            to_boxed_mut_ptr::<rdmamig_dummy>(vec![1, 2, 3])
        }
    }

    extern "C" fn dummy_free(d: *mut rdmamig_dummy) {
        ffi_boundary! { free_box(d) }
    }

    extern "C" fn dummy_len(d: *const rdmamig_dummy) -> usize {
        ffi_boundary! { record_or(0, || Ok(handle(d, "dummy_len", "d")?.len())) }
    }

    extern "C" fn dummy_is_empty(d: *const rdmamig_dummy) -> bool {
        ffi_boundary! { record_or(false, || Ok(handle(d, "dummy_is_empty", "d")?.is_empty())) }
    }

    extern "C" fn dummy_push(d: *mut rdmamig_dummy, values: *const u32, n: usize) -> rdmamig_status {
        ffi_boundary! {
            const F: &str = "dummy_push";
            record(|| {
                let d = handle_mut(d, F, "d")?;
                d.extend_from_slice(items(values, n, F, "values")?);
                Ok(())
            })
        }
    }

    extern "C" fn dummy_copy_out(
        d: *const rdmamig_dummy,
        out: *mut u32,
        n: usize,
        written: *mut usize,
    ) -> rdmamig_status {
        ffi_boundary! {
            const F: &str = "dummy_copy_out";
            record(|| {
                let d = handle(d, F, "d")?;
                let written = out_ref(written, F, "written")?;
                let out = try_slice_mut(out, n).ok_or_else(|| Failure::null(F, "out"))?;
                if out.len() < d.len() {
                    return Err(Failure::new(RDMAMIG_ERR_BUFFER_TOO_SMALL, "short"));
                }
                out[..d.len()].copy_from_slice(d);
                *written = d.len();
                Ok(())
            })
        }
    }

    extern "C" fn dummy_push_name_len(d: *mut rdmamig_dummy, name: *const c_char) -> rdmamig_status {
        ffi_boundary! {
            const F: &str = "dummy_push_name_len";
            record(|| {
                let d = handle_mut(d, F, "d")?;
                d.push(string(name, F, "name")?.len() as u32);
                Ok(())
            })
        }
    }

    /// A consuming call: takes the handle back and returns its sum.
    extern "C" fn dummy_into_sum(d: *mut rdmamig_dummy, sum: *mut u32) -> rdmamig_status {
        ffi_boundary! {
            const F: &str = "dummy_into_sum";
            record(|| {
                let sum = out_ref(sum, F, "sum")?;
                let d = try_box_from_ptr(d).ok_or_else(|| Failure::null(F, "d"))?;
                *sum = d.iter().sum();
                Ok(())
            })
        }
    }

    #[test]
    fn toolkit_on_a_dummy_handle() {
        let null = std::ptr::null_mut::<rdmamig_dummy>();
        assert!(dummy_new(true).is_null(), "panic gives NULL");
        assert_eq!(dummy_len(null), 0);
        assert!(!dummy_is_empty(null));
        dummy_free(null);

        let d = dummy_new(false);
        assert_eq!(dummy_len(d), 3);
        assert_eq!(dummy_push(d, [4, 5].as_ptr(), 2), RDMAMIG_OK);
        assert_eq!(dummy_push(d, std::ptr::null(), 0), RDMAMIG_OK, "empty slice may be NULL");
        assert_eq!(dummy_push(d, std::ptr::null(), 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(dummy_push(null, [1].as_ptr(), 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(dummy_len(d), 5);

        let mut out = [0u32; 8];
        let mut written = 0usize;
        assert_eq!(dummy_copy_out(d, out.as_mut_ptr(), 2, &mut written), RDMAMIG_ERR_BUFFER_TOO_SMALL);
        assert_eq!(written, 0);
        assert_eq!(dummy_copy_out(d, out.as_mut_ptr(), 8, std::ptr::null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(dummy_copy_out(d, out.as_mut_ptr(), 8, &mut written), RDMAMIG_OK);
        assert_eq!((written, &out[..5]), (5, &[1, 2, 3, 4, 5][..]));

        assert_eq!(dummy_push_name_len(d, c"abc".as_ptr()), RDMAMIG_OK);
        assert_eq!(dummy_push_name_len(d, std::ptr::null()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(dummy_push_name_len(d, c"\xc3".as_ptr()), RDMAMIG_ERR_INVALID_ARGUMENT);

        let mut sum = 0;
        assert_eq!(dummy_into_sum(null, &mut sum), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(dummy_into_sum(d, &mut sum), RDMAMIG_OK);
        assert_eq!(sum, 1 + 2 + 3 + 4 + 5 + 3);
    }

    #[test]
    fn status_conversions_in_bodies() {
        extern "C" fn fails() -> rdmamig_status {
            ffi_boundary! {
                let r: rdmamig::Result<()> = Err(rdmamig::Error::new(rdmamig::ErrorKind::BlockMismatch, "x"));
                record(|| Ok(r?))
            }
        }
        assert_eq!(fails(), rdmamig_status::RDMAMIG_ERR_BLOCK_MISMATCH);
    }
}
