//! The error type shared by every layer above the codec.

use std::fmt;

/// `define_error_kinds!` below is the one list of the error kinds, each
/// with its doc, its value and a short description. It makes [`ErrorKind`]
/// and [`ErrorKind::ALL`], from which interfaces that mirror the kinds (the
/// C ABI's `rdmamig_status`, capi/) generate theirs. The values are fixed
/// (the C ABI reports a kind by its value); a new kind takes the next value
/// no status has, and goes nowhere else.
macro_rules! define_error_kinds {
    ($($(#[doc = $doc:literal])* $kind:ident = $value:literal, $description:literal;)*) => {
        /// What went wrong, coarse enough for a caller to act on. A kind's
        /// value is fixed: the C ABI's `rdmamig_status` for it has the same.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorKind {
            $($(#[doc = $doc])* $kind = $value,)*
        }

        impl ErrorKind {
            /// Every kind, in value order.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$kind),*];

            /// The kind's name (`InvalidArgument`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => stringify!($kind),)*
                }
            }

            /// The kind's doc, one line per line.
            pub fn doc(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => concat!($($doc, "\n"),*),)*
                }
            }

            /// A short lower-case description.
            pub fn description(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => $description,)*
                }
            }
        }
    };
}

define_error_kinds! {
    /// A caller passed an argument that makes no sense (bad length, unknown block, ...).
    InvalidArgument = 3, "invalid argument";
    /// No RDMA device is present or usable on this host.
    NoDevice = 4, "no RDMA device present or usable";
    /// A verbs or rdma_cm call failed.
    Verbs = 5, "verbs or rdma_cm call failed";
    /// Address/route resolution or connection establishment failed; among
    /// others, nothing listens at the address and port yet ("no listener on
    /// ..."): a source started before its destination listens may retry
    /// until a deadline of its own, or wait for word from the destination's
    /// side that its listener is up.
    Connect = 6, "connection establishment failed";
    /// The peer speaks another protocol version.
    Version = 7, "peer speaks another protocol version";
    /// The peer sent a malformed or unexpected message.
    Protocol = 8, "peer sent a malformed or unexpected message";
    /// The peer reported an error (an ERROR control message).
    PeerError = 9, "peer reported an error";
    /// The peer disconnected or the device went away.
    Disconnected = 10, "peer disconnected or device went away";
    /// A wait ran past its deadline.
    Timeout = 11, "timed out";
    /// The RAM block lists of the two sides do not match.
    BlockMismatch = 12, "RAM block lists of the two sides do not match";
    /// The connection was aborted by an earlier error; that error's message is kept.
    Aborted = 13, "connection aborted by an earlier error";
    /// The call is not valid in the object's current state.
    State = 14, "operation not valid in the current state";
    /// The hypervisor cancelled the wait (`Listener::cancel`).
    Cancelled = 18, "cancelled";
    /// Memory could not be registered within the pin budget (or the kernel's
    /// memlock limit), or a peer asked for more than this side's budget.
    PinBudget = 19, "pin budget exceeded";
    /// Peer authentication failed: the peer did not prove the pre-shared key
    /// (or does not authenticate while this side requires it), or its address
    /// is not on the listener's allow-list.
    Auth = 20, "peer authentication failed or peer not allowed";
    /// Nothing is ready yet and the call was asked not to wait (a timeout of
    /// `Duration::ZERO`): call again once the connection's event fd is
    /// readable. Not a failure of the connection.
    WouldBlock = 21, "nothing ready yet (the call was asked not to wait)";
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
