//! One RDMA connection: the cm id, an RC queue pair with one completion queue,
//! the three registered control buffers, the READY-credit control channel,
//! RDMA WRITEs and the liveness probe. Setting it up (resolution, connect,
//! accept, the listener) is `setup`.
//!
//! The control channel is QEMU's: the receiver of a message first SENDs READY
//! (one credit), and the sender SENDs only after taking that READY, so a SEND
//! never arrives without a posted RECV (QEMU sets rnr_retry to 0, so that would
//! kill the connection). Responses (REGISTER_RESULT, RAM_BLOCKS_RESULT,
//! UNREGISTER_FINISHED, END_ACK) need no credit: the requester posts the
//! response RECV before its request, and the responder sends the response
//! before its next READY. This type is the one place that owns the credits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::auth::Session;

use super::errors::{encode_error, protocol_error, SetupFailed};
use super::negotiated::Negotiated;
use super::seal::Seal;
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::host::RegisteredBuffer;
use crate::verbs::{
    Access, CmEventKind, CmId, CompletionChannel, CompletionQueue, ProtectionDomain, QpCaps, QueuePair, Sge,
    WorkCompletion, WriteList,
};
use crate::wire::{self, CommandType, EncodeError, Message, MessageWriter, CONTROL_BUFFER_SIZE, CONTROL_TAG_LEN};
use crate::{Error, ErrorKind, Result};

/// Work-request ids. They never travel on the wire.
const WRID_SEND_CONTROL: u64 = 2000;
const WRID_PROBE: u64 = 3000;
const WRID_RECV: [u64; 2] = [4000, 4001];
/// RDMA WRITE ids carry this bit plus the write's sequence number.
const WRID_WRITE: u64 = 1 << 63;
/// RDMA READ ids (post-copy) carry this bit plus the reader's tag.
const WRID_READ: u64 = 1 << 62;

/// Receive slots. `INCOMING` takes READY on the source and every message on the
/// destination; `RESPONSE` takes the answer to a request.
pub(super) const INCOMING: usize = 0;
pub(super) const RESPONSE: usize = 1;

/// Queue sizes as QEMU uses them (512 send WRs, at most 2 RECVs outstanding).
const SEND_QUEUE_DEPTH: u32 = 512;
const RECV_QUEUE_DEPTH: u32 = 3;
/// Writes gathered into one `ibv_post_send` at most, and their bytes: what
/// saves a system call per write on rxe is batching small ones (a final
/// round of scattered 4 KiB pages); large ones go out at once.
const WRITE_LIST_WRS: usize = 16;
const WRITE_LIST_BYTES: u64 = 256 << 10;
const CQ_ENTRIES: i32 = 1024;
/// How often a blocked wait looks at connection events (disconnects), at the
/// liveness probe and at the hypervisor's abort or cancel.
pub(super) const EVENT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long an abort waits until the peer can take an ERROR (see `send_error`).
const ERROR_GRACE: Duration = Duration::from_secs(1);
/// How long a work request the peer's NIC refused waits for the disconnect
/// that would say the peer went away (see `complete`).
const PEER_LOSS_GRACE: Duration = Duration::from_secs(2);
/// How long the source waits for the destination to close first (see `await_peer_close`).
const CLOSE_GRACE: Duration = Duration::from_secs(2);

