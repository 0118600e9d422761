//! The source's post-copy, on its transfer thread: expose the stale blocks
//! for remote read, set up the fault QP, send POSTCOPY, wait for POSTCOPY_DONE.

use super::StalePages;
use crate::engine::link::Link;
use crate::engine::logging;
use crate::engine::pin::Pins;
use crate::engine::ram::RamBlocks;
use crate::verbs::{Access, MemoryRegion};
use crate::wire::{
    postcopy_bitmap_words, CommandType, Entry, PostcopyBlock, PostcopySummary, MAX_PAYLOAD, POSTCOPY_PAGE_SIZE,
};
use crate::{Error, ErrorKind, Result};

/// Checks the caller's bitmaps against the registry (on the caller's thread):
/// one entry per block at most, each long enough, no bit past the block's
/// last page, and the whole message within one control message.
pub(crate) fn check(ram: &RamBlocks, stale: &[StalePages]) -> Result<()> {
    let bad = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
    let mut seen = vec![false; ram.len()];
    let mut bytes = 0u64;
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
        bytes += PostcopyBlock::SIZE as u64 + words * 8;
    }
    if bytes > MAX_PAYLOAD as u64 {
        return bad(format!(
            "the stale bitmaps take {bytes} bytes, more than one control message ({MAX_PAYLOAD}): \
             post-copy of this much RAM is not supported yet"
        ));
    }
    Ok(())
}

/// Registers each block with stale pages for remote read, sends POSTCOPY
/// and waits (while the destination stays alive) for POSTCOPY_DONE. The
/// registrations are released when this returns: the destination has every
/// page, or the connection is gone.
pub(crate) fn run(link: &mut Link, pins: &Pins, ram: &RamBlocks, stale: &[StalePages]) -> Result<PostcopySummary> {
    let stale: Vec<(&StalePages, u64)> = stale
        .iter()
        .map(|s| {
            let words = postcopy_bitmap_words(ram.get(s.block).map_or(0, |b| b.length)) as usize;
            (s, s.bitmap[..words].iter().map(|w| w.count_ones() as u64).sum())
        })
        .filter(|&(_, n)| n > 0)
        .collect();
    let mut mrs: Vec<MemoryRegion> = Vec::with_capacity(stale.len());
    let result = (|| {
        for (s, _) in &stale {
            let block = ram.get(s.block)?;
            if !pins.fits_after_release(block.length) {
                return Err(Error::new(
                    ErrorKind::PinBudget,
                    format!(
                        "post-copy needs block '{}' ({} bytes) registered for remote read: {}",
                        block.name,
                        block.length,
                        pins.over_budget(block.length).message
                    ),
                ));
            }
            pins.settle_for(block.length);
            // SAFETY: the registry's contract keeps the block mapped while the
            // connection exists; the MR is dropped (deregistered) before `run` returns.
            mrs.push(unsafe { pins.register(block.host_ptr(0), block.length, Access::REMOTE_READ)? });
        }
        let total: u64 = stale.iter().map(|&(_, n)| n).sum();
        link.open_fault_qp()?;
        logging::info(format_args!(
            "source: post-copy: {total} stale pages in {} blocks exposed for remote read",
            stale.len()
        ));
        let summary = link.request_by(
            None,
            CommandType::Postcopy,
            |w| {
                for ((s, n), mr) in stale.iter().zip(&mrs) {
                    let length = mr.len() as u64;
                    w.push(&PostcopyBlock {
                        block_index: s.block,
                        rkey: mr.rkey(),
                        remote_addr: mr.addr(),
                        length,
                        stale_pages: *n,
                    })?;
                }
                for ((s, _), mr) in stale.iter().zip(&mrs) {
                    for word in &s.bitmap[..postcopy_bitmap_words(mr.len() as u64) as usize] {
                        w.push_bytes(&word.to_be_bytes())?;
                    }
                }
                Ok(())
            },
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
    result
}
