//! A destination's listening endpoint.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::admit::{Admit, RecoveryNonces};
use super::cm::{check_auth_config, resolve, set_tos};
use super::parked::Parked;
use super::request::Request;
use crate::engine::link::connection::{Link, EVENT_POLL_INTERVAL};
use crate::engine::link::negotiated::Negotiated;
use crate::engine::pin;
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::logging;
use crate::verbs::{self, CmId, EventChannel};
use crate::{Error, ErrorKind, Result};

/// A destination's listening endpoint.
pub struct Listener {
    channel: Arc<EventChannel>,
    id: Arc<CmId>,
    config: Config,
    cancelled: AtomicBool,
    /// The nonces of the recovery requests a source's recovery listener
    /// admitted: one seen again is a replay.
    recovery_nonces: RecoveryNonces,
    /// Shared with this listener's accepts and their handshake threads.
    parked: Arc<Mutex<Parked>>,
    /// Set when the listener is cancelled or dropped: handshakes still running give up.
    closed: Arc<AtomicBool>,
}

impl Listener {
    /// Listens on `host:port` (a name, an IPv4 or an IPv6 address; port 0 picks one).
    pub fn bind(host: &str, port: u16, config: &Config) -> Result<Listener> {
        check_auth_config(config)?;
        pin::fork_mode();
        let addrs = resolve(host, port, config.timeout)?;
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        id.set_reuseaddr()?;
        set_tos(&id, config)?;
        let mut last = None;
        for addr in addrs {
            match id.bind_addr(&addr) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            let e = Error::from(e);
            return Err(Error::new(e.kind, format!("cannot bind {host}:{port}: {}", e.message)));
        }
        id.listen(5)?;
        Ok(Listener {
            channel,
            id,
            config: config.clone(),
            cancelled: AtomicBool::new(false),
            recovery_nonces: RecoveryNonces::default(),
            parked: Arc::default(),
            closed: Arc::default(),
        })
    }

    /// Makes every accept on this listener, running or later, fail with
    /// `Cancelled` (within `EVENT_POLL_INTERVAL`). Callable from any thread.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
        self.closed.store(true, Ordering::Relaxed);
    }

    /// A file descriptor that is readable while a connection request (or
    /// another event of the listening endpoint) waits to be taken: an event
    /// loop polls it, then accepts with `Duration::ZERO`. It belongs to the
    /// listener (its rdma_cm event channel): do not read or close it.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    /// The next connection event, waiting at most `timeout` (`None`: for
    /// ever) in slices so that `cancel` is noticed; `Duration::ZERO` does not
    /// wait (`WouldBlock` when no event is there).
    fn next_event(&self, timeout: Option<Duration>) -> Result<verbs::CmEvent> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if self.cancelled.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Cancelled, "the listener was cancelled"));
            }
            let slice = deadline
                .map_or(EVENT_POLL_INTERVAL, |d| d.saturating_duration_since(Instant::now()).min(EVENT_POLL_INTERVAL));
            if let Some(event) = self.channel.get_event(Some(slice))? {
                return Ok(event);
            }
            if timeout == Some(Duration::ZERO) {
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    "accepting would block: no connection request is waiting",
                ));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::new(ErrorKind::Timeout, "no connection request arrived"));
            }
        }
    }

    /// A first connection admitted after the accept that began it had
    /// returned, now counted in `counters`. One that pin-all was granted
    /// for, which `ram_bytes` of guest RAM would not fit in the pin budget,
    /// is given up (the source fails; it is rare: accepts of guests of
    /// different sizes on one listener with a pin budget).
    pub(super) fn take_admitted(&self, ram_bytes: u64, counters: &Arc<Counters>) -> Option<Link> {
        loop {
            let mut link = self.parked.lock().pop_admitted()?;
            if link.negotiated.pin_all && !Negotiated::offered(&self.config, ram_bytes).pin_all {
                logging::warn(format_args!(
                    "gave up a connection admitted with pin-all: {ram_bytes} bytes of RAM do not fit the pin budget"
                ));
                continue;
            }
            link.counters = counters.clone();
            return Some(link);
        }
    }

    /// The next connection request that `admit` takes: one another accept
    /// left, or the next to arrive within `wait` (`None`: none came, or it
    /// was left for another accept). A request that fails its first checks
    /// is rejected and its error returned.
    pub(super) fn next_request(&self, admit: &Admit, wait: Duration) -> Result<Option<Request>> {
        if let Some(request) = self.parked.lock().claim(admit, self.config.handshake_timeout) {
            return Ok(Some(request));
        }
        let event = match self.next_event(Some(wait)) {
            Ok(event) => event,
            Err(e) if e.kind == ErrorKind::Timeout => return Ok(None),
            Err(e) => return Err(e),
        };
        let request = Request::take(&self.config, &self.recovery_nonces, event, admit)?;
        Ok(self.parked.lock().keep_unless_admitted(admit, request))
    }

    /// Whether a connection request (or another event) waits to be taken.
    pub fn has_request(&self) -> bool {
        self.channel.has_event()
    }

    /// The port actually bound (useful after binding port 0).
    pub fn port(&self) -> u16 {
        self.id.local_port()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What this listener's accepts share.
    pub(super) fn parked(&self) -> &Arc<Mutex<Parked>> {
        &self.parked
    }

    /// Set when the listener is cancelled or dropped.
    pub(super) fn closed(&self) -> &Arc<AtomicBool> {
        &self.closed
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}
