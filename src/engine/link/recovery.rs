//! Post-copy recovery (rdmamig extension): a new connection between the
//! same two processes after the post-copy link was lost.
//!
//! The destination, whose vCPUs wait for pages, reconnects; the source
//! listens. Before POSTCOPY the source opened a listener on the address the
//! destination reached it at and sent its port and a random token
//! (POSTCOPY_RECOVERY). A recovery connection request carries the token
//! (`CAP_RDMAMIG_RESUME`, checked before the accept, so no other party gets a
//! queue pair that can read the exposed RAM), and with a key both sides prove
//! it again, as on the first connection.
//!
//! The new link is made on the old one's protection domain: every
//! registration post-copy uses (the source's exposed RAM and tables, the
//! destination's staging buffer) stays valid, rkeys included. The source
//! cannot write into the destination over it: rdma_cm gives the new QP
//! remote write access, as it gives every connected QP, but no registration
//! on that domain allows remote writes any more (those the source wrote into
//! were deregistered before post-copy ran, `destination::postcopy::run`; the
//! staging and control buffers allow local writes only). The old link's
//! QPs are destroyed before anything is posted on the new one (the caller
//! replaces the old link with the new), so no read of the lost connection
//! lands in a staging slot reused meanwhile. On the new link the control
//! channel keeps the first one's roles (the source requests, the
//! destination grants READY), though the destination connected: the source
//! sets up a fault QP again (POSTCOPY_FAULT_QP), then asks with
//! POSTCOPY_RESUME, answered by POSTCOPY_DONE.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::connection::{Link, EVENT_POLL_INTERVAL};
use super::setup::{accept_from, connect_to, Admit, Listener, Resume};
use super::work::RESPONSE;
use crate::engine::Config;
use crate::wire::{Message, RECOVERY_TOKEN_LEN};
use crate::{Error, ErrorKind, Result};

/// Post-copy recovery addresses the other side by IP.
fn not_ip() -> Error {
    Error::new(ErrorKind::InvalidArgument, "post-copy recovery needs an IP connection (a RoCE or iWARP device)")
}

/// Source side: a listener for the destination's recovery connection,
/// on this side's address of this link, on a port the system picks.
pub(crate) fn recovery_listener(link: &Link, config: &Config) -> Result<Listener> {
    let local = link.id.local_addr().ok_or_else(not_ip)?;
    Listener::bind(&local.ip().to_string(), 0, config)
}

/// Source side: waits until `deadline` for the destination's recovery
/// connection with `token` on `listener` (other requests are refused and
/// the wait goes on), and makes it the link that replaces this one.
pub(crate) fn accept_recovery(
    old: &Link,
    listener: &Listener,
    token: [u8; RECOVERY_TOKEN_LEN],
    deadline: Instant,
) -> Result<Link> {
    let resume = Resume { token, old };
    let left = deadline.saturating_duration_since(Instant::now());
    let mut link =
        accept_from(listener, &Admit::Resume(&resume), 0, old.counters.clone(), Some(left)).map_err(|(e, _)| e)?;
    adopt(&mut link, old)?;
    // The source's role: it takes a READY before each message it sends.
    link.control.expect_ready(true);
    Ok(link)
}

/// Destination side: connects to the source's recovery listener (`port`
/// at the address this link reached the source at) with `token`, and
/// makes it the link that replaces this one.
pub(crate) fn reconnect(old: &Link, config: &Config, port: u16, token: [u8; RECOVERY_TOKEN_LEN]) -> Result<Link> {
    let source = old.peer_addr().ok_or_else(not_ip)?;
    let resume = Resume { token, old };
    let host = source.ip().to_canonical().to_string();
    let mut link = connect_to(&host, port, config, 0, old.counters.clone(), Some(&resume))?;
    adopt(&mut link, old)?;
    // The destination's role: it grants credits and never waits for one.
    link.control.expect_ready(false);
    Ok(link)
}

/// Takes over what the first connection agreed (its stop flag came
/// with `Link::new`).
fn adopt(link: &mut Link, old: &Link) -> Result<()> {
    if link.negotiated.authenticated != old.negotiated.authenticated {
        return Err(Error::new(ErrorKind::Auth, "the recovery connection is not authenticated as the lost one was"));
    }
    link.negotiated = old.negotiated;
    link.peer_pin_budget = old.peer_pin_budget;
    Ok(())
}

/// Gives this connection up before a recovery: its QPs go to the error
/// state (nothing more lands in this side's buffers through them) and
/// are destroyed when the link drops. No disconnect request goes out: the
/// link may be down, and on rxe a connection-manager message sent into a
/// down link breaks its management QP, and with it every later
/// connection (seen on Linux 6.1). The peer learns of it from its own
/// liveness probe or, on the source, from the recovery connection
/// request itself (`request_unless_recovery`).
pub(crate) fn abandon(link: &mut Link) {
    let _ = link.qp.to_error();
    link.data.set_fault_qp(None);
    link.loss.give_up("connection given up for a post-copy recovery");
}

/// Source side, waiting for a recovery connection after `abandon`:
/// whether the peer's disconnect came on this link meanwhile (its
/// process ended; a recovering destination sends none).
pub(crate) fn closed_by_peer_since(link: &mut Link) -> Result<bool> {
    while link.loss.take_event(&link.id, Duration::ZERO)? {}
    Ok(link.closed_by_peer())
}

/// Source side, with a request outstanding (`begin_request_by`): its
/// response, handed to `f`, or `None` as soon as a connection request
/// waits on `listener`, if one is given (the destination's recovery
/// connection, if it holds the token: then the destination gave this
/// connection up, whether or not this side can tell yet).
pub(crate) fn response_or_request<R>(
    link: &mut Link,
    listener: Option<&Listener>,
    f: impl FnOnce(&Message) -> Result<R>,
) -> Result<Option<R>> {
    loop {
        if link.control.has(RESPONSE) {
            return link.finish_request(f).map(Some);
        }
        if listener.is_some_and(Listener::has_request) {
            return Ok(None);
        }
        // poll(2) skips a negative descriptor.
        link.pump(listener.map_or(-1, |l| l.event_fd().as_raw_fd()), EVENT_POLL_INTERVAL)?;
    }
}

#[cfg(feature = "rdma-tests")]
/// Failure injection for the RDMA tests: this side's QPs go to the error
/// state without a connection event, as when the link is lost (the
/// peer's requests go unanswered, this side's fail).
pub(crate) fn sever_for_test(link: &Link) -> Result<()> {
    link.qp.to_error()?;
    if let Some(qp) = link.data.fault_qp() {
        qp.to_error()?;
    }
    Ok(())
}
