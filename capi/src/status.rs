//! `rdmamig_status`: the result of every fallible C function.

use rdmamig::Ending;
use rdmamig::{Error, ErrorKind};
use std::ffi::CStr;

/// The result of a fallible rdmamig call. `RDMAMIG_OK` (0) is success;
/// `RDMAMIG_END_COMPLETED` and `RDMAMIG_END_UNVERIFIED` say how a migration
/// connection ended without failing (`rdmamig_conn_get`,
/// `rdmamig_conn_wait_end`, `rdmamig_conn_close`); every other value is an
/// error. So success is not only `RDMAMIG_OK`: a check written as
/// `status != RDMAMIG_OK` takes a completed migration for a failure. Test
/// with `rdmamig_status_is_error(status)` (since 0.13), which is false for
/// exactly those three values.
///
/// The values are part of the ABI: each is fixed forever, and a value that is
/// retired is never reused for another meaning. New values are only ever added
/// at the end. Callers must be prepared for values they do not know yet
/// (`rdmamig_status_str` returns "unknown status" for them).
///
/// In C the type is a `uint32_t` (C23 and C++ see an enum with that underlying
/// type).
//
// Generated, with `ALL` and the descriptions, from the library's one list of
// the error kinds (`ErrorKind::ALL`, src/error.rs), in C words where
// `C_WORDING` has them, and the C API's own statuses (`OWN_STATUSES` below);
// see capi/src/generated.rs. The test
// `generated_statuses` fails while they differ.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum rdmamig_status {
    // BEGIN generated from rdmamig::ErrorKind::ALL and OWN_STATUSES (make generate)
    /// Success.
    RDMAMIG_OK = 0,
    /// A required pointer argument was NULL.
    RDMAMIG_ERR_NULL_PARAMETER = 1,
    /// rdmamig panicked (an internal bug); the panic was stopped at the API
    /// boundary. The handle involved should only be freed afterwards.
    RDMAMIG_ERR_PANIC = 2,
    /// An argument was present but not valid (bad length, not UTF-8, out of range, ...).
    RDMAMIG_ERR_INVALID_ARGUMENT = 3,
    /// No RDMA device is present or usable on this host.
    RDMAMIG_ERR_NO_DEVICE = 4,
    /// A verbs or rdma_cm call failed.
    RDMAMIG_ERR_VERBS = 5,
    /// Address/route resolution or connection establishment failed; among
    /// others, nothing listens at the address and port yet (the message says
    /// "no listener on ..."). A source started before its destination
    /// listens may call `rdmamig_connect` again until a deadline of its own,
    /// or wait for word from the destination's side that
    /// `rdmamig_listener_new` returned.
    RDMAMIG_ERR_CONNECT = 6,
    /// The peer speaks another protocol version.
    RDMAMIG_ERR_VERSION = 7,
    /// The peer sent a malformed or unexpected message.
    RDMAMIG_ERR_PROTOCOL = 8,
    /// The peer reported an error (an ERROR control message).
    RDMAMIG_ERR_PEER = 9,
    /// The peer disconnected or the device went away.
    RDMAMIG_ERR_DISCONNECTED = 10,
    /// A wait ran past its deadline.
    RDMAMIG_ERR_TIMEOUT = 11,
    /// The RAM block lists of the two sides do not match.
    RDMAMIG_ERR_BLOCK_MISMATCH = 12,
    /// The connection was aborted by an earlier error; that error's message is kept.
    RDMAMIG_ERR_ABORTED = 13,
    /// The call is not valid in the object's current state.
    RDMAMIG_ERR_STATE = 14,
    /// A caller-supplied output buffer is too small; the call says how much is needed.
    RDMAMIG_ERR_BUFFER_TOO_SMALL = 15,
    /// Not an error: the migration completed. The source's last window and
    /// last stream byte were followed by its end marker, which the destination
    /// checked against what it received and acknowledged. Only between
    /// rdmamig peers.
    RDMAMIG_END_COMPLETED = 16,
    /// Not an error, and not a proof: the peer (QEMU, which has no completion
    /// handshake) closed the connection outside any iteration window. Whether
    /// the migration is complete is for the stream to prove (QEMU's
    /// QEMU_VM_EOF); a source gets it when everything was sent and written.
    RDMAMIG_END_UNVERIFIED = 17,
    /// The wait was cancelled (`rdmamig_listener_cancel`).
    RDMAMIG_ERR_CANCELLED = 18,
    /// Guest memory could not be registered within the pin budget
    /// (`rdmamig_config_set_pin_budget`) or the kernel's memlock limit, even
    /// after unpinning what could be; or, on a destination, the source asked
    /// to pin more than the destination's budget.
    RDMAMIG_ERR_PIN_BUDGET = 19,
    /// Peer authentication failed: the peer did not prove the pre-shared key
    /// (`rdmamig_config_set_auth_key`), does not authenticate while this side
    /// requires it, or (destination) its address is not allowed
    /// (`rdmamig_config_allow_source`).
    RDMAMIG_ERR_AUTH = 20,
    /// Not a failure: nothing is ready yet and the call was asked not to
    /// wait (`RDMAMIG_NO_WAIT`). Call again once the connection's event fd
    /// (`rdmamig_conn_event_fd`) is readable.
    RDMAMIG_ERR_WOULD_BLOCK = 21,
    // END generated
}

