//! The CPU work of saved RAM on both sides, without a connection, for the
//! native benchmark (`examples/native_bench.rs`, feature `bench-internals`;
//! not an API). The source's parts run as the transfer thread runs them:
//! the queued commands' runs (`for_each_run`), merged into pieces
//! (`Merging`), routed by their chunk's state (`Registrations::route`: at a
//! chunk's first touch the zero detection of `sparse::split`), the
//! registrations asked in batches and the writes they hold back released,
//! each write paced and counted in the write window as `Transfer::write`
//! does. The control messages go through the wire codec to the
//! destination's `Dispatcher` (blocks exchange, REGISTER_REQUEST, COMPRESS),
//! whose registrar stands in for the pins and registers nothing. Each write
//! ends in a sink that counts what the link would post (guest address,
//! length, remote address, key): nothing is transferred, and nothing here
//! claims a transfer.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::chunk_table::{ChunkKey, ChunkTable};
use super::command::Command;
use super::front::Front;
use super::pacing::Pacer;
use super::piece::{pieces, Merging, Piece};
use super::registration::{placed, Registrations, Route, REGISTER_BATCH, RUN_AHEAD};
use super::write_window::WriteWindow;
use super::zeros::ZeroQueue;
use crate::bitmap::for_each_run;
use crate::engine::destination::dispatch::{Dispatcher, Registrar, Reply, Step};
use crate::engine::link::Negotiated;
use crate::engine::ram::RamBlocks;
use crate::engine::stats::Counters;
use crate::host::{pagemap, GuestRange};
use crate::wire::{decode_message, BlockSpec, CommandType, Entry, MessageWriter, RegisterRequest, CONTROL_BUFFER_SIZE};
use crate::{Error, ErrorKind, Result};

/// What the sink was handed: the writes the link would post, the zero
/// ranges and registrations the destination served.
#[derive(Clone, Copy, Debug, Default)]
pub struct Posted {
    pub writes: u64,
    pub bytes: u64,
    /// A fold of every write's addresses and key, so that none is optimised away.
    pub digest: u64,
    pub zero_ranges: u64,
    pub zero_bytes: u64,
    pub register_requests: u64,
    pub chunks_registered: u64,
}

/// The destination's registrar here: hands out keys, registers nothing.
#[derive(Default)]
struct Keys {
    next: u32,
}

impl Registrar for Keys {
    type Registration = u32;

    fn check_budget(&self, _len: u64) -> Result<()> {
        Ok(())
    }

    fn register_remote(&mut self, _guest: &GuestRange) -> Result<u32> {
        self.next = self.next.wrapping_add(1);
        Ok(self.next)
    }

    fn rkey(key: &u32) -> u32 {
        *key
    }

    fn release_remote(&mut self, _key: u32) {}
}

/// A source's and a destination's CPU path over their RAM blocks (dynamic
/// registration, rdmamig peers).
pub struct CpuPath {
    ram: RamBlocks,
    merging: Merging,
    chunks: ChunkTable,
    zeros: ZeroQueue,
    registrations: Registrations,
    window: WriteWindow,
    pacer: Pacer,
    /// Writes posted so far (the sink completes each as it is posted).
    seq: u64,
    destination: Dispatcher<Keys>,
    keys: Keys,
    buf: Vec<u8>,
    pub posted: Posted,
}

