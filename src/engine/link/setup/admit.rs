//! Which connection requests an accept takes.

use std::net::{IpAddr, SocketAddr};

use parking_lot::Mutex;

use crate::engine::auth::{self, Nonce};
use crate::engine::link::connection::Link;
use crate::wire::{ConnectData, RECOVERY_TAG_LEN, RECOVERY_TOKEN_LEN};

/// Which connection requests a listener takes (the allow-list applies either way).
pub(in crate::engine::link) enum Admit<'a> {
    Any,
    /// Only from the source already connected (`None`: its address is not IP).
    SameSource(Option<IpAddr>),
    /// A source's recovery listener: only the destination's recovery connection.
    Resume(&'a Resume<'a>),
}

/// A post-copy recovery connection (see `recovery`): the token its request
/// proves, and the link it replaces, whose protection domain (the
/// registrations post-copy reads and reads into) it is made on.
pub(in crate::engine::link) struct Resume<'a> {
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
    pub(super) fn check(&self, request: &ConnectData, peer: Option<SocketAddr>) -> std::result::Result<(), String> {
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

/// The nonces of the recovery requests a source's recovery listener
/// admitted: one seen again is a replay.
#[derive(Default)]
pub(super) struct RecoveryNonces(Mutex<Vec<Nonce>>);

impl RecoveryNonces {
    /// Whether `nonce` was not seen before; remembers it.
    pub(super) fn first(&self, nonce: Nonce) -> bool {
        let mut seen = self.0.lock();
        if seen.contains(&nonce) {
            return false;
        }
        seen.push(nonce);
        true
    }
}