/// A status of the generated blocks in this file: an `ErrorKind`'s or one
/// of `OWN_STATUSES`.
#[cfg(test)]
#[derive(Clone)]
struct Status {
    value: u32,
    name: std::borrow::Cow<'static, str>,
    doc: &'static str,
    description: &'static str,
}

/// `own_statuses! { /// doc  NAME = value, "description"; ... }`: the
/// `Status`es of the list.
#[cfg(test)]
macro_rules! own_statuses {
    ($($(#[doc = $doc:literal])* $name:ident = $value:literal, $description:literal;)*) => {
        &[$(Status {
            value: $value,
            name: std::borrow::Cow::Borrowed(stringify!($name)),
            doc: concat!($($doc, "\n"),*),
            description: $description,
        }),*]
    };
}

/// An `ErrorKind`'s status: `RDMAMIG_ERR_` and the kind's name in
/// capitals, with the kind's value, doc and description, but for the names
/// and docs of `C_WORDING`.
#[cfg(test)]
fn kind_status(kind: ErrorKind) -> Status {
    let wording = C_WORDING.iter().find(|(k, ..)| *k == kind);
    let name = match wording.and_then(|(_, name, _)| *name) {
        Some(name) => std::borrow::Cow::Borrowed(name),
        None => {
            let mut name = String::from("RDMAMIG_ERR");
            for c in kind.name().chars() {
                if c.is_uppercase() {
                    name.push('_');
                }
                name.push(c.to_ascii_uppercase());
            }
            std::borrow::Cow::Owned(name)
        }
    };
    let doc = wording.and_then(|(.., doc)| *doc).unwrap_or(kind.doc());
    Status { value: kind as u32, name, doc, description: kind.description() }
}

/// `c_wording! { Kind NAME? { /// doc }?; ... }`: the entries of `C_WORDING`.
#[cfg(test)]
macro_rules! c_wording {
    ($($kind:ident $($name:ident)? $({ $(#[doc = $doc:literal])* })?;)*) => {
        &[$((ErrorKind::$kind, c_wording!(@opt $(stringify!($name))?), c_wording!(@opt $(concat!($($doc, "\n"),*))?))),*]
    };
    (@opt $x:expr) => { Some($x) };
    (@opt) => { None };
}

/// Where a kind's status says it in C words: a name other than the kind's
/// in capitals, or a doc that names C functions where the kind's names Rust
/// items. Wording only: a kind not here is generated all the same.
#[cfg(test)]
const C_WORDING: &[(ErrorKind, Option<&str>, Option<&str>)] = c_wording! {
    InvalidArgument {
        /// An argument was present but not valid (bad length, not UTF-8, out of range, ...).
    };
    Connect {
        /// Address/route resolution or connection establishment failed; among
        /// others, nothing listens at the address and port yet (the message says
        /// "no listener on ..."). A source started before its destination
        /// listens may call `rdmamig_connect` again until a deadline of its own,
        /// or wait for word from the destination's side that
        /// `rdmamig_listener_new` returned.
    };
    PeerError RDMAMIG_ERR_PEER;
    Cancelled {
        /// The wait was cancelled (`rdmamig_listener_cancel`).
    };
    PinBudget {
        /// Guest memory could not be registered within the pin budget
        /// (`rdmamig_config_set_pin_budget`) or the kernel's memlock limit, even
        /// after unpinning what could be; or, on a destination, the source asked
        /// to pin more than the destination's budget.
    };
    Auth {
        /// Peer authentication failed: the peer did not prove the pre-shared key
        /// (`rdmamig_config_set_auth_key`), does not authenticate while this side
        /// requires it, or (destination) its address is not allowed
        /// (`rdmamig_config_allow_source`).
    };
    WouldBlock {
        /// Not a failure: nothing is ready yet and the call was asked not to
        /// wait (`RDMAMIG_NO_WAIT`). Call again once the connection's event fd
        /// (`rdmamig_conn_event_fd`) is readable.
    };
};

/// The statuses that are no `ErrorKind`, the rest of the generated blocks:
/// the C API's own (success, its argument checks, a panic stopped at the
/// boundary) and the two endings. A new one takes the next free value, as a
/// new `ErrorKind` does (src/error.rs).
#[cfg(test)]
const OWN_STATUSES: &[Status] = own_statuses! {
    /// Success.
    RDMAMIG_OK = 0, "success";
    /// A required pointer argument was NULL.
    RDMAMIG_ERR_NULL_PARAMETER = 1, "a required pointer argument was NULL";
    /// rdmamig panicked (an internal bug); the panic was stopped at the API
    /// boundary. The handle involved should only be freed afterwards.
    RDMAMIG_ERR_PANIC = 2, "internal error: rdmamig panicked (caught at the API boundary)";
    /// A caller-supplied output buffer is too small; the call says how much is needed.
    RDMAMIG_ERR_BUFFER_TOO_SMALL = 15, "output buffer too small";
    /// Not an error: the migration completed. The source's last window and
    /// last stream byte were followed by its end marker, which the destination
    /// checked against what it received and acknowledged. Only between
    /// rdmamig peers.
    RDMAMIG_END_COMPLETED = 16, "migration completed (acknowledged by the destination)";
    /// Not an error, and not a proof: the peer (QEMU, which has no completion
    /// handshake) closed the connection outside any iteration window. Whether
    /// the migration is complete is for the stream to prove (QEMU's
    /// QEMU_VM_EOF); a source gets it when everything was sent and written.
    RDMAMIG_END_UNVERIFIED = 17,
        "peer closed the connection without a completion handshake: the stream must prove completeness";
};

impl rdmamig_status {
    /// Every value, in numeric order.
    pub(crate) const ALL: &'static [rdmamig_status] = {
        use rdmamig_status::*;
        &[
            // BEGIN generated from rdmamig::ErrorKind::ALL and OWN_STATUSES, the values (make generate)
            RDMAMIG_OK,
            RDMAMIG_ERR_NULL_PARAMETER,
            RDMAMIG_ERR_PANIC,
            RDMAMIG_ERR_INVALID_ARGUMENT,
            RDMAMIG_ERR_NO_DEVICE,
            RDMAMIG_ERR_VERBS,
            RDMAMIG_ERR_CONNECT,
            RDMAMIG_ERR_VERSION,
            RDMAMIG_ERR_PROTOCOL,
            RDMAMIG_ERR_PEER,
            RDMAMIG_ERR_DISCONNECTED,
            RDMAMIG_ERR_TIMEOUT,
            RDMAMIG_ERR_BLOCK_MISMATCH,
            RDMAMIG_ERR_ABORTED,
            RDMAMIG_ERR_STATE,
            RDMAMIG_ERR_BUFFER_TOO_SMALL,
            RDMAMIG_END_COMPLETED,
            RDMAMIG_END_UNVERIFIED,
            RDMAMIG_ERR_CANCELLED,
            RDMAMIG_ERR_PIN_BUDGET,
            RDMAMIG_ERR_AUTH,
            RDMAMIG_ERR_WOULD_BLOCK,
            // END generated
        ]
    };

    /// The status with this numeric value, if there is one. Values coming from
    /// C must go through this (an out-of-range enum value is UB in Rust), so C
    /// functions taking a status take a `u32`.
    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| *s as u32 == v)
    }

    /// Whether this is an error: every value but `RDMAMIG_OK` and the two
    /// endings that do not fail (what `rdmamig_status_is_error` returns).
    pub fn is_error(self) -> bool {
        use rdmamig_status::*;
        !matches!(self, RDMAMIG_OK | RDMAMIG_END_COMPLETED | RDMAMIG_END_UNVERIFIED)
    }

    /// A short, static, lower-case description (what `rdmamig_status_str` returns).
    pub fn description(self) -> &'static CStr {
        use rdmamig_status::*;
        match self {
            // BEGIN generated from rdmamig::ErrorKind::ALL and OWN_STATUSES, the descriptions (make generate)
            RDMAMIG_OK => c"success",
            RDMAMIG_ERR_NULL_PARAMETER => c"a required pointer argument was NULL",
            RDMAMIG_ERR_PANIC => c"internal error: rdmamig panicked (caught at the API boundary)",
            RDMAMIG_ERR_INVALID_ARGUMENT => c"invalid argument",
            RDMAMIG_ERR_NO_DEVICE => c"no RDMA device present or usable",
            RDMAMIG_ERR_VERBS => c"verbs or rdma_cm call failed",
            RDMAMIG_ERR_CONNECT => c"connection establishment failed",
            RDMAMIG_ERR_VERSION => c"peer speaks another protocol version",
            RDMAMIG_ERR_PROTOCOL => c"peer sent a malformed or unexpected message",
            RDMAMIG_ERR_PEER => c"peer reported an error",
            RDMAMIG_ERR_DISCONNECTED => c"peer disconnected or device went away",
            RDMAMIG_ERR_TIMEOUT => c"timed out",
            RDMAMIG_ERR_BLOCK_MISMATCH => c"RAM block lists of the two sides do not match",
            RDMAMIG_ERR_ABORTED => c"connection aborted by an earlier error",
            RDMAMIG_ERR_STATE => c"operation not valid in the current state",
            RDMAMIG_ERR_BUFFER_TOO_SMALL => c"output buffer too small",
            RDMAMIG_END_COMPLETED => c"migration completed (acknowledged by the destination)",
            RDMAMIG_END_UNVERIFIED => {
                c"peer closed the connection without a completion handshake: the stream must prove completeness"
            }
            RDMAMIG_ERR_CANCELLED => c"cancelled",
            RDMAMIG_ERR_PIN_BUDGET => c"pin budget exceeded",
            RDMAMIG_ERR_AUTH => c"peer authentication failed or peer not allowed",
            RDMAMIG_ERR_WOULD_BLOCK => c"nothing ready yet (the call was asked not to wait)",
            // END generated
        }
    }
}

impl From<ErrorKind> for rdmamig_status {
    /// The status whose value is the kind's (`ErrorKind::ALL`).
    fn from(kind: ErrorKind) -> Self {
        Self::from_u32(kind as u32).expect("every ErrorKind has its rdmamig_status (test generated_statuses)")
    }
}

impl From<Ending> for rdmamig_status {
    /// How `rdmamig_conn_get` and `rdmamig_conn_wait_end` report an ending.
    fn from(ending: Ending) -> Self {
        match ending {
            Ending::Completed => rdmamig_status::RDMAMIG_END_COMPLETED,
            Ending::Unverified => rdmamig_status::RDMAMIG_END_UNVERIFIED,
        }
    }
}

/// A body that succeeded returns `RDMAMIG_OK`.
impl From<()> for rdmamig_status {
    fn from(_: ()) -> Self {
        rdmamig_status::RDMAMIG_OK
    }
}

impl From<&Error> for rdmamig_status {
    fn from(e: &Error) -> Self {
        e.kind.into()
    }
}

impl From<Error> for rdmamig_status {
    fn from(e: Error) -> Self {
        e.kind.into()
    }
}

impl From<rdmamig::Result<()>> for rdmamig_status {
    fn from(r: rdmamig::Result<()>) -> Self {
        status_of(&r)
    }
}

/// `RDMAMIG_OK` for `Ok`, the kind's status for `Err`.
pub(crate) fn status_of<T>(r: &rdmamig::Result<T>) -> rdmamig_status {
    match r {
        Ok(_) => rdmamig_status::RDMAMIG_OK,
        Err(e) => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::{check_or_rewrite, doc_comment};

    #[test]
    fn values_are_dense_ordered_and_round_trip() {
        for (i, s) in rdmamig_status::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32, "{s:?}");
            assert_eq!(rdmamig_status::from_u32(i as u32), Some(*s));
        }
        assert_eq!(rdmamig_status::from_u32(rdmamig_status::ALL.len() as u32), None);
        assert_eq!(rdmamig_status::from_u32(u32::MAX), None);
    }

    #[test]
    fn descriptions_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for s in rdmamig_status::ALL {
            assert!(seen.insert(s.description()), "{s:?}");
        }
    }

    #[test]
    fn success_is_ok_and_the_two_endings() {
        use rdmamig_status::*;
        let successes: Vec<_> = rdmamig_status::ALL.iter().copied().filter(|s| !s.is_error()).collect();
        assert_eq!(successes, [RDMAMIG_OK, RDMAMIG_END_COMPLETED, RDMAMIG_END_UNVERIFIED]);
        assert!(RDMAMIG_ERR_WOULD_BLOCK.is_error(), "nothing was done: the caller checks for it first");
    }

    /// The enum, `ALL` and the descriptions between the markers are
    /// `ErrorKind::ALL` and `OWN_STATUSES` in value order;
    /// `RDMAMIG_REGENERATE=1` rewrites them (`make generate`).
    #[test]
    fn generated_statuses() {
        let kinds = ErrorKind::ALL.iter().map(|&k| kind_status(k));
        let mut all: Vec<Status> = OWN_STATUSES.iter().cloned().chain(kinds).collect();
        all.sort_by_key(|s| s.value);
        for pair in all.windows(2) {
            assert_ne!(pair[0].value, pair[1].value, "{} and {} share a value", pair[0].name, pair[1].name);
        }
        let variants: String =
            all.iter().map(|s| format!("{}    {} = {},\n", doc_comment("    ", s.doc), s.name, s.value)).collect();
        check_or_rewrite("status.rs", "rdmamig::ErrorKind::ALL and OWN_STATUSES", &variants);
        let values: String = all.iter().map(|s| format!("            {},\n", s.name)).collect();
        check_or_rewrite("status.rs", "rdmamig::ErrorKind::ALL and OWN_STATUSES, the values", &values);
        // As rustfmt has them: an arm too long for a line (max_width 120) in a block.
        let arm = |s: &Status| {
            let line = format!("            {} => c{:?},\n", s.name, s.description);
            if line.len() - 1 <= 120 {
                line
            } else {
                format!("            {} => {{\n                c{:?}\n            }}\n", s.name, s.description)
            }
        };
        let descriptions: String = all.iter().map(arm).collect();
        check_or_rewrite("status.rs", "rdmamig::ErrorKind::ALL and OWN_STATUSES, the descriptions", &descriptions);
    }

    #[test]
    fn every_error_kind_maps_to_an_error() {
        let kinds = ErrorKind::ALL.iter().copied();
        let mut seen = std::collections::HashSet::new();
        for k in kinds {
            let s = rdmamig_status::from(k);
            assert!(s.is_error(), "{k:?}");
            assert!(seen.insert(s), "{k:?} shares a status");
        }
        let ok: rdmamig::Result<()> = Ok(());
        assert_eq!(rdmamig_status::from(ok), rdmamig_status::RDMAMIG_OK);
        let err: rdmamig::Result<()> = Err(Error::new(ErrorKind::Timeout, "x"));
        assert_eq!(rdmamig_status::from(err), rdmamig_status::RDMAMIG_ERR_TIMEOUT);
    }
}
