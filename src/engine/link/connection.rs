//! One RDMA connection, composed of its parts: the control channel
//! (`control`: buffers, credits, requests), the data path (`data_path`:
//! writes, reads, fences) and the liveness probe (`liveness`), over one cm
//! id and an RC queue pair with one completion queue. The link owns the
//! waits: each pass takes completions and hands each to the part whose work
//! request it was (`work`), and looks at connection events. Setting a link
//! up (resolution, connect, accept, the listener) is `setup`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::control::{ControlChannel, Pending};
use super::data_path::DataPath;
use super::errors::SetupFailed;
use super::liveness::Liveness;
use super::loss::Loss;
use super::negotiated::Negotiated;
use super::work::{Work, INCOMING, RESPONSE};
use crate::engine::auth::Session;
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::verbs::{
    CmId, CompletionChannel, CompletionQueue, ProtectionDomain, QpCaps, QueuePair, Sge, WorkCompletion,
};
use crate::wire::{CommandType, EncodeError, Message, MessageWriter};
use crate::{Error, ErrorKind, Result};

/// Queue sizes as QEMU uses them (512 send WRs, at most 2 RECVs outstanding).
const SEND_QUEUE_DEPTH: u32 = 512;
const RECV_QUEUE_DEPTH: u32 = 3;
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
    pub counters: Arc<Counters>,
    /// Set by the owner of the connection to make blocked waits give up.
    pub stop: Arc<AtomicBool>,
    pub(super) qp: Arc<QueuePair>,
    pub(super) cq: Arc<CompletionQueue>,
    pub pd: Arc<ProtectionDomain>,
    pub(super) id: Arc<CmId>,
    pub(super) control: ControlChannel,
    pub(super) data: DataPath,
    liveness: Liveness,
    /// Tearing down: waits no longer give up because `stop` is set.
    aborting: bool,
    pub(super) loss: Loss,
    /// A work request completed in error: an RC QP is then in the error
    /// state, and nothing posted on it reaches the peer any more.
    qp_failed: bool,
    /// The keys of an authenticated handshake (`auth`): a recovery
    /// connection that replaces this one proves itself with them.
    pub(super) session: Option<Session>,
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
        let control = ControlChannel::new(&pd)?;
        Ok(Link {
            negotiated,
            peer_pin_budget: None,
            timeout: config.timeout,
            counters,
            stop: replaces.map_or_else(|| Arc::new(AtomicBool::new(false)), |old| old.stop.clone()),
            qp,
            cq,
            pd,
            id,
            control,
            data: DataPath::default(),
            liveness: Liveness::new(config.liveness),
            aborting: false,
            loss: Loss::default(),
            qp_failed: false,
            session: None,
        })
    }

    pub(super) fn post_recv(&mut self, slot: usize) -> Result<()> {
        self.control.post_recv(&self.qp, slot)
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

    /// Hands a completion to the part whose work request it was; a failed
    /// one becomes the error that says why.
    fn complete(&mut self, wc: &WorkCompletion) -> Result<()> {
        let work = Work::of(wc.wr_id());
        if !wc.is_success() {
            self.qp_failed = true;
            // Work requests flushed by the disconnect: `check_events` reports it.
            if self.loss.is_lost() {
                return Ok(());
            }
            let what = work.map_or_else(|| format!("work request {:#x}", wc.wr_id()), Work::name);
            let failed = format!("{what} failed: {} ({})", wc.status_str(), wc.status());
            // A work request out of retries, like a failed probe, is a peer whose
            // NIC acknowledged nothing: it stopped answering, not a local verbs
            // fault. With liveness on, the ACK timeout comes from the liveness
            // time (`setup::set_ack_timeout`), so this is within it.
            if work == Some(Work::Probe) || wc.is_retry_exceeded() {
                let within = if self.liveness.is_on() { " (liveness)" } else { "" };
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
                if let Some(lost) = self.loss.within(&self.id, PEER_LOSS_GRACE)? {
                    let gone = match work {
                        Some(Work::Write(_)) => "the destination went away during an RDMA WRITE",
                        Some(Work::Read(_)) => "the source went away during an RDMA READ",
                        _ => "the peer went away during a control SEND",
                    };
                    return Err(Error::new(ErrorKind::Disconnected, format!("{gone} ({failed}; {})", lost.message)));
                }
            }
            return Err(Error::new(ErrorKind::Verbs, failed));
        }
        let Some(work) = work else { return Ok(()) };
        self.liveness.heard(work);
        self.data.completed(work);
        match work {
            Work::ControlSend => self.control.sent(),
            Work::Recv(slot) => {
                self.control.arrived(slot, wc.byte_len());
                Counters::add(&self.counters.control_messages, 1);
            }
            Work::Probe | Work::Write(_) | Work::Read(_) => {}
        }
        Ok(())
    }

    /// Fails if the connection is gone (disconnect or device removal
    /// events), but only once the CQ is empty: what the peer sent before it
    /// left (its last message, an ERROR) is still taken first.
    pub(super) fn check_events(&mut self) -> Result<()> {
        self.loss.take_events(&self.id)?;
        match self.loss.error().cloned() {
            Some(e) if self.reap()? == 0 => Err(e),
            _ => Ok(()),
        }
    }

    /// The peer's address (`None` when it is not IP).
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.id.peer_addr()
    }

    /// Whether the connection ended with the peer's disconnect (rather than
    /// a device removal, a transport error or a liveness failure).
    pub fn closed_by_peer(&self) -> bool {
        self.loss.closed_by_peer()
    }

    /// Posts the liveness probe when one is due; fails when the peer
    /// stopped answering it (see `liveness`).
    fn keepalive(&mut self) -> Result<()> {
        self.liveness.check(&self.qp)
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
        self.wait_until("a control SEND to complete", deadline, |l| l.control.send_done())
    }

    /// Posts one control SEND without waiting for its completion (the next
    /// SEND waits, before it reuses the buffer).
    pub(super) fn post_send(
        &mut self,
        kind: CommandType,
        deadline: Option<Instant>,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<()> {
        self.wait_until("a control SEND to complete", deadline, |l| l.control.send_done())?;
        let sge = self.control.compose(kind, build)?;
        self.data.before_control_send(&self.qp)?;
        // The send buffer is not written again until this send completes (above).
        self.qp.post_send(Work::ControlSend.id(), sge, true)?;
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
        self.wait_until("a control message from the peer", deadline, |l| l.control.has(slot))?;
        let message = self.control.open(slot)?;
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
        if self.control.ready_expected() {
            let deadline = self.deadline();
            self.take_expected(INCOMING, CommandType::Ready, deadline, |_| Ok(()))?;
            self.control.expect_ready(false);
        }
        Ok(())
    }

    /// Sender side: one message that expects no response (QEMU_FILE, COMPRESS, REGISTER_FINISHED).
    pub fn post_message(
        &mut self,
        kind: CommandType,
        build: impl FnOnce(&mut MessageWriter) -> std::result::Result<(), EncodeError>,
    ) -> Result<()> {
        self.control.check_no_request()?;
        self.take_ready()?;
        self.post_recv(INCOMING)?;
        self.send(kind, build)?;
        self.control.expect_ready(true);
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
        self.control.check_no_request()?;
        self.take_ready()?;
        // The response lands in the first RECV posted, the next READY in the second.
        self.post_recv(RESPONSE)?;
        self.post_recv(INCOMING)?;
        self.post_send(kind, deadline, build)?;
        self.control.expect_ready(true);
        self.control.set_pending(Some(Pending { expect, deadline }));
        Ok(())
    }

    /// Whether a request's response is still to come.
    pub fn request_pending(&self) -> bool {
        self.control.pending().is_some()
    }

    /// The response to the outstanding request, handed to `f`, if it has
    /// arrived; `None` if not yet (it fails once the request's deadline
    /// passed, as a wait would). Only takes completions: the source calls
    /// it after every queued save, so connection events and the liveness
    /// probe (system calls) are left to its waits and idle passes.
    pub fn poll_response<R>(&mut self, f: impl FnOnce(&Message) -> Result<R>) -> Result<Option<R>> {
        let Some(Pending { deadline, .. }) = self.control.pending() else {
            return Err(Error::new(ErrorKind::State, "no request is outstanding"));
        };
        self.check_stop("a control message from the peer")?;
        if !self.control.has(RESPONSE) && self.reap()? == 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("timed out after {:?} waiting for a control message from the peer", self.timeout),
                ));
            }
            return Ok(None);
        }
        if !self.control.has(RESPONSE) {
            return Ok(None);
        }
        self.finish_request(f).map(Some)
    }

    /// Waits for the response to the outstanding request and hands it to `f`.
    /// The request stays pending until its response is taken, so that a
    /// wait that fails leaves it marked as owed (see `send_error`).
    pub fn finish_request<R>(&mut self, f: impl FnOnce(&Message) -> Result<R>) -> Result<R> {
        let Pending { expect, deadline } =
            self.control.pending().ok_or_else(|| Error::new(ErrorKind::State, "no request is outstanding"))?;
        let r = self.take_expected(RESPONSE, expect, deadline, f)?;
        self.control.set_pending(None);
        Ok(r)
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
        self.control.grant();
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
        self.data.post_write(&self.qp, sge, remote_addr, rkey, signaled)
    }

    /// Posts the writes gathered by `post_write`: before the caller goes
    /// idle (nothing else would post them).
    pub fn flush_writes(&mut self) -> Result<()> {
        self.data.flush(&self.qp)
    }

    /// Posts a signalled RDMA READ (post-copy); its completion shows up in
    /// [`take_reads`](Self::take_reads) as `tag` (below bit 62). A `fault`
    /// read goes on the fault QP when there is one (see `fault_qp`).
    /// `remote_addr..+len` lies in the peer's MR of `rkey` (remote read);
    /// the caller reads `sge`'s bytes once the READ completed.
    pub fn post_read(&mut self, tag: u64, sge: Sge, remote_addr: u64, rkey: u32, fault: bool) -> Result<()> {
        self.data.post_read(&self.qp, tag, sge, remote_addr, rkey, fault)
    }

    /// One RDMA READ on the connection's QP, waited for (within the
    /// timeout): for a caller with no other read in flight.
    pub fn read(&mut self, sge: Sge, remote_addr: u64, rkey: u32) -> Result<()> {
        debug_assert!(!self.data.has_reads_done());
        self.post_read(0, sge, remote_addr, rkey, false)?;
        let deadline = self.deadline();
        self.wait_until("an RDMA READ to complete", deadline, |l| l.data.has_reads_done())?;
        self.data.take_reads(&mut Vec::new());
        Ok(())
    }

    /// Moves the tags of the READs completed since the last call into `out`.
    pub fn take_reads(&mut self, out: &mut Vec<u64>) {
        self.data.take_reads(out);
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
        match self.data.post_fence(&self.qp)? {
            Some(seq) => self.wait_write(seq),
            None => Ok(()),
        }
    }

    /// Writes known to be complete: every write up to this sequence number.
    pub fn writes_completed(&self) -> u64 {
        self.data.writes_completed()
    }

    /// Waits until write `seq` (and so every write before it) has completed.
    /// Only a signalled write or a later control SEND can report that.
    pub fn wait_write(&mut self, seq: u64) -> Result<()> {
        let deadline = self.deadline();
        self.wait_until("RDMA WRITEs to complete", deadline, |l| l.data.writes_completed() >= seq)
    }

    /// After the last exchange (the source's END_ACK): waits up to
    /// `CLOSE_GRACE` for the peer to disconnect first. Disconnecting at once
    /// could reach the peer before the acknowledgement of its last SEND (a
    /// connection event overtakes a transport ACK on rxe), which would flush
    /// that SEND there and make the peer's end a failure.
    pub fn await_peer_close(&mut self) {
        let _ = self.loss.within(&self.id, CLOSE_GRACE);
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
        let owes_unbounded = matches!(self.control.pending(), Some(Pending { deadline: None, .. }));
        if self.loss.is_lost() || self.qp_failed || owes_unbounded {
            return;
        }
        self.aborting = true;
        let deadline = Some(Instant::now() + ERROR_GRACE);
        let can_send = self.wait_until("the peer to be able to take an ERROR", deadline, |l| l.control.peer_can_take());
        if can_send.is_ok() {
            let _ = self.send_until(CommandType::Error, deadline, |_| Ok(()));
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if !self.loss.is_lost() {
            let _ = self.id.disconnect();
        }
    }
}
