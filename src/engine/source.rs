//! The source side: a hypervisor thread hands RAM ranges and stream bytes to
//! the transfer thread through a lock-free queue; the transfer thread owns the
//! connection, registers chunks, posts RDMA WRITEs and sends control messages.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::Instant;

use crossbeam_queue::ArrayQueue;
use parking_lot::RwLock;

use crate::engine::link::{protocol_error as protocol, Link, Negotiated};
use crate::engine::ram::{chunk_of, RamBlocks};
use crate::engine::stats::{Counters, Stats};
use crate::engine::sync::{Done, StickyError};
use crate::engine::validate::MAX_COMPRESS_BYTES;
use crate::engine::{is_zero, Config, Ending};
use crate::verbs::{Access, MemoryRegion, Sge};
use crate::wire::{
    BlockSpec, CommandType, Compress, DestBlock, EndSummary, RegisterRequest, RegisterResult, CHUNK_SIZE, MAX_PAYLOAD,
    MAX_REPEAT, SEND_INCREMENT,
};
use crate::{Error, ErrorKind, Result};

/// Writes in flight at most (bytes and work requests): rxe collapses under deep queues.
const MAX_INFLIGHT_BYTES: u64 = 16 << 20;
const MAX_INFLIGHT_WRITES: usize = 256;
/// One write is signalled every this many writes or bytes; the rest complete
/// silently. The unsignalled tail therefore always fits under the limits above.
const SIGNAL_EVERY: u64 = 16;
const SIGNAL_EVERY_BYTES: u64 = MAX_INFLIGHT_BYTES / 4;
/// Chunks per REGISTER_REQUEST toward an rdmamig peer (QEMU takes one).
const REGISTER_BATCH: usize = 256;
/// Largest single RDMA WRITE when both sides registered whole blocks (rdmamig peers).
const LARGE_WRITE: u64 = 4 << 20;
/// Ranges being merged at once: saves from several hypervisor threads interleave.
const MERGE_SLOTS: usize = 4;
/// Zero ranges per COMPRESS message toward an rdmamig peer (QEMU applies one).
const ZERO_BATCH: usize = 1024;
/// Commands queued at most: `save` waits for room rather than let memory grow
/// with the guest when the transfer thread falls behind.
const QUEUE_CAPACITY: usize = 1 << 16;

enum Command {
    Save {
        block: u32,
        offset: u64,
        len: u64,
    },
    Stream(Vec<u8>),
    /// Everything queued before has been sent.
    Sync(Arc<Done>),
    /// Close the window: all writes complete, then REGISTER_FINISHED.
    EndIteration(Arc<Done>),
    /// The completion handshake (rdmamig peers): END, then wait for END_ACK.
    End(Arc<Done>),
}

impl Command {
    fn done(&self) -> Option<&Arc<Done>> {
        match self {
            Command::Sync(d) | Command::EndIteration(d) | Command::End(d) => Some(d),
            _ => None,
        }
    }
}

struct Shared {
    queue: ArrayQueue<Command>,
    engine: OnceLock<Thread>,
    error: StickyError,
    counters: Arc<Counters>,
    closing: AtomicBool,
}

impl Shared {
    /// Queues `cmd`, waiting while the queue is full; fails with the stored
    /// error if the transfer thread has stopped.
    fn push(&self, mut cmd: Command) -> Result<()> {
        loop {
            self.error.check()?;
            match self.queue.push(cmd) {
                Ok(()) => break,
                Err(back) => {
                    cmd = back;
                    self.wake();
                    thread::sleep(std::time::Duration::from_micros(50));
                }
            }
        }
        self.wake();
        Ok(())
    }

    fn wake(&self) {
        if let Some(t) = self.engine.get() {
            t.unpark();
        }
    }
}

