//! A crafted source: a test peer built only from the public `rdmamig::verbs`
//! and `rdmamig::wire` APIs, connected to a real `Destination`. It follows the
//! READY credit protocol exactly as QEMU does (the READY receive posted before
//! connecting; take the destination's READY, post the next receive, then SEND
//! one message), and sends messages a well-behaved source never sends. Each
//! case checks what the destination reports (`wait_end`) and what the peer
//! receives back (ERROR, then the disconnect), and that RAM outside what was
//! legitimately asked for stays as it was (0xAA).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::verbs::{
    Access, CmEvent, CmEventKind, CmId, CompletionChannel, CompletionQueue, ConnParam, EventChannel, MemoryRegion,
    ProtectionDomain, QpCaps, QueuePair, WorkCompletion,
};
use rdmamig::wire::{
    self, Capabilities, CommandType, Compress, DestBlock, Entry, MessageWriter, RegisterRequest, RegisterResult,
    CAP_RDMAMIG_EXT, CONTROL_BUFFER_SIZE,
};
use rdmamig::{Config, Destination, Error, ErrorKind};

use crate::migration::{listen, rdma_ip, read_stream, GuestRam, Layout};

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;
/// The destination's only block: 4 MiB of 0xAA.
const RAM: u64 = 4 * MIB;
/// The block's offset in the destination's RAM address space (not 0, so a
/// missing translation would show).
const BASE: u64 = 64 * MIB;
const GARBAGE: u8 = 0xAA;
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long the destination gets to fail and tell the peer.
const FAIL_WITHIN: Duration = Duration::from_secs(5);

/// Work-request ids (local only), as QEMU numbers them.
const WRID_WRITE: u64 = 1;
const WRID_SEND: u64 = 2000;
const WRID_RECV: u64 = 4000;
/// Receive buffers: at most two receives are ever outstanding (a response and
/// the next READY); a third spare keeps the bookkeeping simple.
const RECV_BUFFERS: usize = 3;

/// A registered 512 KiB control buffer; `mr` is declared first so it is
/// deregistered before the memory is freed.
struct ControlBuffer {
    mr: MemoryRegion,
    mem: Box<[u8]>,
}

impl ControlBuffer {
    fn new(pd: &Arc<ProtectionDomain>) -> ControlBuffer {
        let mut mem = vec![0u8; CONTROL_BUFFER_SIZE].into_boxed_slice();
        // SAFETY: the boxed memory moves into the same struct and outlives `mr` (field order).
        let mr = unsafe { pd.register(mem.as_mut_ptr(), mem.len(), Access::LOCAL_WRITE) }.expect("register buffer");
        ControlBuffer { mr, mem }
    }
}

/// A message the destination sent, validated by `wire::decode_message`.
#[derive(Debug)]
struct Received {
    kind: CommandType,
    repeat: u32,
    bytes: Vec<u8>,
}

impl Received {
    fn entries<E: Entry>(&self) -> Vec<E> {
        let m = wire::decode_message(&self.bytes).expect("validated when received");
        m.collect_entries().unwrap_or_else(|e| panic!("{:?} entries: {e}", self.kind))
    }
}

fn next_event(ch: &EventChannel, want: CmEventKind, deadline: Instant) -> CmEvent {
    let left = deadline.saturating_duration_since(Instant::now());
    let ev = ch.get_event(Some(left)).expect("get_event").unwrap_or_else(|| panic!("timed out waiting for {want:?}"));
    assert_eq!(ev.kind(), want, "unexpected event {ev:?}");
    ev
}

/// The next completion on `cq`, or None at `deadline`.
fn next_wc(cq: &CompletionQueue, deadline: Instant) -> Option<WorkCompletion> {
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if cq.poll(&mut wc).expect("poll") == 1 {
            return Some(wc[0]);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        cq.wait(left.min(Duration::from_millis(100))).expect("wait");
    }
}

/// The test peer: one RC connection to a destination, with QEMU's queue sizes
/// and control buffers.
struct Peer {
    qp: Arc<QueuePair>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
    recv: Vec<ControlBuffer>,
    send_buf: ControlBuffer,
    /// Receive buffers posted, in posting order (receives complete in that order).
    posted: VecDeque<usize>,
    /// The destination's private data in its accept.
    reply: Capabilities,
    id: Arc<CmId>,
}

