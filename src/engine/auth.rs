//! Peer authentication (rdmamig extension, `CAP_RDMAMIG_AUTH`), the keys a
//! handshake derives for the control channel, and the listener's
//! allow-list of source addresses.
//!
//! Both sides hold a pre-shared key. The source sends a fresh nonce with its
//! connect request; the destination answers in its accept with a fresh nonce
//! of its own and its proof; the source checks that proof, then its first
//! message (AUTH) is its own proof. A proof is HMAC-SHA-256 under the key of
//! a role label and the handshake's [`Transcript`]: every field of both
//! private data blocks (version, offered and granted flags, both nonces, the
//! pin budget, a recovery request's tag) and the connection's endpoints as
//! each side sees them. So a recorded handshake is useless on a new
//! connection (the other side's nonce is new), a proof cannot be reflected
//! as the other role's, fields changed in flight make both proofs fail, and
//! a relay between a source and a destination fails too: the source sees
//! the relay's address where the destination sees its own, and the
//! destination sees the relay's address as the source's. The destination
//! registers no memory before the source's proof checked out.
//!
//! From the handshake both sides derive a [`Session`] (HKDF-SHA-256 over the
//! key, both nonces and the transcript): a key per direction for the tags of
//! the control messages that follow (`link::seal`), and the key a post-copy
//! recovery request proves itself with.
//!
//! RDMA WRITE and READ payloads (guest memory) are neither encrypted nor
//! integrity-protected (see docs/security.md).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::wire::{AUTH_NONCE_LEN, AUTH_PROOF_LEN, RECOVERY_TAG_LEN};
use crate::{Error, ErrorKind, Result};

/// Shortest key accepted: 128 bits.
pub const MIN_KEY_LEN: usize = 16;
/// Longest key accepted (HMAC hashes longer keys down anyway).
pub const MAX_KEY_LEN: usize = 1024;

pub type Nonce = [u8; AUTH_NONCE_LEN];
pub type Proof = [u8; AUTH_PROOF_LEN];

/// A pre-shared key. Wiped from memory when dropped; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthKey(Zeroizing<Vec<u8>>);

impl AuthKey {
    /// A key of `MIN_KEY_LEN..=MAX_KEY_LEN` bytes (random bytes, not a password:
    /// nothing here stretches a weak key).
    pub fn new(key: &[u8]) -> Result<AuthKey> {
        if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("an authentication key must have {MIN_KEY_LEN} to {MAX_KEY_LEN} bytes, not {}", key.len()),
            ));
        }
        Ok(AuthKey(Zeroizing::new(key.to_vec())))
    }

    fn mac(&self, role: Role, t: &Transcript) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(role.label());
        mac.update(&t.encode());
        mac
    }

    /// The proof `role` sends for this handshake.
    pub(crate) fn prove(&self, role: Role, t: &Transcript) -> Proof {
        self.mac(role, t).finalize().into_bytes().into()
    }

    /// Whether `proof` is `role`'s proof for this handshake (compared in constant time).
    pub(crate) fn verify(&self, role: Role, t: &Transcript, proof: &Proof) -> bool {
        self.mac(role, t).verify_slice(proof).is_ok()
    }

    /// The keys this handshake gives both sides (see [`Session`]).
    pub(crate) fn session(&self, t: &Transcript) -> Session {
        let salt = [&t.source_nonce[..], &t.destination_nonce[..]].concat();
        let kdf = Hkdf::<Sha256>::new(Some(&salt), &self.0);
        let digest = Sha256::digest(t.encode());
        let derive = |label: &[u8]| {
            let mut out = Zeroizing::new([0u8; 32]);
            kdf.expand_multi_info(&[label, &digest], &mut out[..]).expect("32 bytes is a valid HKDF-SHA-256 length");
            out
        };
        Session {
            source_to_destination: derive(b"rdmamig v2: control, source to destination\0"),
            destination_to_source: derive(b"rdmamig v2: control, destination to source\0"),
            recovery: derive(b"rdmamig v2: post-copy recovery\0"),
        }
    }
}

impl fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthKey(<redacted>)")
    }
}

