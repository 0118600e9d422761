//! The source's queueing front end, what hypervisor threads run: the checks
//! of a save, the iteration window, the queue into the transfer thread and
//! its wake-ups. It needs no connection, so the save path can be measured
//! without RDMA (`examples/save_path.rs`, feature `bench-internals`).
//!
//! A batch call queues a group per queue entry: `save_ranges` up to `GROUP`
//! ranges, `save_bitmap` a copy of up to `GROUP` words of the bitmap (64 pages
//! each; all-zero stretches skipped), whose runs the transfer thread finds.
//! Copying the words costs the caller far less than finding the runs and
//! writing 24 bytes per run into a buffer the transfer thread last read (those
//! stores dominated the caller's time in a profile of `examples/save_path.rs`);
//! finding runs is small next to the transfer thread's work per range.
//! Group buffers come back from the transfer thread through lock-free queues
//! and are reused: once warm, a batch allocates nothing. At most `MAX_GROUPS`
//! of each kind exist, which bounds the memory queued saves take; a caller
//! short of one (or of a queue slot) spins briefly, then sleeps until the
//! transfer thread frees one.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use parking_lot::{Condvar, Mutex, RwLock};

use super::command::Command;
use super::save_range::SaveRange;
use crate::engine::ram::RamBlocks;
use crate::engine::sync::StickyError;
use crate::{Error, ErrorKind, Result};

/// Queue entries at most: callers wait for room rather than let memory grow
/// with the guest when the transfer thread falls behind.
const QUEUE_CAPACITY: usize = 1 << 16;
/// Ranges, or bitmap words, per group entry.
pub(super) const GROUP: usize = 1024;
/// Group buffers of each kind at most (24 KiB of ranges, 8 KiB of words).
const MAX_GROUPS: usize = 256;
/// Tries before a caller waiting for room sleeps: the transfer thread
/// usually frees room within a few microseconds.
const SPINS: u32 = 200;
/// A sleeping caller rechecks this often anyway (and the connection's error).
const NAP: Duration = Duration::from_millis(1);

/// Group buffers of one kind: spare ones, and how many exist.
struct Pool<T> {
    spare: ArrayQueue<Vec<T>>,
    /// Buffers in existence (being filled, queued, being sent, spare).
    made: AtomicUsize,
}

impl<T> Pool<T> {
    fn new() -> Pool<T> {
        Pool { spare: ArrayQueue::new(MAX_GROUPS), made: AtomicUsize::new(0) }
    }

