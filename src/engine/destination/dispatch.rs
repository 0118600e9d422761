//! The destination's protocol state machine: what each message from the
//! source asks for (RAM-block exchange, registrations, zero ranges, window
//! and migration ends), checked (`validate`) and applied to guest RAM, and
//! what to answer. It sees messages already validated by
//! `wire::decode_message` and knows nothing of the connection: the service
//! thread feeds it from the link, the fuzz target from arbitrary bytes.

mod registered;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use registered::Registered;

use super::event::Event;
use super::postcopy::plan::{self, PlanBlock};
use crate::engine::link::{protocol_error, Negotiated};
use crate::engine::ram::{RamBlock, RamBlocks, Run};
use crate::engine::stats::Counters;
use crate::engine::{validate, Ending};
use crate::host::GuestRange;
use crate::wire::{
    BlockSpec, CommandType, Compress, DestBlock, EncodeError, EndSummary, Entry, Message, MessageWriter,
    PostcopyRecovery, QpEndpoint, RegisterRequest, RegisterResult,
};
use crate::{Error, ErrorKind, Result};

/// How the dispatcher registers guest memory for the source's writes: the
/// connection's `Pins`, or a stand-in where there is no RDMA device.
pub trait Registrar {
    /// What keeps a range registered until it is released.
    type Registration;

    /// Fails (`PinBudget`) if `len` more bytes cannot fit the pin budget,
    /// even once what was released is deregistered: the source cannot make
    /// this side unpin.
    fn check_budget(&self, len: u64) -> Result<()>;

    /// Registers `guest` for the source's RDMA writes.
    fn register_remote(&mut self, guest: &GuestRange) -> Result<Self::Registration>;

    /// The key the source writes into `registration` with.
    fn rkey(registration: &Self::Registration) -> u32;

    fn release_remote(&mut self, registration: Self::Registration);
}

/// What the service does after a message.
#[derive(Debug)]
pub enum Step {
    /// QEMU_FILE: the message's payload is stream bytes for the hypervisor.
    Stream,
    /// REGISTER_FINISHED: an iteration window is complete (all its RAM in place).
    WindowClosed,
    /// Applied; nothing to answer (COMPRESS).
    Applied,
    /// Send this answer, then take the next message.
    Answer(Reply),
    /// RAM_BLOCKS_REQUEST: answer with [`Dispatcher::blocks_result`], once
    /// pin-all's registrations (if this side pins all) are handed to
    /// [`Dispatcher::pinned_all`].
    Blocks,
    /// Send this answer, then the connection ends as said: END_ACK after a
    /// checked END, or a RAM_BLOCKS_RESULT that makes the source fail too
    /// (empty, or with only the lengths of blocks that differ in length).
    Last(Reply, Result<Ending>),
    /// POSTCOPY (rdmamig extension): run post-copy over these blocks, then
    /// answer POSTCOPY_DONE.
    Postcopy(Vec<PlanBlock>),
    /// POSTCOPY_FAULT_QP (rdmamig extension): connect a fault QP to this
    /// one of the source's and answer with it.
    FaultQp(QpEndpoint),
    /// POSTCOPY_RECOVERY (rdmamig extension): where the source takes a
    /// recovery connection, should post-copy's connection be lost.
    Recovery(PostcopyRecovery),
}

/// An answer to the source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    RamBlocksResult(Vec<DestBlock>),
    RegisterResult(Vec<RegisterResult>),
    /// Echoes the request's entry count.
    UnregisterFinished(u32),
    EndAck,
}

impl Reply {
    pub fn kind(&self) -> CommandType {
        match self {
            Reply::RamBlocksResult(_) => CommandType::RamBlocksResult,
            Reply::RegisterResult(_) => CommandType::RegisterResult,
            Reply::UnregisterFinished(_) => CommandType::UnregisterFinished,
            Reply::EndAck => CommandType::EndAck,
        }
    }

    /// Writes the payload (and repeat) into a writer for [`kind`](Self::kind).
    pub fn write(&self, w: &mut MessageWriter) -> std::result::Result<(), EncodeError> {
        match self {
            Reply::RamBlocksResult(blocks) => blocks.iter().try_for_each(|b| w.push(b)),
            Reply::RegisterResult(results) => results.iter().try_for_each(|r| w.push(r)),
            Reply::UnregisterFinished(n) => {
                w.set_repeat(*n);
                Ok(())
            }
            Reply::EndAck => Ok(()),
        }
    }
}