pub(crate) struct Link {
    pub negotiated: Negotiated,
    /// The pin budget an rdmamig destination announced (source side).
    pub peer_pin_budget: Option<u64>,
    pub timeout: Duration,
    pub(super) liveness: Option<Duration>,
    /// When the outstanding liveness probe was posted.
    pub(super) probe_posted: Option<Instant>,
    /// Last completion of any kind: the peer's NIC was there.
    pub(super) last_heard: Instant,
    pub counters: Arc<Counters>,
    /// Set by the owner of the connection to make blocked waits give up.
    pub stop: Arc<AtomicBool>,
    pub(super) qp: Arc<QueuePair>,
    pub(super) cq: Arc<CompletionQueue>,
    pub pd: Arc<ProtectionDomain>,
    pub(super) id: Arc<CmId>,
    /// The control channel's buffers (each page-aligned: with rdma-core's
    /// fork support on, registrations must cover whole pages).
    pub(super) recv: [RegisteredBuffer; 2],
    pub(super) send: RegisteredBuffer,
    /// Byte length of a message that arrived in each slot and is not yet taken.
    pub(super) received: [Option<u32>; 2],
    /// Whether each slot has a RECV posted.
    pub(super) posted: [bool; 2],
    /// No control SEND is in flight.
    pub(super) send_done: bool,
    /// Writes posted before the control SEND in flight: its completion
    /// proves them complete (send-queue completions are in order).
    pub(super) send_fence: u64,
    /// A request whose response is still to come (`begin_request`): the
    /// response it expects, and until when.
    pub(super) pending: Option<(CommandType, Option<Instant>)>,
    /// The source must take a READY before its next SEND.
    pub(super) ready_expected: bool,
    /// The destination sent READY and has not received the message it allows:
    /// the source has no RECV posted, so nothing else may be sent to it.
    pub(super) ready_granted: bool,
    /// Tearing down: waits no longer give up because `stop` is set.
    pub(super) aborting: bool,
    /// Sequence number of the last write handed to `post_write` (posted or
    /// still gathered in `writes`).
    pub(super) writes_posted: u64,
    pub(super) writes_completed: u64,
    /// Writes gathered for one `ibv_post_send`: posted once full, and before
    /// anything else is posted or waited for, so that posting order (which
    /// `send_fence` and `fence` rely on) is the order of the calls.
    pub(super) writes: WriteList,
    /// A disconnect (or device removal) event arrived: the link is gone, and
    /// this is the error every wait reports once the completions that arrived
    /// before it are taken.
    pub(super) lost: Option<Error>,
    /// That event was the peer's disconnect (not a device removal).
    pub(super) closed_by_peer: bool,
    /// A work request completed in error: an RC QP is then in the error
    /// state, and nothing posted on it reaches the peer any more.
    pub(super) qp_failed: bool,
    /// Tags of RDMA READs completed and not yet taken (`take_reads`).
    pub(super) reads_done: Vec<u64>,
    /// Post-copy's second QP, for fault reads (`fault_qp`), on `pd` and `cq`.
    pub(super) fault_qp: Option<Arc<QueuePair>>,
    /// The keys of an authenticated handshake (`auth`): a recovery
    /// connection that replaces this one proves itself with them.
    pub(super) session: Option<Session>,
    /// Once authenticated, every control message carries a tag (`seal`).
    pub(super) seal: Option<Seal>,
}

impl Link {
    /// A link on `id`, on a new protection domain or (a post-copy recovery
    /// connection) on the protection domain of the link it `replaces`, which
    /// must be on the same device, and stopped by that link's stop flag.
    pub(super) fn new(
        id: Arc<CmId>,
        negotiated: Negotiated,
        config: &Config,
        counters: Arc<Counters>,
        replaces: Option<&Link>,
    ) -> std::result::Result<Link, SetupFailed> {
        let pd = match replaces {
            None => ProtectionDomain::new(&id)?,
            Some(old) if old.pd.is_on(&id) => old.pd.clone(),
            Some(_) => {
                return Err(Error::new(
                    ErrorKind::Connect,
                    "the recovery connection runs over another RDMA device than the lost one: post-copy's \
                     registrations cannot move to it",
                )
                .into())
            }
        };
        let channel = CompletionChannel::new(&id)?;
        let cq = CompletionQueue::new(&id, CQ_ENTRIES, &channel)?;
        let caps =
            QpCaps { max_send_wr: SEND_QUEUE_DEPTH, max_recv_wr: RECV_QUEUE_DEPTH, max_send_sge: 1, max_recv_sge: 1 };
        let qp = QueuePair::new(&id, &pd, &cq, &cq, caps)?;
        let control = || {
            RegisteredBuffer::new(&pd, CONTROL_BUFFER_SIZE, Access::LOCAL_WRITE).map_err(SetupFailed::control_buffer)
        };
        let recv = [control()?, control()?];
        let send = control()?;
        Ok(Link {
            negotiated,
            peer_pin_budget: None,
            timeout: config.timeout,
            liveness: config.liveness,
            probe_posted: None,
            last_heard: Instant::now(),
            counters,
            stop: replaces.map_or_else(|| Arc::new(AtomicBool::new(false)), |old| old.stop.clone()),
            qp,
            cq,
            pd,
            id,
            recv,
            send,
            received: [None; 2],
            posted: [false; 2],
            send_done: true,
            send_fence: 0,
            pending: None,
            ready_expected: true,
            ready_granted: false,
            aborting: false,
            writes_posted: 0,
            writes_completed: 0,
            writes: WriteList::default(),
            lost: None,
            closed_by_peer: false,
            qp_failed: false,
            reads_done: Vec::new(),
            fault_qp: None,
            session: None,
            seal: None,
        })
    }

