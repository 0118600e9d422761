//! Connection setup: name and address resolution bounded by the config's
//! timeout, rdma_cm connect and accept with the capability exchange in the
//! private data, the QP's transport timeout, and the destination's listener.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::auth::{auth_error, authenticate, check_source_proof};
use super::connection::{Link, EVENT_POLL_INTERVAL};
use super::errors::{protocol_error, SetupFailed};
use super::negotiated::Negotiated;
use super::work::INCOMING;
use crate::engine::auth::{self, Endpoints, Nonce, Role, Transcript};
use crate::engine::pin;
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::logging;
use crate::verbs::{self, CmEventKind, CmId, ConnParam, EventChannel};
use crate::wire::{
    AcceptData, AuthChallenge, Capabilities, ConnectData, RejectData, CAP_RDMAMIG_AUTH, CAP_RDMAMIG_EXT,
    CAP_RDMAMIG_RESUME, RECOVERY_TAG_LEN, RECOVERY_TOKEN_LEN, REJECT_PIN_REFUSED,
};
use crate::{Error, ErrorKind, Result};

/// QEMU's bound for address and route resolution; the config's timeout may shorten it.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Transport retries of an unacknowledged packet before the QP fails (QEMU's 5).
const RETRY_COUNT: u8 = 5;

/// Which connection requests a listener takes (the allow-list applies either way).
pub(super) enum Admit<'a> {
    Any,
    /// Only from the source already connected (`None`: its address is not IP).
    SameSource(Option<IpAddr>),
    /// A source's recovery listener: only the destination's recovery connection.
    Resume(&'a Resume<'a>),
}

/// A post-copy recovery connection (see `recovery`): the token its request
/// proves, and the link it replaces, whose protection domain (the
/// registrations post-copy reads and reads into) it is made on.
pub(super) struct Resume<'a> {
    pub token: [u8; RECOVERY_TOKEN_LEN],
    pub old: &'a Link,
}

impl Resume<'_> {
    /// The tag of a recovery request with `nonce` from `from`: under the
    /// lost connection's session key when it was authenticated, else
    /// under the token.
    pub fn tag(&self, nonce: &Nonce, from: Option<IpAddr>) -> [u8; RECOVERY_TAG_LEN] {
        let key = self.old.session.as_ref().map_or(&self.token[..], |s| s.recovery_key());
        auth::recovery_tag(key, &self.token, nonce, from)
    }

    /// Whether `request` from `peer` is the destination's recovery: from
    /// the address the lost connection had, with the tag due.
    fn check(&self, request: &ConnectData, peer: Option<SocketAddr>) -> std::result::Result<(), String> {
        let ip = |a: Option<SocketAddr>| a.map(|a| a.ip().to_canonical());
        if ip(peer) != ip(self.old.peer_addr()) {
            return Err(format!(
                "a recovery request must come from the lost connection's destination, {}",
                self.old.peer_addr().map_or_else(|| "an address that is not IP".into(), |a| a.ip().to_string())
            ));
        }
        match (request.nonce, request.recovery_tag) {
            (Some(nonce), Some(tag)) if auth::same_bytes(&tag, &self.tag(&nonce, peer.map(|a| a.ip()))) => Ok(()),
            _ => Err("not the destination's post-copy recovery (no or a wrong proof of the token)".into()),
        }
    }
}

/// Requests refused while waiting: how many, and the last refusal.
type Refusals = Option<(u32, Error)>;

/// A key needs the extensions: authentication is one of them.
fn check_auth_config(config: &Config) -> Result<()> {
    if config.auth_key.is_some() && !config.extensions {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "peer authentication is an rdmamig extension: it needs the extensions on",
        ));
    }
    Ok(())
}

/// Source side: resolve `host:port`, connect, and negotiate capabilities
/// for `ram_bytes` of guest RAM.
pub(crate) fn connect(host: &str, port: u16, config: &Config, ram_bytes: u64, counters: Arc<Counters>) -> Result<Link> {
    connect_to(host, port, config, ram_bytes, counters, None)
}

