//! One RDMA connection (`connection`: the `Link`) and how it is set up
//! (`setup`: resolution, connect, accept, the listener), authenticated
//! (`auth`, `seal`), given a second queue pair for post-copy's faults
//! (`fault_qp`) and got back after a loss (`recovery`).

mod auth;
mod connection;
mod errors;
mod fault_qp;
mod negotiated;
mod recovery;
mod seal;
mod setup;

pub(crate) use connection::Link;
pub(crate) use errors::protocol_error;
pub use negotiated::Negotiated;
pub use setup::Listener;
#[cfg(feature = "rdma-tests")]
pub use setup::LAST_RECOVERY_REQUEST;
