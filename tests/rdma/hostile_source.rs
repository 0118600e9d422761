//! A crafted destination: a test peer built only from the public
//! `rdmamig::verbs` and `rdmamig::wire` APIs, serving a real `Source`. It
//! follows the READY credit protocol as QEMU's destination does (its receive
//! posted after ESTABLISHED; one READY before each message it takes, the
//! receive posted again at once; a response before the next READY), and
//! answers with what a well-behaved destination never sends.
//!
//! Every case ends in `Case::refused`, which checks for all of them alike:
//! the source's call fails within `BOUND` with the expected `ErrorKind` and a
//! message naming the problem; the crafted destination then receives ERROR
//! where the link lets the source send one (the source has a receive posted
//! for a READY and the destination grants one), then the disconnect, and
//! nothing else; and the source's guest RAM still holds its pattern.
//!
//! The protocol never gives a destination a key to the source's memory: the
//! source registers its RAM without remote access and sends addresses in the
//! destination's RAM space, never an rkey of its own. So no case can try a
//! write with a key it learned; `source_ram_refuses_a_write_with_its_real_rkey`
//! takes the real key from the kernel's resource table instead.
//!
//! Over IB/RoCE the kernel pads the accept's private data to 196 bytes with
//! zeros, so private data shorter than 8 bytes cannot be told from data
//! whose missing bytes are 0: only the version it then carries can be wrong.
//!
//! Cases:
//! - accept_with_version_2_or_0_is_refused
//! - accept_with_empty_or_short_private_data_is_refused
//! - accept_with_garbage_flags_is_refused
//! - accept_granting_pin_all_not_offered_is_refused
//! - accept_announcing_a_pin_budget_below_a_chunk_is_refused
//! - ram_blocks_result_with_fewer_blocks_is_refused
//! - ram_blocks_result_with_more_blocks_is_refused
//! - ram_blocks_result_with_another_block_length_is_refused
//! - ram_blocks_result_with_a_block_offset_wrapping_is_refused
//! - ram_blocks_result_with_a_block_host_address_wrapping_is_refused
//! - ram_blocks_result_with_repeat_0_4097_or_huge_is_refused
//! - ram_blocks_result_with_a_partial_entry_is_refused
//! - ram_blocks_result_with_len_beyond_what_arrived_is_refused
//! - response_longer_than_the_receive_buffer_fails_the_receive
//! - register_result_with_fewer_entries_is_refused
//! - register_result_with_more_entries_is_refused
//! - register_result_with_len_not_repeat_times_16_is_refused
//! - register_result_sent_unasked_is_refused
//! - register_result_with_a_wrong_rkey_fails_the_write
//! - unregister_finished_sent_unasked_is_refused
//! - end_ack_sent_unasked_is_refused
//! - ram_blocks_result_sent_unasked_is_refused
//! - unknown_command_type_is_refused
//! - command_type_0_is_refused
//! - message_sent_without_a_credit_is_refused
//! - error_before_ram_blocks_is_a_peer_error
//! - error_mid_window_is_a_peer_error
//! - error_in_answer_to_end_is_a_peer_error
//! - second_ready_without_receiving_fails_the_next_send
//! - destination_never_sending_ready_times_out
//! - destination_never_answering_register_times_out
//! - destination_never_answering_ram_blocks_times_out
//! - source_ram_refuses_a_write_with_its_real_rkey
//! - recovery_listener_refuses_requests_without_the_tokens_proof
//!
//! And one case of a well-behaved QEMU destination that ends the connection
//! first: qemu_destination_disconnecting_after_the_last_flush_ends_the_migration.

use hmac::{Hmac, Mac};
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{fence, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::verbs::{
    Access, CmEventKind, CmId, CompletionChannel, CompletionQueue, ConnParam, EventChannel, MemoryRegion,
    ProtectionDomain, QpCaps, QueuePair, WorkCompletion,
};
use rdmamig::wire::{
    self, AcceptData, BlockSpec, Capabilities, CommandType, ConnectData, ControlHeader, DestBlock, Entry,
    PostcopyBlock, PostcopyRecovery, PostcopySummary, QpEndpoint, RegisterRequest, RegisterResult, CAP_PIN_ALL,
    CAP_RDMAMIG_EXT, CAP_RDMAMIG_RECOVERY, CAP_RDMAMIG_RESUME, CONTROL_BUFFER_SIZE, CONTROL_HEADER_LEN, MAX_PAYLOAD,
    RECOVERY_TOKEN_LEN,
};
use rdmamig::{Config, Error, ErrorKind, Negotiated, RamBlocks, Source, StalePages};

use crate::hostile::{
    next_event, next_wc, ControlBuffer, Peer as CraftedSource, Received, WRID_RECV, WRID_SEND, WRID_WRITE,
};
use crate::migration::{rdma_ip, GuestRam};
use sha2::Sha256;

const MIB: u64 = 1 << 20;
/// The source's RAM blocks: several chunks each, so a registration batch has several entries.
const BLOCKS: [(&str, u64); 2] = [("pc.ram", 4 * MIB), ("vga.vram", MIB)];
/// Where each block lies in the source's RAM address space.
const SOURCE_OFFSETS: [u64; 2] = [0, 64 * MIB];
/// Where the crafted destination puts the blocks in its own RAM address space
/// (contiguous from here, in the source's order).
const DEST_BASE: u64 = 1 << 30;
/// The source's guest RAM: not zero, so every chunk is registered and written
/// (a zero range would go as COMPRESS).
const PATTERN: u8 = 0x5A;
/// How long the source's calls get to fail, from the hostile act.
const BOUND: Duration = Duration::from_secs(20);
/// How long the crafted destination waits for what the source sends.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long the source gets to send ERROR and to disconnect, once it failed.
const FAIL_WITHIN: Duration = Duration::from_secs(5);
/// The source's `Config::timeout` in the cases about a destination that stops answering.
const SHORT_TIMEOUT: Duration = Duration::from_secs(2);
/// `IBV_WC_REM_ACCESS_ERR`: the responder refused an RDMA WRITE (key or access rights).
const WC_REMOTE_ACCESS_ERROR: u32 = 10;

/// The source's configuration: short waits, so a missing answer shows fast.
fn config() -> Config {
    Config { timeout: Duration::from_secs(5), liveness: Some(Duration::from_secs(3)), ..Config::default() }
}

/// What a well-behaved rdmamig destination accepts with: the rdmamig
/// extensions the source offers (so END / END_ACK close the migration), no budget.
fn accept_data() -> Vec<u8> {
    AcceptData { caps: Capabilities::v1(CAP_RDMAMIG_EXT), pin_budget: None, auth: None }.encode().to_vec()
}

/// A completion's failure as its status, for the record.
fn wc_result(wc: &WorkCompletion) -> Result<(), String> {
    if wc.is_success() {
        Ok(())
    } else {
        Err(format!("{} ({})", wc.status_str(), wc.status()))
    }
}

/// `entries` encoded back to back, as a payload.
fn encoded<E: Entry>(entries: &[E]) -> Vec<u8> {
    let mut out = vec![0u8; entries.len() * E::SIZE];
    for (e, slot) in entries.iter().zip(out.chunks_mut(E::SIZE)) {
        e.encode(slot);
    }
    out
}

// ---------------------------------------------------------------------------
// The source, run by a thread of its own

/// The source's calls after `Source::connect`, in the order a case makes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    /// `Source::connect` (always made first; not listed in a case's calls).
    Connect,
    /// One iteration window over all of RAM: `iteration_begin`, a `save` per
    /// block, `iteration_end` (the first window also exchanges the block lists).
    Window,
    /// `put` of a few stream bytes, then `flush`.
    Flush,
    /// `close` (with an rdmamig destination: END, then END_ACK). Last.
    Close,
    /// Waits until the test releases the source (`Case::release_source`):
    /// the destination acts first.
    Hold,
}

