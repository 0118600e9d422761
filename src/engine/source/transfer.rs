//! The source's transfer thread: merges saved ranges into pieces, sends a
//! chunk's zero ranges (COMPRESS) and has its data registered on both sides
//! before its writes, posts RDMA WRITEs within the in-flight limits and the
//! bandwidth cap, and sends the other control messages. Its parts keep the
//! state: the chunk table (registrations and their budgets), the
//! registrations asked of the destination, the zero queue, the write window
//! (with the staging ring) and the pacer; this file drives them over the link.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use super::chunk_table::{ChunkKey, ChunkTable, Room};
use super::command::Command;
use super::pacing::Pacer;
use super::piece::{pieces, Merging, Piece};
use super::postcopy;
use super::registration::{placed, Registrations, Route, REGISTER_BATCH, RUN_AHEAD};
use super::shared::Shared;
use super::staging::Staging;
use super::write_window::{Wait, WriteWindow};
use super::zeros::ZeroQueue;
use crate::bitmap::for_each_run;
use crate::engine::link::{protocol_error as protocol, Link};
use crate::engine::pin::{Hint, PinAll, Pins, Unregistration};
use crate::engine::postcopy::PostcopyLink;
use crate::engine::ram::{chunk_of, RamBlocks};
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::host::{pagemap, GuestRange};
use crate::logging;
use crate::verbs::{Access, MemoryRegion, Sge};
use crate::wire::{
    BlockSpec, CommandType, DestBlock, EndSummary, RegisterRequest, RegisterResult, CHUNK_SIZE, MAX_REPEAT,
};
use crate::{Error, ErrorKind, Result};

/// Staging ring size at most (a quarter of a smaller pin budget, at least a chunk).
const STAGING: u64 = 8 << 20;

pub(super) struct Transfer {
    link: Link,
    ram: RamBlocks,
    shared: Arc<Shared>,
    blocks_exchanged: bool,
    pins: Pins,
    /// Pin-all registrations under way (started at connect).
    pin_all: Option<PinAll>,
    /// The chunks and their registrations on both sides.
    chunks: ChunkTable,
    /// Pieces still growing by merging with the next saves.
    merging: Merging,
    /// Zero ranges for the next COMPRESS messages.
    zeros: ZeroQueue,
    /// Chunks asked of the destination, and the writes waiting for them.
    registrations: Registrations,
    /// Posted writes not known to be complete, and the staging ring.
    window: WriteWindow,
    pacer: Pacer,
    /// What a failed post-copy left registered for remote read: released
    /// after the link is gone (see `postcopy::run`).
    postcopy_exposed: Option<postcopy::Exposed>,
    /// This side's settings (post-copy's recovery listener takes them).
    config: Config,
}

