//! The destination side. A service thread owns the connection: it grants the
//! source one READY credit at a time and serves every control message as it
//! arrives (RAM-block exchange, registrations, zero ranges, iteration ends),
//! so the hypervisor never has to parse its own stream to find QEMU's hook
//! markers. Stream bytes (QEMU_FILE) are buffered for `get`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::engine::link::{protocol_error, Link, Listener, Negotiated};
use crate::engine::pin::{PinAll, Pins, Unregistration};
use crate::engine::ram::RamBlocks;
use crate::engine::stats::{Counters, Stats};
use crate::engine::{is_zero, validate, Ending};
use crate::verbs::{Access, MemoryRegion};
use crate::wire::{BlockSpec, CommandType, Compress, DestBlock, EndSummary, Message, RegisterRequest, RegisterResult};
use crate::{Error, ErrorKind, Result};

/// Stream bytes buffered at most before the service thread stops granting credits.
const MAX_BUFFERED_STREAM: usize = 256 << 20;

/// What `Destination::get` read: stream bytes, or the end of a stream that
/// ended without a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    Bytes(usize),
    End(Ending),
}

#[derive(Default)]
struct State {
    stream: VecDeque<u8>,
    iterations: u64,
    /// How the connection ended, once the service thread stopped.
    end: Option<Result<Ending>>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    counters: Arc<Counters>,
}

/// The destination end of a migration connection.
///
/// Thread safety: every method takes `&self` and may be called from any thread.
/// Progress never needs the hypervisor: the library's own service thread
/// serves the source and calls nothing back.
pub struct Destination {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    negotiated: Negotiated,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Keeps the unregistration worker running past `close`, so that close
    /// does not wait for the deregistrations it queued.
    unregistration: Option<Arc<Unregistration>>,
}

