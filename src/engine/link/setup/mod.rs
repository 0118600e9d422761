//! Connection setup: `connect` (the connecting side), `accept` (the
//! accepting side: each request a `request`, what its accepts share
//! `parked`), the destination's `listener`, what an accept `admit`s, and
//! what both sides share (`cm`).

mod accept;
mod admit;
mod cm;
mod connect;
mod listener;
mod parked;
mod request;

pub(super) use accept::accept_from;
pub(crate) use accept::{accept, accept_return};
pub(super) use admit::{Admit, Resume};
pub(crate) use connect::connect;
pub(super) use connect::connect_to;
#[cfg(feature = "rdma-tests")]
pub use connect::LAST_RECOVERY_REQUEST;
pub use listener::Listener;
