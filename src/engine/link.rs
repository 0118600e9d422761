//! One RDMA connection: the cm id, an RC queue pair with one completion queue,
//! the three registered control buffers, and the READY-credit control channel.
//!
//! The control channel is QEMU's: the receiver of a message first SENDs READY
//! (one credit), and the sender SENDs only after taking that READY, so a SEND
//! never arrives without a posted RECV (QEMU sets rnr_retry to 0, so that would
//! kill the connection). Responses (REGISTER_RESULT, RAM_BLOCKS_RESULT,
//! UNREGISTER_FINISHED) need no credit: the requester posts the response RECV
//! before its request, and the responder sends the response before its next
//! READY. This type is the one place that owns the credits.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::verbs::{
    self, Access, CmEventKind, CmId, CompletionChannel, CompletionQueue, ConnParam, EventChannel, MemoryRegion,
    ProtectionDomain, QpCaps, QueuePair, Sge, VerbsError, WorkCompletion,
};
use crate::wire::{
    self, Capabilities, CommandType, EncodeError, Message, MessageWriter, CAP_PIN_ALL, CAP_RDMAMIG_EXT,
    CONTROL_BUFFER_SIZE,
};
use crate::{Error, ErrorKind, Result};

/// Work-request ids. They never travel on the wire.
const WRID_SEND_CONTROL: u64 = 2000;
const WRID_PROBE: u64 = 3000;
const WRID_RECV: [u64; 2] = [4000, 4001];
/// RDMA WRITE ids carry this bit plus the write's sequence number.
const WRID_WRITE: u64 = 1 << 63;

/// Receive slots. `INCOMING` takes READY on the source and every message on the
/// destination; `RESPONSE` takes the answer to a request.
const INCOMING: usize = 0;
const RESPONSE: usize = 1;

/// Queue sizes as QEMU uses them (512 send WRs, at most 2 RECVs outstanding).
const SEND_QUEUE_DEPTH: u32 = 512;
const RECV_QUEUE_DEPTH: u32 = 3;
const CQ_ENTRIES: i32 = 1024;
/// QEMU's bound for address and route resolution; the config's timeout may shorten it.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a blocked wait looks at connection events (disconnects), at the
/// liveness probe and at the hypervisor's abort or cancel.
const EVENT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Transport retries of an unacknowledged packet before the QP fails (QEMU's 5).
const RETRY_COUNT: u8 = 5;
/// How long an abort waits until the peer can take an ERROR (see `send_error`).
const ERROR_GRACE: Duration = Duration::from_secs(1);

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Self {
        let kind = if e.is_no_device() { ErrorKind::NoDevice } else { ErrorKind::Verbs };
        Error::new(kind, e.to_string())
    }
}

pub(crate) fn protocol_error(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Protocol, format!("malformed message from peer: {e}"))
}

fn encode_error(e: EncodeError) -> Error {
    Error::new(ErrorKind::InvalidArgument, format!("cannot encode control message: {e}"))
}

/// What the two sides agreed on in the connection private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub pin_all: bool,
    /// Both sides speak rdmamig's extensions (the peer is not QEMU).
    pub extensions: bool,
}

impl Negotiated {
    /// What `config` offers (source) or allows (destination).
    fn offered(config: &Config) -> Self {
        Negotiated { pin_all: config.pin_all, extensions: config.extensions }
    }

    /// Keeps what both this and the peer's capability flags have.
    fn masked(self, flags: u32) -> Self {
        Negotiated {
            pin_all: self.pin_all && flags & CAP_PIN_ALL != 0,
            extensions: self.extensions && flags & CAP_RDMAMIG_EXT != 0,
        }
    }

    fn flags(self) -> u32 {
        (if self.pin_all { CAP_PIN_ALL } else { 0 }) | (if self.extensions { CAP_RDMAMIG_EXT } else { 0 })
    }
}

/// A registered buffer of the control channel. `mr` is declared first so it is
/// deregistered before the memory is freed.
struct ControlBuffer {
    mr: MemoryRegion,
    mem: Box<[u8]>,
}

