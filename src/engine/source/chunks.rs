//! The source's chunk registrations under the pin budgets: its own (local
//! MRs) and, with an rdmamig destination, the destination's (remote chunk
//! registrations, released with UNREGISTER_REQUEST). When a registration
//! would pass either budget, the least-recently-used chunks (ordered by the
//! hypervisor's hints) with no write pending are unpinned first.
//!
//! Local MRs are registered without write access, as QEMU's source does.
//! A chunk is only pinned when it holds no page that the pin would allocate
//! or copy (never touched, the shared zero page, shared by KSM or a fork:
//! `pin_would_copy`); writes from other chunks go through the staging ring,
//! so those pages stay unallocated or shared. The check is made again in
//! each iteration window (the guest may have filled the chunk meanwhile).

use super::piece::Piece;
use super::registration::REGISTER_BATCH;
use super::transfer::Transfer;
use crate::engine::pin::Hint;
use crate::engine::ram::chunk_of;
use crate::engine::stats::Counters;
use crate::host::GuestRange;
use crate::verbs::{Access, MemoryRegion, Sge};
use crate::wire::{CommandType, RegisterRequest, CHUNK_SIZE, MAX_REPEAT};
use crate::{Error, ErrorKind, Result};

/// (block, chunk index).
pub(super) type ChunkKey = (u32, usize);

#[derive(Default)]
pub(super) struct ChunkState {
    pub remote_rkey: Option<u32>,
    /// Asked for in a REGISTER_REQUEST, or its writes not yet posted: not
    /// to be unpinned.
    pub awaiting: bool,
    pub local: Option<MemoryRegion>,
    /// Sequence number of the last write from this chunk.
    pub last_write: u64,
    /// The iteration window in which pinning the chunk was found to copy
    /// pages: its writes go through the staging ring until the next window.
    staged_in: Option<u64>,
}

impl Transfer {
    fn chunk(&mut self, (b, c): ChunkKey) -> &mut ChunkState {
        &mut self.blocks[b as usize].chunks[c]
    }

    fn chunk_len(&self, (b, c): ChunkKey) -> u64 {
        let (start, end) = self.ram.blocks()[b as usize].chunk_range(c);
        end - start
    }

    /// Whether the destination's registrations count against its budget and
    /// can be released (an rdmamig peer; QEMU's destination never unpins).
    fn remote_unpins(&self) -> bool {
        self.link.negotiated.extensions
    }

    /// Chunks per REGISTER_REQUEST: QEMU serves one per message; otherwise
    /// up to `chunks_per_response`.
    pub(super) fn register_batch(&self) -> usize {
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
    pub(super) fn chunks_per_response(&self) -> usize {
        let budget = match (self.pins.budget(), self.link.peer_pin_budget) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(u64::MAX),
        };
        (budget / CHUNK_SIZE / 2).clamp(1, REGISTER_BATCH as u64) as usize
    }

    /// Records a hint for every chunk of a range.
    pub(super) fn hint(&mut self, block: u32, offset: u64, len: u64, hint: Hint) {
        for c in chunk_of(offset)..=chunk_of(offset + len - 1) {
            self.lru.hint((block, c), hint);
        }
    }

    /// The lkey for a write of `p` (dynamic registration): the chunk's local
    /// MR, registered now if it has none; `None` when pinning the chunk
    /// would copy pages (write through the staging ring instead).
    pub(super) fn local_sge(&mut self, p: &Piece, guest: GuestRange) -> Result<Option<Sge>> {
        let key = (p.block, chunk_of(p.offset));
        let window = self.shared.counters.iterations.load(std::sync::atomic::Ordering::Relaxed);
        let chunk = &self.blocks[key.0 as usize].chunks[key.1];
        if chunk.local.is_none() && chunk.staged_in != Some(window) {
            let block = &self.ram.blocks()[p.block as usize];
            let (start, end) = block.chunk_range(key.1);
            let chunk = block.range(start, end - start);
            if chunk.pin_would_copy() {
                self.chunk(key).staged_in = Some(window);
            } else {
                let mr = self.pin_chunk(key, chunk)?;
                self.chunk(key).local = Some(mr);
            }
        }
        self.used(key);
        self.chunk(key).local.as_ref().map(|mr| sge_in(mr, guest)).transpose()
    }

    /// Registers chunk `key` (`chunk` of guest RAM) read-only within the budget.
    fn pin_chunk(&mut self, key: ChunkKey, chunk: GuestRange) -> Result<MemoryRegion> {
        self.make_local_room(chunk.len(), Some(key))?;
        match self.pins.register_guest(&chunk, Access::empty()) {
            Err(e) if e.kind == ErrorKind::PinBudget => {
                // The kernel counts more than we do (another connection, mlock): unpin one more.
                self.pins.retried();
                if let Some((victim, hint)) = self.lru.victim(|k| k != key && self.can_unpin(k)) {
                    self.unpin(victim, hint)?;
                }
                self.pins.settle();
                self.pins.register_guest(&chunk, Access::empty())
            }
            r => r,
        }
    }