/// How the source's run ended.
#[derive(Debug)]
enum Outcome {
    /// Every call succeeded.
    Succeeded(Negotiated),
    /// `call` failed with `error` after `took`.
    Failed { call: Call, error: Error, took: Duration },
}

/// The source's guest RAM, one mapping per block, all `PATTERN`.
fn source_ram() -> Arc<Vec<GuestRam>> {
    Arc::new(BLOCKS.iter().map(|&(_, len)| GuestRam::new(len, PATTERN)).collect())
}

/// Connects a source over `ram` to `port`, makes `calls` until one fails
/// (`Hold` waits for `release`), and sends how it ended once the source is
/// torn down. The thread holds the RAM until then: a source that hangs (the
/// test failed) never sees it unmapped.
fn run_source(
    port: u16,
    config: Config,
    ram: Arc<Vec<GuestRam>>,
    calls: &'static [Call],
    release: Receiver<()>,
) -> Receiver<Outcome> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let outcome = source_calls(port, &config, &ram, calls, &release);
        let _ = tx.send(outcome);
    });
    rx
}

fn source_calls(port: u16, config: &Config, ram: &[GuestRam], calls: &[Call], release: &Receiver<()>) -> Outcome {
    let mut registry = RamBlocks::new();
    for ((&(name, len), mem), offset) in BLOCKS.iter().zip(ram).zip(SOURCE_OFFSETS) {
        // SAFETY: the mapping outlives the source (this thread holds it).
        unsafe { registry.add(name, mem.ptr(), offset, len).expect("add block") };
    }
    let start = Instant::now();
    let mut source = match Source::connect(&rdma_ip(), port, config, &registry) {
        Ok(source) => source,
        Err(error) => return Outcome::Failed { call: Call::Connect, error, took: start.elapsed() },
    };
    let negotiated = source.negotiated();
    for &call in calls {
        let start = Instant::now();
        let result = match call {
            Call::Connect => unreachable!("connect is always the first call"),
            Call::Window => window(&mut source),
            Call::Flush => source.put(b"device state").and_then(|()| source.flush()),
            Call::Hold => {
                release.recv_timeout(TIMEOUT).expect("the test did not release the source");
                Ok(())
            }
            Call::Close => {
                return match source.close() {
                    Ok(_) => Outcome::Succeeded(negotiated),
                    Err(error) => Outcome::Failed { call, error, took: start.elapsed() },
                }
            }
        };
        if let Err(error) = result {
            return Outcome::Failed { call, error, took: start.elapsed() };
        }
    }
    Outcome::Succeeded(negotiated)
}

fn window(source: &mut Source) -> Result<(), Error> {
    source.iteration_begin()?;
    for (block, &(_, len)) in BLOCKS.iter().enumerate() {
        source.save(block as u32, 0, len)?;
    }
    source.iteration_end()
}

// ---------------------------------------------------------------------------
// The crafted destination

/// A listening id on a free port of the RDMA address.
struct Listening {
    channel: Arc<EventChannel>,
    _id: Arc<CmId>,
    port: u16,
}

impl Listening {
    fn new() -> Listening {
        let ip: IpAddr = rdma_ip().parse().expect("RXE_VM_IP");
        let channel = EventChannel::new().expect("event channel");
        let id = CmId::new(&channel).expect("cm id");
        id.bind_addr(&SocketAddr::new(ip, 0)).expect("bind");
        id.listen(5).expect("listen");
        let port = id.local_port();
        Listening { channel, _id: id, port }
    }
}

/// The crafted destination: one RC connection with QEMU's queue sizes, and
/// RAM for the source's blocks registered for remote writes. Fields drop in
/// order: the QP first, the RAM last (after its registration).
struct Dest {
    qp: Arc<QueuePair>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    /// The one receive buffer (QEMU's slot 0: every message of the source lands there).
    recv: ControlBuffer,
    send_buf: ControlBuffer,
    recv_posted: bool,
    /// A READY was sent and the message it allows has not arrived.
    granted: bool,
    /// The source's ERROR arrived.
    error_received: bool,
    /// What the source offered in its connection request.
    offered: Capabilities,
    ram_mr: MemoryRegion,
    ram: GuestRam,
    id: Arc<CmId>,
}

impl Dest {
    /// Takes the source's connection request on `listening` and accepts it
    /// with `private_data`, as QEMU's destination does (receive posted after ESTABLISHED).
    fn accept(listening: &Listening, private_data: &[u8]) -> Dest {
        let deadline = Instant::now() + TIMEOUT;
        let request = next_event(&listening.channel, CmEventKind::ConnectRequest, deadline);
        let channel = EventChannel::new().expect("event channel");
        let id = request.take_request_id(&channel).expect("the request's id");
        let offered = Capabilities::decode(request.private_data()).expect("the source's private data");
        drop(request);
        let pd = ProtectionDomain::new(&id).expect("pd");
        let send_cq = CompletionQueue::new(&id, 64, &CompletionChannel::new(&id).expect("channel")).expect("send cq");
        let recv_cq = CompletionQueue::new(&id, 16, &CompletionChannel::new(&id).expect("channel")).expect("recv cq");
        let caps = QpCaps { max_send_wr: 16, max_recv_wr: 3, max_send_sge: 1, max_recv_sge: 1 };
        let qp = QueuePair::new(&id, &pd, &send_cq, &recv_cq, caps).expect("qp");
        let ram = GuestRam::new(BLOCKS.iter().map(|b| b.1).sum(), 0);
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // SAFETY: the mapping is a later field of the same struct and outlives the registration.
        let ram_mr = unsafe { pd.register(ram.ptr(), ram.bytes().len(), access) }.expect("register RAM");
        let recv = ControlBuffer::new(&pd, CONTROL_BUFFER_SIZE);
        let send_buf = ControlBuffer::new(&pd, CONTROL_BUFFER_SIZE);
        let param =
            ConnParam { private_data, responder_resources: 2, initiator_depth: 0, retry_count: 5, rnr_retry_count: 0 };
        id.accept(&param).expect("accept");
        next_event(&channel, CmEventKind::Established, deadline);
        let mut dest = Dest {
            qp,
            send_cq,
            recv_cq,
            recv,
            send_buf,
            recv_posted: false,
            granted: false,
            error_received: false,
            offered,
            ram_mr,
            ram,
            id,
        };
        dest.post_recv().expect("post_recv");
        dest
    }

