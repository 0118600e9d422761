//! What a hypervisor thread queues for the transfer thread (`Front`), in
//! order.

use std::sync::Arc;

use parking_lot::Mutex;

use super::save_range::SaveRange;
use crate::bitmap;
use crate::engine::pin::Hint;
use crate::engine::postcopy::{PostcopySummary, StalePages};
use crate::engine::sync::Done;

pub(super) enum Command {
    Save {
        block: u32,
        offset: u64,
        len: u64,
    },
    /// Up to `front::GROUP` ranges of one batch call, in order; the buffer
    /// goes back to `Front::recycle_ranges`.
    Group(Vec<SaveRange>),
    /// Dirty pages: bit `i` of `words` (`i < pages`) stands for `page_size`
    /// bytes at `offset + i * page_size` of `block`; the buffer goes back to
    /// `Front::recycle_words`.
    Bitmap {
        block: u32,
        offset: u64,
        page_size: u64,
        pages: u64,
        words: Vec<u64>,
    },
    Stream(Vec<u8>),
    /// The hypervisor's hint for a range: orders which chunks are unpinned first.
    Hint {
        block: u32,
        offset: u64,
        len: u64,
        hint: Hint,
    },
    /// Everything queued before has been sent.
    Sync(Arc<Done>),
    /// Close the window: all writes complete, then REGISTER_FINISHED.
    EndIteration(Arc<Done>),
    /// The completion handshake (rdmamig peers): END, then wait for END_ACK.
    End(Arc<Done>),
    /// Post-copy (rdmamig peers): expose the stale pages for remote read and
    /// wait until the destination has them; the summary goes into the slot.
    Postcopy(Vec<StalePages>, Arc<Mutex<Option<PostcopySummary>>>, Arc<Done>),
}

impl Command {
    /// The bytes of RAM this command saves (0 for the others).
    pub fn saved_bytes(&self) -> u64 {
        match self {
            Command::Save { len, .. } => *len,
            Command::Group(group) => group.iter().map(|r| r.len).sum(),
            // Bits from `pages` on are not pages.
            Command::Bitmap { page_size, pages, words, .. } => bitmap::count_first(words, *pages) * page_size,
            _ => 0,
        }
    }

    pub fn done(&self) -> Option<&Arc<Done>> {
        match self {
            Command::Sync(d) | Command::EndIteration(d) | Command::End(d) | Command::Postcopy(_, _, d) => Some(d),
            _ => None,
        }
    }
}
