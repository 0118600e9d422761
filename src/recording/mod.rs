//! Record and replay a migration: a debugging tool on the public API.
//!
//! [`Recording::record`] serves one source as a destination and keeps what
//! it sent: every stream byte, each iteration window's place in the stream
//! with the ranges registered or zeroed in it, the RAM-block list, and the
//! final RAM. [`Recording::replay`] is a source that sends it again: the
//! stream bytes in order, each window opened and closed at its recorded
//! stream position, so a destination that parses the stream (QEMU's) sees
//! what the recorded source sent. A QEMU source recorded by rdmamig and
//! replayed into a QEMU destination is how the QEMU-compatible source is
//! checked against QEMU itself.
//!
//! A destination cannot see RDMA WRITEs into memory it registered earlier,
//! so the replay cannot know what each window wrote. But a source writes
//! only into ranges it had registered (dynamic: REGISTER; pin-all: whole
//! blocks, at the RAM-blocks exchange), so the replay writes the final RAM
//! of every range registered or zeroed in a window during that window, and
//! the destination ends up with the recorded final RAM; what it holds
//! between windows differs from the original migration (no destination
//! checks that).
//!
//! The file format ([`Recording::write_to`]) is versioned; see `format`.

mod format;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::engine::{Config, Destination, Ending, Event, Listener, RamBlocks, Read, SaveRange, Source};
use crate::{Error, ErrorKind, Result};

pub use format::FORMAT_VERSION;

/// One RAM block of a recording, with its final contents.
#[derive(Clone, PartialEq, Eq)]
pub struct RecordedBlock {
    /// The block's name (QEMU's RAMBlock idstr, e.g. `pc.ram`).
    pub name: String,
    /// Its offset in the guest's RAM address space (QEMU's `offset`).
    pub offset: u64,
    /// The final RAM: the block's length is this length.
    pub ram: Vec<u8>,
}

impl std::fmt::Debug for RecordedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecordedBlock({:?}, offset {:#x}, {:#x} bytes)", self.name, self.offset, self.ram.len())
    }
}

/// What the source did with a range in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeKind {
    /// Asked for it to be registered: it writes there.
    Registered,
    /// Said it is zero (COMPRESS).
    Zeroed,
}

/// A range of a block, `len` bytes at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedRange {
    pub kind: RangeKind,
    pub block: u32,
    pub offset: u64,
    pub len: u64,
}

/// An iteration window: opened after `stream_begin` stream bytes, closed
/// (REGISTER_FINISHED) after `stream_end` (the same, from a QEMU source,
/// which sends no stream bytes inside a window).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedWindow {
    pub stream_begin: u64,
    pub stream_end: u64,
    pub ranges: Vec<RecordedRange>,
}

/// A recorded migration (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recording {
    /// The source registered whole blocks up front.
    pub pin_all: bool,
    /// In the source's order.
    pub blocks: Vec<RecordedBlock>,
    pub stream: Vec<u8>,
    /// In order; the stream positions never go back.
    pub windows: Vec<RecordedWindow>,
}

/// A RAM block the recording destination offers: QEMU's `info ramblock`
/// gives them, in its migration order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    pub name: String,
    pub offset: u64,
    pub length: u64,
}

impl Recording {
    /// Serves one source on `listener` with zeroed blocks laid out as
    /// `layout` (for a QEMU source: its blocks, in its order), and records
    /// it until it leaves. `timeout` bounds the wait for the source to
    /// connect; the listener's `Config::liveness` bounds silences after.
    /// Returns the recording and how the migration ended; a failed one is an error.
    pub fn record(
        listener: &Listener,
        layout: &[BlockLayout],
        timeout: Option<Duration>,
    ) -> Result<(Recording, Ending)> {
        let mut ram: Vec<Vec<u8>> = layout.iter().map(|b| vec![0u8; b.length as usize]).collect();
        let mut registry = RamBlocks::new();
        for (b, mem) in layout.iter().zip(&mut ram) {
            // SAFETY: the destination (the only writer) is stopped before `ram`
            // is read or dropped: by `close` below, or, on an early return, by
            // its Drop (`dest` is declared after `ram`, so it drops first).
            unsafe { registry.add(&b.name, mem.as_mut_ptr(), b.offset, b.length)? };
        }
        let events = Arc::new(Mutex::new(Vec::new()));
        let observer = {
            let events = events.clone();
            Box::new(move |e: &Event| events.lock().push(*e))
        };
        let dest = Destination::accept_observed(listener, &registry, timeout, observer)?;
        let mut stream = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let ending = loop {
            match dest.get(&mut buf, None) {
                Ok(Read::Bytes(n)) => stream.extend_from_slice(&buf[..n]),
                Ok(Read::End(ending)) => break Ok(ending),
                Err(e) => break Err(e),
            }
        };
        dest.close();
        let ending = ending?;
        let pin_all = dest.negotiated().pin_all;
        let windows = windows(&events.lock())?;
        let blocks = layout
            .iter()
            .zip(ram)
            .map(|(b, ram)| RecordedBlock { name: b.name.clone(), offset: b.offset, ram })
            .collect();
        Ok((Recording { pin_all, blocks, stream, windows }, ending))
    }