/// The destination's view of one connection's protocol state.
pub struct Dispatcher<R: Registrar> {
    ram: RamBlocks,
    /// Both sides speak rdmamig's extensions (END, bounded COMPRESS batches).
    extensions: bool,
    /// This side registers whole blocks (handed over with `pinned_all`), never chunks.
    pin_all: bool,
    /// Both sides have post-copy recovery on: POSTCOPY_RECOVERY may come.
    postcopy_recovery: bool,
    counters: Arc<Counters>,
    /// Set when the connection's owner aborts: a request that registers or
    /// deregisters much memory stops between its entries.
    stop: Arc<AtomicBool>,
    /// Local block index of each source block index (identity until the source describes its blocks).
    order: Vec<usize>,
    /// Registered chunk ranges per local block; pin-all keeps one whole-block registration instead.
    chunks: Vec<Registered<R::Registration>>,
    whole: Vec<Option<R::Registration>>,
    /// A registration message arrived and REGISTER_FINISHED has not yet.
    in_window: bool,
    /// RAM_BLOCKS_REQUEST was answered: block indexes mean what it said for good.
    blocks_exchanged: bool,
    /// POSTCOPY arrived: the guest may run here from then on, so the
    /// source may no longer write or zero its RAM (only stream bytes and END follow).
    postcopy: bool,
    /// Stream bytes received so far: where windows open and close in the stream.
    stream_offset: u64,
    /// Told of every window, registration and zero range, as served.
    observer: Option<Observer>,
}

/// What `Destination::accept_observed` calls with each [`Event`], on the service thread.
pub type Observer = Box<dyn FnMut(&Event) + Send>;

fn entries<E: Entry>(m: &Message) -> Result<Vec<E>> {
    m.collect_entries::<E>().map_err(protocol_error)
}

fn protocol(message: String) -> Error {
    Error::new(ErrorKind::Protocol, message)
}

impl<R: Registrar> Dispatcher<R> {
    /// `stop`: the connection's abort flag.
    pub fn new(ram: RamBlocks, negotiated: Negotiated, counters: Arc<Counters>, stop: Arc<AtomicBool>) -> Self {
        let Negotiated { extensions, pin_all, postcopy_recovery, .. } = negotiated;
        let chunks = ram.blocks().iter().map(|_| Registered::default()).collect();
        let whole = ram.blocks().iter().map(|_| None).collect();
        let order = (0..ram.len()).collect();
        Dispatcher {
            ram,
            extensions,
            pin_all,
            postcopy_recovery,
            counters,
            stop,
            order,
            chunks,
            whole,
            in_window: false,
            blocks_exchanged: false,
            postcopy: false,
            stream_offset: 0,
            observer: None,
        }
    }

    pub fn set_observer(&mut self, observer: Observer) {
        self.observer = Some(observer);
    }

    fn observe(&mut self, event: Event) {
        if let Some(observer) = &mut self.observer {
            observer(&event);
        }
    }

