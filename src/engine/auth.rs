//! Peer authentication (rdmamig extension, `CAP_RDMAMIG_AUTH`) and the
//! listener's allow-list of source addresses.
//!
//! Both sides hold a pre-shared key. The source sends a fresh nonce with its
//! connect request; the destination answers in its accept with a fresh nonce
//! of its own and its proof; the source checks that proof, then its first
//! message (AUTH) is its own proof. A proof is HMAC-SHA-256 under the key of
//! a role label, the protocol version, the offered and granted capability
//! flags and both nonces: a recorded handshake is useless on a new connection
//! (the other side's nonce is new), a proof cannot be reflected as the other
//! role's, and flags changed in flight make both proofs fail. The destination
//! registers no memory before the source's proof checked out.
//!
//! This authenticates the connection's start only: RDMA WRITEs carry guest
//! memory in the clear and are not integrity-protected (see the README's
//! security section).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::wire::{AUTH_NONCE_LEN, AUTH_PROOF_LEN};
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
        mac.update(&t.version.to_be_bytes());
        mac.update(&t.offered.to_be_bytes());
        mac.update(&t.granted.to_be_bytes());
        mac.update(&t.source_nonce);
        mac.update(&t.destination_nonce);
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
}

impl fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthKey(<redacted>)")
    }
}

/// Whose proof: the labels differ so that one side's proof never passes as the other's.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Role {
    Source,
    Destination,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Source => b"rdmamig auth v1: source\0",
            Role::Destination => b"rdmamig auth v1: destination\0",
        }
    }
}

/// What both proofs of one handshake cover.
pub(crate) struct Transcript {
    pub version: u32,
    /// The source's capability flags.
    pub offered: u32,
    /// The flags the destination granted.
    pub granted: u32,
    pub source_nonce: Nonce,
    pub destination_nonce: Nonce,
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
        }
    }

    #[test]
    fn a_proof_verifies_only_for_its_key_role_nonces_and_flags() {
        let key = AuthKey::new(b"0123456789abcdef").unwrap();
        let t = transcript();
        let proof = key.prove(Role::Source, &t);
        assert!(key.verify(Role::Source, &t, &proof));
        assert!(!key.verify(Role::Destination, &t, &proof), "reflected as the other role");
        assert!(!AuthKey::new(b"0123456789abcdeF").unwrap().verify(Role::Source, &t, &proof), "another key");
        let fresh = Transcript { destination_nonce: [3; 32], ..transcript() };
        assert!(!key.verify(Role::Source, &fresh, &proof), "replayed with a new challenge");
        let downgraded = Transcript { granted: 0x8000_0000, ..transcript() };
        assert!(!key.verify(Role::Source, &downgraded, &proof), "flags changed");
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
