//! The error type shared by every layer above the codec.

use std::fmt;

/// `define_error_kinds!` below is the one list of the error kinds: each
/// kind's doc, its value, and how the C ABI reports it (its `rdmamig_status`
/// name and short description, and its doc there when the kind's own names
/// Rust items). It makes [`ErrorKind`] and [`ErrorKind::STATUSES`], from
/// which the C ABI (capi/) generates those statuses. The values are fixed
/// (they are the C ABI's); a new kind takes the next value the C ABI has
/// free, and goes nowhere else.
macro_rules! define_error_kinds {
    ($(
        $(#[doc = $doc:literal])*
        $kind:ident = $value:literal => $status:ident, $description:literal $({ $(#[doc = $c_doc:literal])* })?;
    )*) => {
        /// What went wrong, coarse enough for a caller to act on. A kind's
        /// value is its `rdmamig_status` in the C ABI; the values between are
        /// the C ABI's own (success, its argument checks, the endings).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorKind {
            $($(#[doc = $doc])* $kind = $value,)*
        }

        impl ErrorKind {
            /// Each kind with its `rdmamig_status`, in value order.
            pub const STATUSES: &'static [KindStatus] = &[$(KindStatus {
                kind: ErrorKind::$kind,
                name: stringify!($status),
                doc: c_doc!([$($($c_doc)*)?] [$($doc)*]),
                description: $description,
            }),*];
        }
    };
}

/// A kind's doc for the C ABI: its own (the second list) unless it has one
/// for C (the first).
macro_rules! c_doc {
    ([] [$($doc:literal)*]) => { concat!($($doc, "\n"),*) };
    ([$($c_doc:literal)+] [$($doc:literal)*]) => { concat!($($c_doc, "\n"),*) };
}

/// How the C ABI reports an [`ErrorKind`]: an `rdmamig_status` of its own,
/// whose value is the kind's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindStatus {
    pub kind: ErrorKind,
    /// The status's C name (`RDMAMIG_ERR_...`).
    pub name: &'static str,
    /// Its doc, one line per line.
    pub doc: &'static str,
    /// A short lower-case description (`rdmamig_status_str`).
    pub description: &'static str,
}

define_error_kinds! {
    /// A caller passed an argument that makes no sense (bad length, unknown block, ...).
    InvalidArgument = 3 => RDMAMIG_ERR_INVALID_ARGUMENT, "invalid argument" {
        /// An argument was present but not valid (bad length, not UTF-8, out of range, ...).
    };
    /// No RDMA device is present or usable on this host.
    NoDevice = 4 => RDMAMIG_ERR_NO_DEVICE, "no RDMA device present or usable";
    /// A verbs or rdma_cm call failed.
    Verbs = 5 => RDMAMIG_ERR_VERBS, "verbs or rdma_cm call failed";
    /// Address/route resolution or connection establishment failed; among
    /// others, nothing listens at the address and port yet ("no listener on
    /// ..."): a source started before its destination listens may retry
    /// until a deadline of its own, or wait for word from the destination's
    /// side that its listener is up.
    Connect = 6 => RDMAMIG_ERR_CONNECT, "connection establishment failed" {
        /// Address/route resolution or connection establishment failed; among
        /// others, nothing listens at the address and port yet (the message says
        /// "no listener on ..."). A source started before its destination
        /// listens may call `rdmamig_connect` again until a deadline of its own,
        /// or wait for word from the destination's side that
        /// `rdmamig_listener_new` returned.
    };
    /// The peer speaks another protocol version.
    Version = 7 => RDMAMIG_ERR_VERSION, "peer speaks another protocol version";
    /// The peer sent a malformed or unexpected message.
    Protocol = 8 => RDMAMIG_ERR_PROTOCOL, "peer sent a malformed or unexpected message";
    /// The peer reported an error (an ERROR control message).
    PeerError = 9 => RDMAMIG_ERR_PEER, "peer reported an error";
    /// The peer disconnected or the device went away.
    Disconnected = 10 => RDMAMIG_ERR_DISCONNECTED, "peer disconnected or device went away";
    /// A wait ran past its deadline.
    Timeout = 11 => RDMAMIG_ERR_TIMEOUT, "timed out";
    /// The RAM block lists of the two sides do not match.
    BlockMismatch = 12 => RDMAMIG_ERR_BLOCK_MISMATCH, "RAM block lists of the two sides do not match";
    /// The connection was aborted by an earlier error; that error's message is kept.
    Aborted = 13 => RDMAMIG_ERR_ABORTED, "connection aborted by an earlier error";
    /// The call is not valid in the object's current state.
    State = 14 => RDMAMIG_ERR_STATE, "operation not valid in the current state";
    /// The hypervisor cancelled the wait (`Listener::cancel`).
    Cancelled = 18 => RDMAMIG_ERR_CANCELLED, "cancelled" {
        /// The wait was cancelled (`rdmamig_listener_cancel`).
    };
    /// Memory could not be registered within the pin budget (or the kernel's
    /// memlock limit), or a peer asked for more than this side's budget.
    PinBudget = 19 => RDMAMIG_ERR_PIN_BUDGET, "pin budget exceeded" {
        /// Guest memory could not be registered within the pin budget
        /// (`rdmamig_config_set_pin_budget`) or the kernel's memlock limit, even
        /// after unpinning what could be; or, on a destination, the source asked
        /// to pin more than the destination's budget.
    };
    /// Peer authentication failed: the peer did not prove the pre-shared key
    /// (or does not authenticate while this side requires it), or its address
    /// is not on the listener's allow-list.
    Auth = 20 => RDMAMIG_ERR_AUTH, "peer authentication failed or peer not allowed" {
        /// Peer authentication failed: the peer did not prove the pre-shared key
        /// (`rdmamig_config_set_auth_key`), does not authenticate while this side
        /// requires it, or (destination) its address is not allowed
        /// (`rdmamig_config_allow_source`).
    };
    /// Nothing is ready yet and the call was asked not to wait (a timeout of
    /// `Duration::ZERO`): call again once the connection's event fd is
    /// readable. Not a failure of the connection.
    WouldBlock = 21 => RDMAMIG_ERR_WOULD_BLOCK, "nothing ready yet (the call was asked not to wait)" {
        /// Not a failure: nothing is ready yet and the call was asked not to
        /// wait (`RDMAMIG_NO_WAIT`). Call again once the connection's event fd
        /// (`rdmamig_conn_event_fd`) is readable.
    };
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
