//! The chunks the source asks the destination to register ahead of its
//! writes, and the writes that wait for them. REGISTER_REQUESTs go out
//! without waiting: writes to registered chunks go on while one is
//! outstanding, and each response lets the next request go out before the
//! writes it allows (the transfer sends them).

use super::chunk_table::{ChunkKey, ChunkTable};
use super::piece::Piece;
use super::sparse::{self, Part};
use super::zeros::ZeroQueue;
use crate::engine::ram::{chunk_of, RamBlock};
use crate::{Error, ErrorKind, Result};

/// Chunks per REGISTER_REQUEST toward an rdmamig peer (one registration
/// each), and per registration of consecutive chunks toward QEMU (which
/// answers only a request's first entry).
pub(crate) const REGISTER_BATCH: usize = 256;
/// Chunks in the first REGISTER_REQUEST toward an rdmamig peer (see `Registrations::ahead`).
const FIRST_REQUEST: usize = 128;
/// How far the transfer thread reads ahead of an outstanding REGISTER
/// request (chunks to register next, zero ranges to send): beyond this it
/// waits for the response rather than let its lists grow with the guest.
pub(super) const RUN_AHEAD: usize = 1024;

/// The chunks the destination is asked to register, and the writes that
/// wait for them.
#[derive(Default)]
pub(super) struct Registrations {
    /// Chunks to ask the destination for in the next REGISTER_REQUEST.
    pub to_register: Vec<ChunkKey>,
    /// What the REGISTER_REQUEST whose response is still to come asked for
    /// (the link holds the request: `Link::request_pending`): one entry per
    /// registration, a first chunk and how many chunks from it.
    pub registering: Vec<(ChunkKey, usize)>,
    /// A REGISTER_REQUEST was sent (the first is smaller: `ahead`).
    requested: bool,
    /// Writes waiting for their chunk's registration, in arrival order.
    pub deferred: Vec<Piece>,
}

/// Where a merged piece goes under dynamic registration (`Registrations::route`).
pub(super) enum Route {
    /// Its chunk is registered on the destination: write it.
    Write,
    /// Held among the deferred writes until its chunk's registration, already asked for.
    Held,
    /// Its chunk's first touch: the piece's zero ranges went into the zero
    /// queue; its data, if any (`registers`), among the deferred writes, and
    /// the chunk into `to_register`.
    FirstTouch { registers: bool },
}

impl Registrations {
    /// Routes piece `p` of `block` by its chunk's state; at the chunk's
    /// first touch splits it (`sparse::split`): zero runs need no
    /// registration (and holes are not read).
    pub fn route(
        &mut self,
        chunks: &mut ChunkTable,
        zeros: &mut ZeroQueue,
        block: &RamBlock,
        p: Piece,
        extensions: bool,
    ) -> Route {
        let state = chunks.of(&p);
        if state.remote_rkey.is_some() {
            return Route::Write;
        }
        if state.awaiting {
            self.deferred.push(p);
            return Route::Held;
        }
        let dest_offset = chunks.blocks[p.block as usize].dest_offset;
        let mut registers = false;
        for part in sparse::split(block, p, extensions) {
            match part {
                Part::Zero { offset, len } => zeros.push(p.block, dest_offset + offset, len),
                Part::Data(d) => {
                    registers = true;
                    self.deferred.push(d);
                }
            }
        }
        if registers {
            self.awaits(chunks, (p.block, chunk_of(p.offset)));
        }
        Route::FirstTouch { registers }
    }

    /// Chunk `key` is to be registered on the destination before its deferred writes go.
    pub fn awaits(&mut self, chunks: &mut ChunkTable, key: ChunkKey) {
        chunks.chunk(key).awaiting = true;
        self.to_register.push(key);
    }

    /// Takes the registrations of the next REGISTER_REQUEST off
    /// `to_register`, as (first chunk, chunks). Toward an rdmamig peer
    /// (`extensions`), one chunk each (each is unpinned on its own), up to
    /// `batch`. Toward QEMU, whose destination answers only the first entry
    /// of a request but registers `chunks` more after an entry's chunk under
    /// its key: one registration of the run of consecutive chunks at the
    /// front, up to `per_response`.
    pub fn next(&mut self, extensions: bool, batch: usize, per_response: usize) -> Vec<(ChunkKey, usize)> {
        if extensions {
            let take = self.to_register.len().min(batch);
            return self.to_register.drain(..take).map(|key| (key, 1)).collect();
        }
        let Some(&(block, first)) = self.to_register.first() else { return Vec::new() };
        let run = self
            .to_register
            .iter()
            .take(per_response)
            .enumerate()
            .take_while(|&(i, &(b, c))| b == block && c == first + i)
            .count();
        self.to_register.drain(..run);
        vec![((block, first), run)]
    }

    /// `registrations` went out in a REGISTER_REQUEST.
    pub fn requested(&mut self, registrations: Vec<(ChunkKey, usize)>) {
        self.registering = registrations;
        self.requested = true;
    }

    /// Chunks to collect before a request goes out while the link is busy:
    /// half a batch at first, then a full batch (a dense 256 MiB took two
    /// requests), at most `batch`. A request's registration must take no
    /// longer than the writes its predecessor allows, or the link waits; a
    /// smaller first request does not start the writes sooner (the ramps
    /// measured: docs/benchmarks.md).
    pub fn ahead(&self, batch: usize) -> usize {
        let ramp = if self.requested { REGISTER_BATCH } else { FIRST_REQUEST };
        ramp.min(batch)
    }

    /// Takes the deferred writes whose chunk is now registered on the destination.
    pub fn take_ready(&mut self, chunks: &mut ChunkTable) -> Vec<Piece> {
        let (ready, waiting) =
            std::mem::take(&mut self.deferred).into_iter().partition(|p| chunks.of(p).remote_rkey.is_some());
        self.deferred = waiting;
        ready
    }
}

/// Where the destination placed `block` (its `what`, address or offset),
/// refused if the block's bytes from there would wrap around (a hostile
/// destination's numbers: every write address is computed from it).
pub(super) fn placed(block: &RamBlock, what: &str, at: u64) -> Result<u64> {
    match at.checked_add(block.length) {
        Some(_) => Ok(at),
        None => Err(Error::new(
            ErrorKind::Protocol,
            format!(
                "the destination placed block '{}' at {what} {at:#x}: its {:#x} bytes wrap around",
                block.name, block.length
            ),
        )),
    }
}
