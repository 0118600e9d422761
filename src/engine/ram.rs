//! The RAM-block registry and 1 MiB chunk maths.
//!
//! A block is a range of the hypervisor's guest memory: a name (QEMU's RAMBlock
//! idstr), the host virtual address where it is mapped, its offset in the
//! hypervisor's RAM address space (QEMU's ram_addr_t) and its length. Chunks are
//! counted from each block's start, as QEMU does.

use crate::wire::{BlockSpec, CHUNK_SHIFT, CHUNK_SIZE};
use crate::{Error, ErrorKind, Result};

/// One guest RAM block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamBlock {
    pub name: String,
    /// Host virtual address of the block's first byte.
    pub host: usize,
    /// Offset of the block in the hypervisor's RAM address space.
    pub offset: u64,
    pub length: u64,
}

impl RamBlock {
    /// Number of 1 MiB chunks covering the block (the last may be partial).
    pub fn chunk_count(&self) -> usize {
        chunk_count(self.length)
    }

    /// Byte range `[start, end)` of chunk `chunk`, relative to the block start,
    /// clamped at the block end.
    pub fn chunk_range(&self, chunk: usize) -> (u64, u64) {
        let start = (chunk as u64) << CHUNK_SHIFT;
        (start, (start + CHUNK_SIZE).min(self.length))
    }

    /// Checks that `[offset, offset + len)` (relative to the block start) lies in the block.
    pub fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.length => Ok(()),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("range {offset:#x}+{len:#x} lies outside block '{}' of length {:#x}", self.name, self.length),
            )),
        }
    }

    /// Host pointer to `offset` bytes into the block. The caller checked the range.
    pub fn host_ptr(&self, offset: u64) -> *mut u8 {
        (self.host + offset as usize) as *mut u8
    }
}

/// Number of 1 MiB chunks needed to cover `length` bytes.
pub fn chunk_count(length: u64) -> usize {
    length.div_ceil(CHUNK_SIZE) as usize
}

/// Chunk index of byte `offset` (relative to a block start).
pub fn chunk_of(offset: u64) -> usize {
    (offset >> CHUNK_SHIFT) as usize
}

/// The hypervisor's guest RAM, as a list of blocks in the order it added them.
///
/// On the destination of a QEMU source that order must be the source's block
/// order (QEMU sends no names on the RDMA control channel).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RamBlocks {
    blocks: Vec<RamBlock>,
}

impl RamBlocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a block and returns its index.
    ///
    /// # Safety
    /// `host..host + length` must stay mapped, readable and writable for as
    /// long as any connection using this registry exists.
    pub unsafe fn add(&mut self, name: &str, host: *mut u8, offset: u64, length: u64) -> Result<u32> {
        let invalid = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
        // The name must fit the rdmamig extension's block entry.
        if let Err(e) = BlockSpec::new(name, length) {
            return invalid(format!("block name {name:?}: {e}"));
        }
        if host.is_null() || length == 0 {
            return invalid(format!("block '{name}' needs a host address and a non-zero length"));
        }
        if (host as usize).checked_add(length as usize).is_none() || offset.checked_add(length).is_none() {
            return invalid(format!("block '{name}' wraps around the address space"));
        }
        if self.blocks.iter().any(|b| b.name == name) {
            return invalid(format!("block '{name}' was added twice"));
        }
        if self.blocks.len() >= u32::MAX as usize {
            return invalid("too many blocks".into());
        }
        self.blocks.push(RamBlock { name: name.to_owned(), host: host as usize, offset, length });
        Ok(self.blocks.len() as u32 - 1)
    }

    pub fn blocks(&self) -> &[RamBlock] {
        &self.blocks
    }

    /// Bytes of guest RAM in all blocks.
    pub fn total_bytes(&self) -> u64 {
        self.blocks.iter().map(|b| b.length).sum()
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Block `index`, or an InvalidArgument error naming it.
    pub fn get(&self, index: u32) -> Result<&RamBlock> {
        self.blocks.get(index as usize).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("no RAM block with index {index} ({} blocks)", self.blocks.len()),
            )
        })
    }

    pub fn find(&self, name: &str) -> Option<usize> {
        self.blocks.iter().position(|b| b.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_maths() {
        assert_eq!(chunk_count(1), 1);
        assert_eq!(chunk_count(CHUNK_SIZE), 1);
        assert_eq!(chunk_count(CHUNK_SIZE + 1), 2);
        assert_eq!(chunk_of(CHUNK_SIZE - 1), 0);
        assert_eq!(chunk_of(CHUNK_SIZE), 1);
        let b = RamBlock { name: "pc.ram".into(), host: 0x1000, offset: 0, length: 3 * CHUNK_SIZE / 2 };
        assert_eq!(b.chunk_count(), 2);
        assert_eq!(b.chunk_range(0), (0, CHUNK_SIZE));
        assert_eq!(b.chunk_range(1), (CHUNK_SIZE, 3 * CHUNK_SIZE / 2));
        assert!(b.check_range(CHUNK_SIZE, CHUNK_SIZE / 2).is_ok());
        assert!(b.check_range(CHUNK_SIZE, CHUNK_SIZE / 2 + 1).is_err());
        assert!(b.check_range(u64::MAX, 2).is_err());
    }

    #[test]
    fn registry_rejects_bad_blocks() {
        let mut mem = vec![0u8; 4096];
        let mut r = RamBlocks::new();
        unsafe {
            assert_eq!(r.add("a", mem.as_mut_ptr(), 0, 4096).unwrap(), 0);
            assert!(r.add("a", mem.as_mut_ptr(), 0, 4096).is_err());
            assert!(r.add("", mem.as_mut_ptr(), 0, 4096).is_err());
            assert!(r.add("b", std::ptr::null_mut(), 0, 4096).is_err());
            assert!(r.add("c", mem.as_mut_ptr(), 0, 0).is_err());
            assert!(r.add(&"x".repeat(BlockSpec::MAX_NAME_LEN + 1), mem.as_mut_ptr(), 0, 1).is_err());
            assert!(r.add("a\0b", mem.as_mut_ptr(), 0, 1).is_err());
            assert_eq!(r.add(&"x".repeat(BlockSpec::MAX_NAME_LEN), mem.as_mut_ptr(), 0, 1).unwrap(), 1);
        }
        assert_eq!(r.find("a"), Some(0));
        assert!(r.get(2).is_err());
    }
}
