//! The staging ring: a registered buffer for writes from chunks the source
//! does not pin (see `pin_would_copy`): their bytes are copied into the ring
//! and written from there, so the guest's untouched and shared pages stay
//! untouched and shared. A slot is reused once its write has completed.

use std::collections::VecDeque;

use crate::engine::pin::Pins;
use crate::host::{GuestRange, RegisteredBuffer};
use crate::verbs::{Access, Sge};
use crate::Result;

pub(super) struct Staging {
    /// Owns its memory, and is deregistered before it is freed, whether
    /// dropped or `release`d. With rdma-core's fork support on,
    /// `ibv_dereg_mr` madvises the range (MADV_DOFORK), which must not reach
    /// memory freed (and perhaps mapped anew) meanwhile.
    buf: RegisteredBuffer,
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
        let buf = pins.register_buffer(size as usize, Access::LOCAL_WRITE)?;
        Ok(Staging { buf, size, head: 0, tail: 0, inflight: VecDeque::new() })
    }

    /// Copies `guest` into the ring and returns where its bytes are, or
    /// `None` while the ring is too full (wait for the write of `oldest`).
    /// Record the write with `posted`.
    pub fn stage(&mut self, guest: GuestRange) -> Option<Sge> {
        let len = guest.len();
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
        guest.copy_to(&mut self.buf.bytes_mut()[at as usize..(at + len) as usize]);
        self.head = start + len;
        Some(self.buf.sge(at as usize, len as usize))
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
        pins.release_buffer(self.buf);
    }
}
