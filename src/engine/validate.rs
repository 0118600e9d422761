//! Checks of what a source asks a destination to do: block indices, ranges
//! inside blocks, chunk spans, zero ranges, and the RAM-block lists of the
//! two sides. Pure functions over the registry, so every branch is unit-tested
//! here; the destination's service applies them to each request before it
//! touches memory.

use crate::engine::ram::{chunk_count, chunk_of, RamBlock, RamBlocks};
use crate::wire::{BlockSpec, Compress, RegisterRequest, CHUNK_SIZE};
use crate::{Error, ErrorKind, Result};

/// Zero-range bytes one COMPRESS message may ask for between rdmamig peers:
/// the work a single message can cause is bounded. Our source splits its
/// batches to stay under it.
pub(crate) const MAX_COMPRESS_BYTES: u64 = 256 << 20;

fn protocol(message: String) -> Error {
    Error::new(ErrorKind::Protocol, message)
}

/// The local block index and block that a source block index refers to.
/// `order[i]` is the local block of source block `i`.
pub(crate) fn local_block<'a>(order: &[usize], ram: &'a RamBlocks, source_index: u32) -> Result<(usize, &'a RamBlock)> {
    let local = *order
        .get(source_index as usize)
        .ok_or_else(|| protocol(format!("block index {source_index} out of range ({} blocks)", order.len())))?;
    Ok((local, &ram.blocks()[local]))
}

/// The offset within `block` of `addr` (in this side's RAM address space),
/// checking that `[addr, addr + len)` lies inside the block.
pub(crate) fn block_offset(block: &RamBlock, addr: u64, len: u64) -> Result<u64> {
    addr.checked_sub(block.offset).filter(|&off| block.check_range(off, len).is_ok()).ok_or_else(|| {
        protocol(format!(
            "range {addr:#x}+{len:#x} lies outside block '{}' ({:#x}+{:#x})",
            block.name, block.offset, block.length
        ))
    })
}

/// The chunks `[first, last]` a REGISTER_REQUEST entry names: the chunk of its
/// address and `chunks` more, all inside the block.
pub(crate) fn register_span(block: &RamBlock, r: &RegisterRequest) -> Result<(usize, usize)> {
    let first = chunk_of(block_offset(block, r.key, 1)?);
    let last = usize::try_from(r.chunks).ok().and_then(|extra| first.checked_add(extra));
    match last {
        Some(last) if last < block.chunk_count() => Ok((first, last)),
        _ => Err(protocol(format!(
            "register request for {} more chunks past the end of block '{}'",
            r.chunks, block.name
        ))),
    }
}

/// The chunk an UNREGISTER_REQUEST entry names (its key is a chunk index, not an address).
pub(crate) fn unregister_chunk(block: &RamBlock, r: &RegisterRequest) -> Result<usize> {
    usize::try_from(r.key)
        .ok()
        .filter(|&c| c < chunk_count(block.length))
        .ok_or_else(|| protocol(format!("unregister of chunk {} past the end of block '{}'", r.key, block.name)))
}

/// Checks one COMPRESS message before any range is applied: what QEMU sends
/// toward a QEMU-compatible peer (one range, each then checked by
/// [`check_compress_chunk`]), and at most [`MAX_COMPRESS_BYTES`] in all between
/// rdmamig peers. Each range's place in its block is checked by
/// [`block_offset`], for every range before any is applied.
pub(crate) fn check_compress(ranges: &[Compress], extensions: bool) -> Result<()> {
    if extensions {
        let total = ranges.iter().try_fold(0u64, |t, z| t.checked_add(z.length));
        if total.is_none_or(|t| t > MAX_COMPRESS_BYTES) {
            return Err(protocol(format!(
                "COMPRESS asks to zero more than {MAX_COMPRESS_BYTES:#x} bytes in one message ({} ranges)",
                ranges.len()
            )));
        }
        return Ok(());
    }
    match ranges {
        [_] => Ok(()),
        _ => Err(protocol(format!("COMPRESS with {} ranges (a QEMU source sends one)", ranges.len()))),
    }
}

/// A QEMU source's COMPRESS range, `length` bytes at `offset` in its block,
/// lies inside one 1 MiB chunk: QEMU counts a block's chunks from the block's
/// start, whatever the block's offset in the RAM address space.
pub(crate) fn check_compress_chunk(offset: u64, length: u64) -> Result<()> {
    if length <= CHUNK_SIZE && offset % CHUNK_SIZE + length <= CHUNK_SIZE {
        Ok(())
    } else {
        Err(protocol(format!("COMPRESS range {offset:#x}+{length:#x} of its block is not inside one 1 MiB chunk")))
    }
}