    pub(super) fn post_recv(&mut self, slot: usize) -> Result<()> {
        debug_assert!(!self.posted[slot] && self.received[slot].is_none());
        // The slot's bytes are read only once this receive completed (`take`).
        self.qp.post_recv(WRID_RECV[slot], self.recv[slot].sge(0, CONTROL_BUFFER_SIZE))?;
        self.posted[slot] = true;
        Ok(())
    }

    /// Takes one batch of completions; when there is none, checks connection
    /// events and the liveness probe, then sleeps until the CQ fires or the
    /// event poll interval passes.
    pub(super) fn progress(&mut self, what: &str, deadline: Option<Instant>) -> Result<()> {
        // Before reaping: a bulk transfer always has completions to take, and
        // an abort must stop it all the same.
        self.check_stop(what)?;
        if self.reap()? > 0 {
            return Ok(());
        }
        self.check_events()?;
        self.keepalive()?;
        let mut wait = EVENT_POLL_INTERVAL;
        if let Some(deadline) = deadline {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("timed out after {:?} waiting for {what}", self.timeout),
                ));
            }
            wait = wait.min(deadline - now);
        }
        self.cq.wait(wait)?;
        Ok(())
    }

    /// Fails once the owner asked to stop (unless this side is tearing down and
    /// still sending its ERROR).
    pub fn check_stop(&self, what: &str) -> Result<()> {
        if !self.aborting && self.stop.load(Ordering::Relaxed) {
            return Err(Error::new(ErrorKind::Aborted, format!("closed while waiting for {what}")));
        }
        Ok(())
    }

    /// Takes one batch of completions without waiting; returns how many.
    pub fn reap(&mut self) -> Result<usize> {
        let mut wcs = [WorkCompletion::default(); 16];
        let n = self.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            self.complete(wc)?;
        }
        Ok(n)
    }

    /// What a wait does on each pass, for a caller that is not waiting (the
    /// source's idle engine): takes completions, looks at connection events,
    /// and probes the peer's liveness.
    pub fn tend(&mut self) -> Result<()> {
        self.flush_writes()?;
        self.reap()?;
        self.check_events()?;
        self.keepalive()
    }

    pub(super) fn complete(&mut self, wc: &WorkCompletion) -> Result<()> {
        let id = wc.wr_id();
        if !wc.is_success() {
            self.qp_failed = true;
            // Work requests flushed by the disconnect: `check_events` reports it.
            if self.lost.is_some() {
                return Ok(());
            }
            let what = match id {
                WRID_PROBE => "probe".to_string(),
                WRID_SEND_CONTROL => "control SEND".to_string(),
                _ if id & WRID_WRITE != 0 => format!("RDMA WRITE #{}", id & !WRID_WRITE),
                _ if id & WRID_READ != 0 => format!("RDMA READ (post-copy) {:#x}", id & !WRID_READ),
                _ => "control RECV".to_string(),
            };
            let failed = format!("{what} failed: {} ({})", wc.status_str(), wc.status());
            // A work request out of retries, like a failed probe, is a peer whose
            // NIC acknowledged nothing: it stopped answering, not a local verbs
            // fault. With liveness on, the ACK timeout comes from the liveness
            // time (`setup::set_ack_timeout`), so this is within it.
            if id == WRID_PROBE || wc.is_retry_exceeded() {
                let within = if self.liveness.is_some() { " (liveness)" } else { "" };
                return Err(Error::new(
                    ErrorKind::Disconnected,
                    format!("the peer stopped answering{within}: {failed}"),
                ));
            }
            // A remote error is also what a peer killed mid-transfer leaves
            // behind (its registrations go before its connection does): then
            // its disconnect follows within moments, and the peer went away.
            // Without one it is the peer's doing (a key it revoked, a broken
            // or hostile peer): a verbs error.
            if wc.is_remote_error() {
                if let Some(lost) = self.loss_within(PEER_LOSS_GRACE)? {
                    let gone = match id {
                        _ if id & WRID_WRITE != 0 => "the destination went away during an RDMA WRITE",
                        _ if id & WRID_READ != 0 => "the source went away during an RDMA READ",
                        _ => "the peer went away during a control SEND",
                    };
                    return Err(Error::new(ErrorKind::Disconnected, format!("{gone} ({failed}; {})", lost.message)));
                }
            }
            return Err(Error::new(ErrorKind::Verbs, failed));
        }
        self.last_heard = Instant::now();
        if id == WRID_PROBE {
            self.probe_posted = None;
        } else if id & WRID_READ != 0 {
            self.reads_done.push(id & !WRID_READ);
        } else if id & WRID_WRITE != 0 {
            // A signalled completion implies every earlier WR on the send queue completed.
            self.writes_completed = self.writes_completed.max(id & !WRID_WRITE);
        } else if id == WRID_SEND_CONTROL {
            self.send_done = true;
            // Send-queue completions are in order: every write before this SEND is done too.
            self.writes_completed = self.writes_completed.max(self.send_fence);
        } else if let Some(slot) = WRID_RECV.iter().position(|&w| w == id) {
            self.posted[slot] = false;
            self.received[slot] = Some(wc.byte_len());
            // The peer re-posts its own receive before it sends: a credit we granted is used.
            if slot == INCOMING {
                self.ready_granted = false;
            }
            Counters::add(&self.counters.control_messages, 1);
        }
        Ok(())
    }

    /// Fails if the connection is gone (disconnect or device removal
    /// events), but only once the CQ is empty: what the peer sent before it
    /// left (its last message, an ERROR) is still taken first.
    pub(super) fn check_events(&mut self) -> Result<()> {
        while self.lost.is_none() && self.take_event(Duration::ZERO)? {}
        match self.lost.clone() {
            Some(e) if self.reap()? == 0 => Err(e),
            _ => Ok(()),
        }
    }

    /// Waits up to `grace` for the connection to be lost (a disconnect or
    /// device removal event); its error, if it was.
    pub(super) fn loss_within(&mut self, grace: Duration) -> Result<Option<Error>> {
        let deadline = Instant::now() + grace;
        while self.lost.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.take_event(left)?;
        }
        Ok(self.lost.clone())
    }

    /// Takes the next connection event, waiting up to `wait` for one; a
    /// disconnect or a device removal marks the link lost. Returns whether
    /// there was an event.
    pub(super) fn take_event(&mut self, wait: Duration) -> Result<bool> {
        let Some(event) = self.id.channel().get_event(Some(wait))? else { return Ok(false) };
        let kind = event.kind();
        if matches!(kind, CmEventKind::Disconnected | CmEventKind::DeviceRemoval | CmEventKind::TimewaitExit) {
            self.closed_by_peer = kind != CmEventKind::DeviceRemoval;
            let why = match kind {
                CmEventKind::Disconnected => "the peer closed the connection, or its process ended",
                CmEventKind::DeviceRemoval => "the RDMA device was removed",
                _ => "the connection was torn down",
            };
            self.lost = Some(Error::new(ErrorKind::Disconnected, format!("connection lost: {why} ({kind:?} event)")));
        }
        Ok(true)
    }

    /// The peer's address (`None` when it is not IP).
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.id.peer_addr()
    }

    /// Whether the connection ended with the peer's disconnect (rather than
    /// a device removal, a transport error or a liveness failure).
    pub fn closed_by_peer(&self) -> bool {
        self.closed_by_peer
    }

    /// Liveness: posts a zero-length RDMA WRITE when nothing was heard from
    /// the peer for a third of the liveness time, and fails when one stays
    /// unacknowledged for two thirds of it. The peer's NIC answers it without
    /// its software seeing anything, so this works against a QEMU peer too.
    pub(super) fn keepalive(&mut self) -> Result<()> {
        let Some(liveness) = self.liveness else {
            return Ok(());
        };
        let now = Instant::now();
        match self.probe_posted {
            Some(at) if now.duration_since(at) > liveness * 2 / 3 => Err(Error::new(
                ErrorKind::Disconnected,
                format!(
                    "the peer has not answered for {:?} (liveness probe unacknowledged)",
                    now.duration_since(self.last_heard)
                ),
            )),
            None if now.duration_since(self.last_heard) >= liveness / 3 => {
                self.qp.post_zero_write(WRID_PROBE, true)?;
                self.probe_posted = Some(now);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    pub(super) fn deadline(&self) -> Option<Instant> {
        Some(Instant::now() + self.timeout)
    }

    pub(super) fn wait_until(
        &mut self,
        what: &str,
        deadline: Option<Instant>,
        done: impl Fn(&Link) -> bool,
    ) -> Result<()> {
        self.flush_writes()?;
        while !done(self) {
            self.progress(what, deadline)?;
        }
        Ok(())
    }

    /// SENDs one message built by `build` and waits (until `deadline`) for the
    /// send completion. The caller holds the credit (or the peer pre-posted a
    /// response RECV).
    pub(super) fn send_until(
        &mut self,
        kind: CommandType,
        deadline: Option<Instant>,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<()> {
        self.post_send(kind, deadline, build)?;
        self.wait_until("a control SEND to complete", deadline, |l| l.send_done)
    }

    /// Posts one control SEND without waiting for its completion (the next
    /// SEND waits, before it reuses the buffer).
    pub(super) fn post_send(
        &mut self,
        kind: CommandType,
        deadline: Option<Instant>,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<()> {
        self.wait_until("a control SEND to complete", deadline, |l| l.send_done)?;
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
        let sge = self.send.sge(0, len);
        self.send_done = false;
        self.flush_writes()?;
        self.send_fence = self.writes_posted;
        // The send buffer is not written again until this send completes (above).
        self.qp.post_send(WRID_SEND_CONTROL, sge, true)?;
        Counters::add(&self.counters.control_messages, 1);
        Ok(())
    }

    pub(super) fn send(
        &mut self,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<()> {
        let deadline = self.deadline();
        self.send_until(kind, deadline, build)
    }

    /// Waits for a message in `slot`, validates it, hands it to `f`, and frees the slot.
    /// An ERROR from the peer and any malformed message become errors here.
    pub(super) fn take<R>(
        &mut self,
        slot: usize,
        deadline: Option<Instant>,
        f: impl FnOnce(&Message) -> Result<R>,
    ) -> Result<R> {
        self.wait_until("a control message from the peer", deadline, |l| l.received[slot].is_some())?;
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
        f(&message)
    }

    pub(super) fn take_expected<R>(
        &mut self,
        slot: usize,
        expect: CommandType,
        deadline: Option<Instant>,
        f: impl FnOnce(&Message) -> Result<R>,
    ) -> Result<R> {
        self.take(slot, deadline, |m| {
            if m.kind != expect {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!("expected {expect:?}, the peer sent {:?}", m.kind),
                ));
            }
            f(m)
        })
    }

    /// Sender side: take the peer's READY if one is owed to us.
    pub(super) fn take_ready(&mut self) -> Result<()> {
        if self.ready_expected {
            let deadline = self.deadline();
            self.take_expected(INCOMING, CommandType::Ready, deadline, |_| Ok(()))?;
            self.ready_expected = false;
        }
        Ok(())
    }

    /// Sender side: one message that expects no response (QEMU_FILE, COMPRESS, REGISTER_FINISHED).
    pub fn post_message(
        &mut self,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<()> {
        self.check_no_request()?;
        self.take_ready()?;
        self.post_recv(INCOMING)?;
        self.send(kind, build)?;
        self.ready_expected = true;
        Ok(())
    }

    /// Sender side: one request and its response, handed to `f`.
    pub fn request<R>(
        &mut self,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
        expect: CommandType,
        f: impl FnOnce(&Message) -> Result<R>,
    ) -> Result<R> {
        let deadline = self.deadline();
        self.request_by(deadline, kind, build, expect, f)
    }

    /// As [`request`](Self::request), with the response awaited until
    /// `deadline` (`None`: as long as the peer stays alive, for work on the
    /// peer that can outlast a network wait, such as pinning all guest RAM).
    pub fn request_by<R>(
        &mut self,
        deadline: Option<Instant>,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
        expect: CommandType,
        f: impl FnOnce(&Message) -> Result<R>,
    ) -> Result<R> {
        self.begin_request_by(deadline, kind, build, expect)?;
        self.finish_request(f)
    }

    /// Sends a request and returns without waiting for its response (nor for
    /// the SEND's completion): RDMA WRITEs may go on meanwhile. Take the
    /// response with `poll_response` or `finish_request` before any other
    /// control message: the peer grants its next credit (READY) only after
    /// it answered, and the one response slot holds one answer.
    pub fn begin_request(
        &mut self,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
        expect: CommandType,
    ) -> Result<()> {
        let deadline = self.deadline();
        self.begin_request_by(deadline, kind, build, expect)
    }

    /// As [`begin_request`](Self::begin_request), the response awaited
    /// until `deadline` (`None`: as long as the peer stays alive).
    pub fn begin_request_by(
        &mut self,
        deadline: Option<Instant>,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
        expect: CommandType,
    ) -> Result<()> {
        self.check_no_request()?;
        self.take_ready()?;
        // The response lands in the first RECV posted, the next READY in the second.
        self.post_recv(RESPONSE)?;
        self.post_recv(INCOMING)?;
        self.post_send(kind, deadline, build)?;
        self.ready_expected = true;
        self.pending = Some((expect, deadline));
        Ok(())
    }

    /// Whether a request's response is still to come.
    pub fn request_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The response to the outstanding request, handed to `f`, if it has
    /// arrived; `None` if not yet (it fails once the request's deadline
    /// passed, as a wait would). Only takes completions: the source calls
    /// it after every queued save, so connection events and the liveness
    /// probe (system calls) are left to its waits and idle passes.
    pub fn poll_response<R>(&mut self, f: impl FnOnce(&Message) -> Result<R>) -> Result<Option<R>> {
        let Some((_, deadline)) = self.pending else {
            return Err(Error::new(ErrorKind::State, "no request is outstanding"));
        };
        self.check_stop("a control message from the peer")?;
        if self.received[RESPONSE].is_none() && self.reap()? == 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("timed out after {:?} waiting for a control message from the peer", self.timeout),
                ));
            }
            return Ok(None);
        }
        if self.received[RESPONSE].is_none() {
            return Ok(None);
        }
        self.finish_request(f).map(Some)
    }

    /// Waits for the response to the outstanding request and hands it to `f`.
    /// The request stays pending until its response is taken, so that a
    /// wait that fails leaves it marked as owed (see `send_error`).
    pub fn finish_request<R>(&mut self, f: impl FnOnce(&Message) -> Result<R>) -> Result<R> {
        let (expect, deadline) =
            self.pending.ok_or_else(|| Error::new(ErrorKind::State, "no request is outstanding"))?;
        let r = self.take_expected(RESPONSE, expect, deadline, f)?;
        self.pending = None;
        Ok(r)
    }

    /// Refuses a control message while a request's response is still to come.
    pub(super) fn check_no_request(&self) -> Result<()> {
        match self.pending {
            Some((expect, _)) => Err(Error::new(
                ErrorKind::State,
                format!("a control message while the response {expect:?} is still to come"),
            )),
            None => Ok(()),
        }
    }

    /// Receiver side: grant one credit (READY) and wait, without a deadline,
    /// for the next message; `f` sees it before the slot is posted again.
    pub fn receive<R>(&mut self, f: impl FnOnce(&Message) -> Result<R>) -> Result<R> {
        self.receive_by(None, f)
    }

    /// As [`receive`](Self::receive), waiting only until `deadline`.
    pub(super) fn receive_by<R>(
        &mut self,
        deadline: Option<Instant>,
        f: impl FnOnce(&Message) -> Result<R>,
    ) -> Result<R> {
        self.grant_and_take(deadline, None, f)
    }

    /// As [`receive`](Self::receive), for a message that must be of type
    /// `expect` (anything else is a protocol error).
    pub fn receive_expected<R>(&mut self, expect: CommandType, f: impl FnOnce(&Message) -> Result<R>) -> Result<R> {
        self.grant_and_take(None, Some(expect), f)
    }

    pub(super) fn grant_and_take<R>(
        &mut self,
        deadline: Option<Instant>,
        expect: Option<CommandType>,
        f: impl FnOnce(&Message) -> Result<R>,
    ) -> Result<R> {
        // Granted before the SEND: the peer may use the credit (and its message
        // clear the flag) while this side still waits for the SEND's completion.
        self.ready_granted = true;
        self.send(CommandType::Ready, |_| Ok(()))?;
        let r = match expect {
            Some(kind) => self.take_expected(INCOMING, kind, deadline, f)?,
            None => self.take(INCOMING, deadline, f)?,
        };
        self.post_recv(INCOMING)?;
        Ok(r)
    }

    /// Receiver side: the response to the message just received (no credit needed).
    pub fn respond(
        &mut self,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<()> {
        self.send(kind, build)
    }

    /// Posts (or gathers, see below) an RDMA WRITE and returns its sequence number.
    ///
    /// Gathered with others into one `ibv_post_send` of up to
    /// `WRITE_LIST_WRS` writes or `WRITE_LIST_BYTES`; the rest are posted by
    /// the next wait, control message or [`flush_writes`](Self::flush_writes).
    /// `remote_addr..+len` lies in the peer's MR of `rkey`.
    pub fn post_write(&mut self, sge: Sge, remote_addr: u64, rkey: u32, signaled: bool) -> Result<u64> {
        let seq = self.writes_posted + 1;
        self.writes.push(WRID_WRITE | seq, sge, remote_addr, rkey, signaled);
        self.writes_posted = seq;
        if self.writes.len() >= WRITE_LIST_WRS || self.writes.bytes() >= WRITE_LIST_BYTES {
            self.flush_writes()?;
        }
        Ok(seq)
    }

    /// Posts the writes gathered by `post_write`: before the caller goes
    /// idle (nothing else would post them).
    pub fn flush_writes(&mut self) -> Result<()> {
        self.qp.post_writes(&mut self.writes)?;
        Ok(())
    }

    /// Posts a signalled RDMA READ (post-copy); its completion shows up in
    /// [`take_reads`](Self::take_reads) as `tag` (below bit 62). A `fault`
    /// read goes on the fault QP when there is one (see `fault_qp`).
    /// `remote_addr..+len` lies in the peer's MR of `rkey` (remote read);
    /// the caller reads `sge`'s bytes once the READ completed.
    pub fn post_read(&mut self, tag: u64, sge: Sge, remote_addr: u64, rkey: u32, fault: bool) -> Result<()> {
        debug_assert!(tag & (WRID_WRITE | WRID_READ) == 0);
        self.flush_writes()?;
        let qp = if fault { self.fault_qp.as_ref().unwrap_or(&self.qp) } else { &self.qp };
        qp.post_read(WRID_READ | tag, sge, remote_addr, rkey, true)?;
        Ok(())
    }

    /// One RDMA READ on the connection's QP, waited for (within the
    /// timeout): for a caller with no other read in flight.
    pub fn read(&mut self, sge: Sge, remote_addr: u64, rkey: u32) -> Result<()> {
        debug_assert!(self.reads_done.is_empty());
        self.post_read(0, sge, remote_addr, rkey, false)?;
        let deadline = self.deadline();
        self.wait_until("an RDMA READ to complete", deadline, |l| !l.reads_done.is_empty())?;
        self.reads_done.clear();
        Ok(())
    }

    /// Moves the tags of the READs completed since the last call into `out`.
    pub fn take_reads(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.reads_done);
    }

    /// One pass of a post-copy wait: takes completions; when there were
    /// none, looks at connection events and the liveness probe, then sleeps
    /// until the CQ fires, `other` (the userfaultfd) is readable, or `wait`
    /// passes.
    pub fn pump(&mut self, other: std::os::fd::RawFd, wait: Duration) -> Result<()> {
        self.check_stop("post-copy")?;
        if self.reap()? > 0 {
            return Ok(());
        }
        self.check_events()?;
        self.keepalive()?;
        self.cq.wait_or(wait.min(EVENT_POLL_INTERVAL), Some(other))?;
        Ok(())
    }

    /// Waits until every write posted so far has completed: posts a
    /// signalled zero-length write behind them (completions are in order)
    /// unless they are known complete already.
    pub fn fence(&mut self) -> Result<()> {
        if self.writes_completed >= self.writes_posted {
            return Ok(());
        }
        self.flush_writes()?;
        let seq = self.writes_posted + 1;
        self.qp.post_zero_write(WRID_WRITE | seq, true)?;
        self.writes_posted = seq;
        self.wait_write(seq)
    }

    /// Writes known to be complete: every write up to this sequence number.
    pub fn writes_completed(&self) -> u64 {
        self.writes_completed
    }

    /// Waits until write `seq` (and so every write before it) has completed.
    /// Only a signalled write or a later control SEND can report that.
    pub fn wait_write(&mut self, seq: u64) -> Result<()> {
        let deadline = self.deadline();
        self.wait_until("RDMA WRITEs to complete", deadline, |l| l.writes_completed >= seq)
    }

    /// After the last exchange (the source's END_ACK): waits up to
    /// `CLOSE_GRACE` for the peer to disconnect first. Disconnecting at once
    /// could reach the peer before the acknowledgement of its last SEND (a
    /// connection event overtakes a transport ACK on rxe), which would flush
    /// that SEND there and make the peer's end a failure.
    pub fn await_peer_close(&mut self) {
        let deadline = Instant::now() + CLOSE_GRACE;
        while self.lost.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.take_event(left).is_err() {
                return;
            }
        }
    }

    /// Best effort on abort: tell the peer with an ERROR message. The peer
    /// must have a RECV posted for it (with rnr_retry 0 a SEND without one
    /// kills the connection instead), and its software re-posts one only some
    /// time after a message arrives. So the ERROR waits (at most
    /// `ERROR_GRACE`), after a SEND still in flight, for what proves a posted
    /// RECV: on the source, the destination's READY (it posts before it
    /// grants); on a destination that granted a READY the source has not used
    /// yet, the source's next message (the source posts before it sends). If
    /// that does not come, the peer learns of the end from the disconnect.
    pub fn send_error(&mut self) {
        // Not on a link that is gone or whose QP failed: nothing can go.
        // Nor while the answer to a request without a deadline is owed: the
        // peer grants no credit before it answers, and that answer may be the
        // very work the failure ends (post-copy's whole pull, which would
        // then run on for the grace).
        if self.lost.is_some() || self.qp_failed || matches!(self.pending, Some((_, None))) {
            return;
        }
        self.aborting = true;
        let deadline = Some(Instant::now() + ERROR_GRACE);
        let can_send = self.wait_until("the peer to be able to take an ERROR", deadline, |l| {
            l.send_done && !l.ready_granted && (!l.ready_expected || l.received[INCOMING].is_some())
        });
        if can_send.is_ok() {
            let _ = self.send_until(CommandType::Error, deadline, |_| Ok(()));
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if self.lost.is_none() {
            let _ = self.id.disconnect();
        }
    }
}
