//! The source's transfer thread: merges saved ranges into writes, has their
//! chunks registered on both sides (`registration` asks the destination,
//! `chunks` keeps the budgets), posts RDMA WRITEs within in-flight limits
//! and sends the other control messages.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use super::chunks::{sge_in, ChunkKey, ChunkState};
use super::pacing::Pacer;
use super::piece::Piece;
use super::registration::RUN_AHEAD;
use super::sparse::{self, Part};
use super::staging::Staging;
use super::write_window::{Wait, WriteWindow};
use super::{Command, Shared};
use crate::bitmap::for_each_run;
use crate::engine::link::Link;
use crate::engine::pin::{Lru, PinAll, Pins, Unregistration};
use crate::engine::postcopy;
use crate::engine::ram::{chunk_of, RamBlocks};
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::host::{pagemap, GuestRange};
use crate::logging;
use crate::verbs::{Access, MemoryRegion, Sge};
use crate::wire::{CommandType, Compress, EndSummary, CHUNK_SIZE};
use crate::{Error, ErrorKind, Result};

/// Ranges being merged at once: saves from several hypervisor threads interleave.
const MERGE_SLOTS: usize = 4;
/// Staging ring size at most (a quarter of a smaller pin budget, at least a chunk).
const STAGING: u64 = 8 << 20;

pub(super) struct BlockState {
    /// The destination's host address of the block start, and its offset in its RAM address space.
    pub remote_base: u64,
    pub dest_offset: u64,
    /// Pin-all: whole-block keys on both sides.
    pub remote_rkey: Option<u32>,
    pub local: Option<MemoryRegion>,
    pub chunks: Vec<ChunkState>,
}

pub(super) struct Transfer {
    pub link: Link,
    pub ram: RamBlocks,
    pub shared: Arc<Shared>,
    pub blocks: Vec<BlockState>,
    pub blocks_exchanged: bool,
    pub pins: Pins,
    /// Pin-all registrations under way (started at connect).
    pub pin_all: Option<PinAll>,
    /// Pinned chunks in the order they are unpinned.
    pub lru: Lru<ChunkKey>,
    /// Bytes of chunks registered on the destination (held to the budget it
    /// announced, `link.peer_pin_budget`).
    pub remote_pinned: u64,
    /// Chunks unpinned whose destination registration is still to be released.
    pub to_unregister: Vec<ChunkKey>,
    /// Ranges still growing by merging with the next saves, oldest first.
    pending: Vec<Piece>,
    /// Zero ranges for the next COMPRESS messages.
    pub zeros: Vec<Compress>,
    /// Writes waiting for their chunk's registration, in arrival order.
    pub deferred: Vec<Piece>,
    /// Chunks to ask the destination for in the next REGISTER_REQUEST.
    pub to_register: Vec<ChunkKey>,
    /// What the REGISTER_REQUEST whose response is still to come asked for
    /// (the link holds the request: `Link::request_pending`): one entry per
    /// registration, a first chunk and how many chunks from it.
    pub registering: Vec<(ChunkKey, usize)>,
    /// A REGISTER_REQUEST was sent (the first is smaller: `register_ahead`).
    pub requested: bool,
    /// Posted writes not known to be complete, and the staging ring.
    window: WriteWindow,
    pacer: Pacer,
    /// What a failed post-copy left registered for remote read: released
    /// after the link is gone (see `postcopy::source::run`).
    postcopy_exposed: Option<postcopy::source::Exposed>,
    /// This side's settings (post-copy's recovery listener takes them).
    config: Config,
}

impl Transfer {
    pub fn new(link: Link, config: &Config, ram: RamBlocks, shared: Arc<Shared>) -> Result<Transfer> {
        let pins = Pins::new(link.pd.clone(), config, shared.counters.clone())?;
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
        Ok(Transfer {
            link,
            ram,
            shared,
            blocks,
            blocks_exchanged: false,
            pins,
            pin_all: None,
            lru: Lru::default(),
            remote_pinned: 0,
            to_unregister: Vec::new(),
            pending: Vec::with_capacity(MERGE_SLOTS),
            zeros: Vec::new(),
            deferred: Vec::new(),
            to_register: Vec::new(),
            registering: Vec::new(),
            requested: false,
            window: WriteWindow::default(),
            pacer: Pacer::new(),
            postcopy_exposed: None,
            config: config.clone(),
        })
    }

    pub fn unregistration(&self) -> Option<Arc<Unregistration>> {
        self.pins.worker()
    }

