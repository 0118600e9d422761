//! The C ABI: argument checks, panic boundary, handle casts. No logic.
//!
//! Conventions (see README.md, "API conventions"), modelled on rustls-ffi:
//!
//! - Every exported function is `#[no_mangle] pub extern "C" fn rdmamig_<noun>_<verb>`
//!   and its whole body sits inside [`ffi_boundary!`], so a panic becomes
//!   `RDMAMIG_ERR_PANIC` (or NULL / 0 / false) instead of aborting the hypervisor.
//!   The macro is *inside* the body so cbindgen sees a plain signature.
//! - Handles are opaque zero-sized structs (`pub struct rdmamig_x { _private: [u8; 0] }`)
//!   tied to their Rust type by [`handle::Castable`]; they are created and freed
//!   only by the library. `_free(NULL)` is a no-op.
//! - Pointers are checked with `try_ref!`, `try_mut!`, `try_cstr!`, `try_slice!`,
//!   `try_slice_mut!` before use; a NULL gives `RDMAMIG_ERR_NULL_PARAMETER`
//!   (or NULL / 0 / false).
//! - Errors: [`rdmamig_status`]; a `crate::Error` converts with `.into()` or
//!   [`status::status_of`].
//!
//! Adding a handle type: see `config.rs`, which is the smallest complete example.

// Boundary functions take raw pointers from C without being `unsafe fn`: the C
// caller is responsible for their validity, the layer checks for NULL.
#![allow(clippy::not_unsafe_ptr_arg_deref)]
// C names: `rdmamig_config`, `RDMAMIG_OK`, ...
#![allow(non_camel_case_types)]

#[macro_use]
mod macros;
pub(crate) mod boundary;
pub(crate) mod buffer;
pub(crate) mod handle;
pub(crate) mod status;

pub mod config;
// pub mod device; // TODO: waits for crate::verbs::Context
pub mod version;
