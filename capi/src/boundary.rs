//! What an exported function returns when it cannot run its body: after a
//! caught panic. (A failed argument check returns its status, or the
//! function's documented NULL / 0 / false, through `last_error::record_or`.)

use super::status::rdmamig_status;

/// The value returned after a caught panic.
pub(crate) trait PanicOrDefault {
    fn value() -> Self;
}

impl PanicOrDefault for rdmamig_status {
    fn value() -> Self {
        rdmamig_status::RDMAMIG_ERR_PANIC
    }
}

/// Functions that return nothing, a pointer, a count or a flag give the type's
/// "nothing" (NULL, 0, false) after a panic, as on every other failure; they
/// must document that.
macro_rules! defaults {
    ($($t:ty => $v:expr),* $(,)?) => {$(
        impl PanicOrDefault for $t { fn value() -> Self { $v } }
    )*};
}

defaults! {
    () => (),
    bool => false,
    u8 => 0,
    u16 => 0,
    u32 => 0,
    u64 => 0,
    usize => 0,
    i32 => 0,
    i64 => 0,
}

macro_rules! pointer_defaults {
    ($($tr:ident),*) => {$(
        impl<T> $tr for *mut T { fn value() -> Self { std::ptr::null_mut() } }
        impl<T> $tr for *const T { fn value() -> Self { std::ptr::null() } }
    )*};
}

pointer_defaults!(PanicOrDefault);
