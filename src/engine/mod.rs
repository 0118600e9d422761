//! Source and destination state machines, control channel, RAM chunks.
//!
//! Threads: each connection has one library thread that owns its verbs
//! objects: the source's transfer thread (fed by a lock-free queue) and the
//! destination's service thread. Hypervisor threads only queue work and wait.
//! Two more do pinning work off those threads (`pin`): the process-wide
//! unregistration worker, and a connection's pin-all registration thread.

pub mod auth;
pub mod config;
pub(crate) mod destination;
pub mod device;
pub(crate) mod link;
pub(crate) mod pin;
pub(crate) mod postcopy;
pub mod ram;
pub(crate) mod source;
pub mod stats;
mod sync;
mod validate;

pub use auth::{AuthKey, SourcePrefix};
pub use config::Config;
pub use destination::{Destination, Observer, Read};
pub use link::{Listener, Negotiated};
pub use pin::{Hint, Unregistration};
pub use postcopy::{PostcopyPhase, PostcopyProgress, PostcopySummary, StalePages};
pub use ram::{RamBlock, RamBlocks, Run};
pub use source::{SaveRange, Source};
pub use stats::Stats;

/// How a migration connection ended, when it did not fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Both sides know the migration is complete: the source's END (after its
    /// last window and stream byte) was checked and acknowledged by the
    /// destination. Only between rdmamig peers.
    Completed,
    /// The peer closed the connection outside any iteration window without a
    /// completion handshake: a QEMU peer, which has none. Whether everything
    /// arrived is for the stream itself to prove (QEMU's QEMU_VM_EOF).
    Unverified,
}

/// What a destination saw its source do, in order, as its service thread
/// served it: for tools that record or trace a migration
/// ([`Destination::accept_observed`]). Blocks are indexes into the
/// destination's own registry; offsets are within the block. Only messages
/// are seen: RDMA WRITEs into memory already registered leave no trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The source opened an iteration window (its first registration-channel
    /// message after `stream_offset` stream bytes).
    WindowOpened { stream_offset: u64 },
    /// The source asked for `len` bytes at `offset` to be registered for its
    /// writes (dynamic registration: chunks, even ones registered already;
    /// pin-all: each whole block, at the RAM-blocks exchange).
    Registered { block: usize, offset: u64, len: u64 },
    /// The source had a registration dropped.
    Unregistered { block: usize, offset: u64, len: u64 },
    /// The source said the range is zero (COMPRESS); it is zero here now.
    Zeroed { block: usize, offset: u64, len: u64 },
    /// REGISTER_FINISHED, after `stream_offset` stream bytes: the window's RAM is in place.
    WindowClosed { stream_offset: u64 },
}