    fn post_recv(&mut self) -> Result<(), String> {
        assert!(!self.recv_posted, "the receive is posted already");
        let sge = self.recv.mr.sge(0, CONTROL_BUFFER_SIZE as u32).expect("sge");
        self.qp.post_recv(WRID_RECV, sge).map_err(|e| e.to_string())?;
        self.recv_posted = true;
        Ok(())
    }

    /// The next message from the source, within `timeout`: `Some(Err(status))`
    /// for a failed (flushed) receive, `None` if nothing came. The receive is
    /// posted again at once, as QEMU does.
    fn take(&mut self, timeout: Duration) -> Option<Result<Received, String>> {
        let wc = next_wc(&self.recv_cq, Instant::now() + timeout)?;
        assert!(self.recv_posted && wc.wr_id() == WRID_RECV, "a receive completed that was never posted: {wc:?}");
        self.recv_posted = false;
        if let Err(status) = wc_result(&wc) {
            return Some(Err(status));
        }
        self.granted = false;
        fence(Ordering::Acquire);
        let bytes = self.recv.mem[..wc.byte_len() as usize].to_vec();
        // After a disconnect the post fails; the caller learns of that from the connection events.
        let _ = self.post_recv();
        let m = wire::decode_message(&bytes).unwrap_or_else(|e| panic!("malformed message from the source: {e}"));
        self.error_received |= m.kind == CommandType::Error;
        Some(Ok(Received { kind: m.kind, repeat: m.repeat, bytes }))
    }

    /// SENDs `len` bytes of the send buffer and waits for the completion; the
    /// status of a failed one (the source had no receive posted, the QP is gone).
    fn send_buffer(&mut self, len: usize) -> Result<(), String> {
        let sge = self.send_buf.mr.sge(0, len as u32).expect("sge");
        self.qp.post_send(WRID_SEND, sge, true).map_err(|e| e.to_string())?;
        wc_result(&self.completion(WRID_SEND))
    }

    /// The send-queue completion of `wr_id` (the only work request in flight).
    fn completion(&mut self, wr_id: u64) -> WorkCompletion {
        let wc = next_wc(&self.send_cq, Instant::now() + TIMEOUT).expect("no send completion");
        assert_eq!(wc.wr_id(), wr_id, "{wc:?}");
        wc
    }

    /// Sends a message whose header says `len`, type number `kind` and
    /// `repeat`, whatever the `payload` that follows it.
    fn send_raw(&mut self, len: u32, kind: u32, repeat: u32, payload: &[u8]) -> Result<(), String> {
        let buf = &mut self.send_buf.mem;
        buf[0..4].copy_from_slice(&len.to_be_bytes());
        buf[4..8].copy_from_slice(&kind.to_be_bytes());
        buf[8..12].copy_from_slice(&repeat.to_be_bytes());
        buf[12..16].fill(0);
        buf[CONTROL_HEADER_LEN..CONTROL_HEADER_LEN + payload.len()].copy_from_slice(payload);
        self.send_buffer(CONTROL_HEADER_LEN + payload.len())
    }

    /// A well-formed message of `entries` with the given `repeat`.
    fn send_repeat<E: Entry>(&mut self, kind: CommandType, repeat: u32, entries: &[E]) -> Result<(), String> {
        let payload = encoded(entries);
        self.send_raw(payload.len() as u32, kind.as_u32(), repeat, &payload)
    }

    /// A well-formed message of `entries`: repeat counts them (RAM_BLOCKS_RESULT: 1, as QEMU sends it).
    fn send<E: Entry>(&mut self, kind: CommandType, entries: &[E]) -> Result<(), String> {
        let repeat = if kind == CommandType::RamBlocksResult { 1 } else { entries.len() as u32 };
        self.send_repeat(kind, repeat, entries)
    }

    /// A message without payload (READY, ERROR, END_ACK ...), repeat 1.
    fn send_empty(&mut self, kind: CommandType) -> Result<(), String> {
        self.send_raw(0, kind.as_u32(), 1, &[])
    }

    /// Grants the source one message (READY); the source has a receive posted for it.
    fn grant(&mut self) {
        self.granted = true;
        self.send_empty(CommandType::Ready).expect("SEND of READY");
    }

    /// QEMU's receive: READY, then the message it allows.
    fn next(&mut self) -> Received {
        self.grant();
        match self.take(TIMEOUT) {
            Some(Ok(m)) => m,
            other => panic!("no message from the source after READY: {other:?}"),
        }
    }

    /// Serves the source as a well-behaved destination until it sends a
    /// message of `kind`, which is returned unanswered.
    fn serve_until(&mut self, kind: CommandType) -> Received {
        loop {
            let m = self.next();
            if m.kind == kind {
                return m;
            }
            self.answer(&m);
        }
    }

    /// A well-behaved destination's answer to `m`.
    fn answer(&mut self, m: &Received) {
        let sent = match m.kind {
            CommandType::RamBlocksRequest => {
                let specs = m.entries::<BlockSpec>();
                let want: Vec<(String, u64)> = BLOCKS.iter().map(|&(n, l)| (n.to_string(), l)).collect();
                let got: Vec<(String, u64)> = specs.into_iter().map(|s| (s.name, s.length)).collect();
                assert_eq!(got, want, "the source's block specs");
                let blocks = self.dest_blocks();
                self.send(CommandType::RamBlocksResult, &blocks)
            }
            CommandType::RegisterRequest => {
                let results = self.registrations(m);
                self.send(CommandType::RegisterResult, &results)
            }
            CommandType::UnregisterRequest => {
                let repeat = m.repeat;
                self.send_raw(0, CommandType::UnregisterFinished.as_u32(), repeat, &[])
            }
            CommandType::End => self.send_empty(CommandType::EndAck),
            CommandType::QemuFile | CommandType::Compress | CommandType::RegisterFinished => Ok(()),
            other => panic!("the source sent {other:?} unexpectedly: {m:?}"),
        };
        sent.unwrap_or_else(|e| panic!("answer to {:?}: {e}", m.kind));
    }

    /// The block list a well-behaved destination answers with: each source
    /// block, same length, at its place in this side's RAM.
    fn dest_blocks(&self) -> Vec<DestBlock> {
        let mut at = 0;
        BLOCKS
            .iter()
            .map(|&(_, length)| {
                let block = DestBlock {
                    remote_host_addr: self.ram.ptr() as u64 + at,
                    offset: DEST_BASE + at,
                    length,
                    remote_rkey: 0,
                };
                at += length;
                block
            })
            .collect()
    }

    /// Valid results for a REGISTER_REQUEST: the key of this side's RAM and
    /// each block's base, after checking that each chunk lies in its block.
    fn registrations(&self, m: &Received) -> Vec<RegisterResult> {
        let blocks = self.dest_blocks();
        m.entries::<RegisterRequest>()
            .iter()
            .map(|r| {
                let block = &blocks[r.block_index as usize];
                assert!(r.key >= block.offset && r.key < block.offset + block.length, "{r:?} outside {block:?}");
                RegisterResult { rkey: self.ram_mr.rkey(), host_addr: block.remote_host_addr }
            })
            .collect()
    }

