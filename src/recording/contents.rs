//! What a recording holds: the RAM blocks, the stream and the iteration
//! windows; and the check that they fit together.

use crate::{Error, ErrorKind, Result};

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

/// A recorded migration (see the [module documentation](super)).
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
impl Recording {
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
