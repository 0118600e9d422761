//! The C ABI: argument checks, panic boundary, handle casts. No logic.
//!
//! Conventions (see docs/c-api.md, "Conventions"), modelled on rustls-ffi:
//!
//! - Every exported function is `#[no_mangle] pub extern "C" fn rdmamig_<noun>_<verb>`
//!   and its whole body sits inside [`ffi_boundary!`], so a panic becomes
//!   `RDMAMIG_ERR_PANIC` (or NULL / 0 / false) instead of aborting the hypervisor.
//!   The macro is *inside* the body so cbindgen sees a plain signature.
//! - Handles are opaque zero-sized structs (`pub struct rdmamig_x { _private: [u8; 0] }`)
//!   tied to their Rust type by [`handle::Castable`]; they are created and freed
//!   only by the library. `_free(NULL)` is a no-op.
//! - Arguments are checked with one toolkit, `args.rs`: the body is a
//!   closure returning `Result<_, Failure>` run by `record` (or `record_or`,
//!   or a connection's `conn::run`), and each pointer goes through `handle`,
//!   `handle_mut`, `out_ref`, `string`, `bytes`, `items`, ... first; a NULL
//!   gives `RDMAMIG_ERR_NULL_PARAMETER` (or NULL / 0 / false), and every
//!   failure keeps a message naming the function and the argument.
//! - Errors: [`rdmamig_status`]; a `rdmamig::Error` converts with `.into()` or
//!   [`status::status_of`].
//!
//! Adding a handle type: see `config.rs`, which is the smallest complete example.

// Boundary functions take raw pointers from C without being `unsafe fn`: the C
// caller is responsible for their validity, the layer checks for NULL.
#![allow(clippy::not_unsafe_ptr_arg_deref)]
// C names: `rdmamig_config`, `RDMAMIG_OK`, ...
#![allow(non_camel_case_types)]
// unsafe is for the C boundary, each block with its argument.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

#[macro_use]
mod macros;
pub(crate) mod args;
pub(crate) mod boundary;
pub(crate) mod buffer;
pub(crate) mod connection;
#[cfg(test)]
mod generated;
pub(crate) mod handle;
pub(crate) mod last_error;
pub(crate) mod status;
pub(crate) mod versioned;

pub mod config;
pub mod conn;
pub mod device;
pub mod event;
pub mod fabric;
pub mod listener;
pub mod log;
pub mod postcopy;
pub mod postcopy_link;
pub mod ram;
pub mod stats;
pub mod stream;
pub mod version;
pub mod wait;

/// The checked-in header agrees with the crate (scripts/check-header.sh also
/// checks it is exactly cbindgen's output).
#[cfg(test)]
mod header_tests {
    use super::status::rdmamig_status;

    fn header() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/rdmamig.h");
        std::fs::read_to_string(path).expect("capi/include/rdmamig.h")
    }

    fn define(header: &str, name: &str) -> String {
        let prefix = format!("#define {name} ");
        let line = header.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{name} missing"));
        line[prefix.len()..].trim().to_string()
    }

    #[test]
    fn version_macros_match_cargo_toml() {
        let h = header();
        assert_eq!(define(&h, "RDMAMIG_VERSION_MAJOR"), env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(define(&h, "RDMAMIG_VERSION_MINOR"), env!("CARGO_PKG_VERSION_MINOR"));
        assert_eq!(define(&h, "RDMAMIG_VERSION_PATCH"), env!("CARGO_PKG_VERSION_PATCH"));
    }

    #[test]
    fn status_values_match_header() {
        let h = header();
        let in_header: Vec<(String, u32)> = h
            .lines()
            .map(str::trim)
            .filter(|l| ["RDMAMIG_OK", "RDMAMIG_ERR_", "RDMAMIG_END_"].iter().any(|p| l.starts_with(p)))
            .map(|l| {
                let (name, value) = l.trim_end_matches(',').split_once(" = ").expect("NAME = value");
                (name.to_string(), value.parse().expect("number"))
            })
            .collect();
        let in_rust: Vec<(String, u32)> = rdmamig_status::ALL.iter().map(|s| (format!("{s:?}"), *s as u32)).collect();
        assert_eq!(in_header, in_rust);
    }
}