/// The source end of a migration connection.
///
/// Thread safety: `save` may be called from several threads at once, and
/// alongside `iteration_end`; the other methods take `&mut self` and so run
/// from one thread at a time.
pub struct Source {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    ram: RamBlocks,
    negotiated: Negotiated,
    stop: Arc<AtomicBool>,
    /// Whether an iteration window is open. `save` holds it shared while it
    /// checks and queues, `iteration_end` exclusively while it closes the
    /// window, so a save is either queued before REGISTER_FINISHED or refused.
    in_window: RwLock<bool>,
    outgoing: Vec<u8>,
}

impl Source {
    /// Connects to a destination listening on `host:port` and starts the transfer thread.
    pub fn connect(host: &str, port: u16, config: &Config, ram: &RamBlocks) -> Result<Source> {
        if ram.is_empty() {
            return Err(Error::new(ErrorKind::InvalidArgument, "the RAM block registry is empty"));
        }
        let counters = Arc::new(Counters::default());
        let link = Link::connect(host, port, config, counters.clone())?;
        let shared = Arc::new(Shared {
            queue: ArrayQueue::new(QUEUE_CAPACITY),
            engine: OnceLock::new(),
            error: StickyError::default(),
            counters,
            closing: AtomicBool::new(false),
        });
        let negotiated = link.negotiated;
        let stop = link.stop.clone();
        let engine = Engine::new(link, ram.clone(), shared.clone());
        let thread = thread::Builder::new()
            .name("rdmamig-source".into())
            .spawn(move || engine.run())
            .map_err(|e| Error::new(ErrorKind::State, format!("cannot start the transfer thread: {e}")))?;
        let _ = shared.engine.set(thread.thread().clone());
        Ok(Source {
            shared,
            thread: Some(thread),
            ram: ram.clone(),
            negotiated,
            stop,
            in_window: RwLock::new(false),
            outgoing: Vec::new(),
        })
    }

    /// What the two sides agreed on (pin-all, rdmamig extensions).
    pub fn negotiated(&self) -> Negotiated {
        self.negotiated
    }

    /// Opens an iteration window: `save` calls are legal until `iteration_end`.
    /// Stream bytes `put` so far go out first (a QEMU destination must see the
    /// hook marker before any registration message). The first window also
    /// exchanges the RAM-block lists.
    pub fn iteration_begin(&mut self) -> Result<()> {
        self.shared.error.check()?;
        if *self.in_window.get_mut() {
            return Err(Error::new(ErrorKind::State, "an iteration window is already open"));
        }
        self.queue_stream(true)?;
        *self.in_window.get_mut() = true;
        Ok(())
    }

    /// Queues `len` bytes at `offset` of block `block` for transfer and returns at once.
    pub fn save(&self, block: u32, offset: u64, len: u64) -> Result<()> {
        self.shared.error.check()?;
        self.ram.get(block)?.check_range(offset, len)?;
        let in_window = self.in_window.read();
        if !*in_window {
            return Err(Error::new(ErrorKind::State, "save outside an iteration window"));
        }
        if len > 0 {
            self.shared.push(Command::Save { block, offset, len })?;
        }
        Ok(())
    }

    /// Closes the window: waits until every write of it has completed, then
    /// tells the destination (REGISTER_FINISHED). May race `save` calls from
    /// other threads: each is queued before REGISTER_FINISHED or refused.
    pub fn iteration_end(&self) -> Result<()> {
        // Waits for saves still queueing; later ones see the window closed.
        if !std::mem::replace(&mut *self.in_window.write(), false) {
            return Err(Error::new(ErrorKind::State, "no iteration window is open"));
        }
        let start = Instant::now();
        let r = self.call(Command::EndIteration);
        Counters::add(&self.shared.counters.iteration_end_ns, start.elapsed().as_nanos() as u64);
        r
    }

    /// Appends device-state bytes to the stream (sent in QEMU_FILE messages).
    /// Inside an iteration window they are held back until the window ends:
    /// QEMU's destination accepts no stream message inside one.
    pub fn put(&mut self, data: &[u8]) -> Result<()> {
        self.shared.error.check()?;
        self.outgoing.extend_from_slice(data);
        if !*self.in_window.get_mut() {
            self.queue_stream(false)?;
        }
        Ok(())
    }

