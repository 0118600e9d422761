//! The panic boundary, used around the body of every exported function.
//! (Arguments are checked with the helpers of `last_error.rs`.)

/// Runs the enclosed statements under `catch_unwind`. On a panic the function
/// returns [`crate::boundary::PanicOrDefault::value()`]: `RDMAMIG_ERR_PANIC`
/// for functions returning `rdmamig_status`, NULL for pointers, 0 for integers,
/// false for `bool`, nothing for `()`.
///
/// Put it around the *whole* body, with the signature written out plainly:
///
/// ```ignore
/// #[no_mangle]
/// pub extern "C" fn rdmamig_thing_poke(thing: *mut rdmamig_thing) -> rdmamig_status {
///     ffi_boundary! {
///         const F: &str = "rdmamig_thing_poke";
///         record(|| Ok(handle_mut(thing, F, "thing")?.poke()?))
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
            Err(_) => return $crate::boundary::PanicOrDefault::value(),
        }
    };
}