impl Peer {
    /// Connects to the destination on `port`, offering `flags`, as QEMU's source does.
    fn connect(port: u16, flags: u32) -> Peer {
        let deadline = Instant::now() + TIMEOUT;
        let ip: IpAddr = rdma_ip().parse().expect("RXE_VM_IP");
        let ch = EventChannel::new().expect("event channel");
        let id = CmId::new(&ch).expect("cm id");
        id.resolve_addr(&SocketAddr::new(ip, port), 5000).expect("resolve_addr");
        next_event(&ch, CmEventKind::AddrResolved, deadline);
        id.resolve_route(5000).expect("resolve_route");
        next_event(&ch, CmEventKind::RouteResolved, deadline);
        let pd = ProtectionDomain::new(&id).expect("pd");
        let send_cq = CompletionQueue::new(&id, 64, &CompletionChannel::new(&id).expect("channel")).expect("send cq");
        let recv_cq = CompletionQueue::new(&id, 16, &CompletionChannel::new(&id).expect("channel")).expect("recv cq");
        let caps = QpCaps { max_send_wr: 16, max_recv_wr: 3, max_send_sge: 1, max_recv_sge: 1 };
        let qp = QueuePair::new(&id, &pd, &send_cq, &recv_cq, caps).expect("qp");
        let recv = (0..RECV_BUFFERS).map(|_| ControlBuffer::new(&pd)).collect();
        let send_buf = ControlBuffer::new(&pd);
        let mut peer =
            Peer { qp, send_cq, recv_cq, pd, recv, send_buf, posted: VecDeque::new(), reply: Capabilities::v1(0), id };
        // The READY receive goes up before connecting: the destination sends READY at once.
        peer.post_recv();
        let private = Capabilities::v1(flags).encode();
        // QEMU's parameters: rnr_retry 0, so a SEND without a posted receive kills the QP.
        let param = ConnParam {
            private_data: &private,
            responder_resources: 0,
            initiator_depth: 2,
            retry_count: 5,
            rnr_retry_count: 0,
        };
        peer.id.connect(&param).expect("connect");
        let ev = next_event(&ch, CmEventKind::Established, deadline);
        peer.reply = Capabilities::decode(ev.private_data()).expect("accept private data");
        peer
    }

    fn post_recv(&mut self) {
        let i = (0..RECV_BUFFERS).find(|i| !self.posted.contains(i)).expect("a free receive buffer");
        let sge = self.recv[i].mr.sge(0, CONTROL_BUFFER_SIZE as u32).unwrap();
        // SAFETY: the buffer is registered and lives as long as the QP (both in `self`).
        unsafe { self.qp.post_recv(WRID_RECV + i as u64, sge) }.expect("post_recv");
        self.posted.push_back(i);
    }

    /// The next message from the destination; `Some(Err(status))` for a failed
    /// (e.g. flushed) receive, `None` if nothing arrived within `timeout`.
    fn recv_any(&mut self, timeout: Duration) -> Option<Result<Received, String>> {
        let wc = next_wc(&self.recv_cq, Instant::now() + timeout)?;
        let i = self.posted.pop_front().expect("a receive completed that was never posted");
        assert_eq!(wc.wr_id(), WRID_RECV + i as u64, "receives complete in posting order");
        if !wc.is_success() {
            return Some(Err(format!("{} ({})", wc.status_str(), wc.status())));
        }
        fence(Ordering::Acquire);
        let bytes = self.recv[i].mem[..wc.byte_len() as usize].to_vec();
        let (kind, repeat) = match wire::decode_message(&bytes) {
            Ok(m) => (m.kind, m.repeat),
            Err(e) => panic!("malformed message from the destination: {e}"),
        };
        Some(Ok(Received { kind, repeat, bytes }))
    }

    /// The next message, which must be of type `kind`.
    fn expect(&mut self, kind: CommandType) -> Received {
        match self.recv_any(TIMEOUT) {
            Some(Ok(m)) if m.kind == kind => m,
            other => panic!("expected {kind:?} from the destination, got {other:?}"),
        }
    }

    /// Takes the destination's READY (the credit for one message).
    fn take_ready(&mut self) {
        let m = self.expect(CommandType::Ready);
        assert_eq!((m.repeat, m.bytes.len()), (1, 16), "READY is {{len 0, repeat 1}}");
    }