    pub fn run(mut self) {
        pagemap::keep_open();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()))
            .unwrap_or_else(|_| Err(Error::new(ErrorKind::State, "the transfer thread panicked")));
        // A pin-all still under way stops first (its drop waits for its thread).
        drop(self.pin_all.take());
        let failed = result.is_err();
        let ended = match result {
            Ok(()) => Error::new(ErrorKind::Aborted, "the connection is closed"),
            Err(e) => {
                logging::error(format_args!("source: the connection failed: {e}"));
                if !matches!(e.kind, ErrorKind::PeerError | ErrorKind::Disconnected) {
                    self.link.send_error();
                }
                e
            }
        };
        // Later calls see the stored error; so does whatever still waits in the queue.
        let stored = self.shared.front.error.set(ended);
        // Not after a close that went well: only a failure makes the fd readable.
        if failed {
            self.shared.event.set(true);
        }
        while let Some(cmd) = self.shared.front.pop() {
            if let Some(d) = cmd.done() {
                d.set(Err(stored.clone()));
            }
        }
        // Destroy the QP, CQ and ids, then hand every registration to the worker.
        let Transfer { link, pins, blocks, window, postcopy_exposed, .. } = self;
        drop(link);
        let chunks =
            blocks.into_iter().flat_map(|b| b.local.into_iter().chain(b.chunks.into_iter().filter_map(|c| c.local)));
        for mr in chunks {
            pins.release(mr);
        }
        window.release(&pins);
        if let Some(exposed) = postcopy_exposed {
            exposed.release(&pins);
        }
    }

    fn serve(&mut self) -> Result<()> {
        // Pin-all starts at connect, on its own thread, and overlaps the
        // destination's; it pins for write, as QEMU does (every page is pinned
        // anyway). One CPU stays free for the guest, which runs meanwhile.
        if self.link.negotiated.pin_all {
            self.pin_all = Some(self.pins.pin_all(&self.ram, Access::LOCAL_WRITE, 1)?);
        }
        loop {
            if self.link.stop.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Aborted, "the migration was aborted by the hypervisor"));
            }
            match self.shared.front.pop() {
                Some(cmd) => {
                    let done = cmd.done().cloned();
                    let last = matches!(cmd, Command::End(_));
                    // A REGISTER response that arrived meanwhile is taken at once: its writes go out.
                    let handled = self.handle(cmd).and_then(|()| self.poll_registration(false).map(drop));
                    if let Err(e) = handled {
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
                    if self.shared.closing.load(Ordering::Relaxed) && self.shared.front.is_empty() {
                        return Ok(());
                    }
                    self.link.flush_writes()?;
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
            Command::Group(group) => {
                self.exchange_blocks()?;
                let sent = group.iter().try_for_each(|r| self.save(r.block, r.offset, r.len));
                self.shared.front.recycle_ranges(group);
                sent
            }
            Command::Bitmap { block, offset, page_size, pages, words } => {
                self.exchange_blocks()?;
                let sent =
                    for_each_run(&words, pages, |first, n| self.save(block, offset + first * page_size, n * page_size));
                self.shared.front.recycle_words(words);
                sent
            }
            Command::Stream(data) => {
                self.pace(data.len() as u64)?;
                self.settle_registration()?;
                self.link.post_message(CommandType::QemuFile, |w| w.push_bytes(&data))?;
                Counters::add(&self.shared.counters.stream_bytes, data.len() as u64);
                Ok(())
            }
            Command::Hint { block, offset, len, hint } => {
                self.hint(block, offset, len, hint);
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
                self.flush_unregister()?;
                // An aborted window must never look complete to the destination.
                self.link.check_stop("the end of the iteration window")?;
                // The SEND completes after every write posted before it (in-order send queue).
                self.link.post_message(CommandType::RegisterFinished, |_| Ok(()))?;
                self.retire_completed();
                Counters::add(&self.shared.counters.iterations, 1);
                done.set(Ok(()));
                Ok(())
            }
            Command::Postcopy(stale, slot, done) => {
                self.settle_registration()?;
                self.flush_pending()?;
                self.register_deferred()?;
                self.flush_unregister()?;
                self.link.fence()?;
                let summary = postcopy::source::run(
                    &mut self.link,
                    &self.pins,
                    &self.ram,
                    &stale,
                    &mut self.postcopy_exposed,
                    &self.config,
                )?;
                *slot.lock() = Some(summary);
                done.set(Ok(()));
                Ok(())
            }
            Command::End(done) => {
                self.settle_registration()?;
                // What END counts comes from this thread's own counters: it sent all of it.
                let stats = self.shared.counters.snapshot();
                let summary = EndSummary { stream_bytes: stats.stream_bytes, windows: stats.iterations };
                self.link.request(CommandType::End, |w| w.push(&summary), CommandType::EndAck, |_| Ok(()))?;
                done.set(Ok(()));
                self.link.await_peer_close();
                Ok(())
            }
        }
    }

    fn save(&mut self, block: u32, mut offset: u64, len: u64) -> Result<()> {
        let end = offset + len;
        while offset < end {
            // Pieces end at chunk boundaries: a piece grows only within its chunk.
            let piece_end = ((offset / CHUNK_SIZE + 1) * CHUNK_SIZE).min(end);
            let grows = self
                .pending
                .iter_mut()
                .find(|p| p.block == block && p.offset + p.len == offset && chunk_of(p.offset) == chunk_of(offset));
            if let Some(p) = grows {
                p.len = piece_end - p.offset;
            } else {
                if self.pending.len() == MERGE_SLOTS {
                    let oldest = self.pending.remove(0);
                    self.send_piece(oldest)?;
                }
                self.pending.push(Piece { block, offset, len: piece_end - offset });
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
        // First touch of an unregistered chunk: zero runs need no registration (and holes are not read).
        let mut data = false;
        let block = &self.ram.blocks()[p.block as usize];
        for part in sparse::split(block, p, self.link.negotiated.extensions) {
            match part {
                Part::Zero { offset, len } => self.queue_zero(p.block, dest_offset + offset, len)?,
                Part::Data(d) => {
                    data = true;
                    self.deferred.push(d);
                }
            }
        }
        if !data {
            return Ok(());
        }
        self.blocks[p.block as usize].chunks[chunk].awaiting = true;
        self.to_register.push((p.block, chunk));
        if !self.link.request_pending() && self.to_register.len() >= self.register_ahead() {
            self.begin_registration()?;
        } else if self.to_register.len() >= RUN_AHEAD {
            self.poll_registration(true)?;
        }
        Ok(())
    }

    /// Posts one RDMA WRITE, registering the local chunk if needed (or
    /// staging its bytes when the chunk is not to be pinned).
    pub(super) fn write(&mut self, p: Piece) -> Result<()> {
        self.pace(p.len)?;
        self.make_room(p.len)?;
        let state = &self.blocks[p.block as usize];
        let guest = self.ram.blocks()[p.block as usize].range(p.offset, p.len);
        let (sge, rkey, staged) = if let (Some(mr), Some(rkey)) = (&state.local, state.remote_rkey) {
            (sge_in(mr, guest)?, rkey, false)
        } else {
            let rkey = state.chunks[chunk_of(p.offset)]
                .remote_rkey
                .ok_or_else(|| Error::new(ErrorKind::State, "write to an unregistered chunk"))?;
            match self.local_sge(&p, guest)? {
                Some(sge) => (sge, rkey, false),
                None => (self.stage(guest)?, rkey, true),
            }
        };
        let remote = self.blocks[p.block as usize].remote_base + p.offset;
        let signalled = self.window.signals(p.len);
        // `remote` lies in the chunk (or block) the destination registered for `rkey`.
        let seq = self.link.post_write(sge, remote, rkey, signalled)?;
        self.window.posted(seq, p.len, signalled, staged);
        if staged {
            Counters::add(&self.shared.counters.staged_bytes, p.len);
        } else if !self.link.negotiated.pin_all {
            self.blocks[p.block as usize].chunks[chunk_of(p.offset)].last_write = seq;
        }
        Counters::add(&self.shared.counters.bytes_written, p.len);
        Ok(())
    }

    /// Waits until `bytes` more may go under the bandwidth cap, tending the
    /// connection meanwhile (completions, peer events, liveness, abort).
    fn pace(&mut self, bytes: u64) -> Result<()> {
        let rate = self.shared.max_bandwidth.load(Ordering::Relaxed);
        let now = Instant::now();
        let until = now + self.pacer.delay(now, rate, bytes);
        if until > now {
            // What is gathered counts as sent already.
            self.link.flush_writes()?;
        }
        while let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            thread::sleep(left.min(std::time::Duration::from_millis(20)));
            self.link.check_stop("the bandwidth cap")?;
            self.link.tend()?;
        }
        Ok(())
    }

    /// Copies `guest` into the staging ring (registered on first use, within
    /// the pin budget), waiting for older staged writes to complete while it
    /// is full.
    fn stage(&mut self, guest: GuestRange) -> Result<Sge> {
        if !self.window.has_staging() {
            let size = self.pins.budget().map_or(STAGING, |b| (b / 4).clamp(CHUNK_SIZE, STAGING) & !(CHUNK_SIZE - 1));
            self.make_local_room(size, None)?;
            self.window.set_staging(Staging::new(&self.pins, size)?);
        }
        loop {
            match self.window.stage(guest) {
                Ok(sge) => return Ok(sge),
                Err(None) => return Err(Error::new(ErrorKind::State, "staging ring too small")),
                Err(Some(Wait::Write(seq))) => self.link.wait_write(seq)?,
                Err(Some(Wait::Fence)) => self.link.fence()?,
            }
            self.retire_completed();
        }
    }

    /// Forgets writes known to be complete.
    pub(super) fn retire_completed(&mut self) {
        self.window.retire(self.link.writes_completed());
    }

    /// Waits until a write of `len` bytes fits under the in-flight limits.
    fn make_room(&mut self, len: u64) -> Result<()> {
        loop {
            self.retire_completed();
            match self.window.wait_for_room(len) {
                Some(seq) => self.link.wait_write(seq)?,
                None => return Ok(()),
            }
        }
    }
}