impl Destination {
    /// Waits (up to `timeout`, or for ever) for a source to connect on
    /// `listener` and starts serving it. `ram` lists this side's blocks; for a
    /// QEMU source, in the source's block order.
    pub fn accept(listener: &Listener, ram: &RamBlocks, timeout: Option<Duration>) -> Result<Destination> {
        if ram.is_empty() {
            return Err(Error::new(ErrorKind::InvalidArgument, "the RAM block registry is empty"));
        }
        let counters = Arc::new(Counters::new());
        let link = Link::accept(listener, ram.total_bytes(), counters.clone(), timeout)?;
        let pins = Pins::new(link.pd.clone(), listener.config(), counters.clone())?;
        let unregistration = pins.worker();
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), changed: Condvar::new(), counters });
        let negotiated = link.negotiated;
        let stop = link.stop.clone();
        let service = Service::new(link, pins, ram.clone(), shared.clone());
        let thread = thread::Builder::new()
            .name("rdmamig-dest".into())
            .spawn(move || service.run())
            .map_err(|e| Error::new(ErrorKind::State, format!("cannot start the service thread: {e}")))?;
        Ok(Destination { shared, stop, negotiated, thread: Mutex::new(Some(thread)), unregistration })
    }

    pub fn negotiated(&self) -> Negotiated {
        self.negotiated
    }

    /// The unregistration worker this connection uses (see `Source::unregistration`).
    pub fn unregistration(&self) -> Option<Arc<Unregistration>> {
        self.unregistration.clone()
    }

    /// Reads stream bytes into `buf`: blocks until at least one byte is there
    /// and returns how many were copied. Once the connection has ended and
    /// every byte was read, returns how it ended: [`Read::End`], or the
    /// failure. An empty `buf` reads 0 bytes at once.
    pub fn get(&self, buf: &mut [u8], timeout: Option<Duration>) -> Result<Read> {
        if buf.is_empty() {
            return Ok(Read::Bytes(0));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.shared.state.lock();
        loop {
            if !state.stream.is_empty() {
                let (front, back) = state.stream.as_slices();
                let n = buf.len().min(front.len() + back.len());
                let from_front = n.min(front.len());
                buf[..from_front].copy_from_slice(&front[..from_front]);
                buf[from_front..n].copy_from_slice(&back[..n - from_front]);
                state.stream.drain(..n);
                self.shared.changed.notify_all();
                return Ok(Read::Bytes(n));
            }
            if let Some(end) = &state.end {
                return end.clone().map(Read::End);
            }
            self.wait(&mut state, deadline, "stream bytes")?;
        }
    }

    /// Waits until the connection has ended and returns how: completed,
    /// closed without proof (a QEMU source), or the failure. Stream bytes not
    /// read yet stay readable with `get`.
    pub fn wait_end(&self, timeout: Option<Duration>) -> Result<Ending> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.shared.state.lock();
        loop {
            if let Some(end) = &state.end {
                return end.clone();
            }
            self.wait(&mut state, deadline, "the end of the migration")?;
        }
    }

    /// Waits until at least `n` iteration windows have completed (all RAM
    /// written in them is in place) and returns the number completed.
    pub fn wait_iteration(&self, n: u64, timeout: Option<Duration>) -> Result<u64> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.shared.state.lock();
        loop {
            if state.iterations >= n {
                return Ok(state.iterations);
            }
            match &state.end {
                Some(Err(e)) => return Err(e.clone()),
                Some(Ok(_)) => {
                    return Err(Error::new(
                        ErrorKind::Disconnected,
                        format!("the source ended the migration after {} iteration windows", state.iterations),
                    ))
                }
                None => self.wait(&mut state, deadline, "an iteration to complete")?,
            }
        }
    }

    fn wait(&self, state: &mut parking_lot::MutexGuard<State>, deadline: Option<Instant>, what: &str) -> Result<()> {
        match deadline {
            None => self.shared.changed.wait(state),
            Some(d) => {
                if self.shared.changed.wait_until(state, d).timed_out() {
                    return Err(Error::new(ErrorKind::Timeout, format!("timed out waiting for {what}")));
                }
            }
        }
        Ok(())
    }

    pub fn iterations(&self) -> u64 {
        self.shared.state.lock().iterations
    }

    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// The failure that ended the connection, if it ended with one.
    pub fn error(&self) -> Option<Error> {
        self.shared.state.lock().end.clone().and_then(|end| end.err())
    }

    /// Aborts the migration without waiting: the service thread sends ERROR to
    /// a source still migrating (see `Link::send_error` for when it can) and
    /// tears the connection down; calls blocked in `get`, `wait_end` or
    /// `wait_iteration` then return. May be called from any thread.
    pub fn abort(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Aborts (if still connected) and waits until the connection is torn down.
    pub fn close(&self) {
        self.abort();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Destination {
    fn drop(&mut self) {
        self.close();
    }
}

/// What holds a chunk registered on this side (dynamic registration).
enum ChunkReg {
    Free,
    /// The first chunk of a registered range: owns its MR.
    Owner(MemoryRegion),
    /// A later chunk of the range whose first chunk is this index.
    Covered(usize),
}

struct Service {
    link: Link,
    pins: Pins,
    /// Pin-all registrations under way, taken when the source asks for the blocks.
    pin_all: Option<PinAll>,
    ram: RamBlocks,
    shared: Arc<Shared>,
    /// Local block index of each source block index (identity until the source describes its blocks).
    order: Vec<usize>,
    /// Registered ranges per local block and chunk; pin-all keeps one whole-block MR.
    chunks: Vec<Vec<ChunkReg>>,
    whole: Vec<Option<MemoryRegion>>,
    /// A registration message arrived and REGISTER_FINISHED has not yet.
    in_window: bool,
}

/// What a received message asks the service to do, once the receive buffer is released.
enum Request {
    Stream(usize),
    Blocks(Vec<BlockSpec>),
    Register(Vec<RegisterRequest>),
    Unregister(Vec<RegisterRequest>),
    Zero(Vec<Compress>),
    Finished,
    End(EndSummary),
}

fn entries<E: crate::wire::Entry>(m: &Message) -> Result<Vec<E>> {
    m.collect_entries::<E>().map_err(protocol_error)
}

impl Service {
    fn new(link: Link, pins: Pins, ram: RamBlocks, shared: Arc<Shared>) -> Service {
        let chunks = ram.blocks().iter().map(|b| (0..b.chunk_count()).map(|_| ChunkReg::Free).collect()).collect();
        let whole = ram.blocks().iter().map(|_| None).collect();
        let order = (0..ram.len()).collect();
        Service { link, pins, pin_all: None, ram, shared, order, chunks, whole, in_window: false }
    }

    fn run(mut self) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()))
            .unwrap_or_else(|_| Err(Error::new(ErrorKind::State, "the service thread panicked")));
        let end = self.judge(result);
        if let Err(e) = &end {
            if !matches!(e.kind, ErrorKind::PeerError | ErrorKind::Disconnected) {
                self.link.send_error();
            }
        }
        // Destroy the QP, CQ and id (no more remote writes), hand every
        // registration to the worker, then report the end.
        let Service { link, pins, chunks, whole, shared, .. } = self;
        drop(link);
        let owners = chunks.into_iter().flatten().filter_map(|c| match c {
            ChunkReg::Owner(mr) => Some(mr),
            _ => None,
        });
        for mr in whole.into_iter().flatten().chain(owners) {
            pins.release(mr);
        }
        shared.state.lock().end = Some(end);
        shared.changed.notify_all();
    }

    /// How the connection ended. Only the completion handshake completes a
    /// migration; a QEMU source (no handshake) that disconnects outside a
    /// window ends it without proof; everything else is a failure.
    fn judge(&self, result: Result<Ending>) -> Result<Ending> {
        let e = match result {
            Ok(ending) => return Ok(ending),
            Err(e) if e.kind != ErrorKind::Disconnected => return Err(e),
            Err(e) => e,
        };
        let why = if self.in_window {
            "inside an iteration window: the RAM of that window is incomplete"
        } else if self.link.negotiated.extensions {
            "before completing the migration (no END)"
        } else if self.link.closed_by_peer() {
            return Ok(Ending::Unverified);
        } else {
            "between iteration windows"
        };
        Err(Error::new(ErrorKind::Disconnected, format!("the source disconnected {why} ({})", e.message)))
    }

    fn serve(&mut self) -> Result<Ending> {
        // Pin-all starts here, on its own thread, while the source gets ready
        // to ask for the blocks; the first READY goes out without waiting for it.
        if self.link.negotiated.pin_all {
            self.pin_all = Some(self.pins.pin_all(&self.ram, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?);
        }
        loop {
            self.wait_for_room()?;
            let shared = self.shared.clone();
            let extensions = self.link.negotiated.extensions;
            let request = self.link.receive(|m| {
                Ok(match m.kind {
                    CommandType::QemuFile => {
                        shared.state.lock().stream.extend(m.payload);
                        shared.changed.notify_all();
                        Request::Stream(m.payload.len())
                    }
                    CommandType::RamBlocksRequest => Request::Blocks(entries(m)?),
                    CommandType::RegisterRequest => Request::Register(entries(m)?),
                    CommandType::UnregisterRequest => Request::Unregister(entries(m)?),
                    CommandType::Compress => Request::Zero(entries(m)?),
                    CommandType::RegisterFinished => Request::Finished,
                    // decode_message let END through with exactly one summary.
                    CommandType::End if extensions => Request::End(entries(m)?[0]),
                    other => {
                        return Err(Error::new(
                            ErrorKind::Protocol,
                            format!("unexpected {other:?} message from the source"),
                        ))
                    }
                })
            })?;
            // Registration messages open a window, REGISTER_FINISHED closes it.
            self.in_window = match request {
                Request::Stream(_) | Request::End(_) => self.in_window,
                Request::Finished => false,
                _ => true,
            };
            match request {
                Request::Stream(n) => Counters::add(&self.shared.counters.stream_bytes, n as u64),
                Request::Blocks(specs) => self.blocks(specs)?,
                Request::Register(r) => self.register(r)?,
                Request::Unregister(r) => self.unregister(r)?,
                Request::Zero(z) => self.zero(z)?,
                Request::Finished => {
                    self.shared.state.lock().iterations += 1;
                    Counters::add(&self.shared.counters.iterations, 1);
                    self.shared.changed.notify_all();
                }
                Request::End(summary) => return self.end(summary),
            }
        }
    }

    /// END: acknowledges it if this side received everything it counts.
    fn end(&mut self, summary: EndSummary) -> Result<Ending> {
        let stats = self.shared.counters.snapshot();
        let received = EndSummary { stream_bytes: stats.stream_bytes, windows: stats.iterations };
        if self.in_window || summary != received {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "the source ended the migration after {} stream bytes and {} windows, this side has {} and {}{}",
                    summary.stream_bytes,
                    summary.windows,
                    received.stream_bytes,
                    received.windows,
                    if self.in_window { " and a window still open" } else { "" }
                ),
            ));
        }
        self.link.respond(CommandType::EndAck, |_| Ok(()))?;
        Ok(Ending::Completed)
    }

    /// Holds the next credit back while the hypervisor is behind on reading the stream.
    fn wait_for_room(&mut self) -> Result<()> {
        let mut state = self.shared.state.lock();
        while state.stream.len() >= MAX_BUFFERED_STREAM {
            self.shared.changed.wait_for(&mut state, Duration::from_millis(100));
            if self.link.stop.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Aborted, "closed by the hypervisor"));
            }
        }
        Ok(())
    }

    fn blocks(&mut self, specs: Vec<BlockSpec>) -> Result<()> {
        if !specs.is_empty() {
            match validate::match_blocks(&self.ram, &specs) {
                Ok(order) => self.order = order,
                Err(e) => {
                    // An empty answer makes the source fail with a count mismatch too.
                    self.link.respond(CommandType::RamBlocksResult, |_| Ok(()))?;
                    return Err(e);
                }
            }
        }
        if let Some(job) = self.pin_all.take() {
            for (i, mr) in job.wait(&self.link.stop)?.into_iter().enumerate() {
                Counters::add(&self.shared.counters.chunks_registered, self.ram.blocks()[i].chunk_count() as u64);
                self.whole[i] = Some(mr);
            }
        }
        let result: Vec<DestBlock> = self
            .order
            .iter()
            .map(|&local| {
                let b = &self.ram.blocks()[local];
                DestBlock {
                    remote_host_addr: b.host as u64,
                    offset: b.offset,
                    length: b.length,
                    remote_rkey: self.whole[local].as_ref().map_or(0, |mr| mr.rkey()),
                }
            })
            .collect();
        self.link.respond(CommandType::RamBlocksResult, |w| result.iter().try_for_each(|d| w.push(d)))
    }

    fn register(&mut self, requests: Vec<RegisterRequest>) -> Result<()> {
        let mut results = Vec::with_capacity(requests.len());
        for r in &requests {
            let (local, block) = validate::local_block(&self.order, &self.ram, r.block_index)?;
            let (first, last) = validate::register_span(block, r)?;
            let host_addr = block.host as u64;
            let rkey = match &self.whole[local] {
                Some(mr) => mr.rkey(),
                None => self.register_chunks(local, first, last)?,
            };
            results.push(RegisterResult { rkey, host_addr });
        }
        Counters::add(&self.shared.counters.registration_round_trips, 1);
        self.link.respond(CommandType::RegisterResult, |w| results.iter().try_for_each(|r| w.push(r)))
    }

    /// The rkey of a registration covering chunks `[first, last]` of local
    /// block `local`: an existing one that covers them all (its key stays
    /// valid, as the source may still write with it), or a new one if none
    /// of them is registered. Each chunk belongs to at most one MR, so each
    /// pinned byte is counted once; a request that overlaps an existing
    /// registration only in part is refused.
    fn register_chunks(&mut self, local: usize, first: usize, last: usize) -> Result<u32> {
        let regs = &mut self.chunks[local];
        let owner = match regs[first] {
            ChunkReg::Covered(o) => Some(o),
            ChunkReg::Owner(_) => Some(first),
            ChunkReg::Free => None,
        };
        if let Some(o) = owner {
            let covers = (first..=last).all(|c| c == o || matches!(regs[c], ChunkReg::Covered(x) if x == o));
            return match &regs[o] {
                ChunkReg::Owner(mr) if covers => Ok(mr.rkey()),
                _ => Err(Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "register request for chunks {first}..={last} overlaps the registration at chunk {o} in part"
                    ),
                )),
            };
        }
        if let Some(c) = (first..=last).find(|&c| !matches!(regs[c], ChunkReg::Free)) {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("register request for chunks {first}..={last} overlaps the registration of chunk {c}"),
            ));
        }
        let block = &self.ram.blocks()[local];
        let (start, _) = block.chunk_range(first);
        let (_, end) = block.chunk_range(last);
        let len = end - start;
        // The source cannot make this side unpin: what passes the budget is refused.
        if !self.pins.fits_after_release(len) {
            return Err(Error::new(
                ErrorKind::PinBudget,
                format!(
                    "the source asked to register chunks {first}..={last} of block '{}': {}",
                    block.name,
                    self.pins.over_budget(len).message
                ),
            ));
        }
        self.pins.settle_for(len);
        let (ptr, access) = (block.host_ptr(start), Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        // SAFETY (both): the hypervisor keeps registered blocks mapped for the connection's life.
        let mr = match unsafe { self.pins.register(ptr, len, access) } {
            Err(e) if e.kind == ErrorKind::PinBudget => {
                // Nothing here can be unpinned; what the worker still holds can.
                self.pins.retried();
                self.pins.settle();
                unsafe { self.pins.register(ptr, len, access)? }
            }
            r => r?,
        };
        let rkey = mr.rkey();
        Counters::add(&self.shared.counters.chunks_registered, (last - first + 1) as u64);
        regs[first] = ChunkReg::Owner(mr);
        for reg in &mut regs[first + 1..=last] {
            *reg = ChunkReg::Covered(first);
        }
        Ok(rkey)
    }

    /// UNREGISTER: drops the registration holding each named chunk (all of its chunks).
    fn unregister(&mut self, requests: Vec<RegisterRequest>) -> Result<()> {
        for r in &requests {
            let (local, block) = validate::local_block(&self.order, &self.ram, r.block_index)?;
            let chunk = validate::unregister_chunk(block, r)?;
            let regs = &mut self.chunks[local];
            let owner = match regs[chunk] {
                ChunkReg::Covered(o) => o,
                _ => chunk,
            };
            if let ChunkReg::Owner(mr) = std::mem::replace(&mut regs[owner], ChunkReg::Free) {
                self.pins.release(mr);
                Counters::add(&self.shared.counters.unpins, 1);
                for reg in regs[owner + 1..].iter_mut().take_while(|r| matches!(r, ChunkReg::Covered(o) if *o == owner))
                {
                    *reg = ChunkReg::Free;
                }
            }
        }
        let n = requests.len() as u32;
        self.link.respond(CommandType::UnregisterFinished, |w| {
            w.set_repeat(n);
            Ok(())
        })
    }

    fn zero(&mut self, ranges: Vec<Compress>) -> Result<()> {
        validate::check_compress(&ranges, self.link.negotiated.extensions)?;
        for z in &ranges {
            let (_, block) = validate::local_block(&self.order, &self.ram, z.block_index)?;
            let off = validate::block_offset(block, z.offset, z.length)?;
            let ptr = block.host_ptr(off);
            // SAFETY: the range was checked to lie inside a block the hypervisor keeps mapped.
            // Already-zero memory is left untouched so untouched pages stay unallocated.
            unsafe {
                if !is_zero(ptr, z.length as usize) {
                    std::ptr::write_bytes(ptr, 0, z.length as usize);
                }
            }
            Counters::add(&self.shared.counters.zero_chunks, 1);
        }
        Ok(())
    }
}
