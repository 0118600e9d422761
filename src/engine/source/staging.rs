//! The staging ring: a registered buffer for writes from chunks the source
//! does not pin (see `pin_would_copy`): their bytes are copied into the ring
//! and written from there, so the guest's untouched and shared pages stay
//! untouched and shared. A slot is reused once its write has completed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::engine::pin::Pins;
use crate::host::page_buffer::PageBuffer;
use crate::verbs::{MemoryRegion, Sge};
use crate::Result;

pub(super) struct Staging {
    /// Declared before `mem` and never handed out: the ring is deregistered
    /// before its memory is freed, whether dropped or `release`d. With
    /// rdma-core's fork support on, `ibv_dereg_mr` madvises the range
    /// (MADV_DOFORK), which must not reach memory freed (and perhaps mapped
    /// anew) meanwhile.
    mr: MemoryRegion,
    mem: PageBuffer,
    size: u64,
    /// Bytes ever handed out and ever freed: the ring holds `[tail, head)`.
    head: u64,
    tail: u64,
    /// (write sequence, `head` after its bytes) of writes not known complete.
    inflight: VecDeque<(u64, u64)>,
}

impl Staging {
    /// A ring of `size` bytes (a page multiple), registered through `pins`.
    pub fn new(pins: &Pins, size: u64) -> Result<Staging> {
        let mem = PageBuffer::new(size as usize);
        // SAFETY: `mem` is freed after the registration is dropped (see `mr`).
        let mr = unsafe { pins.register(mem.ptr(), size, crate::verbs::Access::LOCAL_WRITE)? };
        Ok(Staging { mr, mem, size, head: 0, tail: 0, inflight: VecDeque::new() })
    }

    /// Copies `len` bytes of guest RAM at `src` into the ring and returns
    /// where they are, or `None` while the ring is too full (wait for the
    /// write of `oldest`). Record the write with `posted`.
    ///
    /// # Safety
    /// `src..src + len` is mapped and readable (the guest may write it meanwhile).
    pub unsafe fn stage(&mut self, src: *const u8, len: u64) -> Option<Sge> {
        let mut at = self.head % self.size;
        let mut start = self.head;
        if at + len > self.size {
            // Never split a write: skip the rest of the ring.
            start += self.size - at;
            at = 0;
        }
        if start + len - self.tail > self.size {
            return None;
        }
        copy_racing(src, self.mem.ptr().add(at as usize), len as usize);
        self.head = start + len;
        self.mr.sge(at as usize, len as u32)
    }

    /// The write of the bytes staged last was posted as `seq`.
    pub fn posted(&mut self, seq: u64) {
        self.inflight.push_back((seq, self.head));
    }

    /// Frees the slots of writes up to `completed`.
    pub fn retire(&mut self, completed: u64) {
        while let Some(&(seq, end)) = self.inflight.front() {
            if seq > completed {
                break;
            }
            self.tail = end;
            self.inflight.pop_front();
        }
    }

    /// The oldest write still holding a slot.
    pub fn oldest(&self) -> Option<u64> {
        self.inflight.front().map(|&(seq, _)| seq)
    }

    /// Deregisters the ring here and now (counted by `pins`), then frees
    /// it: when the connection ends, once its QP is gone.
    pub fn release(self, pins: &Pins) {
        pins.release_here(self.mr);
        // The rest of `self`, `mem` with it, is dropped as this returns.
    }
}

/// Copies guest memory that the guest may be writing at the same time: with
/// relaxed atomic loads (plain loads on every target), as a data race with
/// non-atomic copies would be undefined behaviour. A torn page is fine: the
/// dirty log sends it again.
///
/// # Safety
/// `src..src + len` readable, `dst..dst + len` writable and not racing.
unsafe fn copy_racing(src: *const u8, dst: *mut u8, len: usize) {
    let mut i = 0;
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

#[cfg(test)]
mod tests {
    #[test]
    fn copy_racing_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..100u8).collect();
        for start in 0..9 {
            for len in [0, 1, 7, 8, 9, 50, 100 - start] {
                let mut dst = vec![0u8; len];
                unsafe { super::copy_racing(src.as_ptr().add(start), dst.as_mut_ptr(), len) };
                assert_eq!(dst, &src[start..start + len]);
            }
        }
    }
}
