//! The connecting side: rdma_cm connect with the capability exchange in
//! the private data, resolution bounded by the config's timeout, and what
//! a reject says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::admit::Resume;
use super::cm::{
    check_auth_config, expect_event, resolve, set_ack_timeout, set_tos, version_error, wait_event, MAX_RD_ATOMIC,
    RETRY_COUNT,
};
use crate::engine::auth::{self, Endpoints, Transcript};
use crate::engine::link::auth::{auth_error, authenticate};
use crate::engine::link::connection::Link;
use crate::engine::link::errors::protocol_error;
use crate::engine::link::negotiated::Negotiated;
use crate::engine::link::work::INCOMING;
use crate::engine::pin;
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::verbs::{CmEventKind, CmId, ConnParam, EventChannel};
use crate::wire::{
    AcceptData, Capabilities, ConnectData, RejectData, CAP_RDMAMIG_AUTH, CAP_RDMAMIG_RESUME, REJECT_PIN_REFUSED,
};
use crate::{Error, ErrorKind, Result};

/// QEMU's bound for address and route resolution; the config's timeout may shorten it.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Source side: resolve `host:port`, connect, and negotiate capabilities
/// for `ram_bytes` of guest RAM.
pub(crate) fn connect(host: &str, port: u16, config: &Config, ram_bytes: u64, counters: Arc<Counters>) -> Result<Link> {
    connect_to(host, port, config, ram_bytes, counters, None)
}

/// As [`connect`]; with `resume`, a destination's
/// recovery connection to its source (it reads, and it proves the token).
pub(in crate::engine::link) fn connect_to(
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

/// The resolve timeout for rdma_cm: QEMU's, or what is left until `deadline` if less.
fn resolve_timeout_ms(deadline: Instant) -> i32 {
    let left = deadline.saturating_duration_since(Instant::now()).min(RESOLVE_TIMEOUT);
    (left.as_millis() as i32).max(1)
}
