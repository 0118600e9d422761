//! The unit of the source's transfer: a contiguous range within one chunk,
//! sent as one write (or, at a chunk's first touch, split into zero ranges
//! and data: `sparse`).

/// A contiguous range within one chunk: one write. (With pin-all a write
/// could span chunks; larger writes were slower on rxe: docs/benchmarks.md.)
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    pub block: u32,
    pub offset: u64,
    pub len: u64,
}