    /// An RDMA WRITE of `len` bytes of the send buffer to `remote_addr`; its completion.
    fn write(&mut self, remote_addr: u64, rkey: u32, len: usize) -> WorkCompletion {
        self.send_buf.mem[..len].fill(0xEE);
        let sge = self.send_buf.mr.sge(0, len as u32).expect("sge");
        self.qp.post_write(WRID_WRITE, sge, remote_addr, rkey, true).expect("post_write");
        self.completion(WRID_WRITE)
    }

    /// One SEND of a RAM_BLOCKS_RESULT of `len` bytes in all, taken from
    /// this side's RAM (it may be more than a control buffer holds).
    fn send_from_ram(&mut self, len: usize) -> Result<(), String> {
        assert!(len <= self.ram.bytes().len());
        let h = ControlHeader { len: (len - CONTROL_HEADER_LEN) as u32, kind: CommandType::RamBlocksResult, repeat: 1 };
        let mut header = [0u8; CONTROL_HEADER_LEN];
        wire::encode_header(&h, &mut header);
        // SAFETY: the mapping is this side's own RAM; nothing else touches it now.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), self.ram.ptr(), header.len()) };
        let sge = self.ram_mr.sge(0, len as u32).expect("sge");
        self.qp.post_send(WRID_SEND, sge, true).map_err(|e| e.to_string())?;
        wc_result(&self.completion(WRID_SEND))
    }

    /// What arrives until the source's disconnect (or `timeout`): the
    /// messages (as their kinds) and failed receives, and whether it disconnected.
    fn until_disconnect(&mut self, timeout: Duration) -> (bool, Vec<String>) {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        let mut disconnected = false;
        while !disconnected && Instant::now() < deadline {
            while let Some(r) = self.take(Duration::ZERO) {
                seen.push(r.map(|m| format!("{:?}", m.kind)).unwrap_or_else(|e| format!("failed receive: {e}")));
            }
            match self.id.channel().get_event(Some(Duration::from_millis(50))).expect("get_event") {
                Some(ev) if ev.kind() == CmEventKind::Disconnected => disconnected = true,
                Some(ev) => eprintln!("destination: connection event {ev:?}"),
                None => {}
            }
        }
        (disconnected, seen)
    }
}

impl Drop for Dest {
    fn drop(&mut self) {
        let _ = self.id.disconnect();
    }
}

// ---------------------------------------------------------------------------
// A case: a source and the crafted destination it connected to

/// What the crafted destination hears once the source has failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hears {
    /// ERROR, then the disconnect: the source had a receive posted for a
    /// READY, so the destination grants one (unless it did already).
    Error,
    /// Only the disconnect: the source has no receive posted for a READY
    /// (it took a message there), its QP is gone, or the peer's ERROR ended it.
    Disconnect,
}

struct Case {
    dest: Dest,
    source: Receiver<Outcome>,
    /// Lets the source past its `Hold`.
    release: mpsc::Sender<()>,
    ram: Arc<Vec<GuestRam>>,
}

/// A source with `config` making `calls`, and the crafted destination that
/// accepted it with `private_data`.
fn start_with(private_data: &[u8], config: Config, calls: &'static [Call]) -> Case {
    let listening = Listening::new();
    let ram = source_ram();
    let (release, hold) = mpsc::channel();
    let source = run_source(listening.port, config, ram.clone(), calls, hold);
    let dest = Dest::accept(&listening, private_data);
    Case { dest, source, release, ram }
}

/// A source making `calls`, and a crafted destination that accepted it as an
/// rdmamig destination does.
fn start(calls: &'static [Call]) -> Case {
    let case = start_with(&accept_data(), config(), calls);
    assert_eq!(case.dest.offered, Capabilities::v1(CAP_RDMAMIG_EXT), "the source's offer");
    case
}

/// A source with a `SHORT_TIMEOUT` making one window, accepted as by an rdmamig destination.
fn start_impatient() -> Case {
    start_with(&accept_data(), Config { timeout: SHORT_TIMEOUT, ..config() }, &[Call::Window])
}

impl Case {
    fn release_source(&self) {
        self.release.send(()).expect("the source is gone");
    }

    /// The checks every case ends with: `call` failed within `BOUND` with
    /// `kind` and a message holding every one of `words`; the destination
    /// heard what `hears` says and nothing else; the source's RAM is intact.
    fn refused(mut self, call: Call, kind: ErrorKind, words: &[&str], hears: Hears) -> Error {
        // Gather what each side saw before asserting, so a failure shows all of it.
        let start = Instant::now();
        let heard = match hears {
            Hears::Error if !self.dest.error_received => {
                if !self.dest.granted {
                    // The source has its READY receive posted: this is the credit for its ERROR.
                    // Best effort: a source that is gone already leaves its failure to show below.
                    self.dest.granted = self.dest.send_empty(CommandType::Ready).is_ok();
                }
                Some(self.dest.take(FAIL_WITHIN))
            }
            _ => None,
        };
        let outcome = self.source.recv_timeout(BOUND);
        let took = start.elapsed();
        let (disconnected, after) = self.dest.until_disconnect(FAIL_WITHIN);
        // Only once the source reported (it is torn down then): a hung one may still read its RAM.
        let ram = if outcome.is_ok() { self.ram_check() } else { Err("not checked: the source still runs".into()) };
        eprintln!("source: {outcome:?}, {took:?} after the hostile act; its RAM: {ram:?}");
        eprintln!("destination: heard {heard:?}; then {after:?}; DISCONNECTED: {disconnected}");
        // What the destination heard first: another message means the source went on.
        match heard {
            None | Some(Some(Ok(Received { kind: CommandType::Error, .. }))) => {}
            Some(other) => panic!("the destination should have received ERROR, got {other:?}"),
        }
        let outcome = outcome.unwrap_or_else(|_| panic!("the source gave no result within {BOUND:?} (hang)"));
        let err = match outcome {
            Outcome::Failed { call: failed, error, took } if failed == call => {
                eprintln!("source: {call:?} failed after {took:?}");
                error
            }
            Outcome::Failed { call: failed, error, .. } => {
                panic!("the source should have failed in {call:?}, it failed in {failed:?}: {error}")
            }
            Outcome::Succeeded(negotiated) => {
                panic!("the source should have failed in {call:?}, every call succeeded (negotiated {negotiated:?})")
            }
        };
        assert_eq!(err.kind, kind, "{err}");
        for w in words {
            assert!(err.message.contains(w), "{w:?} not in: {err}");
        }
        if hears == Hears::Error {
            assert!(self.dest.error_received, "no ERROR from the source");
        }
        let messages: Vec<&String> = after.iter().filter(|s| !s.starts_with("failed receive")).collect();
        assert!(messages.is_empty(), "the source sent {messages:?} after failing");
        assert!(disconnected, "the source did not disconnect");
        ram.unwrap_or_else(|e| panic!("{e}"));
        err
    }

