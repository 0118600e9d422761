//! The accepting side: which request an accept takes, the refusals, and
//! first connections' handshakes on threads of their own.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::admit::Admit;
use super::listener::Listener;
use crate::engine::link::connection::{Link, EVENT_POLL_INTERVAL};
use crate::engine::stats::Counters;
use crate::logging;
use crate::{Error, ErrorKind, Result};

/// Requests refused while waiting: how many, and the last refusal.
type Refusals = Option<(u32, Error)>;

/// Destination side: accept a connection request from `listener`, for
/// `ram_bytes` of guest RAM. A request that fails a check (allow-list,
/// version, authentication, a handshake that does not finish within
/// `Config::handshake_timeout`) is refused and the wait goes on; several
/// handshakes may run at once. If the time runs out after refusals, the
/// error (of the last refusal's kind) says what was refused.
pub(crate) fn accept(
    listener: &Listener,
    ram_bytes: u64,
    counters: Arc<Counters>,
    timeout: Option<Duration>,
) -> Result<Link> {
    accept_from(listener, &Admit::Any, ram_bytes, counters, timeout).map_err(|(e, refused)| match refused {
        Some((n, last)) if e.kind == ErrorKind::Timeout => {
            Error::new(last.kind, format!("no source was admitted ({n} refused; the last: {})", last.message))
        }
        _ => e,
    })
}

/// Destination side, right after accepting `forward` from a QEMU source:
/// accept that source's return-path connection, the second request QEMU
/// makes to the same listener (requests from other addresses are
/// rejected), within the config's timeout (QEMU itself gives up after
/// 5 s). On it the roles are reversed: this side sends, each message
/// after the source's READY.
pub(crate) fn accept_return(
    listener: &Listener,
    forward: &Link,
    ram_bytes: u64,
    counters: Arc<Counters>,
) -> Result<Link> {
    let admit = Admit::SameSource(forward.peer_addr().map(|a| a.ip().to_canonical()));
    let timeout = listener.config().timeout;
    let accepted = accept_from(listener, &admit, ram_bytes, counters, Some(timeout));
    let mut link = accepted.map_err(|(e, refused)| {
        if e.kind != ErrorKind::Timeout {
            return Error::new(e.kind, format!("accepting the return-path connection: {}", e.message));
        }
        let refused = refused
            .map_or(String::new(), |(n, last)| format!(" ({n} other requests refused; the last: {})", last.message));
        Error::new(
            ErrorKind::Connect,
            format!(
                "the source opened no return-path connection within {timeout:?}{refused}; QEMU 7.2 opens one \
                 only with its postcopy-ram or dirty-bitmaps capability on"
            ),
        )
    })?;
    link.control.expect_ready(true);
    // Aborting the migration stops waits on either connection.
    link.stop = forward.stop.clone();
    Ok(link)
}

/// Accepts the first request `admit` takes, refusing (and logging) the
/// others. Fails with the error and, when requests were refused
/// meanwhile, their count and the last refusal.
///
/// A first connection's handshakes (`Admit::Any`, waiting) run on
/// threads of their own, so that a peer that connects and stays silent
/// holds up nobody; the first to finish is the one taken, the others
/// wait in the listener for the next accept. A return path or a
/// recovery is the one request expected, handled here.
pub(in crate::engine::link) fn accept_from(
    listener: &Listener,
    admit: &Admit,
    ram_bytes: u64,
    counters: Arc<Counters>,
    timeout: Option<Duration>,
) -> std::result::Result<Link, (Error, Refusals)> {
    let deadline = timeout.map(|t| Instant::now() + t);
    // Only a caller's zero means "do not wait"; a deadline that ran out is a timeout.
    let no_wait = timeout == Some(Duration::ZERO);
    let parallel = matches!(admit, Admit::Any) && !no_wait;
    // Each handshake thread tells this accept how it ended; an admitted
    // link goes to the listener's queue, for this accept or the next.
    let (done_tx, done) = mpsc::channel::<Result<()>>();
    let mut running = 0;
    let mut refused: Refusals = None;
    loop {
        while let Ok(handshake) = done.try_recv() {
            running -= 1;
            if let Err(e) = handshake {
                count(&mut refused, e);
            }
        }
        if matches!(admit, Admit::Any) {
            if let Some(link) = listener.take_admitted(ram_bytes, &counters) {
                return Ok(link);
            }
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) && !no_wait {
            return Err((Error::new(ErrorKind::Timeout, "no connection request arrived"), refused));
        }
        // While handshakes run, their results are looked at often.
        let slice = if running > 0 { HANDSHAKE_POLL_INTERVAL } else { EVENT_POLL_INTERVAL };
        let request = match listener.next_request(admit, left.map_or(slice, |l| l.min(slice))) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(e) if matches!(e.kind, ErrorKind::Cancelled | ErrorKind::WouldBlock) => return Err((e, refused)),
            Err(e) => {
                refuse(&mut refused, e);
                continue;
            }
        };
        if !parallel {
            match request.handshake(listener.config(), admit, ram_bytes, counters.clone(), None) {
                Ok(link) => {
                    listener.parked().lock().expect_return_path(listener.config(), admit, &link);
                    return Ok(link);
                }
                Err(e) if matches!(e.kind, ErrorKind::Aborted | ErrorKind::Cancelled) => return Err((e, refused)),
                Err(e) => refuse(&mut refused, e),
            }
            continue;
        }
        if running >= MAX_HANDSHAKES {
            refuse(&mut refused, request.refuse(format_args!("{MAX_HANDSHAKES} handshakes are in progress already")));
            continue;
        }
        let (config, counters, done_tx, closed, parked) = (
            listener.config().clone(),
            counters.clone(),
            done_tx.clone(),
            listener.closed().clone(),
            listener.parked().clone(),
        );
        let spawned = std::thread::Builder::new().name("rdmamig-handshake".into()).spawn(move || {
            let done = match request.handshake(&config, &Admit::Any, ram_bytes, counters, Some(closed)) {
                Ok(link) => {
                    let mut parked = parked.lock();
                    parked.expect_return_path(&config, &Admit::Any, &link);
                    parked.push_admitted(link);
                    Ok(())
                }
                Err(e) => {
                    logging::warn(format_args!("{}; still listening", e.message));
                    Err(e)
                }
            };
            // The accept that started it may have ended meanwhile.
            let _ = done_tx.send(done);
        });
        match spawned {
            Ok(_) => running += 1,
            Err(e) => {
                refuse(&mut refused, Error::new(ErrorKind::Connect, format!("cannot start a handshake thread: {e}")))
            }
        }
    }
}

/// Logs a refused request and counts it.
pub(super) fn refuse(refused: &mut Refusals, e: Error) {
    logging::warn(format_args!("{}; still listening", e.message));
    count(refused, e);
}

/// Counts a refused request (logged already).
pub(super) fn count(refused: &mut Refusals, e: Error) {
    *refused = Some((refused.as_ref().map_or(0, |(n, _)| *n) + 1, e));
}

/// Handshakes one accept runs at once; a request beyond them is refused.
const MAX_HANDSHAKES: usize = 8;

/// How often an accept looks for finished handshakes while some run.
const HANDSHAKE_POLL_INTERVAL: Duration = Duration::from_millis(5);