impl Transfer {
    pub fn new(link: Link, config: &Config, ram: RamBlocks, shared: Arc<Shared>) -> Result<Transfer> {
        let pins = Pins::new(link.pd.clone(), config, shared.counters.clone())?;
        let extensions = link.negotiated.extensions;
        let budgeted = pins.budget().is_some() || link.peer_pin_budget.is_some();
        Ok(Transfer {
            chunks: ChunkTable::new(&ram, extensions, budgeted),
            link,
            ram,
            shared,
            blocks_exchanged: false,
            pins,
            pin_all: None,
            merging: Merging::new(),
            zeros: ZeroQueue::new(extensions),
            registrations: Registrations::default(),
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
        let Transfer { link, pins, chunks, window, postcopy_exposed, shared, .. } = self;
        drop(link);
        for mr in chunks.into_registrations() {
            pins.release(mr);
        }
        window.release(&pins);
        if let Some(exposed) = postcopy_exposed {
            exposed.release(&pins);
        }
        shared.postcopy_link.set(PostcopyLink::Ended);
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
                    let bytes = self.shared.front.counted(&cmd);
                    // A REGISTER response that arrived meanwhile is taken at once: its writes go out.
                    let handled = self.handle(cmd).and_then(|()| self.poll_registration(false).map(drop));
                    self.shared.front.taken(bytes);
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
                self.chunks.hint(block, offset, len, hint);
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
                let summary = postcopy::run(
                    &mut self.link,
                    &self.pins,
                    &self.ram,
                    &stale,
                    &mut self.postcopy_exposed,
                    &self.config,
                    &self.shared.postcopy_link,
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

    fn save(&mut self, block: u32, offset: u64, len: u64) -> Result<()> {
        for p in pieces(block, offset, len) {
            if let Some(oldest) = self.merging.add(p) {
                self.send_piece(oldest)?;
            }
        }
        Ok(())
    }

    /// Sends every range still merging.
    fn flush_pending(&mut self) -> Result<()> {
        for p in self.merging.take() {
            self.send_piece(p)?;
        }
        Ok(())
    }

    /// Sends one merged range: a write, a COMPRESS, or a deferral until its chunk is registered.
    fn send_piece(&mut self, p: Piece) -> Result<()> {
        if self.link.negotiated.pin_all {
            return self.write(p);
        }
        let block = &self.ram.blocks()[p.block as usize];
        let extensions = self.link.negotiated.extensions;
        match self.registrations.route(&mut self.chunks, &mut self.zeros, block, p, extensions) {
            Route::Write => self.write(p),
            Route::Held => Ok(()),
            Route::FirstTouch { registers } => {
                self.zeros_queued()?;
                let waiting = self.registrations.to_register.len();
                if !registers {
                    Ok(())
                } else if !self.link.request_pending() && waiting >= self.registrations.ahead(self.register_batch()) {
                    self.begin_registration()
                } else if waiting >= RUN_AHEAD {
                    self.poll_registration(true).map(drop)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Posts one RDMA WRITE, registering the local chunk if needed (or
    /// staging its bytes when the chunk is not to be pinned).
    fn write(&mut self, p: Piece) -> Result<()> {
        self.pace(p.len)?;
        self.make_room(p.len)?;
        let state = &self.chunks.blocks[p.block as usize];
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
        let remote = self.chunks.blocks[p.block as usize].remote_base + p.offset;
        let signalled = self.window.signals(p.len);
        // `remote` lies in the chunk (or block) the destination registered for `rkey`.
        let seq = self.link.post_write(sge, remote, rkey, signalled)?;
        self.window.posted(seq, p.len, signalled, staged);
        if staged {
            Counters::add(&self.shared.counters.staged_bytes, p.len);
        } else if !self.link.negotiated.pin_all {
            self.chunks.of(&p).last_write = seq;
        }
        Counters::add(&self.shared.counters.bytes_written, p.len);
        Ok(())
    }

    /// Waits until `bytes` more may go under the bandwidth cap, tending the
    /// connection meanwhile (completions, peer events, liveness, abort).
    fn pace(&mut self, bytes: u64) -> Result<()> {
        let rate = self.shared.max_bandwidth.load(Ordering::Relaxed);
        if rate == 0 {
            self.pacer.uncapped();
            return Ok(());
        }
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
    fn retire_completed(&mut self) {
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

    /// Chunks per REGISTER_REQUEST: QEMU serves one per message; otherwise
    /// up to `chunks_per_response`.
    fn register_batch(&self) -> usize {
        if !self.link.negotiated.extensions {
            return 1;
        }
        self.chunks_per_response()
    }

    /// Chunks one REGISTER response may cover (one batch toward an rdmamig
    /// peer, one run of consecutive chunks toward QEMU): up to half of the
    /// smaller budget. The chunks of a response cannot be unpinned until the
    /// writes it allows are posted, and those writes pin their chunks here:
    /// with more than the budget in one response the last of them would find
    /// nothing to unpin. Half, so that a batch never has to unpin the chunks
    /// of the batch before it.
    fn chunks_per_response(&self) -> usize {
        let budget = match (self.pins.budget(), self.link.peer_pin_budget) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(u64::MAX),
        };
        (budget / CHUNK_SIZE / 2).clamp(1, REGISTER_BATCH as u64) as usize
    }

    /// The entry for a write of `p` (`guest`, dynamic registration): in the
    /// chunk's local MR, registered now if it has none; `None` when pinning
    /// the chunk would copy pages (write through the staging ring instead).
    ///
    /// A chunk is only pinned when it holds no page that the pin would
    /// allocate or copy (never touched, the shared zero page, shared by KSM
    /// or a fork: `pin_would_copy`), without write access, as QEMU's source
    /// does; the check is made again in each iteration window (the guest may
    /// have filled the chunk meanwhile).
    fn local_sge(&mut self, p: &Piece, guest: GuestRange) -> Result<Option<Sge>> {
        let key = (p.block, chunk_of(p.offset));
        let window = self.shared.counters.iterations.load(Ordering::Relaxed);
        let state = self.chunks.chunk(key);
        if state.local.is_none() && state.staged_in != Some(window) {
            let block = &self.ram.blocks()[p.block as usize];
            let (start, end) = block.chunk_range(key.1);
            let chunk = block.range(start, end - start);
            if chunk.pin_would_copy() {
                self.chunks.chunk(key).staged_in = Some(window);
            } else {
                let mr = self.pin_chunk(key, chunk)?;
                self.chunks.chunk(key).local = Some(mr);
            }
        }
        self.chunks.used(key);
        self.chunks.chunk(key).local.as_ref().map(|mr| sge_in(mr, guest)).transpose()
    }

    /// Registers chunk `key` (`chunk` of guest RAM) read-only within the budget.
    fn pin_chunk(&mut self, key: ChunkKey, chunk: GuestRange) -> Result<MemoryRegion> {
        self.make_local_room(chunk.len(), Some(key))?;
        match self.pins.register_guest(&chunk, Access::empty()) {
            Err(e) if e.kind == ErrorKind::PinBudget => {
                // The kernel counts more than we do (another connection, mlock): unpin one more.
                self.pins.retried();
                if let Some((victim, hint)) = self.chunks.victim(Room::Retry { except: key }) {
                    self.unpin(victim, hint)?;
                }
                self.pins.settle();
                self.pins.register_guest(&chunk, Access::empty())
            }
            r => r,
        }
    }

    /// Unpins until `len` more bytes fit this side's budget (`except` stays).
    fn make_local_room(&mut self, len: u64, except: Option<ChunkKey>) -> Result<()> {
        while !self.pins.fits_after_release(len) {
            match self.chunks.victim(Room::Local { except }) {
                Some((k, hint)) => self.unpin(k, hint)?,
                None => return Err(self.pins.over_budget(len)),
            }
        }
        self.pins.settle_for(len);
        Ok(())
    }

    /// Unpins until `bytes` more fit the destination's announced budget,
    /// and tells the destination before it is asked for more.
    fn make_remote_room(&mut self, bytes: u64) -> Result<()> {
        if let Some(budget) = self.link.peer_pin_budget {
            while self.chunks.remote_pinned() + bytes > budget {
                match self.chunks.victim(Room::Remote) {
                    Some((k, hint)) => self.unpin(k, hint)?,
                    None => {
                        return Err(Error::new(
                            ErrorKind::PinBudget,
                            format!(
                                "{bytes} more bytes do not fit the destination's pin budget of {budget} bytes \
                                 with {} registered there",
                                self.chunks.remote_pinned()
                            ),
                        ))
                    }
                }
            }
        }
        self.flush_unregister()
    }

    /// Drops chunk `key`'s registrations (`ChunkTable::unpin`): the local MR
    /// once no posted write still reads from it.
    fn unpin(&mut self, key: ChunkKey, hint: Hint) -> Result<()> {
        let unpinned = self.chunks.unpin(key, hint, &self.shared.counters);
        if let Some(mr) = unpinned.local {
            if unpinned.last_write > self.link.writes_completed() {
                self.link.fence()?;
            }
            self.pins.release(mr);
        }
        Ok(())
    }

    /// UNREGISTER_REQUEST for the chunks unpinned since the last one. The
    /// destination takes it after every write posted before it (RC order),
    /// so those writes need not have completed here.
    fn flush_unregister(&mut self) -> Result<()> {
        let requests: Vec<RegisterRequest> = self
            .chunks
            .take_unregister()
            .into_iter()
            .map(|(b, c)| RegisterRequest { key: c as u64, block_index: b, chunks: 0 })
            .collect();
        for batch in requests.chunks(REGISTER_BATCH.min(MAX_REPEAT as usize)) {
            self.link.request(
                CommandType::UnregisterRequest,
                |w| batch.iter().try_for_each(|r| w.push(r)),
                CommandType::UnregisterFinished,
                |_| Ok(()),
            )?;
        }
        Ok(())
    }

    /// RAM_BLOCKS_REQUEST/RESULT, once, before the first RAM goes out.
    fn exchange_blocks(&mut self) -> Result<()> {
        if self.blocks_exchanged {
            return Ok(());
        }
        self.blocks_exchanged = true;
        let pin_all = self.link.negotiated.pin_all;
        if let Some(job) = self.pin_all.take() {
            for (mr, state) in job.wait(&self.link.stop)?.into_iter().zip(&mut self.chunks.blocks) {
                state.local = Some(mr);
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
        // With pin-all the destination registers everything before it answers:
        // no network wait's timeout then, liveness bounds it.
        let deadline = (!pin_all).then(|| Instant::now() + self.link.timeout);
        let theirs: Vec<DestBlock> = self.link.request_by(
            deadline,
            CommandType::RamBlocksRequest,
            |w| specs.iter().try_for_each(|s| w.push(s)),
            CommandType::RamBlocksResult,
            |m| m.collect_entries::<DestBlock>().map_err(protocol),
        )?;
        // With pin-all the exchange registers every block: the registration round trip.
        if pin_all {
            Counters::add(&self.shared.counters.registration_round_trips, 1);
        }
        // An rdmamig destination answers a list it cannot match by name with no blocks.
        if theirs.is_empty() && !specs.is_empty() {
            let ours: Vec<String> = specs.iter().map(|s| format!("'{}' of {:#x} bytes", s.name, s.length)).collect();
            return Err(Error::new(
                ErrorKind::BlockMismatch,
                format!(
                    "RAM blocks mismatch: the destination matched none of this side's {} blocks ({}): it lacks one \
                     of these names or has another number of blocks (its error names them)",
                    specs.len(),
                    ours.join(", ")
                ),
            ));
        }
        if theirs.len() != self.ram.len() {
            return Err(Error::new(
                ErrorKind::BlockMismatch,
                format!("RAM blocks mismatch: {} here, {} on the destination", self.ram.len(), theirs.len()),
            ));
        }
        for ((ours, dest), state) in self.ram.blocks().iter().zip(&theirs).zip(&mut self.chunks.blocks) {
            if ours.length != dest.length {
                return Err(Error::new(
                    ErrorKind::BlockMismatch,
                    format!(
                        "block '{}' has length {:#x} here and {:#x} on the destination",
                        ours.name, ours.length, dest.length
                    ),
                ));
            }
            state.remote_base = placed(ours, "address", dest.remote_host_addr)?;
            state.dest_offset = placed(ours, "offset", dest.offset)?;
            if pin_all {
                state.remote_rkey = Some(dest.remote_rkey);
            }
        }
        Ok(())
    }

    /// Sends the zero ranges queued for COMPRESS (each before any write of
    /// its chunk) once a message is full, unless a REGISTER response is still
    /// to come and the control channel is busy (then before the next request),
    /// or once `RUN_AHEAD` are queued.
    fn zeros_queued(&mut self) -> Result<()> {
        let full = self.zeros.len() >= self.zeros.batch();
        if full && !self.link.request_pending() || self.zeros.len() >= RUN_AHEAD {
            self.send_zeros()?;
        }
        Ok(())
    }

    /// Sends the batched zero ranges as COMPRESS messages.
    fn send_zeros(&mut self) -> Result<()> {
        if self.zeros.is_empty() {
            return Ok(());
        }
        self.settle_registration()?;
        for message in self.zeros.take_messages() {
            self.link.post_message(CommandType::Compress, |w| message.iter().try_for_each(|z| w.push(z)))?;
            Counters::add(&self.shared.counters.zero_chunks, message.len() as u64);
        }
        Ok(())
    }

    /// Registers every awaited chunk on the destination and posts their
    /// writes, waiting for each response; sends the batched zero ranges
    /// (those of chunks first touched after the last request went out, too:
    /// a window must not end without them).
    fn register_deferred(&mut self) -> Result<()> {
        loop {
            self.settle_registration()?;
            if self.registrations.to_register.is_empty() {
                return self.send_zeros();
            }
            self.begin_registration()?;
        }
    }

    /// Waits for the outstanding REGISTER response (and any that taking it
    /// begins), so that another control message may go.
    fn settle_registration(&mut self) -> Result<()> {
        while self.link.request_pending() {
            self.poll_registration(true)?;
        }
        Ok(())
    }

    /// Asks the destination to register the next batch of awaited chunks
    /// (one per request toward QEMU) without waiting for its answer: writes
    /// to registered chunks go on meanwhile. Batched zero ranges go first:
    /// a chunk's COMPRESS must precede its writes.
    fn begin_registration(&mut self) -> Result<()> {
        self.send_zeros()?;
        let (batch, per_response) = (self.register_batch(), self.chunks_per_response());
        let registrations = self.registrations.next(self.link.negotiated.extensions, batch, per_response);
        if registrations.is_empty() {
            return Ok(());
        }
        let blocks = self.ram.blocks();
        let bytes = registrations
            .iter()
            .map(|&((b, c), n)| {
                let block = &blocks[b as usize];
                block.chunk_range(c + n - 1).1 - block.chunk_range(c).0
            })
            .sum();
        self.make_remote_room(bytes)?;
        let requests: Vec<RegisterRequest> = registrations
            .iter()
            .map(|&((b, c), n)| RegisterRequest {
                key: self.chunks.blocks[b as usize].dest_offset + self.ram.blocks()[b as usize].chunk_range(c).0,
                block_index: b,
                chunks: n as u64 - 1,
            })
            .collect();
        self.link.begin_request(
            CommandType::RegisterRequest,
            |w| requests.iter().try_for_each(|r| w.push(r)),
            CommandType::RegisterResult,
        )?;
        self.registrations.requested(registrations);
        Ok(())
    }

    /// Takes the outstanding REGISTER response if it has come (`wait`: waits
    /// for it), begins the next request, and posts the writes it allows;
    /// returns whether it took one.
    fn poll_registration(&mut self, wait: bool) -> Result<bool> {
        if !self.link.request_pending() {
            return Ok(false);
        }
        let parse = |m: &crate::wire::Message| m.collect_entries::<RegisterResult>().map_err(protocol);
        let results = if wait {
            self.link.finish_request(parse)?
        } else {
            match self.link.poll_response(parse)? {
                Some(r) => r,
                None => return Ok(false),
            }
        };
        let registrations = std::mem::take(&mut self.registrations.registering);
        if results.len() != registrations.len() {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "asked to register {} runs of chunks, the destination answered {}",
                    registrations.len(),
                    results.len()
                ),
            ));
        }
        self.retire_completed();
        let chunks: Vec<ChunkKey> =
            registrations.iter().flat_map(|&((b, c), n)| (c..c + n).map(move |c| (b, c))).collect();
        Counters::add(&self.shared.counters.registration_round_trips, 1);
        Counters::add(&self.shared.counters.chunks_registered, chunks.len() as u64);
        for (&((b, c), n), r) in registrations.iter().zip(&results) {
            self.chunks.blocks[b as usize].remote_base =
                placed(&self.ram.blocks()[b as usize], "address", r.host_addr)?;
            for c in c..c + n {
                self.chunks.registered_remotely((b, c), r.rkey);
            }
        }
        // The next request goes out before these writes, so the destination
        // registers while they stream: a full one, or what is waiting once no
        // save is queued (nothing more would come before the link runs dry).
        let waiting = self.registrations.to_register.len();
        let nothing_queued = waiting > 0 && self.shared.front.is_empty();
        if waiting >= self.registrations.ahead(self.register_batch()) || nothing_queued {
            self.begin_registration()?;
        }
        for p in self.registrations.take_ready(&mut self.chunks) {
            self.write(p)?;
        }
        for &key in &chunks {
            self.chunks.chunk(key).awaiting = false;
        }
        Ok(true)
    }
}

/// The entry for `guest` in `mr`, the registration that covers it.
fn sge_in(mr: &MemoryRegion, guest: GuestRange) -> Result<Sge> {
    mr.sge_at(guest.addr(), guest.len() as u32)
        .ok_or_else(|| Error::new(ErrorKind::State, format!("{guest:?} is not inside its registration {mr:?}")))
}
