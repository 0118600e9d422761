//! The destination side. A service thread (`service`) owns the connection:
//! it grants the source one READY credit at a time and serves every control
//! message as it arrives (RAM-block exchange, registrations, zero ranges,
//! iteration ends; `dispatch`), so the hypervisor never has to parse its own
//! stream to find QEMU's hook markers. Stream bytes (QEMU_FILE) are buffered
//! for `get`. A QEMU source's return path (`Config::return_path`) is a second
//! connection on which this side sends: `put_return` runs on the caller's
//! thread.

pub(crate) mod dispatch;
mod event;
mod handle;
pub(crate) mod postcopy;
mod service;
mod shared;

pub use dispatch::Observer;
pub use event::Event;
pub use handle::{Destination, Read};
#[cfg(feature = "rdma-tests")]
pub use service::SEVER_AFTER_WINDOWS;
