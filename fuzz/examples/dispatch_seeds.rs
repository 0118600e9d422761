//! Writes the `dispatch` target's seeds: message sequences a well-behaved
//! source sends in each mode, and a few a destination must refuse, encoded
//! with the library's own `MessageWriter`.
//!
//!   cargo run --manifest-path fuzz/Cargo.toml --example dispatch_seeds -- fuzz/seeds/dispatch

use std::path::PathBuf;

use rdmamig::wire::{
    BlockSpec, CommandType, Compress, EndSummary, Entry, MessageWriter, PostcopyRecovery, RegisterRequest, CHUNK_SIZE,
    CONTROL_BUFFER_SIZE,
};
use rdmamig_fuzz::dispatch::{BLOCKS, BUDGET_SHIFT, MODE_EXTENSIONS, MODE_PIN_ALL, MODE_RECOVERY};

/// One input: the mode byte, then the messages as SENDs carry them.
struct Sequence {
    bytes: Vec<u8>,
    stream_bytes: u64,
    windows: u64,
}

impl Sequence {
    fn new(mode: u8) -> Sequence {
        Sequence { bytes: vec![mode], stream_bytes: 0, windows: 0 }
    }

    fn message(mut self, kind: CommandType, build: impl FnOnce(&mut MessageWriter)) -> Sequence {
        let mut buf = vec![0u8; CONTROL_BUFFER_SIZE];
        let mut w = MessageWriter::new(&mut buf, kind);
        build(&mut w);
        let n = w.finish();
        self.bytes.extend_from_slice(&buf[..n]);
        self
    }

    fn entries<E: Entry>(self, kind: CommandType, entries: &[E]) -> Sequence {
        self.message(kind, |w| entries.iter().for_each(|e| w.push(e).expect("entry fits")))
    }

    /// RAM_BLOCKS_REQUEST: with our blocks' specs in `order` (rdmamig), or empty (QEMU).
    fn blocks(self, order: &[usize]) -> Sequence {
        let specs: Vec<BlockSpec> =
            order.iter().map(|&i| BlockSpec::new(BLOCKS[i].0, BLOCKS[i].2 as u64).expect("block spec")).collect();
        self.entries(CommandType::RamBlocksRequest, &specs)
    }

    fn stream(mut self, data: &[u8]) -> Sequence {
        self.stream_bytes += data.len() as u64;
        self.message(CommandType::QemuFile, |w| w.push_bytes(data).expect("stream bytes fit"))
    }

    fn finished(mut self) -> Sequence {
        self.windows += 1;
        self.message(CommandType::RegisterFinished, |_| {})
    }

    /// END with what was sent so far.
    fn end(self) -> Sequence {
        let summary = EndSummary { stream_bytes: self.stream_bytes, windows: self.windows };
        self.entries(CommandType::End, &[summary])
    }
}

/// REGISTER_REQUEST entry: chunk `chunk` of source block `index` (local block `local`) and `more` after it.
fn register(index: u32, local: usize, chunk: u64, more: u64) -> RegisterRequest {
    RegisterRequest { key: BLOCKS[local].1 + chunk * CHUNK_SIZE, block_index: index, chunks: more }
}

/// UNREGISTER_REQUEST entry: its key is the chunk index.
fn unregister(index: u32, chunk: u64) -> RegisterRequest {
    RegisterRequest { key: chunk, block_index: index, chunks: 0 }
}

fn zero(index: u32, local: usize, offset: u64, length: u64) -> Compress {
    Compress { value: 0, block_index: index, offset: BLOCKS[local].1 + offset, length }
}

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).expect("usage: dispatch_seeds DIR"));
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    use CommandType::{Compress as Z, RegisterRequest as Reg, UnregisterRequest as Unreg};
    let ext = MODE_EXTENSIONS;
    let seeds = [
        // QEMU: one range per COMPRESS, one chunk per REGISTER, no names, no END.
        (
            "qemu_dynamic",
            Sequence::new(0)
                .stream(b"QEVM\0\0\0\x03")
                .blocks(&[])
                .entries(Z, &[zero(0, 0, 4096, 8192)])
                .entries(Reg, &[register(0, 0, 1, 0)])
                .entries(Reg, &[register(2, 2, 0, 0)])
                .finished()
                .stream(&[0x07; 64]),
        ),
        ("qemu_pin_all", Sequence::new(MODE_PIN_ALL).blocks(&[]).entries(Reg, &[register(1, 1, 0, 0)]).finished()),
        // rdmamig: named blocks in the source's order, batches, unregistration, END.
        (
            "rdmamig_dynamic",
            Sequence::new(ext)
                .blocks(&[2, 0, 1])
                .entries(Z, &[zero(1, 0, 0, CHUNK_SIZE), zero(2, 1, 0, 4096), zero(0, 2, 4096, 8192)])
                .entries(Reg, &[register(1, 0, 0, 2), register(2, 1, 0, 0), register(0, 2, 0, 0)])
                .stream(b"device state")
                .entries(Unreg, &[unregister(1, 1), unregister(0, 0)])
                .entries(Reg, &[register(1, 0, 1, 0)])
                .finished()
                .stream(b"more state")
                .end(),
        ),
        (
            "rdmamig_pin_all",
            Sequence::new(ext | MODE_PIN_ALL)
                .blocks(&[0, 1, 2])
                .entries(Reg, &[register(0, 0, 2, 0)])
                .entries(Z, &[zero(1, 1, 0, CHUNK_SIZE)])
                .finished()
                .end(),
        ),
        // Under a 1 MiB budget: register, unregister, register again; then past the budget.
        (
            "rdmamig_budget",
            Sequence::new(ext | (1 << BUDGET_SHIFT))
                .blocks(&[0, 1, 2])
                .entries(Reg, &[register(0, 0, 0, 0)])
                .entries(Unreg, &[unregister(0, 0)])
                .entries(Reg, &[register(1, 1, 0, 0)])
                .finished()
                .entries(Reg, &[register(0, 0, 1, 0)]),
        ),
        // Refused: UNREGISTER of a chunk no longer registered.
        (
            "unregister_twice",
            Sequence::new(ext)
                .entries(Reg, &[register(0, 0, 0, 1)])
                .entries(Unreg, &[unregister(0, 1), unregister(0, 0)]),
        ),
        // Refused: under pin-all, a REGISTER before the blocks exchange (found by fuzzing).
        ("pin_all_register_first", Sequence::new(MODE_PIN_ALL).entries(Reg, &[register(2, 2, 0, 0)]).blocks(&[])),
        // Refused: END before the window closed.
        ("end_in_window", Sequence::new(ext).entries(Z, &[zero(2, 2, 0, 4096)]).end()),
        // Post-copy recovery negotiated: POSTCOPY_RECOVERY after the first window.
        (
            "rdmamig_recovery",
            Sequence::new(ext | MODE_RECOVERY)
                .blocks(&[0, 1, 2])
                .finished()
                .entries(CommandType::PostcopyRecovery, &[PostcopyRecovery { port: 4791, token: [7; 16] }]),
        ),
    ];
    for (name, seq) in seeds {
        std::fs::write(dir.join(name), &seq.bytes).expect("write a seed");
    }
}