    /// Sends every byte `put` so far and waits until it is out. Not inside an
    /// iteration window (see `put`).
    pub fn flush(&mut self) -> Result<()> {
        if *self.in_window.get_mut() {
            return Err(Error::new(ErrorKind::State, "flush inside an iteration window: end the window first"));
        }
        self.queue_stream(true)?;
        self.call(Command::Sync)
    }

    /// Queues the buffered stream bytes as messages: whole pieces only, or all.
    fn queue_stream(&mut self, all: bool) -> Result<()> {
        let piece = if self.negotiated.extensions { MAX_PAYLOAD } else { SEND_INCREMENT };
        let whole = if all { self.outgoing.len() } else { self.outgoing.len() / piece * piece };
        for chunk in self.outgoing[..whole].chunks(piece) {
            self.shared.push(Command::Stream(chunk.to_vec()))?;
        }
        self.outgoing.drain(..whole);
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// The stored error, if the connection failed.
    pub fn error(&self) -> Option<Error> {
        self.shared.error.get()
    }

    /// Aborts the migration: every later call fails with `Aborted` at once;
    /// the transfer thread sends ERROR and tears down.
    pub fn abort(&self) {
        self.shared.error.set(Error::new(ErrorKind::Aborted, "the migration was aborted by the hypervisor"));
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.shared.engine.get() {
            t.unpark();
        }
    }

    /// Ends an open window, flushes the stream, waits for queued work, and
    /// disconnects. With an rdmamig destination it first runs the completion
    /// handshake: [`Ending::Completed`] means the destination checked and
    /// acknowledged that it has everything. A QEMU destination has no
    /// handshake: [`Ending::Unverified`] means everything was sent and every
    /// write completed, but only QEMU itself knows whether it loaded it.
    pub fn close(mut self) -> Result<Ending> {
        let r = if *self.in_window.get_mut() { self.iteration_end() } else { Ok(()) };
        let r = r.and_then(|()| self.flush()).and_then(|()| {
            if self.negotiated.extensions {
                self.call(Command::End).map(|()| Ending::Completed)
            } else {
                Ok(Ending::Unverified)
            }
        });
        self.shutdown();
        r
    }

    fn call(&self, make: impl FnOnce(Arc<Done>) -> Command) -> Result<()> {
        let done = Arc::new(Done::default());
        self.shared.push(make(done.clone()))?;
        done.wait(|| self.shared.error.get())
    }

    fn shutdown(&mut self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A contiguous range within one write unit (a chunk, or a larger span with pin-all).
#[derive(Clone, Copy, Debug)]
struct Piece {
    block: u32,
    offset: u64,
    len: u64,
    /// End of the write unit: the piece may grow up to here.
    limit: u64,
}

#[derive(Default)]
struct ChunkState {
    remote_rkey: Option<u32>,
    /// Asked for in the next REGISTER_REQUEST.
    awaiting: bool,
    local: Option<MemoryRegion>,
}

struct BlockState {
    /// The destination's host address of the block start, and its offset in its RAM address space.
    remote_base: u64,
    dest_offset: u64,
    /// Pin-all: whole-block keys on both sides.
    remote_rkey: Option<u32>,
    local: Option<MemoryRegion>,
    chunks: Vec<ChunkState>,
}

struct Engine {
    link: Link,
    ram: RamBlocks,
    shared: Arc<Shared>,
    blocks: Vec<BlockState>,
    blocks_exchanged: bool,
    /// Ranges still growing by merging with the next saves, oldest first.
    pending: Vec<Piece>,
    /// Zero ranges for the next COMPRESS message (rdmamig peers only), and their bytes.
    zeros: Vec<Compress>,
    zero_bytes: u64,
    /// Writes waiting for their chunk's registration, in arrival order.
    deferred: Vec<Piece>,
    to_register: Vec<(u32, usize)>,
    /// (sequence, bytes) of posted writes not known to be complete.
    inflight: VecDeque<(u64, u64)>,
    inflight_bytes: u64,
    signalled: VecDeque<u64>,
    /// Writes and bytes posted since the last signalled write.
    unsignalled: (u64, u64),
}

impl Engine {
    fn new(link: Link, ram: RamBlocks, shared: Arc<Shared>) -> Engine {
        let blocks = ram
            .blocks()
            .iter()
            .map(|b| BlockState {
                remote_base: 0,
                dest_offset: 0,
                remote_rkey: None,
                local: None,
                chunks: (0..b.chunk_count()).map(|_| ChunkState::default()).collect(),
            })
            .collect();
        Engine {
            link,
            ram,
            shared,
            blocks,
            blocks_exchanged: false,
            pending: Vec::with_capacity(MERGE_SLOTS),
            zeros: Vec::new(),
            zero_bytes: 0,
            deferred: Vec::new(),
            to_register: Vec::new(),
            inflight: VecDeque::new(),
            inflight_bytes: 0,
            signalled: VecDeque::new(),
            unsignalled: (0, 0),
        }
    }

    fn run(mut self) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()))
            .unwrap_or_else(|_| Err(Error::new(ErrorKind::State, "the transfer thread panicked")));
        let ended = match result {
            Ok(()) => Error::new(ErrorKind::Aborted, "the connection is closed"),
            Err(e) => {
                if !matches!(e.kind, ErrorKind::PeerError | ErrorKind::Disconnected) {
                    self.link.send_error();
                }
                e
            }
        };
        // Later calls see the stored error; so does whatever still waits in the queue.
        let stored = self.shared.error.set(ended);
        while let Some(cmd) = self.shared.queue.pop() {
            if let Some(d) = cmd.done() {
                d.set(Err(stored.clone()));
            }
        }
        // Dropping `self` deregisters every MR and destroys the QP, CQ and ids.
        self.shared.counters.pinned_bytes.store(0, Ordering::Relaxed);
    }

