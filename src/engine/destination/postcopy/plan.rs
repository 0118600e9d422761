//! The switch-over's plan on the destination: the blocks of a POSTCOPY
//! message checked against this side's registry (`plan`, on the service
//! thread as the message arrives), then each block's table (stale bitmap and
//! the regions to read from) read from the source and checked
//! (`read_tables`, by the post-copy thread before its userfaultfd opens).

use std::collections::HashSet;

use crate::engine::link::Link;
use crate::engine::pin::{PinnedBuffer, Pins};
use crate::engine::ram::RamBlocks;
use crate::engine::validate;
use crate::host::GuestRange;
use crate::wire::{
    postcopy_table, postcopy_table_len, Message, PostcopyBlock, PostcopyRegion, POSTCOPY_MAX_REGIONS,
    POSTCOPY_PAGE_SIZE,
};
use crate::{Error, ErrorKind, Result};

const PAGE: u64 = POSTCOPY_PAGE_SIZE;
/// The largest read of a block's table (256 KiB: the bitmap of 8 GiB of guest RAM).
const TABLE_READ: u64 = 256 << 10;

/// One block of a POSTCOPY message, checked against this side's registry.
#[derive(Debug)]
pub struct PlanBlock {
    /// The block's index in this side's registry.
    pub index: usize,
    pub host: usize,
    /// Where the block lies in the address space of the userfaultfd's
    /// process: `host`, unless the hypervisor's userfaultfd is another
    /// process's (`Destination::postcopy_userfaultfd`).
    pub uffd_addr: u64,
    pub length: u64,
    /// The block's memory here.
    pub(crate) guest: GuestRange,
    /// The source's entry: where to read the block's table.
    pub source: PostcopyBlock,
    /// Stale pages not installed yet (bit per page), once read (`read_tables`).
    pub stale: Vec<u64>,
    /// Where the stale pages can be read, once read (`read_tables`).
    pub regions: Vec<PostcopyRegion>,
}

impl PlanBlock {
    /// Where stale page `page` is read on the source (in a region, as
    /// `read_tables` checked): address, key, and the pages from it to its
    /// region's end.
    pub fn remote(&self, page: u64) -> (u64, u32, u64) {
        let at = page * PAGE;
        let r = &self.regions[self.regions.partition_point(|r| r.offset + r.length <= at)];
        (r.remote_addr + (at - r.offset), r.rkey, (r.offset + r.length - at) / PAGE)
    }

    /// Where the block lies in this process: host address and length (for the fuzz target).
    #[cfg_attr(not(feature = "fuzzing"), allow(dead_code))]
    pub fn span(&self) -> (usize, u64) {
        (self.host, self.length)
    }
}

fn protocol(why: String) -> Error {
    Error::new(ErrorKind::Protocol, format!("malformed POSTCOPY from the source: {why}"))
}

/// The blocks of a POSTCOPY message (already validated by `decode_message`),
/// mapped to this side's blocks through the source's block order.
pub(crate) fn plan(m: &Message, order: &[usize], ram: &RamBlocks) -> Result<Vec<PlanBlock>> {
    let mut seen = HashSet::new();
    let mut plan = Vec::new();
    let mut regions_total = 0u64;
    for b in m.entries::<PostcopyBlock>() {
        let b = b.map_err(|e| protocol(e.to_string()))?;
        let (local, block) = validate::local_block(order, ram, b.block_index)?;
        if !seen.insert(local) {
            return Err(protocol(format!("block {} listed twice", b.block_index)));
        }
        if b.length != block.length {
            return Err(protocol(format!(
                "block '{}' has {} bytes here, {} on the source",
                block.name, block.length, b.length
            )));
        }
        if block.length % PAGE != 0 || block.host as u64 % PAGE != 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("post-copy needs page-aligned blocks: '{}' is not", block.name),
            ));
        }
        // Bounds what this side allocates for the tables.
        regions_total += b.regions as u64;
        if regions_total > POSTCOPY_MAX_REGIONS as u64 || (b.stale_pages > 0) != (b.regions > 0) {
            return Err(protocol(format!(
                "block {} has {} regions for {} stale pages ({regions_total} so far, at most {POSTCOPY_MAX_REGIONS})",
                b.block_index, b.regions, b.stale_pages
            )));
        }
        if b.table_addr.checked_add(postcopy_table_len(&b)).is_none() {
            return Err(protocol(format!("the table of block {} wraps the address space", b.block_index)));
        }
        if b.stale_pages > b.length / PAGE {
            return Err(protocol(format!(
                "block {} declares {} stale pages of its {}",
                b.block_index,
                b.stale_pages,
                b.length / PAGE
            )));
        }
        if b.stale_pages > 0 {
            let (stale, regions) = (Vec::new(), Vec::new());
            let guest = block.range(0, block.length);
            plan.push(PlanBlock {
                index: local,
                host: block.host,
                uffd_addr: block.host as u64,
                length: block.length,
                guest,
                source: b,
                stale,
                regions,
            });
        }
    }
    Ok(plan)
}

/// Reads each block's table from the source (one read at a time, of at most
/// `TABLE_READ` bytes: there are few) into one buffer, then checks it.
pub(super) fn read_tables(link: &mut Link, pins: &Pins, blocks: &mut [PlanBlock]) -> Result<()> {
    let len = |b: &PlanBlock| postcopy_table_len(&b.source);
    let total = blocks.iter().map(len).sum::<u64>() as usize;
    let mut buf = PinnedBuffer::new(pins, total, "post-copy's tables")?;
    let mut at = 0;
    for b in blocks.iter() {
        for from in (0..len(b)).step_by(TABLE_READ as usize) {
            let n = (len(b) - from).min(TABLE_READ);
            let sge = buf.sge((at + from) as usize, n as usize);
            // Nothing else uses `buf` until the read completes; `plan`
            // checked that the source's range does not wrap.
            link.read(sge, b.source.table_addr + from, b.source.table_rkey)?;
        }
        at += len(b);
    }
    let mut at = 0;
    for b in blocks.iter_mut() {
        let bytes = &buf.bytes_mut()[at as usize..(at + len(b)) as usize];
        (b.stale, b.regions) = postcopy_table(&b.source, bytes).map_err(|e| protocol(e.to_string()))?;
        at += len(b);
    }
    Ok(())
}
