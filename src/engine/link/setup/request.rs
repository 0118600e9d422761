//! A connection request: its first checks, and the handshake that makes
//! it a link.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use super::admit::{Admit, RecoveryNonces};
use super::cm::{expect_event, set_ack_timeout, version_error, MAX_RD_ATOMIC, RETRY_COUNT, RNR_RETRY_FOREVER};
use crate::engine::auth::{self, Endpoints, Role, Transcript};
use crate::engine::link::auth::{auth_error, check_source_proof};
use crate::engine::link::connection::Link;
use crate::engine::link::errors::{protocol_error, SetupFailed};
use crate::engine::link::negotiated::Negotiated;
use crate::engine::link::work::INCOMING;
use crate::engine::pin;
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::verbs::{self, CmEventKind, CmId, ConnParam, EventChannel};
use crate::wire::{
    AcceptData, AuthChallenge, Capabilities, ConnectData, RejectData, CAP_RDMAMIG_AUTH, CAP_RDMAMIG_EXT,
    CAP_RDMAMIG_RESUME, REJECT_PIN_REFUSED,
};
use crate::{Error, ErrorKind, Result};

/// A connection request that passed the checks made before anything is set
/// up for it (allow-list, the expected peer, version, authentication
/// required, a recovery's proof): its id, on an event channel of its own
/// (the id migrates to it, so its disconnect events are not taken by
/// whoever waits on the listener).
pub(super) struct Request {
    id: Arc<CmId>,
    channel: Arc<EventChannel>,
    data: ConnectData,
    peer: Option<SocketAddr>,
    from: String,
}

impl Request {
    /// The source's IP address (IPv4 as such), `None` if not IP.
    pub(super) fn source_ip(&self) -> Option<IpAddr> {
        self.peer.map(|a| a.ip().to_canonical())
    }

    /// Whether a QEMU source made it: QEMU never offers rdmamig's extensions
    /// (an rdmamig source's request is never a return path).
    pub(super) fn of_qemu(&self) -> bool {
        self.data.caps.flags & CAP_RDMAMIG_EXT == 0
    }

    /// Where the request came from, for messages.
    pub(super) fn from(&self) -> &str {
        &self.from
    }

    /// Checks one connection event; a request that fails is rejected here.
    pub(super) fn take(
        config: &Config,
        recovery_nonces: &RecoveryNonces,
        event: verbs::CmEvent,
        admit: &Admit,
    ) -> Result<Request> {
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
            if !recovery_nonces.first(nonce) {
                return reject(
                    &[],
                    auth_error(format!("refused a connection from {from}: a replayed recovery request")),
                );
            }
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
    pub(super) fn refuse(self, why: std::fmt::Arguments) -> Error {
        let _ = self.id.reject(&[]);
        Error::new(ErrorKind::Connect, format!("refused a connection from {}: {why}", self.from))
    }

    /// Accepts the request and finishes the handshake (the connection
    /// established and, with a key, the source's proof checked) within the
    /// config's handshake timeout, and, if `given_up` is given, until it is
    /// set (the listener closed).
    pub(super) fn handshake(
        self,
        config: &Config,
        admit: &Admit,
        ram_bytes: u64,
        counters: Arc<Counters>,
        given_up: Option<Arc<AtomicBool>>,
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
