//! One RDMA connection, the `Link` (`connection`), composed of its parts:
//! the control channel (`control`), the data path (`data_path`), liveness
//! (`liveness`) and how it ended (`loss`); `work` says which part a
//! completion belongs to. What makes or changes a link is a set of
//! functions over it: `setup` (resolution, `connect`, `accept`, the
//! listener) returns a link, `auth` and `seal` authenticate it, `fault_qp`
//! gives it a second queue pair for post-copy's faults, `recovery` gets a
//! lost one back.

mod auth;
mod connection;
mod control;
mod data_path;
mod errors;
mod fault_qp;
mod liveness;
mod loss;
mod negotiated;
mod recovery;
mod seal;
mod setup;
mod work;

pub(crate) use connection::Link;
pub(crate) use errors::protocol_error;
pub(crate) use fault_qp::{accept_fault_qp, close_fault_qp, open_fault_qp};
pub use negotiated::Negotiated;
#[cfg(feature = "rdma-tests")]
pub(crate) use recovery::sever_for_test;
pub(crate) use recovery::{
    abandon, accept_recovery, closed_by_peer_since, reconnect, recovery_listener, response_or_request,
};
pub use setup::Listener;
#[cfg(feature = "rdma-tests")]
pub use setup::LAST_RECOVERY_REQUEST;
pub(crate) use setup::{accept, accept_return, connect};
