//! Never-populated guest pages are sent as zero ranges without being read,
//! and left alone by the destination: a guest with a quarter of its RAM
//! written in 64 KiB runs migrates byte-identical while the source's memory
//! does not grow at all, and the destination's only by the chunks it had to
//! register for the written data.
//!
//! Two kinds of guest RAM: shared memory (a memfd, as vhost-user setups use,
//! its fd given with `RamBlocks::set_backing`; reading a hole of a shared
//! mapping would allocate it), measured by the file's allocation
//! (`st_blocks`); and private anonymous memory (found out from
//! /proc/self/maps), measured by its present pages in /proc/self/pagemap.
//! Each with rdmamig's extensions on and off (QEMU's wire: one zero range per
//! COMPRESS). Dynamic registration only: pin-all pins, and so allocates,
//! every page on both sides by definition.
//!
//! The destination registers a whole 1 MiB chunk for the source's writes,
//! which allocates the chunk (a pin for write faults every page in): its
//! growth is bounded by the chunks that hold data, here half of them (the
//! written quarter sits in every other chunk, alternate 64 KiB runs).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::{Duration, Instant};

use rdmamig::{Config, Ending, RamBlocks, Stats};

use crate::migration::{connect, PAGE};

const MIB: u64 = 1 << 20;
const RUN: u64 = 64 << 10;
/// The guest: 256 MiB, 64 MiB of it written.
const SIZE: u64 = 256 * MIB;

/// Whether 64 KiB run `run` (counted from the block start) is written: in
/// even chunks, every other run (which ones alternates from chunk to chunk).
fn written(run: u64) -> bool {
    let (chunk, slot) = (run * RUN / MIB, run % (MIB / RUN));
    chunk % 2 == 0 && slot % 2 == (chunk / 2) % 2
}

fn runs_written() -> impl Iterator<Item = u64> {
    (0..SIZE / RUN).filter(|&r| written(r))
}

/// Bytes the guest wrote, and the 1 MiB chunks they lie in.
fn written_bytes() -> u64 {
    runs_written().count() as u64 * RUN
}

fn data_chunks() -> u64 {
    (0..SIZE / MIB).filter(|&c| (c * MIB / RUN..(c + 1) * MIB / RUN).any(written)).count() as u64
}

/// Guest RAM: a mapping of `SIZE` bytes, of a memfd (shared) or anonymous (private).
struct Ram {
    ptr: *mut u8,
    file: Option<File>,
}

impl Ram {
    fn new(shared: bool) -> Ram {
        let file = shared.then(|| {
            let fd = unsafe { libc::memfd_create(c"guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
            let file = unsafe { File::from_raw_fd(fd) };
            file.set_len(SIZE).unwrap();
            file
        });
        let (flags, fd) = match &file {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), SIZE as usize, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0)
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // One 4 KiB write must not populate a 2 MiB huge page (the guest's THP is `always`).
        unsafe { libc::madvise(ptr, SIZE as usize, libc::MADV_NOHUGEPAGE) };
        Ram { ptr: ptr.cast(), file }
    }

    /// The guest writes its quarter: each run a byte of its own, never zero.
    fn write_guest(&self) {
        for r in runs_written() {
            unsafe { std::ptr::write_bytes(self.ptr.add((r * RUN) as usize), (r % 251 + 1) as u8, RUN as usize) };
        }
    }

    fn registry(&self) -> RamBlocks {
        let mut ram = RamBlocks::new();
        unsafe { ram.add("pc.ram", self.ptr, 0, SIZE).unwrap() };
        if let Some(f) = &self.file {
            ram.set_backing(0, f.as_fd(), 0).unwrap();
        }
        ram
    }

    /// What is allocated, in bytes: the file's blocks, or the mapping's present pages.
    fn allocated(&self) -> u64 {
        match &self.file {
            Some(f) => f.metadata().unwrap().blocks() * 512,
            None => {
                let pagemap = File::open("/proc/self/pagemap").unwrap();
                let mut buf = vec![0u8; (SIZE / PAGE * 8) as usize];
                pagemap.read_exact_at(&mut buf, self.ptr as u64 / PAGE * 8).unwrap();
                let present = buf.chunks_exact(8).filter(|e| u64::from_ne_bytes((*e).try_into().unwrap()) >> 63 == 1);
                present.count() as u64 * PAGE
            }
        }
    }

    /// 1 MiB at `offset`, read without allocating (pread of a memfd reads holes as zero).
    fn read(&self, offset: u64, buf: &mut [u8]) {
        match &self.file {
            Some(f) => f.read_exact_at(buf, offset).unwrap(),
            None => {
                buf.copy_from_slice(unsafe { std::slice::from_raw_parts(self.ptr.add(offset as usize), buf.len()) })
            }
        }
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr.cast(), SIZE as usize) };
    }
}

