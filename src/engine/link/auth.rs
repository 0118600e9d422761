//! Peer authentication on a connected link (see `engine::auth` for the
//! proofs): the source checks the destination's proof from the accept and
//! sends its own as its first message; the destination checks it before
//! anything else happens on the connection.

use std::time::Instant;

use super::{protocol_error, Link};
use crate::engine::auth::{AuthKey, Nonce, Role, Transcript};
use crate::wire::{AcceptData, AuthProof, Capabilities, CommandType};
use crate::{Error, ErrorKind, Result};

pub(super) fn auth_error(message: String) -> Error {
    Error::new(ErrorKind::Auth, message)
}

impl Link {
    /// Source side, once connected with a key: checks the destination's
    /// proof (it must have granted authentication), then sends its own (AUTH).
    pub(super) fn authenticate(
        &mut self,
        key: &AuthKey,
        caps: Capabilities,
        nonce: Nonce,
        accepted: &AcceptData,
    ) -> Result<()> {
        let Some(challenge) = accepted.auth.filter(|_| self.negotiated.authenticated) else {
            return Err(auth_error(
                "the destination does not authenticate (it did not grant the authentication capability)".into(),
            ));
        };
        let transcript = Transcript {
            version: caps.version,
            offered: caps.flags,
            granted: accepted.caps.flags,
            source_nonce: nonce,
            destination_nonce: challenge.nonce,
        };
        if !key.verify(Role::Destination, &transcript, &challenge.proof) {
            return Err(auth_error("the destination failed to prove the pre-shared key (the keys differ?)".into()));
        }
        let proof = AuthProof { tag: key.prove(Role::Source, &transcript) };
        self.post_message(CommandType::Auth, |w| w.push(&proof))
    }

    /// Destination side: the source's first message must be AUTH with its
    /// proof, within the config's timeout. Anything else refuses the source
    /// (`ErrorKind::Auth`) before any guest memory is registered.
    pub(super) fn check_source_proof(&mut self, key: &AuthKey, t: &Transcript, from: &str) -> Result<()> {
        let deadline = Some(Instant::now() + self.timeout);
        let proof = self.receive_by(deadline, |m| match m.kind {
            CommandType::Auth => m.collect_entries::<AuthProof>().map_err(protocol_error).map(|p| p[0]),
            other => Err(Error::new(ErrorKind::Protocol, format!("expected AUTH, got {other:?}"))),
        });
        let refused = match proof {
            Ok(p) if key.verify(Role::Source, t, &p.tag) => return Ok(()),
            Ok(_) => format!("the source from {from} failed to prove the pre-shared key"),
            Err(e) => format!("the source from {from} did not authenticate: {}", e.message),
        };
        self.send_error();
        Err(auth_error(refused))
    }
}
