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

use crate::engine::is_zero;
use crate::engine::link::{protocol_error, Link, Listener, Negotiated};
use crate::engine::ram::{chunk_count, RamBlock, RamBlocks};
use crate::engine::stats::{Counters, Stats};
use crate::verbs::{Access, MemoryRegion};
use crate::wire::{BlockSpec, CommandType, Compress, DestBlock, Message, RegisterRequest, RegisterResult, CHUNK_SHIFT};
use crate::{Error, ErrorKind, Result};

/// Stream bytes buffered at most before the service thread stops granting credits.
const MAX_BUFFERED_STREAM: usize = 256 << 20;

#[derive(Default)]
struct State {
    stream: VecDeque<u8>,
    iterations: u64,
    /// Why the service thread stopped: a failure, or the source disconnecting.
    ended: Option<Error>,
    /// The source disconnected between iteration windows (not a failure).
    clean_end: bool,
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
}

impl Destination {
    /// Waits (up to `timeout`, or for ever) for a source to connect on
    /// `listener` and starts serving it. `ram` lists this side's blocks; for a
    /// QEMU source, in the source's block order.
    pub fn accept(listener: &Listener, ram: &RamBlocks, timeout: Option<Duration>) -> Result<Destination> {
        if ram.is_empty() {
            return Err(Error::new(ErrorKind::InvalidArgument, "the RAM block registry is empty"));
        }
        let counters = Arc::new(Counters::default());
        let link = Link::accept(listener, counters.clone(), timeout)?;
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), changed: Condvar::new(), counters });
        let negotiated = link.negotiated;
        let stop = link.stop.clone();
        let service = Service::new(link, ram.clone(), shared.clone());
        let thread = thread::Builder::new()
            .name("rdmamig-dest".into())
            .spawn(move || service.run())
            .map_err(|e| Error::new(ErrorKind::State, format!("cannot start the service thread: {e}")))?;
        Ok(Destination { shared, stop, negotiated, thread: Mutex::new(Some(thread)) })
    }

    pub fn negotiated(&self) -> Negotiated {
        self.negotiated
    }

    /// Reads stream bytes into `buf`: blocks until at least one byte is there
    /// and returns how many were copied. Once the source has disconnected and
    /// every byte was read, returns the `Disconnected` error; after a failure,
    /// the stored error.
    pub fn get(&self, buf: &mut [u8], timeout: Option<Duration>) -> Result<usize> {
        if buf.is_empty() {
            return Ok(0);
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
                return Ok(n);
            }
            if let Some(e) = &state.ended {
                return Err(e.clone());
            }
            self.wait(&mut state, deadline, "stream bytes")?;
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
            if let Some(e) = &state.ended {
                return Err(e.clone());
            }
            self.wait(&mut state, deadline, "an iteration to complete")?;
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

    /// The failure that stopped the connection, if any. The source
    /// disconnecting between iteration windows is not a failure; inside one it is.
    pub fn error(&self) -> Option<Error> {
        let state = self.shared.state.lock();
        state.ended.clone().filter(|_| !state.clean_end)
    }

    /// Aborts the migration without waiting: the service thread sends ERROR to
    /// a source still migrating and tears the connection down; calls blocked in
    /// `get` or `wait_iteration` then return. May be called from any thread.
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

struct Service {
    link: Link,
    ram: RamBlocks,
    shared: Arc<Shared>,
    /// Local block index of each source block index (identity until the source describes its blocks).
    order: Vec<usize>,
    /// Registered ranges per local block, keyed by first chunk; pin-all keeps one whole-block MR.
    chunks: Vec<Vec<Option<MemoryRegion>>>,
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
}

fn entries<E: crate::wire::Entry>(m: &Message) -> Result<Vec<E>> {
    m.collect_entries::<E>().map_err(protocol_error)
}

impl Service {
    fn new(link: Link, ram: RamBlocks, shared: Arc<Shared>) -> Service {
        let chunks = ram.blocks().iter().map(|b| (0..b.chunk_count()).map(|_| None).collect()).collect();
        let whole = ram.blocks().iter().map(|_| None).collect();
        let order = (0..ram.len()).collect();
        Service { link, ram, shared, order, chunks, whole, in_window: false }
    }

    fn run(mut self) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()))
            .unwrap_or_else(|_| Err(Error::new(ErrorKind::State, "the service thread panicked")));
        let e = result.err().unwrap_or_else(|| Error::new(ErrorKind::Aborted, "closed"));
        if !matches!(e.kind, ErrorKind::PeerError | ErrorKind::Disconnected) {
            self.link.send_error();
        }
        let clean_end = e.kind == ErrorKind::Disconnected && !self.in_window;
        let e = match (e.kind, clean_end) {
            (ErrorKind::Disconnected, true) => Error::new(ErrorKind::Disconnected, "the source closed the connection"),
            (ErrorKind::Disconnected, false) => {
                Error::new(ErrorKind::Disconnected, "the source disconnected inside an iteration window")
            }
            _ => e,
        };
        // Deregister everything and destroy the QP, CQ and id before reporting the end.
        let Service { link, chunks, whole, shared, .. } = self;
        drop((chunks, whole, link));
        shared.counters.pinned_bytes.store(0, Ordering::Relaxed);
        let mut state = shared.state.lock();
        state.ended = Some(e);
        state.clean_end = clean_end;
        drop(state);
        shared.changed.notify_all();
    }

    fn serve(&mut self) -> Result<()> {
        loop {
            self.wait_for_room()?;
            let shared = self.shared.clone();
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
                Request::Stream(_) => self.in_window,
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
            }
        }
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

    /// The local block a source block index refers to.
    fn block<'a>(order: &[usize], ram: &'a RamBlocks, source_index: u32) -> Result<(usize, &'a RamBlock)> {
        let local = *order.get(source_index as usize).ok_or_else(|| {
            Error::new(ErrorKind::Protocol, format!("block index {source_index} out of range ({} blocks)", order.len()))
        })?;
        Ok((local, &ram.blocks()[local]))
    }

    /// Offset within the block of an address in our RAM address space, checking `[addr, addr+len)` lies in it.
    fn block_offset(block: &RamBlock, addr: u64, len: u64) -> Result<u64> {
        addr.checked_sub(block.offset).filter(|&off| block.check_range(off, len).is_ok()).ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                format!(
                    "range {addr:#x}+{len:#x} lies outside block '{}' ({:#x}+{:#x})",
                    block.name, block.offset, block.length
                ),
            )
        })
    }

    /// The local block of each block the source described, checking that the
    /// two sides have the same blocks with the same lengths.
    fn source_order(&self, specs: &[BlockSpec]) -> Result<Vec<usize>> {
        let found: Vec<Option<usize>> = specs.iter().map(|s| self.ram.find(&s.name)).collect();
        let missing: Vec<&str> =
            specs.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(s, _)| s.name.as_str()).collect();
        if !missing.is_empty() || specs.len() != self.ram.len() {
            return Err(Error::new(
                ErrorKind::BlockMismatch,
                format!(
                    "the source has {} blocks, this side {}; not found here: {missing:?}",
                    specs.len(),
                    self.ram.len()
                ),
            ));
        }
        let order: Vec<usize> = found.into_iter().flatten().collect();
        if let Some(dup) = order.iter().enumerate().find(|(i, b)| order[..*i].contains(b)) {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("the source named block '{}' twice", self.ram.blocks()[*dup.1].name),
            ));
        }
        let differ: Vec<String> = specs
            .iter()
            .zip(&order)
            .map(|(s, &local)| (s, &self.ram.blocks()[local]))
            .filter(|(s, b)| s.length != b.length)
            .map(|(s, b)| {
                format!("block '{}' has length {:#x} on the source and {:#x} here", b.name, s.length, b.length)
            })
            .collect();
        if !differ.is_empty() {
            return Err(Error::new(ErrorKind::BlockMismatch, differ.join("; ")));
        }
        Ok(order)
    }

    fn blocks(&mut self, specs: Vec<BlockSpec>) -> Result<()> {
        if !specs.is_empty() {
            match self.source_order(&specs) {
                Ok(order) => self.order = order,
                Err(e) => {
                    // An empty answer makes the source fail with a count mismatch too.
                    self.link.respond(CommandType::RamBlocksResult, |_| Ok(()))?;
                    return Err(e);
                }
            }
        }
        let mut result = Vec::with_capacity(self.order.len());
        for &local in &self.order {
            let b = &self.ram.blocks()[local];
            let mut rkey = 0;
            if self.link.negotiated.pin_all {
                if self.whole[local].is_none() {
                    // SAFETY: the hypervisor keeps registered blocks mapped for the connection's life.
                    let mr = unsafe {
                        self.link.pd.register(
                            b.host_ptr(0),
                            b.length as usize,
                            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                        )?
                    };
                    self.shared.counters.pin(b.length);
                    Counters::add(&self.shared.counters.chunks_registered, b.chunk_count() as u64);
                    self.whole[local] = Some(mr);
                }
                rkey = self.whole[local].as_ref().map_or(0, |mr| mr.rkey());
            }
            result.push(DestBlock {
                remote_host_addr: b.host as u64,
                offset: b.offset,
                length: b.length,
                remote_rkey: rkey,
            });
        }
        self.link.respond(CommandType::RamBlocksResult, |w| result.iter().try_for_each(|d| w.push(d)))
    }

    fn register(&mut self, requests: Vec<RegisterRequest>) -> Result<()> {
        let mut results = Vec::with_capacity(requests.len());
        for r in &requests {
            let (local, block) = Self::block(&self.order, &self.ram, r.block_index)?;
            let off = Self::block_offset(block, r.key, 1)?;
            let first = (off >> CHUNK_SHIFT) as usize;
            let last = r
                .chunks
                .try_into()
                .ok()
                .and_then(|extra: usize| first.checked_add(extra))
                .filter(|&l| l < block.chunk_count());
            let Some(last) = last else {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!("register request for {} chunks past the end of block '{}'", r.chunks, block.name),
                ));
            };
            let rkey = if let Some(mr) = &self.whole[local] {
                mr.rkey()
            } else {
                if self.chunks[local][first]
                    .as_ref()
                    .is_none_or(|mr| (mr.len() as u64) < block.chunk_range(last).1 - block.chunk_range(first).0)
                {
                    let (start, _) = block.chunk_range(first);
                    let (_, end) = block.chunk_range(last);
                    // SAFETY: the hypervisor keeps registered blocks mapped for the connection's life.
                    let mr = unsafe {
                        self.link.pd.register(
                            block.host_ptr(start),
                            (end - start) as usize,
                            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                        )?
                    };
                    self.shared.counters.pin(end - start);
                    if let Some(old) = self.chunks[local][first].replace(mr) {
                        self.shared.counters.unpin(old.len() as u64);
                    }
                    Counters::add(&self.shared.counters.chunks_registered, (last - first + 1) as u64);
                }
                self.chunks[local][first].as_ref().map_or(0, |mr| mr.rkey())
            };
            results.push(RegisterResult { rkey, host_addr: block.host as u64 });
        }
        Counters::add(&self.shared.counters.registration_round_trips, 1);
        self.link.respond(CommandType::RegisterResult, |w| results.iter().try_for_each(|r| w.push(r)))
    }

    fn unregister(&mut self, requests: Vec<RegisterRequest>) -> Result<()> {
        for r in &requests {
            let (local, block) = Self::block(&self.order, &self.ram, r.block_index)?;
            // UNREGISTER carries a chunk index, not an address.
            let chunk = usize::try_from(r.key).ok().filter(|&c| c < chunk_count(block.length)).ok_or_else(|| {
                Error::new(
                    ErrorKind::Protocol,
                    format!("unregister of chunk {} past the end of block '{}'", r.key, block.name),
                )
            })?;
            if let Some(mr) = self.chunks[local][chunk].take() {
                self.shared.counters.unpin(mr.len() as u64);
            }
        }
        let n = requests.len() as u32;
        self.link.respond(CommandType::UnregisterFinished, |w| {
            w.set_repeat(n);
            Ok(())
        })
    }

    fn zero(&mut self, ranges: Vec<Compress>) -> Result<()> {
        for z in &ranges {
            let (_, block) = Self::block(&self.order, &self.ram, z.block_index)?;
            let off = Self::block_offset(block, z.offset, z.length)?;
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
