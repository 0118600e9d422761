//! The source's chunks and what is registered for them: its own pins (local
//! MRs, or pin-all's whole blocks) and the destination's registrations, with
//! the least-recently-used order (by the hypervisor's hints) in which they
//! are dropped when a budget is reached. Bookkeeping only: registering,
//! waiting and messages are the transfer's.

use super::piece::Piece;
use crate::engine::pin::{Hint, Lru};
use crate::engine::ram::{chunk_of, RamBlocks};
use crate::engine::stats::Counters;
use crate::verbs::MemoryRegion;
use crate::wire::CHUNK_SIZE;

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
    pub staged_in: Option<u64>,
}

pub(super) struct BlockState {
    pub length: u64,
    /// The destination's host address of the block start, and its offset in its RAM address space.
    pub remote_base: u64,
    pub dest_offset: u64,
    /// Pin-all: whole-block keys on both sides.
    pub remote_rkey: Option<u32>,
    pub local: Option<MemoryRegion>,
    pub chunks: Vec<ChunkState>,
}

/// Which registration to drop to make room.
pub(super) enum Room {
    /// For a local pin: a chunk with a local MR, but not `except`.
    Local { except: Option<ChunkKey> },
    /// After the kernel refused a pin of `except`: any other chunk.
    Retry { except: ChunkKey },
    /// For the destination's budget: a chunk registered there.
    Remote,
}

/// A chunk dropped by `unpin`: its local MR, to be released once its last
/// write (`last_write`) completed.
pub(super) struct Unpinned {
    pub local: Option<MemoryRegion>,
    pub last_write: u64,
}

pub(super) struct ChunkTable {
    pub blocks: Vec<BlockState>,
    /// Pinned chunks in the order they are unpinned.
    lru: Lru<ChunkKey>,
    /// Bytes of chunks registered on the destination (held to the budget it
    /// announced).
    remote_pinned: u64,
    /// Chunks unpinned whose destination registration is still to be released.
    to_unregister: Vec<ChunkKey>,
    /// Whether the destination's registrations count against its budget and
    /// can be released (an rdmamig peer; QEMU's destination never unpins).
    remote_unpins: bool,
    /// Whether a budget bounds either side: without one nothing is ever
    /// unpinned, and no order is kept.
    budgeted: bool,
}

impl ChunkTable {
    pub fn new(ram: &RamBlocks, remote_unpins: bool, budgeted: bool) -> ChunkTable {
        let blocks = ram
            .blocks()
            .iter()
            .map(|b| BlockState {
                length: b.length,
                remote_base: 0,
                dest_offset: 0,
                remote_rkey: None,
                local: None,
                chunks: (0..b.chunk_count()).map(|_| ChunkState::default()).collect(),
            })
            .collect();
        ChunkTable { blocks, lru: Lru::default(), remote_pinned: 0, to_unregister: Vec::new(), remote_unpins, budgeted }
    }

    pub fn chunk(&mut self, (b, c): ChunkKey) -> &mut ChunkState {
        &mut self.blocks[b as usize].chunks[c]
    }

    /// The chunk of piece `p`.
    pub fn of(&mut self, p: &Piece) -> &mut ChunkState {
        self.chunk((p.block, chunk_of(p.offset)))
    }

    /// Bytes of chunk `key` (the last of a block may be short).
    pub fn chunk_len(&self, (b, c): ChunkKey) -> u64 {
        let start = c as u64 * CHUNK_SIZE;
        (start + CHUNK_SIZE).min(self.blocks[b as usize].length) - start
    }

    /// Bytes of chunks registered on the destination.
    pub fn remote_pinned(&self) -> u64 {
        self.remote_pinned
    }

    /// Records a hint for every chunk of a range.
    pub fn hint(&mut self, block: u32, offset: u64, len: u64, hint: Hint) {
        for c in chunk_of(offset)..=chunk_of(offset + len - 1) {
            self.lru.hint((block, c), hint);
        }
    }

    /// Chunk `key` was just used: the last to go, if it holds anything that
    /// can (and there is a budget).
    pub fn used(&mut self, key: ChunkKey) {
        if self.budgeted && self.holds_pins(key) {
            self.lru.touch(key);
        }
    }

    /// Whether chunk `key` holds a registration this side can unpin.
    fn holds_pins(&self, (b, c): ChunkKey) -> bool {
        let chunk = &self.blocks[b as usize].chunks[c];
        chunk.local.is_some() || (self.remote_unpins && chunk.remote_rkey.is_some())
    }

    /// Whether chunk `key` holds a registration that may go now.
    fn can_unpin(&self, key: ChunkKey) -> bool {
        !self.blocks[key.0 as usize].chunks[key.1].awaiting && self.holds_pins(key)
    }

    /// The chunk to unpin next for `room`, and its hint.
    pub fn victim(&self, room: Room) -> Option<(ChunkKey, Hint)> {
        let state = |(b, c): ChunkKey| &self.blocks[b as usize].chunks[c];
        match room {
            Room::Local { except } => {
                self.lru.victim(|k| Some(k) != except && self.can_unpin(k) && state(k).local.is_some())
            }
            Room::Retry { except } => self.lru.victim(|k| k != except && self.can_unpin(k)),
            Room::Remote => self.lru.victim(|k| self.can_unpin(k) && state(k).remote_rkey.is_some()),
        }
    }

    /// Records a chunk's new registration on the destination.
    pub fn registered_remotely(&mut self, key: ChunkKey, rkey: u32) {
        self.remote_pinned += self.chunk_len(key);
        self.chunk(key).remote_rkey = Some(rkey);
        self.used(key);
    }

    /// Drops chunk `key`'s registrations: returns the local MR, and (rdmamig
    /// peers) queues the destination's for the next UNREGISTER_REQUEST.
    /// Toward QEMU the destination's registration stays.
    pub fn unpin(&mut self, key: ChunkKey, hint: Hint, counters: &Counters) -> Unpinned {
        let local = self.chunk(key).local.take();
        if self.remote_unpins && self.chunk(key).remote_rkey.take().is_some() {
            self.remote_pinned -= self.chunk_len(key);
            self.to_unregister.push(key);
        }
        self.lru.remove(key);
        Counters::add(&counters.unpins, 1);
        if hint == Hint::Cold {
            Counters::add(&counters.unpins_cold, 1);
        }
        Unpinned { local, last_write: self.chunk(key).last_write }
    }

    /// The chunks whose destination registration is to be released now.
    pub fn take_unregister(&mut self) -> Vec<ChunkKey> {
        std::mem::take(&mut self.to_unregister)
    }

    /// Every local registration, pin-all's and the chunks'.
    pub fn into_registrations(self) -> impl Iterator<Item = MemoryRegion> {
        self.blocks.into_iter().flat_map(|b| b.local.into_iter().chain(b.chunks.into_iter().filter_map(|c| c.local)))
    }
}
