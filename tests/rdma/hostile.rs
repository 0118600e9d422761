//! A crafted source: a test peer built only from the public `rdmamig::verbs`
//! and `rdmamig::wire` APIs, connected to a real `Destination`. It follows the
//! READY credit protocol exactly as QEMU does (the READY receive posted before
//! connecting; take the destination's READY, post the next receive, then SEND
//! one message), and sends messages a well-behaved source never sends, some
//! built byte by byte. Each case checks what the destination reports
//! (`wait_end`, within a bound), what the peer receives back (ERROR where the
//! link can still carry it, then the disconnect), and the destination's RAM:
//! each of its two blocks sits in its own mapping between canaries of 0x5C
//! that nothing may touch, and inside a block nothing but what the case
//! legitimately asked for may differ from the initial 0xAA. The session's
//! ending helpers check all of it, so no case can skip it.
//!
//! Cases (destination side):
//! * `qemu_mode_compress_with_two_ranges_is_refused`: COMPRESS with two ranges toward a QEMU-compatible destination
//! * `qemu_mode_compress_across_a_chunk_or_over_1_mib_is_refused`: a COMPRESS range crossing a chunk, or over 1 MiB
//! * `extension_compress_over_256_mib_is_refused_before_touching_ram`: rdmamig COMPRESS asking for > 256 MiB
//! * `partially_overlapping_registration_is_refused_and_keys_are_never_replaced`: REGISTER overlapping another in part
//! * `destination_abort_reaches_the_peer_as_error_after_its_next_message`: hypervisor abort while the peer holds READY
//! * `len_past_the_payload_room_is_refused`: header len 524273 (full buffer) and 0xFFFFFFFF (header only)
//! * `register_len_not_a_multiple_of_the_entry_size_is_refused`: REGISTER_REQUEST with len 25
//! * `register_len_short_of_repeat_entries_is_refused`: REGISTER_REQUEST with repeat 2 and len 24
//! * `send_longer_than_16_plus_len_is_refused`: a SEND of 116 bytes whose header says len 10
//! * `send_shorter_than_16_plus_len_is_refused`: a SEND of 66 bytes whose header says len 100
//! * `send_shorter_than_a_header_is_refused`: SENDs of 0 and 15 bytes
//! * `send_larger_than_the_receive_buffer_breaks_the_link_cleanly`: a SEND of 512 KiB + 4 KiB
//! * `register_with_repeat_0_is_refused`: REGISTER_REQUEST with one entry and repeat 0
//! * `compress_with_repeat_0_is_refused`: COMPRESS with one entry and repeat 0
//! * `unregister_with_repeat_0_is_refused`: UNREGISTER_REQUEST with one entry and repeat 0
//! * `repeat_4097_is_refused`: REGISTER_REQUEST with 4097 entries
//! * `repeat_0xffffffff_is_refused`: REGISTER_REQUEST with repeat 0xFFFFFFFF
//! * `repeat_times_entry_size_wrapping_u32_is_refused`: repeat 0x0AAAAAAB, whose × 24 wraps to len 8
//! * `unknown_command_types_are_refused`: types 12, 0x7FFFFFFF and 0x80000004
//! * `type_0_none_is_refused`: type 0 (NONE)
//! * `auth_toward_a_destination_without_a_key_is_refused`: AUTH where no authentication was negotiated
//! * `ready_from_the_source_is_refused`: READY sent by the source
//! * `error_from_the_source_ends_without_an_error_back`: ERROR sent by the source
//! * `register_result_sent_to_the_destination_is_refused`: REGISTER_RESULT sent by the source
//! * `ram_blocks_result_sent_to_the_destination_is_refused`: RAM_BLOCKS_RESULT sent by the source
//! * `unregister_finished_sent_to_the_destination_is_refused`: UNREGISTER_FINISHED sent by the source
//! * `end_ack_sent_to_the_destination_is_refused`: END_ACK sent by the source
//! * `end_in_qemu_compatible_mode_is_refused`: END toward a destination with extensions off
//! * `end_with_a_window_open_is_refused`: END after a REGISTER and no REGISTER_FINISHED
//! * `end_with_wrong_counts_is_refused`: END counting more windows than were closed
//! * `register_before_the_ram_blocks_request_is_served_in_local_block_order`: REGISTER first (accepted, as QEMU does)
//! * `second_ram_blocks_request_is_refused`: a second RAM_BLOCKS_REQUEST, with the blocks swapped
//! * `send_without_waiting_for_ready_breaks_the_link_cleanly`: two SENDs back to back on one READY
//! * `source_that_posts_no_receive_for_a_response_breaks_the_link_cleanly`: REGISTER with no receive posted
//! * `register_block_index_out_of_range_is_refused`: REGISTER of block 2 (of 2)
//! * `compress_block_index_out_of_range_is_refused`: COMPRESS of block 0xFFFFFFFF
//! * `unregister_block_index_out_of_range_is_refused`: UNREGISTER of block 2
//! * `register_range_ending_past_its_block_is_refused`: REGISTER of the last chunk and one more
//! * `register_at_an_address_near_u64_max_is_refused`: REGISTER at 0xFFFFFFFFFFFFF000
//! * `register_with_a_chunk_count_that_overflows_is_refused`: REGISTER of u64::MAX more chunks
//! * `register_with_another_blocks_address_is_refused`: REGISTER naming block 0 at an address of block 1
//! * `compress_range_ending_past_its_block_is_refused`: COMPRESS of the last 4 KiB of a block and 4 KiB more
//! * `compress_range_wrapping_around_u64_is_refused`: COMPRESS at 0xFFFFFFFFFFFFF000 of 8 KiB
//! * `compress_with_another_blocks_address_is_refused`: COMPRESS naming block 1 at an address of block 0
//! * `compress_with_a_bad_range_after_good_ones_is_refused`: rdmamig COMPRESS whose second range leaves its block
//! * `compress_with_a_nonzero_value_is_refused`: COMPRESS with value 0xAB
//! * `unregister_of_a_chunk_never_registered_is_refused`: UNREGISTER of a chunk that holds no registration
//! * `unregister_of_a_chunk_past_its_block_is_refused`: UNREGISTER of chunk 3 of a 3-chunk block
//! * `block_list_with_fewer_blocks_is_refused`: RAM_BLOCKS_REQUEST naming one of the two blocks
//! * `block_list_with_more_blocks_is_refused`: RAM_BLOCKS_REQUEST naming a third block
//! * `block_list_with_a_wrong_length_is_refused`: RAM_BLOCKS_REQUEST with a block of another length
//! * `block_list_with_an_unknown_name_is_refused`: RAM_BLOCKS_REQUEST with a name the destination lacks
//! * `block_list_naming_a_block_twice_is_refused`: RAM_BLOCKS_REQUEST naming one block twice
//! * `block_list_with_an_unterminated_name_is_refused`: a block-spec entry whose name has no NUL
//! * `connect_with_version_2_is_rejected_with_our_version`: private data version 2
//! * `connect_with_version_0_is_rejected_with_our_version`: private data version 0
//! * `unknown_capability_flags_are_masked_away`: flags 0x7FFFFFFE and 0xFFFFFFFF
//! * `stream_flood_without_reading_is_held_back_at_256_mib`: QEMU_FILE flood, the hypervisor never reading
//! * `write_with_a_stale_rkey_after_unregistration_fails`: RDMA WRITE with a key the source unregistered
//! * `write_outside_the_registered_chunk_fails`: RDMA WRITE with a valid key outside its registration
//! * `postcopy_running_leaves_the_source_no_key_to_write_with`: RDMA WRITE with each key given, once post-copy runs

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{fence, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::verbs::{
    Access, CmEvent, CmEventKind, CmId, CompletionChannel, CompletionQueue, ConnParam, EventChannel, MemoryRegion,
    ProtectionDomain, QpCaps, QueuePair, WorkCompletion,
};
use rdmamig::wire::{
    self, AuthProof, BlockSpec, Capabilities, CommandType, Compress, DestBlock, EndSummary, Entry, MessageWriter,
    PostcopyBlock, PostcopyRecovery, PostcopyRegion, QpEndpoint, RegisterRequest, RegisterResult, CAP_PIN_ALL,
    CAP_RDMAMIG_EXT, CAP_RDMAMIG_RECOVERY, CONTROL_BUFFER_SIZE, MAX_PAYLOAD,
};
use rdmamig::{Config, Destination, Ending, Error, ErrorKind, Negotiated, PostcopyPhase, RamBlocks};

use crate::migration::{listen, rdma_ip, read_stream, GuestRam};

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

/// One destination block: its name, its offset in the destination's RAM
/// address space (not 0, so a missing translation would show) and its length.
struct BlockLayout {
    name: &'static str,
    offset: u64,
    length: u64,
}

/// The destination's blocks. Two, so that a wrong block index shows; the
/// second ends with a partial chunk.
const BLOCKS: [BlockLayout; 2] = [
    BlockLayout { name: "pc.ram", offset: 64 * MIB, length: 4 * MIB },
    BlockLayout { name: "vga.vram", offset: 132 * MIB, length: 5 * MIB / 2 },
];
const PC: usize = 0;
const VGA: usize = 1;
/// What each block holds before the case.
const GARBAGE: u8 = 0xAA;
/// What surrounds each block, and must still surround it after the case.
const CANARY: u8 = 0x5C;
/// Canary bytes on each side of a block (whole pages).
const CANARY_LEN: u64 = 64 * KIB;

const TIMEOUT: Duration = Duration::from_secs(10);
/// How long the destination gets to refuse a message and tell the peer.
const FAIL_WITHIN: Duration = Duration::from_secs(5);
/// How long the destination gets to notice a broken link (its SEND's
/// transport retries, 6 × 0.54 s with the default liveness).
const BREAK_WITHIN: Duration = Duration::from_secs(15);
/// No READY for this long, with the destination's buffer full: the peer is held back.
const CREDIT_STOPPED_AFTER: Duration = Duration::from_secs(3);
/// The destination's limit of buffered stream bytes (`MAX_BUFFERED_STREAM`).
const STREAM_LIMIT: u64 = 256 * MIB;

/// Work-request ids (local only), as QEMU numbers them.
pub(crate) const WRID_WRITE: u64 = 1;
pub(crate) const WRID_SEND: u64 = 2000;
pub(crate) const WRID_RECV: u64 = 4000;
/// Receive buffers: at most two receives are ever outstanding (a response and
/// the next READY); a third spare keeps the bookkeeping simple.
const RECV_BUFFERS: usize = 3;
/// The send buffer holds more than a receive buffer: room for a SEND that
/// overflows the destination's receive, or for two messages side by side.
const SEND_BUFFER: usize = 2 * CONTROL_BUFFER_SIZE;

/// Address `off` bytes into block `b`, in the destination's RAM address space.
fn addr(b: usize, off: u64) -> u64 {
    BLOCKS[b].offset + off
}

/// A REGISTER_REQUEST entry: chunk `chunk` of block `b` and `more` chunks after it.
fn reg(b: usize, chunk: u64, more: u64) -> RegisterRequest {
    RegisterRequest { key: addr(b, chunk * MIB), block_index: b as u32, chunks: more }
}

/// An UNREGISTER_REQUEST entry: its key is a chunk index, not an address.
fn unreg(b: usize, chunk: u64) -> RegisterRequest {
    RegisterRequest { key: chunk, block_index: b as u32, chunks: 0 }
}

/// A COMPRESS entry: zero `length` bytes at `off` in block `b`.
fn zero(b: usize, off: u64, length: u64) -> Compress {
    Compress { value: 0, block_index: b as u32, offset: addr(b, off), length }
}

/// The block list as the destination has it, in its order (rdmamig extension).
fn block_specs() -> Vec<BlockSpec> {
    BLOCKS.iter().map(|b| BlockSpec::new(b.name, b.length).expect("valid name")).collect()
}

/// A recognisable byte pattern, different for each `seed`.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(7) ^ seed.wrapping_mul(0x9E)) as u8).collect()
}

