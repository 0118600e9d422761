//! Which pages of a RAM block were never populated, found without touching
//! them: reading a never-written page of a shared mapping allocates it (and
//! one of private memory maps the zero page), so a migration that reads all
//! of RAM to find its zeros grows the source (and, zeroing, the destination)
//! to its full size. A never-populated page reads as zero, so it is sent as
//! a zero range unread, and a destination asked to zero it leaves it alone.
//!
//! How depends on the block's memory:
//! - a backing file given by the hypervisor (`RamBlocks::set_backing`: memfd,
//!   /dev/shm, hugetlbfs): its holes (`lseek` `SEEK_DATA`/`SEEK_HOLE`), which
//!   read as zero by definition;
//! - private anonymous memory: `/proc/self/pagemap`, where an entry neither
//!   present nor swapped was never populated (or was discarded) and reads as
//!   zero. Only there: a page of a file or shared mapping may sit in the page
//!   cache without being mapped here. Whether the block is such memory is read
//!   once from `/proc/self/maps`, at the first query (not when the block is
//!   added: nothing is paid for blocks never asked about, such as pin-all's),
//!   and kept for the block's life: the registry's contract keeps the range
//!   mapped, and so of one kind, while connections use it;
//! - otherwise nothing is known, and the caller reads the memory as before.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, OnceLock};

use crate::host::pagemap::{self, page_size, PM_PRESENT, PM_SWAP};
use crate::{Error, ErrorKind, Result};

/// A run of a queried range, `[start, end)` relative to the block start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub start: u64,
    pub end: u64,
    /// False: never populated, reads as zero (and was not read to know it).
    pub populated: bool,
}

/// The backing file of a block: the library's own descriptor of the file,
/// and the file offset of the block's first byte.
#[derive(Debug)]
struct Backing {
    fd: OwnedFd,
    file_offset: u64,
    /// (st_dev, st_ino): which file it is, to compare registries.
    id: (u64, u64),
}

/// What is known of one block's memory; shared by the registry's copies.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    backing: Option<Backing>,
    /// Whether the whole block is private anonymous memory, once asked.
    private_anonymous: OnceLock<bool>,
}

impl PartialEq for Memory {
    fn eq(&self, other: &Self) -> bool {
        let key = |m: &Memory| m.backing.as_ref().map(|b| (b.id, b.file_offset));
        key(self) == key(other)
    }
}

impl Eq for Memory {}

fn invalid(why: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, why)
}

impl Memory {
    /// A block's memory backed by `fd`'s file from `file_offset`, checked
    /// against the block's mapping at `host..host + length`.
    pub(crate) fn with_backing(fd: BorrowedFd<'_>, file_offset: u64, host: usize, length: u64) -> Result<Arc<Memory>> {
        let own = own_descriptor(fd)?;
        let file = File::from(own);
        let meta = file.metadata().map_err(|e| invalid(format!("fstat of the backing fd: {e}")))?;
        if !meta.file_type().is_file() {
            return Err(invalid("the backing fd is not a regular file".into()));
        }
        if file_offset.checked_add(length).is_none_or(|end| end > meta.size()) {
            return Err(invalid(format!(
                "the block's {length:#x} bytes from file offset {file_offset:#x} pass the backing file's end ({:#x})",
                meta.size()
            )));
        }
        // A mapping places file pages at page-aligned addresses.
        if (host as u64).wrapping_sub(file_offset) % page_size() != 0 {
            return Err(invalid(format!(
                "file offset {file_offset:#x} and host address {host:#x} are not the same within a page"
            )));
        }
        let id = (meta.dev(), meta.ino());
        check_shared_mapping(host as u64, length, id, file_offset)?;
        Ok(Arc::new(Memory {
            backing: Some(Backing { fd: file.into(), file_offset, id }),
            private_anonymous: OnceLock::new(),
        }))
    }

    /// The never-populated and (maybe) populated runs of `[offset, offset + len)`
    /// of the block of `length` bytes at `host`, in order and covering the range,
    /// adjacent runs of one kind merged; `None` when this memory cannot tell
    /// (read it instead).
    pub(crate) fn runs(&self, host: usize, length: u64, offset: u64, len: u64) -> Option<Vec<Run>> {
        if len == 0 {
            return Some(Vec::new());
        }
        if let Some(b) = &self.backing {
            return file_runs(b, offset, len);
        }
        let private = *self.private_anonymous.get_or_init(|| is_private_anonymous(host as u64, length));
        if private {
            pagemap_runs(host as u64, offset, len)
        } else {
            None
        }
    }
}