/// As [`connect`]; with `resume`, a destination's
/// recovery connection to its source (it reads, and it proves the token).
pub(super) fn connect_to(
    host: &str,
    port: u16,
    config: &Config,
    ram_bytes: u64,
    counters: Arc<Counters>,
    resume: Option<&Resume>,
) -> Result<Link> {
    check_auth_config(config)?;
    pin::fork_mode();
    let deadline = Instant::now() + config.timeout;
    // A recovery connection's waits end at the hypervisor's abort too.
    let stop = resume.map(|r| &*r.old.stop);
    let addrs = resolve(host, port, config.timeout)?;
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    set_ack_timeout(&id, config)?;
    set_tos(&id, config)?;
    let mut last = None;
    for addr in &addrs {
        match id.resolve_addr(addr, resolve_timeout_ms(deadline)) {
            Ok(()) => match expect_event(&channel, CmEventKind::AddrResolved, deadline, stop) {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            },
            Err(e) => last = Some(e.into()),
        }
    }
    if let Some(e) = last {
        return Err(Error::new(e.kind, format!("cannot resolve {host}:{port}: {}", e.message)));
    }
    id.resolve_route(resolve_timeout_ms(deadline))?;
    expect_event(&channel, CmEventKind::RouteResolved, deadline, stop)?;

    let offered = Negotiated::offered(config, ram_bytes);
    let mut link = Link::new(id, offered, config, counters, resume.map(|r| r.old))?;
    // QEMU posts the READY receive before connecting: the destination may SEND at once.
    link.post_recv(INCOMING)?;
    let resume_flag = if resume.is_some() { CAP_RDMAMIG_RESUME } else { 0 };
    let caps = Capabilities { version: config.protocol_version, flags: offered.flags() | resume_flag };
    let nonce = if config.auth_key.is_some() || resume.is_some() { Some(auth::nonce()?) } else { None };
    let endpoints = Endpoints { source: link.id.local_addr().map(|a| a.ip()), destination: link.id.peer_addr() };
    let recovery_tag = resume.zip(nonce).map(|(r, n)| r.tag(&n, endpoints.source));
    let private_data = ConnectData { caps, nonce, recovery_tag }.encode();
    #[cfg(feature = "rdma-tests")]
    if resume.is_some() {
        *LAST_RECOVERY_REQUEST.lock() = Some(private_data.clone());
    }
    link.id.connect(&ConnParam {
        private_data: &private_data,
        // The device's most (librdmacm's RDMA_MAX_RESP_RES): an rdmamig
        // destination reads this side's RAM in post-copy; QEMU never does.
        // A recovery connection is that destination: it reads, and is not read.
        responder_resources: if resume.is_some() { 0 } else { MAX_RD_ATOMIC },
        initiator_depth: if resume.is_some() { MAX_RD_ATOMIC } else { 2 },
        retry_count: RETRY_COUNT,
        rnr_retry_count: 0,
    })?;
    let event = wait_event(&channel, deadline, "the answer to the connection request", stop)?;
    match event.kind() {
        CmEventKind::Established => {
            let accepted = AcceptData::decode(event.private_data()).map_err(protocol_error)?;
            let reply = accepted.caps;
            if reply.version != config.protocol_version {
                return Err(version_error(config.protocol_version, reply.version));
            }
            // A destination grants a subset of the offer (QEMU masks it with what it knows).
            let extra = reply.flags & !caps.flags;
            if extra != 0 {
                return Err(protocol_error(format_args!(
                    "the destination granted capabilities {extra:#x} that were not offered"
                )));
            }
            if reply.flags & resume_flag != resume_flag {
                return Err(Error::new(
                    ErrorKind::Connect,
                    format!("{host}:{port} is not the source's post-copy recovery listener"),
                ));
            }
            // The destination clears what it does not support; we turn those features off.
            link.negotiated = offered.masked(reply.flags);
            if link.negotiated.extensions {
                link.peer_pin_budget = accepted.pin_budget;
            }
            if let (Some(key), Some(source_nonce)) = (&config.auth_key, nonce) {
                let Some(challenge) = accepted.auth.filter(|_| link.negotiated.authenticated) else {
                    return Err(auth_error(
                        "the destination does not authenticate (it did not grant the authentication capability)".into(),
                    ));
                };
                let transcript = Transcript {
                    version: caps.version,
                    offered: caps.flags,
                    granted: reply.flags,
                    source_nonce,
                    destination_nonce: challenge.nonce,
                    pin_budget: accepted.pin_budget.unwrap_or(0),
                    recovery_tag,
                    endpoints,
                };
                authenticate(&mut link, key, &transcript, &challenge.proof)?;
            }
            Ok(link)
        }
        // Our destination rejects a version it does not speak with its own
        // version as private data; a reject without it (nobody listening) is zeros.
        CmEventKind::Rejected => match RejectData::decode(event.private_data()) {
            Ok(theirs) if theirs.caps.version != 0 && theirs.caps.version != config.protocol_version => {
                Err(version_error(config.protocol_version, theirs.caps.version))
            }
            // Our destination rejects a source without a key with the authentication flag.
            Ok(theirs) if theirs.caps.flags & CAP_RDMAMIG_AUTH != 0 && config.auth_key.is_none() => {
                Err(auth_error(format!("{host}:{port} requires peer authentication and no key is set")))
            }
            Ok(theirs) if theirs.cause == REJECT_PIN_REFUSED => Err(Error::new(
                ErrorKind::Connect,
                format!(
                    "{host}:{port} rejected the connection: the destination's kernel refused to pin memory for \
                     it (RLIMIT_MEMLOCK, `ulimit -l`, too low there without CAP_IPC_LOCK; `rdmamig doctor` on \
                     the destination says what it needs)"
                ),
            )),
            // Nobody listens there any more (a killed source's recovery
            // listener is gone with it): the peer is gone, no retrying.
            // (Other refusals may pass: on rxe a request sent while the
            // link was down was refused, reason 28, once it came back.)
            _ if resume.is_some() && NO_LISTENER.contains(&event.status()) => Err(Error::new(
                ErrorKind::Disconnected,
                format!("{host}:{port} refused the recovery connection: the source's recovery listener is gone"),
            )),
            _ if NO_LISTENER.contains(&event.status()) => Err(Error::new(
                ErrorKind::Connect,
                format!("no listener on {host} port {port} (is the destination listening yet?)"),
            )),
            _ => Err(Error::new(
                ErrorKind::Connect,
                format!("{host}:{port} rejected the connection ({})", reject_reason(event.status())),
            )),
        },
        other => Err(Error::new(
            ErrorKind::Connect,
            format!("connecting to {host}:{port} failed: {other:?} (status {})", event.status()),
        )),
    }
}

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
    let timeout = listener.config.timeout;
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
pub(super) fn accept_from(
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
            match request.handshake(&listener.config, admit, ram_bytes, counters.clone(), None, &listener.parked) {
                Ok(link) => return Ok(link),
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
            listener.config.clone(),
            counters.clone(),
            done_tx.clone(),
            listener.closed.clone(),
            listener.parked.clone(),
        );
        let spawned = std::thread::Builder::new().name("rdmamig-handshake".into()).spawn(move || {
            let done = match request.handshake(&config, &Admit::Any, ram_bytes, counters, Some(closed), &parked) {
                Ok(link) => {
                    parked.lock().admitted.push_back(link);
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
fn refuse(refused: &mut Refusals, e: Error) {
    logging::warn(format_args!("{}; still listening", e.message));
    count(refused, e);
}

/// Counts a refused request (logged already).
fn count(refused: &mut Refusals, e: Error) {
    *refused = Some((refused.as_ref().map_or(0, |(n, _)| *n) + 1, e));
}

/// Handshakes one accept runs at once; a request beyond them is refused.
const MAX_HANDSHAKES: usize = 8;
/// How often an accept looks for finished handshakes while some run.
const HANDSHAKE_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// A connection request that passed the checks made before anything is set
/// up for it (allow-list, the expected peer, version, authentication
/// required, a recovery's proof): its id, on an event channel of its own
/// (the id migrates to it, so its disconnect events are not taken by
/// whoever waits on the listener).
struct Request {
    id: Arc<CmId>,
    channel: Arc<EventChannel>,
    data: ConnectData,
    peer: Option<SocketAddr>,
    from: String,
}

impl Request {
    /// Checks one connection event; a request that fails is rejected here.
    fn take(listener: &Listener, event: verbs::CmEvent, admit: &Admit) -> Result<Request> {
        let config = &listener.config;
        if event.kind() != CmEventKind::ConnectRequest {
            return Err(Error::new(
                ErrorKind::Connect,
                format!("expected a connection request, got {:?}", event.kind()),
            ));
        }
        let channel = EventChannel::new()?;
        let Some(id) = event.take_request_id(&channel) else {
            return Err(Error::new(ErrorKind::Connect, "connection request without an id"));
        };
        let peer = id.peer_addr();
        let from = peer.map_or_else(|| "an address that is not IP".to_string(), |a| a.to_string());
        let reject = |private: &[u8], e: Error| {
            let _ = id.reject(private);
            Err(e)
        };
        if !config.allowed_sources.is_empty()
            && !peer.is_some_and(|a| config.allowed_sources.iter().any(|p| p.contains(a.ip())))
        {
            return reject(&[], auth_error(format!("refused a connection from {from}: not on the allow-list")));
        }
        let ours = Capabilities { version: config.protocol_version, flags: 0 };
        let data = match ConnectData::decode(event.private_data()) {
            Ok(r) => r,
            Err(e) => return reject(&ours.encode(), protocol_error(e)),
        };
        drop(event);
        if let Admit::Resume(resume) = admit {
            if let Err(e) = resume.check(&data, peer) {
                return reject(&[], auth_error(format!("refused a connection from {from}: {e}")));
            }
            // The tag checked out, so the request has a nonce: one admitted before is a replay.
            let nonce = data.nonce.expect("a recovery request with a valid tag has a nonce");
            let mut seen = listener.recovery_nonces.lock();
            if seen.contains(&nonce) {
                return reject(
                    &[],
                    auth_error(format!("refused a connection from {from}: a replayed recovery request")),
                );
            }
            seen.push(nonce);
        }
        if data.caps.version != config.protocol_version {
            // QEMU just drops such a request; rejecting tells the source why.
            return reject(&ours.encode(), version_error(config.protocol_version, data.caps.version));
        }
        // Whether the source authenticates does not depend on the RAM (0 fits any pin budget).
        if config.auth_key.is_some() && !Negotiated::offered(config, 0).masked(data.caps.flags).authenticated {
            return reject(
                &Capabilities { flags: CAP_RDMAMIG_EXT | CAP_RDMAMIG_AUTH, ..ours }.encode(),
                auth_error(format!("refused a source from {from} that does not authenticate")),
            );
        }
        Ok(Request { id, channel, data, peer, from })
    }

    /// Rejects this request; the error says why.
    fn refuse(self, why: std::fmt::Arguments) -> Error {
        let _ = self.id.reject(&[]);
        Error::new(ErrorKind::Connect, format!("refused a connection from {}: {why}", self.from))
    }

    /// Accepts the request and finishes the handshake (the connection
    /// established and, with a key, the source's proof checked) within the
    /// config's handshake timeout, and, if `given_up` is given, until it is
    /// set (the listener closed).
    fn handshake(
        self,
        config: &Config,
        admit: &Admit,
        ram_bytes: u64,
        counters: Arc<Counters>,
        given_up: Option<Arc<AtomicBool>>,
        parked: &Mutex<Parked>,
    ) -> Result<Link> {
        let Request { id, channel, data, peer, from } = self;
        let deadline = Instant::now() + config.handshake_timeout.min(config.timeout);
        let negotiated = Negotiated::offered(config, ram_bytes).masked(data.caps.flags);
        let resume = match admit {
            Admit::Resume(resume) => Some(*resume),
            _ => None,
        };
        let old = resume.map(|r| r.old);
        let link = set_ack_timeout(&id, config)
            .map_err(SetupFailed::from)
            .and_then(|()| Link::new(id.clone(), negotiated, config, counters, old));
        let mut link = match link {
            Ok(link) => link,
            Err(failed) => {
                // The source cannot guess the kernel's pinning limit here: the reject says so.
                let _ = if failed.pin_refused {
                    let caps = Capabilities { version: config.protocol_version, flags: CAP_RDMAMIG_EXT };
                    id.reject(&RejectData { caps, cause: REJECT_PIN_REFUSED }.encode())
                } else {
                    id.reject(&[])
                };
                return Err(failed.into());
            }
        };
        // The handshake's waits end when the listener closes (`given_up`),
        // a recovery's at the hypervisor's abort (the lost link's stop flag,
        // which the new link shares).
        let lasting_stop = given_up.map(|stop| std::mem::replace(&mut link.stop, stop));
        // Masking unknown flags is the whole negotiation: echo what we kept.
        let resume_flag = if resume.is_some() { CAP_RDMAMIG_RESUME } else { 0 };
        let reply = Capabilities { version: data.caps.version, flags: negotiated.flags() | resume_flag };
        let pin_budget = pin::budget_for(config);
        let transcript = match (&config.auth_key, data.nonce) {
            (Some(key), Some(source_nonce)) if negotiated.authenticated => Some((
                key,
                Transcript {
                    version: reply.version,
                    offered: data.caps.flags,
                    granted: reply.flags,
                    source_nonce,
                    destination_nonce: auth::nonce()?,
                    pin_budget: pin_budget.unwrap_or(0),
                    recovery_tag: data.recovery_tag,
                    endpoints: Endpoints { source: peer.map(|a| a.ip()), destination: id.local_addr() },
                },
            )),
            _ => None,
        };
        let challenge = transcript
            .as_ref()
            .map(|(key, t)| AuthChallenge { nonce: t.destination_nonce, proof: key.prove(Role::Destination, t) });
        // A return-path connection's source SENDs READY as soon as it is
        // established (QEMU sets rnr_retry to 0): the receive goes first.
        link.post_recv(INCOMING)?;
        // An rdmamig source also learns the budget it must plan within; QEMU gets its 8 bytes.
        let accept_data = AcceptData { caps: reply, pin_budget, auth: challenge }.encode();
        let accept_data = if negotiated.extensions { &accept_data[..] } else { &accept_data[..Capabilities::LEN] };
        link.id.accept(&ConnParam {
            private_data: accept_data,
            // A source's recovery connection serves the destination's reads.
            responder_resources: if resume.is_some() { MAX_RD_ATOMIC } else { 2 },
            // An rdmamig source's post-copy lets this side READ (up to what it offered).
            initiator_depth: if negotiated.extensions && resume.is_none() { MAX_RD_ATOMIC } else { 0 },
            retry_count: RETRY_COUNT,
            // On a recovery connection the credits run the other way round
            // once the connecting destination sent its AUTH: its READY may
            // arrive before this side posted the receive for it again
            // (seen on rxe: RNR retry exceeded). Its SENDs wait for one.
            rnr_retry_count: if resume.is_some() { RNR_RETRY_FOREVER } else { 0 },
        })?;
        expect_event(&channel, CmEventKind::Established, deadline, Some(&link.stop)).map_err(|e| {
            Error::new(e.kind, format!("the connection from {from} was not established: {}", e.message))
        })?;
        // A QEMU source opens its return path right away: its next request
        // is for the accept that takes this one (`accept_return`).
        if config.return_path && !negotiated.extensions && matches!(admit, Admit::Any) {
            parked.lock().expect_return_path(peer, config.timeout);
        }
        // The destination grants credits; it never waits for one.
        link.control.expect_ready(false);
        if let Some((key, t)) = transcript {
            check_source_proof(&mut link, key, &t, &from, deadline)?;
        }
        if let Some(stop) = lasting_stop {
            link.stop = stop;
        }
        Ok(link)
    }
}

/// What the accepts running on one listener share: the requests one of
/// them read and left for another, the connections admitted and not taken
/// yet, and the QEMU sources whose return path is due.
#[derive(Default)]
pub(super) struct Parked {
    /// Requests left for another accept, with when they came; one nobody
    /// takes within the handshake timeout is rejected.
    requests: Vec<(Request, Instant)>,
    /// First connections whose handshake ended after the accept that began
    /// it had returned: the next accept takes them (as a kernel's backlog).
    admitted: VecDeque<Link>,
    /// QEMU sources admitted with `Config::return_path`, and until when
    /// their next request is their return path (which no other accept takes).
    return_paths: Vec<(Option<IpAddr>, Instant)>,
}

impl Parked {
    /// Whether the accept of `admit` takes `request`: a return path from
    /// the QEMU source it serves; a first connection unless it is a QEMU
    /// source's return path that is due.
    fn admits(&self, admit: &Admit, request: &Request) -> bool {
        let from = request.peer.map(|a| a.ip().to_canonical());
        // QEMU never offers rdmamig's extensions: such a request is no return path.
        let qemu = request.data.caps.flags & CAP_RDMAMIG_EXT == 0;
        match *admit {
            Admit::SameSource(source) => qemu && source == from,
            Admit::Any => !qemu || !self.return_paths.iter().any(|&(ip, until)| ip == from && Instant::now() < until),
            Admit::Resume(_) => true,
        }
    }

    /// A request left earlier that `admit` takes; rejects those that waited
    /// longer than `wait`, and forgets return paths no longer due.
    fn claim(&mut self, admit: &Admit, wait: Duration) -> Option<Request> {
        let now = Instant::now();
        self.return_paths.retain(|&(_, until)| now < until);
        self.requests.retain(|(request, since)| {
            let keep = now.duration_since(*since) < wait;
            if !keep {
                logging::warn(format_args!("refused a connection from {}: no accept took it", request.from));
                let _ = request.id.reject(&[]);
            }
            keep
        });
        let at = self.requests.iter().position(|(request, _)| self.admits(admit, request))?;
        let (request, _) = self.requests.remove(at);
        if let Admit::SameSource(source) = *admit {
            self.took_return_path(source);
        }
        Some(request)
    }

    /// `request` if `admit` takes it, else it is left for another accept.
    fn keep_unless_admitted(&mut self, admit: &Admit, request: Request) -> Option<Request> {
        if self.admits(admit, &request) {
            if let Admit::SameSource(source) = *admit {
                self.took_return_path(source);
            }
            return Some(request);
        }
        logging::debug(format_args!("a connection request from {} is left for another accept", request.from));
        self.requests.push((request, Instant::now()));
        None
    }

    fn expect_return_path(&mut self, source: Option<SocketAddr>, within: Duration) {
        self.return_paths.push((source.map(|a| a.ip().to_canonical()), Instant::now() + within));
    }

    /// The return path of `source` is taken (or given up): no longer due.
    fn took_return_path(&mut self, source: Option<IpAddr>) {
        if let Some(at) = self.return_paths.iter().position(|&(ip, _)| ip == source) {
            self.return_paths.remove(at);
        }
    }
}

/// For the RDMA tests: the private data of the last recovery connection
/// request made, as a host on the path could record it.
#[cfg(feature = "rdma-tests")]
pub static LAST_RECOVERY_REQUEST: parking_lot::Mutex<Option<Vec<u8>>> = parking_lot::Mutex::new(None);

/// The status of a REJECTED event when nothing listens at the port: the IB
/// CM's reason IB_CM_REJ_INVALID_SERVICE_ID (RoCE, InfiniBand), or
/// -ECONNREFUSED (iWARP).
const NO_LISTENER: [i32; 2] = [8, -libc::ECONNREFUSED];

/// The IB CM's reason IB_CM_REJ_CONSUMER_DEFINED: the peer's software
/// (rdma_reject) refused the request.
const REFUSED_BY_PEER: i32 = 28;

/// A REJECTED event's status in words.
fn reject_reason(status: i32) -> String {
    match status {
        REFUSED_BY_PEER => {
            format!("reason {status}: refused by the destination's software, which sent no cause; its log says why")
        }
        _ => format!("reason {status}"),
    }
}

/// An RNR retry count of 7: a SEND that finds no receive posted is retried until one is.
const RNR_RETRY_FOREVER: u8 = 7;

/// librdmacm's RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH: the device's maximum.
const MAX_RD_ATOMIC: u8 = 0xff;

fn version_error(ours: u32, theirs: u32) -> Error {
    Error::new(ErrorKind::Version, format!("the peer speaks RDMA migration protocol version {theirs}, we speak {ours}"))
}

/// `host:port` as addresses, waiting at most `timeout` for the resolver.
fn resolve(host: &str, port: u16, timeout: Duration) -> Result<Vec<SocketAddr>> {
    verbs::resolve(host, port, timeout)
        .map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::TimedOut { ErrorKind::Timeout } else { ErrorKind::Connect };
            Error::new(kind, format!("cannot resolve '{host}': {e}"))
        })
        .and_then(|a| {
            if a.is_empty() {
                Err(Error::new(ErrorKind::Connect, format!("'{host}' has no address")))
            } else {
                Ok(a)
            }
        })
}

/// The resolve timeout for rdma_cm: QEMU's, or what is left until `deadline` if less.
fn resolve_timeout_ms(deadline: Instant) -> i32 {
    let left = deadline.saturating_duration_since(Instant::now()).min(RESOLVE_TIMEOUT);
    (left.as_millis() as i32).max(1)
}

/// Sets the QP's ACK timeout from the liveness time (see [`ack_timeout_exponent`]);
/// without liveness, rdma_cm's default stays.
fn set_ack_timeout(id: &CmId, config: &Config) -> Result<()> {
    match config.liveness {
        Some(liveness) => Ok(id.set_ack_timeout(ack_timeout_exponent(liveness))?),
        None => Ok(()),
    }
}

/// Marks the connection's packets with `Config::tos`: read by the kernel at
/// route resolution (connecting side; the passive side follows the traffic
/// class of the request) and passed on to iWARP listens. 0 leaves the id
/// unset, since setting 0 would override the port's configured default.
fn set_tos(id: &CmId, config: &Config) -> Result<()> {
    if config.tos != 0 {
        id.set_tos(config.tos)?;
    }
    Ok(())
}

/// The QP's ACK timeout, as the exponent e of 4.096 µs × 2^e: the QP gives up
/// on an unacknowledged packet after `RETRY_COUNT + 1` timeouts, which should
/// take at most half the liveness time; but one timeout never drops below
/// 0.27 s (2^16), so a slow software link is not declared dead, nor rises
/// above 4.3 s (2^20).
fn ack_timeout_exponent(liveness: Duration) -> u8 {
    let per_try_ns = liveness.as_nanos() / 2 / (u128::from(RETRY_COUNT) + 1);
    let mut exponent = 16u8;
    while exponent < 20 && 4096u128 << (exponent + 1) <= per_try_ns {
        exponent += 1;
    }
    exponent
}

/// The next connection event on `channel`, within `deadline` (`what` names
/// the step for a timeout), unless `stop` is set (looked at every
/// [`EVENT_POLL_INTERVAL`]).
fn wait_event(
    channel: &EventChannel,
    deadline: Instant,
    what: &str,
    stop: Option<&AtomicBool>,
) -> Result<verbs::CmEvent> {
    loop {
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Err(Error::new(ErrorKind::Aborted, format!("aborted while waiting for {what}")));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(ErrorKind::Timeout, format!("timed out waiting for {what}")));
        }
        let slice = if stop.is_some() { left.min(EVENT_POLL_INTERVAL) } else { left };
        if let Some(event) = channel.get_event(Some(slice))? {
            return Ok(event);
        }
    }
}

fn expect_event(channel: &EventChannel, kind: CmEventKind, deadline: Instant, stop: Option<&AtomicBool>) -> Result<()> {
    let event = wait_event(channel, deadline, &format!("a connection event ({kind:?})"), stop)?;
    if event.kind() != kind {
        return Err(Error::new(
            ErrorKind::Connect,
            format!("expected {kind:?}, got {:?} (status {})", event.kind(), event.status()),
        ));
    }
    Ok(())
}

/// A destination's listening endpoint.
pub struct Listener {
    channel: Arc<EventChannel>,
    id: Arc<CmId>,
    config: Config,
    cancelled: AtomicBool,
    /// The nonces of the recovery requests a source's recovery listener
    /// admitted: one seen again is a replay.
    recovery_nonces: Mutex<Vec<Nonce>>,
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
            recovery_nonces: Mutex::new(Vec::new()),
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
    fn take_admitted(&self, ram_bytes: u64, counters: &Arc<Counters>) -> Option<Link> {
        loop {
            let mut link = self.parked.lock().admitted.pop_front()?;
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
    fn next_request(&self, admit: &Admit, wait: Duration) -> Result<Option<Request>> {
        if let Some(request) = self.parked.lock().claim(admit, self.config.handshake_timeout) {
            return Ok(Some(request));
        }
        let event = match self.next_event(Some(wait)) {
            Ok(event) => event,
            Err(e) if e.kind == ErrorKind::Timeout => return Ok(None),
            Err(e) => return Err(e),
        };
        let request = Request::take(self, event, admit)?;
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
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_fits_half_the_liveness_within_bounds() {
        let e = |ms| ack_timeout_exponent(Duration::from_millis(ms));
        // 6 tries of 4.096 µs × 2^e fit in half the liveness: the steps lie at 12 × 4.096 µs × 2^e.
        assert_eq!(e(10_000), 17, "the default: 6 × 0.54 s = 3.2 s ≤ 5 s");
        assert_eq!((e(6_442), e(6_443)), (16, 17));
        assert_eq!((e(12_884), e(12_885)), (17, 18));
        assert_eq!((e(51_539), e(51_540)), (19, 20));
        // Clamped: never below 0.27 s per try, never above 4.3 s.
        assert_eq!((e(1), e(3_000)), (16, 16));
        assert_eq!(e(3_600_000), 20);
    }
}
