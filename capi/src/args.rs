//! The argument checks: the layer's one toolkit for what C passes in. Each
//! check names the function and the argument in its message: a NULL gives
//! `RDMAMIG_ERR_NULL_PARAMETER`, text that is not UTF-8
//! `RDMAMIG_ERR_INVALID_ARGUMENT`.

use std::os::raw::c_char;

use super::handle::{opt_str_from_ptr, try_from_mut_ptr, try_from_ptr, try_slice, try_slice_mut, Castable};
use super::last_error::Failure;

/// `&RustType` behind a handle; NULL fails with `RDMAMIG_ERR_NULL_PARAMETER`.
pub(crate) fn handle<'a, C: Castable>(ptr: *const C, func: &str, arg: &str) -> Result<&'a C::RustType, Failure> {
    try_from_ptr(ptr).ok_or_else(|| Failure::null(func, arg))
}

/// `&mut RustType` behind a handle; NULL as in [`handle`].
pub(crate) fn handle_mut<'a, C: Castable>(ptr: *mut C, func: &str, arg: &str) -> Result<&'a mut C::RustType, Failure> {
    try_from_mut_ptr(ptr).ok_or_else(|| Failure::null(func, arg))
}

/// A caller's output variable; NULL as in [`handle`].
pub(crate) fn out_ref<'a, T>(ptr: *mut T, func: &str, arg: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: the C caller passes a valid, writable, aligned `T` (or NULL).
    unsafe { ptr.as_mut() }.ok_or_else(|| Failure::null(func, arg))
}

/// An optional output variable: `None` for NULL.
pub(crate) fn opt_out<'a, T>(ptr: *mut T) -> Option<&'a mut T> {
    // SAFETY: as in `out_ref`.
    unsafe { ptr.as_mut() }
}

/// A required C string; NULL as in [`handle`], not UTF-8 gives `RDMAMIG_ERR_INVALID_ARGUMENT`.
pub(crate) fn string<'a>(ptr: *const c_char, func: &str, arg: &str) -> Result<&'a str, Failure> {
    opt_string(ptr, func, arg)?.ok_or_else(|| Failure::null(func, arg))
}

/// An optional C string: `None` for NULL; not UTF-8 as in [`string`].
pub(crate) fn opt_string<'a>(ptr: *const c_char, func: &str, arg: &str) -> Result<Option<&'a str>, Failure> {
    opt_str_from_ptr(ptr).map_err(|()| Failure::invalid(format!("{func}: {arg} is not UTF-8")))
}

/// `(ptr, len)` as bytes; NULL with `len > 0` as in [`handle`].
pub(crate) fn bytes<'a>(ptr: *const u8, len: usize, func: &str, arg: &str) -> Result<&'a [u8], Failure> {
    items(ptr, len, func, arg)
}

/// `(ptr, len)` as `len` elements; NULL with `len > 0` as in [`handle`].
pub(crate) fn items<'a, T>(ptr: *const T, len: usize, func: &str, arg: &str) -> Result<&'a [T], Failure> {
    try_slice(ptr, len).ok_or_else(|| Failure::null(func, arg))
}

/// `(ptr, len)` as writable bytes; NULL with `len > 0` as in [`handle`].
pub(crate) fn bytes_mut<'a>(ptr: *mut u8, len: usize, func: &str, arg: &str) -> Result<&'a mut [u8], Failure> {
    try_slice_mut(ptr, len).ok_or_else(|| Failure::null(func, arg))
}
