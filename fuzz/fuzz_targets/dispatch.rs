//! The destination's dispatcher on arbitrary message sequences, over real
//! memory. A fake link stands in for the connection (the one place a
//! stand-in transport is right): input byte 0 sets the negotiated mode, the
//! rest is split into frames as SENDs would carry them (a control header and
//! the payload its `len` announces, cut short at the end of the input), each
//! decoded by `wire::decode_message` as the real link does; the first frame
//! the link or the dispatcher refuses ends the connection.
//!
//! After every message: nothing was written outside the RAM blocks (canary
//! bytes between and around them), every answer encodes, and the fake
//! registrar's invariants hold (no byte registered twice, the budget
//! checked before each registration, only live registrations released or
//! handed to the source). At the end every registration is released.
#![no_main]

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rdmamig::engine::stats::Counters;
use rdmamig::fuzzing::{Dispatcher, GuestRange, Registrar, Reply, Step};
use rdmamig::wire::{decode_message, CommandType, MessageWriter, CONTROL_BUFFER_SIZE, CONTROL_HEADER_LEN};
use rdmamig::{Error, ErrorKind, Negotiated, RamBlocks, Result};
use rdmamig_fuzz::dispatch::{BLOCKS, BUDGETS, BUDGET_SHIFT, MODE_EXTENSIONS, MODE_PIN_ALL, MODE_RECOVERY};

const CANARY_LEN: usize = 4096;
const CANARY: u8 = 0xC5;
const FILL: u8 = 0x5A;

/// The blocks in one buffer, canaries before, between and after them. The
/// buffer is leaked: the registry's pointers stay valid for the process.
struct Arena {
    base: usize,
    len: usize,
    ram: RamBlocks,
    /// `[start, end)` offsets of each block in the buffer.
    blocks: Vec<(usize, usize)>,
}

impl Arena {
    fn get() -> &'static Arena {
        static ARENA: OnceLock<Arena> = OnceLock::new();
        ARENA.get_or_init(|| {
            let len = CANARY_LEN + BLOCKS.iter().map(|b| b.2 + CANARY_LEN).sum::<usize>();
            let base = Box::leak(vec![CANARY; len].into_boxed_slice()).as_mut_ptr();
            let (mut ram, mut blocks, mut at) = (RamBlocks::new(), Vec::new(), CANARY_LEN);
            for (name, offset, length) in BLOCKS {
                // SAFETY: the leaked buffer is never freed; `at + length` is inside it.
                unsafe { ram.add(name, base.add(at), offset, length as u64).unwrap() };
                blocks.push((at, at + length));
                at += length + CANARY_LEN;
            }
            let arena = Arena { base: base as usize, len, ram, blocks };
            arena.refill();
            arena
        })
    }

    /// The whole buffer. Only read while the dispatcher is not running.
    fn bytes(&self) -> &[u8] {
        // SAFETY: the leaked buffer is `len` bytes; nothing writes it while this borrow lives.
        unsafe { std::slice::from_raw_parts(self.base as *const u8, self.len) }
    }

    /// Gives the blocks their initial contents back (COMPRESS zeroes them).
    fn refill(&self) {
        for &(start, end) in &self.blocks {
            // SAFETY: a block's range lies inside the leaked buffer; no borrow of it is alive.
            unsafe { std::ptr::write_bytes((self.base + start) as *mut u8, FILL, end - start) };
        }
    }

    fn check_canaries(&self) {
        let bytes = self.bytes();
        let mut gaps = vec![(0, self.blocks[0].0)];
        gaps.extend(self.blocks.windows(2).map(|w| (w[0].1, w[1].0)));
        gaps.push((self.blocks[self.blocks.len() - 1].1, self.len));
        for (start, end) in gaps {
            if let Some(i) = bytes[start..end].iter().position(|&b| b != CANARY) {
                panic!("written outside the RAM blocks at buffer offset {:#x}", start + i);
            }
        }
    }

    /// The block (index into `blocks`) that holds `[addr, addr + len)`, if one does.
    fn block_of(&self, addr: usize, len: usize) -> Option<usize> {
        let off = addr.checked_sub(self.base)?;
        self.blocks.iter().position(|&(start, end)| off >= start && off.checked_add(len).is_some_and(|e| e <= end))
    }
}