/// Whose proof: the labels differ so that one side's proof never passes as the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Source,
    Destination,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Source => b"rdmamig auth v2: source\0",
            Role::Destination => b"rdmamig auth v2: destination\0",
        }
    }
}

/// The connection's endpoints as one side sees them: the source's address
/// (without its port, which nothing needs to agree on) and the address and
/// port the source connected to. `None`: not an IP connection (native
/// InfiniBand addressing), bound as such.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Endpoints {
    pub source: Option<IpAddr>,
    pub destination: Option<SocketAddr>,
}

impl Endpoints {
    /// Canonical bytes: IPv4-mapped IPv6 addresses as IPv4.
    fn encode(&self, out: &mut Vec<u8>) {
        fn ip(out: &mut Vec<u8>, ip: Option<IpAddr>) {
            match ip.map(|a| a.to_canonical()) {
                None => out.push(0),
                Some(IpAddr::V4(a)) => {
                    out.push(4);
                    out.extend(a.octets());
                }
                Some(IpAddr::V6(a)) => {
                    out.push(6);
                    out.extend(a.octets());
                }
            }
        }
        ip(out, self.source);
        ip(out, self.destination.map(|a| a.ip()));
        out.extend(self.destination.map_or(0, |a| a.port()).to_be_bytes());
    }
}

/// What both proofs of one handshake cover: every field of both private
/// data blocks, and the endpoints.
pub(crate) struct Transcript {
    pub version: u32,
    /// The source's capability flags.
    pub offered: u32,
    /// The flags the destination granted.
    pub granted: u32,
    pub source_nonce: Nonce,
    pub destination_nonce: Nonce,
    /// The pin budget the destination announced (0: none).
    pub pin_budget: u64,
    /// A recovery connection request's tag (see [`Session::recovery_tag`]).
    pub recovery_tag: Option<[u8; RECOVERY_TAG_LEN]>,
    pub endpoints: Endpoints,
}

impl Transcript {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        out.extend(self.version.to_be_bytes());
        out.extend(self.offered.to_be_bytes());
        out.extend(self.granted.to_be_bytes());
        out.extend(self.source_nonce);
        out.extend(self.destination_nonce);
        out.extend(self.pin_budget.to_be_bytes());
        match &self.recovery_tag {
            Some(tag) => {
                out.push(1);
                out.extend(tag);
            }
            None => out.push(0),
        }
        self.endpoints.encode(&mut out);
        out
    }
}

/// The keys one authenticated handshake derived: one per direction for the
/// control messages' tags, and one for a post-copy recovery request.
/// Wiped when dropped.
pub(crate) struct Session {
    source_to_destination: Zeroizing<[u8; 32]>,
    destination_to_source: Zeroizing<[u8; 32]>,
    recovery: Zeroizing<[u8; 32]>,
}

impl Session {
    /// The key of the control messages `role` sends.
    pub fn sending(&self, role: Role) -> &[u8; 32] {
        match role {
            Role::Source => &self.source_to_destination,
            Role::Destination => &self.destination_to_source,
        }
    }

    /// The key of the control messages `role` receives.
    pub fn receiving(&self, role: Role) -> &[u8; 32] {
        match role {
            Role::Source => &self.destination_to_source,
            Role::Destination => &self.source_to_destination,
        }
    }

    /// The key a recovery request of this connection proves itself with.
    pub fn recovery_key(&self) -> &[u8] {
        &self.recovery[..]
    }
}

/// A post-copy recovery connection request's tag: HMAC-SHA-256, truncated,
/// under `key` (the lost connection's [`Session::recovery_key`] with a
/// pre-shared key, else the recovery token) of the token, the request's
/// fresh nonce and the address the request comes from. It is checked before
/// the source accepts, so nobody without the key (or, unkeyed, the token)
/// gets a queue pair on the protection domain post-copy exposes.
pub(crate) fn recovery_tag(key: &[u8], token: &[u8], nonce: &Nonce, from: Option<IpAddr>) -> [u8; RECOVERY_TAG_LEN] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(b"rdmamig v2: recovery request\0");
    mac.update(token);
    mac.update(nonce);
    let mut from_bytes = Vec::new();
    Endpoints { source: from, destination: None }.encode(&mut from_bytes);
    mac.update(&from_bytes);
    let full = mac.finalize().into_bytes();
    full[..RECOVERY_TAG_LEN].try_into().expect("the tag is shorter than SHA-256")
}

