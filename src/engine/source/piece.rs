//! The unit of the source's transfer: a contiguous range within one chunk,
//! sent as one write (or, at a chunk's first touch, split into zero ranges
//! and data: `sparse`); and the merging of saved ranges into pieces.

use crate::engine::ram::chunk_of;
use crate::wire::CHUNK_SIZE;

/// Ranges being merged at once: saves from several hypervisor threads interleave.
const MERGE_SLOTS: usize = 4;

/// A contiguous range within one chunk: one write. (With pin-all a write
/// could span chunks; larger writes were slower on rxe: docs/benchmarks.md.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Piece {
    pub block: u32,
    pub offset: u64,
    pub len: u64,
}

/// The pieces of `len` bytes at `offset` of `block`: cut at chunk boundaries.
pub(super) fn pieces(block: u32, offset: u64, len: u64) -> impl Iterator<Item = Piece> {
    let end = offset + len;
    let mut at = offset;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let piece_end = ((at / CHUNK_SIZE + 1) * CHUNK_SIZE).min(end);
            let p = Piece { block, offset: at, len: piece_end - at };
            at = piece_end;
            p
        })
    })
}

/// Pieces still growing by merging with the next saves, oldest first.
pub(super) struct Merging {
    pending: Vec<Piece>,
}

impl Merging {
    pub fn new() -> Merging {
        Merging { pending: Vec::with_capacity(MERGE_SLOTS) }
    }

    /// Merges `p` (within one chunk) into the piece it continues, or starts a
    /// new one; returns the oldest piece, to be sent, when every slot was taken.
    pub fn add(&mut self, p: Piece) -> Option<Piece> {
        let grows = self
            .pending
            .iter_mut()
            .find(|q| q.block == p.block && q.offset + q.len == p.offset && chunk_of(q.offset) == chunk_of(p.offset));
        if let Some(q) = grows {
            q.len += p.len;
            return None;
        }
        let oldest = (self.pending.len() == MERGE_SLOTS).then(|| self.pending.remove(0));
        self.pending.push(p);
        oldest
    }

    /// Takes every piece still merging.
    pub fn take(&mut self) -> Vec<Piece> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    fn piece(block: u32, page: u64, pages: u64) -> Piece {
        Piece { block, offset: page * PAGE, len: pages * PAGE }
    }

    #[test]
    fn saves_merge_into_pieces_within_a_chunk() {
        // 1 MiB chunks: 256 pages each.
        assert_eq!(
            pieces(0, 250 * PAGE, 300 * PAGE).collect::<Vec<_>>(),
            [piece(0, 250, 6), piece(0, 256, 256), piece(0, 512, 38)]
        );
        let mut m = Merging::new();
        let mut sent = Vec::new();
        // Two interleaved streams merge; a run reaching a chunk's end starts another piece.
        for p in [piece(0, 0, 1), piece(1, 0, 1), piece(0, 1, 2), piece(1, 1, 1), piece(0, 3, 253), piece(0, 256, 1)] {
            sent.extend(m.add(p));
        }
        assert!(sent.is_empty());
        assert_eq!(m.take(), [piece(0, 0, 256), piece(1, 0, 2), piece(0, 256, 1)]);
        // Five disjoint ranges: the oldest goes when a fifth needs a slot.
        for p in [1, 3, 5, 7, 9] {
            sent.extend(m.add(piece(0, p, 1)));
        }
        assert_eq!(sent, [piece(0, 1, 1)]);
        assert_eq!(m.take().len(), 4);
    }
}
