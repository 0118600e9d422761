//! Guest memory as a type: a [`GuestRange`] is minted once, when the
//! hypervisor registers a RAM block and promises to keep it mapped
//! (`RamBlocks::add`), and offers the operations the engine needs on it.
//! The guest (or the peer's NIC) may change it at any time, so it is never
//! borrowed as a Rust slice: it is scanned and copied with atomic loads,
//! registered, or handed to the kernel.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use super::{sharing, zero};
use crate::verbs::{self, Access, MemoryRegion, ProtectionDomain};

/// `len` bytes of guest RAM at `addr`, which the hypervisor keeps mapped,
/// readable and writable for as long as a registry or connection using it
/// exists (the promise made to `RamBlocks::add`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestRange {
    addr: usize,
    len: u64,
}

impl GuestRange {
    /// The range `len` bytes at `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` stays mapped, readable and writable while the
    /// range or any range taken from it is used, and the caller accepts that
    /// the library and the NIC read and write it at any time meanwhile.
    pub unsafe fn new(addr: *mut u8, len: u64) -> GuestRange {
        GuestRange { addr: addr as usize, len }
    }

    /// The address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// The `len` bytes at `offset` into this range.
    ///
    /// # Panics
    /// When they do not lie inside it (callers check ranges against their
    /// block first: a range outside is the library's bug).
    pub fn sub(&self, offset: u64, len: u64) -> GuestRange {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "{offset:#x}+{len:#x} outside {self:?}");
        GuestRange { addr: self.addr + offset as usize, len }
    }

    /// Whether every byte is zero (the widest vector scan the CPU has).
    pub fn is_zero(&self) -> bool {
        // SAFETY: mapped and readable (the type's contract); the scan reads
        // with volatile loads, so the guest's writes meanwhile are harmless.
        unsafe { zero::is_zero(self.addr as *const u8, self.len as usize) }
    }

    /// Whether pinning the range would allocate or copy a page (see
    /// `sharing`).
    pub fn pin_would_copy(&self) -> bool {
        // SAFETY: mapped and readable (the type's contract).
        unsafe { sharing::pin_would_copy(self.addr as *const u8, self.len) }
    }

    /// Makes every byte zero, writing only if one is not (a page already
    /// zero is not dirtied).
    pub fn make_zero(&self) {
        if !self.is_zero() {
            // SAFETY: mapped and writable (the type's contract).
            unsafe { std::ptr::write_bytes(self.addr as *mut u8, 0, self.len as usize) };
        }
    }

    /// Copies the range into `dst` (as long as the range) while the guest
    /// may be writing it: with relaxed atomic loads (plain loads on every
    /// target), as a data race with non-atomic copies would be undefined
    /// behaviour. A torn page is fine: the dirty log sends it again.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len() as u64, self.len, "copy_to needs a destination as long as the range");
        // SAFETY: the source is mapped and readable (the type's contract)
        // and is read with atomic loads only; `dst` is ours, as long.
        unsafe { copy_racing(self.addr as *const u8, dst.as_mut_ptr(), dst.len()) }
    }

    /// Registers the range with `pd` (`ibv_reg_mr`).
    pub fn register(&self, pd: &Arc<ProtectionDomain>, access: Access) -> verbs::Result<MemoryRegion> {
        // SAFETY: guest RAM stays mapped while it is used, and the hypervisor
        // accepted that the NIC and the peer read and write it (the type's
        // contract); the library holds no reference to it.
        unsafe { pd.register(self.addr as *mut u8, self.len as usize, access) }
    }

    /// Drops the range's pages: a shared mapping (memfd, shmem) has its
    /// file's pages punched out (`MADV_REMOVE`: merely unmapping them would
    /// map the old page back on the next touch, without a fault); private
    /// anonymous memory, where that fails with EINVAL, has them unmapped
    /// (`MADV_DONTNEED`). The errors of both calls on failure.
    pub fn discard(&self) -> Result<(), (std::io::Error, std::io::Error)> {
        // SAFETY: guest RAM (the type's contract); only its pages' contents go.
        if unsafe { libc::madvise(self.addr as *mut _, self.len as usize, libc::MADV_REMOVE) } == 0 {
            return Ok(());
        }
        let remove = std::io::Error::last_os_error();
        if remove.raw_os_error() == Some(libc::EINVAL)
            // SAFETY: as above.
            && unsafe { libc::madvise(self.addr as *mut _, self.len as usize, libc::MADV_DONTNEED) } == 0
        {
            return Ok(());
        }
        Err((remove, std::io::Error::last_os_error()))
    }

    /// Populates the range's pages for writing (`MADV_POPULATE_WRITE`,
    /// widened to whole pages). Best effort: a kernel without it (before
    /// 5.14) leaves the faulting to whoever touches or pins the pages.
    pub fn populate_write(&self) {
        let page = super::pagemap::page_size();
        let aligned = self.addr() & !(page - 1);
        let span = (self.addr() + self.len - aligned).next_multiple_of(page);
        // SAFETY: guest RAM (the type's contract), and the pages around its
        // ends are mapped too; populating changes neither contents nor mapping.
        unsafe { libc::madvise(aligned as *mut libc::c_void, span as usize, libc::MADV_POPULATE_WRITE) };
    }

    /// Makes the range inaccessible (`mprotect(PROT_NONE)`): a thread that
    /// touches it gets SIGSEGV (under KVM, `KVM_RUN` fails with `EFAULT`).
    pub fn protect_none(&self) -> std::io::Result<()> {
        // SAFETY: guest RAM (the type's contract); only its protection changes.
        if unsafe { libc::mprotect(self.addr as *mut _, self.len as usize, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Copies `len` bytes at `src`, which another thread may be writing, to `dst`.
///
/// # Safety
/// `src..src + len` readable, `dst..dst + len` writable and not racing.
unsafe fn copy_racing(src: *const u8, dst: *mut u8, len: usize) {
    let mut i = 0;
    // SAFETY: the caller's contract; `src` is only read through atomics.
    unsafe {
        while i < len && (src as usize + i) % 8 != 0 {
            *dst.add(i) = AtomicU8::from_ptr(src.add(i) as *mut u8).load(Ordering::Relaxed);
            i += 1;
        }
        while i + 8 <= len {
            let word = AtomicU64::from_ptr(src.add(i) as *mut u64).load(Ordering::Relaxed);
            (dst.add(i) as *mut u64).write_unaligned(word);
            i += 8;
        }
        while i < len {
            *dst.add(i) = AtomicU8::from_ptr(src.add(i) as *mut u8).load(Ordering::Relaxed);
            i += 1;
        }
    }
}

/// Memory for tests that stands in for guest RAM: leaked, so it stays
/// mapped for the life of the test process.
#[cfg(test)]
pub(crate) fn leaked(len: usize) -> GuestRange {
    let mem: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
    // SAFETY: leaked memory stays mapped until the process ends.
    unsafe { GuestRange::new(mem.as_mut_ptr(), len as u64) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_racing_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..100u8).collect();
        for start in 0..9 {
            for len in [0, 1, 7, 8, 9, 50, 100 - start] {
                let mut dst = vec![0u8; len];
                // SAFETY: both ranges inside their vectors.
                unsafe { copy_racing(src.as_ptr().add(start), dst.as_mut_ptr(), len) };
                assert_eq!(dst, &src[start..start + len]);
            }
        }
    }

    #[test]
    fn sub_ranges_stay_inside() {
        let r = leaked(4096);
        assert_eq!(r.sub(4000, 96).addr(), r.addr() + 4000);
        assert!(std::panic::catch_unwind(|| r.sub(4000, 97)).is_err());
        assert!(std::panic::catch_unwind(|| r.sub(u64::MAX, 2)).is_err());
    }
}

/// Guest memory for the engine's tests: mappings that stand in for a
/// hypervisor's RAM.
#[cfg(test)]
pub(crate) mod testing {
    use std::os::fd::{AsRawFd, BorrowedFd};

    use super::GuestRange;

    /// A new memfd named `name`, empty.
    pub fn memfd(name: &str) -> std::fs::File {
        let name = std::ffi::CString::new(name).unwrap();
        // SAFETY: a NUL-terminated name; the new descriptor is owned by the File.
        unsafe {
            let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
            std::os::fd::FromRawFd::from_raw_fd(fd)
        }
    }

    /// A mapping of the test's own, unmapped when dropped: its range must
    /// not be used after that.
    pub(crate) struct Mapping(GuestRange);

    impl Mapping {
        /// `len` bytes of private anonymous memory, never touched (address
        /// space only, MAP_NORESERVE; no transparent huge pages: tests count
        /// 4 KiB pages).
        pub fn anonymous(len: u64) -> Mapping {
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
            let mapping = Mapping::map(len, flags, -1);
            // SAFETY: the mapping just made.
            unsafe { libc::madvise(mapping.0.addr as *mut _, len as usize, libc::MADV_NOHUGEPAGE) };
            mapping
        }

        /// The first `len` bytes of `file`, mapped shared.
        pub fn shared(file: BorrowedFd<'_>, len: u64) -> Mapping {
            Mapping::map(len, libc::MAP_SHARED, file.as_raw_fd())
        }

        fn map(len: u64, flags: i32, fd: i32) -> Mapping {
            let prot = libc::PROT_READ | libc::PROT_WRITE;
            // SAFETY: a fresh mapping the kernel places, checked.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len as usize, prot, flags, fd, 0) };
            assert_ne!(p, libc::MAP_FAILED, "mmap of {len} bytes: {}", std::io::Error::last_os_error());
            // SAFETY: mapped until `drop`, after the test's last use.
            Mapping(unsafe { GuestRange::new(p.cast(), len) })
        }

        pub fn range(&self) -> GuestRange {
            self.0
        }

        /// Sets every byte to `value`.
        pub fn fill(&self, value: u8) {
            // SAFETY: our mapping, writable.
            unsafe { std::ptr::write_bytes(self.0.addr as *mut u8, value, self.0.len as usize) };
        }

        /// A copy of bytes `from..to`.
        pub fn bytes(&self, from: u64, to: u64) -> Vec<u8> {
            let mut out = vec![0; (to - from) as usize];
            self.0.sub(from, to - from).copy_to(&mut out);
            out
        }

        /// Writes `value` at byte `at` (as the guest would).
        pub fn poke(&self, at: u64, value: u8) {
            assert!(at < self.0.len);
            // SAFETY: inside our mapping, writable.
            unsafe { (self.0.addr as *mut u8).add(at as usize).write_volatile(value) };
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `map`.
            unsafe { libc::munmap(self.0.addr as *mut _, self.0.len as usize) };
        }
    }
}