    /// Connects to a destination on `host:port` as a source (with `config`,
    /// its `pin_all` replaced by the recording's) and sends the recording:
    /// the stream in order, each window at its recorded position, writing
    /// the final RAM of its ranges.
    /// Returns how the source's `close` judged the end.
    pub fn replay(&mut self, host: &str, port: u16, config: &Config) -> Result<Ending> {
        self.check()?;
        let config = Config { pin_all: self.pin_all, ..config.clone() };
        let mut registry = RamBlocks::new();
        for b in &mut self.blocks {
            // SAFETY: the source only reads the blocks, and is closed or dropped
            // below before `self` (borrowed mutably meanwhile) can change them.
            unsafe { registry.add(&b.name, b.ram.as_mut_ptr(), b.offset, b.ram.len() as u64)? };
        }
        let mut source = Source::connect(host, port, &config, &registry)?;
        match self.send(&mut source) {
            Ok(()) => source.close(),
            Err(e) => {
                source.abort();
                Err(e)
            }
        }
    }

    fn send(&self, source: &mut Source) -> Result<()> {
        let mut sent = 0;
        for w in &self.windows {
            source.put(&self.stream[sent..w.stream_begin as usize])?;
            source.iteration_begin()?;
            source.save_ranges(w.ranges.iter().map(|r| SaveRange { block: r.block, offset: r.offset, len: r.len }))?;
            // Held back by the source until the window is closed, as they were sent.
            source.put(&self.stream[w.stream_begin as usize..w.stream_end as usize])?;
            source.iteration_end()?;
            sent = w.stream_end as usize;
        }
        source.put(&self.stream[sent..])
    }

    /// Whether the windows and ranges fit the stream and the blocks.
    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::new(ErrorKind::InvalidArgument, format!("recording: {what}")));
        let mut at = 0;
        for (i, w) in self.windows.iter().enumerate() {
            if w.stream_begin < at || w.stream_end < w.stream_begin || w.stream_end > self.stream.len() as u64 {
                return bad(format!(
                    "window {i} spans stream bytes {}..{}, after {at} of {}",
                    w.stream_begin,
                    w.stream_end,
                    self.stream.len()
                ));
            }
            at = w.stream_end;
            for r in &w.ranges {
                let fits = self
                    .blocks
                    .get(r.block as usize)
                    .is_some_and(|b| r.offset.checked_add(r.len).is_some_and(|end| end <= b.ram.len() as u64));
                if !fits {
                    return bad(format!("window {i} has a range outside the blocks: {r:?}"));
                }
            }
        }
        if self.blocks.is_empty() {
            return bad("no RAM blocks".into());
        }
        Ok(())
    }
}

/// The windows the events describe.
fn windows(events: &[Event]) -> Result<Vec<RecordedWindow>> {
    let mut windows = Vec::new();
    let mut open: Option<RecordedWindow> = None;
    for e in events {
        let (kind, block, offset, len) = match *e {
            Event::WindowOpened { stream_offset } => {
                open =
                    Some(RecordedWindow { stream_begin: stream_offset, stream_end: stream_offset, ranges: Vec::new() });
                continue;
            }
            Event::WindowClosed { stream_offset } => {
                windows.extend(open.take().map(|w| RecordedWindow { stream_end: stream_offset, ..w }));
                continue;
            }
            Event::Unregistered { .. } => continue,
            Event::Registered { block, offset, len } => (RangeKind::Registered, block, offset, len),
            Event::Zeroed { block, offset, len } => (RangeKind::Zeroed, block, offset, len),
        };
        // The destination opens a window before it serves anything in it.
        if let Some(w) = &mut open {
            w.ranges.push(RecordedRange { kind, block: block as u32, offset, len });
        }
    }
    if open.is_some() {
        return Err(Error::new(ErrorKind::Disconnected, "the source left with an iteration window open"));
    }
    Ok(windows)
}
