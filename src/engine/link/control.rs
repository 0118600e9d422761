//! The control channel's state: its registered buffers, what arrived in
//! each receive slot, the READY credits, the request whose response is
//! owed, and the seal of an authenticated link. Waiting is the link's:
//! this part composes, opens and keeps the books.
//!
//! The control channel is QEMU's: the receiver of a message first SENDs READY
//! (one credit), and the sender SENDs only after taking that READY, so a SEND
//! never arrives without a posted RECV (QEMU sets rnr_retry to 0, so that would
//! kill the connection). Responses (REGISTER_RESULT, RAM_BLOCKS_RESULT,
//! UNREGISTER_FINISHED, END_ACK) need no credit: the requester posts the
//! response RECV before its request, and the responder sends the response
//! before its next READY. This type is the one place that owns the credits.

use std::sync::Arc;
use std::time::Instant;

use super::errors::{encode_error, protocol_error, SetupFailed};
use super::seal::Seal;
use super::work::{Work, INCOMING};
use crate::host::RegisteredBuffer;
use crate::verbs::{Access, ProtectionDomain, QueuePair, Sge};
use crate::wire::{self, CommandType, EncodeError, Message, MessageWriter, CONTROL_BUFFER_SIZE, CONTROL_TAG_LEN};
use crate::{Error, ErrorKind, Result};

/// A request sent whose response is still to come: the response it
/// expects, and until when (`None`: as long as the peer stays alive).
#[derive(Clone, Copy)]
pub(super) struct Pending {
    pub expect: CommandType,
    pub deadline: Option<Instant>,
}

pub(super) struct ControlChannel {
    /// The buffers (each page-aligned: with rdma-core's fork support on,
    /// registrations must cover whole pages).
    recv: [RegisteredBuffer; 2],
    send: RegisteredBuffer,
    /// Byte length of a message that arrived in each slot and is not yet taken.
    received: [Option<u32>; 2],
    /// Whether each slot has a RECV posted.
    posted: [bool; 2],
    /// No control SEND is in flight.
    send_done: bool,
    pending: Option<Pending>,
    /// The source must take a READY before its next SEND.
    ready_expected: bool,
    /// The destination sent READY and has not received the message it allows:
    /// the source has no RECV posted, so nothing else may be sent to it.
    ready_granted: bool,
    /// Once authenticated, every message carries a tag.
    seal: Option<Seal>,
}

impl ControlChannel {
    /// The channel's buffers, registered on `pd`, for a link whose side
    /// takes a READY before its first message (`ready_expected`).
    pub(super) fn new(pd: &Arc<ProtectionDomain>) -> std::result::Result<ControlChannel, SetupFailed> {
        let buffer =
            || RegisteredBuffer::new(pd, CONTROL_BUFFER_SIZE, Access::LOCAL_WRITE).map_err(SetupFailed::control_buffer);
        Ok(ControlChannel {
            recv: [buffer()?, buffer()?],
            send: buffer()?,
            received: [None; 2],
            posted: [false; 2],
            send_done: true,
            pending: None,
            ready_expected: true,
            ready_granted: false,
            seal: None,
        })
    }

    pub(super) fn post_recv(&mut self, qp: &QueuePair, slot: usize) -> Result<()> {
        debug_assert!(!self.posted[slot] && self.received[slot].is_none());
        // The slot's bytes are read only once this receive completed (`open`).
        qp.post_recv(Work::Recv(slot).id(), self.recv[slot].sge(0, CONTROL_BUFFER_SIZE))?;
        self.posted[slot] = true;
        Ok(())
    }

    /// A message of `len` bytes arrived in `slot`.
    pub(super) fn arrived(&mut self, slot: usize, len: u32) {
        self.posted[slot] = false;
        self.received[slot] = Some(len);
        // The peer re-posts its own receive before it sends: a credit we granted is used.
        if slot == INCOMING {
            self.ready_granted = false;
        }
    }

    /// Whether a message waits in `slot`.
    pub(super) fn has(&self, slot: usize) -> bool {
        self.received[slot].is_some()
    }

    /// The SEND in flight completed: the send buffer may be written again.
    pub(super) fn sent(&mut self) {
        self.send_done = true;
    }

    pub(super) fn send_done(&self) -> bool {
        self.send_done
    }

    /// Writes the message `build` makes into the send buffer, sealed when the
    /// link is authenticated; the SGE to post. The send counts as in flight
    /// from here (call only once `send_done`).
    pub(super) fn compose(
        &mut self,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<Sge> {
        debug_assert!(self.send_done);
        // A tagged message leaves room for its tag.
        let room = CONTROL_BUFFER_SIZE - if self.seal.is_some() { CONTROL_TAG_LEN } else { 0 };
        let mut writer = MessageWriter::new(&mut self.send.bytes_mut()[..room], kind);
        build(&mut writer).map_err(encode_error)?;
        let mut len = writer.finish();
        if let Some(seal) = &mut self.seal {
            let tag = seal.tag(&self.send.bytes()[..len]);
            self.send.bytes_mut()[len..len + CONTROL_TAG_LEN].copy_from_slice(&tag);
            len += CONTROL_TAG_LEN;
        }
        self.send_done = false;
        Ok(self.send.sge(0, len))
    }

    /// Takes the message that arrived in `slot`: checks its seal, decodes
    /// it, and turns the peer's ERROR into an error.
    pub(super) fn open(&mut self, slot: usize) -> Result<Message<'_>> {
        let len = self.received[slot].take().unwrap_or(0) as usize;
        let mut bytes =
            self.recv[slot].bytes().get(..len).ok_or_else(|| protocol_error(format_args!("message of {len} bytes")))?;
        if let Some(seal) = &mut self.seal {
            bytes = seal.open(bytes)?;
        }
        let message = wire::decode_message(bytes).map_err(protocol_error)?;
        if message.kind == CommandType::Error {
            return Err(Error::new(ErrorKind::PeerError, "the peer aborted the migration (ERROR message)"));
        }
        Ok(message)
    }

    /// From now on every message is sealed and every one received must be.
    pub(super) fn seal(&mut self, seal: Seal) {
        self.seal = Some(seal);
    }

    /// Whether this side must take a READY before its next message.
    pub(super) fn ready_expected(&self) -> bool {
        self.ready_expected
    }

    /// This side's role: the source takes a READY before each message it
    /// sends (`true`), the destination grants them (`false`).
    pub(super) fn expect_ready(&mut self, expected: bool) {
        self.ready_expected = expected;
    }

    /// This side grants the peer one credit (sends READY).
    pub(super) fn grant(&mut self) {
        self.ready_granted = true;
    }

    /// Whether the peer surely has a RECV posted for one more SEND: no SEND
    /// in flight, no credit granted and unused, and, on a side that takes
    /// READYs, the peer's READY arrived.
    pub(super) fn peer_can_take(&self) -> bool {
        self.send_done && !self.ready_granted && (!self.ready_expected || self.received[INCOMING].is_some())
    }

    pub(super) fn pending(&self) -> Option<Pending> {
        self.pending
    }

    pub(super) fn set_pending(&mut self, pending: Option<Pending>) {
        self.pending = pending;
    }

    /// Refuses a control message while a request's response is still to come.
    pub(super) fn check_no_request(&self) -> Result<()> {
        match self.pending {
            Some(Pending { expect, .. }) => Err(Error::new(
                ErrorKind::State,
                format!("a control message while the response {expect:?} is still to come"),
            )),
            None => Ok(()),
        }
    }
}