/// The library's own open file description of `fd`'s file: reopened read-only
/// through /proc/self/fd, so that `lseek` moves no offset the hypervisor uses;
/// a duplicate (sharing the hypervisor's offset) where that is not possible.
fn own_descriptor(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    let dup =
        File::from(fd.try_clone_to_owned().map_err(|e| invalid(format!("cannot duplicate the backing fd: {e}")))?);
    let id = |f: &File| f.metadata().ok().map(|m| (m.dev(), m.ino()));
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match std::fs::OpenOptions::new().read(true).open(&path) {
        // The magic link opens the same file; checked anyway.
        Ok(reopened) if id(&reopened).is_some() && id(&reopened) == id(&dup) => Ok(reopened.into()),
        _ => Ok(dup.into()),
    }
}

/// One line of /proc/self/maps: `[start, end)`, permissions, file offset, device, inode, path.
struct Vma {
    start: u64,
    end: u64,
    shared: bool,
    offset: u64,
    dev: (u32, u32),
    inode: u64,
    path: String,
}

fn parse_vma(line: &str) -> Option<Vma> {
    let mut f = line.split_ascii_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let perms = f.next()?;
    let offset = f.next()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let inode = f.next()?;
    let path = f.collect::<Vec<_>>().join(" ");
    Some(Vma {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        shared: perms.as_bytes().get(3) == Some(&b's'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?),
        inode: inode.parse().ok()?,
        path,
    })
}

/// The mappings covering `[start, end)`, in order, if they cover it without
/// a gap; `None` when /proc/self/maps cannot be read or does not cover it.
fn mappings(start: u64, end: u64) -> Option<Vec<Vma>> {
    let maps = File::open("/proc/self/maps").ok()?;
    let mut covering = Vec::new();
    let mut at = start;
    for line in BufReader::new(maps).lines() {
        let vma = parse_vma(&line.ok()?)?;
        if vma.end <= at || vma.start >= end {
            continue;
        }
        if vma.start > at {
            return None;
        }
        at = vma.end;
        covering.push(vma);
        if at >= end {
            return Some(covering);
        }
    }
    None
}

/// Whether `[host, host + length)` is mapped shared from file `id` with the
/// block's first byte at `file_offset`: a private mapping's written pages are
/// not in the file, whose holes would then not read as zero. Unchecked when
/// /proc/self/maps is not readable (the caller's contract says so).
fn check_shared_mapping(host: u64, length: u64, id: (u64, u64), file_offset: u64) -> Result<()> {
    if File::open("/proc/self/maps").is_err() {
        return Ok(());
    }
    let Some(vmas) = mappings(host, host + length) else {
        return Err(invalid(format!("the block's memory at {host:#x}+{length:#x} is not all mapped")));
    };
    let dev = (libc::major(id.0 as libc::dev_t), libc::minor(id.0 as libc::dev_t));
    for v in vmas {
        let expected = file_offset.wrapping_add(v.start.max(host) - host);
        let here = v.offset + (v.start.max(host) - v.start);
        if !v.shared || v.dev != dev || v.inode != id.1 || here != expected {
            return Err(invalid(format!(
                "the block's memory at {:#x} is not a shared mapping of the backing file at offset {expected:#x} \
                 (mapped: {}, {:x}:{:x} inode {} offset {here:#x})",
                v.start.max(host),
                if v.shared { "shared" } else { "private" },
                v.dev.0,
                v.dev.1,
                v.inode,
            )));
        }
    }
    Ok(())
}

/// Whether every page of `[host, host + length)` is private anonymous memory:
/// not shared, no file (inode 0), and no name but the heap's, the stack's or
/// one given with PR_SET_VMA_ANON_NAME (shared anonymous memory is named
/// `/dev/zero (deleted)`, `[anon_shmem:...]` or `/SYSV...`).
fn is_private_anonymous(host: u64, length: u64) -> bool {
    let anonymous = |v: &Vma| {
        !v.shared
            && v.inode == 0
            && (v.path.is_empty() || v.path == "[heap]" || v.path == "[stack]" || v.path.starts_with("[anon:"))
    };
    mappings(host, host + length).is_some_and(|vmas| vmas.iter().all(anonymous))
}