    /// Whether the source's guest RAM still holds `PATTERN` everywhere.
    fn ram_check(&self) -> Result<(), String> {
        for (b, mem) in self.ram.iter().enumerate() {
            if let Some(at) = mem.bytes().iter().position(|&x| x != PATTERN) {
                return Err(format!("source RAM of block {b} was written at {at:#x}: {:#x}", mem.bytes()[at]));
            }
        }
        Ok(())
    }
}

/// A source whose first window is served as a well-behaved destination
/// does until it sends `request`, which `respond` answers (hostile).
fn window_answered(request: CommandType, respond: impl FnOnce(&mut Dest, &Received) -> Result<(), String>) -> Case {
    let mut case = start(&[Call::Window]);
    let m = case.dest.serve_until(request);
    respond(&mut case.dest, &m).expect("SEND of the hostile answer");
    case
}

/// The source's first window meets `kind` (type number, len 0, repeat 1)
/// where it waits for the destination's first READY.
fn unasked_before_ready(kind: u32) -> Case {
    let mut case = start(&[Call::Window]);
    case.dest.send_raw(0, kind, 1, &[]).expect("SEND of the unasked message");
    case
}

// ---------------------------------------------------------------------------
// A QEMU destination's end

/// A QEMU destination disconnects once it has loaded the stream, and may do
/// so before the source closes. A source whose every byte was out (its last
/// flush returned) takes that disconnect as the migration's end: its close
/// returns (unverified, as always toward QEMU), not the disconnect. QEMU 10.2
/// as the destination of a patched QEMU did this in CI.
#[test]
fn qemu_destination_disconnecting_after_the_last_flush_ends_the_migration() {
    let qemu = AcceptData { caps: Capabilities::v1(0), pin_budget: None, auth: None }.encode().to_vec();
    let mut case = start_with(&qemu, config(), &[Call::Flush, Call::Hold, Call::Close]);
    case.dest.serve_until(CommandType::QemuFile);
    case.dest.id.disconnect().expect("disconnect");
    // Let the source learn of the disconnect before it closes.
    thread::sleep(Duration::from_secs(1));
    case.release_source();
    let outcome = case.source.recv_timeout(BOUND).expect("the source gave no result (hang)");
    assert!(matches!(outcome, Outcome::Succeeded(ref n) if !n.extensions), "{outcome:?}");
}

// ---------------------------------------------------------------------------
// Connection: the accept's private data

#[test]
fn accept_with_version_2_or_0_is_refused() {
    for version in [2, 0] {
        eprintln!("version {version}");
        let data = AcceptData { caps: Capabilities { version, flags: CAP_RDMAMIG_EXT }, pin_budget: None, auth: None }
            .encode();
        let case = start_with(&data, config(), &[]);
        let words = format!("version {version}");
        case.refused(Call::Connect, ErrorKind::Version, &[&words], Hears::Disconnect);
    }
}

#[test]
fn accept_with_empty_or_short_private_data_is_refused() {
    // Zero-padded by the kernel: empty reads as version 0, [0, 1] as version 0x10000.
    for (data, words) in [(&[][..], "version 0,"), (&[0, 1][..], "version 65536")] {
        eprintln!("private data {data:?}");
        let case = start_with(data, config(), &[]);
        case.refused(Call::Connect, ErrorKind::Version, &[words], Hears::Disconnect);
    }
}

/// A destination echoes a subset of what was offered (QEMU masks the offer
/// with what it knows); one that grants more does not speak the protocol.
/// The source offered the rdmamig extension only.
fn accept_granting(flags: u32) {
    let data = AcceptData { caps: Capabilities::v1(flags), pin_budget: None, auth: None }.encode();
    let case = start_with(&data, config(), &[]);
    case.refused(Call::Connect, ErrorKind::Protocol, &["not offered"], Hears::Disconnect);
}

/// Every bit but the two known ones.
#[test]
fn accept_with_garbage_flags_is_refused() {
    accept_granting(0x7FFF_FFFE);
}

#[test]
fn accept_granting_pin_all_not_offered_is_refused() {
    accept_granting(CAP_RDMAMIG_EXT | CAP_PIN_ALL);
}

/// The destination announces a pin budget of 4 KiB: no chunk can ever be
/// registered there. The source fails before asking (and tells with ERROR).
#[test]
fn accept_announcing_a_pin_budget_below_a_chunk_is_refused() {
    let data = AcceptData { caps: Capabilities::v1(CAP_RDMAMIG_EXT), pin_budget: Some(4096), auth: None }.encode();
    let mut case = start_with(&data, config(), &[Call::Window]);
    case.dest.serve_until(CommandType::Error);
    case.refused(Call::Window, ErrorKind::PinBudget, &["pin budget of 4096 bytes"], Hears::Error);
}

// ---------------------------------------------------------------------------
// RAM_BLOCKS_RESULT

/// The source's first window gets `blocks` (the well-behaved list, changed
/// by `change`) in answer to its RAM_BLOCKS_REQUEST.
fn blocks_answered(change: impl FnOnce(&mut Vec<DestBlock>)) -> Case {
    window_answered(CommandType::RamBlocksRequest, |d, _| {
        let mut blocks = d.dest_blocks();
        change(&mut blocks);
        d.send(CommandType::RamBlocksResult, &blocks)
    })
}

#[test]
fn ram_blocks_result_with_fewer_blocks_is_refused() {
    let case = blocks_answered(|b| {
        b.pop();
    });
    case.refused(Call::Window, ErrorKind::BlockMismatch, &["2 here, 1 on the destination"], Hears::Error);
}

#[test]
fn ram_blocks_result_with_more_blocks_is_refused() {
    let case = blocks_answered(|b| b.push(DestBlock { offset: DEST_BASE + 8 * MIB, ..b[1] }));
    case.refused(Call::Window, ErrorKind::BlockMismatch, &["2 here, 3 on the destination"], Hears::Error);
}

#[test]
fn ram_blocks_result_with_another_block_length_is_refused() {
    let case = blocks_answered(|b| b[0].length = 8 * MIB);
    case.refused(Call::Window, ErrorKind::BlockMismatch, &["'pc.ram'", "0x400000", "0x800000"], Hears::Error);
}

/// 1 MiB below 2^64: a 4 MiB block placed there wraps the address space.
const NEAR_THE_END: u64 = u64::MAX - MIB + 1;

/// The block's offset (destination RAM space) plus its length passes 2^64:
/// the addresses the source sends for its later chunks would wrap.
#[test]
fn ram_blocks_result_with_a_block_offset_wrapping_is_refused() {
    let case = blocks_answered(|b| b[0].offset = NEAR_THE_END);
    case.refused(Call::Window, ErrorKind::Protocol, &["pc.ram"], Hears::Error);
}

/// The block's host address plus its length passes 2^64: the source's RDMA
/// WRITEs to its later chunks would wrap.
#[test]
fn ram_blocks_result_with_a_block_host_address_wrapping_is_refused() {
    let case = blocks_answered(|b| b[0].remote_host_addr = NEAR_THE_END);
    case.refused(Call::Window, ErrorKind::Protocol, &["pc.ram"], Hears::Error);
}