    /// Sends one message (the caller took a READY): first a receive for each
    /// expected response, then the receive for the next READY (or an ERROR),
    /// then the SEND, waiting for its completion.
    fn send_with(&mut self, kind: CommandType, responses: usize, build: impl FnOnce(&mut MessageWriter)) {
        for _ in 0..responses {
            self.post_recv();
        }
        self.post_recv();
        let mut writer = MessageWriter::new(&mut self.send_buf.mem, kind);
        build(&mut writer);
        let len = writer.finish();
        let sge = self.send_buf.mr.sge(0, len as u32).unwrap();
        // SAFETY: registered buffer, untouched until the completion below.
        unsafe { self.qp.post_send(WRID_SEND, sge, true) }.expect("post_send");
        let wc = next_wc(&self.send_cq, Instant::now() + TIMEOUT).expect("no send completion");
        assert!(wc.is_success() && wc.wr_id() == WRID_SEND, "SEND of {kind:?}: {wc:?}");
    }

    /// A message with `entries` and no response (COMPRESS, ...).
    fn send<E: Entry>(&mut self, kind: CommandType, entries: &[E]) {
        self.send_with(kind, 0, |w| entries.iter().for_each(|e| w.push(e).expect("push")));
    }

    /// A request with `entries`; returns what lands in the response receive.
    fn request<E: Entry>(&mut self, kind: CommandType, entries: &[E]) -> Result<Received, String> {
        self.send_with(kind, 1, |w| entries.iter().for_each(|e| w.push(e).expect("push")));
        self.recv_any(TIMEOUT).expect("no response")
    }

    /// A QEMU_FILE message carrying `data`.
    fn send_file(&mut self, data: &[u8]) {
        self.send_with(CommandType::QemuFile, 0, |w| w.push_bytes(data).expect("push_bytes"));
    }

    /// QEMU's first window: RAM_BLOCKS_REQUEST (empty) → RAM_BLOCKS_RESULT.
    /// Takes the READY for it; returns the destination's only block.
    fn ram_blocks(&mut self) -> DestBlock {
        self.take_ready();
        self.send_with(CommandType::RamBlocksRequest, 1, |_| {});
        let blocks = self.expect(CommandType::RamBlocksResult).entries::<DestBlock>();
        assert_eq!(blocks.len(), 1, "{blocks:?}");
        assert_eq!((blocks[0].offset, blocks[0].length, blocks[0].remote_rkey), (BASE, RAM, 0), "{blocks:?}");
        blocks[0]
    }

    /// An RDMA WRITE of `data` to the destination; returns its completion.
    fn write(&mut self, remote_addr: u64, rkey: u32, data: &[u8]) -> WorkCompletion {
        let mut mem = data.to_vec();
        // SAFETY: `mem` outlives `mr` (dropped below, after the completion).
        let mr = unsafe { self.pd.register(mem.as_mut_ptr(), mem.len(), Access::LOCAL_WRITE) }.expect("register");
        let sge = mr.sge(0, mem.len() as u32).unwrap();
        // SAFETY: as above; the write completes (or fails) before `mr` drops.
        unsafe { self.qp.post_write(WRID_WRITE, sge, remote_addr, rkey, true) }.expect("post_write");
        let wc = next_wc(&self.send_cq, Instant::now() + TIMEOUT).expect("no write completion");
        assert_eq!(wc.wr_id(), WRID_WRITE);
        drop(mr);
        wc
    }

    /// Whether the destination disconnected within `timeout`.
    fn disconnected(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.id.channel().get_event(Some(left)).expect("get_event") {
                Some(ev) if ev.kind() == CmEventKind::Disconnected => return true,
                Some(ev) => eprintln!("peer: connection event {ev:?}"),
                None => return false,
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.id.disconnect();
    }
}

/// A destination over one 4 MiB block of 0xAA at `BASE`, and a peer connected
/// to it. Fields drop in order: the destination first, the RAM last.
struct Session {
    dest: Destination,
    peer: Peer,
    ram: Vec<GuestRam>,
}

fn start(config: Config, flags: u32) -> Session {
    let layout = Layout { blocks: vec![("pc.ram", RAM, vec![])] };
    let ram = layout.dest_ram();
    let registry = layout.registry(&ram, BASE);
    let (listener, port) = listen(&config);
    let accept = thread::spawn(move || Destination::accept(&listener, &registry, Some(TIMEOUT)).expect("accept"));
    let peer = Peer::connect(port, flags);
    let dest = accept.join().expect("accept thread");
    Session { dest, peer, ram }
}

impl Session {
    /// The peer's last message was refused: the peer receives ERROR (in the
    /// receive it posted before sending), then the disconnect, and the
    /// destination ends with a Protocol error whose message has every `word`.
    fn rejected(&mut self, words: &[&str]) -> Error {
        // Gather what each side saw before asserting, so a failure shows all of it.
        // The destination sends ERROR before it ends, so the ERROR is there by then.
        let t = Instant::now();
        let end = self.dest.wait_end(Some(FAIL_WITHIN));
        let ended_at = t.elapsed();
        let got = self.peer.recv_any(Duration::from_secs(1));
        let disconnected = self.peer.disconnected(FAIL_WITHIN);
        eprintln!("destination: {end:?}, ended {ended_at:?} after the peer's message");
        eprintln!("peer: received {got:?}; DISCONNECTED: {disconnected}");
        match &got {
            Some(Ok(m)) if m.kind == CommandType::Error => assert_eq!(m.bytes.len(), 16, "ERROR has no payload"),
            other => panic!("the peer should have received ERROR, got {other:?}"),
        }
        let err = end.expect_err("the destination must fail");
        assert_eq!(err.kind, ErrorKind::Protocol, "{err}");
        for w in words {
            assert!(err.message.contains(w), "{w:?} not in: {err}");
        }
        assert!(disconnected, "no DISCONNECTED after the ERROR");
        err
    }

