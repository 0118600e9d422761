//! postcopy_table on arbitrary bytes: the block's entry from the first 40
//! bytes (its length cut to at most 16 MiB, its regions to 64, its stale
//! count set to the bits its bitmap holds, so that tables get accepted),
//! the table from the rest. An accepted table must satisfy the documented
//! rules, checked here in one pass.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmamig::wire::*;

fuzz_target!(|data: &[u8]| {
    let Some((entry, table)) = data.split_at_checked(PostcopyBlock::SIZE) else { return };
    let Ok(mut block) = PostcopyBlock::decode(entry) else { return };
    block.length %= 16 << 20;
    block.regions %= 64;
    let words = postcopy_bitmap_words(block.length) as usize;
    if let Some(map) = table.get(..words * 8) {
        block.stale_pages = map.iter().map(|b| b.count_ones() as u64).sum();
    }
    let Ok((stale, regions)) = postcopy_table(&block, table) else { return };
    let pages = block.length.div_ceil(POSTCOPY_PAGE_SIZE);
    assert_eq!(stale.len(), words);
    assert_eq!(regions.len(), block.regions as usize);
    assert_eq!(stale.iter().map(|w| w.count_ones() as u64).sum::<u64>(), block.stale_pages);
    let mut end = 0;
    for r in &regions {
        assert!(r.length > 0 && r.offset % POSTCOPY_PAGE_SIZE == 0 && r.length % POSTCOPY_PAGE_SIZE == 0);
        assert!(r.offset >= end && r.offset + r.length <= block.length);
        assert!(r.remote_addr.checked_add(r.length).is_some());
        end = r.offset + r.length;
    }
    // Every stale page inside a region (both in order: one pass), none past the block.
    let mut next = regions.iter().peekable();
    for p in 0..(words as u64 * 64) {
        if stale[(p / 64) as usize] >> (p % 64) & 1 == 0 {
            continue;
        }
        assert!(p < pages, "stale page {p} past the block's {pages}");
        let at = p * POSTCOPY_PAGE_SIZE;
        while next.peek().is_some_and(|r| r.offset + r.length <= at) {
            next.next();
        }
        assert!(next.peek().is_some_and(|r| r.offset <= at), "stale page {p} outside every region");
    }
});
