//! The source side: a hypervisor thread hands RAM ranges and stream bytes to
//! the transfer thread through a lock-free queue; the transfer thread
//! (`transfer`) owns the connection, registers chunks within the pin budget
//! (`chunks`), posts RDMA WRITEs and sends control messages.

mod chunks;
mod pacing;
mod sparse;
mod staging;
mod transfer;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::Instant;

use crossbeam_queue::ArrayQueue;
use parking_lot::RwLock;

use crate::engine::link::{Link, Negotiated};
use crate::engine::pin::{Hint, Unregistration};
use crate::engine::ram::RamBlocks;
use crate::engine::stats::{Counters, Stats};
use crate::engine::sync::{Done, StickyError};
use crate::engine::{Config, Ending};
use crate::wire::{MAX_PAYLOAD, SEND_INCREMENT};
use crate::{Error, ErrorKind, Result};
use transfer::Engine;

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
    /// The hypervisor's hint for a range: orders which chunks are unpinned first.
    Hint {
        block: u32,
        offset: u64,
        len: u64,
        hint: Hint,
    },
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
    /// The bandwidth cap in bytes per second (0: none); the transfer thread paces by it.
    max_bandwidth: AtomicU64,
}

impl Shared {
    /// Queues `cmd`, waiting while the queue is full; fails with the stored
    /// error if the transfer thread has stopped.
    fn push(&self, cmd: Command) -> Result<()> {
        self.push_quietly(cmd)?;
        self.wake();
        Ok(())
    }

    /// As `push`, but wakes the transfer thread only while the queue is
    /// full: a batch of commands costs one wake-up, by its caller, at the end.
    fn push_quietly(&self, mut cmd: Command) -> Result<()> {
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
    unregistration: Option<Arc<Unregistration>>,
}

impl Source {
    /// Connects to a destination listening on `host:port` and starts the transfer thread.
    pub fn connect(host: &str, port: u16, config: &Config, ram: &RamBlocks) -> Result<Source> {
        if ram.is_empty() {
            return Err(Error::new(ErrorKind::InvalidArgument, "the RAM block registry is empty"));
        }
        if config.return_path {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "an rdmamig source opens no return path: Config::return_path is for a destination serving QEMU",
            ));
        }
        let counters = Arc::new(Counters::new());
        let link = Link::connect(host, port, config, ram.total_bytes(), counters.clone())?;
        let shared = Arc::new(Shared {
            queue: ArrayQueue::new(QUEUE_CAPACITY),
            engine: OnceLock::new(),
            error: StickyError::default(),
            counters,
            closing: AtomicBool::new(false),
            max_bandwidth: AtomicU64::new(config.max_bandwidth.unwrap_or(0)),
        });
        let negotiated = link.negotiated;
        let stop = link.stop.clone();
        let engine = Engine::new(link, config, ram.clone(), shared.clone())?;
        let unregistration = engine.unregistration();
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
            unregistration,
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

    /// Queues `len` bytes at `offset` of block `block` for transfer and
    /// returns at once. (`save_ranges` and `save_bitmap` queue many at once.)
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

    /// Queues every range of `ranges` for transfer, as that many `save`
    /// calls would, waking the transfer thread once. All are checked first:
    /// one bad range refuses the call and nothing is queued.
    /// (The ranges are walked twice: to check, then to queue.)
    pub fn save_ranges<I>(&self, ranges: I) -> Result<()>
    where
        I: IntoIterator<Item = SaveRange>,
        I::IntoIter: Clone,
    {
        self.shared.error.check()?;
        let ranges = ranges.into_iter();
        for r in ranges.clone() {
            self.ram.get(r.block)?.check_range(r.offset, r.len)?;
        }
        self.save_batch(ranges.map(|r| (r.block, r.offset, r.len)))
    }

    /// Queues the dirty pages of block `block` a dirty bitmap names: bit
    /// `i % 64` of `bitmap[i / 64]` stands for page `first_page + i` of
    /// `page_size` bytes, for `i` below `page_count` (later bits are
    /// ignored). Each run of set bits is one range; the transfer thread is
    /// woken once. The pages must lie inside the block, and `bitmap` must
    /// hold `page_count` bits.
    pub fn save_bitmap(
        &self,
        block: u32,
        bitmap: &[u64],
        first_page: u64,
        page_count: u64,
        page_size: u64,
    ) -> Result<()> {
        self.shared.error.check()?;
        let bad = |what: String| Error::new(ErrorKind::InvalidArgument, what);
        if page_size == 0 {
            return Err(bad("page size 0".into()));
        }
        if (bitmap.len() as u64) < page_count.div_ceil(64) {
            return Err(bad(format!("a bitmap of {} words cannot hold {page_count} pages", bitmap.len())));
        }
        let span = |pages: u64| pages.checked_mul(page_size).ok_or_else(|| bad("the pages overflow 64 bits".into()));
        self.ram.get(block)?.check_range(span(first_page)?, span(page_count)?)?;
        let base = first_page * page_size;
        self.save_batch(
            bitmap_runs(bitmap, page_count).map(|(first, pages)| (block, base + first * page_size, pages * page_size)),
        )
    }

