//! A connection side's registrations under its budget: counted, refused or
//! made room for, and handed to the unregistration worker when dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::budget::{budget_for, refusal};
use super::fork::fork_mode;
use super::{PinAll, Unregistration};
use crate::engine::ram::RamBlocks;
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::host::{limits, GuestRange, RegisteredBuffer};
use crate::verbs::{Access, MemoryRegion, ProtectionDomain};
use crate::{Error, ErrorKind, Result};

/// One connection side's registrations, counted against its budget.
pub(crate) struct Pins {
    pd: Arc<ProtectionDomain>,
    budget: Option<u64>,
    counters: Arc<Counters>,
    /// `None`: deregistration happens inline, on the caller's thread.
    worker: Option<Arc<Unregistration>>,
    /// Bytes released to the worker and not yet deregistered (still pinned).
    releasing: Arc<AtomicU64>,
}

impl Pins {
    pub fn new(pd: Arc<ProtectionDomain>, config: &Config, counters: Arc<Counters>) -> Result<Pins> {
        let budget = budget_for(config);
        Counters::set(&counters.pin_budget, budget.unwrap_or(u64::MAX));
        Counters::set(&counters.cgroup_memory_limit, limits::cgroup_memory_limit().unwrap_or(u64::MAX));
        Counters::set(&counters.fork_mode, fork_mode() as u64);
        let worker = if config.unregister_worker { Some(Unregistration::get()?) } else { None };
        Ok(Pins { pd, budget, counters, worker, releasing: Arc::default() })
    }

    /// Bytes this side may keep registered (`None`: no limit).
    pub fn budget(&self) -> Option<u64> {
        self.budget
    }

    pub fn pinned(&self) -> u64 {
        self.counters.pinned_bytes.load(Ordering::Relaxed)
    }

    /// Whether `len` more bytes fit the budget now.
    pub fn fits(&self, len: u64) -> bool {
        self.budget.is_none_or(|b| self.pinned() + len <= b)
    }

    /// Whether `len` more bytes fit once what was released is deregistered.
    pub fn fits_after_release(&self, len: u64) -> bool {
        // `releasing` is part of `pinned` (the worker lowers it first), so this never wraps.
        self.budget.is_none_or(|b| self.pinned().saturating_sub(self.releasing.load(Ordering::Relaxed)) + len <= b)
    }

    /// The error for `len` more bytes that cannot fit the budget.
    pub fn over_budget(&self, len: u64) -> Error {
        Error::new(
            ErrorKind::PinBudget,
            format!(
                "{len} more bytes do not fit the pin budget of {} bytes with {} pinned",
                self.budget.unwrap_or(u64::MAX),
                self.pinned()
            ),
        )
    }

    /// Makes room for `len` more bytes (`what`, for the error): `PinBudget`
    /// if they do not fit even once what was released is deregistered, else
    /// waits for those deregistrations if they are needed.
    pub fn reserve(&self, len: u64, what: &str) -> Result<()> {
        if !self.fits_after_release(len) {
            return Err(Error::new(
                ErrorKind::PinBudget,
                format!("{what} needs {len} bytes pinned: {}", self.over_budget(len).message),
            ));
        }
        self.settle_for(len);
        Ok(())
    }

    /// Before registering `len` bytes that fit once what was released is
    /// deregistered: waits for those deregistrations if they are needed.
    pub fn settle_for(&self, len: u64) {
        if !self.fits(len) {
            self.settle();
        }
    }

    /// Registers guest memory, counted as pinned. A refusal by the kernel
    /// (ENOMEM, EPERM: memlock limit) is a `PinBudget` error, which callers
    /// answer by unpinning what they can, `settle`, and one retry (counted
    /// with `retried`).
    pub fn register_guest(&self, guest: &GuestRange, access: Access) -> Result<MemoryRegion> {
        let len = guest.len();
        let mr = guest.register(&self.pd, access).map_err(|e| refusal(e, len, self.pinned()))?;
        self.counters.pin(len);
        Ok(mr)
    }

