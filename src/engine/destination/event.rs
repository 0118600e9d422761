//! What a destination saw its source do, for observers.

/// What a destination saw its source do, in order, as its service thread
/// served it: for tools that record or trace a migration
/// ([`Destination::accept_observed`](crate::engine::Destination::accept_observed)). Blocks are indexes into the
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