    /// Chunk `key` was just used: the last to go, if it holds anything that
    /// can (and there is a budget: without one nothing is ever unpinned).
    fn used(&mut self, key: ChunkKey) {
        let budgeted = self.pins.budget().is_some() || self.link.peer_pin_budget.is_some();
        if budgeted && self.holds_pins(key) {
            self.lru.touch(key);
        }
    }

    /// Whether chunk `key` holds a registration this side can unpin.
    fn holds_pins(&self, key: ChunkKey) -> bool {
        let chunk = &self.blocks[key.0 as usize].chunks[key.1];
        chunk.local.is_some() || (self.remote_unpins() && chunk.remote_rkey.is_some())
    }

    /// Whether chunk `key` holds a registration that may go now.
    fn can_unpin(&self, key: ChunkKey) -> bool {
        !self.blocks[key.0 as usize].chunks[key.1].awaiting && self.holds_pins(key)
    }

    /// Unpins until `len` more bytes fit this side's budget (`except` stays).
    pub(super) fn make_local_room(&mut self, len: u64, except: Option<ChunkKey>) -> Result<()> {
        while !self.pins.fits_after_release(len) {
            let victim = self.lru.victim(|k| {
                Some(k) != except && self.can_unpin(k) && self.blocks[k.0 as usize].chunks[k.1].local.is_some()
            });
            match victim {
                Some((k, hint)) => self.unpin(k, hint)?,
                None => return Err(self.pins.over_budget(len)),
            }
        }
        self.pins.settle_for(len);
        Ok(())
    }

    /// Unpins until `bytes` more fit the destination's announced budget,
    /// and tells the destination before it is asked for more.
    pub(super) fn make_remote_room(&mut self, bytes: u64) -> Result<()> {
        if let Some(budget) = self.link.peer_pin_budget {
            while self.remote_pinned + bytes > budget {
                let victim = self
                    .lru
                    .victim(|k| self.can_unpin(k) && self.blocks[k.0 as usize].chunks[k.1].remote_rkey.is_some());
                match victim {
                    Some((k, hint)) => self.unpin(k, hint)?,
                    None => {
                        return Err(Error::new(
                            ErrorKind::PinBudget,
                            format!(
                                "{bytes} more bytes do not fit the destination's pin budget of {budget} bytes \
                                 with {} registered there",
                                self.remote_pinned
                            ),
                        ))
                    }
                }
            }
        }
        self.flush_unregister()
    }

    /// Records a chunk's new registration on the destination.
    pub(super) fn registered_remotely(&mut self, key: ChunkKey, rkey: u32) {
        self.remote_pinned += self.chunk_len(key);
        self.chunk(key).remote_rkey = Some(rkey);
        self.used(key);
    }

    /// Drops chunk `key`'s registrations: the local MR once its writes are
    /// complete, and (rdmamig peers) the destination's, sent with the next
    /// UNREGISTER_REQUEST. Toward QEMU the destination's registration stays.
    fn unpin(&mut self, key: ChunkKey, hint: Hint) -> Result<()> {
        if let Some(local) = self.chunk(key).local.take() {
            self.release_local(key, local)?;
        }
        if self.remote_unpins() && self.chunk(key).remote_rkey.take().is_some() {
            self.remote_pinned -= self.chunk_len(key);
            self.to_unregister.push(key);
        }
        self.lru.remove(key);
        Counters::add(&self.shared.counters.unpins, 1);
        if hint == Hint::Cold {
            Counters::add(&self.shared.counters.unpins_cold, 1);
        }
        Ok(())
    }

    /// Releases a local MR once no posted write still reads from it.
    fn release_local(&mut self, key: ChunkKey, mr: MemoryRegion) -> Result<()> {
        if self.chunk(key).last_write > self.link.writes_completed() {
            self.link.fence()?;
        }
        self.pins.release(mr);
        Ok(())
    }

    /// UNREGISTER_REQUEST for the chunks unpinned since the last one. The
    /// destination takes it after every write posted before it (RC order),
    /// so those writes need not have completed here.
    pub(super) fn flush_unregister(&mut self) -> Result<()> {
        if self.to_unregister.is_empty() {
            return Ok(());
        }
        let requests: Vec<RegisterRequest> = std::mem::take(&mut self.to_unregister)
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
}

/// The entry for `guest` in `mr`, the registration that covers it.
pub(super) fn sge_in(mr: &MemoryRegion, guest: GuestRange) -> Result<Sge> {
    mr.sge_at(guest.addr(), guest.len() as u32)
        .ok_or_else(|| Error::new(ErrorKind::State, format!("{guest:?} is not inside its registration {mr:?}")))
}