impl ControlBuffer {
    fn new(pd: &Arc<ProtectionDomain>) -> Result<Self> {
        let mut mem = vec![0u8; CONTROL_BUFFER_SIZE].into_boxed_slice();
        // SAFETY: `mem` lives in the same struct and outlives `mr` (field order).
        let mr = unsafe { pd.register(mem.as_mut_ptr(), mem.len(), Access::LOCAL_WRITE)? };
        Ok(ControlBuffer { mr, mem })
    }

    fn sge(&self, len: usize) -> Sge {
        Sge { addr: self.mem.as_ptr() as u64, len: len as u32, lkey: self.mr.lkey() }
    }
}

pub(crate) struct Link {
    pub negotiated: Negotiated,
    pub timeout: Duration,
    liveness: Option<Duration>,
    /// When the outstanding liveness probe was posted.
    probe_posted: Option<Instant>,
    /// Last completion of any kind: the peer's NIC was there.
    last_heard: Instant,
    pub counters: Arc<Counters>,
    /// Set by the owner of the connection to make blocked waits give up.
    pub stop: Arc<AtomicBool>,
    qp: Arc<QueuePair>,
    cq: Arc<CompletionQueue>,
    pub pd: Arc<ProtectionDomain>,
    id: Arc<CmId>,
    recv: [ControlBuffer; 2],
    send: ControlBuffer,
    /// Byte length of a message that arrived in each slot and is not yet taken.
    received: [Option<u32>; 2],
    /// Whether each slot has a RECV posted.
    posted: [bool; 2],
    /// No control SEND is in flight.
    send_done: bool,
    /// The source must take a READY before its next SEND.
    ready_expected: bool,
    /// The destination sent READY and has not received the message it allows:
    /// the source has no RECV posted, so nothing else may be sent to it.
    ready_granted: bool,
    /// Tearing down: waits no longer give up because `stop` is set.
    aborting: bool,
    writes_posted: u64,
    writes_completed: u64,
    /// A disconnect (or device removal) event arrived: the link is gone.
    disconnected: bool,
    /// That event was the peer's disconnect (not a device removal).
    closed_by_peer: bool,
}

impl Link {
    fn new(id: Arc<CmId>, negotiated: Negotiated, config: &Config, counters: Arc<Counters>) -> Result<Link> {
        let pd = ProtectionDomain::new(&id)?;
        let channel = CompletionChannel::new(&id)?;
        let cq = CompletionQueue::new(&id, CQ_ENTRIES, &channel)?;
        let caps =
            QpCaps { max_send_wr: SEND_QUEUE_DEPTH, max_recv_wr: RECV_QUEUE_DEPTH, max_send_sge: 1, max_recv_sge: 1 };
        let qp = QueuePair::new(&id, &pd, &cq, &cq, caps)?;
        let recv = [ControlBuffer::new(&pd)?, ControlBuffer::new(&pd)?];
        let send = ControlBuffer::new(&pd)?;
        Ok(Link {
            negotiated,
            timeout: config.timeout,
            liveness: config.liveness,
            probe_posted: None,
            last_heard: Instant::now(),
            counters,
            stop: Arc::new(AtomicBool::new(false)),
            qp,
            cq,
            pd,
            id,
            recv,
            send,
            received: [None; 2],
            posted: [false; 2],
            send_done: true,
            ready_expected: true,
            ready_granted: false,
            aborting: false,
            writes_posted: 0,
            writes_completed: 0,
            disconnected: false,
            closed_by_peer: false,
        })
    }

