//! How a piece sent at the first touch of its chunk splits into zero ranges
//! (COMPRESS, no registration) and data (registered and written), without
//! reading the pages that were never populated (`RamBlock::populated_runs`):
//! reading a hole of a shared mapping allocates it, so a source that read
//! all of RAM to find its zeros would grow to its full size.
//!
//! Between rdmamig peers a COMPRESS message carries up to 1024 ranges, so
//! zero runs are exact: never-populated runs, and the all-zero 4 KiB pages
//! of the populated ones. Toward QEMU each COMPRESS is a message of its own
//! (QEMU applies only the first range), costing a control round trip: the
//! populated runs are not split by page (as QEMU's own source, which checks
//! whole writes), and one range from the first to the last never-populated
//! byte is zeroed, the data runs inside it written after (a chunk's COMPRESS
//! precedes its writes).

use super::piece::Piece;
use crate::engine::ram::{RamBlock, Run};

/// Granularity of the zero scan of populated memory.
const SCAN: u64 = 4096;

/// A part of a piece: zero (sent as COMPRESS) or data (written).
#[derive(Clone, Copy, Debug)]
pub(super) enum Part {
    Zero { offset: u64, len: u64 },
    Data(Piece),
}

/// The parts of piece `p` of `block`, in order, toward an rdmamig peer
/// (`extensions`) or QEMU (see the module comment).
pub(super) fn split(block: &RamBlock, p: Piece, extensions: bool) -> Vec<Part> {
    let runs = block.populated_runs(p.offset, p.len);
    let runs = runs.unwrap_or_else(|| vec![Run { start: p.offset, end: p.offset + p.len, populated: true }]);
    let zero = |start: u64, end: u64| Part::Zero { offset: start, len: end - start };
    let data = |start: u64, end: u64| Part::Data(Piece { offset: start, len: end - start, ..p });
    if extensions {
        let mut parts = Vec::new();
        for r in runs {
            if r.populated {
                scan(block, r.start, r.end, |s, e, z| add(&mut parts, if z { zero(s, e) } else { data(s, e) }));
            } else {
                add(&mut parts, zero(r.start, r.end));
            }
        }
        return parts;
    }
    // Toward QEMU: one COMPRESS at most, from the first zero run to the last (holes known or not).
    if runs.iter().all(|r| r.populated) {
        let z = block.range(p.offset, p.len).is_zero();
        return vec![if z { zero(p.offset, p.offset + p.len) } else { data(p.offset, p.offset + p.len) }];
    }
    let zeros: Vec<bool> =
        runs.iter().map(|r| !r.populated || block.range(r.start, r.end - r.start).is_zero()).collect();
    let zero_runs = || runs.iter().zip(&zeros).filter(|(_, &z)| z).map(|(r, _)| r);
    let from = zero_runs().next().expect("a never-populated run is zero").start;
    let to = zero_runs().next_back().expect("a never-populated run is zero").end;
    let mut parts = vec![zero(from, to)];
    // The data inside the zero range is written after it.
    parts.extend(runs.iter().zip(&zeros).filter(|(_, &z)| !z).map(|(r, _)| data(r.start, r.end)));
    parts
}

/// Calls `f(start, end, zero)` for the runs of all-zero and other 4 KiB pages
/// (aligned in memory) of populated memory `[start, end)` of `block`.
fn scan(block: &RamBlock, start: u64, end: u64, mut f: impl FnMut(u64, u64, bool)) {
    let host = block.host as u64;
    let mut at = start;
    while at < end {
        let next = ((host + at) / SCAN + 1) * SCAN - host;
        let page_end = next.min(end);
        let z = block.range(at, page_end - at).is_zero();
        f(at, page_end, z);
        at = page_end;
    }
}

/// Appends `part`, merged with the last part if adjacent and of the same kind.
fn add(parts: &mut Vec<Part>, part: Part) {
    match (parts.last_mut(), part) {
        (Some(Part::Zero { offset, len }), Part::Zero { offset: o, len: l }) if *offset + *len == o => *len += l,
        (Some(Part::Data(d)), Part::Data(n)) if d.offset + d.len == n.offset => d.len += n.len,
        _ => parts.push(part),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::RamBlocks;
    use crate::host::guest::testing::Mapping;

    const PAGE: u64 = 4096;

    fn pagemap_present(ptr: *const u8, pages: u64) -> Vec<bool> {
        use crate::host::pagemap::{entries, PM_PRESENT};
        entries(ptr, pages, PM_PRESENT).into_iter().map(|e| e != 0).collect()
    }

    /// (offset, len, zero) in pages of each part.
    fn pages(parts: &[Part]) -> Vec<(u64, u64, bool)> {
        parts
            .iter()
            .map(|p| match *p {
                Part::Zero { offset, len } => (offset / PAGE, len / PAGE, true),
                Part::Data(d) => (d.offset / PAGE, d.len / PAGE, false),
            })
            .collect()
    }

    #[test]
    fn a_piece_splits_into_holes_zero_pages_and_data() {
        let n = 16u64;
        let guest = Mapping::anonymous(n * PAGE);
        // Pages 2, 3, 8 and 12 hold data; 4 was written and zeroed again (populated, zero); the rest never touched.
        for p in [2, 3, 4, 8, 12] {
            guest.poke(p * PAGE + 1, 1);
        }
        guest.poke(4 * PAGE + 1, 0);
        let host = guest.range().addr() as *const u8;
        let mut ram = RamBlocks::new();
        ram.add_range("anon", guest.range(), 0).unwrap();
        let block = &ram.blocks()[0];
        let before = pagemap_present(host, n);
        let piece = |offset: u64, len: u64| Piece { block: 0, offset: offset * PAGE, len: len * PAGE };
        // rdmamig peers: exact zero runs (holes and the zero page merged), data runs written.
        assert_eq!(
            pages(&split(block, piece(0, 16), true)),
            [(0, 2, true), (2, 2, false), (4, 4, true), (8, 1, false), (9, 3, true), (12, 1, false), (13, 3, true)]
        );
        assert_eq!(pages(&split(block, piece(5, 3), true)), [(5, 3, true)]);
        // QEMU: one zero range from the first zero run to the last, every data run written after it;
        // populated runs are not split by page (page 4 goes with 2 and 3).
        assert_eq!(
            pages(&split(block, piece(0, 16), false)),
            [(0, 16, true), (2, 3, false), (8, 1, false), (12, 1, false)]
        );
        assert_eq!(pages(&split(block, piece(2, 7), false)), [(5, 3, true), (2, 3, false), (8, 1, false)]);
        // No hole: the whole piece, zero or not, as before.
        assert_eq!(pages(&split(block, piece(2, 3), false)), [(2, 3, false)]);
        assert_eq!(pages(&split(block, piece(2, 3), true)), [(2, 2, false), (4, 1, true)]);
        assert_eq!(pages(&split(block, piece(4, 1), false)), [(4, 1, true)]);
        assert_eq!(pagemap_present(host, n), before, "splitting populated nothing");
    }
}