/// QEMU's RAM_BLOCKS_RESULT has repeat 1; 0 says "no entries" against the
/// payload, and more than 4096 is past the protocol's limit.
#[test]
fn ram_blocks_result_with_repeat_0_4097_or_huge_is_refused() {
    for repeat in [4097, u32::MAX, 0] {
        eprintln!("repeat {repeat}");
        let case = window_answered(CommandType::RamBlocksRequest, |d, _| {
            let blocks = d.dest_blocks();
            d.send_repeat(CommandType::RamBlocksResult, repeat, &blocks)
        });
        case.refused(Call::Window, ErrorKind::Protocol, &["repeat"], Hears::Error);
    }
}

/// 48 bytes: one block and half of another.
#[test]
fn ram_blocks_result_with_a_partial_entry_is_refused() {
    let case = window_answered(CommandType::RamBlocksRequest, |d, _| {
        let payload = encoded(&d.dest_blocks());
        d.send_raw(48, CommandType::RamBlocksResult.as_u32(), 1, &payload[..48])
    });
    case.refused(Call::Window, ErrorKind::Protocol, &["48", "not a multiple of 32"], Hears::Error);
}

/// The header's len claims more than arrived: past the largest payload
/// (524272), or within it but more than the SEND carried.
#[test]
fn ram_blocks_result_with_len_beyond_what_arrived_is_refused() {
    let max = MAX_PAYLOAD as u32;
    for (len, words) in [(max + 1, "exceeds the maximum"), (u32::MAX, "exceeds the maximum"), (max, "malformed length")]
    {
        eprintln!("len {len}");
        let case = window_answered(CommandType::RamBlocksRequest, |d, _| {
            let payload = encoded(&d.dest_blocks());
            d.send_raw(len, CommandType::RamBlocksResult.as_u32(), 1, &payload)
        });
        case.refused(Call::Window, ErrorKind::Protocol, &[&len.to_string(), words], Hears::Error);
    }
}

/// A SEND of 16 + 512 KiB: more than the source's posted receive holds. The
/// receive fails on the source (and its QP with it): a clear error, no hang.
#[test]
fn response_longer_than_the_receive_buffer_fails_the_receive() {
    let mut case = start(&[Call::Window]);
    case.dest.serve_until(CommandType::RamBlocksRequest);
    let sent = case.dest.send_from_ram(CONTROL_HEADER_LEN + CONTROL_BUFFER_SIZE);
    eprintln!("destination: oversized SEND: {sent:?}");
    case.refused(Call::Window, ErrorKind::Verbs, &["control RECV failed"], Hears::Disconnect);
}

// ---------------------------------------------------------------------------
// REGISTER_RESULT

/// The source's first window gets, in answer to its first REGISTER_REQUEST
/// (of several chunks: a whole block), the valid results changed by `change`.
fn registrations_answered(change: impl FnOnce(&mut Vec<RegisterResult>)) -> Case {
    window_answered(CommandType::RegisterRequest, |d, m| {
        assert!(m.repeat >= 2, "a registration batch of several chunks: {m:?}");
        let mut results = d.registrations(m);
        change(&mut results);
        d.send(CommandType::RegisterResult, &results)
    })
}

/// What the source says when the results do not match its request.
const WRONG_RESULT_COUNT: &[&str] = &["asked to register", "chunks, the destination answered"];

#[test]
fn register_result_with_fewer_entries_is_refused() {
    let case = registrations_answered(|r| {
        r.pop();
    });
    case.refused(Call::Window, ErrorKind::Protocol, WRONG_RESULT_COUNT, Hears::Error);
}

#[test]
fn register_result_with_more_entries_is_refused() {
    let case = registrations_answered(|r| r.push(r[0]));
    case.refused(Call::Window, ErrorKind::Protocol, WRONG_RESULT_COUNT, Hears::Error);
}

/// repeat says one entry more than the payload carries.
#[test]
fn register_result_with_len_not_repeat_times_16_is_refused() {
    let case = window_answered(CommandType::RegisterRequest, |d, m| {
        let results = d.registrations(m);
        d.send_repeat(CommandType::RegisterResult, m.repeat + 1, &results)
    });
    case.refused(Call::Window, ErrorKind::Protocol, &["RegisterResult", "is not repeat"], Hears::Error);
}

/// A REGISTER_RESULT to a request never made, where the source waits for its first READY.
#[test]
fn register_result_sent_unasked_is_refused() {
    let mut case = start(&[Call::Window]);
    let result = RegisterResult { rkey: case.dest.ram_mr.rkey(), host_addr: case.dest.ram.ptr() as u64 };
    case.dest.send(CommandType::RegisterResult, &[result]).expect("SEND");
    case.refused(Call::Window, ErrorKind::Protocol, &["expected Ready", "RegisterResult"], Hears::Disconnect);
}

/// The results carry a key this side never registered: the source's RDMA
/// WRITE fails (and both QPs with it); the source reports it, it does not hang.
#[test]
fn register_result_with_a_wrong_rkey_fails_the_write() {
    let case = registrations_answered(|r| r.iter_mut().for_each(|r| r.rkey ^= 0x00AB_CD00));
    case.refused(Call::Window, ErrorKind::Verbs, &["RDMA WRITE", "remote access error"], Hears::Disconnect);
}

// ---------------------------------------------------------------------------
// Messages nobody asked for, unknown types

#[test]
fn unregister_finished_sent_unasked_is_refused() {
    let case = unasked_before_ready(CommandType::UnregisterFinished.as_u32());
    case.refused(Call::Window, ErrorKind::Protocol, &["expected Ready", "UnregisterFinished"], Hears::Disconnect);
}

/// END_ACK in answer to a REGISTER_REQUEST (no END was sent).
#[test]
fn end_ack_sent_unasked_is_refused() {
    let case = window_answered(CommandType::RegisterRequest, |d, _| d.send_empty(CommandType::EndAck));
    case.refused(Call::Window, ErrorKind::Protocol, &["expected RegisterResult", "EndAck"], Hears::Error);
}

/// A block list before the source asked for one.
#[test]
fn ram_blocks_result_sent_unasked_is_refused() {
    let mut case = start(&[Call::Window]);
    let blocks = case.dest.dest_blocks();
    case.dest.send(CommandType::RamBlocksResult, &blocks).expect("SEND");
    case.refused(Call::Window, ErrorKind::Protocol, &["expected Ready", "RamBlocksResult"], Hears::Disconnect);
}

/// Type 12 (the first number past QEMU's commands) and 0x7FFFFFFF, in
/// answer to RAM_BLOCKS_REQUEST.
#[test]
fn unknown_command_type_is_refused() {
    for kind in [12, 0x7FFF_FFFF] {
        eprintln!("type {kind}");
        let case = window_answered(CommandType::RamBlocksRequest, |d, _| d.send_raw(0, kind, 1, &[]));
        let words = format!("unknown control message type {kind}");
        case.refused(Call::Window, ErrorKind::Protocol, &[&words], Hears::Error);
    }
}

/// Type 0 (NONE, "expect anything" inside QEMU, never sent).
#[test]
fn command_type_0_is_refused() {
    let case = unasked_before_ready(CommandType::None.as_u32());
    case.refused(Call::Window, ErrorKind::Protocol, &["type 0"], Hears::Disconnect);
}

