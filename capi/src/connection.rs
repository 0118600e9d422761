//! One migration connection of either role, for interfaces that hold a
//! connection without knowing its role at compile time (the C ABI's
//! `rdmamig_conn`): which calls fit which role, closing, and the message of
//! the last call that failed.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;

use std::time::Duration;

use rdmamig::{Destination, Ending, Negotiated, PostcopyLink, Source, Stats};
use rdmamig::{Error, ErrorKind, Result};

/// The role a [`Connection`] plays, for its whole life.
enum Role {
    Source(Source),
    Destination(Destination),
}

/// Where a [`Connection`] is in its life (`Connection::phase`).
const OPEN: u8 = 0;
/// `close` is running: only `abort` and the read-only calls may run alongside.
const CLOSING: u8 = 1;
/// `close` returned: every call but the error message fails.
const CLOSED: u8 = 2;

/// A source or a destination behind one type. Calls that do not fit its role
/// (or come after [`Connection::close`]) fail with [`ErrorKind::State`],
/// their message naming the call (`call`, as the caller's interface spells it).
///
/// Every call takes `&self`, `close` too: an `abort` from another thread may
/// then stop a `close` blocked in the completion handshake. So the role is
/// never taken out; a closed connection keeps its (stopped) role until it
/// is dropped, and `phase` refuses the calls.
pub(crate) struct Connection {
    role: Role,
    phase: AtomicU8,
    /// The message of the last call on this connection that failed.
    last_error: Mutex<Option<String>>,
}

