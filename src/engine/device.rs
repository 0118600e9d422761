//! Finding an RDMA device.

use crate::{Error, ErrorKind, Result};

/// Opens the RDMA device called `name` (or the first one when `None`) and
/// returns its name, closing it again.
///
/// Errors: `NoDevice` when the host has no RDMA device (or none called `name`),
/// `Verbs` when a device exists but cannot be opened.
pub fn probe_device(name: Option<&str>) -> Result<String> {
    match crate::verbs::Context::open(name) {
        Ok(ctx) => Ok(ctx.name().to_string()),
        Err(e) if e.is_no_device() => Err(Error::new(
            ErrorKind::NoDevice,
            match name {
                Some(n) => format!("no RDMA device called {n:?}: {e}"),
                None => format!("no RDMA device on this host: {e}"),
            },
        )),
        Err(e) => Err(Error::new(ErrorKind::Verbs, format!("cannot open RDMA device: {e}"))),
    }
}