/// Whether two byte strings are equal, in a time that does not depend on
/// where they differ (`subtle`, the constant-time comparison `hmac` uses).
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// A fresh nonce from the operating system's random number generator.
pub(crate) fn nonce() -> Result<Nonce> {
    let mut n = [0u8; AUTH_NONCE_LEN];
    getrandom::getrandom(&mut n)
        .map_err(|e| Error::new(ErrorKind::Auth, format!("cannot draw an authentication nonce: {e}")))?;
    Ok(n)
}

/// An address prefix of the listener's allow-list: `198.18.0.2`,
/// `198.18.0.0/24`, `fd00::/8`. IPv4 sources seen as IPv4-mapped IPv6
/// addresses match IPv4 prefixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourcePrefix {
    addr: IpAddr,
    len: u8,
}

impl SourcePrefix {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.len),
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.len),
            _ => false,
        }
    }
}

/// Whether the first `len` bits of `a` and `b` are equal.
fn prefix_eq(a: &[u8], b: &[u8], len: u8) -> bool {
    let (bytes, bits) = (usize::from(len / 8), len % 8);
    a[..bytes] == b[..bytes] && (bits == 0 || (a[bytes] ^ b[bytes]) >> (8 - bits) == 0)
}

impl FromStr for SourcePrefix {
    type Err = Error;