    /// Fails once the connection's owner aborted.
    fn check_stop(&self) -> Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(Error::new(ErrorKind::Aborted, "closed while serving a registration request"));
        }
        Ok(())
    }

    /// A registration-channel message arrived: the window is open until REGISTER_FINISHED.
    fn open_window(&mut self) {
        if !self.in_window {
            self.in_window = true;
            self.observe(Event::WindowOpened { stream_offset: self.stream_offset });
        }
    }

    pub fn ram(&self) -> &RamBlocks {
        &self.ram
    }

    /// Whether an iteration window is open: its RAM is incomplete until REGISTER_FINISHED.
    pub fn in_window(&self) -> bool {
        self.in_window
    }

    /// Serves one message from the source; an error ends the connection.
    pub fn dispatch(&mut self, m: &Message, registrar: &mut R) -> Result<Step> {
        let step = match m.kind {
            CommandType::QemuFile => {
                Counters::add(&self.counters.stream_bytes, m.payload.len() as u64);
                self.stream_offset += m.payload.len() as u64;
                return Ok(Step::Stream);
            }
            // decode_message let END through with exactly one summary.
            CommandType::End if self.extensions => return self.end(entries(m)?[0]),
            kind if self.postcopy => {
                return Err(protocol(format!("unexpected {kind:?} message from the source after post-copy")))
            }
            CommandType::RegisterFinished => {
                // A window with nothing in it (QEMU closes empty ones) opens here.
                self.open_window();
                self.in_window = false;
                Counters::add(&self.counters.iterations, 1);
                self.observe(Event::WindowClosed { stream_offset: self.stream_offset });
                return Ok(Step::WindowClosed);
            }
            // A second one would change what every block index means under registrations handed out.
            CommandType::RamBlocksRequest if self.blocks_exchanged => {
                return Err(protocol("unexpected second RamBlocksRequest message from the source".into()))
            }
            CommandType::RamBlocksRequest => {
                let specs = entries(m)?;
                self.blocks_exchanged = true;
                self.open_window();
                self.blocks(&specs)
            }
            CommandType::RegisterRequest => {
                let requests = entries(m)?;
                self.open_window();
                Step::Answer(self.register(&requests, registrar)?)
            }
            CommandType::UnregisterRequest => {
                let requests = entries(m)?;
                self.open_window();
                Step::Answer(self.unregister(&requests, registrar)?)
            }
            CommandType::Compress => {
                let ranges = entries(m)?;
                self.open_window();
                self.zero(&ranges)?;
                Step::Applied
            }
            CommandType::Postcopy if self.extensions && self.blocks_exchanged && !self.in_window => {
                let plan = plan::plan(m, &self.order, &self.ram)?;
                self.postcopy = true;
                Step::Postcopy(plan)
            }
            CommandType::PostcopyFaultQp if self.extensions && self.blocks_exchanged && !self.in_window => {
                Step::FaultQp(entries::<QpEndpoint>(m)?[0])
            }
            CommandType::PostcopyRecovery if self.postcopy_recovery && self.blocks_exchanged && !self.in_window => {
                Step::Recovery(entries::<PostcopyRecovery>(m)?[0])
            }
            other => return Err(protocol(format!("unexpected {other:?} message from the source"))),
        };
        Ok(step)
    }

    /// END: acknowledged if this side received everything it counts.
    fn end(&self, summary: EndSummary) -> Result<Step> {
        let stats = self.counters.snapshot();
        let received = EndSummary { stream_bytes: stats.stream_bytes, windows: stats.iterations };
        if self.in_window || summary != received {
            return Err(protocol(format!(
                "the source ended the migration after {} stream bytes and {} windows, this side has {} and {}{}",
                summary.stream_bytes,
                summary.windows,
                received.stream_bytes,
                received.windows,
                if self.in_window { " and a window still open" } else { "" }
            )));
        }
        Ok(Step::Last(Reply::EndAck, Ok(Ending::Completed)))
    }

    /// RAM_BLOCKS_REQUEST: with block specs (rdmamig source), the source's
    /// block order, checked against ours.
    fn blocks(&mut self, specs: &[BlockSpec]) -> Step {
        if !specs.is_empty() {
            let order = match validate::match_blocks(&self.ram, specs) {
                Ok(order) => order,
                // An empty answer makes the source fail with a count mismatch too.
                Err(e) => return Step::Last(Reply::RamBlocksResult(Vec::new()), Err(e)),
            };
            if let Err(e) = validate::check_lengths(&self.ram, specs, &order) {
                // Our lengths alone, in its order (no address, no key): the
                // source's own length check then names both lengths.
                let lengths = order
                    .iter()
                    .map(|&local| DestBlock { length: self.ram.blocks()[local].length, ..DestBlock::default() });
                return Step::Last(Reply::RamBlocksResult(lengths.collect()), Err(e));
            }
            self.order = order;
        }
        Step::Blocks
    }

    /// Takes pin-all's registrations, one per local block, made for the
    /// blocks exchange (which is then the registration round trip).
    pub fn pinned_all(&mut self, registrations: Vec<R::Registration>) {
        Counters::add(&self.counters.registration_round_trips, 1);
        for (i, reg) in registrations.into_iter().enumerate() {
            let block = &self.ram.blocks()[i];
            Counters::add(&self.counters.chunks_registered, block.chunk_count() as u64);
            let len = block.length;
            self.whole[i] = Some(reg);
            self.observe(Event::Registered { block: i, offset: 0, len });
        }
    }

    /// The answer to RAM_BLOCKS_REQUEST: our blocks in the source's order.
    pub fn blocks_result(&self) -> Reply {
        let blocks = self
            .order
            .iter()
            .map(|&local| {
                let b = &self.ram.blocks()[local];
                DestBlock {
                    remote_host_addr: b.host as u64,
                    offset: b.offset,
                    length: b.length,
                    remote_rkey: self.whole[local].as_ref().map_or(0, R::rkey),
                }
            })
            .collect();
        Reply::RamBlocksResult(blocks)
    }

    fn register(&mut self, requests: &[RegisterRequest], registrar: &mut R) -> Result<Reply> {
        let mut results = Vec::with_capacity(requests.len());
        for r in requests {
            self.check_stop()?;
            let (local, block) = validate::local_block(&self.order, &self.ram, r.block_index)?;
            let (first, last) = validate::register_span(block, r)?;
            let host_addr = block.host as u64;
            let (offset, _) = block.chunk_range(first);
            let len = block.chunk_range(last).1 - offset;
            let rkey = match &self.whole[local] {
                Some(reg) => R::rkey(reg),
                // The whole block gets registered at the blocks exchange: a chunk registered now would be pinned twice.
                None if self.pin_all => {
                    return Err(protocol(format!(
                        "register request for block '{}' before the RAM blocks exchange (pin-all)",
                        block.name
                    )))
                }
                None => self.register_chunks(local, first, last, registrar)?,
            };
            results.push(RegisterResult { rkey, host_addr });
            self.observe(Event::Registered { block: local, offset, len });
        }
        Counters::add(&self.counters.registration_round_trips, 1);
        Ok(Reply::RegisterResult(results))
    }

    /// The rkey of a registration covering chunks `[first, last]` of local
    /// block `local`: an existing one that covers them all (its key stays
    /// valid, as the source may still write with it), or a new one if none
    /// of them is registered. Each chunk belongs to at most one registration,
    /// so each pinned byte is counted once; a request that overlaps an
    /// existing registration only in part is refused.
    fn register_chunks(&mut self, local: usize, first: usize, last: usize, registrar: &mut R) -> Result<u32> {
        let regs = &self.chunks[local];
        if let Some((o, span)) = regs.covering(first) {
            if span.last < last {
                return Err(protocol(format!(
                    "register request for chunks {first}..={last} overlaps the registration at chunk {o} in part"
                )));
            }
            return Ok(R::rkey(&span.registration));
        }
        if let Some(c) = regs.first_start_in(first, last) {
            return Err(protocol(format!(
                "register request for chunks {first}..={last} overlaps the registration of chunk {c}"
            )));
        }
        let block = &self.ram.blocks()[local];
        let (start, _) = block.chunk_range(first);
        let (_, end) = block.chunk_range(last);
        let len = end - start;
        registrar.check_budget(len).map_err(|e| {
            Error::new(
                ErrorKind::PinBudget,
                format!(
                    "the source asked to register chunks {first}..={last} of block '{}': {}",
                    block.name, e.message
                ),
            )
        })?;
        let reg = registrar.register_remote(&block.range(start, len))?;
        let rkey = R::rkey(&reg);
        Counters::add(&self.counters.chunks_registered, (last - first + 1) as u64);
        self.chunks[local].insert(first, last, reg);
        Ok(rkey)
    }

    /// UNREGISTER: drops the registration holding each named chunk (all of
    /// its chunks). A chunk that is not registered is refused: the source
    /// lost track of what it registered (QEMU would dereference a null MR).
    fn unregister(&mut self, requests: &[RegisterRequest], registrar: &mut R) -> Result<Reply> {
        for r in requests {
            self.check_stop()?;
            let (local, block) = validate::local_block(&self.order, &self.ram, r.block_index)?;
            let chunk = validate::unregister_chunk(block, r)?;
            let Some((owner, span)) = self.chunks[local].remove_covering(chunk) else {
                return Err(protocol(format!(
                    "unregister of chunk {chunk} of block '{}', which is not registered",
                    block.name
                )));
            };
            registrar.release_remote(span.registration);
            Counters::add(&self.counters.unpins, 1);
            let (offset, _) = block.chunk_range(owner);
            let len = block.chunk_range(span.last).1 - offset;
            self.observe(Event::Unregistered { block: local, offset, len });
        }
        Ok(Reply::UnregisterFinished(requests.len() as u32))
    }

    /// COMPRESS: every range is checked before any is applied.
    fn zero(&mut self, ranges: &[Compress]) -> Result<()> {
        validate::check_compress(ranges, self.extensions)?;
        let targets = ranges
            .iter()
            .map(|z| {
                let (local, block) = validate::local_block(&self.order, &self.ram, z.block_index)?;
                let offset = validate::block_offset(block, z.offset, z.length)?;
                if !self.extensions {
                    validate::check_compress_chunk(offset, z.length)?;
                }
                Ok((local, offset))
            })
            .collect::<Result<Vec<(usize, u64)>>>()?;
        for (z, (local, offset)) in ranges.iter().zip(targets) {
            zero_populated(&self.ram.blocks()[local], offset, z.length);
            Counters::add(&self.counters.zero_chunks, 1);
            self.observe(Event::Zeroed { block: local, offset, len: z.length });
        }
        Ok(())
    }

    /// Hands every registration back to `registrar`, whole blocks first:
    /// at the end, or when post-copy starts (the source writes no more).
    pub fn release_all(&mut self, registrar: &mut R) {
        let owners = self.chunks.iter_mut().flat_map(Registered::drain);
        for reg in self.whole.iter_mut().filter_map(Option::take).chain(owners) {
            registrar.release_remote(reg);
        }
    }
}

