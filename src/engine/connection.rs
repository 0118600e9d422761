//! One migration connection of either role, for interfaces that hold a
//! connection without knowing its role at compile time (the C ABI's
//! `rdmamig_conn`): which calls fit which role, closing, and the message of
//! the last call that failed.

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Destination, Ending, Negotiated, Source, Stats, Unregistration};
use crate::{Error, ErrorKind, Result};

/// The role a [`Connection`] is in. A connection starts as a source or a
/// destination and becomes `Closed` once [`Connection::close`] ran.
enum Role {
    Source(Source),
    Destination(Destination),
    Closed,
}

/// A source or a destination behind one type. Calls that do not fit its role
/// (or come after [`Connection::close`]) fail with [`ErrorKind::State`],
/// their message naming the call (`call`, as the caller's interface spells it).
pub(crate) struct Connection {
    role: Role,
    /// The message of the last call on this connection that failed.
    last_error: Mutex<Option<String>>,
    /// Keeps the unregistration worker running until the connection is
    /// dropped, so that closing does not wait for deregistration.
    _unregistration: Option<Arc<Unregistration>>,
}

impl Role {
    /// The failure for `call`, which needs a `wanted` connection.
    fn wrong(&self, call: &str, wanted: &str) -> Error {
        let message = match self {
            Role::Closed => format!("{call}: the connection is closed; only rdmamig_conn_free is valid"),
            Role::Source(_) => format!("{call}: needs a {wanted} connection, this one is a source"),
            Role::Destination(_) => format!("{call}: needs a {wanted} connection, this one is a destination"),
        };
        Error::new(ErrorKind::State, message)
    }
}

/// The role's calls that take `&self` run concurrently (`save` from several
/// threads while another reads stats), so both roles must be `Sync`.
const _: () = {
    const fn is_sync<T: Sync>() {}
    is_sync::<Source>();
    is_sync::<Destination>();
};

impl Connection {
    fn new(role: Role) -> Self {
        let unregistration = match &role {
            Role::Source(s) => s.unregistration(),
            Role::Destination(d) => d.unregistration(),
            Role::Closed => None,
        };
        Connection { role, last_error: Mutex::new(None), _unregistration: unregistration }
    }

    pub fn source(source: Source) -> Self {
        Self::new(Role::Source(source))
    }

    pub fn destination(destination: Destination) -> Self {
        Self::new(Role::Destination(destination))
    }

    /// A connection that is already closed (for tests of the wrong-role paths).
    #[cfg(test)]
    pub fn closed() -> Self {
        Self::new(Role::Closed)
    }

    pub fn as_source(&self, call: &str) -> Result<&Source> {
        match &self.role {
            Role::Source(s) => Ok(s),
            _ => Err(self.role.wrong(call, "source")),
        }
    }

    pub fn as_destination(&self, call: &str) -> Result<&Destination> {
        match &self.role {
            Role::Destination(d) => Ok(d),
            _ => Err(self.role.wrong(call, "destination")),
        }
    }

    /// The connection's pollable fd (`Source::event_fd`, `Destination::event_fd`).
    pub fn event_fd(&self, call: &str) -> Result<BorrowedFd<'_>> {
        match &self.role {
            Role::Source(s) => Ok(s.event_fd()),
            Role::Destination(d) => Ok(d.event_fd()),
            Role::Closed => Err(self.role.wrong(call, "open")),
        }
    }

    pub fn is_source(&self) -> bool {
        matches!(self.role, Role::Source(_))
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.role, Role::Closed)
    }

    /// Fails after [`Connection::close`]; `Ok` for either open role.
    pub fn check_open(&self, call: &str) -> Result<()> {
        if self.is_closed() {
            return Err(self.role.wrong(call, "open"));
        }
        Ok(())
    }

    pub fn stats(&self, call: &str) -> Result<Stats> {
        match &self.role {
            Role::Source(s) => Ok(s.stats()),
            Role::Destination(d) => Ok(d.stats()),
            Role::Closed => Err(self.role.wrong(call, "open")),
        }
    }

    pub fn negotiated(&self, call: &str) -> Result<Negotiated> {
        match &self.role {
            Role::Source(s) => Ok(s.negotiated()),
            Role::Destination(d) => Ok(d.negotiated()),
            Role::Closed => Err(self.role.wrong(call, "open")),
        }
    }

    /// Aborts either role (see [`Source::abort`], [`Destination::abort`]).
    pub fn abort(&self, call: &str) -> Result<()> {
        match &self.role {
            Role::Source(s) => s.abort(),
            Role::Destination(d) => d.abort(),
            Role::Closed => return Err(self.role.wrong(call, "open")),
        }
        Ok(())
    }

    /// Closes: a source flushes, runs the completion handshake and
    /// disconnects ([`Source::close`]); a destination stops serving and
    /// reports how the connection had ended. Afterwards the connection is
    /// closed whatever the outcome.
    pub fn close(&mut self, call: &str) -> Result<Ending> {
        match std::mem::replace(&mut self.role, Role::Closed) {
            Role::Source(s) => s.close(),
            Role::Destination(d) => {
                d.close();
                d.wait_end(None)
            }
            Role::Closed => Err(Role::Closed.wrong(call, "open")),
        }
    }

    /// Keeps `message` as the last failed call's.
    pub fn set_last_error(&self, message: &str) {
        *self.last_error.lock() = Some(message.to_string());
    }

    /// The last failed call's message, else the failure that ended the connection.
    pub fn error_message(&self) -> Option<String> {
        let ended = || match &self.role {
            Role::Source(s) => s.error(),
            Role::Destination(d) => d.error(),
            Role::Closed => None,
        };
        self.last_error.lock().clone().or_else(|| ended().map(|e| e.message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_connection_refuses_every_role_call() {
        let mut c = Connection::closed();
        assert!(c.is_closed() && !c.is_source());
        for e in [
            c.as_source("f").err(),
            c.as_destination("f").err(),
            c.stats("f").err(),
            c.negotiated("f").err(),
            c.abort("f").err(),
            c.check_open("f").err(),
        ] {
            let e = e.expect("an error");
            assert_eq!(
                (e.kind, e.message.as_str()),
                (ErrorKind::State, "f: the connection is closed; only rdmamig_conn_free is valid")
            );
        }
        assert_eq!(c.as_source("g").err().map(|e| e.kind), Some(ErrorKind::State));
        assert_eq!(c.close("h").err().map(|e| e.kind), Some(ErrorKind::State));
        assert_eq!(c.error_message(), None);
        c.set_last_error("h: no");
        assert_eq!(c.error_message().as_deref(), Some("h: no"));
    }
}