    /// Checks the destination's RAM: zero in `zeroed`, `written` where
    /// written, 0xAA everywhere else. Only once the destination has ended.
    fn check_ram(&self, zeroed: &[(u64, u64)], written: Option<(u64, &[u8])>) {
        let bytes = self.ram[0].bytes();
        for (off, &b) in bytes.iter().enumerate() {
            let off = off as u64;
            let want = if let Some(at) = written.filter(|(at, d)| off >= *at && off < at + d.len() as u64) {
                at.1[(off - at.0) as usize]
            } else if zeroed.iter().any(|&(z, len)| off >= z && off < z + len) {
                0
            } else {
                GARBAGE
            };
            assert_eq!(b, want, "destination RAM byte {off:#x}");
        }
    }
}

fn zero(offset: u64, length: u64) -> Compress {
    Compress { value: 0, block_index: 0, offset, length }
}

/// QEMU-compatible destination (the peer offers no rdmamig extension):
/// COMPRESS with two ranges is refused before any memory is touched.
#[test]
fn qemu_mode_compress_with_two_ranges_is_refused() {
    let mut s = start(Config::default(), 0);
    assert_eq!(s.peer.reply, Capabilities::v1(0));
    assert!(!s.dest.negotiated().extensions);
    s.peer.ram_blocks();
    s.peer.take_ready();
    s.peer.send(CommandType::Compress, &[zero(BASE, 4 * KIB), zero(BASE + MIB, 4 * KIB)]);
    s.rejected(&["COMPRESS", "2 ranges"]);
    assert_eq!(s.dest.stats().zero_chunks, 0);
    s.check_ram(&[], None);
}

/// QEMU-compatible destination (extensions off; it masks the peer's offer):
/// a valid one-chunk COMPRESS is applied, one that crosses a 1 MiB chunk or
/// is longer than 1 MiB is refused.
#[test]
fn qemu_mode_compress_across_a_chunk_or_over_1_mib_is_refused() {
    let config = Config { extensions: false, ..Config::default() };
    let control = (3 * MIB, 64 * KIB);
    for bad in [zero(BASE + MIB / 2, MIB), zero(BASE + MIB, 2 * MIB), zero(BASE + MIB, MIB + 1)] {
        eprintln!("COMPRESS {:#x}+{:#x}", bad.offset, bad.length);
        let mut s = start(config.clone(), CAP_RDMAMIG_EXT);
        assert_eq!(s.peer.reply, Capabilities::v1(0), "the destination must clear the extension bit");
        assert!(!s.dest.negotiated().extensions);
        s.peer.ram_blocks();
        s.peer.take_ready();
        s.peer.send(CommandType::Compress, &[zero(BASE + control.0, control.1)]);
        // The next READY comes after the range was applied.
        s.peer.take_ready();
        s.peer.send(CommandType::Compress, &[bad]);
        s.rejected(&["COMPRESS", "not inside one 1 MiB chunk"]);
        assert_eq!(s.dest.stats().zero_chunks, 1);
        s.check_ram(&[control], None);
    }
}

/// Between rdmamig peers COMPRESS may carry many ranges, but at most 256 MiB
/// in all; more is refused before any range is applied, even when every
/// range lies inside the block.
#[test]
fn extension_compress_over_256_mib_is_refused_before_touching_ram() {
    let controls = [(0, 64 * KIB), (2 * MIB, 64 * KIB)];
    // One valid range, then one claiming 256 MiB (the sum crosses the limit).
    let huge = vec![zero(BASE + MIB, 4 * KIB), zero(BASE, 256 * MIB)];
    // 4096 ranges of 64 KiB + 1, each inside the block: 256 MiB + 4096 bytes.
    let many: Vec<Compress> = (0..4096).map(|i| zero(BASE + (i * 4 * KIB) % (3 * MIB), 64 * KIB + 1)).collect();
    for (name, bad) in [("one huge range", huge), ("4096 ranges", many)] {
        eprintln!("{name}");
        let mut s = start(Config::default(), CAP_RDMAMIG_EXT);
        assert_eq!(s.peer.reply, Capabilities::v1(CAP_RDMAMIG_EXT));
        assert!(s.dest.negotiated().extensions);
        s.peer.ram_blocks();
        s.peer.take_ready();
        let ok: Vec<Compress> = controls.iter().map(|&(o, l)| zero(BASE + o, l)).collect();
        s.peer.send(CommandType::Compress, &ok);
        s.peer.take_ready();
        s.peer.send(CommandType::Compress, &bad);
        s.rejected(&["COMPRESS", "more than 0x10000000 bytes"]);
        assert_eq!(s.dest.stats().zero_chunks, 2, "only the valid message's ranges");
        s.check_ram(&controls, None);
    }
}

/// A registration that overlaps an earlier one in part is refused; repeating
/// an identical request returns the same key, which stays usable.
#[test]
fn partially_overlapping_registration_is_refused_and_keys_are_never_replaced() {
    let mut s = start(Config::default(), 0);
    let block = s.peer.ram_blocks();
    let chunk1 = RegisterRequest { key: BASE + MIB, block_index: 0, chunks: 0 };
    let mut keys = Vec::new();
    for _ in 0..2 {
        s.peer.take_ready();
        let m = s.peer.request(CommandType::RegisterRequest, &[chunk1]).expect("REGISTER_RESULT");
        assert_eq!((m.kind, m.repeat), (CommandType::RegisterResult, 1), "{m:?}");
        let r = m.entries::<RegisterResult>();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].host_addr, block.remote_host_addr, "the block base");
        keys.push(r[0].rkey);
    }
    eprintln!("rkeys for chunk 1: {keys:#x?}");
    assert_eq!(keys[0], keys[1], "a repeated registration must return the same key");
    // The key still works: write a pattern into chunk 1 with it.
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
    let at = MIB + 0x100;
    let wc = s.peer.write(block.remote_host_addr + at, keys[0], &pattern);
    assert!(wc.is_success(), "RDMA WRITE with the returned key: {wc:?}");
    // Chunks 0..=1 overlap the registration of chunk 1 in part.
    s.peer.take_ready();
    let overlap = RegisterRequest { key: BASE, block_index: 0, chunks: 1 };
    s.peer.send_with(CommandType::RegisterRequest, 1, |w| w.push(&overlap).expect("push"));
    s.rejected(&["overlaps"]);
    let stats = s.dest.stats();
    assert_eq!((stats.chunks_registered, stats.registration_round_trips), (1, 2), "{stats:?}");
    s.check_ram(&[], Some((at, &pattern)));
}

