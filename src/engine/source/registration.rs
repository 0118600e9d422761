//! What the source asks of the destination ahead of its writes: the RAM
//! blocks exchange, REGISTER_REQUESTs for the chunks first touched (sent
//! without waiting: writes to registered chunks go on while one is
//! outstanding, and each response lets the next request go out before the
//! writes it allows) and the batched zero ranges (COMPRESS), which must
//! precede their chunk's writes.

use std::time::Instant;

use super::chunks::ChunkKey;
use super::transfer::{Engine, Piece};
use crate::engine::link::protocol_error as protocol;
use crate::engine::ram::{chunk_of, RamBlock};
use crate::engine::stats::Counters;
use crate::engine::validate::MAX_COMPRESS_BYTES;
use crate::wire::{BlockSpec, CommandType, Compress, DestBlock, RegisterRequest, RegisterResult};
use crate::{Error, ErrorKind, Result};

/// Chunks per REGISTER_REQUEST toward an rdmamig peer (one registration
/// each), and per registration of consecutive chunks toward QEMU (which
/// answers only a request's first entry).
pub(crate) const REGISTER_BATCH: usize = 256;
/// Zero ranges per COMPRESS message toward an rdmamig peer (QEMU applies one).
const ZERO_BATCH: usize = 1024;
/// Chunks in the first REGISTER_REQUEST toward an rdmamig peer (see `register_ahead`).
const FIRST_REQUEST: usize = 128;
/// How far the transfer thread reads ahead of an outstanding REGISTER
/// request (chunks to register next, zero ranges to send): beyond this it
/// waits for the response rather than let its lists grow with the guest.
pub(super) const RUN_AHEAD: usize = 1024;

