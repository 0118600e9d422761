//! The source's handle: what hypervisor threads call. Saves and stream
//! bytes are checked and queued for the transfer thread (`Front`); window
//! ends, post-copy and close wait for it.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::command::Command;
use super::postcopy;
use super::save_range::SaveRange;
use super::shared::Shared;
use super::transfer::Transfer;
use crate::engine::link::{self, Negotiated};
use crate::engine::pin::{self, Hint, Unregistration};
use crate::engine::postcopy::{PostcopyLink, PostcopySummary, StalePages};
use crate::engine::ram::RamBlocks;
use crate::engine::stats::{Counters, Stats};
use crate::engine::sync::Done;
use crate::engine::{Config, Ending};
use crate::host::readiness::Readiness;
use crate::logging;
use crate::wire::{CONTROL_TAG_LEN, MAX_PAYLOAD, SEND_INCREMENT};
use crate::{Error, ErrorKind, Result};

/// The source end of a migration connection.
///
/// Thread safety: `save` may be called from several threads at once, and
/// alongside `iteration_end`. `abort`, `stats`, `error` and `event_fd` may
/// run alongside any call (`abort` is there to stop one). The calls that
/// shape the stream and the windows (`iteration_begin`, `iteration_end`,
/// `put`, `flush`, `postcopy`, `close`) are meant for one thread; they take `&self`
/// so that an `abort` from another thread can stop one blocked in them (the
/// C ABI relies on that). Called at once, they queue their work one call
/// after another, so no stream byte lands inside a window.
pub struct Source {
    shared: Arc<Shared>,
    /// The transfer thread, until `close` (or drop) joined it; locked so
    /// that `close` can take `&self` (see `finish`).
    thread: Mutex<Option<JoinHandle<()>>>,
    negotiated: Negotiated,
    stop: Arc<AtomicBool>,
    /// Stream bytes `put` and not queued yet. Locked while `put`, `flush`,
    /// `iteration_begin`, `iteration_end` and `postcopy` check the window
    /// and queue their commands, so that no byte is queued inside a window
    /// (a QEMU destination accepts none there).
    outgoing: Mutex<Vec<u8>>,
    unregistration: Option<Arc<Unregistration>>,
    /// `postcopy` was called: the guest runs on the destination from then
    /// on, so no window may write into its RAM any more.
    postcopy_called: AtomicBool,
    /// `close` was called (only the first closes).
    close_called: AtomicBool,
    /// Everything put was flushed out, and nothing was saved or put since:
    /// a QEMU destination that disconnects now has all of it.
    synced: AtomicBool,
    /// `close` returned `Ok`.
    closed_ok: AtomicBool,
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
        let event = Readiness::new()?;
        let link = link::connect(host, port, config, ram.total_bytes(), counters.clone()).inspect_err(|e| {
            logging::error(format_args!("source: cannot connect to {host}:{port}: {e}"));
        })?;
        let shared = Shared::new(ram.clone(), counters, event, config);
        let negotiated = link.negotiated;
        logging::info(format_args!("source: connected to {host}:{port}: {negotiated}"));
        let stop = link.stop.clone();
        let transfer = Transfer::new(link, config, ram.clone(), shared.clone())?;
        let unregistration = transfer.unregistration();
        let thread = thread::Builder::new()
            .name("rdmamig-source".into())
            .spawn(move || transfer.run())
            .map_err(|e| Error::new(ErrorKind::State, format!("cannot start the transfer thread: {e}")))?;
        shared.front.set_consumer(thread.thread().clone());
        Ok(Source::new(shared, Some(thread), negotiated, stop, unregistration))
    }

    fn new(
        shared: Arc<Shared>,
        thread: Option<JoinHandle<()>>,
        negotiated: Negotiated,
        stop: Arc<AtomicBool>,
        unregistration: Option<Arc<Unregistration>>,
    ) -> Source {
        Source {
            shared,
            thread: Mutex::new(thread),
            negotiated,
            stop,
            outgoing: Mutex::new(Vec::new()),
            unregistration,
            postcopy_called: AtomicBool::new(false),
            close_called: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            closed_ok: AtomicBool::new(false),
        }
    }

    /// A source with no peer and no transfer thread (for tests of the
    /// paths that refuse a call before it reaches either).
    #[cfg(feature = "test-support")]
    pub(crate) fn detached() -> Source {
        let shared = Shared::new(
            RamBlocks::new(),
            Arc::new(Counters::new()),
            Readiness::new().expect("an eventfd"),
            &Config::default(),
        );
        let negotiated =
            Negotiated { pin_all: false, extensions: true, authenticated: false, postcopy_recovery: false };
        Source::new(shared, None, negotiated, Arc::new(AtomicBool::new(false)), None)
    }

    /// What the two sides agreed on (pin-all, rdmamig extensions).
    pub fn negotiated(&self) -> Negotiated {
        self.negotiated
    }

    /// Opens an iteration window: `save` calls are legal until `iteration_end`.
    /// Stream bytes `put` so far go out first (a QEMU destination must see the
    /// hook marker before any registration message). The first window also
    /// exchanges the RAM-block lists. `State` if a window is open or
    /// `postcopy` was called.
    pub fn iteration_begin(&self) -> Result<()> {
        let mut outgoing = self.outgoing.lock();
        self.synced.store(false, Ordering::Relaxed);
        self.shared.front.error.check()?;
        if self.shared.front.window_open() {
            return Err(Error::new(ErrorKind::State, "an iteration window is already open"));
        }
        self.check_no_postcopy()?;
        self.queue_stream(&mut outgoing, true)?;
        self.shared.front.open_window();
        Ok(())
    }

    /// Queues `len` bytes at `offset` of block `block` for transfer and
    /// returns at once, or with `Config::max_queued_bytes` once the queue is
    /// within it again. (`save_ranges` and `save_bitmap` queue many at once.)
    pub fn save(&self, block: u32, offset: u64, len: u64) -> Result<()> {
        self.shared.front.save(block, offset, len)
    }

    /// Queues every range of `ranges` for transfer, as that many `save`
    /// calls would, in groups of up to 1024 ranges per queue entry. All are
    /// checked first: one bad range refuses the call and nothing is queued.
    /// (The ranges are walked twice: to check, then to queue.)
    pub fn save_ranges<I>(&self, ranges: I) -> Result<()>
    where
        I: IntoIterator<Item = SaveRange>,
        I::IntoIter: Clone,
    {
        self.shared.front.save_ranges(ranges)
    }

    /// Queues the dirty pages of block `block` a dirty bitmap names: bit
    /// `i % 64` of `bitmap[i / 64]` stands for page `first_page + i` of
    /// `page_size` bytes, for `i` below `page_count` (later bits are
    /// ignored). The bitmap is copied into the queue, 65536 pages per entry
    /// (entries with no bit set skipped); the transfer thread sends each run
    /// of set bits as one range. The pages must lie inside the block, and
    /// `bitmap` must hold `page_count` bits.
    pub fn save_bitmap(
        &self,
        block: u32,
        bitmap: &[u64],
        first_page: u64,
        page_count: u64,
        page_size: u64,
    ) -> Result<()> {
        self.shared.front.save_bitmap(block, bitmap, first_page, page_count, page_size)
    }

    /// Hints how `len` bytes at `offset` of block `block` will be sent: cold
    /// ranges are unpinned first when the pin budget is full, hot ones last.
    /// Applies to chunks pinned later too; takes effect in queue order.
    pub fn hint(&self, block: u32, offset: u64, len: u64, hint: Hint) -> Result<()> {
        self.shared.front.error.check()?;
        self.shared.front.ram().get(block)?.check_range(offset, len)?;
        if len > 0 {
            self.shared.front.push(Command::Hint { block, offset, len, hint })?;
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
        let start;
        let done = Arc::new(Done::default());
        {
            // Under the stream lock: no stream byte or POSTCOPY of another
            // thread's call can be queued between the window's end and its
            // EndIteration (it would land inside the window).
            let _outgoing = self.outgoing.lock();
            // Waits for saves still queueing; later ones see the window closed.
            if !self.shared.front.close_window() {
                return Err(Error::new(ErrorKind::State, "no iteration window is open"));
            }
            start = Instant::now();
            self.shared.front.push(Command::EndIteration(done.clone()))?;
        }
        let r = self.wait(&done);
        let took = start.elapsed();
        Counters::add(&self.shared.counters.iteration_end_ns, took.as_nanos() as u64);
        if r.is_ok() && logging::enabled(logging::Level::Debug) {
            let n = self.shared.counters.iterations.load(Ordering::Relaxed);
            logging::debug(format_args!(
                "source: iteration window {n} complete ({} ms in iteration_end)",
                took.as_millis()
            ));
        }
        r
    }

    /// Appends device-state bytes to the stream (sent in QEMU_FILE messages).
    /// Inside an iteration window they are held back until the window ends:
    /// QEMU's destination accepts no stream message inside one.
    pub fn put(&self, data: &[u8]) -> Result<()> {
        let mut outgoing = self.outgoing.lock();
        self.shared.front.error.check()?;
        self.synced.store(false, Ordering::Relaxed);
        outgoing.extend_from_slice(data);
        if !self.shared.front.window_open() {
            self.queue_stream(&mut outgoing, false)?;
        }
        Ok(())
    }

    /// Sends every byte `put` so far and waits until it is out. Not inside an
    /// iteration window (see `put`).
    pub fn flush(&self) -> Result<()> {
        {
            let mut outgoing = self.outgoing.lock();
            if self.shared.front.window_open() {
                return Err(Error::new(ErrorKind::State, "flush inside an iteration window: end the window first"));
            }
            self.queue_stream(&mut outgoing, true)?;
        }
        self.call(Command::Sync)?;
        self.synced.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Queues the buffered stream bytes as messages: whole pieces only, or all.
    fn queue_stream(&self, outgoing: &mut Vec<u8>, all: bool) -> Result<()> {
        // An rdmamig peer takes whole messages, less the room an
        // authenticated connection's tag takes; QEMU reads 32 KiB pieces.
        let piece = if self.negotiated.extensions { MAX_PAYLOAD - CONTROL_TAG_LEN } else { SEND_INCREMENT };
        let whole = if all { outgoing.len() } else { outgoing.len() / piece * piece };
        for chunk in outgoing[..whole].chunks(piece) {
            self.shared.front.push(Command::Stream(chunk.to_vec()))?;
        }
        outgoing.drain(..whole);
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// Post-copy switch-over (rdmamig destinations only): after the last
    /// iteration window and the device state (`flush`ed), with the guest
    /// stopped, hands over the pages the destination does not have right
    /// (`stale`: dirtied since they were sent, or never sent) and returns
    /// once the destination has pulled every one of them with RDMA READs
    /// (POSTCOPY_DONE), with what it reports. Until then the 2 MiB windows
    /// of the blocks that hold stale pages are registered for remote read
    /// (within the pin budget: refused with `PinBudget` if they do not fit)
    /// and the memory must stay mapped and unchanged. Then `close` as usual:
    /// from this call on, iteration windows and another post-copy are
    /// refused (`State`). Runs on the caller's thread; the transfer thread
    /// does the work.
    pub fn postcopy(&self, stale: &[StalePages]) -> Result<PostcopySummary> {
        if !self.negotiated.extensions {
            return Err(Error::new(
                ErrorKind::State,
                "post-copy needs an rdmamig destination (QEMU has no such extension)",
            ));
        }
        {
            // Under the lock `iteration_begin` holds: no window opens from here on.
            let mut outgoing = self.outgoing.lock();
            if self.shared.front.window_open() {
                return Err(Error::new(ErrorKind::State, "post-copy inside an iteration window: end the window first"));
            }
            if self.shared.counters.iterations.load(Ordering::Relaxed) == 0 {
                return Err(Error::new(ErrorKind::State, "post-copy needs a pre-copy window first"));
            }
            self.check_no_postcopy()?;
            postcopy::check(self.shared.front.ram(), stale)?;
            // The device state goes out first: the transfer thread takes commands in order.
            self.queue_stream(&mut outgoing, true)?;
            self.postcopy_called.store(true, Ordering::Relaxed);
        }
        let slot = Arc::new(Mutex::new(None));
        self.call(|done| Command::Postcopy(stale.to_vec(), slot.clone(), done))?;
        let summary = slot.lock().take();
        summary.ok_or_else(|| Error::new(ErrorKind::State, "post-copy ended without a summary"))
    }

    /// Where post-copy's connection is: waits until it is not `known` (up to
    /// `timeout`; `None`: for ever) and returns where it is then (still
    /// `known` if the time ran out). For a hypervisor that shows its own
    /// states while `postcopy` runs on another thread: `Lost` (paused),
    /// `Recovering`, `Up` again; `Ended` once the connection ended. Any
    /// thread.
    pub fn wait_postcopy_link(&self, known: PostcopyLink, timeout: Option<Duration>) -> PostcopyLink {
        self.shared.postcopy_link.wait_change(known, timeout)
    }

    /// With `Config::postcopy_recovery_by_hypervisor`, after post-copy's
    /// connection was lost (`PostcopyLink::Lost`): admit the destination's
    /// recovery connection now (within what is left of the window). `State`
    /// without the setting or when the link is not lost. Any thread.
    pub fn postcopy_recover(&self) -> Result<()> {
        self.shared.postcopy_link.recover()
    }

    fn check_no_postcopy(&self) -> Result<()> {
        if self.postcopy_called.load(Ordering::Relaxed) {
            return Err(Error::new(ErrorKind::State, "post-copy was started: the guest runs on the destination"));
        }
        Ok(())
    }

    /// A file descriptor to poll (POLLIN, EPOLLIN) for the connection's
    /// failure, so that an event loop learns of a destination that went away
    /// (its ERROR, a disconnect, the liveness check) without a call blocked
    /// on the connection. Level-triggered: readable once the connection has
    /// failed (from then on every call returns the error, see
    /// [`error`](Self::error)), and for good; never before. A source has
    /// nothing else to read: an rdmamig source opens no return path. Do not
    /// read from or write to it (an eventfd, the library's); valid until the
    /// `Source` is closed or dropped.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.shared.event.fd()
    }

    /// The stored error, if the connection failed (not after a close that
    /// succeeded: the stored "the connection is closed" refuses later calls).
    pub fn error(&self) -> Option<Error> {
        if self.closed_ok.load(Ordering::Acquire) {
            return None;
        }
        self.shared.front.error.get()
    }

    /// Aborts the migration: every later call fails with `Aborted` at once;
    /// the transfer thread sends ERROR and tears down.
    pub fn abort(&self) {
        self.shared.front.error.set(Error::new(ErrorKind::Aborted, "the migration was aborted by the hypervisor"));
        self.shared.event.set(true);
        self.stop.store(true, Ordering::Relaxed);
        self.shared.front.wake();
    }

    /// Ends an open window, flushes the stream, waits for queued work, and
    /// disconnects. With an rdmamig destination it first runs the completion
    /// handshake: [`Ending::Completed`] means the destination checked and
    /// acknowledged that it has everything. A QEMU destination has no
    /// handshake: [`Ending::Unverified`] means everything was sent and every
    /// write completed, but only QEMU itself knows whether it loaded it (also
    /// when QEMU disconnected first, after the last successful `flush` with
    /// nothing put or saved since: it does so once it has loaded the stream).
    ///
    /// Takes `&self` so that another thread may [`abort`](Self::abort) a
    /// close that waits for the destination (share the source, e.g. in an
    /// `Arc`): the close then fails with `Aborted`. Only the first call
    /// closes; a second, also one made while the first runs, fails with
    /// `State`. Afterwards the calls that would send fail, and
    /// [`error`](Self::error) is the close's failure, if any.
    pub fn close(&self) -> Result<Ending> {
        if self.close_called.swap(true, Ordering::AcqRel) {
            return Err(Error::new(ErrorKind::State, "close was called already"));
        }
        let r = if self.shared.front.window_open() { self.iteration_end() } else { Ok(()) };
        let synced = self.synced.load(Ordering::Relaxed);
        let r = r.and_then(|()| self.flush()).and_then(|()| {
            if self.negotiated.extensions {
                self.call(Command::End).map(|()| Ending::Completed)
            } else {
                Ok(Ending::Unverified)
            }
        });
        // A QEMU destination disconnects once it has loaded the stream: when
        // everything was out before, that is its end, not a failure.
        let r = match r {
            Err(e) if e.kind == ErrorKind::Disconnected && synced && !self.negotiated.extensions => {
                Ok(Ending::Unverified)
            }
            r => r,
        };
        self.shutdown();
        match &r {
            Ok(Ending::Completed) => logging::info(format_args!("source: migration completed (END acknowledged)")),
            Ok(Ending::Unverified) => logging::info(format_args!(
                "source: closed; everything sent and written, unverified (a QEMU destination has no completion handshake)"
            )),
            Err(e) => logging::error(format_args!("source: close failed, the migration did not complete: {e}")),
        }
        self.closed_ok.store(r.is_ok(), Ordering::Release);
        r
    }

    fn call(&self, make: impl FnOnce(Arc<Done>) -> Command) -> Result<()> {
        let done = Arc::new(Done::default());
        self.shared.front.push(make(done.clone()))?;
        self.wait(&done)
    }

    /// Waits until the transfer thread has done a queued command (or the connection failed).
    fn wait(&self, done: &Done) -> Result<()> {
        done.wait(|| self.shared.front.error.get())
    }

    fn shutdown(&self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.lock().take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
        pin::settle_at_close(self.unregistration.as_deref());
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.shutdown();
    }
}
