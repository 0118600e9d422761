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
//!     type RustType = crate::engine::Thing;
//! }
//! ```
//!
//! cbindgen emits it as an incomplete struct (`typedef struct rdmamig_thing
//! rdmamig_thing;`), so C can only hold pointers to it. The pointer really points
//! to a `Box<RustType>` made by [`to_boxed_mut_ptr`] and released by
//! [`free_box`]. If a handle ever needs shared ownership across C owners, add an
//! `Arc` flavour here (rustls-ffi's `OwnershipArc`) rather than casting by hand.

// A toolbox for the boundary functions: not every helper is used at every moment.
#![allow(dead_code)]

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