/// Zeroes `len` bytes at `offset` of `block` (checked to lie inside it) without
/// allocating memory: never-populated pages already read as zero and are not
/// touched (`RamBlock::populated_runs`), and of the others only the 4 KiB
/// pages that are not already zero are written.
fn zero_populated(block: &RamBlock, offset: u64, len: u64) {
    const PAGE: u64 = 4096;
    let runs = block.populated_runs(offset, len);
    let populated = runs.unwrap_or_else(|| vec![Run { start: offset, end: offset + len, populated: true }]);
    for r in populated.into_iter().filter(|r| r.populated) {
        let mut at = r.start;
        while at < r.end {
            let end = (((block.host as u64 + at) / PAGE + 1) * PAGE - block.host as u64).min(r.end);
            block.range(at, end - at).make_zero();
            at = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::host::guest::testing::{memfd, Mapping};
    use crate::wire::{decode_message, PostcopyBlock, CHUNK_SIZE, CONTROL_BUFFER_SIZE, MAX_REPEAT};

    const MIB: u64 = CHUNK_SIZE;
    const TIB: u64 = 1 << 40;

    /// Registrations as bare keys; `live` holds those not yet released.
    #[derive(Default)]
    struct Keys {
        next: u32,
        live: Vec<u32>,
        /// Set with each registration: the hypervisor aborts meanwhile.
        abort: Option<Arc<AtomicBool>>,
    }

    impl Registrar for Keys {
        type Registration = u32;

        fn check_budget(&self, _len: u64) -> Result<()> {
            Ok(())
        }

        fn register_remote(&mut self, _guest: &GuestRange) -> Result<u32> {
            if let Some(stop) = &self.abort {
                stop.store(true, Ordering::Relaxed);
            }
            self.next += 1;
            self.live.push(self.next);
            Ok(self.next)
        }

        fn rkey(key: &u32) -> u32 {
            *key
        }

        fn release_remote(&mut self, key: u32) {
            assert!(self.live.contains(&key), "released twice: {key}");
            self.live.retain(|&k| k != key);
        }
    }

    /// One block "a" at RAM offset 16 MiB over a mapping: 3 MiB of real
    /// memory, or address space only (`whole`: `Keys` never touches memory).
    struct Fixture {
        mem: Mapping,
        dispatcher: Dispatcher<Keys>,
        keys: Keys,
    }

    impl Fixture {
        /// A block of `len` bytes of address space, registered whole: by
        /// pin-all, or by one REGISTER_REQUEST entry naming all its chunks.
        fn whole(len: u64, pin_all: bool) -> Fixture {
            let mem = Mapping::anonymous(len);
            let mut ram = RamBlocks::new();
            ram.add_range("a", mem.range(), 16 * MIB).unwrap();
            let negotiated = Negotiated { extensions: true, pin_all, authenticated: false, postcopy_recovery: false };
            let dispatcher = Dispatcher::new(ram, negotiated, Arc::new(Counters::new()), Arc::default());
            let mut f = Fixture { mem, dispatcher, keys: Keys::default() };
            if pin_all {
                assert!(matches!(f.send::<BlockSpec>(CommandType::RamBlocksRequest, &[]).unwrap(), Step::Blocks));
                let whole = f.keys.register_remote(&f.mem.range()).unwrap();
                f.dispatcher.pinned_all(vec![whole]);
            } else {
                f.register(0, len / MIB - 1);
            }
            f
        }
    }

    /// A full REGISTER_REQUEST ([`MAX_REPEAT`] entries) over a block of
    /// `chunks` chunks: each from a chunk spread over the block to its end.
    fn to_the_end(chunks: u64) -> Vec<RegisterRequest> {
        let n = u64::from(MAX_REPEAT);
        let step = chunks / n;
        assert!(step > 0, "a block of at least {n} chunks");
        (0..n)
            .map(|i| RegisterRequest { key: 16 * MIB + i * step * MIB, block_index: 0, chunks: chunks - 1 - i * step })
            .collect()
    }

    impl Fixture {
        fn new(extensions: bool, pin_all: bool) -> Fixture {
            Fixture::at(16 * MIB, extensions, pin_all)
        }

        /// A 3 MiB block of 0xAA at `offset` in the RAM address space.
        fn at(offset: u64, extensions: bool, pin_all: bool) -> Fixture {
            let mem = Mapping::anonymous(3 * MIB);
            mem.fill(0xAA);
            let mut ram = RamBlocks::new();
            ram.add_range("a", mem.range(), offset).unwrap();
            let negotiated = Negotiated { extensions, pin_all, authenticated: false, postcopy_recovery: false };
            let dispatcher = Dispatcher::new(ram, negotiated, Arc::new(Counters::new()), Arc::default());
            Fixture { mem, dispatcher, keys: Keys::default() }
        }
    }

    impl Fixture {
        /// Sends one message built from `entries` through the wire codec.
        fn send<E: Entry>(&mut self, kind: CommandType, entries: &[E]) -> Result<Step> {
            let mut buf = vec![0u8; CONTROL_BUFFER_SIZE];
            let mut w = MessageWriter::new(&mut buf, kind);
            entries.iter().for_each(|e| w.push(e).unwrap());
            let n = w.finish();
            let m = decode_message(&buf[..n]).unwrap();
            self.dispatcher.dispatch(&m, &mut self.keys)
        }

        /// REGISTER_REQUEST for chunk `chunk` and `more` chunks after it; returns the rkey.
        fn register(&mut self, chunk: u64, more: u64) -> u32 {
            let r = RegisterRequest { key: 16 * MIB + chunk * MIB, block_index: 0, chunks: more };
            match self.send(CommandType::RegisterRequest, &[r]).unwrap() {
                Step::Answer(Reply::RegisterResult(results)) => results[0].rkey,
                other => panic!("{other:?}"),
            }
        }

        fn unregister(&mut self, chunks: &[u64]) -> Result<Step> {
            let requests: Vec<RegisterRequest> =
                chunks.iter().map(|&c| RegisterRequest { key: c, block_index: 0, chunks: 0 }).collect();
            self.send(CommandType::UnregisterRequest, &requests)
        }
    }

    fn refused(step: Result<Step>, words: &[&str]) {
        let e = step.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Protocol, "{e}");
        for w in words {
            assert!(e.message.contains(w), "{w:?} not in: {e}");
        }
    }

    #[test]
    fn unregister_drops_a_registration_once() {
        let mut f = Fixture::new(true, false);
        f.register(0, 0);
        let two = f.register(1, 1);
        assert!(matches!(f.unregister(&[0]).unwrap(), Step::Answer(Reply::UnregisterFinished(1))));
        // A covered chunk names the whole registration.
        assert!(matches!(f.unregister(&[2]).unwrap(), Step::Answer(Reply::UnregisterFinished(1))));
        assert!(f.keys.live.is_empty(), "{:?}", f.keys.live);
        assert_ne!(f.register(1, 1), two, "registered again: a new registration");
        assert_eq!(f.keys.live.len(), 1);
    }

    #[test]
    fn unregister_of_a_chunk_not_registered_is_refused() {
        let mut f = Fixture::new(true, false);
        refused(f.unregister(&[1]), &["chunk 1", "block 'a'", "not registered"]);

        let mut f = Fixture::new(true, false);
        f.register(0, 0);
        f.unregister(&[0]).unwrap();
        refused(f.unregister(&[0]), &["chunk 0", "not registered"]);

        // Two chunks of one registration: the first drops it, the second finds nothing.
        let mut f = Fixture::new(true, false);
        f.register(0, 2);
        refused(f.unregister(&[0, 1]), &["chunk 1", "not registered"]);
        assert!(f.keys.live.is_empty());
    }

    #[test]
    fn unregister_under_pin_all_is_refused() {
        let mut f = Fixture::new(true, true);
        assert!(matches!(f.send::<BlockSpec>(CommandType::RamBlocksRequest, &[]).unwrap(), Step::Blocks));
        // SAFETY: `Keys` touches no memory.
        let whole = f.keys.register_remote(&f.mem.range()).unwrap();
        f.dispatcher.pinned_all(vec![whole]);
        let trips = |f: &Fixture| f.dispatcher.counters.snapshot().registration_round_trips;
        assert_eq!(trips(&f), 1, "the exchange that registered the block");
        assert_eq!(f.register(1, 0), whole, "pin-all answers with the block's key");
        assert_eq!(trips(&f), 2);
        refused(f.unregister(&[1]), &["chunk 1", "not registered"]);
        assert_eq!(f.keys.live, [whole]);
    }

    /// Issue 31: after a whole-block registration each entry of a
    /// REGISTER_REQUEST looked at every chunk of the block (4096 entries on a
    /// 4 TiB block: 1.6 × 10^10 steps, the service thread stalled and close
    /// with it). Now each is one lookup, with either kind of whole-block
    /// registration.
    #[test]
    fn a_full_register_request_after_a_whole_block_registration_is_served_at_once() {
        for pin_all in [false, true] {
            let mut f = Fixture::whole(4 * TIB, pin_all);
            let whole = f.keys.live.clone();
            let requests = to_the_end(4 * TIB / MIB);
            let start = Instant::now();
            let step = f.send(CommandType::RegisterRequest, &requests).unwrap();
            let served = start.elapsed();
            let Step::Answer(Reply::RegisterResult(results)) = step else { panic!("{step:?}") };
            assert_eq!(results.len(), requests.len());
            assert!(results.iter().all(|r| [r.rkey] == whole[..]), "pin-all {pin_all}: not the whole block's key");
            assert_eq!(f.keys.live, whole, "registered again");
            assert!(served < Duration::from_millis(50), "pin-all {pin_all}: served in {served:?}");
        }
    }

    /// As above, counted: one lookup per entry, however many chunks the
    /// registration that answers covers.
    #[test]
    fn each_entry_of_a_register_request_is_one_lookup() {
        const LEN: u64 = 8 << 30;
        let mut f = Fixture::whole(LEN, false);
        let lookups = |f: &Fixture| f.dispatcher.chunks[0].lookups.get();
        let before = lookups(&f);
        let requests = to_the_end(LEN / MIB);
        assert!(matches!(f.send(CommandType::RegisterRequest, &requests).unwrap(), Step::Answer(_)));
        assert_eq!(lookups(&f) - before, requests.len() as u64);
        // Unregistering through any of its chunks: one lookup too.
        f.unregister(&[LEN / MIB / 2]).unwrap();
        assert_eq!(lookups(&f) - before, requests.len() as u64 + 1);
        assert!(f.keys.live.is_empty());
    }

    /// The connection's abort stops a registration request (and an
    /// unregistration request) between its entries.
    #[test]
    fn an_abort_stops_a_register_request_between_entries() {
        let mut f = Fixture::new(true, false);
        f.keys.abort = Some(f.dispatcher.stop.clone());
        let entries = [0, 1, 2].map(|c| RegisterRequest { key: 16 * MIB + c * MIB, block_index: 0, chunks: 0 });
        let e = f.send(CommandType::RegisterRequest, &entries).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
        assert_eq!(f.keys.live, [1], "registered after the abort");
        let e = f.unregister(&[0]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
        f.dispatcher.release_all(&mut f.keys);
        assert!(f.keys.live.is_empty());
    }

    /// Once POSTCOPY arrives the guest may run here: the registrations go
    /// (their budget serves post-copy), and the source may no longer
    /// register, write, zero or open a window; END still ends it.
    #[test]
    fn after_postcopy_the_source_may_not_register_or_zero() {
        let mut f = Fixture::new(true, false);
        assert!(matches!(f.send::<BlockSpec>(CommandType::RamBlocksRequest, &[]).unwrap(), Step::Blocks));
        f.register(0, 1);
        assert!(matches!(f.send::<BlockSpec>(CommandType::RegisterFinished, &[]).unwrap(), Step::WindowClosed));
        let block = PostcopyBlock { block_index: 0, length: 3 * MIB, ..PostcopyBlock::default() };
        assert!(matches!(f.send(CommandType::Postcopy, &[block]).unwrap(), Step::Postcopy(plan) if plan.is_empty()));
        f.dispatcher.release_all(&mut f.keys);
        assert!(f.keys.live.is_empty(), "{:?}", f.keys.live);
        let r = RegisterRequest { key: 16 * MIB, block_index: 0, chunks: 0 };
        refused(f.send(CommandType::RegisterRequest, &[r]), &["RegisterRequest", "after post-copy"]);
        let z = Compress { value: 0, block_index: 0, offset: 16 * MIB, length: 4096 };
        refused(f.send(CommandType::Compress, &[z]), &["Compress", "after post-copy"]);
        refused(f.send::<BlockSpec>(CommandType::RegisterFinished, &[]), &["after post-copy"]);
        refused(f.send(CommandType::Postcopy, &[block]), &["Postcopy", "after post-copy"]);
        assert!(f.keys.live.is_empty(), "{:?}", f.keys.live);
        let end = EndSummary { stream_bytes: 0, windows: 1 };
        assert!(matches!(f.send(CommandType::End, &[end]).unwrap(), Step::Last(..)));
    }

    /// Found by the `dispatch` fuzz target: under pin-all, a REGISTER before
    /// RAM_BLOCKS_REQUEST was served with a chunk registration, and the
    /// blocks exchange then registered the whole block over it.
    #[test]
    fn pin_all_refuses_register_before_the_blocks_exchange() {
        for extensions in [false, true] {
            let mut f = Fixture::new(extensions, true);
            let r = RegisterRequest { key: 16 * MIB, block_index: 0, chunks: 0 };
            refused(f.send(CommandType::RegisterRequest, &[r]), &["block 'a'", "before the RAM blocks exchange"]);
            assert!(f.keys.live.is_empty(), "registered: {:?}", f.keys.live);
        }
    }

    #[test]
    fn the_observer_sees_windows_at_their_stream_offsets() {
        let mut f = Fixture::new(false, false);
        let events = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let seen = events.clone();
        f.dispatcher.set_observer(Box::new(move |e| seen.lock().push(*e)));
        let stream = |f: &mut Fixture, n: usize| {
            let mut buf = vec![0u8; CONTROL_BUFFER_SIZE];
            let mut w = MessageWriter::new(&mut buf, CommandType::QemuFile);
            w.push_bytes(&vec![1u8; n]).unwrap();
            let n = w.finish();
            assert!(matches!(
                f.dispatcher.dispatch(&decode_message(&buf[..n]).unwrap(), &mut f.keys),
                Ok(Step::Stream)
            ));
        };
        stream(&mut f, 10);
        f.register(1, 1);
        let zero = Compress { value: 0, block_index: 0, offset: 16 * MIB + 4096, length: 4096 };
        f.send(CommandType::Compress, &[zero]).unwrap();
        f.send::<Compress>(CommandType::RegisterFinished, &[]).unwrap();
        stream(&mut f, 5);
        f.send::<Compress>(CommandType::RegisterFinished, &[]).unwrap();
        f.unregister(&[2]).unwrap();
        assert_eq!(
            *events.lock(),
            [
                Event::WindowOpened { stream_offset: 10 },
                Event::Registered { block: 0, offset: MIB, len: 2 * MIB },
                Event::Zeroed { block: 0, offset: 4096, len: 4096 },
                Event::WindowClosed { stream_offset: 10 },
                // An empty window: REGISTER_FINISHED alone.
                Event::WindowOpened { stream_offset: 15 },
                Event::WindowClosed { stream_offset: 15 },
                Event::WindowOpened { stream_offset: 15 },
                Event::Unregistered { block: 0, offset: MIB, len: 2 * MIB },
            ]
        );
    }

    /// QEMU counts a block's chunks from the block's start: a block at an
    /// offset that is no multiple of 1 MiB (QEMU 10.2's q35 has such blocks)
    /// gets COMPRESS ranges of whole chunks that straddle 1 MiB boundaries of
    /// the RAM address space.
    #[test]
    fn compress_chunks_count_from_the_block_start() {
        let base = 16 * MIB + 512 * 1024;
        let mut f = Fixture::at(base, false, false);
        let z = |offset, length| Compress { value: 0, block_index: 0, offset, length };
        f.send(CommandType::Compress, &[z(base + MIB, MIB)]).unwrap();
        assert!(f.mem.bytes(MIB, 2 * MIB).iter().all(|&b| b == 0), "chunk 1 zeroed");
        assert!(f.mem.bytes(0, MIB).iter().all(|&b| b == 0xAA), "chunk 0 untouched");
        refused(f.send(CommandType::Compress, &[z(base + MIB / 2, MIB)]), &["not inside one 1 MiB chunk"]);
    }

    /// A zero range over a shared memfd: data pages zeroed, holes left holes (nothing allocated).
    #[test]
    fn zeroing_leaves_never_populated_pages_alone() {
        use std::os::fd::AsFd;
        use std::os::unix::fs::{FileExt, MetadataExt};
        const PAGE: u64 = 4096;
        let pages = 32u64;
        let file = memfd("zero-test");
        file.set_len(pages * PAGE).unwrap();
        for p in [1u64, 2, 9] {
            file.write_all_at(&[7; 64], p * PAGE + 100).unwrap();
        }
        let mem = Mapping::shared(file.as_fd(), pages * PAGE);
        let mut ram = RamBlocks::new();
        ram.add_range("shm", mem.range(), 0).unwrap();
        ram.set_backing(0, file.as_fd(), 0).unwrap();
        let allocated = file.metadata().unwrap().blocks();
        zero_populated(&ram.blocks()[0], 0, pages * PAGE);
        assert_eq!(file.metadata().unwrap().blocks(), allocated, "zeroing allocated pages");
        let mut all = vec![1u8; (pages * PAGE) as usize];
        file.read_exact_at(&mut all, 0).unwrap();
        assert!(all.iter().all(|&b| b == 0), "the data pages were not zeroed");
        // Without the backing file (unknown: every page read) the holes get allocated: what the test guards against.
        let mut unknown = RamBlocks::new();
        unknown.add_range("shm", mem.range(), 0).unwrap();
        zero_populated(&unknown.blocks()[0], 0, pages * PAGE);
        assert!(file.metadata().unwrap().blocks() > allocated);
    }
}
