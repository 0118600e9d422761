//! Tags on the control messages of an authenticated connection (rdmamig
//! extension, with `CAP_RDMAMIG_AUTH`): after the handshake every control
//! message carries, after its `16 + len` bytes, a [`CONTROL_TAG_LEN`]-byte
//! HMAC-SHA-256 tag under the sender's direction key of the session
//! (`engine::auth::Session`) over the message's sequence number in that
//! direction and its bytes. A message that is forged, altered, replayed,
//! reordered or dropped (the next one's number no longer matches) fails
//! its check, and the link with it. QEMU peers never authenticate, so they
//! never see a tag.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::engine::auth::{Role, Session};
use crate::wire::CONTROL_TAG_LEN;
use crate::{Error, ErrorKind, Result};

pub(super) struct Seal {
    send_key: Zeroizing<[u8; 32]>,
    receive_key: Zeroizing<[u8; 32]>,
    /// Messages tagged and checked so far, in each direction.
    sent: u64,
    received: u64,
}

impl Seal {
    /// The tags of the side that played `role` in `session`'s handshake.
    pub fn new(session: &Session, role: Role) -> Seal {
        Seal {
            send_key: Zeroizing::new(*session.sending(role)),
            receive_key: Zeroizing::new(*session.receiving(role)),
            sent: 0,
            received: 0,
        }
    }

    /// The tag of the next message sent, `message` (header and payload).
    pub fn tag(&mut self, message: &[u8]) -> [u8; CONTROL_TAG_LEN] {
        let tag = tag_of(&self.send_key, self.sent, message);
        self.sent += 1;
        tag
    }

    /// The message in `received` (the message, then its tag) if the tag
    /// is the one due for the next message received.
    pub fn open<'a>(&mut self, received: &'a [u8]) -> Result<&'a [u8]> {
        let Some(split) = received.len().checked_sub(CONTROL_TAG_LEN) else {
            return Err(forged(format_args!("a control message of {} bytes has no room for its tag", received.len())));
        };
        let (message, tag) = received.split_at(split);
        if mac(&self.receive_key, self.received, message).verify_truncated_left(tag).is_err() {
            return Err(forged(format_args!(
                "control message #{} from the peer failed its authentication tag (forged, altered, replayed or \
                 out of order)",
                self.received
            )));
        }
        self.received += 1;
        Ok(message)
    }
}

fn mac(key: &[u8; 32], sequence: u64, message: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(&sequence.to_be_bytes());
    mac.update(message);
    mac
}

fn tag_of(key: &[u8; 32], sequence: u64, message: &[u8]) -> [u8; CONTROL_TAG_LEN] {
    mac(key, sequence, message).finalize().into_bytes()[..CONTROL_TAG_LEN]
        .try_into()
        .expect("the tag is shorter than SHA-256")
}

fn forged(message: std::fmt::Arguments) -> Error {
    Error::new(ErrorKind::Auth, message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::auth::{AuthKey, Endpoints, Transcript};

    fn session(key: &[u8]) -> Session {
        let t = Transcript {
            version: 1,
            offered: 0xC000_0000,
            granted: 0xC000_0000,
            source_nonce: [1; 32],
            destination_nonce: [2; 32],
            pin_budget: 0,
            recovery_tag: None,
            endpoints: Endpoints { source: None, destination: None },
        };
        AuthKey::new(key).unwrap().session(&t)
    }

    fn sealed(seal: &mut Seal, message: &[u8]) -> Vec<u8> {
        [message, &seal.tag(message)[..]].concat()
    }

    #[test]
    fn messages_pass_in_order_between_the_two_roles_only() {
        let s = session(b"0123456789abcdef");
        let (mut source, mut destination) = (Seal::new(&s, Role::Source), Seal::new(&s, Role::Destination));
        for message in [&b"first message..."[..], b"second", b""] {
            let wire = sealed(&mut source, message);
            assert_eq!(destination.open(&wire).unwrap(), message);
            let wire = sealed(&mut destination, message);
            assert_eq!(source.open(&wire).unwrap(), message);
        }
    }

    #[test]
    fn forged_altered_replayed_reflected_or_dropped_messages_fail() {
        let s = session(b"0123456789abcdef");
        let fresh = || (Seal::new(&s, Role::Source), Seal::new(&s, Role::Destination));
        let check = |why: &str, r: Result<&[u8]>| {
            let e = r.map(|_| ()).expect_err(why);
            assert_eq!(e.kind, ErrorKind::Auth, "{why}: {e}");
        };
        let (mut source, mut destination) = fresh();
        let mut wire = sealed(&mut source, b"END_ACK");
        wire[0] ^= 1;
        check("altered", destination.open(&wire));

        let (mut source, mut destination) = fresh();
        let first = sealed(&mut source, b"one");
        destination.open(&first).unwrap();
        check("replayed", destination.open(&first));

        let (mut source, mut destination) = fresh();
        let _dropped = sealed(&mut source, b"one");
        check("one dropped", destination.open(&sealed(&mut source, b"two")));

        let (mut source, _) = fresh();
        check("reflected", source.open(&sealed(&mut Seal::new(&s, Role::Source), b"x")));

        let (_, mut destination) = fresh();
        let mut other = Seal::new(&session(b"another key 0123"), Role::Source);
        check("another session", destination.open(&sealed(&mut other, b"x")));
        check("too short", destination.open(&[0; CONTROL_TAG_LEN - 1]));
        check("no tag", destination.open(b"READY without its tag"));
    }
}
