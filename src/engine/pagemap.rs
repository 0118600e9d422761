//! What the kernel says of each page of this process (`/proc/self/pagemap`,
//! Documentation/admin-guide/mm/pagemap.rst; readable without privileges,
//! only the frame number is hidden): which pages were never populated
//! (`populated`) and which a pin would copy (`pin::sharing`).
//!
//! The file is opened once per thread that asks (the library's transfer and
//! service threads, once per chunk first touched) and closed when that
//! thread ends, with the connection: under TCG, opening it cost about three
//! times as much as reading a 1 MiB chunk's entries (rxe guest, 256 MiB
//! dense migration: 58 ms of the transfer thread's time in opens and reads,
//! 15 ms in reads alone).

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

/// The calling thread's open pagemap (None: it cannot be opened here) and
/// its read buffer.
struct Reader {
    file: Option<File>,
    buf: Vec<u8>,
}

thread_local! {
    static READER: RefCell<Reader> =
        RefCell::new(Reader { file: File::open("/proc/self/pagemap").ok(), buf: Vec::new() });
}

/// Calls `f(page, entry)` for every virtual page number in `first..last`, in
/// order; `None` if pagemap cannot be read (`f` may then have seen some).
pub fn for_each_entry(first: u64, last: u64, mut f: impl FnMut(u64, u64)) -> Option<()> {
    READER.with_borrow_mut(|Reader { file, buf }| {
        let file = file.as_ref()?;
        let mut from = first;
        while from < last {
            let n = (last - from).min(BATCH);
            buf.resize((n * 8) as usize, 0);
            file.read_exact_at(buf, from * 8).ok()?;
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
