//! Device probe.

use super::args::opt_string;
use super::buffer::copy_to_c_buf;
use super::last_error::{record, Failure};
use super::status::rdmamig_status;
use std::os::raw::c_char;

/// The longest RDMA device name, in bytes, not counting the NUL
/// (`IBV_SYSFS_NAME_MAX - 1`). A `name_out` buffer of
/// `RDMAMIG_DEVICE_NAME_MAX + 1` bytes always suffices.
#[allow(dead_code)] // for C, through the header
pub const RDMAMIG_DEVICE_NAME_MAX: usize = 63;

/// Checks that an RDMA device can be opened, and says which.
///
/// `name` selects a device by name (e.g. "rxe0", "mlx5_0"); NULL means the
/// first device found. On `RDMAMIG_OK` the device's name is copied,
/// NUL-terminated, into `name_out` (of `name_out_len` bytes). `name_out` may be
/// NULL when `name_out_len` is 0, to only check for a device.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NO_DEVICE` when the host has no RDMA
/// device (or none called `name`); `RDMAMIG_ERR_VERBS` when the device exists
/// but cannot be opened; `RDMAMIG_ERR_INVALID_ARGUMENT` when `name` is not
/// UTF-8; `RDMAMIG_ERR_NULL_PARAMETER` when `name_out` is NULL but
/// `name_out_len` is not 0; `RDMAMIG_ERR_BUFFER_TOO_SMALL` when the name does
/// not fit (the buffer then holds as much of it as fits, NUL-terminated).
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rdmamig_device_probe(
    name: *const c_char,
    name_out: *mut c_char,
    name_out_len: usize,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_device_probe";
        record(|| {
            let name = opt_string(name, F, "name")?;
            if name_out.is_null() && name_out_len != 0 {
                return Err(Failure::null(F, "name_out"));
            }
            let found = rdmamig::engine::device::probe_device(name)?;
            let needed = copy_to_c_buf(&found, name_out, name_out_len);
            if name_out_len != 0 && needed >= name_out_len {
                return Err(Failure::new(
                    rdmamig_status::RDMAMIG_ERR_BUFFER_TOO_SMALL,
                    format!("{F}: the name {found:?} needs {} bytes, name_out_len is {name_out_len}", needed + 1),
                ));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmamig_status::*;

    #[test]
    fn argument_checks() {
        assert_eq!(rdmamig_device_probe(std::ptr::null(), std::ptr::null_mut(), 8), RDMAMIG_ERR_NULL_PARAMETER);
        let mut buf = [0 as c_char; 8];
        let bad = c"\xff".as_ptr();
        assert_eq!(rdmamig_device_probe(bad, buf.as_mut_ptr(), buf.len()), RDMAMIG_ERR_INVALID_ARGUMENT);
    }

    #[test]
    fn probe_is_ok_or_no_device() {
        let mut buf = [0x55 as c_char; RDMAMIG_DEVICE_NAME_MAX + 1];
        match rdmamig_device_probe(std::ptr::null(), buf.as_mut_ptr(), buf.len()) {
            RDMAMIG_OK => assert!(buf.contains(&0)),
            RDMAMIG_ERR_NO_DEVICE => assert_eq!(buf[0], 0x55, "written only on success"),
            other => panic!("{other:?}"),
        }
    }
}