/// The failure for `call` on a closed connection.
fn closed_error(call: &str) -> Error {
    Error::new(ErrorKind::State, format!("{call}: the connection is closed; only rdmamig_conn_free is valid"))
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
        Connection { role, phase: AtomicU8::new(OPEN), last_error: Mutex::new(None) }
    }

    pub fn source(source: Source) -> Self {
        Self::new(Role::Source(source))
    }

    pub fn destination(destination: Destination) -> Self {
        Self::new(Role::Destination(destination))
    }

    /// A source connection that is already closed and never had a peer (for
    /// tests of the argument and closed-connection paths).
    #[cfg(test)]
    pub fn closed() -> Self {
        let c = Self::source(rdmamig::test_support::detached_source());
        c.phase.store(CLOSED, Ordering::Relaxed);
        c
    }

    /// `role` if the connection is not closed, else the failure for `call`.
    fn open_role(&self, call: &str) -> Result<&Role> {
        if self.is_closed() {
            return Err(closed_error(call));
        }
        Ok(&self.role)
    }

    /// The failure for `call`, which needs a `wanted` connection (the other role).
    fn wrong_role(&self, call: &str, wanted: &str) -> Error {
        let this = match self.role {
            Role::Source(_) => "source",
            Role::Destination(_) => "destination",
        };
        Error::new(ErrorKind::State, format!("{call}: needs a {wanted} connection, this one is a {this}"))
    }

    pub fn as_source(&self, call: &str) -> Result<&Source> {
        match self.open_role(call)? {
            Role::Source(s) => Ok(s),
            _ => Err(self.wrong_role(call, "source")),
        }
    }

    pub fn as_destination(&self, call: &str) -> Result<&Destination> {
        match self.open_role(call)? {
            Role::Destination(d) => Ok(d),
            _ => Err(self.wrong_role(call, "destination")),
        }
    }

    /// The connection's pollable fd (`Source::event_fd`, `Destination::event_fd`).
    pub fn event_fd(&self, call: &str) -> Result<BorrowedFd<'_>> {
        Ok(match self.open_role(call)? {
            Role::Source(s) => s.event_fd(),
            Role::Destination(d) => d.event_fd(),
        })
    }

    /// `wait_postcopy_link` of either role.
    pub fn wait_postcopy_link(
        &self,
        call: &str,
        known: PostcopyLink,
        timeout: Option<Duration>,
    ) -> Result<PostcopyLink> {
        Ok(match self.open_role(call)? {
            Role::Source(s) => s.wait_postcopy_link(known, timeout),
            Role::Destination(d) => d.wait_postcopy_link(known, timeout),
        })
    }

    /// `postcopy_recover` of either role.
    pub fn postcopy_recover(&self, call: &str) -> Result<()> {
        match self.open_role(call)? {
            Role::Source(s) => s.postcopy_recover(),
            Role::Destination(d) => d.postcopy_recover(),
        }
    }

    pub fn is_source(&self) -> bool {
        matches!(self.role, Role::Source(_))
    }

    pub fn is_closed(&self) -> bool {
        self.phase.load(Ordering::Acquire) == CLOSED
    }

    /// Fails after [`Connection::close`]; `Ok` for either open role.
    pub fn check_open(&self, call: &str) -> Result<()> {
        self.open_role(call).map(|_| ())
    }

    pub fn stats(&self, call: &str) -> Result<Stats> {
        Ok(match self.open_role(call)? {
            Role::Source(s) => s.stats(),
            Role::Destination(d) => d.stats(),
        })
    }

    pub fn negotiated(&self, call: &str) -> Result<Negotiated> {
        Ok(match self.open_role(call)? {
            Role::Source(s) => s.negotiated(),
            Role::Destination(d) => d.negotiated(),
        })
    }

    /// Aborts either role (see [`Source::abort`], [`Destination::abort`]),
    /// also while `close` runs: a `close` waiting for the peer then returns.
    pub fn abort(&self, call: &str) -> Result<()> {
        match self.open_role(call)? {
            Role::Source(s) => s.abort(),
            Role::Destination(d) => d.abort(),
        }
        Ok(())
    }

    /// Closes: a source flushes, runs the completion handshake and
    /// disconnects ([`Source::close`]); a destination stops serving and
    /// reports how the connection had ended. Afterwards the connection is
    /// closed whatever the outcome. Only the first call closes; another,
    /// during or after it, fails with `State`.
    pub fn close(&self, call: &str) -> Result<Ending> {
        if self.phase.compare_exchange(OPEN, CLOSING, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Err(match self.is_closed() {
                true => closed_error(call),
                false => Error::new(ErrorKind::State, format!("{call}: the connection is already closing")),
            });
        }
        /// Closed however the close ends, a panic (caught at the C boundary) included.
        struct Closed<'a>(&'a AtomicU8);
        impl Drop for Closed<'_> {
            fn drop(&mut self) {
                self.0.store(CLOSED, Ordering::Release);
            }
        }
        let _closed = Closed(&self.phase);
        match &self.role {
            Role::Source(s) => s.close(),
            Role::Destination(d) => {
                d.close();
                d.wait_end(None)
            }
        }
    }

    /// Keeps `message` as the last failed call's.
    pub fn set_last_error(&self, message: &str) {
        *self.last_error.lock() = Some(message.to_string());
    }

    /// The last failed call's message, else the failure that ended the
    /// connection. After `close` only the former: a failed close left its
    /// message there, and a closed role's stored error may only say that it
    /// was closed.
    pub fn error_message(&self) -> Option<String> {
        let ended = || match &self.role {
            Role::Source(s) => s.error(),
            Role::Destination(d) => d.error(),
        };
        let last = self.last_error.lock().clone();
        match self.is_closed() {
            true => last,
            false => last.or_else(|| ended().map(|e| e.message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_connection_refuses_every_role_call() {
        let c = Connection::closed();
        assert!(c.is_closed());
        for e in [
            c.as_source("f").err(),
            c.as_destination("f").err(),
            c.stats("f").err(),
            c.negotiated("f").err(),
            c.abort("f").err(),
            c.check_open("f").err(),
            c.event_fd("f").err(),
            c.close("f").err(),
        ] {
            let e = e.expect("an error");
            assert_eq!(
                (e.kind, e.message.as_str()),
                (ErrorKind::State, "f: the connection is closed; only rdmamig_conn_free is valid")
            );
        }
        assert_eq!(c.error_message(), None);
        c.set_last_error("h: no");
        assert_eq!(c.error_message().as_deref(), Some("h: no"));
    }

    #[test]
    fn an_open_connection_refuses_the_other_role_and_a_second_close() {
        let c = Connection::source(rdmamig::test_support::detached_source());
        assert!(!c.is_closed() && c.is_source());
        assert!(c.as_source("f").is_ok() && c.stats("f").is_ok() && c.check_open("f").is_ok());
        let e = c.as_destination("f").err().expect("an error");
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::State, "f: needs a destination connection, this one is a source")
        );
        c.phase.store(CLOSING, Ordering::Relaxed);
        assert!(c.abort("f").is_ok(), "abort reaches a closing connection");
        assert_eq!(c.error_message().as_deref(), Some("the migration was aborted by the hypervisor"));
        let e = c.close("g").expect_err("a second close");
        assert_eq!((e.kind, e.message.as_str()), (ErrorKind::State, "g: the connection is already closing"));
        c.phase.store(CLOSED, Ordering::Relaxed);
        assert_eq!(c.error_message(), None, "a closed role's own error is not the connection's");
    }
}