/// Runs from the backing file's holes and data.
fn file_runs(b: &Backing, offset: u64, len: u64) -> Option<Vec<Run>> {
    let start = b.file_offset + offset;
    let end = start + len;
    let mut runs = Vec::new();
    let mut at = start;
    while at < end {
        let data = match seek(&b.fd, at, libc::SEEK_DATA) {
            Ok(d) => d.min(end),
            // No data from here to the file's end.
            Err(libc::ENXIO) => end,
            Err(_) => return None,
        };
        push(&mut runs, at - b.file_offset, data - b.file_offset, false);
        if data >= end {
            break;
        }
        let hole = match seek(&b.fd, data, libc::SEEK_HOLE) {
            Ok(h) => h.min(end),
            Err(_) => return None,
        };
        push(&mut runs, data - b.file_offset, hole - b.file_offset, true);
        at = hole;
    }
    Some(runs)
}

/// `lseek(fd, at, whence)`, or the errno.
fn seek(fd: &OwnedFd, at: u64, whence: libc::c_int) -> std::result::Result<u64, i32> {
    let at = libc::off_t::try_from(at).map_err(|_| libc::EINVAL)?;
    // SAFETY: lseek on a descriptor this registry owns; it moves only its own offset (or, on a
    // duplicate, the shared offset, which the contract of `set_backing` allows).
    let r = unsafe { libc::lseek(fd.as_raw_fd(), at, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    } else {
        Ok(r as u64)
    }
}

/// Appends `[start, end)` to `runs`, merged with the last run if of the same kind.
fn push(runs: &mut Vec<Run>, start: u64, end: u64, populated: bool) {
    if start >= end {
        return;
    }
    match runs.last_mut() {
        Some(last) if last.populated == populated && last.end == start => last.end = end,
        _ => runs.push(Run { start, end, populated }),
    }
}

/// Runs from this process's page table (private anonymous memory only).
fn pagemap_runs(host: u64, offset: u64, len: u64) -> Option<Vec<Run>> {
    let page = page_size();
    let (from, to) = (host + offset, host + offset + len);
    let mut runs = Vec::new();
    pagemap::for_each_entry(from / page, to.div_ceil(page), |p, entry| {
        let (s, e) = ((p * page).max(from), ((p + 1) * page).min(to));
        push(&mut runs, s - host, e - host, entry & (PM_PRESENT | PM_SWAP) != 0);
    })?;
    Some(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::RamBlocks;
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;

    const PAGES: u64 = 64;

    /// A shared mapping of `len` bytes of `fd` from `offset`.
    fn map(fd: &OwnedFd, len: u64, offset: u64, flags: libc::c_int) -> *mut u8 {
        // SAFETY: a new mapping of a file we own; unmapped by the caller.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        p.cast()
    }

    fn unmap(p: *mut u8, len: u64) {
        // SAFETY: `p` is a mapping of `len` bytes made by this test.
        unsafe { libc::munmap(p.cast(), len as usize) };
    }

    /// A memfd of `pages` pages with data written (by pwrite, not mapped) at `data` pages.
    fn memfd(pages: u64, data: &[u64]) -> File {
        // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned below.
        let fd = unsafe { libc::memfd_create(c"populated-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor nobody else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(pages * page_size()).unwrap();
        for &p in data {
            file.write_all_at(&[0x5a; 100], p * page_size() + 7).unwrap();
        }
        file
    }

    fn blocks(file: &File) -> u64 {
        file.metadata().unwrap().blocks()
    }

    /// Only the bits that say populated or not.
    fn pagemap(ptr: *const u8, pages: u64) -> Vec<u64> {
        pagemap::entries(ptr, pages, PM_PRESENT | PM_SWAP)
    }

    /// Runs of pages `(first, last_exclusive, populated)`, in bytes.
    fn runs_of(pages: &[(u64, u64, bool)]) -> Vec<Run> {
        let page = page_size();
        pages.iter().map(|&(s, e, populated)| Run { start: s * page, end: e * page, populated }).collect()
    }

    use std::os::fd::FromRawFd;

    #[test]
    fn a_backing_files_holes_are_never_populated_and_stay_holes() {
        let page = page_size();
        let file = memfd(PAGES, &[3, 4, 10, 20, 21, 22, 23, 63]);
        let fd: OwnedFd = file.try_clone().unwrap().into();
        let host = map(&fd, PAGES * page, 0, libc::MAP_SHARED);
        let mut ram = RamBlocks::new();
        // SAFETY: the mapping outlives the registry's use here.
        unsafe { ram.add("memfd", host, 0, PAGES * page).unwrap() };
        let before = blocks(&file);
        assert_eq!(before * 512, 8 * page, "8 data pages allocated");
        assert_eq!(ram.blocks()[0].populated_runs(0, PAGES * page), None, "shared memory, no backing: unknown");
        ram.set_backing(0, fd.as_fd(), 0).unwrap();
        drop(fd);
        let b = &ram.blocks()[0];
        assert_eq!(
            b.populated_runs(0, PAGES * page).unwrap(),
            runs_of(&[
                (0, 3, false),
                (3, 5, true),
                (5, 10, false),
                (10, 11, true),
                (11, 20, false),
                (20, 24, true),
                (24, 63, false),
                (63, 64, true)
            ])
        );
        // A range with unaligned ends, starting and ending in holes.
        assert_eq!(
            b.populated_runs(page + 5, 9 * page).unwrap(),
            vec![
                Run { start: page + 5, end: 3 * page, populated: false },
                Run { start: 3 * page, end: 5 * page, populated: true },
                Run { start: 5 * page, end: 10 * page, populated: false },
                Run { start: 10 * page, end: 10 * page + 5, populated: true },
            ]
        );
        assert_eq!(
            b.populated_runs(4 * page + 1, 10).unwrap(),
            vec![Run { start: 4 * page + 1, end: 4 * page + 11, populated: true }]
        );
        assert_eq!(b.populated_runs(30 * page, page).unwrap(), runs_of(&[(30, 31, false)]));
        assert_eq!(blocks(&file), before, "querying allocated nothing");
        // The registry's copies share the backing; the copy still answers once the original is gone.
        let copy = ram.clone();
        drop(ram);
        assert_eq!(
            copy.blocks()[0].populated_runs(62 * page, 2 * page).unwrap(),
            runs_of(&[(62, 63, false), (63, 64, true)])
        );
        unmap(host, PAGES * page);
    }

    #[test]
    fn a_block_inside_a_mapping_at_a_file_offset() {
        let page = page_size();
        let file = memfd(PAGES, &[17, 40]);
        let fd: OwnedFd = file.try_clone().unwrap().into();
        // The mapping starts at file page 8; the block at its page 4 (file page 12), 32 pages long.
        let host = map(&fd, 48 * page, 8 * page, libc::MAP_SHARED);
        let mut ram = RamBlocks::new();
        // SAFETY: as above.
        unsafe { ram.add("b", host.wrapping_add(4 * page as usize), 0, 32 * page).unwrap() };
        let wrong = ram.set_backing(0, fd.as_fd(), 8 * page).unwrap_err();
        assert_eq!(wrong.kind, ErrorKind::InvalidArgument, "{wrong}");
        assert!(wrong.message.contains("not a shared mapping of the backing file"), "{wrong}");
        let past_end = ram.set_backing(0, fd.as_fd(), 40 * page).unwrap_err();
        assert!(past_end.message.contains("pass the backing file's end"), "{past_end}");
        let unaligned = ram.set_backing(0, fd.as_fd(), 12 * page + 8).unwrap_err();
        assert!(unaligned.message.contains("within a page"), "{unaligned}");
        ram.set_backing(0, fd.as_fd(), 12 * page).unwrap();
        assert_eq!(
            ram.blocks()[0].populated_runs(0, 32 * page).unwrap(),
            runs_of(&[(0, 5, false), (5, 6, true), (6, 28, false), (28, 29, true), (29, 32, false)])
        );
        assert!(ram.set_backing(1, fd.as_fd(), 0).is_err(), "no block 1");
        unmap(host, 48 * page);
    }

    #[test]
    fn a_private_mapping_of_the_file_or_another_file_is_refused() {
        let page = page_size();
        let file = memfd(PAGES, &[1]);
        let fd: OwnedFd = file.try_clone().unwrap().into();
        let other: OwnedFd = memfd(PAGES, &[]).into();
        let private = map(&fd, PAGES * page, 0, libc::MAP_PRIVATE);
        let shared = map(&fd, PAGES * page, 0, libc::MAP_SHARED);
        let mut ram = RamBlocks::new();
        // SAFETY: as above.
        unsafe {
            ram.add("private", private, 0, PAGES * page).unwrap();
            ram.add("shared", shared, 0, PAGES * page).unwrap();
        }
        let e = ram.set_backing(0, fd.as_fd(), 0).unwrap_err();
        assert!(e.message.contains("private"), "{e}");
        let e = ram.set_backing(1, other.as_fd(), 0).unwrap_err();
        assert!(e.message.contains("not a shared mapping"), "{e}");
        // A file mapped privately is neither backed nor private anonymous: unknown.
        assert_eq!(ram.blocks()[0].populated_runs(0, page), None);
        let (r, w) = {
            let mut p = [0; 2];
            // SAFETY: pipe fills the array.
            assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
            // SAFETY: fresh descriptors, owned here.
            unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
        };
        let e = ram.set_backing(1, r.as_fd(), 0).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
        drop(w);
        unmap(private, PAGES * page);
        unmap(shared, PAGES * page);
    }

    /// A private anonymous mapping of `pages` pages without huge pages.
    fn anonymous(pages: u64, flags: libc::c_int) -> *mut u8 {
        let len = (pages * page_size()) as usize;
        // SAFETY: a new anonymous mapping, unmapped by the caller.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        p.cast()
    }

    #[test]
    fn private_anonymous_memory_never_touched_is_never_populated() {
        let page = page_size();
        let host = anonymous(PAGES, libc::MAP_PRIVATE);
        // SAFETY: pages of our mapping.
        unsafe {
            for p in [1, 2, 5, 40] {
                host.add((p * page) as usize + 9).write_volatile(3);
            }
            // Read, never written: the shared zero page is mapped (present, scanned as populated).
            assert_eq!(host.add(7 * page as usize).read_volatile(), 0);
        }
        let mut ram = RamBlocks::new();
        // SAFETY: the mapping outlives the registry's use here.
        unsafe { ram.add("anon", host, 0, PAGES * page).unwrap() };
        let before = pagemap(host, PAGES);
        let b = &ram.blocks()[0];
        assert_eq!(
            b.populated_runs(0, PAGES * page).unwrap(),
            runs_of(&[
                (0, 1, false),
                (1, 3, true),
                (3, 5, false),
                (5, 6, true),
                (6, 7, false),
                (7, 8, true),
                (8, 40, false),
                (40, 41, true),
                (41, 64, false)
            ])
        );
        assert_eq!(
            b.populated_runs(2 * page + 100, page).unwrap(),
            vec![
                Run { start: 2 * page + 100, end: 3 * page, populated: true },
                Run { start: 3 * page, end: 3 * page + 100, populated: false }
            ]
        );
        assert_eq!(pagemap(host, PAGES), before, "querying populated nothing");
        // Discarded pages read as zero again.
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(host.add(page as usize).cast(), page as usize, libc::MADV_DONTNEED) };
        assert_eq!(b.populated_runs(0, 3 * page).unwrap(), runs_of(&[(0, 2, false), (2, 3, true)]));
        unmap(host, PAGES * page);
    }

    #[test]
    fn shared_anonymous_memory_is_unknown() {
        let page = page_size();
        let host = anonymous(PAGES, libc::MAP_SHARED);
        let mut ram = RamBlocks::new();
        // SAFETY: as above.
        unsafe { ram.add("shm", host, 0, PAGES * page).unwrap() };
        assert_eq!(ram.blocks()[0].populated_runs(0, page), None);
        unmap(host, PAGES * page);
    }

    #[test]
    fn maps_lines_parse() {
        let v = parse_vma("7f12a000-7f12c000 rw-s 00003000 00:01 2055 /memfd:x (deleted)").unwrap();
        assert_eq!(
            (v.start, v.end, v.shared, v.offset, v.dev, v.inode),
            (0x7f12a000, 0x7f12c000, true, 0x3000, (0, 1), 2055)
        );
        assert_eq!(v.path, "/memfd:x (deleted)");
        let v = parse_vma("55d0c000-55d2d000 rw-p 00000000 00:00 0                          [heap]").unwrap();
        assert!(!v.shared && v.inode == 0 && v.path == "[heap]");
        assert!(parse_vma("garbage").is_none());
    }
}
