//! Recording: a destination that keeps what its source sent.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::{RangeKind, RecordedBlock, RecordedRange, RecordedWindow, Recording};
use crate::engine::{Destination, Ending, Event, Listener, RamBlocks, Read};
use crate::{Error, ErrorKind, Result};

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