/// A control message built by hand, for what the codec will not write: the
/// header's len, type and repeat as given (big-endian, padding 0), then
/// `payload` whatever its length.
fn raw_message(len: u32, kind: u32, repeat: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(16 + payload.len());
    for field in [len, kind, repeat, 0] {
        m.extend_from_slice(&field.to_be_bytes());
    }
    m.extend_from_slice(payload);
    m
}

/// `entries` encoded as they are, skipping the checks `MessageWriter::push`
/// makes (a COMPRESS value ≠ 0, an unterminated name...).
fn encoded<E: Entry>(entries: &[E]) -> Vec<u8> {
    let mut out = vec![0u8; entries.len() * E::SIZE];
    for (e, slot) in entries.iter().zip(out.chunks_mut(E::SIZE)) {
        e.encode(slot);
    }
    out
}

/// A well-formed header over `entries` (repeat = their count).
fn message<E: Entry>(kind: CommandType, entries: &[E]) -> Vec<u8> {
    let payload = encoded(entries);
    raw_message(payload.len() as u32, kind.as_u32(), entries.len() as u32, &payload)
}

/// A message without payload, {len 0, repeat 1}.
fn empty(kind: CommandType) -> Vec<u8> {
    raw_message(0, kind.as_u32(), 1, &[])
}

/// A QEMU_FILE message carrying `data` (repeat 0, as QEMU sends it).
fn file_message(data: &[u8]) -> Vec<u8> {
    raw_message(data.len() as u32, CommandType::QemuFile.as_u32(), 0, data)
}

/// The destination's RAM: each block in its own mapping, between two
/// canaries of `CANARY_LEN` bytes of 0x5C; the block starts as 0xAA. Only the
/// block is in the registry the destination serves.
pub(crate) struct GuardedRam {
    maps: Vec<GuestRam>,
}

impl GuardedRam {
    pub(crate) fn new() -> GuardedRam {
        let maps = BLOCKS
            .iter()
            .map(|b| {
                let map = GuestRam::new(CANARY_LEN + b.length + CANARY_LEN, CANARY);
                // SAFETY: the block lies inside the mapping.
                unsafe { std::ptr::write_bytes(map.ptr().add(CANARY_LEN as usize), GARBAGE, b.length as usize) };
                map
            })
            .collect();
        GuardedRam { maps }
    }

    pub(crate) fn registry(&self) -> RamBlocks {
        let mut r = RamBlocks::new();
        for (b, map) in BLOCKS.iter().zip(&self.maps) {
            // SAFETY: the mapping outlives every destination over it (it is dropped last).
            unsafe { r.add(b.name, map.ptr().add(CANARY_LEN as usize), b.offset, b.length) }.expect("add block");
        }
        r
    }

    /// Every canary byte is still 0x5C. Only while nothing writes.
    /// Nothing in or around the blocks changed.
    pub(crate) fn check_untouched(&self) {
        self.check_canaries();
        self.check_blocks(&[]);
    }

    fn check_canaries(&self) {
        for (b, map) in BLOCKS.iter().zip(&self.maps) {
            let (canary, len) = (CANARY_LEN as usize, b.length as usize);
            let bytes = map.bytes();
            for (side, range) in [("before", 0..canary), ("after", canary + len..canary + len + canary)] {
                if let Some(i) = bytes[range.clone()].iter().position(|&x| x != CANARY) {
                    panic!(
                        "the canary {side} block '{}' was overwritten: byte {i:#x} of it is {:#04x}",
                        b.name,
                        bytes[range.start + i]
                    );
                }
            }
        }
    }

    /// The bytes of block `block`. Only while nothing writes.
    fn block(&self, block: usize) -> &[u8] {
        &self.maps[block].bytes()[CANARY_LEN as usize..][..BLOCKS[block].length as usize]
    }

    /// Each block holds 0xAA except what `changes` legitimately did. Only while nothing writes.
    fn check_blocks(&self, changes: &[Change]) {
        for (i, b) in BLOCKS.iter().enumerate() {
            let mut want = vec![GARBAGE; b.length as usize];
            for c in changes.iter().filter(|c| c.block() == i) {
                c.apply(&mut want);
            }
            let got = self.block(i);
            if let Some(at) = want.iter().zip(got).position(|(w, g)| w != g) {
                panic!("block '{}' byte {at:#x} is {:#04x}, expected {:#04x}", b.name, got[at], want[at]);
            }
        }
    }
}

/// What a case legitimately did to a destination block.
enum Change {
    Zeroed { block: usize, at: u64, len: u64 },
    Written { block: usize, at: u64, data: Vec<u8> },
}

impl Change {
    fn block(&self) -> usize {
        match self {
            Change::Zeroed { block, .. } | Change::Written { block, .. } => *block,
        }
    }

    fn apply(&self, bytes: &mut [u8]) {
        match self {
            Change::Zeroed { at, len, .. } => bytes[*at as usize..(at + len) as usize].fill(0),
            Change::Written { at, data, .. } => bytes[*at as usize..][..data.len()].copy_from_slice(data),
        }
    }
}

/// A registered control buffer; `mr` is declared first so it is deregistered
/// before the memory is freed.
pub(crate) struct ControlBuffer {
    pub(crate) mr: MemoryRegion,
    pub(crate) mem: Box<[u8]>,
}

impl ControlBuffer {
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, len: usize) -> ControlBuffer {
        let mut mem = vec![0u8; len].into_boxed_slice();
        // SAFETY: the boxed memory moves into the same struct and outlives `mr` (field order).
        let mr = unsafe { pd.register(mem.as_mut_ptr(), mem.len(), Access::LOCAL_WRITE) }.expect("register buffer");
        ControlBuffer { mr, mem }
    }
}

/// A message a crafted peer received, validated by `wire::decode_message`
/// (anything malformed fails the test: the library under test sent it).
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) kind: CommandType,
    pub(crate) repeat: u32,
    pub(crate) bytes: Vec<u8>,
}

impl Received {
    pub(crate) fn entries<E: Entry>(&self) -> Vec<E> {
        let m = wire::decode_message(&self.bytes).expect("validated when received");
        m.collect_entries().unwrap_or_else(|e| panic!("{:?} entries: {e}", self.kind))
    }
}

/// How the destination answered a connect it did not accept.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) kind: CmEventKind,
    private_data: Vec<u8>,
    /// From the connection request to this answer.
    pub(crate) took: Duration,
}

fn wait_event(ch: &EventChannel, deadline: Instant) -> CmEvent {
    let left = deadline.saturating_duration_since(Instant::now());
    ch.get_event(Some(left)).expect("get_event").expect("timed out waiting for a connection event")
}

pub(crate) fn next_event(ch: &EventChannel, want: CmEventKind, deadline: Instant) -> CmEvent {
    let ev = wait_event(ch, deadline);
    assert_eq!(ev.kind(), want, "unexpected event {ev:?}");
    ev
}

