//! What the source hands post-copy: the pages the destination must read.

/// The stale pages of one block, for [`Source::postcopy`](crate::engine::Source::postcopy):
/// bit `i % 64` of `bitmap[i / 64]` set means page `i` (4 KiB,
/// [`wire::POSTCOPY_PAGE_SIZE`](crate::wire::POSTCOPY_PAGE_SIZE)) of block
/// `block` must be read from the source. Blocks not listed have none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StalePages {
    pub block: u32,
    pub bitmap: Vec<u64>,
}
