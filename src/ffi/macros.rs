//! The boundary macros. Used inside the body of every exported function.
//! A toolbox: not every macro is used at every moment.
#![allow(unused_macros)]

/// Runs the enclosed statements under `catch_unwind`. On a panic the function
/// returns [`crate::ffi::boundary::PanicOrDefault::value()`]: `RDMAMIG_ERR_PANIC`
/// for functions returning `rdmamig_status`, NULL for pointers, 0 for integers,
/// false for `bool`, nothing for `()`.
///
/// Put it around the *whole* body, with the signature written out plainly:
///
/// ```ignore
/// #[no_mangle]
/// pub extern "C" fn rdmamig_thing_poke(thing: *mut rdmamig_thing) -> rdmamig_status {
///     ffi_boundary! {
///         let thing = try_mut!(thing);
///         thing.poke().into()
///     }
/// }
/// ```
///
/// `return` inside the body returns from the exported function (the body is the
/// closure run by `catch_unwind`). The closure is not wrapped in
/// `AssertUnwindSafe`: it captures only the C arguments (raw pointers and plain
/// values), which are `UnwindSafe`, so the compiler checks that nothing else
/// leaks in. If a body really needs to capture something that is not, wrap that
/// one value in `std::panic::AssertUnwindSafe` and say why.
macro_rules! ffi_boundary {
    ( $($body:tt)* ) => {
        match ::std::panic::catch_unwind(|| { $($body)* }) {
            Ok(ret) => ret,
            Err(_) => return $crate::ffi::boundary::PanicOrDefault::value(),
        }
    };
}

/// `&RustType` from a `*const Handle` (or `*mut`); on NULL, returns
/// `RDMAMIG_ERR_NULL_PARAMETER` / NULL / 0 / false from the enclosing function.
macro_rules! try_ref {
    ($ptr:expr) => {
        match $crate::ffi::handle::try_from_ptr($crate::ffi::handle::ConstPtr::const_ptr($ptr)) {
            Some(r) => r,
            None => return $crate::ffi::boundary::NullParameterOrDefault::value(),
        }
    };
}

/// `&mut RustType` from a `*mut Handle`; NULL as in [`try_ref!`].
macro_rules! try_mut {
    ($ptr:expr) => {
        match $crate::ffi::handle::try_from_mut_ptr($ptr) {
            Some(r) => r,
            None => return $crate::ffi::boundary::NullParameterOrDefault::value(),
        }
    };
}

/// `&mut T` from a plain (non-handle) output pointer `*mut T`, e.g. a
/// `size_t *len_out` or a caller-allocated `#[repr(C)]` struct; NULL as in
/// [`try_ref!`]. Write it only once the call has succeeded.
macro_rules! try_out {
    ($ptr:expr) => {
        // SAFETY: the C caller passes a valid, writable, aligned pointer or NULL.
        match unsafe { ($ptr).as_mut() } {
            Some(r) => r,
            None => return $crate::ffi::boundary::NullParameterOrDefault::value(),
        }
    };
}

/// Takes back ownership of a `*mut Handle` created by `to_boxed_mut_ptr`
/// (`Box<RustType>`); NULL as in [`try_ref!`]. For consuming calls other than
/// `_free` (which use [`crate::ffi::handle::free_box`]).
macro_rules! try_box {
    ($ptr:expr) => {
        match $crate::ffi::handle::try_box_from_ptr($ptr) {
            Some(b) => b,
            None => return $crate::ffi::boundary::NullParameterOrDefault::value(),
        }
    };
}

/// `Option<&str>` from a `const char *`: NULL gives `None`; text that is not
/// UTF-8 returns `RDMAMIG_ERR_INVALID_ARGUMENT` (or the default) from the
/// enclosing function. Use [`try_cstr!`] when NULL is not allowed.
macro_rules! try_opt_cstr {
    ($ptr:expr) => {
        match $crate::ffi::handle::opt_str_from_ptr($ptr) {
            Ok(s) => s,
            Err(()) => return $crate::ffi::boundary::InvalidArgumentOrDefault::value(),
        }
    };
}

/// `&str` from a `const char *` that must not be NULL; NULL as in
/// [`try_ref!`], non-UTF-8 as in [`try_opt_cstr!`].
macro_rules! try_cstr {
    ($ptr:expr) => {
        match try_opt_cstr!($ptr) {
            Some(s) => s,
            None => return $crate::ffi::boundary::NullParameterOrDefault::value(),
        }
    };
}

/// `&[T]` from `(const T *ptr, size_t len)`. `len == 0` gives an empty slice
/// whatever `ptr` is; NULL with `len > 0` as in [`try_ref!`].
macro_rules! try_slice {
    ($ptr:expr, $len:expr) => {
        match $crate::ffi::handle::try_slice($ptr, $len) {
            Some(s) => s,
            None => return $crate::ffi::boundary::NullParameterOrDefault::value(),
        }
    };
}

/// `&mut [T]` from `(T *ptr, size_t len)`; as [`try_slice!`].
macro_rules! try_slice_mut {
    ($ptr:expr, $len:expr) => {
        match $crate::ffi::handle::try_slice_mut($ptr, $len) {
            Some(s) => s,
            None => return $crate::ffi::boundary::NullParameterOrDefault::value(),
        }
    };
}