    fn from_str(s: &str) -> Result<SourcePrefix> {
        let bad = |why: &str| Error::new(ErrorKind::InvalidArgument, format!("'{s}' is not an address prefix: {why}"));
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l.parse::<u8>().map_err(|_| bad("the length is not a number"))?)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad("not an IPv4 or IPv6 address"))?;
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = len.unwrap_or(max);
        if len > max {
            return Err(bad("the length is longer than the address"));
        }
        Ok(SourcePrefix { addr, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            version: 1,
            offered: 0xC000_0001,
            granted: 0xC000_0000,
            source_nonce: [1; 32],
            destination_nonce: [2; 32],
            pin_budget: 1 << 30,
            recovery_tag: None,
            endpoints: Endpoints {
                source: Some("198.18.0.2".parse().unwrap()),
                destination: Some("198.18.0.1:4444".parse().unwrap()),
            },
        }
    }

    #[test]
    fn a_proof_verifies_only_for_its_key_role_and_transcript() {
        let key = AuthKey::new(b"0123456789abcdef").unwrap();
        let t = transcript();
        let proof = key.prove(Role::Source, &t);
        assert!(key.verify(Role::Source, &t, &proof));
        assert!(!key.verify(Role::Destination, &t, &proof), "reflected as the other role");
        assert!(!AuthKey::new(b"0123456789abcdeF").unwrap().verify(Role::Source, &t, &proof), "another key");
        let changed = [
            ("replayed with a new challenge", Transcript { destination_nonce: [3; 32], ..transcript() }),
            ("flags changed", Transcript { granted: 0x8000_0000, ..transcript() }),
            ("offer changed", Transcript { offered: 0xC000_0000, ..transcript() }),
            ("version changed", Transcript { version: 2, ..transcript() }),
            ("pin budget changed", Transcript { pin_budget: 1 << 40, ..transcript() }),
            ("recovery tag added", Transcript { recovery_tag: Some([0; 16]), ..transcript() }),
        ];
        for (why, t) in changed {
            assert!(!key.verify(Role::Source, &t, &proof), "{why}");
        }
    }

    #[test]
    fn a_relayed_handshake_does_not_verify() {
        // A relay R between source S and destination D: S sees (S, R:p), D sees (R, D:p).
        let key = AuthKey::new(b"0123456789abcdef").unwrap();
        let at = |source: &str, destination: &str| Transcript {
            endpoints: Endpoints {
                source: Some(source.parse().unwrap()),
                destination: Some(destination.parse().unwrap()),
            },
            ..transcript()
        };
        let seen_by_source = at("198.18.0.2", "198.18.0.3:4444");
        let seen_by_destination = at("198.18.0.3", "198.18.0.1:4444");
        let destination_proof = key.prove(Role::Destination, &seen_by_destination);
        assert!(!key.verify(Role::Destination, &seen_by_source, &destination_proof));
        let source_proof = key.prove(Role::Source, &seen_by_source);
        assert!(!key.verify(Role::Source, &seen_by_destination, &source_proof));
        // Another port, and IPv4-mapped addresses are the same endpoint.
        assert!(!key.verify(
            Role::Source,
            &at("198.18.0.2", "198.18.0.1:4445"),
            &key.prove(Role::Source, &transcript())
        ));
        let mapped = at("::ffff:198.18.0.2", "[::ffff:198.18.0.1]:4444");
        assert!(key.verify(Role::Source, &mapped, &key.prove(Role::Source, &transcript())));
    }

    #[test]
    fn a_session_has_a_key_per_direction_bound_to_the_handshake() {
        let key = AuthKey::new(b"0123456789abcdef").unwrap();
        let s = key.session(&transcript());
        assert_eq!(s.sending(Role::Source), s.receiving(Role::Destination));
        assert_eq!(s.sending(Role::Destination), s.receiving(Role::Source));
        assert_ne!(s.sending(Role::Source), s.sending(Role::Destination));
        assert_ne!(&s.sending(Role::Source)[..], s.recovery_key());
        let other = key.session(&Transcript { pin_budget: 0, ..transcript() });
        assert_ne!(s.sending(Role::Source), other.sending(Role::Source), "another transcript, other keys");
        let other = AuthKey::new(b"0123456789abcdeF").unwrap().session(&transcript());
        assert_ne!(s.sending(Role::Source), other.sending(Role::Source), "another key, other keys");
    }

    #[test]
    fn a_recovery_tag_binds_key_token_nonce_and_address() {
        let from = Some("198.18.0.1".parse().unwrap());
        let tag = recovery_tag(b"k", &[7; 16], &[1; 32], from);
        assert_eq!(tag, recovery_tag(b"k", &[7; 16], &[1; 32], from));
        assert_ne!(tag, recovery_tag(b"K", &[7; 16], &[1; 32], from));
        assert_ne!(tag, recovery_tag(b"k", &[8; 16], &[1; 32], from));
        assert_ne!(tag, recovery_tag(b"k", &[7; 16], &[2; 32], from));
        assert_ne!(tag, recovery_tag(b"k", &[7; 16], &[1; 32], Some("198.18.0.3".parse().unwrap())));
        assert!(same_bytes(&tag, &tag) && !same_bytes(&tag, &[0; 16]));
    }

    #[test]
    fn keys_are_bounded_and_never_printed() {
        assert_eq!(AuthKey::new(&[7; 15]).unwrap_err().kind, ErrorKind::InvalidArgument);
        assert_eq!(AuthKey::new(&[7; 1025]).unwrap_err().kind, ErrorKind::InvalidArgument);
        let key = AuthKey::new(b"secret-secret-secret").unwrap();
        assert!(!format!("{key:?}").contains("secret"));
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }

    #[test]
    fn prefixes_match_addresses() {
        let p = |s: &str| s.parse::<SourcePrefix>().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(p("198.18.0.2").contains(ip("198.18.0.2")));
        assert!(!p("198.18.0.2").contains(ip("198.18.0.3")));
        assert!(p("198.18.0.0/24").contains(ip("198.18.0.77")));
        assert!(p("198.18.0.0/23").contains(ip("198.18.1.1")));
        assert!(!p("198.18.0.0/23").contains(ip("198.18.2.1")));
        assert!(p("198.18.0.0/24").contains(ip("::ffff:198.18.0.9")), "IPv4-mapped");
        assert!(p("0.0.0.0/0").contains(ip("10.1.2.3")));
        assert!(!p("0.0.0.0/0").contains(ip("fd00::1")));
        assert!(p("fd00::/8").contains(ip("fd12::1")));
        assert!(!p("fd00::/8").contains(ip("fe80::1")));
        for bad in ["198.18.0.0/33", "fd00::/129", "nonsense", "198.18.0.0/x", ""] {
            assert_eq!(bad.parse::<SourcePrefix>().unwrap_err().kind, ErrorKind::InvalidArgument, "{bad}");
        }
    }
}