/// Migrates the quarter-written guest (round 0: every page) and checks the
/// destination's bytes, both sides' allocation, and the bytes written.
fn migrate(shared: bool, extensions: bool) {
    let src = Ram::new(shared);
    let dst = Ram::new(shared);
    src.write_guest();
    let config = Config { extensions, ..Config::default() };
    let (source, dest) = connect(&src.registry(), &config, dst.registry(), &config);
    let (src_before, dst_before) = (src.allocated(), dst.allocated());
    let start = Instant::now();
    source.iteration_begin().unwrap();
    source.save(0, 0, SIZE).unwrap();
    source.iteration_end().unwrap();
    let elapsed = start.elapsed();
    let stats: Stats = source.stats();
    let ending = if extensions { Ending::Completed } else { Ending::Unverified };
    assert_eq!(source.close().unwrap(), ending);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(30))).unwrap(), ending);
    let (src_after, dst_after) = (src.allocated(), dst.allocated());
    let kind = if shared { "memfd" } else { "private anonymous" };
    eprintln!(
        "{kind}, extensions {extensions}: {} MiB written by the guest in {} chunks; window {elapsed:?}; \
         source allocated {src_before} -> {src_after} bytes, destination {dst_before} -> {dst_after}; \
         bytes_written {}, zero ranges {}, chunks registered {}, staged {}",
        written_bytes() / MIB,
        data_chunks(),
        stats.bytes_written,
        stats.zero_chunks,
        stats.chunks_registered,
        stats.staged_bytes,
    );
    // Every check is made, then all failures reported together.
    let mut failed = Vec::new();
    if src_after > src_before + 4 * PAGE {
        failed.push(format!("the source's memory grew: {src_before} -> {src_after} bytes"));
    }
    let bound = dst_before + data_chunks() * MIB + MIB;
    if dst_after > bound {
        failed.push(format!("the destination allocated {dst_after} bytes, more than {bound}"));
    }
    if stats.bytes_written < written_bytes() || stats.bytes_written > written_bytes() + written_bytes() / 20 {
        failed.push(format!("{} bytes written for {} written by the guest", stats.bytes_written, written_bytes()));
    }
    let (mut a, mut b) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    for off in (0..SIZE).step_by(MIB as usize) {
        src.read(off, &mut a);
        dst.read(off, &mut b);
        if a != b {
            failed.push(format!("the destination differs in the chunk at {off:#x}"));
            break;
        }
    }
    assert!(failed.is_empty(), "{kind}, extensions {extensions}: {failed:#?}");
}

#[test]
fn shared_memory_guest_keeps_its_holes() {
    migrate(true, true);
}

#[test]
fn shared_memory_guest_keeps_its_holes_qemu_compatible() {
    migrate(true, false);
}

#[test]
fn private_anonymous_guest_keeps_its_holes() {
    migrate(false, true);
}

#[test]
fn private_anonymous_guest_keeps_its_holes_qemu_compatible() {
    migrate(false, false);
}
