//! Guest RAM of the example programs: a private anonymous mapping, or a
//! shared mapping of a file, registered as one block "pc.ram".

use std::fs::File;
use std::os::unix::io::AsRawFd;

use rdmamig::RamBlocks;

/// Guest RAM: a private anonymous mapping, or a shared mapping of a file.
pub struct Ram {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: plain memory; the threads that share it read it (vCPUs) or hand it
// to the library (the registry), as a VMM's do; who writes when is each
// program's protocol.
unsafe impl Sync for Ram {}

impl Ram {
    pub fn anonymous(len: u64) -> Result<Ram, String> {
        Ram::map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    }

    pub fn shared(file: &File, len: u64) -> Result<Ram, String> {
        Ram::map(len, libc::MAP_SHARED, file.as_raw_fd())
    }

    fn map(len: u64, flags: i32, fd: i32) -> Result<Ram, String> {
        let len = len as usize;
        // SAFETY: a fresh mapping chosen by the kernel; `fd` is open (or -1 for anonymous memory).
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap of {len} bytes: {}", std::io::Error::last_os_error()));
        }
        Ok(Ram { ptr: ptr as *mut u8, len })
    }

    /// Only while no connection transfers from or into it.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the whole mapping, readable; callers read it only between transfers.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Only while no connection transfers from or into it.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the whole mapping, writable; callers write it only between transfers.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// One block, "pc.ram", over the whole mapping.
    pub fn registry(&self) -> RamBlocks {
        let mut r = RamBlocks::new();
        // SAFETY: the mapping outlives every connection that uses the
        // registry (each run drops its connection before its Ram).
        unsafe { r.add("pc.ram", self.ptr, 0, self.len as u64).expect("a valid block") };
        r
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}