    /// A buffer of `len` bytes of the library's own, registered and counted
    /// as pinned (refused as `register_guest`); give it back with
    /// `release_buffer`.
    pub fn register_buffer(&self, len: usize, access: Access) -> Result<RegisteredBuffer> {
        let buf = RegisteredBuffer::new(&self.pd, len, access).map_err(|e| refusal(e, len as u64, self.pinned()))?;
        self.counters.pin(buf.len() as u64);
        Ok(buf)
    }

    /// Deregisters a buffer of `register_buffer` here and now, then frees it.
    pub fn release_buffer(&self, buf: RegisteredBuffer) {
        self.counters.unpin(buf.release() as u64);
    }

    /// Counts a registration retried after the kernel refused it.
    pub fn retried(&self) {
        Counters::add(&self.counters.registration_retries, 1);
    }

    /// Drops a registration: on the worker if there is one, else here.
    pub fn release(&self, mr: MemoryRegion) {
        match &self.worker {
            Some(w) => {
                let bytes = mr.len() as u64;
                let (counters, releasing) = (self.counters.clone(), self.releasing.clone());
                Counters::add(&counters.unregister_queue_depth, 1);
                releasing.fetch_add(bytes, Ordering::Relaxed);
                w.release(mr, move || {
                    releasing.fetch_sub(bytes, Ordering::Relaxed);
                    counters.unpin(bytes);
                    counters.unregister_queue_depth.fetch_sub(1, Ordering::Relaxed);
                });
            }
            None => self.release_here(mr),
        }
    }

    /// Drops a registration on this thread (deregistered when this returns).
    pub fn release_here(&self, mr: MemoryRegion) {
        let bytes = mr.len() as u64;
        drop(mr);
        self.counters.unpin(bytes);
    }

    /// Waits until the registrations this side released are deregistered
    /// (the kernel counts them as pinned until then); the wait is counted.
    pub fn settle(&self) {
        let start = Instant::now();
        if self.wait_released() {
            Counters::add(&self.counters.pin_wait_ns, start.elapsed().as_nanos() as u64);
        }
    }

    /// Waits until every registration this side released is deregistered,
    /// so that no key of them lets the peer in any more; returns whether
    /// there were any left to wait for.
    pub fn wait_released(&self) -> bool {
        match (&self.worker, self.releasing.load(Ordering::Acquire) > 0) {
            (Some(w), true) => {
                w.flush();
                true
            }
            _ => false,
        }
    }

    /// Starts pin-all: every block of `ram` registered with `access` on a
    /// background thread (negotiation granted pin-all only if it fits the
    /// budget), pre-faulted on all CPUs but `spare_cpus`.
    pub fn pin_all(&self, ram: &RamBlocks, access: Access, spare_cpus: usize) -> Result<PinAll> {
        PinAll::start(self.pd.clone(), ram.clone(), access, spare_cpus, self.counters.clone())
    }

    /// The worker, for a handle that must keep it running after the engine stops.
    pub fn worker(&self) -> Option<Arc<Unregistration>> {
        self.worker.clone()
    }
}

/// A buffer of the library's own that the NIC writes into (post-copy's
/// staging and tables), registered within the pin budget; deregistered,
/// then freed, when dropped.
pub(crate) struct PinnedBuffer<'a> {
    buf: Option<RegisteredBuffer>,
    pins: &'a Pins,
}

impl<'a> PinnedBuffer<'a> {
    /// `len` bytes (`what`, for the error), zeroed, registered for local write.
    pub fn new(pins: &'a Pins, len: usize, what: &str) -> Result<PinnedBuffer<'a>> {
        pins.reserve(len.next_multiple_of(4096) as u64, what)?;
        Ok(PinnedBuffer { buf: Some(pins.register_buffer(len, Access::LOCAL_WRITE)?), pins })
    }
}

impl std::ops::Deref for PinnedBuffer<'_> {
    type Target = RegisteredBuffer;
    fn deref(&self) -> &RegisteredBuffer {
        self.buf.as_ref().expect("registered until dropped")
    }
}

impl std::ops::DerefMut for PinnedBuffer<'_> {
    fn deref_mut(&mut self) -> &mut RegisteredBuffer {
        self.buf.as_mut().expect("registered until dropped")
    }
}

impl Drop for PinnedBuffer<'_> {
    /// Deregistered here and now (a READ still in flight then fails rather
    /// than land in freed memory), then freed.
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pins.release_buffer(buf);
        }
    }
}
