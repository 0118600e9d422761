//! Peer authentication on a connected link (see `engine::auth` for the
//! proofs): the source checks the destination's proof from the accept and
//! sends its own as its first message; the destination checks it before
//! anything else happens on the connection. Then both sides tag every
//! control message (`seal`).

use std::time::Instant;

use super::connection::Link;
use super::errors::protocol_error;
use super::seal::Seal;
use crate::engine::auth::{AuthKey, Proof, Role, Transcript};
use crate::wire::{AuthProof, CommandType};
use crate::{Error, ErrorKind, Result};

pub(super) fn auth_error(message: String) -> Error {
    Error::new(ErrorKind::Auth, message)
}

/// Connecting side, once connected with a key: checks the accepting
/// side's proof, then sends its own (AUTH).
pub(super) fn authenticate(link: &mut Link, key: &AuthKey, t: &Transcript, proof: &Proof) -> Result<()> {
    if !key.verify(Role::Destination, t, proof) {
        return Err(auth_error(
            "the destination failed to prove the pre-shared key for this connection (the keys differ, a host \
             in between relays the connection, or the peer runs rdmamig older than 0.12)"
                .into(),
        ));
    }
    let proof = AuthProof { tag: key.prove(Role::Source, t) };
    link.post_message(CommandType::Auth, |w| w.push(&proof))?;
    seal_with(link, key, t, Role::Source);
    Ok(())
}

/// Accepting side: the connecting side's first message must be AUTH
/// with its proof, by `deadline`. Anything else refuses it
/// (`ErrorKind::Auth`) before any guest memory is registered.
pub(super) fn check_source_proof(
    link: &mut Link,
    key: &AuthKey,
    t: &Transcript,
    from: &str,
    deadline: Instant,
) -> Result<()> {
    let proof = link.receive_by(Some(deadline), |m| match m.kind {
        CommandType::Auth => m.collect_entries::<AuthProof>().map_err(protocol_error).map(|p| p[0]),
        other => Err(Error::new(ErrorKind::Protocol, format!("expected AUTH, got {other:?}"))),
    });
    let refused = match proof {
        Ok(p) if key.verify(Role::Source, t, &p.tag) => {
            seal_with(link, key, t, Role::Destination);
            return Ok(());
        }
        Ok(_) => format!(
            "the source from {from} failed to prove the pre-shared key for this connection (the keys differ, a \
             host in between relays the connection, or the peer runs rdmamig older than 0.12)"
        ),
        // A peer that sent nothing (or is gone) gets no ERROR: waiting
        // for it to take one would hold this handshake past its deadline.
        Err(e) if matches!(e.kind, ErrorKind::Timeout | ErrorKind::Disconnected | ErrorKind::Aborted) => {
            return Err(auth_error(format!("the source from {from} did not authenticate: {}", e.message)))
        }
        Err(e) => format!("the source from {from} did not authenticate: {}", e.message),
    };
    link.send_error();
    Err(auth_error(refused))
}

/// From here on, control messages are tagged under the handshake's session.
fn seal_with(link: &mut Link, key: &AuthKey, t: &Transcript, role: Role) {
    let session = key.session(t);
    link.control.seal(Seal::new(&session, role));
    link.session = Some(session);
}