/// The local block of each block the source described (rdmamig extension),
/// by name, checking that both sides have the same blocks and that no block
/// is named twice (their lengths: `check_lengths`).
pub(crate) fn match_blocks(ram: &RamBlocks, specs: &[BlockSpec]) -> Result<Vec<usize>> {
    let found: Vec<Option<usize>> = specs.iter().map(|s| ram.find(&s.name)).collect();
    let missing: Vec<&str> =
        specs.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(s, _)| s.name.as_str()).collect();
    if !missing.is_empty() || specs.len() != ram.len() {
        return Err(Error::new(
            ErrorKind::BlockMismatch,
            format!("the source has {} blocks, this side {}; not found here: {missing:?}", specs.len(), ram.len()),
        ));
    }
    let order: Vec<usize> = found.into_iter().flatten().collect();
    if let Some((_, &dup)) = order.iter().enumerate().find(|(i, b)| order[..*i].contains(b)) {
        return Err(protocol(format!("the source named block '{}' twice", ram.blocks()[dup].name)));
    }
    Ok(order)
}

/// Checks that each block the source described has the same length here
/// (`order`: the local blocks `match_blocks` found).
pub(crate) fn check_lengths(ram: &RamBlocks, specs: &[BlockSpec], order: &[usize]) -> Result<()> {
    let differ: Vec<String> = specs
        .iter()
        .zip(order)
        .map(|(s, &local)| (s, &ram.blocks()[local]))
        .filter(|(s, b)| s.length != b.length)
        .map(|(s, b)| format!("block '{}' has length {:#x} on the source and {:#x} here", b.name, s.length, b.length))
        .collect();
    if !differ.is_empty() {
        return Err(Error::new(ErrorKind::BlockMismatch, differ.join("; ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::host::guest::testing::Mapping;

    const MIB: u64 = CHUNK_SIZE;

    /// Blocks "a" (3.5 MiB at RAM offset 16 MiB) and "b" (1 MiB at 0):
    /// address space only, never touched, kept for the test process.
    fn ram() -> RamBlocks {
        let (a, b) = (Mapping::anonymous(7 * MIB / 2), Mapping::anonymous(MIB));
        let mut r = RamBlocks::new();
        r.add_range("a", a.range(), 16 * MIB).unwrap();
        r.add_range("b", b.range(), 0).unwrap();
        std::mem::forget((a, b));
        r
    }

    fn kind<T: std::fmt::Debug>(r: Result<T>) -> ErrorKind {
        r.unwrap_err().kind
    }

    #[test]
    fn local_block_follows_the_source_order() {
        let ram = ram();
        assert_eq!(local_block(&[1, 0], &ram, 0).unwrap().0, 1);
        assert_eq!(local_block(&[1, 0], &ram, 1).unwrap().1.name, "a");
        assert_eq!(kind(local_block(&[1, 0], &ram, 2)), ErrorKind::Protocol);
        assert_eq!(kind(local_block(&[1, 0], &ram, u32::MAX)), ErrorKind::Protocol);
        assert_eq!(kind(local_block(&[], &ram, 0)), ErrorKind::Protocol);
    }

    #[test]
    fn block_offset_every_branch() {
        let ram = ram();
        let a = &ram.blocks()[0];
        assert_eq!(block_offset(a, 16 * MIB, 1).unwrap(), 0);
        assert_eq!(block_offset(a, 16 * MIB, 7 * MIB / 2).unwrap(), 0, "the whole block");
        assert_eq!(block_offset(a, 16 * MIB + 7 * MIB / 2 - 1, 1).unwrap(), 7 * MIB / 2 - 1, "the last byte");
        assert_eq!(block_offset(a, 16 * MIB + 7 * MIB / 2, 0).unwrap(), 7 * MIB / 2, "empty range at the end");
        assert_eq!(kind(block_offset(a, 16 * MIB - 1, 1)), ErrorKind::Protocol, "below the block");
        assert_eq!(kind(block_offset(a, 0, 1)), ErrorKind::Protocol, "another block's address");
        assert_eq!(kind(block_offset(a, 16 * MIB + 7 * MIB / 2, 1)), ErrorKind::Protocol, "past the end");
        assert_eq!(kind(block_offset(a, 16 * MIB, 7 * MIB / 2 + 1)), ErrorKind::Protocol, "one byte too long");
        assert_eq!(kind(block_offset(a, 16 * MIB + 1, u64::MAX)), ErrorKind::Protocol, "offset + len overflows");
        assert_eq!(kind(block_offset(a, u64::MAX, 1)), ErrorKind::Protocol, "address at the top");
    }

    #[test]
    fn register_span_every_branch() {
        let ram = ram();
        let a = &ram.blocks()[0];
        let req = |key, chunks| RegisterRequest { key, block_index: 0, chunks };
        assert_eq!(register_span(a, &req(16 * MIB, 0)).unwrap(), (0, 0));
        assert_eq!(register_span(a, &req(16 * MIB + MIB + 5, 0)).unwrap(), (1, 1), "any address in the chunk");
        assert_eq!(register_span(a, &req(16 * MIB, 3)).unwrap(), (0, 3), "the partial last chunk");
        assert_eq!(register_span(a, &req(19 * MIB, 0)).unwrap(), (3, 3));
        assert_eq!(kind(register_span(a, &req(16 * MIB, 4))), ErrorKind::Protocol, "one chunk too many");
        assert_eq!(kind(register_span(a, &req(19 * MIB, 1))), ErrorKind::Protocol);
        assert_eq!(kind(register_span(a, &req(16 * MIB, u64::MAX))), ErrorKind::Protocol, "first + chunks overflows");
        assert_eq!(kind(register_span(a, &req(15 * MIB, 0))), ErrorKind::Protocol, "address below the block");
        assert_eq!(kind(register_span(a, &req(20 * MIB, 0))), ErrorKind::Protocol, "address past the block");
    }

    #[test]
    fn unregister_chunk_every_branch() {
        let ram = ram();
        let a = &ram.blocks()[0];
        let req = |key| RegisterRequest { key, block_index: 0, chunks: 0 };
        assert_eq!(unregister_chunk(a, &req(0)).unwrap(), 0);
        assert_eq!(unregister_chunk(a, &req(3)).unwrap(), 3, "the partial last chunk");
        assert_eq!(kind(unregister_chunk(a, &req(4))), ErrorKind::Protocol);
        assert_eq!(kind(unregister_chunk(a, &req(u64::MAX))), ErrorKind::Protocol);
    }

    #[test]
    fn compress_limits() {
        let z = |offset, length| Compress { value: 0, block_index: 0, offset, length };
        // Toward QEMU-compatible peers: one range inside one chunk of its block.
        assert!(check_compress(&[z(16 * MIB, MIB)], false).is_ok());
        assert_eq!(kind(check_compress(&[z(0, 4096), z(4096, 4096)], false)), ErrorKind::Protocol, "two ranges");
        assert_eq!(kind(check_compress(&[], false)), ErrorKind::Protocol);
        assert!(check_compress_chunk(16 * MIB, MIB).is_ok());
        assert!(check_compress_chunk(16 * MIB + 4096, MIB - 4096).is_ok());
        assert_eq!(kind(check_compress_chunk(16 * MIB + 4096, MIB)), ErrorKind::Protocol, "crosses a chunk");
        assert_eq!(kind(check_compress_chunk(16 * MIB, MIB + 1)), ErrorKind::Protocol);
        assert_eq!(kind(check_compress_chunk(16 * MIB, u64::MAX)), ErrorKind::Protocol);
        // Between rdmamig peers: many ranges, bounded bytes.
        let many: Vec<Compress> = (0..4096).map(|i| z(i * 65536, 65536)).collect();
        assert!(check_compress(&many, true).is_ok(), "exactly the limit");
        assert!(check_compress(&[z(0, MAX_COMPRESS_BYTES)], true).is_ok());
        assert_eq!(kind(check_compress(&[z(0, MAX_COMPRESS_BYTES + 1)], true)), ErrorKind::Protocol);
        assert_eq!(kind(check_compress(&[z(0, MAX_COMPRESS_BYTES), z(0, 1)], true)), ErrorKind::Protocol);
        assert_eq!(kind(check_compress(&[z(0, u64::MAX), z(0, 2)], true)), ErrorKind::Protocol, "sum overflows");
    }

    #[test]
    fn match_blocks_and_check_lengths_every_branch() {
        let ram = ram();
        let spec = |name: &str, len| BlockSpec::new(name, len).unwrap();
        assert_eq!(match_blocks(&ram, &[spec("a", 7 * MIB / 2), spec("b", MIB)]).unwrap(), vec![0, 1]);
        assert_eq!(match_blocks(&ram, &[spec("b", MIB), spec("a", 7 * MIB / 2)]).unwrap(), vec![1, 0], "source order");
        let e = match_blocks(&ram, &[spec("b", MIB), spec("c", MIB)]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BlockMismatch);
        assert!(e.message.contains("\"c\""), "{}", e.message);
        assert_eq!(kind(match_blocks(&ram, &[spec("a", 7 * MIB / 2)])), ErrorKind::BlockMismatch, "one block short");
        let three = [spec("a", 7 * MIB / 2), spec("b", MIB), spec("a", 7 * MIB / 2)];
        assert_eq!(kind(match_blocks(&ram, &three)), ErrorKind::BlockMismatch, "one block too many");
        assert_eq!(
            kind(match_blocks(&ram, &[spec("a", 7 * MIB / 2), spec("a", 7 * MIB / 2)])),
            ErrorKind::Protocol,
            "named twice"
        );
        let longer_b = [spec("a", 7 * MIB / 2), spec("b", 2 * MIB)];
        let order = match_blocks(&ram, &longer_b).unwrap();
        let e = check_lengths(&ram, &longer_b, &order).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BlockMismatch);
        assert!(e.message.contains("block 'b' has length 0x200000 on the source and 0x100000 here"), "{}", e.message);
        assert_eq!(kind(match_blocks(&ram, &[])), ErrorKind::BlockMismatch);
        let same = [spec("b", MIB), spec("a", 7 * MIB / 2)];
        assert!(check_lengths(&ram, &same, &[1, 0]).is_ok());
    }
}