    /// A spare buffer, or a new one while fewer than `MAX_GROUPS` exist.
    fn try_take(&self) -> Option<Vec<T>> {
        self.spare.pop().or_else(|| {
            let more =
                self.made.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < MAX_GROUPS).then_some(n + 1));
            more.is_ok().then(|| Vec::with_capacity(GROUP))
        })
    }

    fn give_back(&self, mut group: Vec<T>) {
        group.clear();
        if self.spare.push(group).is_err() {
            // Cannot happen (`spare` holds every buffer there may be); count it gone anyway.
            self.made.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The queueing front end of a `Source`. Every method but `new` may be
/// called from several threads at once.
pub struct Front {
    queue: ArrayQueue<Command>,
    ranges: Pool<SaveRange>,
    words: Pool<u64>,
    /// The thread that pops (the transfer thread), woken after pushes.
    consumer: OnceLock<Thread>,
    pub(super) error: StickyError,
    ram: RamBlocks,
    /// Whether an iteration window is open. A save holds it shared while it
    /// checks and queues, `close_window` exclusively while it closes the
    /// window, so a save is either queued before what follows the close or refused.
    in_window: RwLock<bool>,
    /// Callers sleeping for room (a queue slot or a group buffer), and where they sleep.
    waiting: AtomicUsize,
    room: Mutex<()>,
    room_freed: Condvar,
    /// Bytes of RAM in queued commands (`Command::saved_bytes`), and the
    /// bound past which a save waits (`Config::max_queued_bytes`).
    queued_bytes: AtomicU64,
    max_queued_bytes: Option<u64>,
}

impl Front {
    pub fn new(ram: RamBlocks, max_queued_bytes: Option<u64>) -> Front {
        Front {
            queue: ArrayQueue::new(QUEUE_CAPACITY),
            ranges: Pool::new(),
            words: Pool::new(),
            consumer: OnceLock::new(),
            error: StickyError::default(),
            ram,
            in_window: RwLock::new(false),
            waiting: AtomicUsize::new(0),
            room: Mutex::new(()),
            room_freed: Condvar::new(),
            queued_bytes: AtomicU64::new(0),
            max_queued_bytes,
        }
    }

    /// Names the thread that pops, to be woken when work is queued (once).
    pub fn set_consumer(&self, thread: Thread) {
        let _ = self.consumer.set(thread);
    }

    pub(crate) fn ram(&self) -> &RamBlocks {
        &self.ram
    }

    pub fn window_open(&self) -> bool {
        *self.in_window.read()
    }

    /// Opens the window (the caller checked that it was closed).
    pub fn open_window(&self) {
        *self.in_window.write() = true;
    }

    /// Closes the window once every save queueing in it is queued; later
    /// ones are refused. False if it was not open.
    pub fn close_window(&self) -> bool {
        std::mem::replace(&mut *self.in_window.write(), false)
    }

    /// Queues `len` bytes at `offset` of block `block`: one entry, one wake-up.
    pub fn save(&self, block: u32, offset: u64, len: u64) -> Result<()> {
        self.error.check()?;
        self.ram.get(block)?.check_range(offset, len)?;
        let in_window = self.in_window.read();
        if !*in_window {
            return Err(outside_window());
        }
        if len > 0 {
            self.push(Command::Save { block, offset, len })?;
        }
        Ok(())
    }

    /// Queues every range, all checked first (one bad range: nothing queued),
    /// in groups of up to `GROUP`.
    pub fn save_ranges<I>(&self, ranges: I) -> Result<()>
    where
        I: IntoIterator<Item = SaveRange>,
        I::IntoIter: Clone,
    {
        self.error.check()?;
        let ranges = ranges.into_iter();
        for r in ranges.clone() {
            self.ram.get(r.block)?.check_range(r.offset, r.len)?;
        }
        let in_window = self.in_window.read();
        if !*in_window {
            return Err(outside_window());
        }
        let mut group: Option<Vec<SaveRange>> = None;
        let mut wakes = Wakes::default();
        let queued = ranges.filter(|r| r.len > 0).try_for_each(|r| {
            let g = match &mut group {
                Some(g) => g,
                None => group.insert(self.until_room(|| self.ranges.try_take())?),
            };
            g.push(r);
            if g.len() == GROUP {
                wakes.push(self, Command::Group(group.take().expect("filled above")))?;
            }
            Ok(())
        });
        let queued = match (queued, group) {
            (Ok(()), Some(g)) => wakes.push(self, Command::Group(g)),
            (r, g) => {
                // A call that failed half-way gives its buffer back.
                if let Some(g) = g {
                    self.recycle_ranges(g);
                }
                r
            }
        };
        wakes.finish(self);
        queued
    }

    /// Queues the dirty pages of a bitmap (see `Source::save_bitmap`): a
    /// copy of its words, `GROUP` at a time, skipping groups of clear bits.
    pub fn save_bitmap(
        &self,
        block: u32,
        bitmap: &[u64],
        first_page: u64,
        page_count: u64,
        page_size: u64,
    ) -> Result<()> {
        self.error.check()?;
        let bad = |what: String| Error::new(ErrorKind::InvalidArgument, what);
        if page_size == 0 {
            return Err(bad("page size 0".into()));
        }
        if (bitmap.len() as u64) < page_count.div_ceil(64) {
            return Err(bad(format!("a bitmap of {} words cannot hold {page_count} pages", bitmap.len())));
        }
        let span = |pages: u64| pages.checked_mul(page_size).ok_or_else(|| bad("the pages overflow 64 bits".into()));
        self.ram.get(block)?.check_range(span(first_page)?, span(page_count)?)?;
        let in_window = self.in_window.read();
        if !*in_window {
            return Err(outside_window());
        }
        let base = first_page * page_size;
        let bitmap = &bitmap[..page_count.div_ceil(64) as usize];
        let mut wakes = Wakes::default();
        let queued = bitmap.chunks(GROUP).enumerate().try_for_each(|(i, words)| {
            // An OR the compiler vectorises: cheaper than stopping at the first set bit.
            if words.iter().fold(0, |a, w| a | w) == 0 {
                return Ok(());
            }
            let first = (i * GROUP * 64) as u64;
            let pages = page_count.min(first + (GROUP * 64) as u64) - first;
            let mut copy = self.until_room(|| self.words.try_take())?;
            copy.extend_from_slice(words);
            wakes.push(self, Command::Bitmap { block, offset: base + first * page_size, page_size, pages, words: copy })
        });
        wakes.finish(self);
        queued
    }

    /// Queues `cmd` and wakes the transfer thread, waiting while the queue
    /// is full; fails with the stored error if the transfer thread has stopped.
    pub(super) fn push(&self, cmd: Command) -> Result<()> {
        self.push_quietly(cmd)?;
        self.wake();
        Ok(())
    }

    /// As `push`, but wakes the transfer thread only while the queue is full
    /// (or holds more bytes than its bound).
    fn push_quietly(&self, cmd: Command) -> Result<()> {
        self.error.check()?;
        let bytes = self.counted(&cmd);
        // Counted before it can be popped: the transfer thread subtracts it.
        self.queued_bytes.fetch_add(bytes, Ordering::SeqCst);
        let mut cmd = Some(cmd);
        let mut attempt = || match self.queue.push(cmd.take().expect("put back on failure")) {
            Ok(()) => Some(()),
            Err(back) => {
                cmd = Some(back);
                None
            }
        };
        if attempt().is_none() {
            self.until_room(attempt).inspect_err(|_| self.taken(bytes))?;
        }
        match self.max_queued_bytes {
            Some(max) if bytes > 0 => {
                self.until_room(|| (self.queued_bytes.load(Ordering::SeqCst) <= max).then_some(()))
            }
            _ => Ok(()),
        }
    }

    /// Retries `attempt` until it succeeds: a short spin, then sleeps woken
    /// by the transfer thread as it frees room (`freed`). Fails with the
    /// stored error if the transfer thread has stopped.
    fn until_room<T>(&self, mut attempt: impl FnMut() -> Option<T>) -> Result<T> {
        for spin in 0..SPINS {
            if let Some(t) = attempt() {
                return Ok(t);
            }
            self.error.check()?;
            if spin == 0 {
                self.wake();
            }
            std::hint::spin_loop();
        }
        loop {
            self.error.check()?;
            let mut room = self.room.lock();
            self.waiting.fetch_add(1, Ordering::SeqCst);
            // Pairs with the fence in `freed`: either this attempt sees the
            // room freed, or `freed` sees this caller waiting and notifies
            // (it takes `room` first, so only once this caller sleeps).
            fence(Ordering::SeqCst);
            let got = attempt();
            if got.is_none() {
                self.wake();
                self.room_freed.wait_for(&mut room, NAP);
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            if let Some(t) = got {
                return Ok(t);
            }
        }
    }

    /// Wakes the transfer thread.
    pub(super) fn wake(&self) {
        if let Some(t) = self.consumer.get() {
            t.unpark();
        }
    }

    /// The next command, for the transfer thread.
    pub(super) fn pop(&self) -> Option<Command> {
        let cmd = self.queue.pop();
        if cmd.is_some() {
            self.freed();
        }
        cmd
    }

    /// The bytes of `cmd` the bound counts: none without a bound.
    pub(super) fn counted(&self, cmd: &Command) -> u64 {
        self.max_queued_bytes.map_or(0, |_| cmd.saved_bytes())
    }

    /// The transfer thread has handled a command that counted `bytes`.
    pub(super) fn taken(&self, bytes: u64) {
        if bytes > 0 {
            self.queued_bytes.fetch_sub(bytes, Ordering::SeqCst);
            self.freed();
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Takes back a group of ranges the transfer thread has handled.
    pub(super) fn recycle_ranges(&self, group: Vec<SaveRange>) {
        self.ranges.give_back(group);
        self.freed();
    }

    /// Takes back a bitmap group the transfer thread has handled.
    pub(super) fn recycle_words(&self, words: Vec<u64>) {
        self.words.give_back(words);
        self.freed();
    }

    /// Room was freed: wakes the callers sleeping for it.
    fn freed(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            let _room = self.room.lock();
            self.room_freed.notify_all();
        }
    }

    /// For a benchmark's drain thread: pops one command and returns the
    /// ranges and bytes it saves, found as the transfer thread finds them
    /// (the group goes back for reuse), or `None` when the queue is empty.
    #[cfg(feature = "bench-internals")]
    pub fn drain_one(&self) -> Option<(u64, u64)> {
        let cmd = self.pop()?;
        self.taken(self.counted(&cmd));
        Some(match cmd {
            Command::Save { len, .. } => (1, len),
            Command::Group(g) => {
                let counted = (g.len() as u64, g.iter().map(|r| r.len).sum());
                self.recycle_ranges(g);
                counted
            }
            Command::Bitmap { page_size, pages, words, .. } => {
                let mut counted = (0, 0);
                let _ = crate::bitmap::for_each_run(&words, pages, |_, n| {
                    counted = (counted.0 + 1, counted.1 + n * page_size);
                    Ok::<(), ()>(())
                });
                self.recycle_words(words);
                counted
            }
            _ => (0, 0),
        })
    }
}

/// The wake-ups of one batch call: at its first group (the transfer thread
/// starts while the rest are built) and at its end, not at every group: a
/// wake-up of a thread that went idle is a system call, and the transfer
/// thread may go idle after each group while the caller builds the next.
#[derive(Default)]
struct Wakes {
    quiet: bool,
}

impl Wakes {
    fn push(&mut self, front: &Front, cmd: Command) -> Result<()> {
        if self.quiet {
            front.push_quietly(cmd)
        } else {
            front.push(cmd)?;
            self.quiet = true;
            Ok(())
        }
    }

    fn finish(self, front: &Front) {
        if self.quiet {
            front.wake();
        }
    }
}

fn outside_window() -> Error {
    Error::new(ErrorKind::State, "save outside an iteration window")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::guest::testing::Mapping;
    use std::thread;

    const BLOCK: u64 = 64 << 20;

    /// A front over one block of `BLOCK` bytes (reserved, never touched: the front reads no RAM).
    fn front() -> (Front, Mapping) {
        bounded_front(None)
    }

    /// As `front`, with `Config::max_queued_bytes`.
    fn bounded_front(max_queued_bytes: Option<u64>) -> (Front, Mapping) {
        let ram = Mapping::anonymous(BLOCK);
        let mut blocks = RamBlocks::new();
        blocks.add_range("pc.ram", ram.range(), 0).unwrap();
        (Front::new(blocks, max_queued_bytes), ram)
    }

    /// Pops everything queued: the ranges of each entry (a `Save` as one).
    fn drain(front: &Front) -> Vec<Vec<SaveRange>> {
        std::iter::from_fn(|| front.pop())
            .map(|cmd| match cmd {
                Command::Save { block, offset, len } => vec![SaveRange { block, offset, len }],
                Command::Group(g) => {
                    let ranges = g.clone();
                    front.recycle_ranges(g);
                    ranges
                }
                Command::Bitmap { block, offset, page_size, pages, words } => {
                    let mut ranges = Vec::new();
                    crate::bitmap::for_each_run(&words, pages, |first, n| {
                        ranges.push(SaveRange { block, offset: offset + first * page_size, len: n * page_size });
                        Ok::<(), ()>(())
                    })
                    .unwrap();
                    front.recycle_words(words);
                    ranges
                }
                _ => panic!("not a save"),
            })
            .collect()
    }

    fn page(i: u64) -> SaveRange {
        SaveRange { block: 0, offset: i * 4096 % BLOCK, len: 4096 }
    }

    #[test]
    fn batches_queue_in_groups_of_their_ranges_in_order() {
        let (front, _ram) = front();
        assert_eq!(front.save(0, 0, 1).unwrap_err().kind, ErrorKind::State);
        assert_eq!(front.save_ranges((0..10).map(page)).unwrap_err().kind, ErrorKind::State);
        front.open_window();
        // One bad range (the last): nothing queued.
        let bad = SaveRange { block: 0, offset: BLOCK - 1, len: 2 };
        let e = front.save_ranges((0..2500).map(page).chain([bad])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(front.is_empty());
        // Empty ranges are dropped; 2500 others make groups of 1024, 1024, 452.
        let ranges: Vec<SaveRange> =
            (0..2600).map(|i| if i % 26 == 25 { SaveRange { len: 0, ..page(i) } } else { page(i) }).collect();
        front.save_ranges(ranges.iter().copied()).unwrap();
        front.save(0, 4096, 8192).unwrap();
        let entries = drain(&front);
        assert_eq!(entries.iter().map(Vec::len).collect::<Vec<_>>(), [1024, 1024, 452, 1]);
        let want: Vec<SaveRange> = ranges.into_iter().filter(|r| r.len > 0).collect();
        assert_eq!(entries[..3].concat(), want);
        assert_eq!(entries[3], [SaveRange { block: 0, offset: 4096, len: 8192 }]);
        // The buffers come back and are reused.
        assert_eq!(front.ranges.made.load(Ordering::Relaxed), 3);
        // A bitmap of 3200 words: 64 pages (of 256 bytes) a word, later bits ignored.
        let mut bits = vec![0u64; 3300];
        bits[3] = 0b1110_0110;
        bits[1023] = 1 << 63;
        bits[2048] = 0b11;
        bits[3071] = 1 << 63;
        bits[3072] = 1;
        bits[3199] = 1 << 40 | 1 << 63;
        bits[3200] = 1;
        let run = |first: u64, pages: u64| SaveRange { block: 0, offset: (16 + first) * 256, len: pages * 256 };
        for _ in 0..3 {
            front.save_ranges((0..3000).map(page)).unwrap();
            front.save_bitmap(0, &bits[..1024], 16, 1024 * 64, 256).unwrap();
            // Groups of words 1024.., 2048.., 3072..; the first is clear and not queued.
            front.save_bitmap(0, &bits[1024..], 16 + 1024 * 64, (3199 - 1024) * 64 + 41, 256).unwrap();
            front.save_bitmap(0, &bits[1024..2048], 16 + 1024 * 64, 1024 * 64, 256).unwrap();
            let entries = drain(&front);
            assert_eq!(entries.iter().map(Vec::len).collect::<Vec<_>>(), [1024, 1024, 952, 3, 2, 2]);
            assert_eq!(entries[3], [run(193, 2), run(197, 3), run(1023 * 64 + 63, 1)]);
            // A run across a group boundary comes in two pieces (the transfer thread merges them).
            assert_eq!(entries[4], [run(2048 * 64, 2), run(3071 * 64 + 63, 1)]);
            assert_eq!(entries[5], [run(3072 * 64, 1), run(3199 * 64 + 40, 1)]);
        }
        // All filled before any was popped, reused ever since.
        assert_eq!(front.ranges.made.load(Ordering::Relaxed), 3);
        assert_eq!(front.words.made.load(Ordering::Relaxed), 3);
        assert!(front.close_window());
        assert!(!front.close_window());
    }

    #[test]
    fn callers_wait_for_group_buffers_until_the_consumer_frees_them() {
        let (front, _ram) = front();
        front.open_window();
        // Four callers each queue more groups than may exist at once.
        const EACH: u64 = (MAX_GROUPS as u64 + 44) * GROUP as u64;
        let got = thread::scope(|s| {
            let callers: Vec<_> = (0..4)
                .map(|c| {
                    let front = &front;
                    s.spawn(move || front.save_ranges((0..EACH).map(|i| SaveRange { len: 1 + c, ..page(i) })))
                })
                .collect();
            // The callers fill every buffer there may be, then sleep.
            while front.ranges.made.load(Ordering::Relaxed) < MAX_GROUPS || front.waiting.load(Ordering::SeqCst) == 0 {
                assert!(!callers.iter().all(|c| c.is_finished()), "the callers never waited");
                thread::yield_now();
            }
            front.set_consumer(thread::current());
            let mut got = vec![Vec::new(); 4];
            while callers.iter().any(|c| !c.is_finished()) || !front.is_empty() {
                for entry in drain(&front) {
                    got[entry[0].len as usize - 1].extend(entry);
                }
                thread::park_timeout(Duration::from_millis(1));
            }
            callers.into_iter().for_each(|c| c.join().unwrap().unwrap());
            got
        });
        // Each caller's ranges all arrived, in its order.
        for (c, ranges) in got.iter().enumerate() {
            let want: Vec<SaveRange> = (0..EACH).map(|i| SaveRange { len: 1 + c as u64, ..page(i) }).collect();
            assert!(*ranges == want, "caller {c}: {} ranges", ranges.len());
        }
        assert!(front.ranges.made.load(Ordering::Relaxed) <= MAX_GROUPS);
    }

    #[test]
    fn saves_wait_while_more_than_the_bound_is_queued() {
        const MAX: u64 = 1 << 20;
        const SAVE: u64 = 256 << 10;
        let (front, _ram) = bounded_front(Some(MAX));
        front.open_window();
        let returned = AtomicUsize::new(0);
        thread::scope(|s| {
            let saver = s.spawn(|| {
                for i in 0..16 {
                    front.save(0, i * SAVE, SAVE)?;
                    assert!(front.queued_bytes.load(Ordering::SeqCst) <= MAX, "save {i} returned over the bound");
                    returned.fetch_add(1, Ordering::SeqCst);
                }
                front.save_bitmap(0, &[u64::MAX; 4], 0, 4 * 64, 16 << 10)
            });
            // Four saves fill the bound; the fifth is queued and waits.
            while front.waiting.load(Ordering::SeqCst) == 0 {
                assert!(!saver.is_finished(), "the saver never waited");
                thread::yield_now();
            }
            assert_eq!(returned.load(Ordering::SeqCst), 4);
            assert_eq!(front.queued_bytes.load(Ordering::SeqCst), 5 * SAVE);
            // Each command the consumer takes lets a waiting save return.
            front.set_consumer(thread::current());
            let mut taken = Vec::new();
            while !saver.is_finished() || !front.is_empty() {
                match front.pop() {
                    Some(cmd) => {
                        taken.push(front.counted(&cmd));
                        front.taken(*taken.last().unwrap());
                    }
                    None => thread::park_timeout(Duration::from_millis(1)),
                }
            }
            saver.join().unwrap().unwrap();
            // 16 saves, and the bitmap's 256 pages of 16 KiB in one entry.
            assert_eq!(taken, [[SAVE; 16].as_slice(), &[4 << 20]].concat());
        });
        assert_eq!(front.queued_bytes.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_command_counts_the_bytes_it_saves() {
        let bitmap = |pages, words: Vec<u64>| Command::Bitmap { block: 0, offset: 0, page_size: 4096, pages, words };
        // Bits from `pages` on are not pages.
        assert_eq!(bitmap(70, vec![u64::MAX, u64::MAX]).saved_bytes(), 70 * 4096);
        assert_eq!(bitmap(128, vec![0b1011, 1 << 63]).saved_bytes(), 4 * 4096);
        assert_eq!(bitmap(64, vec![u64::MAX, u64::MAX]).saved_bytes(), 64 * 4096);
        assert_eq!(Command::Group(vec![page(0), SaveRange { len: 10, ..page(3) }]).saved_bytes(), 4106);
        assert_eq!(Command::Save { block: 0, offset: 0, len: 7 }.saved_bytes(), 7);
        assert_eq!(Command::Stream(vec![0; 100]).saved_bytes(), 0);
        // Without a bound nothing is counted.
        let (front, _ram) = front();
        assert_eq!(front.counted(&Command::Save { block: 0, offset: 0, len: 7 }), 0);
    }

    #[test]
    fn callers_waiting_for_room_fail_with_the_stored_error() {
        let (front, _ram) = front();
        front.open_window();
        thread::scope(|s| {
            let caller = s.spawn(|| front.save_ranges((0..(MAX_GROUPS as u64 + 1) * GROUP as u64).map(page)));
            while front.waiting.load(Ordering::SeqCst) == 0 {
                assert!(!caller.is_finished(), "the caller never waited");
                thread::yield_now();
            }
            front.error.set(Error::new(ErrorKind::Aborted, "test"));
            assert_eq!(caller.join().unwrap().unwrap_err().kind, ErrorKind::Aborted);
        });
        assert_eq!(front.save(0, 0, 1).unwrap_err().kind, ErrorKind::Aborted);
    }
}
