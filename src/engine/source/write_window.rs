//! The source's posted writes not known to be complete: how many and how
//! many bytes (held under in-flight limits), which of them are signalled
//! (one every so many: the rest complete silently), and the staging ring
//! whose slots they hold.

use std::collections::VecDeque;

use super::staging::Staging;
use crate::engine::pin::Pins;
use crate::host::GuestRange;
use crate::verbs::Sge;

/// Writes in flight at most (bytes and work requests): rxe collapses under deep queues.
const MAX_INFLIGHT_BYTES: u64 = 16 << 20;
const MAX_INFLIGHT_WRITES: usize = 256;
/// One write is signalled every this many writes or bytes; the rest complete
/// silently. The unsignalled tail therefore always fits under the limits above.
const SIGNAL_EVERY: u64 = 16;
const SIGNAL_EVERY_BYTES: u64 = MAX_INFLIGHT_BYTES / 4;

#[derive(Default)]
pub(super) struct WriteWindow {
    /// (sequence, bytes) of posted writes not known to be complete.
    inflight: VecDeque<(u64, u64)>,
    inflight_bytes: u64,
    signalled: VecDeque<u64>,
    /// Writes and bytes posted since the last signalled write.
    unsignalled: (u64, u64),
    /// Writes from chunks that are not pinned go through here (made on first use).
    staging: Option<Staging>,
}

/// What a write waits for to go on: a signalled write's completion, or
/// (none is signalled after what it needs) a fence.
pub(super) enum Wait {
    Write(u64),
    Fence,
}

impl WriteWindow {
    /// Whether the next write, of `len` bytes, is to be signalled.
    pub fn signals(&self, len: u64) -> bool {
        self.unsignalled.0 + 1 >= SIGNAL_EVERY || self.unsignalled.1 + len >= SIGNAL_EVERY_BYTES
    }

    /// Write `seq` of `len` bytes was posted, `signalled` or not, from the
    /// staging ring (`staged`: the bytes staged last) or not.
    pub fn posted(&mut self, seq: u64, len: u64, signalled: bool, staged: bool) {
        if signalled {
            self.unsignalled = (0, 0);
            self.signalled.push_back(seq);
        } else {
            self.unsignalled = (self.unsignalled.0 + 1, self.unsignalled.1 + len);
        }
        if let (true, Some(staging)) = (staged, &mut self.staging) {
            staging.posted(seq);
        }
        self.inflight.push_back((seq, len));
        self.inflight_bytes += len;
    }

    /// Forgets the writes up to `completed`.
    pub fn retire(&mut self, completed: u64) {
        if let Some(staging) = &mut self.staging {
            staging.retire(completed);
        }
        while let Some(&(seq, bytes)) = self.inflight.front() {
            if seq > completed {
                break;
            }
            self.inflight.pop_front();
            self.inflight_bytes -= bytes;
        }
        while self.signalled.front().is_some_and(|&s| s <= completed) {
            self.signalled.pop_front();
        }
    }

    /// The signalled write to wait for before a write of `len` bytes fits
    /// under the in-flight limits, if it does not fit now. With no signalled
    /// write outstanding only the short unsignalled tail is in flight: it fits.
    pub fn wait_for_room(&self, len: u64) -> Option<u64> {
        let fits = self.inflight.len() < MAX_INFLIGHT_WRITES && self.inflight_bytes + len <= MAX_INFLIGHT_BYTES;
        self.signalled.front().copied().filter(|_| !fits)
    }

    pub fn has_staging(&self) -> bool {
        self.staging.is_some()
    }

    pub fn set_staging(&mut self, staging: Staging) {
        self.staging = Some(staging);
    }

    /// Copies `guest` into the staging ring (made first: `set_staging`):
    /// where its bytes are, or what to wait for while the ring is full.
    pub fn stage(&mut self, guest: GuestRange) -> Result<Sge, Option<Wait>> {
        let staging = self.staging.as_mut().expect("the staging ring is made before its first use");
        if let Some(sge) = staging.stage(guest) {
            return Ok(sge);
        }
        let Some(oldest) = staging.oldest() else { return Err(None) };
        Err(Some(match self.signalled.iter().find(|&&s| s >= oldest) {
            Some(&s) => Wait::Write(s),
            None => Wait::Fence,
        }))
    }

    /// Deregisters the staging ring (when the connection ends, once its QP is gone).
    pub fn release(self, pins: &Pins) {
        if let Some(staging) = self.staging {
            staging.release(pins);
        }
    }
}
