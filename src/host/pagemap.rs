//! What the kernel says of each page of this process (`/proc/self/pagemap`,
//! Documentation/admin-guide/mm/pagemap.rst; readable without privileges,
//! only the frame number is hidden): which pages were never populated
//! (`populated`) and which a pin would copy (`pin::sharing`).
//!
//! The library's own threads (the source's transfer thread, the
//! destination's service thread: they ask once per chunk first touched)
//! keep the file open (`keep_open`) until they end, with their connection;
//! any other thread opens it for each query, so that the library holds no
//! descriptor on a hypervisor's thread. An open costs more than the read it
//! serves (under TCG most of a query; figures in docs/benchmarks.md).

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;

pub const PM_PRESENT: u64 = 1 << 63;
pub const PM_SWAP: u64 = 1 << 62;
pub const PM_FILE_OR_SHARED_ANON: u64 = 1 << 61;
pub const PM_EXCLUSIVE: u64 = 1 << 56;

/// Entries read at a time (64 KiB of entries: 32 MiB of 4 KiB pages).
const BATCH: u64 = 8192;

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64
}

fn open() -> Option<File> {
    File::open("/proc/self/pagemap").ok()
}

thread_local! {
    /// The pagemap a library thread keeps open (`keep_open`).
    static KEPT: RefCell<Option<File>> = const { RefCell::new(None) };
}

/// Keeps the pagemap open on the calling thread, one of the library's own,
/// until it ends (if it cannot be opened now, each query tries again).
pub fn keep_open() {
    KEPT.set(open());
}

/// Calls `f(page, entry)` for every virtual page number in `first..last`, in
/// order; `None` if pagemap cannot be read (`f` may then have seen some).
pub fn for_each_entry(first: u64, last: u64, mut f: impl FnMut(u64, u64)) -> Option<()> {
    KEPT.with_borrow(|kept| {
        let opened;
        let file = match kept {
            Some(file) => file,
            None => {
                opened = open()?;
                &opened
            }
        };
        let mut buf = Vec::new();
        let mut from = first;
        while from < last {
            let n = (last - from).min(BATCH);
            buf.resize((n * 8) as usize, 0);
            file.read_exact_at(&mut buf, from * 8).ok()?;
            for (i, e) in buf.chunks_exact(8).enumerate() {
                f(from + i as u64, u64::from_ne_bytes(e.try_into().expect("8 bytes")));
            }
            from += n;
        }
        Some(())
    })
}

/// The entries of the `pages` pages from `ptr`, with only the bits in `mask`
/// (for tests: frame numbers may be hidden or change).
#[cfg(test)]
pub fn entries(ptr: *const u8, pages: u64, mask: u64) -> Vec<u64> {
    let first = ptr as u64 / page_size();
    let mut out = Vec::new();
    for_each_entry(first, first + pages, |_, e| out.push(e & mask)).expect("pagemap readable");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_a_range_spanning_batches() {
        let page = page_size();
        let pages = BATCH + 3;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        unsafe {
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                (pages * page) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert_ne!(ptr as *mut libc::c_void, libc::MAP_FAILED);
            libc::madvise(ptr.cast(), (pages * page) as usize, libc::MADV_NOHUGEPAGE);
            for p in [0, BATCH - 1, BATCH + 2] {
                ptr.add((p * page) as usize).write_volatile(1);
            }
            let present = entries(ptr, pages, PM_PRESENT);
            assert_eq!(present.len() as u64, pages);
            let touched: Vec<u64> = (0..pages).filter(|&p| present[p as usize] != 0).collect();
            assert_eq!(touched, [0, BATCH - 1, BATCH + 2]);
            let mut seen = Vec::new();
            let first = ptr as u64 / page;
            for_each_entry(first + 5, first + 5, |p, _| seen.push(p)).unwrap();
            assert!(seen.is_empty(), "an empty range");
            libc::munmap(ptr.cast(), (pages * page) as usize);
        }
    }
}