/// The next completion on `cq`, or None at `deadline`.
pub(crate) fn next_wc(cq: &CompletionQueue, deadline: Instant) -> Option<WorkCompletion> {
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
pub(crate) struct Peer {
    qp: Arc<QueuePair>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    pub(crate) pd: Arc<ProtectionDomain>,
    recv: Vec<ControlBuffer>,
    send_buf: ControlBuffer,
    /// Receive buffers posted, in posting order (receives complete in that order).
    posted: VecDeque<usize>,
    /// The capabilities in the destination's accept.
    reply: Capabilities,
    /// The destination's whole accept private data (as rdma_cm padded it).
    pub(crate) accepted: Vec<u8>,
    id: Arc<CmId>,
}

impl Peer {
    /// Connects to the destination on `port` with `private` data (QEMU's
    /// source sends its 8 bytes of capabilities); the destination's answer if
    /// it did not accept.
    pub(crate) fn connect(port: u16, private: &[u8]) -> Result<Peer, Refusal> {
        Peer::connect_from(None, port, private)
    }

    /// As `connect`, from the local address `source` if given.
    pub(crate) fn connect_from(source: Option<IpAddr>, port: u16, private: &[u8]) -> Result<Peer, Refusal> {
        let deadline = Instant::now() + TIMEOUT;
        let ip: IpAddr = rdma_ip().parse().expect("RXE_VM_IP");
        let ch = EventChannel::new().expect("event channel");
        let id = CmId::new(&ch).expect("cm id");
        if let Some(source) = source {
            id.bind_addr(&SocketAddr::new(source, 0)).expect("bind the source address");
        }
        id.resolve_addr(&SocketAddr::new(ip, port), 5000).expect("resolve_addr");
        next_event(&ch, CmEventKind::AddrResolved, deadline);
        id.resolve_route(5000).expect("resolve_route");
        next_event(&ch, CmEventKind::RouteResolved, deadline);
        let pd = ProtectionDomain::new(&id).expect("pd");
        let send_cq = CompletionQueue::new(&id, 64, &CompletionChannel::new(&id).expect("channel")).expect("send cq");
        let recv_cq = CompletionQueue::new(&id, 16, &CompletionChannel::new(&id).expect("channel")).expect("recv cq");
        let caps_qp = QpCaps { max_send_wr: 16, max_recv_wr: 3, max_send_sge: 1, max_recv_sge: 1 };
        let qp = QueuePair::new(&id, &pd, &send_cq, &recv_cq, caps_qp).expect("qp");
        let recv = (0..RECV_BUFFERS).map(|_| ControlBuffer::new(&pd, CONTROL_BUFFER_SIZE)).collect();
        let send_buf = ControlBuffer::new(&pd, SEND_BUFFER);
        let reply = Capabilities::v1(0);
        let mut peer =
            Peer { qp, send_cq, recv_cq, pd, recv, send_buf, posted: VecDeque::new(), reply, accepted: Vec::new(), id };
        // The READY receive goes up before connecting: the destination sends READY at once.
        peer.post_recv();
        // QEMU's parameters: rnr_retry 0, so a SEND without a posted receive kills the QP.
        let param = ConnParam {
            private_data: private,
            // QEMU's 0 would do but for post-copy, where the destination reads from the peer.
            responder_resources: 1,
            initiator_depth: 2,
            retry_count: 5,
            rnr_retry_count: 0,
        };
        let requested = Instant::now();
        peer.id.connect(&param).expect("connect");
        let ev = wait_event(&ch, deadline);
        if ev.kind() != CmEventKind::Established {
            return Err(Refusal {
                kind: ev.kind(),
                private_data: ev.private_data().to_vec(),
                took: requested.elapsed(),
            });
        }
        peer.reply = Capabilities::decode(ev.private_data()).expect("accept private data");
        peer.accepted = ev.private_data().to_vec();
        Ok(peer)
    }

    fn post_recv(&mut self) {
        let i = (0..RECV_BUFFERS).find(|i| !self.posted.contains(i)).expect("a free receive buffer");
        let sge = self.recv[i].mr.sge(0, CONTROL_BUFFER_SIZE as u32).unwrap();
        self.qp.post_recv(WRID_RECV + i as u64, sge).expect("post_recv");
        self.posted.push_back(i);
    }

    fn post_recvs(&mut self, n: usize) {
        for _ in 0..n {
            self.post_recv();
        }
    }

    /// The next message from the destination; `Some(Err(status))` for a failed
    /// (e.g. flushed) receive, `None` if nothing arrived within `timeout`.
    pub(crate) fn recv_any(&mut self, timeout: Duration) -> Option<Result<Received, String>> {
        Some(self.recv_bytes(timeout)?.map(|bytes| {
            let (kind, repeat) = match wire::decode_message(&bytes) {
                Ok(m) => (m.kind, m.repeat),
                Err(e) => panic!("malformed message from the destination: {e}"),
            };
            Received { kind, repeat, bytes }
        }))
    }

    /// As `recv_any`, the bytes as they came (a tagged message's tag included).
    pub(crate) fn recv_bytes(&mut self, timeout: Duration) -> Option<Result<Vec<u8>, String>> {
        let wc = next_wc(&self.recv_cq, Instant::now() + timeout)?;
        let i = self.posted.pop_front().expect("a receive completed that was never posted");
        assert_eq!(wc.wr_id(), WRID_RECV + i as u64, "receives complete in posting order");
        if !wc.is_success() {
            return Some(Err(format!("{} ({})", wc.status_str(), wc.status())));
        }
        fence(Ordering::Acquire);
        Some(Ok(self.recv[i].mem[..wc.byte_len() as usize].to_vec()))
    }

    /// The next message, which must be of type `kind`.
    fn expect(&mut self, kind: CommandType) -> Received {
        match self.recv_any(TIMEOUT) {
            Some(Ok(m)) if m.kind == kind => m,
            other => panic!("expected {kind:?} from the destination, got {other:?}"),
        }
    }

    /// Takes the destination's READY (the credit for one message).
    pub(crate) fn take_ready(&mut self) {
        let m = self.expect(CommandType::Ready);
        assert_eq!((m.repeat, m.bytes.len()), (1, 16), "READY is {{len 0, repeat 1}}");
    }

    /// Copies `bytes` to the start of the send buffer; returns their length.
    fn stage(&mut self, bytes: &[u8]) -> usize {
        self.send_buf.mem[..bytes.len()].copy_from_slice(bytes);
        bytes.len()
    }

    /// SENDs the first `len` bytes of the send buffer and returns the
    /// completion, successful or not. Posts no receive.
    fn transmit(&mut self, len: usize) -> WorkCompletion {
        let sge = self.send_buf.mr.sge(0, len as u32).unwrap();
        self.qp.post_send(WRID_SEND, sge, true).expect("post_send");
        let wc = next_wc(&self.send_cq, Instant::now() + TIMEOUT).expect("no send completion");
        assert_eq!(wc.wr_id(), WRID_SEND);
        wc
    }

    /// Sends one message (the caller took a READY): first a receive for each
    /// expected response, then the receive for the next READY (or an ERROR),
    /// then the SEND, waiting for its completion.
    pub(crate) fn send_with(&mut self, kind: CommandType, responses: usize, build: impl FnOnce(&mut MessageWriter)) {
        self.post_recvs(responses + 1);
        let mut writer = MessageWriter::new(&mut self.send_buf.mem[..CONTROL_BUFFER_SIZE], kind);
        build(&mut writer);
        let len = writer.finish();
        let wc = self.transmit(len);
        assert!(wc.is_success(), "SEND of {kind:?}: {wc:?}");
    }

    /// As `send_with`, for bytes built by hand (`raw_message`, `message`).
    pub(crate) fn send_raw(&mut self, responses: usize, bytes: &[u8]) {
        self.post_recvs(responses + 1);
        let len = self.stage(bytes);
        let wc = self.transmit(len);
        assert!(wc.is_success(), "SEND of {len} bytes: {wc:?}");
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

    /// REGISTER_FINISHED: closes the window.
    fn finish_window(&mut self) {
        self.take_ready();
        self.send_with(CommandType::RegisterFinished, 0, |_| {});
    }

    /// QEMU's first window: RAM_BLOCKS_REQUEST (empty) → RAM_BLOCKS_RESULT,
    /// which must list `BLOCKS` in order, each with a key exactly under
    /// pin-all. Takes the READY for it.
    fn ram_blocks(&mut self) -> Vec<DestBlock> {
        self.take_ready();
        self.send_with(CommandType::RamBlocksRequest, 1, |_| {});
        let blocks = self.expect(CommandType::RamBlocksResult).entries::<DestBlock>();
        let got: Vec<(u64, u64, bool)> = blocks.iter().map(|d| (d.offset, d.length, d.remote_rkey != 0)).collect();
        let want: Vec<(u64, u64, bool)> = BLOCKS.iter().map(|b| (b.offset, b.length, self.reply.pin_all())).collect();
        assert_eq!(got, want, "{blocks:?}");
        blocks
    }

    /// Registers one range (taking the READY); returns the destination's key and block base.
    fn register(&mut self, r: RegisterRequest) -> RegisterResult {
        self.take_ready();
        let m = self.request(CommandType::RegisterRequest, &[r]).expect("REGISTER_RESULT");
        assert_eq!((m.kind, m.repeat), (CommandType::RegisterResult, 1), "{m:?}");
        let results = m.entries::<RegisterResult>();
        assert_eq!(results.len(), 1, "{results:?}");
        results[0]
    }

    /// An RDMA WRITE of `data` to the destination; returns its completion.
    fn write(&mut self, remote_addr: u64, rkey: u32, data: &[u8]) -> WorkCompletion {
        let mut mem = data.to_vec();
        // SAFETY: `mem` outlives `mr` (dropped below, after the completion).
        let mr = unsafe { self.pd.register(mem.as_mut_ptr(), mem.len(), Access::LOCAL_WRITE) }.expect("register");
        let sge = mr.sge(0, mem.len() as u32).unwrap();
        self.qp.post_write(WRID_WRITE, sge, remote_addr, rkey, true).expect("post_write");
        let wc = next_wc(&self.send_cq, Instant::now() + TIMEOUT).expect("no write completion");
        assert_eq!(wc.wr_id(), WRID_WRITE);
        drop(mr);
        wc
    }

    /// Two SENDs posted one right after the other, the second without a
    /// credit (no READY in between); returns both completions.
    fn send_back_to_back(&mut self, first: &[u8], second: &[u8]) -> [WorkCompletion; 2] {
        let second_at = CONTROL_BUFFER_SIZE;
        self.send_buf.mem[..first.len()].copy_from_slice(first);
        self.send_buf.mem[second_at..][..second.len()].copy_from_slice(second);
        for (at, len) in [(0, first.len()), (second_at, second.len())] {
            let sge = self.send_buf.mr.sge(at, len as u32).unwrap();
            self.qp.post_send(WRID_SEND, sge, true).expect("post_send");
        }
        let deadline = Instant::now() + TIMEOUT;
        [(); 2].map(|_| next_wc(&self.send_cq, deadline).expect("no send completion"))
    }

    /// Whether the connection was disconnected within `timeout`.
    pub(crate) fn disconnected(&self, timeout: Duration) -> bool {
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

/// A destination's accept and a peer's connect, as they came out, over fresh
/// guarded RAM. Fields drop in order: the RAM last.
struct Dialed {
    dest: rdmamig::Result<Destination>,
    peer: Result<Peer, Refusal>,
    ram: GuardedRam,
}

fn dial(config: Config, caps: Capabilities) -> Dialed {
    let ram = GuardedRam::new();
    let registry = ram.registry();
    let (listener, port) = listen(&config);
    let accept = thread::spawn(move || Destination::accept(&listener, &registry, Some(TIMEOUT)));
    let peer = Peer::connect(port, &caps.encode());
    let dest = accept.join().expect("accept thread");
    Dialed { dest, peer, ram }
}

/// A destination and a peer connected to it.
/// Fields drop in order: the destination first, the RAM last.
struct Session {
    dest: Destination,
    peer: Peer,
    ram: GuardedRam,
    /// What the case legitimately did to the blocks.
    changes: Vec<Change>,
}

/// A session with a destination configured by `config`, the peer offering `flags`.
fn start(config: Config, flags: u32) -> Session {
    let Dialed { dest, peer, ram } = dial(config, Capabilities::v1(flags));
    let peer = peer.unwrap_or_else(|r| panic!("the destination refused the connection: {r:?}"));
    let dest = dest.expect("accept");
    Session { dest, peer, ram, changes: Vec::new() }
}

/// A session past QEMU's first step (the RAM-block exchange), the peer offering `flags`.
fn after_blocks(flags: u32) -> Session {
    let mut s = start(Config::default(), flags);
    s.peer.ram_blocks();
    s
}

/// The destination's failure, which must be of one of `kinds` with every word in its message.
fn failure(end: rdmamig::Result<Ending>, kinds: &[ErrorKind], words: &[&str]) -> Error {
    let err = end.expect_err("the destination must fail");
    assert!(kinds.contains(&err.kind), "expected one of {kinds:?}, got {err}");
    for w in words {
        assert!(err.message.contains(w), "{w:?} not in: {err}");
    }
    err
}

/// What each side saw after the peer's last action.
struct Outcome {
    end: rdmamig::Result<Ending>,
    got: Option<Result<Received, String>>,
    disconnected: bool,
}

impl Session {
    /// Records `len` bytes at `at` of block `block` as legitimately zeroed.
    fn zeroed(&mut self, block: usize, at: u64, len: u64) {
        self.changes.push(Change::Zeroed { block, at, len });
    }

    /// Records `data` at `at` of block `block` as legitimately written.
    fn written(&mut self, block: usize, at: u64, data: &[u8]) {
        self.changes.push(Change::Written { block, at, data: data.to_vec() });
    }

    /// Waits (at most `within`) for the destination to end, then gathers
    /// what the peer got and checks the RAM (canaries and blocks).
    fn outcome(&mut self, within: Duration) -> Outcome {
        let t = Instant::now();
        let end = self.dest.wait_end(Some(within));
        let took = t.elapsed();
        let got = self.peer.recv_any(Duration::from_secs(1));
        let disconnected = self.peer.disconnected(FAIL_WITHIN);
        eprintln!("destination: {end:?}, ended {took:?} after the peer's last action");
        eprintln!("peer: received {got:?}; DISCONNECTED: {disconnected}");
        self.ram.check_canaries();
        self.ram.check_blocks(&self.changes);
        Outcome { end, got, disconnected }
    }

    /// The destination refused the peer's last message and told it: the peer
    /// receives ERROR (in the first receive it posted), then the disconnect;
    /// the destination ends with `kind`, its message holding every word.
    fn refused(&mut self, kind: ErrorKind, words: &[&str]) -> Error {
        let o = self.outcome(FAIL_WITHIN);
        match &o.got {
            Some(Ok(m)) if m.kind == CommandType::Error => assert_eq!(m.bytes.len(), 16, "ERROR has no payload"),
            other => panic!("the peer should have received ERROR, got {other:?} (destination: {:?})", o.end),
        }
        let err = failure(o.end, &[kind], words);
        assert!(o.disconnected, "no DISCONNECTED after the ERROR");
        err
    }

    /// `refused` with a Protocol error.
    fn rejected(&mut self, words: &[&str]) -> Error {
        self.refused(ErrorKind::Protocol, words)
    }

    /// Sends `message` (raw bytes) with the next READY, a receive posted for
    /// a response as a request does, and checks that it is `rejected`.
    fn rejects(&mut self, message: &[u8], words: &[&str]) -> Error {
        self.peer.take_ready();
        self.peer.send_raw(1, message);
        self.rejected(words)
    }

    /// The destination ended without an ERROR (the link broke, or the peer
    /// sent ERROR itself): the peer receives nothing but perhaps a READY
    /// granted before the break (a receive it posted is flushed), then the
    /// disconnect; the destination ends within `BREAK_WITHIN` with one of `kinds`.
    fn dropped(&mut self, kinds: &[ErrorKind], words: &[&str]) -> Error {
        let o = self.outcome(BREAK_WITHIN);
        if let Some(Ok(m)) = &o.got {
            assert_eq!(m.kind, CommandType::Ready, "the peer received {m:?} (destination: {:?})", o.end);
        }
        let err = failure(o.end, kinds, words);
        assert!(o.disconnected, "no DISCONNECTED");
        err
    }

    /// The peer ends an rdmamig migration properly: END with `summary`,
    /// answered by END_ACK; the destination reports it completed.
    fn completes(&mut self, summary: EndSummary) {
        self.peer.take_ready();
        let ack = self.peer.request(CommandType::End, &[summary]).expect("END_ACK");
        assert_eq!(ack.kind, CommandType::EndAck, "{ack:?}");
        let o = self.outcome(FAIL_WITHIN);
        assert_eq!(o.end, Ok(Ending::Completed));
        assert!(o.disconnected, "no DISCONNECTED after END_ACK");
    }

    /// The peer disconnects (a QEMU source's end); how the destination judged it.
    fn peer_leaves(&mut self) -> rdmamig::Result<Ending> {
        self.peer.id.disconnect().expect("disconnect");
        self.outcome(FAIL_WITHIN).end
    }
}

impl Drop for Session {
    /// The backstop: whatever a case did, nothing was written around a block.
    fn drop(&mut self) {
        self.dest.close();
        if !thread::panicking() {
            self.ram.check_canaries();
        }
    }
}

// ---- COMPRESS limits and overlapping registrations ----

/// QEMU-compatible destination (the peer offers no rdmamig extension):
/// COMPRESS with two ranges is refused before any memory is touched.
#[test]
fn qemu_mode_compress_with_two_ranges_is_refused() {
    let mut s = start(Config::default(), 0);
    assert_eq!(s.peer.reply, Capabilities::v1(0));
    assert!(!s.dest.negotiated().extensions);
    s.peer.ram_blocks();
    let two = [zero(PC, 0, 4 * KIB), zero(PC, MIB, 4 * KIB)];
    s.rejects(&message(CommandType::Compress, &two), &["COMPRESS", "2 ranges"]);
    assert_eq!(s.dest.stats().zero_chunks, 0);
}

/// QEMU-compatible destination (extensions off; it masks the peer's offer):
/// a valid one-chunk COMPRESS is applied, one that crosses a 1 MiB chunk or
/// is longer than 1 MiB is refused.
#[test]
fn qemu_mode_compress_across_a_chunk_or_over_1_mib_is_refused() {
    let config = Config { extensions: false, ..Config::default() };
    let (control_at, control_len) = (3 * MIB, 64 * KIB);
    for bad in [zero(PC, MIB / 2, MIB), zero(PC, MIB, 2 * MIB), zero(PC, MIB, MIB + 1)] {
        eprintln!("COMPRESS {:#x}+{:#x}", bad.offset, bad.length);
        let mut s = start(config.clone(), CAP_RDMAMIG_EXT);
        assert_eq!(s.peer.reply, Capabilities::v1(0), "the destination must clear the extension bit");
        assert!(!s.dest.negotiated().extensions);
        s.peer.ram_blocks();
        s.peer.take_ready();
        s.peer.send_raw(0, &message(CommandType::Compress, &[zero(PC, control_at, control_len)]));
        s.zeroed(PC, control_at, control_len);
        // The next READY comes after the range was applied.
        s.rejects(&message(CommandType::Compress, &[bad]), &["COMPRESS", "not inside one 1 MiB chunk"]);
        assert_eq!(s.dest.stats().zero_chunks, 1);
    }
}

/// Between rdmamig peers COMPRESS may carry many ranges, but at most 256 MiB
/// in all; more is refused before any range is applied, even when every
/// range lies inside the block.
#[test]
fn extension_compress_over_256_mib_is_refused_before_touching_ram() {
    let controls = [(0, 64 * KIB), (2 * MIB, 64 * KIB)];
    // One valid range, then one claiming 256 MiB (the sum crosses the limit).
    let huge = vec![zero(PC, MIB, 4 * KIB), zero(PC, 0, 256 * MIB)];
    // 4096 ranges of 64 KiB + 1, each inside the block: 256 MiB + 4096 bytes.
    let many: Vec<Compress> = (0..4096).map(|i| zero(PC, (i * 4 * KIB) % (3 * MIB), 64 * KIB + 1)).collect();
    for (name, bad) in [("one huge range", huge), ("4096 ranges", many)] {
        eprintln!("{name}");
        let mut s = start(Config::default(), CAP_RDMAMIG_EXT);
        assert_eq!(s.peer.reply, Capabilities::v1(CAP_RDMAMIG_EXT));
        assert!(s.dest.negotiated().extensions);
        s.peer.ram_blocks();
        s.peer.take_ready();
        let ok: Vec<Compress> = controls.iter().map(|&(o, l)| zero(PC, o, l)).collect();
        s.peer.send_raw(0, &message(CommandType::Compress, &ok));
        for (at, len) in controls {
            s.zeroed(PC, at, len);
        }
        s.rejects(&message(CommandType::Compress, &bad), &["COMPRESS", "more than 0x10000000 bytes"]);
        assert_eq!(s.dest.stats().zero_chunks, 2, "only the valid message's ranges");
    }
}

/// A registration that overlaps an earlier one in part is refused; repeating
/// an identical request returns the same key, which stays usable.
#[test]
fn partially_overlapping_registration_is_refused_and_keys_are_never_replaced() {
    let mut s = start(Config::default(), 0);
    let blocks = s.peer.ram_blocks();
    let keys: Vec<u32> = (0..2)
        .map(|_| {
            let r = s.peer.register(reg(PC, 1, 0));
            assert_eq!(r.host_addr, blocks[PC].remote_host_addr, "the block base");
            r.rkey
        })
        .collect();
    eprintln!("rkeys for chunk 1: {keys:#x?}");
    assert_eq!(keys[0], keys[1], "a repeated registration must return the same key");
    // The key still works: write a pattern into chunk 1 with it.
    let data = pattern(4096, 1);
    let at = MIB + 0x100;
    let wc = s.peer.write(blocks[PC].remote_host_addr + at, keys[0], &data);
    assert!(wc.is_success(), "RDMA WRITE with the returned key: {wc:?}");
    s.written(PC, at, &data);
    // Chunks 0..=1 overlap the registration of chunk 1 in part.
    s.rejects(&message(CommandType::RegisterRequest, &[reg(PC, 0, 1)]), &["overlaps"]);
    let stats = s.dest.stats();
    assert_eq!((stats.chunks_registered, stats.registration_round_trips), (1, 2), "{stats:?}");
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
    s.peer.send_file(b"second");
    s.refused(ErrorKind::Aborted, &["closed"]);
    // What arrived before the abort is still readable.
    assert_eq!(read_stream(&s.dest, 5), b"first");
}

// ---- The header: len against the bytes received ----

/// `len` past the 524272 bytes a receive buffer has room for after the
/// header: refused whether the SEND fills the buffer or is the header alone.
#[test]
fn len_past_the_payload_room_is_refused() {
    for (len, payload) in [(MAX_PAYLOAD as u32 + 1, MAX_PAYLOAD), (u32::MAX, 0)] {
        let mut s = after_blocks(0);
        let words = format!("payload length {len} exceeds the maximum {MAX_PAYLOAD}");
        s.rejects(&raw_message(len, CommandType::QemuFile.as_u32(), 0, &vec![0x11; payload]), &[words.as_str()]);
        assert_eq!(s.dest.stats().stream_bytes, 0);
    }
}

#[test]
fn register_len_not_a_multiple_of_the_entry_size_is_refused() {
    let mut s = after_blocks(0);
    let mut payload = encoded(&[reg(PC, 0, 0)]);
    payload.push(0);
    let m = raw_message(25, CommandType::RegisterRequest.as_u32(), 1, &payload);
    s.rejects(&m, &["payload length 25 is not repeat 1 x 24 bytes"]);
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

#[test]
fn register_len_short_of_repeat_entries_is_refused() {
    let mut s = after_blocks(0);
    let m = raw_message(24, CommandType::RegisterRequest.as_u32(), 2, &encoded(&[reg(PC, 0, 0)]));
    s.rejects(&m, &["payload length 24 is not repeat 2 x 24 bytes"]);
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

#[test]
fn send_longer_than_16_plus_len_is_refused() {
    let mut s = after_blocks(0);
    let m = raw_message(10, CommandType::QemuFile.as_u32(), 0, &[0x22; 100]);
    s.rejects(&m, &["header says 16 + 10 bytes but 116 bytes were received"]);
    assert_eq!(s.dest.stats().stream_bytes, 0);
}

#[test]
fn send_shorter_than_16_plus_len_is_refused() {
    let mut s = after_blocks(0);
    let m = raw_message(100, CommandType::QemuFile.as_u32(), 0, &[0x22; 50]);
    s.rejects(&m, &["header says 16 + 100 bytes but 66 bytes were received"]);
    assert_eq!(s.dest.stats().stream_bytes, 0);
}

#[test]
fn send_shorter_than_a_header_is_refused() {
    for len in [0, 15] {
        let mut s = after_blocks(0);
        let m = file_message(b"");
        s.rejects(&m[..len], &[format!("control header needs 16 bytes, got {len}").as_str()]);
    }
}

/// A SEND longer than the destination's 512 KiB receive fails in its NIC
/// (no bytes land anywhere) and kills the connection: no ERROR can follow.
#[test]
fn send_larger_than_the_receive_buffer_breaks_the_link_cleanly() {
    let mut s = after_blocks(0);
    let payload = vec![0x33; MAX_PAYLOAD + 4096];
    s.peer.take_ready();
    s.peer.post_recvs(1);
    let len = s.peer.stage(&raw_message(payload.len() as u32, CommandType::QemuFile.as_u32(), 0, &payload));
    let wc = s.peer.transmit(len);
    eprintln!("peer: SEND of {len} bytes: {wc:?}");
    assert!(!wc.is_success(), "a SEND past the receive buffer must fail");
    s.dropped(&[ErrorKind::Verbs], &["control RECV failed"]);
    assert_eq!(s.dest.stats().stream_bytes, 0);
}

// ---- repeat ----

#[test]
fn register_with_repeat_0_is_refused() {
    let mut s = after_blocks(0);
    let m = raw_message(24, CommandType::RegisterRequest.as_u32(), 0, &encoded(&[reg(PC, 0, 0)]));
    s.rejects(&m, &["RegisterRequest message with repeat 0"]);
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

#[test]
fn compress_with_repeat_0_is_refused() {
    let mut s = after_blocks(0);
    let m = raw_message(24, CommandType::Compress.as_u32(), 0, &encoded(&[zero(PC, 0, 4 * KIB)]));
    s.rejects(&m, &["Compress message with repeat 0"]);
    assert_eq!(s.dest.stats().zero_chunks, 0);
}

#[test]
fn unregister_with_repeat_0_is_refused() {
    let mut s = after_blocks(0);
    s.peer.register(reg(PC, 0, 0));
    let m = raw_message(24, CommandType::UnregisterRequest.as_u32(), 0, &encoded(&[unreg(PC, 0)]));
    s.rejects(&m, &["UnregisterRequest message with repeat 0"]);
    assert_eq!(s.dest.stats().unpins, 0);
}

/// 4097 valid entries, one more than QEMU's limit: refused before any is registered.
#[test]
fn repeat_4097_is_refused() {
    let mut s = after_blocks(0);
    s.rejects(
        &message(CommandType::RegisterRequest, &[reg(PC, 0, 0); 4097]),
        &["repeat 4097 exceeds the maximum 4096"],
    );
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

#[test]
fn repeat_0xffffffff_is_refused() {
    let mut s = after_blocks(0);
    let m = raw_message(24, CommandType::RegisterRequest.as_u32(), u32::MAX, &encoded(&[reg(PC, 0, 0)]));
    s.rejects(&m, &["repeat 4294967295 exceeds the maximum 4096"]);
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

/// repeat × 24 = 2^32 + 8: a receiver multiplying in u32 would see len 8 match.
#[test]
fn repeat_times_entry_size_wrapping_u32_is_refused() {
    let repeat = 0x0AAA_AAAB_u32;
    assert_eq!(repeat.wrapping_mul(24), 8);
    let mut s = after_blocks(0);
    let m = raw_message(8, CommandType::RegisterRequest.as_u32(), repeat, &[0; 8]);
    s.rejects(&m, &[format!("repeat {repeat} exceeds the maximum 4096").as_str()]);
}

// ---- type ----

#[test]
fn unknown_command_types_are_refused() {
    // 0x8000_0004: rdmamig 0.8's POSTCOPY, whose bitmaps were in the message.
    for kind in [12, 0x7FFF_FFFF, 0x8000_0004, 0x8000_000B] {
        let mut s = after_blocks(0);
        s.rejects(&raw_message(0, kind, 1, &[]), &[format!("unknown control message type {kind}").as_str()]);
    }
}

/// POSTCOPY (rdmamig extension): refused from a source without the
/// extensions, one whose block does not match this side's, and one with
/// more regions than allowed.
#[test]
fn postcopy_without_extensions_a_wrong_block_or_too_many_regions_is_refused() {
    let block = PostcopyBlock { block_index: 0, table_rkey: 1, table_addr: 0x1000, ..PostcopyBlock::default() };
    let mut s = after_blocks(0);
    s.rejects(&message(CommandType::Postcopy, &[block]), &["unexpected Postcopy"]);
    // Inside the window the RAM-block exchange opened, it is not expected either.
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.rejects(&message(CommandType::Postcopy, &[block]), &["unexpected Postcopy"]);
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.peer.finish_window();
    s.rejects(&message(CommandType::Postcopy, &[block]), &["malformed POSTCOPY", "bytes here, 0 on the source"]);
    // More regions than any source makes: refused before this side allocates for their tables.
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.peer.finish_window();
    let many =
        PostcopyBlock { block_index: PC as u32, regions: 4097, length: BLOCKS[PC].length, stale_pages: 1, ..block };
    s.rejects(&message(CommandType::Postcopy, &[many]), &["malformed POSTCOPY", "at most 4096"]);
}

/// POSTCOPY whose table, read from the peer, does not hold up (a bitmap
/// with another count than its entry declares, a stale page outside every
/// region) or cannot be read (a wrong read key): refused before any guest
/// page is dropped (`rejects` checks the RAM).
#[test]
fn postcopy_table_that_does_not_hold_up_or_cannot_be_read_is_refused() {
    let length = BLOCKS[PC].length;
    let words = (length / 4096).div_ceil(64) as usize;
    let cases: [(u64, u64, u32, &[&str]); 3] = [
        (4, 0, 0, &["malformed POSTCOPY", "declares 4 stale pages, its bitmap holds 3"]),
        (3, 4096, 0, &["malformed POSTCOPY", "a stale page lies outside every region"]),
        (3, 0, 1, &["RDMA READ (post-copy)", "failed"]),
    ];
    for (declared, region_start, key_off, words_expected) in cases {
        let mut s = after_blocks(CAP_RDMAMIG_EXT);
        s.peer.finish_window();
        // Pages 0, 1 and 3 stale (big-endian words), then one region.
        let mut table = vec![0u8; words * 8 + PostcopyRegion::SIZE];
        table[..8].copy_from_slice(&0b1011u64.to_be_bytes());
        // SAFETY: `table` outlives `mr` (dropped at the end of the iteration, after the destination's end).
        let mr = unsafe { s.peer.pd.register(table.as_mut_ptr(), table.len(), Access::REMOTE_READ) }.unwrap();
        let region = PostcopyRegion { offset: region_start, length: MIB, remote_addr: mr.addr(), rkey: mr.rkey() };
        region.encode(&mut table[words * 8..]);
        let block = PostcopyBlock {
            block_index: PC as u32,
            regions: 1,
            length,
            stale_pages: declared,
            table_addr: mr.addr(),
            table_rkey: mr.rkey() ^ key_off,
        };
        if key_off == 0 {
            s.rejects(&message(CommandType::Postcopy, &[block]), words_expected);
        } else {
            s.peer.take_ready();
            s.peer.send_raw(1, &message(CommandType::Postcopy, &[block]));
            s.dropped(&[ErrorKind::Verbs], words_expected);
        }
        drop(s);
        drop(mr);
    }
}

/// POSTCOPY_FAULT_QP (rdmamig extension): refused without the extensions
/// and inside a window; outside one it is answered with the destination's
/// QP (24-bit number and PSN); a second one, or one whose numbers do not fit
/// in 24 bits, is refused.
#[test]
fn postcopy_fault_qp_out_of_place_twice_or_out_of_range_is_refused() {
    let ep = QpEndpoint { qpn: 0x123, psn: 0x4567 };
    let mut s = after_blocks(0);
    s.rejects(&message(CommandType::PostcopyFaultQp, &[ep]), &["unexpected PostcopyFaultQp"]);
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.rejects(&message(CommandType::PostcopyFaultQp, &[ep]), &["unexpected PostcopyFaultQp"]);
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.peer.finish_window();
    s.rejects(&raw_message(8, 0x8000_0006, 1, &[1, 0, 0, 0, 0, 0, 0, 1]), &["24-bit"]);

    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.peer.finish_window();
    s.peer.take_ready();
    let m = s.peer.request(CommandType::PostcopyFaultQp, &[ep]).expect("POSTCOPY_FAULT_QP_RESULT");
    assert_eq!(m.kind, CommandType::PostcopyFaultQpResult, "{m:?}");
    let qp = m.entries::<QpEndpoint>()[0];
    assert!(qp.qpn != 0 && qp.qpn < 1 << 24 && qp.psn < 1 << 24, "{qp:?}");
    s.rejects(&message(CommandType::PostcopyFaultQp, &[ep]), &["a second POSTCOPY_FAULT_QP"]);
}

/// POSTCOPY_RECOVERY (rdmamig extension): refused without the extensions,
/// without the recovery capability granted (the source did not offer it, or
/// the destination has recovery off), inside a window, and with port 0;
/// POSTCOPY_RESUME is refused outside a post-copy recovery connection.
#[test]
fn postcopy_recovery_out_of_place_or_with_port_0_and_resume_unasked_are_refused() {
    let offer = PostcopyRecovery { port: 4791, token: [7; 16] };
    let recovering = || Config { postcopy_recovery: Some(Duration::from_secs(5)), ..Config::default() };
    let recovery = CAP_RDMAMIG_EXT | CAP_RDMAMIG_RECOVERY;
    let mut s = after_blocks(0);
    s.rejects(&message(CommandType::PostcopyRecovery, &[offer]), &["unexpected PostcopyRecovery"]);
    // Offered, not granted: this destination has recovery off.
    let mut s = after_blocks(recovery);
    assert_eq!(s.peer.reply, Capabilities::v1(CAP_RDMAMIG_EXT));
    s.peer.finish_window();
    s.rejects(&message(CommandType::PostcopyRecovery, &[offer]), &["unexpected PostcopyRecovery"]);
    // Not offered, so not granted, though this destination has it on.
    let mut s = start(recovering(), CAP_RDMAMIG_EXT);
    s.peer.ram_blocks();
    s.peer.finish_window();
    s.rejects(&message(CommandType::PostcopyRecovery, &[offer]), &["unexpected PostcopyRecovery"]);
    let mut s = start(recovering(), recovery);
    assert_eq!(s.peer.reply, Capabilities::v1(recovery));
    s.peer.ram_blocks();
    s.rejects(&message(CommandType::PostcopyRecovery, &[offer]), &["unexpected PostcopyRecovery"]);
    let mut s = start(recovering(), recovery);
    s.peer.ram_blocks();
    s.peer.finish_window();
    s.rejects(&message(CommandType::PostcopyRecovery, &[PostcopyRecovery { port: 0, ..offer }]), &["port 0"]);
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.peer.finish_window();
    s.rejects(&raw_message(0, CommandType::PostcopyResume.as_u32(), 0, &[]), &["unexpected PostcopyResume"]);
}

#[test]
fn auth_toward_a_destination_without_a_key_is_refused() {
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.rejects(&message(CommandType::Auth, &[AuthProof { tag: [0; 32] }]), &["unexpected Auth"]);
}

#[test]
fn type_0_none_is_refused() {
    let mut s = after_blocks(0);
    s.rejects(&raw_message(0, 0, 1, &[]), &["type 0 (NONE)"]);
}

// ---- Messages at a step where the destination never expects them ----

#[test]
fn ready_from_the_source_is_refused() {
    let mut s = after_blocks(0);
    s.rejects(&empty(CommandType::Ready), &["unexpected Ready message"]);
}

/// The source's ERROR ends the migration; the destination does not answer it.
#[test]
fn error_from_the_source_ends_without_an_error_back() {
    let mut s = after_blocks(0);
    s.peer.take_ready();
    s.peer.send_raw(0, &empty(CommandType::Error));
    s.dropped(&[ErrorKind::PeerError], &["ERROR message"]);
}

#[test]
fn register_result_sent_to_the_destination_is_refused() {
    let mut s = after_blocks(0);
    let result = RegisterResult { rkey: 0x1234, host_addr: 0 };
    s.rejects(&message(CommandType::RegisterResult, &[result]), &["unexpected RegisterResult message"]);
}

#[test]
fn ram_blocks_result_sent_to_the_destination_is_refused() {
    let mut s = after_blocks(0);
    let block = DestBlock { remote_host_addr: 0, offset: BLOCKS[PC].offset, length: BLOCKS[PC].length, remote_rkey: 0 };
    s.rejects(&message(CommandType::RamBlocksResult, &[block]), &["unexpected RamBlocksResult message"]);
}

#[test]
fn unregister_finished_sent_to_the_destination_is_refused() {
    let mut s = after_blocks(0);
    s.rejects(&empty(CommandType::UnregisterFinished), &["unexpected UnregisterFinished message"]);
}

#[test]
fn end_ack_sent_to_the_destination_is_refused() {
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.rejects(&empty(CommandType::EndAck), &["unexpected EndAck message"]);
}

/// The peer offered the extensions, the destination did not grant them: END is not a command here.
#[test]
fn end_in_qemu_compatible_mode_is_refused() {
    let mut s = start(Config { extensions: false, ..Config::default() }, CAP_RDMAMIG_EXT);
    s.peer.ram_blocks();
    s.peer.finish_window();
    let end = EndSummary { stream_bytes: 0, windows: 1 };
    s.rejects(&message(CommandType::End, &[end]), &["unexpected End message"]);
}

#[test]
fn end_with_a_window_open_is_refused() {
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.peer.finish_window();
    s.peer.register(reg(PC, 0, 0));
    let end = EndSummary { stream_bytes: 0, windows: 1 };
    s.rejects(&message(CommandType::End, &[end]), &["a window still open"]);
}

#[test]
fn end_with_wrong_counts_is_refused() {
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    s.peer.finish_window();
    s.peer.take_ready();
    s.peer.send_file(b"hello");
    let end = EndSummary { stream_bytes: 5, windows: 2 };
    s.rejects(&message(CommandType::End, &[end]), &["after 5 stream bytes and 2 windows, this side has 5 and 1"]);
}

/// QEMU's destination serves a REGISTER that comes before the block list
/// (its blocks are in local order until then); so does ours, in local block
/// order, and only inside the block: nothing to refuse.
#[test]
fn register_before_the_ram_blocks_request_is_served_in_local_block_order() {
    let mut s = start(Config::default(), CAP_RDMAMIG_EXT);
    let r = s.peer.register(reg(VGA, 1, 0));
    let data = pattern(4096, 3);
    let at = MIB + 0x40;
    assert!(s.peer.write(r.host_addr + at, r.rkey, &data).is_success());
    s.written(VGA, at, &data);
    let blocks = s.peer.ram_blocks();
    assert_eq!(r.host_addr, blocks[VGA].remote_host_addr, "block index 1 was the destination's second block");
    s.peer.finish_window();
    s.completes(EndSummary { stream_bytes: 0, windows: 1 });
}

/// QEMU sends RAM_BLOCKS_REQUEST once; a second one, here with the blocks
/// swapped, would change what every block index means under registrations
/// already handed out.
#[test]
fn second_ram_blocks_request_is_refused() {
    let mut s = start(Config::default(), CAP_RDMAMIG_EXT);
    s.peer.take_ready();
    let first = s.peer.request(CommandType::RamBlocksRequest, &block_specs()).expect("RAM_BLOCKS_RESULT");
    assert_eq!(first.kind, CommandType::RamBlocksResult);
    let swapped: Vec<BlockSpec> = block_specs().into_iter().rev().collect();
    s.rejects(&message(CommandType::RamBlocksRequest, &swapped), &["RamBlocksRequest"]);
}

// ---- The READY credits ----

/// Two SENDs back to back on one READY: the second finds no receive posted
/// (unless the destination re-posted in between), and with rnr_retry 0 one
/// side's SEND fails. The destination must notice within a bound, not hang.
#[test]
fn send_without_waiting_for_ready_breaks_the_link_cleanly() {
    let mut s = start(Config::default(), 0);
    s.peer.take_ready();
    // As a source does, one receive for the next READY; none for a third.
    s.peer.post_recvs(1);
    let wcs = s.peer.send_back_to_back(&file_message(b"first"), &file_message(b"second"));
    eprintln!("peer: SEND completions {wcs:#?}");
    s.dropped(&[ErrorKind::Verbs, ErrorKind::Disconnected], &[]);
    let both = b"firstsecond";
    let n = s.dest.stats().stream_bytes as usize;
    assert!(n == 5 || n == both.len(), "{n} stream bytes");
    assert_eq!(read_stream(&s.dest, n), &both[..n]);
}

/// A source that never reads: REGISTER_REQUEST with no receive posted for
/// the REGISTER_RESULT (nor for the next READY). The destination's response
/// finds no receive and fails; it must end, not wait.
#[test]
fn source_that_posts_no_receive_for_a_response_breaks_the_link_cleanly() {
    let mut s = after_blocks(0);
    s.peer.take_ready();
    let len = s.peer.stage(&message(CommandType::RegisterRequest, &[reg(PC, 1, 0)]));
    let wc = s.peer.transmit(len);
    assert!(wc.is_success(), "{wc:?}");
    s.dropped(&[ErrorKind::Verbs], &["control SEND failed"]);
}

// ---- Block indices ----

#[test]
fn register_block_index_out_of_range_is_refused() {
    let mut s = after_blocks(0);
    let r = RegisterRequest { key: addr(PC, 0), block_index: 2, chunks: 0 };
    s.rejects(&message(CommandType::RegisterRequest, &[r]), &["block index 2 out of range (2 blocks)"]);
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

#[test]
fn compress_block_index_out_of_range_is_refused() {
    let mut s = after_blocks(0);
    let z = Compress { block_index: u32::MAX, ..zero(PC, 0, 4 * KIB) };
    s.rejects(&message(CommandType::Compress, &[z]), &["block index 4294967295 out of range (2 blocks)"]);
    assert_eq!(s.dest.stats().zero_chunks, 0);
}

#[test]
fn unregister_block_index_out_of_range_is_refused() {
    let mut s = after_blocks(0);
    s.rejects(&message(CommandType::UnregisterRequest, &[unreg(2, 0)]), &["block index 2 out of range (2 blocks)"]);
}

// ---- REGISTER ranges ----

/// The last (partial) chunk of vga.vram and one more.
#[test]
fn register_range_ending_past_its_block_is_refused() {
    let mut s = after_blocks(0);
    s.rejects(
        &message(CommandType::RegisterRequest, &[reg(VGA, 2, 1)]),
        &["1 more chunks past the end of block 'vga.vram'"],
    );
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

#[test]
fn register_at_an_address_near_u64_max_is_refused() {
    let mut s = after_blocks(0);
    let r = RegisterRequest { key: 0xFFFF_FFFF_FFFF_F000, block_index: PC as u32, chunks: 0 };
    s.rejects(&message(CommandType::RegisterRequest, &[r]), &["0xfffffffffffff000", "outside block 'pc.ram'"]);
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

#[test]
fn register_with_a_chunk_count_that_overflows_is_refused() {
    let mut s = after_blocks(0);
    s.rejects(
        &message(CommandType::RegisterRequest, &[reg(PC, 1, u64::MAX)]),
        &["18446744073709551615 more chunks past the end of block 'pc.ram'"],
    );
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

#[test]
fn register_with_another_blocks_address_is_refused() {
    let mut s = after_blocks(0);
    let r = RegisterRequest { block_index: PC as u32, ..reg(VGA, 0, 0) };
    s.rejects(&message(CommandType::RegisterRequest, &[r]), &["outside block 'pc.ram'"]);
    assert_eq!(s.dest.stats().chunks_registered, 0);
}

// ---- COMPRESS ranges and values ----

/// rdmamig peers (QEMU mode refuses it earlier, as crossing a chunk): the
/// last 4 KiB of pc.ram and 4 KiB of what lies after it.
#[test]
fn compress_range_ending_past_its_block_is_refused() {
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    let z = zero(PC, BLOCKS[PC].length - 4 * KIB, 8 * KIB);
    s.rejects(&message(CommandType::Compress, &[z]), &["outside block 'pc.ram'"]);
    assert_eq!(s.dest.stats().zero_chunks, 0);
}

#[test]
fn compress_range_wrapping_around_u64_is_refused() {
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    let z = Compress { offset: 0xFFFF_FFFF_FFFF_F000, ..zero(PC, 0, 8 * KIB) };
    s.rejects(&message(CommandType::Compress, &[z]), &["range 0xfffffffffffff000+0x2000 lies outside block 'pc.ram'"]);
    assert_eq!(s.dest.stats().zero_chunks, 0);
}

/// QEMU mode: one range inside one chunk, but of pc.ram while naming vga.vram.
#[test]
fn compress_with_another_blocks_address_is_refused() {
    let mut s = after_blocks(0);
    let z = Compress { block_index: VGA as u32, ..zero(PC, 0, 4 * KIB) };
    s.rejects(&message(CommandType::Compress, &[z]), &["outside block 'vga.vram'"]);
    assert_eq!(s.dest.stats().zero_chunks, 0);
}

/// rdmamig peers: every range is checked before any is applied, so the good
/// range before the bad one is not zeroed either.
#[test]
fn compress_with_a_bad_range_after_good_ones_is_refused() {
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    let (good_at, good_len) = (MIB, 64 * KIB);
    let bad = zero(VGA, BLOCKS[VGA].length, 4 * KIB);
    s.rejects(&message(CommandType::Compress, &[zero(PC, good_at, good_len), bad]), &["outside block 'vga.vram'"]);
    assert_eq!(s.dest.stats().zero_chunks, 0);
}

#[test]
fn compress_with_a_nonzero_value_is_refused() {
    let mut s = after_blocks(0);
    let z = Compress { value: 0xAB, ..zero(PC, 0, 4 * KIB) };
    s.rejects(&message(CommandType::Compress, &[z]), &["COMPRESS entry with non-zero fill value 171"]);
    assert_eq!(s.dest.stats().zero_chunks, 0);
}

// ---- UNREGISTER ----

/// Chunk 2 of pc.ram holds no registration: refusing names the chunk.
/// (Expected behaviour being implemented separately: the destination used to
/// answer UNREGISTER_FINISHED.)
#[test]
fn unregister_of_a_chunk_never_registered_is_refused() {
    let mut s = after_blocks(0);
    s.rejects(&message(CommandType::UnregisterRequest, &[unreg(PC, 2)]), &["chunk 2"]);
    assert_eq!(s.dest.stats().unpins, 0);
}

/// vga.vram has 3 chunks (0..=2).
#[test]
fn unregister_of_a_chunk_past_its_block_is_refused() {
    let mut s = after_blocks(0);
    s.rejects(
        &message(CommandType::UnregisterRequest, &[unreg(VGA, 3)]),
        &["unregister of chunk 3 past the end of block 'vga.vram'"],
    );
}

// ---- The block list (rdmamig extension: names and lengths in RAM_BLOCKS_REQUEST) ----

/// The source lists `specs`; the destination answers RAM_BLOCKS_RESULT with
/// `lengths` (the source fails on the count, or on a length, too), then
/// ERROR, and ends with `kind`.
fn block_list_refused_with(specs: &[BlockSpec], lengths: &[u64], kind: ErrorKind, words: &[&str]) {
    let mut s = start(Config::default(), CAP_RDMAMIG_EXT);
    s.peer.take_ready();
    let m = s.peer.request(CommandType::RamBlocksRequest, specs).expect("RAM_BLOCKS_RESULT");
    assert_eq!((m.kind, m.bytes.len()), (CommandType::RamBlocksResult, 16 + 32 * lengths.len()), "{m:?}");
    let blocks: Vec<DestBlock> = m.entries();
    let only_lengths: Vec<DestBlock> =
        lengths.iter().map(|&length| DestBlock { length, ..DestBlock::default() }).collect();
    assert_eq!(blocks, only_lengths, "the lengths alone: no address, no key");
    s.refused(kind, words);
}

/// The same, with an empty RAM_BLOCKS_RESULT.
fn block_list_refused(specs: &[BlockSpec], kind: ErrorKind, words: &[&str]) {
    block_list_refused_with(specs, &[], kind, words)
}

fn spec(name: &str, length: u64) -> BlockSpec {
    BlockSpec::new(name, length).expect("valid name")
}

#[test]
fn block_list_with_fewer_blocks_is_refused() {
    block_list_refused(&block_specs()[..1], ErrorKind::BlockMismatch, &["the source has 1 blocks, this side 2"]);
}

#[test]
fn block_list_with_more_blocks_is_refused() {
    let mut specs = block_specs();
    specs.push(spec("pc.bios", 256 * KIB));
    block_list_refused(&specs, ErrorKind::BlockMismatch, &["the source has 3 blocks, this side 2", "\"pc.bios\""]);
}

#[test]
fn block_list_with_a_wrong_length_is_refused() {
    let specs = [spec("pc.ram", 4 * MIB), spec("vga.vram", 3 * MIB)];
    block_list_refused_with(
        &specs,
        &[4 * MIB, 5 * MIB / 2],
        ErrorKind::BlockMismatch,
        &["block 'vga.vram' has length 0x300000 on the source and 0x280000 here"],
    );
}

#[test]
fn block_list_with_an_unknown_name_is_refused() {
    let specs = [spec("pc.ram", 4 * MIB), spec("nvdimm0", 5 * MIB / 2)];
    block_list_refused(&specs, ErrorKind::BlockMismatch, &["not found here: [\"nvdimm0\"]"]);
}

#[test]
fn block_list_naming_a_block_twice_is_refused() {
    let specs = [spec("pc.ram", 4 * MIB), spec("pc.ram", 4 * MIB)];
    block_list_refused(&specs, ErrorKind::Protocol, &["named block 'pc.ram' twice"]);
}

/// A name filling all 248 bytes of its field, with no NUL: refused when the
/// message is read, before any block is matched (so no RAM_BLOCKS_RESULT).
#[test]
fn block_list_with_an_unterminated_name_is_refused() {
    let mut s = start(Config::default(), CAP_RDMAMIG_EXT);
    let mut entry = encoded(&block_specs()[..1]);
    entry[8..].fill(b'x');
    let mut payload = entry;
    payload.extend(encoded(&block_specs()[1..]));
    let m = raw_message(payload.len() as u32, CommandType::RamBlocksRequest.as_u32(), 2, &payload);
    s.rejects(&m, &["not NUL-terminated"]);
}

// ---- Private data ----

/// The destination rejects the connect (QEMU would just drop it), the reject
/// carrying its own version so the source can tell why, and `accept` fails
/// with Version naming both.
fn version_refused(version: u32) {
    let d = dial(Config::default(), Capabilities { version, flags: 0 });
    let refusal = d.peer.as_ref().err().expect("the connect must be refused");
    eprintln!("peer: {refusal:?}");
    assert_eq!(refusal.kind, CmEventKind::Rejected);
    assert_eq!(Capabilities::decode(&refusal.private_data).map(|c| c.version), Ok(1), "our version in the reject");
    let err = d.dest.as_ref().err().expect("accept must fail");
    assert_eq!(err.kind, ErrorKind::Version, "{err}");
    assert!(err.message.contains(&format!("version {version}, we speak 1")), "{err}");
    d.ram.check_canaries();
    d.ram.check_blocks(&[]);
}

#[test]
fn connect_with_version_2_is_rejected_with_our_version() {
    version_refused(2);
}

#[test]
fn connect_with_version_0_is_rejected_with_our_version() {
    version_refused(0);
}

/// Unknown bits are cleared, as QEMU does, and the reply echoes what was
/// kept: nothing of 0x7FFFFFFE (a QEMU-compatible connection), only the
/// extension of 0xFFFFFFFF (this destination does not allow pin-all). Each
/// connection then works, and ends as its mode ends.
#[test]
fn unknown_capability_flags_are_masked_away() {
    for (offered, kept) in [(0x7FFF_FFFE, 0), (u32::MAX, CAP_RDMAMIG_EXT)] {
        let mut s = start(Config::default(), offered);
        let extensions = kept == CAP_RDMAMIG_EXT;
        assert_eq!(s.peer.reply, Capabilities::v1(kept), "offered {offered:#x}");
        let negotiated = Negotiated { pin_all: false, extensions, authenticated: false, postcopy_recovery: false };
        assert_eq!(s.dest.negotiated(), negotiated);
        s.peer.ram_blocks();
        s.peer.finish_window();
        if extensions {
            s.completes(EndSummary { stream_bytes: 0, windows: 1 });
        } else {
            assert_eq!(s.peer_leaves(), Ok(Ending::Unverified));
        }
    }
}

// ---- Flow control ----

/// The hypervisor never reads the stream: the destination stops granting
/// READY once 256 MiB are buffered, so the peer is held back (at most one
/// message past the limit) instead of the buffer growing; a read brings the
/// credit back.
#[test]
fn stream_flood_without_reading_is_held_back_at_256_mib() {
    let mut s = start(Config::default(), 0);
    let chunk = vec![0x3C; MAX_PAYLOAD];
    let t = Instant::now();
    let mut sent = 0u64;
    // Below the limit every message gets its credit (`take_ready` waits up to 10 s, however slow the link).
    while sent < STREAM_LIMIT {
        s.peer.take_ready();
        s.peer.send_file(&chunk);
        sent += chunk.len() as u64;
    }
    // The last message crossed the limit: no credit now.
    let late = s.peer.recv_any(CREDIT_STOPPED_AFTER);
    let buffered = s.dest.stats().stream_bytes;
    eprintln!("peer: {sent} bytes sent in {:?}; the destination buffered {buffered}; then got {late:?}", t.elapsed());
    assert!(late.is_none(), "a credit past the limit: {late:?}");
    assert_eq!(buffered, sent, "every byte sent is buffered, nothing more");
    assert!(buffered < STREAM_LIMIT + MAX_PAYLOAD as u64, "{buffered} bytes: more than one message past the limit");
    // The hypervisor reads: the READY comes, into the receive the peer posted with its last message.
    assert!(read_stream(&s.dest, MIB as usize).iter().all(|&b| b == 0x3C));
    s.rejects(&empty(CommandType::Ready), &["unexpected Ready message"]);
}

// ---- RDMA WRITE outside what is registered ----

/// The source unregisters a chunk and the worker deregisters it: a WRITE
/// with the old key fails at the destination's NIC and lands nowhere, and
/// the connection breaks (the NIC moves the QP to the error state).
#[test]
fn write_with_a_stale_rkey_after_unregistration_fails() {
    let mut s = after_blocks(CAP_RDMAMIG_EXT);
    let r = s.peer.register(reg(PC, 1, 0));
    let at = MIB + 0x100;
    let data = pattern(4096, 4);
    assert!(s.peer.write(r.host_addr + at, r.rkey, &data).is_success(), "the key works while registered");
    s.written(PC, at, &data);
    s.peer.take_ready();
    let m = s.peer.request(CommandType::UnregisterRequest, &[unreg(PC, 1)]).expect("UNREGISTER_FINISHED");
    assert_eq!((m.kind, m.repeat), (CommandType::UnregisterFinished, 1), "{m:?}");
    // The worker deregisters on its own thread: wait until the MR is gone.
    s.dest.unregistration().expect("the unregistration worker").flush();
    assert_eq!(s.dest.stats().unpins, 1);
    let wc = s.peer.write(r.host_addr + at, r.rkey, &pattern(4096, 5));
    eprintln!("peer: WRITE with the stale key: {wc:?}");
    assert_eq!(wc.status_str(), "remote access error", "{wc:?}");
    s.dropped(&[ErrorKind::Verbs], &["control RECV failed"]);
}

/// A valid key, written beyond the registration it belongs to: across the
/// end of chunk 1, in chunk 2 of the same block, and below the block (its
/// canary) with the key of chunk 0. Each fails at the NIC and lands nowhere.
#[test]
fn write_outside_the_registered_chunk_fails() {
    let targets: [(&str, u64, i64, usize); 3] = [
        ("across the end of chunk 1", 1, 2 * MIB as i64 - 8, 16),
        ("in chunk 2", 1, 2 * MIB as i64, 4096),
        ("in the canary below the block", 0, -4096, 4096),
    ];
    for (what, chunk, at, len) in targets {
        eprintln!("WRITE {what}");
        let mut s = after_blocks(0);
        let r = s.peer.register(reg(PC, chunk, 0));
        let wc = s.peer.write(r.host_addr.wrapping_add_signed(at), r.rkey, &pattern(len, 6));
        eprintln!("peer: {wc:?}");
        assert_eq!(wc.status_str(), "remote access error", "{what}: {wc:?}");
        s.dropped(&[ErrorKind::Verbs], &["control RECV failed"]);
    }
}

// ---- post-copy: no key left to write with ----

/// How long the test holds the unregistration worker while post-copy
/// starts (post-copy must not report running meanwhile).
const WORKER_HELD: Duration = Duration::from_secs(2);

/// A key the destination gave the peer, and where in its block the peer writes with it.
struct GivenKey {
    what: &'static str,
    block: usize,
    at: u64,
    /// The block's address in the destination's process, as given with the key.
    host_addr: u64,
    rkey: u32,
}

/// The keys a peer past the RAM-block exchange gets for writing: under
/// pin-all one per block (RAM_BLOCKS_RESULT), else one per REGISTER
/// (chunk 1 of pc.ram; chunks 0 and 1 of vga.vram).
fn keys_given(peer: &mut Peer, blocks: &[DestBlock]) -> Vec<GivenKey> {
    if peer.reply.pin_all() {
        let whole = |what, block, at| {
            let b: &DestBlock = &blocks[block];
            GivenKey { what, block, at, host_addr: b.remote_host_addr, rkey: b.remote_rkey }
        };
        return vec![
            whole("pin-all's key of pc.ram", PC, MIB + 0x100),
            whole("pin-all's key of vga.vram", VGA, 2 * MIB),
        ];
    }
    let chunk = peer.register(reg(PC, 1, 0));
    let chunks = peer.register(reg(VGA, 0, 1));
    vec![
        GivenKey {
            what: "the key of chunk 1 of pc.ram",
            block: PC,
            at: MIB + 0x100,
            host_addr: chunk.host_addr,
            rkey: chunk.rkey,
        },
        GivenKey {
            what: "the key of chunks 0-1 of vga.vram",
            block: VGA,
            at: MIB + 0x300,
            host_addr: chunks.host_addr,
            rkey: chunks.rkey,
        },
    ]
}

/// A peer's post-copy of one stale page of pc.ram: its table (bitmap and
/// one region) and the page's content, readable by the destination.
/// `mr` is declared first so it is deregistered before the memory is freed.
struct StalePage {
    mr: MemoryRegion,
    _mem: Box<[u8]>,
    content: Vec<u8>,
}

impl StalePage {
    /// The stale page: page 2 of pc.ram.
    const AT: u64 = 2 * 4096;

    fn new(pd: &Arc<ProtectionDomain>) -> StalePage {
        let words = (BLOCKS[PC].length / 4096).div_ceil(64) as usize;
        // The table in the first page, the content in the second.
        let mut mem = vec![0u8; 2 * 4096].into_boxed_slice();
        // SAFETY: `mem` moves into the same struct and outlives `mr` (field order).
        let mr = unsafe { pd.register(mem.as_mut_ptr(), mem.len(), Access::REMOTE_READ) }.expect("register");
        mem[..8].copy_from_slice(&(1u64 << (Self::AT / 4096)).to_be_bytes());
        let region = PostcopyRegion { offset: Self::AT, length: 4096, remote_addr: mr.addr() + 4096, rkey: mr.rkey() };
        region.encode(&mut mem[words * 8..]);
        let content = pattern(4096, 8);
        mem[4096..].copy_from_slice(&content);
        StalePage { mr, _mem: mem, content }
    }

    /// The POSTCOPY entry of pc.ram.
    fn entry(&self) -> PostcopyBlock {
        PostcopyBlock {
            block_index: PC as u32,
            regions: 1,
            length: BLOCKS[PC].length,
            stale_pages: 1,
            table_addr: self.mr.addr(),
            table_rkey: self.mr.rkey(),
        }
    }
}

/// Once the destination reports post-copy running (its guest may run and
/// change any page), no key it gave the source lets the source write: the
/// registrations the source wrote into (pin-all's whole blocks, or its
/// REGISTERed chunks) go to the process's unregistration worker at
/// POSTCOPY, and post-copy reports running only once they are deregistered.
/// The test holds the worker while POSTCOPY arrives (a job of its own,
/// queued first, waits for it): post-copy must not report running until it
/// lets go (if it does, the test writes with the key then and says whether
/// the WRITE landed in the guest's RAM). Then a WRITE with the key fails at
/// the destination's NIC (remote access error) and lands nowhere. One
/// session per key: the failed WRITE breaks the connection. It comes once
/// post-copy is done (its one stale page is in place), so the broken
/// connection fails no post-copy (which would leave pc.ram PROT_NONE, out of
/// the RAM check's reach).
#[test]
fn postcopy_running_leaves_the_source_no_key_to_write_with() {
    for (pin_all, key) in [(true, 0), (true, 1), (false, 0), (false, 1)] {
        let flags = CAP_RDMAMIG_EXT | if pin_all { CAP_PIN_ALL } else { 0 };
        let mut s = start(Config { pin_all, ..Config::default() }, flags);
        assert_eq!(s.peer.reply.pin_all(), pin_all);
        let blocks = s.peer.ram_blocks();
        let keys = keys_given(&mut s.peer, &blocks);
        for (i, k) in keys.iter().enumerate() {
            let data = pattern(4096, i as u32);
            let wc = s.peer.write(k.host_addr + k.at, k.rkey, &data);
            assert!(wc.is_success(), "{} works before post-copy: {wc:?}", k.what);
            s.written(k.block, k.at, &data);
        }
        s.peer.finish_window();
        let stale = StalePage::new(&s.peer.pd);
        let ControlBuffer { mr: stall, mem: _stall_mem } = ControlBuffer::new(&s.peer.pd, 4096);
        let (let_go, held) = mpsc::channel::<()>();
        s.dest.unregistration().expect("the unregistration worker").release(stall, move || {
            let _ = held.recv();
        });
        s.peer.take_ready();
        s.peer.send_raw(1, &message(CommandType::Postcopy, &[stale.entry()]));
        let k = &keys[key];
        match s.dest.wait_postcopy(PostcopyPhase::Running, Some(WORKER_HELD)) {
            Err(e) => assert_eq!(e.kind, ErrorKind::Timeout, "{e}"),
            Ok(running) => {
                let data = pattern(4096, 9);
                let wc = s.peer.write(k.host_addr + k.at, k.rkey, &data);
                let landed = s.ram.block(k.block)[k.at as usize..][..data.len()] == data;
                panic!(
                    "post-copy runs ({running:?}) though the source's registrations wait for the unregistration \
                     worker: a WRITE with {} now: {wc:?}, in the guest's RAM: {landed}",
                    k.what
                );
            }
        }
        drop(let_go);
        let done = s.dest.wait_postcopy(PostcopyPhase::Done, Some(TIMEOUT)).expect("post-copy");
        assert_eq!((done.pages_total, done.pages_remaining), (1, 0), "{done:?}");
        s.peer.expect(CommandType::PostcopyDone);
        s.written(PC, StalePage::AT, &stale.content);
        let wc = s.peer.write(k.host_addr + k.at, k.rkey, &pattern(4096, 9));
        eprintln!("peer: WRITE with {} after post-copy ran: {wc:?}", k.what);
        assert_eq!(wc.status_str(), "remote access error", "{}: {wc:?}", k.what);
        s.dropped(&[ErrorKind::Verbs], &["control RECV failed"]);
    }
}
