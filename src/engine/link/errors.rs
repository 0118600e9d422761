//! The link's errors: a verbs failure, a malformed message, a message that
//! cannot be encoded, and a setup that failed (with whether the kernel
//! refused to pin, which a destination tells its source).

use crate::host::limits;
use crate::verbs::VerbsError;
use crate::wire::{EncodeError, CONTROL_BUFFER_SIZE};
use crate::{Error, ErrorKind};

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Self {
        let kind = if e.is_no_device() { ErrorKind::NoDevice } else { ErrorKind::Verbs };
        Error::new(kind, e.to_string())
    }
}

pub(crate) fn protocol_error(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Protocol, format!("malformed message from peer: {e}"))
}

pub(super) fn encode_error(e: EncodeError) -> Error {
    Error::new(ErrorKind::InvalidArgument, format!("cannot encode control message: {e}"))
}

/// Why a link could not be set up: the error, and whether the kernel
/// refused to pin a control buffer (a destination tells the source so).
pub(super) struct SetupFailed {
    pub error: Error,
    pub pin_refused: bool,
}

impl SetupFailed {
    /// A control buffer's registration failed; a refusal to pin says what bounds pinning here.
    pub(super) fn control_buffer(e: VerbsError) -> Self {
        let pin_refused = limits::is_pin_refusal(&e);
        let mut error = Error::from(e);
        error.message = format!("registering a {} KiB control buffer: {}", CONTROL_BUFFER_SIZE >> 10, error.message);
        if pin_refused {
            error.message = format!("{}: the kernel refused to pin it: {}", error.message, limits::memlock_advice());
        }
        SetupFailed { error, pin_refused }
    }
}

impl From<Error> for SetupFailed {
    fn from(error: Error) -> Self {
        SetupFailed { error, pin_refused: false }
    }
}

impl From<VerbsError> for SetupFailed {
    fn from(e: VerbsError) -> Self {
        Error::from(e).into()
    }
}

impl From<SetupFailed> for Error {
    fn from(failed: SetupFailed) -> Self {
        failed.error
    }
}