/// The source never grants the destination a credit: a message of the
/// destination's own (stream data) lands where the source waits for READY.
/// Sent after a valid registration round, in place of the next READY.
#[test]
fn message_sent_without_a_credit_is_refused() {
    let mut case = window_answered(CommandType::RegisterRequest, |d, m| {
        let results = d.registrations(m);
        d.send(CommandType::RegisterResult, &results)
    });
    case.dest.send_raw(4, CommandType::QemuFile.as_u32(), 0, b"QEVM").expect("SEND");
    case.refused(Call::Window, ErrorKind::Protocol, &["expected Ready", "QemuFile"], Hears::Disconnect);
}

// ---------------------------------------------------------------------------
// ERROR from the destination

#[test]
fn error_before_ram_blocks_is_a_peer_error() {
    let case = unasked_before_ready(CommandType::Error.as_u32());
    case.refused(Call::Window, ErrorKind::PeerError, &["ERROR"], Hears::Disconnect);
}

#[test]
fn error_mid_window_is_a_peer_error() {
    let case = window_answered(CommandType::RegisterRequest, |d, _| d.send_empty(CommandType::Error));
    case.refused(Call::Window, ErrorKind::PeerError, &["ERROR"], Hears::Disconnect);
}

/// A whole valid window, then ERROR in answer to END.
#[test]
fn error_in_answer_to_end_is_a_peer_error() {
    let mut case = start(&[Call::Window, Call::Close]);
    case.dest.serve_until(CommandType::End);
    case.dest.send_empty(CommandType::Error).expect("SEND of ERROR");
    case.refused(Call::Close, ErrorKind::PeerError, &["ERROR"], Hears::Disconnect);
}

// ---------------------------------------------------------------------------
// READY credits

/// Two READYs at once, while the source is held: it has one receive
/// posted, so the second meets none (RNR, retry 0) and kills the
/// destination's own QP. The source's next SEND, released at once (before
/// any liveness probe), goes unanswered: it runs out of retries and fails
/// as a peer that stopped answering, it does not hang.
#[test]
fn second_ready_without_receiving_fails_the_next_send() {
    let mut case = start(&[Call::Hold, Call::Flush]);
    case.dest.grant();
    let second = case.dest.send_empty(CommandType::Ready);
    eprintln!("destination: second READY: {second:?}");
    assert!(second.is_err(), "the second READY found a receive posted");
    case.release_source();
    case.refused(
        Call::Flush,
        ErrorKind::Disconnected,
        &["stopped answering", "control SEND failed"],
        Hears::Disconnect,
    );
}

/// The source's first message waits for a READY that never comes: it times
/// out after `Config::timeout` (the destination's NIC still answers the
/// liveness probes).
#[test]
fn destination_never_sending_ready_times_out() {
    let case = start_impatient();
    case.refused(Call::Window, ErrorKind::Timeout, &["timed out after 2s"], Hears::Disconnect);
}

/// REGISTER_REQUEST taken, never answered: the source times out.
#[test]
fn destination_never_answering_register_times_out() {
    let mut case = start_impatient();
    case.dest.serve_until(CommandType::RegisterRequest);
    case.refused(Call::Window, ErrorKind::Timeout, &["timed out after 2s"], Hears::Disconnect);
}

/// RAM_BLOCKS_REQUEST taken, never answered (no pin-all: the destination has
/// nothing long to do before it answers): the source times out.
#[test]
fn destination_never_answering_ram_blocks_times_out() {
    let mut case = start_impatient();
    case.dest.serve_until(CommandType::RamBlocksRequest);
    case.refused(Call::Window, ErrorKind::Timeout, &["timed out after 2s"], Hears::Disconnect);
}

// ---------------------------------------------------------------------------
// The source's RAM is read-only to the destination

/// A registration in the kernel's RDMA resource table (`rdma -j resource
/// show mr`; keys are shown to root only). The table has no addresses.
#[derive(Debug)]
struct Registration {
    mrn: u64,
    pdn: u64,
    rkey: u32,
    lkey: u32,
    len: u64,
    /// The registering thread's name.
    comm: String,
}