impl CpuPath {
    /// The tables of both sides for `source` and `destination` (blocks of
    /// the same names and lengths), and the RAM-blocks exchange between them.
    /// The calling thread stands in for the transfer thread: it keeps the
    /// pagemap open, as that thread does.
    pub fn new(source: RamBlocks, destination: RamBlocks) -> Result<CpuPath> {
        pagemap::keep_open();
        let negotiated =
            Negotiated { pin_all: false, extensions: true, authenticated: false, postcopy_recovery: false };
        let mut path = CpuPath {
            chunks: ChunkTable::new(&source, true, false),
            ram: source,
            merging: Merging::new(),
            zeros: ZeroQueue::new(true),
            registrations: Registrations::default(),
            window: WriteWindow::default(),
            pacer: Pacer::new(),
            seq: 0,
            destination: Dispatcher::new(
                destination,
                negotiated,
                Arc::new(Counters::new()),
                Arc::<AtomicBool>::default(),
            ),
            keys: Keys::default(),
            buf: vec![0; CONTROL_BUFFER_SIZE],
            posted: Posted::default(),
        };
        let specs = path
            .ram
            .blocks()
            .iter()
            .map(|b| BlockSpec::new(&b.name, b.length))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::new(ErrorKind::InvalidArgument, e.to_string()))?;
        path.exchange(CommandType::RamBlocksRequest, &specs)?;
        let Reply::RamBlocksResult(theirs) = path.destination.blocks_result() else { unreachable!() };
        for ((ours, dest), state) in path.ram.blocks().iter().zip(&theirs).zip(&mut path.chunks.blocks) {
            state.remote_base = placed(ours, "address", dest.remote_host_addr)?;
            state.dest_offset = placed(ours, "offset", dest.offset)?;
        }
        Ok(path)
    }

    /// Takes everything queued in `front`, then (as the idle transfer thread
    /// does) sends what is still merging and has every chunk it awaits registered.
    pub fn drain(&mut self, front: &Front) -> Result<()> {
        while let Some(cmd) = front.pop() {
            front.taken(front.counted(&cmd));
            match cmd {
                Command::Save { block, offset, len } => self.save(block, offset, len)?,
                Command::Group(group) => {
                    let saved = group.iter().try_for_each(|r| self.save(r.block, r.offset, r.len));
                    front.recycle_ranges(group);
                    saved?
                }
                Command::Bitmap { block, offset, page_size, pages, words } => {
                    let saved = for_each_run(&words, pages, |first, n| {
                        self.save(block, offset + first * page_size, n * page_size)
                    });
                    front.recycle_words(words);
                    saved?
                }
                _ => return Err(Error::new(ErrorKind::InvalidArgument, "only saves are measured")),
            }
        }
        for p in self.merging.take() {
            self.send_piece(p)?;
        }
        while !self.registrations.to_register.is_empty() {
            self.register()?;
        }
        self.send_zeros()
    }

    /// Has every chunk of every block registered on the destination, in
    /// requests of `REGISTER_BATCH` (as a first window that finds data in
    /// every chunk): what later windows find.
    pub fn register_all(&mut self) -> Result<()> {
        let chunk_counts: Vec<usize> = self.ram.blocks().iter().map(|b| b.chunk_count()).collect();
        for (b, chunks) in chunk_counts.into_iter().enumerate() {
            for c in 0..chunks {
                let key: ChunkKey = (b as u32, c);
                if self.chunks.chunk(key).remote_rkey.is_none() && !self.chunks.chunk(key).awaiting {
                    self.registrations.awaits(&mut self.chunks, key);
                }
                if self.registrations.to_register.len() >= REGISTER_BATCH {
                    self.register()?;
                }
            }
        }
        while !self.registrations.to_register.is_empty() {
            self.register()?;
        }
        Ok(())
    }

    fn save(&mut self, block: u32, offset: u64, len: u64) -> Result<()> {
        for p in pieces(block, offset, len) {
            if let Some(oldest) = self.merging.add(p) {
                self.send_piece(oldest)?;
            }
        }
        Ok(())
    }

    /// As `Transfer::send_piece`, with each REGISTER_REQUEST answered at once.
    fn send_piece(&mut self, p: Piece) -> Result<()> {
        let block = &self.ram.blocks()[p.block as usize];
        match self.registrations.route(&mut self.chunks, &mut self.zeros, block, p, true) {
            Route::Write => self.write(p),
            Route::Held => Ok(()),
            Route::FirstTouch { registers } => {
                if self.zeros.len() >= RUN_AHEAD {
                    self.send_zeros()?;
                }
                if registers && self.registrations.to_register.len() >= self.registrations.ahead(REGISTER_BATCH) {
                    self.register()?;
                }
                Ok(())
            }
        }
    }

    /// What `Transfer::write` does for a write to a chunk registered on both
    /// sides, the post itself handed to the sink.
    fn write(&mut self, p: Piece) -> Result<()> {
        // No cap (`Transfer::pace`).
        self.pacer.uncapped();
        self.window.retire(self.seq);
        debug_assert!(self.window.wait_for_room(p.len).is_none());
        let rkey = self.chunks.of(&p).remote_rkey.ok_or_else(|| Error::new(ErrorKind::State, "unregistered chunk"))?;
        let guest = self.ram.blocks()[p.block as usize].range(p.offset, p.len);
        let remote = self.chunks.blocks[p.block as usize].remote_base + p.offset;
        let signalled = self.window.signals(p.len);
        self.seq += 1;
        self.window.posted(self.seq, p.len, signalled, false);
        self.chunks.of(&p).last_write = self.seq;
        let posted = &mut self.posted;
        posted.writes += 1;
        posted.bytes += p.len;
        posted.digest = posted.digest.rotate_left(5) ^ guest.addr() ^ remote ^ u64::from(rkey) ^ guest.len();
        Ok(())
    }

    /// The next REGISTER_REQUEST, its answer taken as `poll_registration`
    /// takes it, and the writes it releases.
    fn register(&mut self) -> Result<()> {
        self.send_zeros()?;
        let registrations = self.registrations.next(true, REGISTER_BATCH, REGISTER_BATCH);
        let requests: Vec<RegisterRequest> = registrations
            .iter()
            .map(|&((b, c), n)| RegisterRequest {
                key: self.chunks.blocks[b as usize].dest_offset + self.ram.blocks()[b as usize].chunk_range(c).0,
                block_index: b,
                chunks: n as u64 - 1,
            })
            .collect();
        let Step::Answer(Reply::RegisterResult(results)) = self.exchange(CommandType::RegisterRequest, &requests)?
        else {
            return Err(Error::new(ErrorKind::Protocol, "no REGISTER_RESULT"));
        };
        self.posted.register_requests += 1;
        for (&((b, c), n), r) in registrations.iter().zip(&results) {
            self.chunks.blocks[b as usize].remote_base =
                placed(&self.ram.blocks()[b as usize], "address", r.host_addr)?;
            for c in c..c + n {
                self.chunks.registered_remotely((b, c), r.rkey);
                self.posted.chunks_registered += 1;
            }
        }
        for p in self.registrations.take_ready(&mut self.chunks) {
            self.write(p)?;
        }
        for &((b, c), n) in &registrations {
            for c in c..c + n {
                self.chunks.chunk((b, c)).awaiting = false;
            }
        }
        Ok(())
    }

    /// The queued zero ranges, as COMPRESS messages applied by the destination.
    fn send_zeros(&mut self) -> Result<()> {
        for message in self.zeros.take_messages() {
            self.posted.zero_ranges += message.len() as u64;
            self.posted.zero_bytes += message.iter().map(|z| z.length).sum::<u64>();
            self.exchange(CommandType::Compress, &message)?;
        }
        Ok(())
    }

    /// One message of `entries` to the destination, through the wire codec.
    fn exchange<E: Entry>(&mut self, kind: CommandType, entries: &[E]) -> Result<Step> {
        let mut w = MessageWriter::new(&mut self.buf, kind);
        for e in entries {
            w.push(e).map_err(|e| Error::new(ErrorKind::Protocol, e.to_string()))?;
        }
        let n = w.finish();
        let m = decode_message(&self.buf[..n]).map_err(|e| Error::new(ErrorKind::Protocol, e.to_string()))?;
        self.destination.dispatch(&m, &mut self.keys)
    }
}