    /// Source side: resolve `host:port`, connect, and negotiate capabilities.
    pub fn connect(host: &str, port: u16, config: &Config, counters: Arc<Counters>) -> Result<Link> {
        let deadline = Instant::now() + config.timeout;
        let addrs = resolve(host, port, config.timeout)?;
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        set_ack_timeout(&id, config)?;
        let mut last = None;
        for addr in &addrs {
            match id.resolve_addr(addr, resolve_timeout_ms(deadline)) {
                Ok(()) => match expect_event(&channel, CmEventKind::AddrResolved, deadline) {
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
        expect_event(&channel, CmEventKind::RouteResolved, deadline)?;

        let offered = Negotiated::offered(config);
        let mut link = Link::new(id, offered, config, counters)?;
        // QEMU posts the READY receive before connecting: the destination may SEND at once.
        link.post_recv(INCOMING)?;
        let caps = Capabilities { version: config.protocol_version, flags: offered.flags() }.encode();
        link.id.connect(&ConnParam {
            private_data: &caps,
            responder_resources: 0,
            initiator_depth: 2,
            retry_count: RETRY_COUNT,
            rnr_retry_count: 0,
        })?;
        let event = wait_event(&channel, deadline)?;
        match event.kind() {
            CmEventKind::Established => {
                let reply = Capabilities::decode(event.private_data()).map_err(protocol_error)?;
                if reply.version != config.protocol_version {
                    return Err(version_error(config.protocol_version, reply.version));
                }
                // The destination clears what it does not support; we turn those features off.
                link.negotiated = offered.masked(reply.flags);
                Ok(link)
            }
            // Our destination rejects a version it does not speak with its own
            // version as private data; a reject without it (nobody listening) is zeros.
            CmEventKind::Rejected => match Capabilities::decode(event.private_data()) {
                Ok(theirs) if theirs.version != 0 && theirs.version != config.protocol_version => {
                    Err(version_error(config.protocol_version, theirs.version))
                }
                _ => Err(Error::new(ErrorKind::Connect, format!("{host}:{port} rejected the connection"))),
            },
            other => Err(Error::new(
                ErrorKind::Connect,
                format!("connecting to {host}:{port} failed: {other:?} (status {})", event.status()),
            )),
        }
    }

    /// Destination side: accept one connection request from `listener`.
    pub fn accept(listener: &Listener, counters: Arc<Counters>, timeout: Option<Duration>) -> Result<Link> {
        let config = &listener.config;
        let event = listener.next_event(timeout)?;
        if event.kind() != CmEventKind::ConnectRequest {
            return Err(Error::new(
                ErrorKind::Connect,
                format!("expected a connection request, got {:?}", event.kind()),
            ));
        }
        // Each connection gets its own event channel (the id migrates to it), so
        // its disconnect events are not taken by whoever waits on the listener.
        let channel = EventChannel::new()?;
        let Some(id) = event.take_request_id(&channel) else {
            return Err(Error::new(ErrorKind::Connect, "connection request without an id"));
        };
        let ours = Capabilities { version: config.protocol_version, flags: 0 };
        let request = match Capabilities::decode(event.private_data()) {
            Ok(r) => r,
            Err(e) => {
                let _ = id.reject(&ours.encode());
                return Err(protocol_error(e));
            }
        };
        drop(event);
        if request.version != config.protocol_version {
            // QEMU just drops such a request; rejecting tells the source why.
            let _ = id.reject(&ours.encode());
            return Err(version_error(config.protocol_version, request.version));
        }
        let negotiated = Negotiated::offered(config).masked(request.flags);
        let link = set_ack_timeout(&id, config).and_then(|()| Link::new(id.clone(), negotiated, config, counters));
        let mut link = match link {
            Ok(link) => link,
            Err(e) => {
                let _ = id.reject(&[]);
                return Err(e);
            }
        };
        // Masking unknown flags is the whole negotiation: echo what we kept.
        let reply = Capabilities { version: request.version, flags: negotiated.flags() };
        link.id.accept(&ConnParam {
            private_data: &reply.encode(),
            responder_resources: 2,
            initiator_depth: 0,
            retry_count: RETRY_COUNT,
            rnr_retry_count: 0,
        })?;
        expect_event(&channel, CmEventKind::Established, Instant::now() + config.timeout)?;
        link.post_recv(INCOMING)?;
        Ok(link)
    }

    fn post_recv(&mut self, slot: usize) -> Result<()> {
        debug_assert!(!self.posted[slot] && self.received[slot].is_none());
        let sge = self.recv[slot].sge(CONTROL_BUFFER_SIZE);
        // SAFETY: the buffer is registered and owned by `self`, which outlives the QP's use of it
        // (the QP is destroyed when `self` drops).
        unsafe { self.qp.post_recv(WRID_RECV[slot], sge)? };
        self.posted[slot] = true;
        Ok(())
    }

    /// Takes one batch of completions; when there is none, checks connection
    /// events and the liveness probe, then sleeps until the CQ fires or the
    /// event poll interval passes.
    fn progress(&mut self, what: &str, deadline: Option<Instant>) -> Result<()> {
        if self.reap()? > 0 {
            return Ok(());
        }
        if !self.aborting && self.stop.load(Ordering::Relaxed) {
            return Err(Error::new(ErrorKind::Aborted, format!("closed while waiting for {what}")));
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

    /// Takes one batch of completions without waiting; returns how many.
    fn reap(&mut self) -> Result<usize> {
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
        self.reap()?;
        self.check_events()?;
        self.keepalive()
    }

    fn complete(&mut self, wc: &WorkCompletion) -> Result<()> {
        let id = wc.wr_id();
        if !wc.is_success() {
            if id == WRID_PROBE {
                return Err(Error::new(
                    ErrorKind::Disconnected,
                    format!("the peer stopped answering: liveness probe failed: {} ({})", wc.status_str(), wc.status()),
                ));
            }
            let what = match id {
                WRID_SEND_CONTROL => "control SEND".to_string(),
                _ if id & WRID_WRITE != 0 => format!("RDMA WRITE #{}", id & !WRID_WRITE),
                _ => "control RECV".to_string(),
            };
            return Err(Error::new(ErrorKind::Verbs, format!("{what} failed: {} ({})", wc.status_str(), wc.status())));
        }
        self.last_heard = Instant::now();
        if id == WRID_PROBE {
            self.probe_posted = None;
        } else if id & WRID_WRITE != 0 {
            // A signalled completion implies every earlier WR on the send queue completed.
            self.writes_completed = self.writes_completed.max(id & !WRID_WRITE);
        } else if id == WRID_SEND_CONTROL {
            self.send_done = true;
            // Send-queue completions are in order: every write before this SEND is done too.
            self.writes_completed = self.writes_posted;
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

    /// Fails if the connection is gone (disconnect or device removal events).
    fn check_events(&mut self) -> Result<()> {
        while let Some(event) = self.id.channel().get_event(Some(Duration::ZERO))? {
            let kind = event.kind();
            if matches!(kind, CmEventKind::Disconnected | CmEventKind::DeviceRemoval | CmEventKind::TimewaitExit) {
                self.disconnected = true;
                self.closed_by_peer = kind != CmEventKind::DeviceRemoval;
                return Err(Error::new(ErrorKind::Disconnected, format!("connection lost: {kind:?} event")));
            }
        }
        Ok(())
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
    fn keepalive(&mut self) -> Result<()> {
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

    fn deadline(&self) -> Option<Instant> {
        Some(Instant::now() + self.timeout)
    }

    fn wait_until(&mut self, what: &str, deadline: Option<Instant>, done: impl Fn(&Link) -> bool) -> Result<()> {
        while !done(self) {
            self.progress(what, deadline)?;
        }
        Ok(())
    }

    /// SENDs one message built by `build` and waits (until `deadline`) for the
    /// send completion. The caller holds the credit (or the peer pre-posted a
    /// response RECV).
    fn send_until(
        &mut self,
        kind: CommandType,
        deadline: Option<Instant>,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<()> {
        let mut writer = MessageWriter::new(&mut self.send.mem, kind);
        build(&mut writer).map_err(encode_error)?;
        let len = writer.finish();
        let sge = self.send.sge(len);
        self.send_done = false;
        // SAFETY: the send buffer is registered and not touched until the completion below.
        unsafe { self.qp.post_send(WRID_SEND_CONTROL, sge, true)? };
        self.wait_until("a control SEND to complete", deadline, |l| l.send_done)?;
        Counters::add(&self.counters.control_messages, 1);
        Ok(())
    }

    fn send(
        &mut self,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<()> {
        let deadline = self.deadline();
        self.send_until(kind, deadline, build)
    }

    /// Waits for a message in `slot`, validates it, hands it to `f`, and frees the slot.
    /// An ERROR from the peer and any malformed message become errors here.
    fn take<R>(&mut self, slot: usize, deadline: Option<Instant>, f: impl FnOnce(&Message) -> Result<R>) -> Result<R> {
        self.wait_until("a control message from the peer", deadline, |l| l.received[slot].is_some())?;
        let len = self.received[slot].take().unwrap_or(0) as usize;
        let bytes =
            self.recv[slot].mem.get(..len).ok_or_else(|| protocol_error(format_args!("message of {len} bytes")))?;
        let message = wire::decode_message(bytes).map_err(protocol_error)?;
        if message.kind == CommandType::Error {
            return Err(Error::new(ErrorKind::PeerError, "the peer aborted the migration (ERROR message)"));
        }
        f(&message)
    }

    fn take_expected<R>(
        &mut self,
        slot: usize,
        expect: CommandType,
        f: impl FnOnce(&Message) -> Result<R>,
    ) -> Result<R> {
        let deadline = self.deadline();
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
    fn take_ready(&mut self) -> Result<()> {
        if self.ready_expected {
            self.take_expected(INCOMING, CommandType::Ready, |_| Ok(()))?;
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
        self.take_ready()?;
        // The response lands in the first RECV posted, the next READY in the second.
        self.post_recv(RESPONSE)?;
        self.post_recv(INCOMING)?;
        self.send(kind, build)?;
        self.ready_expected = true;
        self.take_expected(RESPONSE, expect, f)
    }

    /// Receiver side: grant one credit (READY) and wait, without a deadline,
    /// for the next message; `f` sees it before the slot is posted again.
    pub fn receive<R>(&mut self, f: impl FnOnce(&Message) -> Result<R>) -> Result<R> {
        // Granted before the SEND: the peer may use the credit (and its message
        // clear the flag) while this side still waits for the SEND's completion.
        self.ready_granted = true;
        self.send(CommandType::Ready, |_| Ok(()))?;
        self.wait_until("a control message from the peer", None, |l| l.received[INCOMING].is_some())?;
        let r = self.take(INCOMING, None, f)?;
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

    /// Posts an RDMA WRITE and returns its sequence number.
    ///
    /// # Safety
    /// `sge` lies in a registered local MR whose memory stays valid until the
    /// write completes, and `remote_addr..+len` lies in the peer's MR of `rkey`.
    pub unsafe fn post_write(&mut self, sge: Sge, remote_addr: u64, rkey: u32, signaled: bool) -> Result<u64> {
        let seq = self.writes_posted + 1;
        self.qp.post_write(WRID_WRITE | seq, sge, remote_addr, rkey, signaled)?;
        self.writes_posted = seq;
        Ok(seq)
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

    /// Best effort on abort: tell the peer with an ERROR message. The peer
    /// must have a RECV posted for it (with rnr_retry 0 a SEND without one
    /// kills the connection instead). A source always has one: the
    /// destination re-posts its RECV as soon as a message arrives. A
    /// destination that granted a READY the source has not used yet must
    /// wait: the source's RECV took that READY, and the source posts the next
    /// one just before it sends its next message. So the ERROR waits (at most
    /// `ERROR_GRACE`) for a SEND still in flight and for that message; if the
    /// source sends nothing meanwhile, it learns of the end from the
    /// disconnect instead.
    pub fn send_error(&mut self) {
        if self.disconnected {
            return;
        }
        self.aborting = true;
        let deadline = Some(Instant::now() + ERROR_GRACE);
        let can_send =
            self.wait_until("the peer to be able to take an ERROR", deadline, |l| l.send_done && !l.ready_granted);
        if can_send.is_ok() {
            let _ = self.send_until(CommandType::Error, deadline, |_| Ok(()));
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if !self.disconnected {
            let _ = self.id.disconnect();
        }
    }
}

fn version_error(ours: u32, theirs: u32) -> Error {
    Error::new(ErrorKind::Version, format!("the peer speaks RDMA migration protocol version {theirs}, we speak {ours}"))
}

/// `host:port` as addresses, waiting at most `timeout` for the resolver.
fn resolve(host: &str, port: u16, timeout: Duration) -> Result<Vec<SocketAddr>> {
    verbs::resolve(host, port, timeout)
        .map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::TimedOut { ErrorKind::Timeout } else { ErrorKind::Connect };
            Error::new(kind, format!("cannot resolve '{host}': {e}"))
        })
        .and_then(|a| {
            if a.is_empty() {
                Err(Error::new(ErrorKind::Connect, format!("'{host}' has no address")))
            } else {
                Ok(a)
            }
        })
}

/// The resolve timeout for rdma_cm: QEMU's, or what is left until `deadline` if less.
fn resolve_timeout_ms(deadline: Instant) -> i32 {
    let left = deadline.saturating_duration_since(Instant::now()).min(RESOLVE_TIMEOUT);
    (left.as_millis() as i32).max(1)
}

/// Sets the QP's ACK timeout from the liveness time (see [`ack_timeout_exponent`]);
/// without liveness, rdma_cm's default stays.
fn set_ack_timeout(id: &CmId, config: &Config) -> Result<()> {
    match config.liveness {
        Some(liveness) => Ok(id.set_ack_timeout(ack_timeout_exponent(liveness))?),
        None => Ok(()),
    }
}

/// The QP's ACK timeout, as the exponent e of 4.096 µs × 2^e: the QP gives up
/// on an unacknowledged packet after `RETRY_COUNT + 1` timeouts, which should
/// take at most half the liveness time; but one timeout never drops below
/// 0.27 s (2^16), so a slow software link is not declared dead, nor rises
/// above 4.3 s (2^20).
fn ack_timeout_exponent(liveness: Duration) -> u8 {
    let per_try_ns = liveness.as_nanos() / 2 / (u128::from(RETRY_COUNT) + 1);
    let mut exponent = 16u8;
    while exponent < 20 && 4096u128 << (exponent + 1) <= per_try_ns {
        exponent += 1;
    }
    exponent
}

fn wait_event(channel: &EventChannel, deadline: Instant) -> Result<verbs::CmEvent> {
    let left = deadline.saturating_duration_since(Instant::now());
    channel
        .get_event(Some(left))?
        .ok_or_else(|| Error::new(ErrorKind::Timeout, "timed out waiting for a connection event"))
}

fn expect_event(channel: &EventChannel, kind: CmEventKind, deadline: Instant) -> Result<()> {
    let event = wait_event(channel, deadline)?;
    if event.kind() != kind {
        return Err(Error::new(
            ErrorKind::Connect,
            format!("expected {kind:?}, got {:?} (status {})", event.kind(), event.status()),
        ));
    }
    Ok(())
}

/// A destination's listening endpoint.
pub struct Listener {
    channel: Arc<EventChannel>,
    id: Arc<CmId>,
    config: Config,
    cancelled: AtomicBool,
}

impl Listener {
    /// Listens on `host:port` (a name, an IPv4 or an IPv6 address; port 0 picks one).
    pub fn bind(host: &str, port: u16, config: &Config) -> Result<Listener> {
        let addrs = resolve(host, port, config.timeout)?;
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        id.set_reuseaddr()?;
        let mut last = None;
        for addr in addrs {
            match id.bind_addr(&addr) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            let e = Error::from(e);
            return Err(Error::new(e.kind, format!("cannot bind {host}:{port}: {}", e.message)));
        }
        id.listen(5)?;
        Ok(Listener { channel, id, config: config.clone(), cancelled: AtomicBool::new(false) })
    }

    /// Makes every accept on this listener, running or later, fail with
    /// `Cancelled` (within `EVENT_POLL_INTERVAL`). Callable from any thread.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// The next connection event, waiting at most `timeout` (`None`: for
    /// ever) in slices so that `cancel` is noticed.
    fn next_event(&self, timeout: Option<Duration>) -> Result<verbs::CmEvent> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if self.cancelled.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Cancelled, "the listener was cancelled"));
            }
            let slice = deadline
                .map_or(EVENT_POLL_INTERVAL, |d| d.saturating_duration_since(Instant::now()).min(EVENT_POLL_INTERVAL));
            if let Some(event) = self.channel.get_event(Some(slice))? {
                return Ok(event);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::new(ErrorKind::Timeout, "no connection request arrived"));
            }
        }
    }

    /// The port actually bound (useful after binding port 0).
    pub fn port(&self) -> u16 {
        self.id.local_port()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_fits_half_the_liveness_within_bounds() {
        let e = |ms| ack_timeout_exponent(Duration::from_millis(ms));
        // 6 tries of 4.096 µs × 2^e fit in half the liveness: the steps lie at 12 × 4.096 µs × 2^e.
        assert_eq!(e(10_000), 17, "the default: 6 × 0.54 s = 3.2 s ≤ 5 s");
        assert_eq!((e(6_442), e(6_443)), (16, 17));
        assert_eq!((e(12_884), e(12_885)), (17, 18));
        assert_eq!((e(51_539), e(51_540)), (19, 20));
        // Clamped: never below 0.27 s per try, never above 4.3 s.
        assert_eq!((e(1), e(3_000)), (16, 16));
        assert_eq!(e(3_600_000), 20);
    }
}