    fn serve(&mut self) -> Result<()> {
        loop {
            if self.link.stop.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Aborted, "the migration was aborted by the hypervisor"));
            }
            match self.shared.queue.pop() {
                Some(cmd) => {
                    let done = cmd.done().cloned();
                    let last = matches!(cmd, Command::End(_));
                    if let Err(e) = self.handle(cmd) {
                        if let Some(d) = done {
                            d.set(Err(e.clone()));
                        }
                        return Err(e);
                    }
                    if last {
                        return Ok(());
                    }
                }
                None => {
                    // Idle: post what is pending rather than wait for more to merge.
                    self.flush_pending()?;
                    self.register_deferred()?;
                    if self.shared.closing.load(Ordering::Relaxed) && self.shared.queue.is_empty() {
                        return Ok(());
                    }
                    thread::park_timeout(std::time::Duration::from_millis(100));
                    self.link.tend()?;
                }
            }
        }
    }

    fn handle(&mut self, cmd: Command) -> Result<()> {
        match cmd {
            Command::Save { block, offset, len } => {
                self.exchange_blocks()?;
                self.save(block, offset, len)
            }
            Command::Stream(data) => {
                self.link.post_message(CommandType::QemuFile, |w| w.push_bytes(&data))?;
                Counters::add(&self.shared.counters.stream_bytes, data.len() as u64);
                Ok(())
            }
            Command::Sync(done) => {
                done.set(Ok(()));
                Ok(())
            }
            Command::EndIteration(done) => {
                self.exchange_blocks()?;
                self.flush_pending()?;
                self.register_deferred()?;
                // The SEND completes after every write posted before it (in-order send queue).
                self.link.post_message(CommandType::RegisterFinished, |_| Ok(()))?;
                self.retire_completed();
                Counters::add(&self.shared.counters.iterations, 1);
                done.set(Ok(()));
                Ok(())
            }
            Command::End(done) => {
                // What END counts comes from this thread's own counters: it sent all of it.
                let stats = self.shared.counters.snapshot();
                let summary = EndSummary { stream_bytes: stats.stream_bytes, windows: stats.iterations };
                self.link.request(CommandType::End, |w| w.push(&summary), CommandType::EndAck, |_| Ok(()))?;
                done.set(Ok(()));
                Ok(())
            }
        }
    }

    /// RAM_BLOCKS_REQUEST/RESULT, once, before the first RAM goes out.
    fn exchange_blocks(&mut self) -> Result<()> {
        if self.blocks_exchanged {
            return Ok(());
        }
        self.blocks_exchanged = true;
        let pin_all = self.link.negotiated.pin_all;
        if pin_all {
            for (b, state) in self.ram.blocks().iter().zip(&mut self.blocks) {
                // SAFETY: the hypervisor keeps registered blocks mapped for the connection's life.
                state.local =
                    Some(unsafe { self.link.pd.register(b.host_ptr(0), b.length as usize, Access::LOCAL_WRITE)? });
                self.shared.counters.pin(b.length);
            }
        }
        let specs: Vec<BlockSpec> = if self.link.negotiated.extensions {
            self.ram
                .blocks()
                .iter()
                .map(|b| BlockSpec::new(&b.name, b.length))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::new(ErrorKind::InvalidArgument, e.to_string()))?
        } else {
            Vec::new()
        };
        let theirs: Vec<DestBlock> = self.link.request(
            CommandType::RamBlocksRequest,
            |w| specs.iter().try_for_each(|s| w.push(s)),
            CommandType::RamBlocksResult,
            |m| m.collect_entries::<DestBlock>().map_err(protocol),
        )?;
        Counters::add(&self.shared.counters.registration_round_trips, 1);
        if theirs.len() != self.ram.len() {
            return Err(Error::new(
                ErrorKind::BlockMismatch,
                format!("RAM blocks mismatch: {} here, {} on the destination", self.ram.len(), theirs.len()),
            ));
        }
        for ((ours, dest), state) in self.ram.blocks().iter().zip(&theirs).zip(&mut self.blocks) {
            if ours.length != dest.length {
                return Err(Error::new(
                    ErrorKind::BlockMismatch,
                    format!(
                        "block '{}' has length {:#x} here and {:#x} on the destination",
                        ours.name, ours.length, dest.length
                    ),
                ));
            }
            state.remote_base = dest.remote_host_addr;
            state.dest_offset = dest.offset;
            if pin_all {
                state.remote_rkey = Some(dest.remote_rkey);
            }
        }
        Ok(())
    }

    /// End (exclusive, relative to the block) of the write unit holding `offset`.
    fn unit_end(&self, block: u32, offset: u64) -> u64 {
        let unit =
            if self.link.negotiated.pin_all && self.link.negotiated.extensions { LARGE_WRITE } else { CHUNK_SIZE };
        ((offset / unit + 1) * unit).min(self.ram.blocks()[block as usize].length)
    }

    fn save(&mut self, block: u32, mut offset: u64, len: u64) -> Result<()> {
        let end = offset + len;
        while offset < end {
            let limit = self.unit_end(block, offset);
            let piece_end = limit.min(end);
            let grows = self
                .pending
                .iter_mut()
                .find(|p| p.block == block && p.offset + p.len == offset && piece_end <= p.limit);
            if let Some(p) = grows {
                p.len = piece_end - p.offset;
            } else {
                if self.pending.len() == MERGE_SLOTS {
                    let oldest = self.pending.remove(0);
                    self.send_piece(oldest)?;
                }
                self.pending.push(Piece { block, offset, len: piece_end - offset, limit });
            }
            offset = piece_end;
        }
        Ok(())
    }

    /// Sends every range still merging.
    fn flush_pending(&mut self) -> Result<()> {
        for p in std::mem::take(&mut self.pending) {
            self.send_piece(p)?;
        }
        Ok(())
    }

    /// Sends one merged range: a write, a COMPRESS, or a deferral until its chunk is registered.
    fn send_piece(&mut self, p: Piece) -> Result<()> {
        if self.link.negotiated.pin_all {
            return self.write(p);
        }
        let chunk = chunk_of(p.offset);
        let dest_offset = self.blocks[p.block as usize].dest_offset;
        let state = &self.blocks[p.block as usize].chunks[chunk];
        if state.remote_rkey.is_some() {
            return self.write(p);
        }
        if state.awaiting {
            self.deferred.push(p);
            return Ok(());
        }
        let block = &self.ram.blocks()[p.block as usize];
        // First touch of an unregistered chunk: an all-zero range needs no registration.
        // SAFETY: the range was checked against the block in `Source::save`.
        if unsafe { is_zero(block.host_ptr(p.offset), p.len as usize) } {
            // The destination bounds the bytes one COMPRESS may zero.
            if self.zero_bytes + p.len > MAX_COMPRESS_BYTES {
                self.send_zeros()?;
            }
            self.zero_bytes += p.len;
            let entry = Compress { value: 0, block_index: p.block, offset: dest_offset + p.offset, length: p.len };
            match self.zeros.last_mut() {
                Some(z) if z.block_index == entry.block_index && z.offset + z.length == entry.offset => {
                    z.length += entry.length
                }
                _ => self.zeros.push(entry),
            }
            if self.zeros.len() >= self.zero_batch() {
                self.send_zeros()?;
            }
            return Ok(());
        }
        self.blocks[p.block as usize].chunks[chunk].awaiting = true;
        self.to_register.push((p.block, chunk));
        self.deferred.push(p);
        if self.to_register.len() >= self.register_batch() {
            self.register_deferred()?;
        }
        Ok(())
    }

    /// Chunks per REGISTER_REQUEST: QEMU serves one per message.
    fn register_batch(&self) -> usize {
        if self.link.negotiated.extensions {
            REGISTER_BATCH.min(MAX_REPEAT as usize)
        } else {
            1
        }
    }

    /// Sends the batched zero ranges in one COMPRESS message.
    fn send_zeros(&mut self) -> Result<()> {
        if self.zeros.is_empty() {
            return Ok(());
        }
        let zeros = std::mem::take(&mut self.zeros);
        self.zero_bytes = 0;
        self.link.post_message(CommandType::Compress, |w| zeros.iter().try_for_each(|z| w.push(z)))?;
        Counters::add(&self.shared.counters.zero_chunks, zeros.len() as u64);
        Ok(())
    }

    /// Zero ranges per COMPRESS message: QEMU applies only the first.
    fn zero_batch(&self) -> usize {
        if self.link.negotiated.extensions {
            ZERO_BATCH
        } else {
            1
        }
    }

    /// Registers every awaited chunk on the destination (batched toward rdmamig
    /// peers, one per message toward QEMU), then posts the deferred writes.
    /// Batched zero ranges go first: a chunk's COMPRESS must precede its writes.
    fn register_deferred(&mut self) -> Result<()> {
        self.send_zeros()?;
        let batch = self.register_batch();
        while !self.to_register.is_empty() {
            let take = self.to_register.len().min(batch);
            let chunks: Vec<(u32, usize)> = self.to_register.drain(..take).collect();
            let requests: Vec<RegisterRequest> = chunks
                .iter()
                .map(|&(b, c)| RegisterRequest {
                    key: self.blocks[b as usize].dest_offset + self.ram.blocks()[b as usize].chunk_range(c).0,
                    block_index: b,
                    chunks: 0,
                })
                .collect();
            let results: Vec<RegisterResult> = self.link.request(
                CommandType::RegisterRequest,
                |w| requests.iter().try_for_each(|r| w.push(r)),
                CommandType::RegisterResult,
                |m| m.collect_entries::<RegisterResult>().map_err(protocol),
            )?;
            if results.len() != chunks.len() {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!("asked to register {} chunks, the destination answered {}", chunks.len(), results.len()),
                ));
            }
            self.retire_completed();
            Counters::add(&self.shared.counters.registration_round_trips, 1);
            Counters::add(&self.shared.counters.chunks_registered, chunks.len() as u64);
            for (&(b, c), r) in chunks.iter().zip(&results) {
                let block = &mut self.blocks[b as usize];
                block.remote_base = r.host_addr;
                block.chunks[c].remote_rkey = Some(r.rkey);
                block.chunks[c].awaiting = false;
            }
        }
        for p in std::mem::take(&mut self.deferred) {
            self.write(p)?;
        }
        Ok(())
    }

    /// Posts one RDMA WRITE, registering the local chunk on first use.
    fn write(&mut self, p: Piece) -> Result<()> {
        self.make_room(p.len)?;
        let block = &self.ram.blocks()[p.block as usize];
        let state = &mut self.blocks[p.block as usize];
        let (lkey, rkey) = if let (Some(mr), Some(rkey)) = (&state.local, state.remote_rkey) {
            (mr.lkey(), rkey)
        } else {
            let c = chunk_of(p.offset);
            let chunk = &mut state.chunks[c];
            if chunk.local.is_none() {
                let (start, end) = block.chunk_range(c);
                // SAFETY: the hypervisor keeps registered blocks mapped for the connection's life.
                chunk.local = Some(unsafe {
                    self.link.pd.register(block.host_ptr(start), (end - start) as usize, Access::LOCAL_WRITE)?
                });
                self.shared.counters.pin(end - start);
            }
            let rkey =
                chunk.remote_rkey.ok_or_else(|| Error::new(ErrorKind::State, "write to an unregistered chunk"))?;
            (chunk.local.as_ref().map_or(0, |mr| mr.lkey()), rkey)
        };
        let sge = Sge { addr: block.host_ptr(p.offset) as u64, len: p.len as u32, lkey };
        let remote = state.remote_base + p.offset;
        let signalled = self.unsignalled.0 + 1 >= SIGNAL_EVERY || self.unsignalled.1 + p.len >= SIGNAL_EVERY_BYTES;
        // SAFETY: `sge` lies in a local MR over guest RAM the hypervisor keeps mapped;
        // `remote` lies in the chunk (or block) the destination registered for `rkey`.
        let seq = unsafe { self.link.post_write(sge, remote, rkey, signalled)? };
        if signalled {
            self.unsignalled = (0, 0);
            self.signalled.push_back(seq);
        } else {
            self.unsignalled = (self.unsignalled.0 + 1, self.unsignalled.1 + p.len);
        }
        self.inflight.push_back((seq, p.len));
        self.inflight_bytes += p.len;
        Counters::add(&self.shared.counters.bytes_written, p.len);
        Ok(())
    }

    /// Forgets writes known to be complete.
    fn retire_completed(&mut self) {
        let done = self.link.writes_completed();
        while let Some(&(seq, bytes)) = self.inflight.front() {
            if seq > done {
                break;
            }
            self.inflight.pop_front();
            self.inflight_bytes -= bytes;
        }
        while self.signalled.front().is_some_and(|&s| s <= done) {
            self.signalled.pop_front();
        }
    }

    /// Waits until a write of `len` bytes fits under the in-flight limits.
    fn make_room(&mut self, len: u64) -> Result<()> {
        loop {
            self.retire_completed();
            let fits = self.inflight.len() < MAX_INFLIGHT_WRITES && self.inflight_bytes + len <= MAX_INFLIGHT_BYTES;
            // With no signalled write outstanding only the short unsignalled tail is in flight.
            match self.signalled.front() {
                Some(&seq) if !fits => self.link.wait_write(seq)?,
                _ => return Ok(()),
            }
        }
    }
}