/// A registration of the fake: its key only, neither Clone nor Copy, so the
/// dispatcher can release it once at most.
#[derive(Debug)]
struct Token(u32);

struct Live {
    rkey: u32,
    addr: usize,
    len: usize,
}

/// Registrations without a device, checked as they come and go.
struct FakePins {
    arena: &'static Arena,
    budget: Option<u64>,
    live: Vec<Live>,
    next_rkey: u32,
}

impl FakePins {
    fn pinned(&self) -> u64 {
        self.live.iter().map(|r| r.len as u64).sum()
    }

    fn add(&mut self, addr: usize, len: usize) -> Token {
        assert!(len > 0, "empty registration");
        assert!(self.arena.block_of(addr, len).is_some(), "registration {addr:#x}+{len:#x} is not inside one block");
        if let Some(r) = self.live.iter().find(|r| addr < r.addr + r.len && r.addr < addr + len) {
            panic!("{addr:#x}+{len:#x} registered twice (overlaps {:#x}+{:#x})", r.addr, r.len);
        }
        self.next_rkey += 1;
        self.live.push(Live { rkey: self.next_rkey, addr, len });
        Token(self.next_rkey)
    }

    /// Pin-all: every block in one registration.
    fn pin_all(&mut self) -> Vec<Token> {
        let blocks = &self.arena.blocks;
        blocks.iter().map(|&(start, end)| self.add(self.arena.base + start, end - start)).collect()
    }

    /// The live registration of `rkey`, which the source is about to write into.
    fn handed_out(&self, rkey: u32) -> &Live {
        self.live.iter().find(|r| r.rkey == rkey).unwrap_or_else(|| panic!("rkey {rkey} handed out, not live"))
    }
}

impl Registrar for FakePins {
    type Registration = Token;

    fn check_budget(&self, len: u64) -> Result<()> {
        match self.budget {
            Some(b) if self.pinned() + len > b => Err(Error::new(ErrorKind::PinBudget, "over the fake's budget")),
            _ => Ok(()),
        }
    }

    fn register_remote(&mut self, guest: &GuestRange) -> Result<Token> {
        // What the dispatcher registers it has checked against the budget.
        let len = guest.len();
        assert!(self.check_budget(len).is_ok(), "registered {len} bytes past the budget");
        Ok(self.add(guest.addr() as usize, len as usize))
    }

    fn rkey(token: &Token) -> u32 {
        token.0
    }

    fn release_remote(&mut self, token: Token) {
        let i = self.live.iter().position(|r| r.rkey == token.0);
        self.live.swap_remove(i.unwrap_or_else(|| panic!("{token:?} released, not live")));
    }
}

/// The next frame: a header and the payload its `len` announces, or what is left.
fn next_frame(input: &[u8]) -> (&[u8], &[u8]) {
    let announced = input.get(..4).map_or(0, |l| u32::from_be_bytes(l.try_into().unwrap()) as usize);
    input.split_at(CONTROL_HEADER_LEN.saturating_add(announced).min(input.len()))
}

/// Encodes an answer as the link would send it, into a send buffer of the link's size.
fn encode(reply: &Reply) {
    thread_local! {
        static SEND: RefCell<Vec<u8>> = RefCell::new(vec![0; CONTROL_BUFFER_SIZE]);
    }
    SEND.with_borrow_mut(|buf| {
        let mut w = MessageWriter::new(buf, reply.kind());
        if let Err(e) = reply.write(&mut w) {
            panic!("{:?} does not encode: {e}", reply.kind());
        }
        let n = w.finish();
        assert_eq!(decode_message(&buf[..n]).map(|m| m.kind), Ok(reply.kind()), "{reply:?}");
    });
}

