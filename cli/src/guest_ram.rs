//! The bench's synthetic guest RAM: an anonymous mapping that the source's
//! dirtier writes and the destination's vCPUs read, in pages of [`PAGE`]
//! bytes filled from [`splitmix64`].

use rdmamig::RamBlocks;
use sha2::{Digest, Sha256};

use crate::human;

/// The guest's page size (the dirtier's and the dirty bitmap's unit).
pub(crate) const PAGE: u64 = 4096;

/// Anonymous private memory: the synthetic guest's RAM.
pub(crate) struct Ram {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory; who writes when is this program's protocol (the
// dirtier writes pages while the library reads them, as a running guest
// does; the hashes read it only once the dirtier has stopped).
unsafe impl Send for Ram {}
unsafe impl Sync for Ram {}

impl Ram {
    pub(crate) fn new(len: u64) -> Result<Ram, String> {
        let len = usize::try_from(len).map_err(|_| "size too large".to_string())?;
        // SAFETY: a fresh anonymous mapping chosen by the kernel.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("cannot map {} of guest RAM: {}", human(len as u64), std::io::Error::last_os_error()));
        }
        Ok(Ram { ptr: ptr.cast(), len })
    }

    pub(crate) fn pages(&self) -> u64 {
        self.len as u64 / PAGE
    }

    /// Where the mapping lies: address and length.
    pub(crate) fn span(&self) -> (usize, usize) {
        (self.ptr as usize, self.len)
    }

    /// The word at `offset`, read volatile (it must happen, and may fault).
    ///
    /// # Safety
    /// `offset + 8` lies inside the mapping.
    pub(crate) unsafe fn read_u64(&self, offset: u64) -> u64 {
        (self.ptr.add(offset as usize) as *const u64).read_volatile()
    }

    /// Fills page `page` with random non-zero bytes drawn from `state`.
    pub(crate) fn fill_page(&self, page: u64, state: &mut u64) {
        let words = (PAGE / 8) as usize;
        // SAFETY: the page lies inside the mapping (callers pass page < pages()); u64-aligned.
        let p = unsafe { self.ptr.add((page * PAGE) as usize) } as *mut u64;
        for i in 0..words {
            let mut w = splitmix64(state);
            if i == 0 {
                w |= 1; // never an all-zero page
            }
            // SAFETY: inside the page; volatile because the NIC may be reading it (a live guest's write).
            unsafe { p.add(i).write_volatile(w) };
        }
    }

    /// Only once nothing writes it any more.
    pub(crate) fn sha256(&self) -> String {
        // SAFETY: the whole mapping is readable; callers ensure no writer is left.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        let digest = Sha256::digest(bytes);
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub(crate) fn registry(&self) -> rdmamig::Result<RamBlocks> {
        let mut r = RamBlocks::new();
        // SAFETY: the mapping outlives every connection using the registry
        // (each is closed before the Ram drops).
        unsafe { r.add("pc.ram", self.ptr, 0, self.len as u64) }?;
        Ok(r)
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The guest's random numbers (SplitMix64): the pages' contents, and the
/// pages the dirtier writes and the vCPUs read.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_never_zero() {
        let ram = Ram::new(4 * PAGE).unwrap();
        let mut s = 7;
        for p in 0..4 {
            ram.fill_page(p, &mut s);
        }
        let bytes = unsafe { std::slice::from_raw_parts(ram.ptr, ram.len) };
        assert!(bytes.chunks(PAGE as usize).all(|p| p.iter().any(|&b| b != 0)));
        let first = ram.sha256();
        let mut s = 7;
        ram.fill_page(0, &mut s);
        assert_eq!(ram.sha256(), first, "the same seed gives the same page");
    }
}
