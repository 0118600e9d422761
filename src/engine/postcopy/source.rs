//! The source's post-copy, on its transfer thread: expose the stale blocks
//! and their bitmaps for remote read, set up the fault QP, send POSTCOPY,
//! wait for POSTCOPY_DONE.

use super::StalePages;
use crate::engine::link::Link;
use crate::engine::logging;
use crate::engine::page_buffer::PageBuffer;
use crate::engine::pin::Pins;
use crate::engine::ram::RamBlocks;
use crate::verbs::{Access, MemoryRegion};
use crate::wire::{postcopy_bitmap_words, CommandType, PostcopyBlock, PostcopySummary, MAX_REPEAT, POSTCOPY_PAGE_SIZE};
use crate::{Error, ErrorKind, Result};

/// Checks the caller's bitmaps against the registry (on the caller's thread):
/// one entry per block at most (and at most a message's entries), each long
/// enough, no bit past the block's last page.
pub(crate) fn check(ram: &RamBlocks, stale: &[StalePages]) -> Result<()> {
    let bad = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
    if stale.len() > MAX_REPEAT as usize {
        return bad(format!("{} blocks listed, more than one POSTCOPY message holds ({MAX_REPEAT})", stale.len()));
    }
    let mut seen = vec![false; ram.len()];
    for s in stale {
        let block = ram.get(s.block)?;
        if std::mem::replace(&mut seen[s.block as usize], true) {
            return bad(format!("block {} is listed twice", s.block));
        }
        let pages = block.length.div_ceil(POSTCOPY_PAGE_SIZE);
        let words = postcopy_bitmap_words(block.length);
        if (s.bitmap.len() as u64) < words {
            return bad(format!(
                "block '{}' has {pages} pages: a bitmap of {} words is short",
                block.name,
                s.bitmap.len()
            ));
        }
        let past = s.bitmap[words as usize..].iter().any(|&w| w != 0)
            || (pages % 64 != 0 && s.bitmap[words as usize - 1] >> (pages % 64) != 0);
        if past {
            return bad(format!("the bitmap of block '{}' has bits past its {pages} pages", block.name));
        }
    }
    Ok(())
}

/// Registers each block with stale pages and their bitmaps for remote
/// read, sends POSTCOPY and waits (while the destination stays alive) for
/// POSTCOPY_DONE. The registrations are released when this returns: the
/// destination has every page, or the connection is gone.
pub(crate) fn run(link: &mut Link, pins: &Pins, ram: &RamBlocks, stale: &[StalePages]) -> Result<PostcopySummary> {
    // (bitmap, block index, set bits) of each block with stale pages.
    let stale: Vec<(&[u64], u32, u64)> = stale
        .iter()
        .filter_map(|s| {
            let words = postcopy_bitmap_words(ram.get(s.block).map_or(0, |b| b.length));
            let bitmap = &s.bitmap[..words as usize];
            let n: u64 = bitmap.iter().map(|w| w.count_ones() as u64).sum();
            (n > 0).then_some((bitmap, s.block, n))
        })
        .collect();
    // What the destination reads first: the bitmaps, big-endian, one after the other.
    let mut bitmaps = PageBuffer::new(stale.iter().map(|(b, ..)| b.len() * 8).sum());
    for (word, out) in stale.iter().flat_map(|(b, ..)| b.iter()).zip(bitmaps.bytes_mut().chunks_exact_mut(8)) {
        out.copy_from_slice(&word.to_be_bytes());
    }
    let mut mrs: Vec<MemoryRegion> = Vec::with_capacity(stale.len() + 1);
    let result = (|| {
        // SAFETY: `bitmaps` outlives its registration (settled below).
        let bitmaps_mr = unsafe { expose(pins, "the stale bitmaps", bitmaps.ptr(), bitmaps.len() as u64)? };
        let bitmaps_at = (bitmaps_mr.addr(), bitmaps_mr.rkey());
        mrs.push(bitmaps_mr);
        let mut entries = Vec::with_capacity(stale.len());
        let mut offset = 0;
        for &(bitmap, block_index, stale_pages) in &stale {
            let block = ram.get(block_index)?;
            // SAFETY: the registry's contract keeps the block mapped while the
            // connection exists; the MR is released before `run` returns.
            let mr = unsafe { expose(pins, &format!("block '{}'", block.name), block.host_ptr(0), block.length)? };
            entries.push(PostcopyBlock {
                block_index,
                rkey: mr.rkey(),
                remote_addr: mr.addr(),
                length: block.length,
                stale_pages,
                bitmap_addr: bitmaps_at.0 + offset,
                bitmap_rkey: bitmaps_at.1,
            });
            offset += bitmap.len() as u64 * 8;
            mrs.push(mr);
        }
        let total: u64 = entries.iter().map(|e| e.stale_pages).sum();
        link.open_fault_qp()?;
        logging::info(format_args!(
            "source: post-copy: {total} stale pages in {} blocks exposed for remote read",
            entries.len()
        ));
        let summary = link.request_by(
            None,
            CommandType::Postcopy,
            |w| entries.iter().try_for_each(|e| w.push(e)),
            CommandType::PostcopyDone,
            |m| {
                let mut e = m.entries::<PostcopySummary>();
                e.next().expect("decode_message checked one entry").map_err(crate::engine::link::protocol_error)
            },
        )?;
        if summary.pages != total {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("the destination reports {} pages installed of the {total} stale", summary.pages),
            ));
        }
        logging::info(format_args!(
            "source: post-copy done: {} pages, {} faults, {} bytes read",
            summary.pages, summary.faults, summary.bytes
        ));
        Ok(summary)
    })();
    link.close_fault_qp();
    for mr in mrs {
        pins.release(mr);
    }
    // The bitmaps' registration is gone before their memory is.
    pins.settle();
    drop(bitmaps);
    result
}

/// Registers `len` bytes at `addr` (`what`) for remote read, within the pin budget.
///
/// # Safety
/// The memory stays mapped until the registration is released.
unsafe fn expose(pins: &Pins, what: &str, addr: *mut u8, len: u64) -> Result<MemoryRegion> {
    if !pins.fits_after_release(len) {
        return Err(Error::new(
            ErrorKind::PinBudget,
            format!(
                "post-copy needs {what} ({len} bytes) registered for remote read: {}",
                pins.over_budget(len).message
            ),
        ));
    }
    pins.settle_for(len);
    // SAFETY: as this function's contract.
    unsafe { pins.register(addr, len, Access::REMOTE_READ) }
}
