//! Whether pinning a range would allocate or unshare memory. A long-term
//! pin (even read-only) makes the kernel give the pinning process a page of
//! its own for every page of the range: a never-touched page is allocated,
//! and the shared zero page or a page shared with another mapping (KSM, a
//! forked child) is copied (Linux >= 5.19; the Debian 6.1 kernels too). The
//! source therefore pins only ranges whose pages it already has to itself,
//! and sends the others through a registered staging buffer.

use crate::host::pagemap::{self, page_size, PM_EXCLUSIVE, PM_FILE_OR_SHARED_ANON, PM_PRESENT};
use crate::host::zero::is_zero;

/// Whether a page with this pagemap entry would be allocated or copied by a
/// pin: not present (never touched, or swapped out), or present but neither
/// mapped only here nor file-backed (the shared zero page, KSM, after fork).
/// File and shmem pages are pinned in place.
fn pin_copies(entry: u64) -> bool {
    entry & PM_PRESENT == 0 || entry & (PM_EXCLUSIVE | PM_FILE_OR_SHARED_ANON) == 0
}

/// Whether pinning `len` bytes at `ptr` would allocate or copy a page (see
/// `pin_copies`). Without a readable /proc/self/pagemap: whether a page of
/// the range is all zero (it may be untouched or the shared zero page).
///
/// # Safety
/// `ptr..ptr + len` is mapped and readable.
pub unsafe fn pin_would_copy(ptr: *const u8, len: u64) -> bool {
    let page = page_size();
    let first = ptr as u64 / page;
    let last = (ptr as u64 + len).div_ceil(page);
    let mut copies = false;
    if pagemap::for_each_entry(first, last, |_, entry| copies |= pin_copies(entry)).is_some() {
        return copies;
    }
    (first..last).any(|p| {
        let start = (p * page).max(ptr as u64);
        let end = ((p + 1) * page).min(ptr as u64 + len);
        // SAFETY: inside `ptr..ptr + len` (this function's contract).
        unsafe { is_zero(start as *const u8, (end - start) as usize) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_pages_a_pin_would_copy() {
        assert!(pin_copies(0), "never touched");
        assert!(pin_copies(1 << 62), "swapped out");
        assert!(pin_copies(PM_PRESENT), "the zero page, or shared anonymous");
        assert!(!pin_copies(PM_PRESENT | PM_EXCLUSIVE), "private, mapped once");
        assert!(!pin_copies(PM_PRESENT | PM_FILE_OR_SHARED_ANON), "file or shmem");
    }

    #[test]
    fn touched_pages_are_pinned_in_place_untouched_ones_are_not() {
        let page = page_size() as usize;
        let len = 8 * page;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        unsafe {
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert_ne!(ptr as *mut libc::c_void, libc::MAP_FAILED);
            libc::madvise(ptr.cast(), len, libc::MADV_NOHUGEPAGE);
            for p in 0..4 {
                ptr.add(p * page).write_volatile(1);
            }
            assert!(!pin_would_copy(ptr, 4 * page as u64));
            assert!(pin_would_copy(ptr, 5 * page as u64));
            // Read but never written: the shared zero page.
            assert!(ptr.add(6 * page).read_volatile() == 0);
            assert!(pin_would_copy(ptr.add(6 * page), page as u64));
            libc::munmap(ptr.cast(), len);
        }
    }
}
