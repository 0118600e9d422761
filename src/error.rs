//! The error type shared by every layer above the codec.

use std::fmt;

/// What went wrong, coarse enough for a caller to act on. The C ABI maps each
/// kind to a fixed `rdmamig_status` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A caller passed an argument that makes no sense (bad length, unknown block, ...).
    InvalidArgument,
    /// No RDMA device is present or usable on this host.
    NoDevice,
    /// A verbs or rdma_cm call failed.
    Verbs,
    /// Address/route resolution or connection establishment failed; among
    /// others, nothing listens at the address and port yet ("no listener on
    /// ..."): a source started before its destination listens may retry
    /// until a deadline of its own, or wait for word from the destination's
    /// side that its listener is up.
    Connect,
    /// The peer speaks another protocol version.
    Version,
    /// The peer sent a malformed or unexpected message.
    Protocol,
    /// The peer reported an error (an ERROR control message).
    PeerError,
    /// The peer disconnected or the device went away.
    Disconnected,
    /// A wait ran past its deadline.
    Timeout,
    /// The RAM block lists of the two sides do not match.
    BlockMismatch,
    /// The connection was aborted earlier; this is the stored error.
    Aborted,
    /// The operation is not valid in the connection's current state.
    State,
    /// The hypervisor cancelled the wait (`Listener::cancel`).
    Cancelled,
    /// Memory could not be registered within the pin budget (or the kernel's
    /// memlock limit), or a peer asked for more than this side's budget.
    PinBudget,
    /// Peer authentication failed: the peer did not prove the pre-shared key
    /// (or does not authenticate while this side requires it), or its address
    /// is not on the listener's allow-list.
    Auth,
    /// Nothing is ready yet and the call was asked not to wait (a timeout of
    /// `Duration::ZERO`): call again once the connection's event fd is
    /// readable. Not a failure of the connection.
    WouldBlock,
}

/// An error with a message naming its cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
