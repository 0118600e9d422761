//! The RAM-block registry and 1 MiB chunk maths.
//!
//! A block is a range of the hypervisor's guest memory: a name (QEMU's RAMBlock
//! idstr), the host virtual address where it is mapped, its offset in the
//! hypervisor's RAM address space (QEMU's ram_addr_t) and its length. Chunks are
//! counted from each block's start, as QEMU does.

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use crate::host::populated::Memory;
pub use crate::host::populated::Run;
use crate::host::GuestRange;
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
    /// What is known of its memory (its backing file); shared by the registry's copies.
    memory: Arc<Memory>,
    /// The block's memory, as the hypervisor promised it to `RamBlocks::add`.
    guest: GuestRange,
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

    /// The block's `len` bytes at `offset` (the caller checked the range).
    pub(crate) fn range(&self, offset: u64, len: u64) -> GuestRange {
        self.guest.sub(offset, len)
    }

    /// The never-populated runs (which read as zero) and the others of
    /// `[offset, offset + len)` (relative to the block start, inside it), in
    /// order, covering the range, found without touching its memory; `None`
    /// when the block's memory cannot tell (neither a backing file given nor
    /// private anonymous memory): read it. See `host::populated`.
    pub fn populated_runs(&self, offset: u64, len: u64) -> Option<Vec<Run>> {
        self.memory.runs(self.host, self.length, offset, len)
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
        // SAFETY: this function's contract is the range's.
        self.add_range(name, unsafe { GuestRange::new(host, length) }, offset)
    }

    /// Adds a block over `guest` (checked as `add` says) and returns its index.
    pub(crate) fn add_range(&mut self, name: &str, guest: GuestRange, offset: u64) -> Result<u32> {
        let (host, length) = (guest.addr() as usize, guest.len());
        let invalid = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
        // The name must fit the rdmamig extension's block entry.
        if let Err(e) = BlockSpec::new(name, length) {
            return invalid(format!("block name {name:?}: {e}"));
        }
        if host == 0 || length == 0 {
            return invalid(format!("block '{name}' needs a host address and a non-zero length"));
        }
        if host.checked_add(length as usize).is_none() || offset.checked_add(length).is_none() {
            return invalid(format!("block '{name}' wraps around the address space"));
        }
        if self.blocks.iter().any(|b| b.name == name) {
            return invalid(format!("block '{name}' was added twice"));
        }
        if self.blocks.len() >= u32::MAX as usize {
            return invalid("too many blocks".into());
        }
        self.blocks.push(RamBlock { name: name.to_owned(), host, offset, length, memory: Arc::default(), guest });
        Ok(self.blocks.len() as u32 - 1)
    }

    /// Gives block `index` its backing file: `fd`'s file holds the block's
    /// memory from `file_offset` (the file offset of the block's first byte),
    /// mapped shared (MAP_SHARED: memfd, /dev/shm, hugetlbfs), and must stay
    /// that file for as long as any connection using this registry exists.
    /// The file's holes (`SEEK_HOLE`) are then sent as zero ranges without
    /// being read, and a destination leaves them alone when asked to zero them.
    ///
    /// The registry keeps its own descriptor of the file (reopened read-only
    /// through /proc/self/fd, or else duplicated with `F_DUPFD_CLOEXEC`, which
    /// shares the file offset: then the hypervisor must not rely on it),
    /// closed when the registry and the connections made with it are gone;
    /// `fd` stays the caller's. Refused when the file is not regular, is
    /// shorter than the block, or (where /proc/self/maps is readable) is not
    /// what is mapped shared at the block's address with that offset.
    pub fn set_backing(&mut self, index: u32, fd: BorrowedFd<'_>, file_offset: u64) -> Result<()> {
        let block = self.get(index)?;
        let memory = Memory::with_backing(fd, file_offset, block.host, block.length)
            .map_err(|e| Error::new(e.kind, format!("backing file of block '{}': {}", block.name, e.message)))?;
        self.blocks[index as usize].memory = memory;
        Ok(())
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
        let b = RamBlock {
            name: "pc.ram".into(),
            host: 0x1000,
            offset: 0,
            length: 3 * CHUNK_SIZE / 2,
            memory: Arc::default(),
            guest: crate::host::guest::leaked(3 * CHUNK_SIZE as usize / 2),
        };
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
        // SAFETY: `mem` outlives the registry.
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
