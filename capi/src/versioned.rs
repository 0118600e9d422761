//! C structs versioned by their size (`rdmamig_stats`,
//! `rdmamig_postcopy_progress`): the caller sets `size` to the `sizeof` it was
//! built with, the library fills the fields that fit and writes back the
//! bytes it filled, so a program built against an older or newer header works
//! with any library. The structs only grow, at the end.

use std::mem::size_of;
use std::ptr::{addr_of, addr_of_mut, copy_nonoverlapping};

use super::last_error::Failure;

/// A struct versioned by its size.
///
/// # Safety
/// The implementor is `#[repr(C)]` with `size: u32` at offset 0, another
/// `u32` after it, then only `u64` fields: no padding, and every field ends
/// at a multiple of 8 bytes.
pub(crate) unsafe trait VersionedBySize: Copy {
    /// The C name of the struct, for messages.
    const NAME: &'static str;
    /// The size of its first version, the smallest `size` accepted, and the
    /// C name of that constant.
    const SIZE_V1: (u32, &'static str);
}

/// Sets the `u64` fields of `full` after its first 8 bytes to `values`, in
/// order, as many as both have (the struct's generated fields mirror a list
/// of the library's, which may be a step ahead until `make generate`).
pub(crate) fn set_counters<T: VersionedBySize>(full: &mut T, values: &[u64]) {
    let n = ((size_of::<T>() - 8) / 8).min(values.len());
    let counters = addr_of_mut!(*full).cast::<u8>();
    // SAFETY: from byte 8 to its end `T` has only `u64` fields, 8-aligned
    // (the `VersionedBySize` contract): `n` of them fit.
    unsafe { copy_nonoverlapping(values.as_ptr(), counters.add(8).cast::<u64>(), n) };
}

/// `out->size` (`None` for a NULL `out`), checked to be at least the first
/// version's: nothing is written otherwise.
pub(crate) fn caller_size<T: VersionedBySize>(out: *const T, func: &str) -> Result<Option<u32>, Failure> {
    if out.is_null() {
        return Ok(None);
    }
    // SAFETY: `out` points to a caller's struct whose first field is `size`
    // (the `VersionedBySize` contract).
    let size = unsafe { addr_of!(*out).cast::<u32>().read() };
    let (v1, v1_name) = T::SIZE_V1;
    if size < v1 {
        return Err(Failure::invalid(format!(
            "{func}: out->size is {size}, less than {v1_name} ({v1}); set it to sizeof({})",
            T::NAME
        )));
    }
    Ok(Some(size))
}

/// Copies the fields of `full` that end within `size` bytes of `out`, then
/// sets `out->size` to the bytes filled.
///
/// # Safety
/// `out` must point to at least `size` writable bytes, `size >= 8`.
pub(crate) unsafe fn fill<T: VersionedBySize>(out: *mut T, size: u32, full: &T) {
    // Fields end at multiples of 8 (the `VersionedBySize` contract).
    let filled = (size as usize).min(size_of::<T>()) & !7;
    let from = addr_of!(*full).cast::<u8>();
    let to = addr_of_mut!(*out).cast::<u8>();
    // SAFETY: bytes 4..filled lie within both `*full` and the caller's
    // `size` bytes; the two do not overlap (`full` is the library's).
    unsafe { copy_nonoverlapping(from.add(4), to.add(4), filled - 4) };
    // SAFETY: as above; `size` is the first field.
    unsafe { to.cast::<u32>().write(filled as u32) };
}