impl Engine {
    /// RAM_BLOCKS_REQUEST/RESULT, once, before the first RAM goes out.
    pub(super) fn exchange_blocks(&mut self) -> Result<()> {
        if self.blocks_exchanged {
            return Ok(());
        }
        self.blocks_exchanged = true;
        let pin_all = self.link.negotiated.pin_all;
        if let Some(job) = self.pin_all.take() {
            for (mr, state) in job.wait(&self.link.stop)?.into_iter().zip(&mut self.blocks) {
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
        for ((ours, dest), state) in self.ram.blocks().iter().zip(&theirs).zip(&mut self.blocks) {
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

    /// Adds a zero range (`offset` in the destination's RAM address space) to
    /// the next COMPRESS. Sent before any write of its chunk: once a message
    /// is full, or (while a REGISTER response is still to come and the
    /// control channel is busy) before the next request.
    pub(super) fn queue_zero(&mut self, block: u32, offset: u64, len: u64) -> Result<()> {
        let entry = Compress { value: 0, block_index: block, offset, length: len };
        // Merged only toward an rdmamig peer: QEMU takes one range inside one chunk.
        let merges = self.link.negotiated.extensions;
        match self.zeros.last_mut() {
            Some(z)
                if merges
                    && z.block_index == entry.block_index
                    && z.offset + z.length == entry.offset
                    && z.length + entry.length <= MAX_COMPRESS_BYTES =>
            {
                z.length += entry.length
            }
            _ => self.zeros.push(entry),
        }
        if self.zeros.len() >= self.zero_batch() && !self.link.request_pending() || self.zeros.len() >= RUN_AHEAD {
            self.send_zeros()?;
        }
        Ok(())
    }

    /// Sends the batched zero ranges, in COMPRESS messages of at most
    /// `zero_batch` ranges and `MAX_COMPRESS_BYTES` (the destination's bound).
    pub(super) fn send_zeros(&mut self) -> Result<()> {
        if self.zeros.is_empty() {
            return Ok(());
        }
        self.settle_registration()?;
        let zeros = std::mem::take(&mut self.zeros);
        let mut rest = &zeros[..];
        while !rest.is_empty() {
            let mut bytes = 0;
            let n = rest
                .iter()
                .take(self.zero_batch())
                .take_while(|z| {
                    bytes += z.length;
                    bytes <= MAX_COMPRESS_BYTES
                })
                .count()
                .max(1);
            let (message, later) = rest.split_at(n);
            self.link.post_message(CommandType::Compress, |w| message.iter().try_for_each(|z| w.push(z)))?;
            Counters::add(&self.shared.counters.zero_chunks, n as u64);
            rest = later;
        }
        Ok(())
    }

    /// Zero ranges per COMPRESS message: QEMU applies only the first.
    fn zero_batch(&self) -> usize {
        if self.link.negotiated.extensions {
            ZERO_BATCH
        } else {
            1
        }
    }

    /// Registers every awaited chunk on the destination and posts their
    /// writes, waiting for each response; sends the batched zero ranges
    /// (those of chunks first touched after the last request went out, too:
    /// a window must not end without them).
    pub(super) fn register_deferred(&mut self) -> Result<()> {
        loop {
            self.settle_registration()?;
            if self.to_register.is_empty() {
                return self.send_zeros();
            }
            self.begin_registration()?;
        }
    }

    /// Waits for the outstanding REGISTER response (and any that taking it
    /// begins), so that another control message may go.
    pub(super) fn settle_registration(&mut self) -> Result<()> {
        while self.link.request_pending() {
            self.poll_registration(true)?;
        }
        Ok(())
    }

    /// Asks the destination to register the next batch of awaited chunks
    /// (one per request toward QEMU) without waiting for its answer: writes
    /// to registered chunks go on meanwhile. Batched zero ranges go first:
    /// a chunk's COMPRESS must precede its writes.
    pub(super) fn begin_registration(&mut self) -> Result<()> {
        self.send_zeros()?;
        let registrations = self.next_registrations();
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
                key: self.blocks[b as usize].dest_offset + self.ram.blocks()[b as usize].chunk_range(c).0,
                block_index: b,
                chunks: n as u64 - 1,
            })
            .collect();
        self.link.begin_request(
            CommandType::RegisterRequest,
            |w| requests.iter().try_for_each(|r| w.push(r)),
            CommandType::RegisterResult,
        )?;
        self.registering = registrations;
        self.requested = true;
        Ok(())
    }

    /// Takes the registrations of the next REGISTER_REQUEST off
    /// `to_register`, as (first chunk, chunks). Toward an rdmamig peer, one
    /// chunk each (each is unpinned on its own), up to `register_batch`.
    /// Toward QEMU, whose destination answers only the first entry of a
    /// request but registers `chunks` more after an entry's chunk under its
    /// key: one registration of the run of consecutive chunks at the front,
    /// up to `chunks_per_response`.
    fn next_registrations(&mut self) -> Vec<(ChunkKey, usize)> {
        if self.link.negotiated.extensions {
            let take = self.to_register.len().min(self.register_batch());
            return self.to_register.drain(..take).map(|key| (key, 1)).collect();
        }
        let Some(&(block, first)) = self.to_register.first() else { return Vec::new() };
        let run = self
            .to_register
            .iter()
            .take(self.chunks_per_response())
            .enumerate()
            .take_while(|&(i, &(b, c))| b == block && c == first + i)
            .count();
        self.to_register.drain(..run);
        vec![((block, first), run)]
    }

    /// Chunks to collect before a request goes out while the link is busy:
    /// half a batch at first, then a full batch (a dense 256 MiB took two
    /// requests). A request's registration must take no longer than the
    /// writes its predecessor allows, or the link waits. In one rxe boot (3
    /// runs each), where the destination's registering of fresh memory
    /// competes with the writes for the CPUs, 64 then 192 chunks ran at
    /// 0.98-1.01 Gbit/s against 1.07-1.12 for 64 → 128 → 64; in another,
    /// 128 → 128 at 1.10-1.13 against 1.11; in a third (2 runs each), a
    /// smaller first request (8 or 16 chunks, doubling) no faster (1.07-1.11
    /// against 1.09).
    pub(super) fn register_ahead(&self) -> usize {
        let ramp = if self.requested { REGISTER_BATCH } else { FIRST_REQUEST };
        ramp.min(self.register_batch())
    }

    /// Takes the outstanding REGISTER response if it has come (`wait`: waits
    /// for it), begins the next request, and posts the writes it allows;
    /// returns whether it took one.
    pub(super) fn poll_registration(&mut self, wait: bool) -> Result<bool> {
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
        let registrations = std::mem::take(&mut self.registering);
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
            self.blocks[b as usize].remote_base = placed(&self.ram.blocks()[b as usize], "address", r.host_addr)?;
            for c in c..c + n {
                self.registered_remotely((b, c), r.rkey);
            }
        }
        // The next request goes out before these writes, so the destination
        // registers while they stream: a full one, or what is waiting once no
        // save is queued (nothing more would come before the link runs dry).
        let nothing_queued = !self.to_register.is_empty() && self.shared.front.is_empty();
        if self.to_register.len() >= self.register_ahead() || nothing_queued {
            self.begin_registration()?;
        }
        let (ready, waiting): (Vec<Piece>, Vec<Piece>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|p| self.blocks[p.block as usize].chunks[chunk_of(p.offset)].remote_rkey.is_some());
        self.deferred = waiting;
        for p in ready {
            self.write(p)?;
        }
        for &(b, c) in &chunks {
            self.blocks[b as usize].chunks[c].awaiting = false;
        }
        Ok(true)
    }
}

/// Where the destination placed `block` (its `what`, address or offset),
/// refused if the block's bytes from there would wrap around (a hostile
/// destination's numbers: every write address is computed from it).
fn placed(block: &RamBlock, what: &str, at: u64) -> Result<u64> {
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
