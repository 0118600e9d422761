//! Pinned memory under a budget: each connection side counts the guest
//! memory (and the buffers of its own) it has registered, refuses or makes
//! room before a registration would pass its budget, and hands
//! registrations it drops to the unregistration worker. Which registration to drop is the source's call
//! ([`Lru`]): only it knows which chunks it will write again.

mod budget;
mod fork;
mod lru;
mod pin_all;
mod pins;
mod unregister;

pub(crate) use budget::{budget_for, CONTROL_PINNED};
pub(crate) use fork::{fork_mode, settle_at_close};
pub use lru::{Hint, Lru};
#[cfg(feature = "rdma-tests")]
pub use pin_all::pin_all_blocks;
pub(crate) use pin_all::PinAll;
pub(crate) use pins::{PinnedBuffer, Pins};
pub use unregister::Unregistration;
