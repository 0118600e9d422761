//! How a migration connection ended, when it did not fail.

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