fn registrations() -> Vec<Registration> {
    let out = Command::new("rdma").args(["-j", "resource", "show", "mr"]).output().expect("the rdma tool (iproute2)");
    assert!(out.status.success(), "rdma resource show mr: {}", String::from_utf8_lossy(&out.stderr));
    let table: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("rdma's JSON");
    let key = |v: &serde_json::Value| u32::from_str_radix(v.as_str().expect("a hex key"), 16).expect("a hex key");
    table
        .iter()
        .map(|r| Registration {
            mrn: r["mrn"].as_u64().expect("mrn"),
            pdn: r["pdn"].as_u64().expect("pdn"),
            rkey: key(&r["rkey"]),
            lkey: key(&r["lkey"]),
            len: r["mrlen"].as_u64().expect("mrlen"),
            comm: r["comm"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

/// The source's chunk registrations, oldest first: 1 MiB regions its
/// transfer thread ("rdmamig-source") registered in the newest such PD
/// (older connections' regions may still wait for deregistration).
fn source_chunk_registrations() -> Vec<Registration> {
    let mut chunks: Vec<Registration> =
        registrations().into_iter().filter(|r| r.comm == "rdmamig-source" && r.len == MIB).collect();
    let newest = chunks.iter().map(|r| r.pdn).max();
    chunks.retain(|r| Some(r.pdn) == newest);
    chunks.sort_by_key(|r| r.mrn);
    chunks
}

/// After a valid window the source holds registrations over its 5 RAM
/// chunks; the kernel shows them without a remote key (rkey 0). The
/// destination writes into the first chunk with that region's local key
/// (which rxe would also have made its rkey): the write fails, and the
/// connection with it on both sides, and the RAM stays as it was.
#[test]
fn source_ram_refuses_a_write_with_its_real_rkey() {
    let mut case = start(&[Call::Window, Call::Flush]);
    case.dest.serve_until(CommandType::RegisterFinished);
    let chunks = source_chunk_registrations();
    eprintln!("the source's chunk registrations: {chunks:?}");
    assert_eq!(chunks.len(), BLOCKS.iter().map(|b| b.1 / MIB).sum::<u64>() as usize, "one per chunk");
    assert!(chunks.iter().all(|r| r.rkey == 0), "a chunk registration has a remote key");
    let first = case.ram[0].ptr() as u64;
    let wc = case.dest.write(first, chunks[0].lkey, 4096);
    eprintln!("destination: RDMA WRITE into the source's RAM with key {:#x}: {wc:?}", chunks[0].lkey);
    assert_eq!(wc.status(), WC_REMOTE_ACCESS_ERROR, "{} ({})", wc.status_str(), wc.status());
    case.refused(Call::Flush, ErrorKind::Verbs, &["control RECV failed"], Hears::Disconnect);
}

/// With post-copy recovery on, the source listens for the destination's
/// recovery connection while post-copy runs. A request must prove the
/// token (a tag, here under the token itself: the source has no key): one
/// with the token's tag over another nonce than it carries, one proving
/// another token, and one without any proof are refused at once, before any
/// QP exists for them; the source keeps its connection (it takes only an
/// admitted request as the loss of it) and its post-copy ends normally
/// when the crafted destination answers POSTCOPY_DONE.
#[test]
fn recovery_listener_refuses_requests_without_the_tokens_proof() {
    let listening = Listening::new();
    let ram = source_ram();
    let pages = BLOCKS[0].1 / 4096;
    let postcopy = recovering_source(listening.port, &ram, pages);
    let granted =
        AcceptData { caps: Capabilities::v1(CAP_RDMAMIG_EXT | CAP_RDMAMIG_RECOVERY), pin_budget: None, auth: None };
    let mut dest = Dest::accept(&listening, &granted.encode());
    let offer = dest.serve_until(CommandType::PostcopyRecovery).entries::<PostcopyRecovery>()[0];
    // The fault QP: a made-up endpoint will do (the source only answers reads on it).
    let m = dest.next();
    assert_eq!(m.kind, CommandType::PostcopyFaultQp);
    dest.send(CommandType::PostcopyFaultQpResult, &[QpEndpoint { qpn: 1, psn: 0 }]).expect("fault QP result");
    let m = dest.next();
    assert_eq!(m.kind, CommandType::Postcopy);
    assert_eq!(m.entries::<PostcopyBlock>()[0].stale_pages, pages);

    // The source now waits for POSTCOPY_DONE and polls its recovery listener.
    let mut wrong = offer.token;
    wrong[0] ^= 1;
    let resume = |nonce: [u8; 32], tag: Option<[u8; 16]>| {
        let flags = CAP_RDMAMIG_EXT | if tag.is_some() { CAP_RDMAMIG_RESUME } else { 0 };
        ConnectData { caps: Capabilities::v1(flags), nonce: tag.map(|_| nonce), recovery_tag: tag }.encode()
    };
    let requests = [
        ("the token's tag over another nonce", resume([2; 32], Some(recovery_tag(&offer.token, &[1; 32])))),
        ("another token's tag", resume([1; 32], Some(recovery_tag(&wrong, &[1; 32])))),
        ("no proof", resume([1; 32], None)),
    ];
    for (what, private) in requests {
        let started = Instant::now();
        match CraftedSource::connect(offer.port, &private) {
            Ok(_) => panic!("a recovery request with {what} was accepted"),
            Err(refusal) => {
                assert_eq!(refusal.kind, CmEventKind::Rejected, "a recovery request with {what}");
                assert!(started.elapsed() < FAIL_WITHIN, "refused only after {:?}", started.elapsed());
                eprintln!("recovery request with {what}: rejected after {:?}", started.elapsed());
            }
        }
    }
    thread::sleep(Duration::from_millis(500));
    assert!(postcopy.try_recv().is_err(), "the source's post-copy ended before POSTCOPY_DONE");
    let summary = PostcopySummary { pages, faults: 0, bytes: pages * 4096 };
    dest.send(CommandType::PostcopyDone, &[summary]).expect("POSTCOPY_DONE");
    let got = postcopy.recv_timeout(BOUND).expect("the source's post-copy still waits");
    assert_eq!(got.expect("post-copy over the first connection"), summary);
    eprintln!(
        "recovery listener on port {}: refused every request without the token's proof; post-copy ended over its \
         connection",
        offer.port
    );
}

/// A recovery request's tag as docs/security.md describes it, computed here
/// independently of the library, for a source without a key: HMAC-SHA-256
/// under the token of a label, the token, the request's nonce and the
/// address it comes from, truncated to 16 bytes.
pub(crate) fn recovery_tag(token: &[u8; RECOVERY_TOKEN_LEN], nonce: &[u8; 32]) -> [u8; 16] {
    recovery_tag_from(rdma_ip().parse().unwrap(), token, nonce)
}

/// As `recovery_tag`, for a request from `ip`.
pub(crate) fn recovery_tag_from(
    ip: std::net::Ipv4Addr,
    token: &[u8; RECOVERY_TOKEN_LEN],
    nonce: &[u8; 32],
) -> [u8; 16] {
    let mut mac = Hmac::<Sha256>::new_from_slice(token).unwrap();
    for part in [&b"rdmamig v2: recovery request\0"[..], token, nonce, &[4], &ip.octets(), &[0], &[0, 0]] {
        mac.update(part);
    }
    mac.finalize().into_bytes()[..16].try_into().unwrap()
}

/// A source with post-copy recovery on, in a thread: it connects to `port`,
/// sends one window, then post-copy with every page of the first block stale;
/// its `postcopy` result comes through the channel.
fn recovering_source(port: u16, ram: &Arc<Vec<GuestRam>>, pages: u64) -> Receiver<rdmamig::Result<PostcopySummary>> {
    let (tx, postcopy) = mpsc::channel();
    let ram = ram.clone();
    let config = Config { postcopy_recovery: Some(Duration::from_secs(5)), ..config() };
    thread::spawn(move || {
        let mut registry = RamBlocks::new();
        for ((&(name, len), mem), offset) in BLOCKS.iter().zip(ram.iter()).zip(SOURCE_OFFSETS) {
            // SAFETY: the mapping outlives the source (this thread holds it).
            unsafe { registry.add(name, mem.ptr(), offset, len).expect("add block") };
        }
        let mut source = Source::connect(&rdma_ip(), port, &config, &registry).expect("connect");
        window(&mut source).expect("window");
        let bitmap = vec![!0u64; (pages / 64) as usize];
        let _ = tx.send(source.postcopy(&[StalePages { block: 0, bitmap }]));
        drop(source);
    });
    postcopy
}

/// A source with post-copy recovery on whose destination does not grant it
/// (recovery off there, or an rdmamig before 0.11): the source sends no
/// POSTCOPY_RECOVERY, which that destination would refuse, and its
/// post-copy runs without recovery.
#[test]
fn recovery_not_granted_is_not_offered() {
    let listening = Listening::new();
    let ram = source_ram();
    let pages = BLOCKS[0].1 / 4096;
    let postcopy = recovering_source(listening.port, &ram, pages);
    let mut dest = Dest::accept(&listening, &accept_data());
    let m = loop {
        let m = dest.next();
        if matches!(m.kind, CommandType::PostcopyFaultQp | CommandType::PostcopyRecovery) {
            break m;
        }
        dest.answer(&m);
    };
    assert_eq!(m.kind, CommandType::PostcopyFaultQp, "the source offered recovery that was not granted");
    dest.send(CommandType::PostcopyFaultQpResult, &[QpEndpoint { qpn: 1, psn: 0 }]).expect("fault QP result");
    assert_eq!(dest.next().kind, CommandType::Postcopy);
    let summary = PostcopySummary { pages, faults: 0, bytes: pages * 4096 };
    dest.send(CommandType::PostcopyDone, &[summary]).expect("POSTCOPY_DONE");
    let got = postcopy.recv_timeout(BOUND).expect("the source's post-copy still waits");
    assert_eq!(got.expect("post-copy without recovery"), summary);
}