/// The hypervisor aborts the destination while it waits for the peer's next
/// message (it granted a READY the peer holds): the peer's next message, sent
/// within a second, is answered with ERROR.
#[test]
fn destination_abort_reaches_the_peer_as_error_after_its_next_message() {
    let mut s = start(Config::default(), 0);
    s.peer.take_ready();
    s.peer.send_file(b"first");
    // The destination has granted the next READY: the peer holds the credit
    // and has no receive posted.
    s.peer.take_ready();
    assert!(s.peer.posted.is_empty());
    s.dest.abort();
    // Let the service thread notice the abort (it looks every 100 ms).
    thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    s.peer.send_file(b"second");
    match s.peer.recv_any(FAIL_WITHIN) {
        Some(Ok(m)) if m.kind == CommandType::Error => {}
        other => panic!("the peer should have received ERROR, got {other:?}"),
    }
    eprintln!("peer: ERROR {:?} after its message", sent.elapsed());
    let err = s.dest.wait_end(Some(FAIL_WITHIN)).expect_err("the destination must end with a failure");
    assert_eq!(err.kind, ErrorKind::Aborted, "{err}");
    eprintln!("destination: {err}");
    assert!(s.peer.disconnected(FAIL_WITHIN), "no DISCONNECTED after the ERROR");
    // What arrived before the abort is still readable.
    assert_eq!(read_stream(&s.dest, 5), b"first");
    s.check_ram(&[], None);
}