    /// Queues checked ranges, in the open window, with one wake-up.
    fn save_batch(&self, ranges: impl Iterator<Item = (u32, u64, u64)>) -> Result<()> {
        let in_window = self.in_window.read();
        if !*in_window {
            return Err(Error::new(ErrorKind::State, "save outside an iteration window"));
        }
        let queued = ranges
            .filter(|&(_, _, len)| len > 0)
            .try_for_each(|(block, offset, len)| self.shared.push_quietly(Command::Save { block, offset, len }));
        self.shared.wake();
        queued
    }

    /// Hints how `len` bytes at `offset` of block `block` will be sent: cold
    /// ranges are unpinned first when the pin budget is full, hot ones last.
    /// Applies to chunks pinned later too; takes effect in queue order.
    pub fn hint(&self, block: u32, offset: u64, len: u64, hint: Hint) -> Result<()> {
        self.shared.error.check()?;
        self.ram.get(block)?.check_range(offset, len)?;
        if len > 0 {
            self.shared.push(Command::Hint { block, offset, len, hint })?;
        }
        Ok(())
    }

    /// Caps the rate at which RAM and stream bytes go out, in bytes per
    /// second (`None`: no cap), from the next write on; may be called at any
    /// time, from any thread (see `Config::max_bandwidth`).
    pub fn set_max_bandwidth(&self, bytes_per_second: Option<u64>) {
        self.shared.max_bandwidth.store(bytes_per_second.unwrap_or(0), Ordering::Relaxed);
    }

    /// The unregistration worker this connection uses (`None`: it
    /// deregisters inline). Holding it past `close` keeps `close` from
    /// waiting for the deregistrations (the worker stops when the last
    /// holder drops it).
    pub fn unregistration(&self) -> Option<Arc<Unregistration>> {
        self.unregistration.clone()
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

/// A range of guest RAM for [`Source::save_ranges`]: `len` bytes at `offset` of block `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveRange {
    pub block: u32,
    pub offset: u64,
    pub len: u64,
}

/// The runs of set bits among the first `count` bits of `bitmap`, as (first
/// bit, length): a word at a time, looking for the next set bit, then the
/// next clear one.
fn bitmap_runs(bitmap: &[u64], count: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut pos = 0;
    std::iter::from_fn(move || {
        // The first bit at or after `pos`, below `count`, that is set (or clear).
        let next = |pos: &mut u64, set: bool| -> Option<u64> {
            while *pos < count {
                let word = bitmap[(*pos / 64) as usize];
                let word = if set { word } else { !word };
                let rest = word >> (*pos % 64);
                if rest != 0 {
                    let found = *pos + u64::from(rest.trailing_zeros());
                    return (found < count).then_some(found);
                }
                *pos = (*pos / 64 + 1) * 64;
            }
            None
        };
        let first = next(&mut pos, true)?;
        pos = first;
        let end = next(&mut pos, false).unwrap_or(count);
        pos = end;
        Some((first, end - first))
    })
}

impl Drop for Source {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::bitmap_runs;

    /// The runs a bit-by-bit walk finds.
    fn slow_runs(bitmap: &[u64], count: u64) -> Vec<(u64, u64)> {
        let bit = |i: u64| bitmap[(i / 64) as usize] >> (i % 64) & 1 == 1;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for i in (0..count).filter(|&i| bit(i)) {
            match runs.last_mut() {
                Some((first, len)) if *first + *len == i => *len += 1,
                _ => runs.push((i, 1)),
            }
        }
        runs
    }

    #[test]
    fn bitmap_runs_match_a_bit_by_bit_walk() {
        let words = [
            vec![0, 0, 0],
            vec![!0, !0, !0],
            vec![1, 1 << 63, 1],
            vec![1 << 63, 1, 0],
            vec![0xF0F0_0000_0000_00FF, !0, 0x8000_0000_0000_0001],
            vec![!0 - 1, !0 >> 1, 0x5555_5555_5555_5555],
        ];
        for bitmap in &words {
            for count in [0, 1, 63, 64, 65, 100, 127, 128, 129, 191, 192] {
                assert_eq!(
                    bitmap_runs(bitmap, count).collect::<Vec<_>>(),
                    slow_runs(bitmap, count),
                    "{bitmap:x?} {count}"
                );
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            let bitmap: Vec<u64> = (0..5)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x & (x >> 3)
                })
                .collect();
            let count = x % 321;
            assert_eq!(bitmap_runs(&bitmap, count).collect::<Vec<_>>(), slow_runs(&bitmap, count));
        }
    }
}