/// Checks an answer against the registrations: every key handed to the
/// source is live and inside the block the answer names.
fn check_keys(reply: &Reply, pins: &FakePins) {
    let block_at = |host: u64| pins.arena.ram.blocks().iter().position(|b| b.host as u64 == host);
    match reply {
        Reply::RegisterResult(results) => {
            for r in results {
                let block = block_at(r.host_addr).expect("REGISTER_RESULT names no block");
                let live = pins.handed_out(r.rkey);
                assert_eq!(pins.arena.block_of(live.addr, live.len), Some(block), "rkey of another block");
            }
        }
        Reply::RamBlocksResult(blocks) => {
            for d in blocks.iter().filter(|d| d.remote_rkey != 0) {
                let live = pins.handed_out(d.remote_rkey);
                assert_eq!(Some(live.addr as u64), Some(d.remote_host_addr), "pin-all key not of the whole block");
            }
        }
        Reply::UnregisterFinished(_) | Reply::EndAck => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else { return };
    let (extensions, pin_all) = (mode & MODE_EXTENSIONS != 0, mode & MODE_PIN_ALL != 0);
    let arena = Arena::get();
    let mut pins = FakePins {
        arena,
        budget: BUDGETS[(mode >> BUDGET_SHIFT) as usize % BUDGETS.len()],
        live: Vec::new(),
        next_rkey: 0,
    };
    let postcopy_recovery = extensions && mode & MODE_RECOVERY != 0;
    let negotiated = Negotiated { extensions, pin_all, authenticated: false, postcopy_recovery };
    let counters = Arc::new(Counters::new());
    let mut dispatcher = Dispatcher::<FakePins>::new(arena.ram.clone(), negotiated, counters, Arc::default());
    let mut pin_all_pending = pin_all;
    let mut zeroed = false;
    while !rest.is_empty() {
        let (frame, tail) = next_frame(rest);
        rest = tail;
        // The link ends the connection on a malformed message and on ERROR.
        let Ok(m) = decode_message(frame) else { break };
        if m.kind == CommandType::Error {
            break;
        }
        zeroed |= m.kind == CommandType::Compress;
        let step = dispatcher.dispatch(&m, &mut pins);
        arena.check_canaries();
        let reply = match step {
            Err(_) => break,
            Ok(Step::Stream | Step::WindowClosed | Step::Applied) => continue,
            Ok(Step::Answer(reply)) => reply,
            Ok(Step::Blocks) => {
                if pin_all_pending {
                    pin_all_pending = false;
                    dispatcher.pinned_all(pins.pin_all());
                }
                dispatcher.blocks_result()
            }
            // Post-copy needs the connection (RDMA READs); the plan must lie
            // in the RAM. The registrations go, as the service lets them.
            Ok(Step::Postcopy(plan)) => {
                for b in &plan {
                    let (host, len) = b.span();
                    assert!(arena.ram.blocks().iter().any(|r| r.host == host && r.length == len));
                }
                dispatcher.release_all(&mut pins);
                assert!(pins.live.is_empty(), "registrations left at post-copy: {}", pins.live.len());
                continue;
            }
            // Connecting the fault QP needs the connection; the decoder checked the numbers.
            Ok(Step::FaultQp(qp)) => {
                assert!(qp.qpn < 1 << 24 && qp.psn < 1 << 24);
                continue;
            }
            // Where the source would take a recovery connection: kept by the service.
            Ok(Step::Recovery(offer)) => {
                assert_ne!(offer.port, 0);
                continue;
            }
            Ok(Step::Last(reply, _)) => {
                encode(&reply);
                break;
            }
        };
        encode(&reply);
        check_keys(&reply, &pins);
    }
    dispatcher.release_all(&mut pins);
    assert!(pins.live.is_empty(), "registrations left after the end: {}", pins.live.len());
    if zeroed {
        arena.refill();
    }
});
