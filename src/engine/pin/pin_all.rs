//! Pin-all that scales: whole RAM blocks registered on a background thread
//! that starts at connect, overlapping the RAM-blocks exchange. Each block
//! is first pre-faulted by several threads (`prefault`: allocating and
//! zeroing pages is most of a registration's cost), then registered in one
//! `ibv_reg_mr` (one key per block, as the protocol wants), which then only
//! walks present pages.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::engine::ram::RamBlocks;
use crate::engine::stats::Counters;
use crate::host::GuestRange;
use crate::verbs::{Access, MemoryRegion, ProtectionDomain};
use crate::{Error, ErrorKind, Result};

/// Bytes one pre-faulting thread takes at a time: one `madvise`, which holds the
/// process's mmap lock for reading throughout, so every mmap or munmap of the
/// process (a thread's start included) waits for it: the piece bounds that
/// wait. With 64 MiB pieces the second thread often could not start until
/// the first had done nearly all (docs/benchmarks.md).
const PIECE: u64 = 4 << 20;
/// Pre-faulting threads at most.
const MAX_THREADS: usize = 8;

/// The registrations of every block, one each, or why not.
type Registered = Result<Vec<MemoryRegion>>;

/// Registrations of whole blocks under way; `wait` for them. Dropped
/// unfinished, it stops the thread (before its next 4 MiB piece, or once
/// the block it is registering is done) and waits for it, then drops the
/// registrations: nothing of it touches the guest's RAM after the
/// connection's end, when the hypervisor may unmap it.
pub(crate) struct PinAll {
    /// Where the thread leaves its result, and its signal that it did.
    result: Arc<(Mutex<Option<Registered>>, Condvar)>,
    /// Nobody will take the result: the thread stops.
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl PinAll {
    /// Starts registering every block of `ram` with `access`, pre-faulting
    /// on all CPUs but `spare_cpus`; progress goes to
    /// `counters.pin_all_progress_bytes`, the registrations to `pinned_bytes`.
    pub fn start(
        pd: Arc<ProtectionDomain>,
        ram: RamBlocks,
        access: Access,
        spare_cpus: usize,
        counters: Arc<Counters>,
    ) -> Result<PinAll> {
        let (result, cancel) = (Arc::new((Mutex::new(None), Condvar::new())), Arc::new(AtomicBool::new(false)));
        let (theirs, cancelled, counting) = (result.clone(), cancel.clone(), counters.clone());
        let thread = thread::Builder::new()
            .name("rdmamig-pinall".into())
            .spawn(move || {
                let mut mrs = Vec::with_capacity(ram.len());
                for b in ram.blocks() {
                    prefault(b.range(0, b.length), spare_cpus, &cancelled, &counting);
                    if cancelled.load(Ordering::Relaxed) {
                        break; // the result is dropped unread
                    }
                    match b.range(0, b.length).register(&pd, access) {
                        Ok(mr) => {
                            counting.pin(b.length);
                            mrs.push(mr);
                        }
                        Err(e) => {
                            let refused =
                                super::budget::refusal(e, b.length, counting.pinned_bytes.load(Ordering::Relaxed));
                            release(Ok(mrs), &counting);
                            *theirs.0.lock() = Some(Err(refused));
                            theirs.1.notify_all();
                            return;
                        }
                    }
                }
                *theirs.0.lock() = Some(Ok(mrs));
                theirs.1.notify_all();
            })
            .map_err(|e| Error::new(ErrorKind::State, format!("cannot start the pin-all thread: {e}")))?;
        Ok(PinAll { result, cancel, thread: Some(thread), counters })
    }

    /// The registrations, one per block, once all are done; gives up when `stop` is set.
    pub fn wait(self, stop: &AtomicBool) -> Result<Vec<MemoryRegion>> {
        let (result, done) = &*self.result;
        let mut slot = result.lock();
        loop {
            if let Some(result) = slot.take() {
                return result;
            }
            if stop.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Aborted, "aborted while pinning all guest RAM"));
            }
            // Woken as soon as the result is in (a 10 ms poll cost each side
            // 5 ms on average); `stop` has no signal.
            done.wait_for(&mut slot, Duration::from_millis(10));
        }
    }
}

impl Drop for PinAll {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(result) = self.result.0.lock().take() {
            release(result, &self.counters);
        }
    }
}

/// Pin-all of `ram` as a connection runs it, from its start to its last
/// registration (`rdmamig::bench_internals`, for
/// `examples/registration_bench.rs`).
#[cfg(feature = "rdma-tests")]
pub fn pin_all_blocks(
    pd: Arc<ProtectionDomain>,
    ram: &RamBlocks,
    access: Access,
    spare_cpus: usize,
) -> Result<Vec<MemoryRegion>> {
    PinAll::start(pd, ram.clone(), access, spare_cpus, Arc::default())?.wait(&AtomicBool::new(false))
}

/// Deregisters registrations nobody took, and uncounts them.
fn release(result: Result<Vec<MemoryRegion>>, counters: &Counters) {
    for mr in result.into_iter().flatten() {
        let bytes = mr.len() as u64;
        drop(mr);
        counters.unpin(bytes);
    }
}

/// Populates `guest` for writing (`GuestRange::populate_write`), in pieces
/// on as many threads as there are CPUs but `spare_cpus`, until `cancel` is
/// set.
fn prefault(guest: GuestRange, spare_cpus: usize, cancel: &AtomicBool, counters: &Counters) {
    let len = guest.len();
    let pieces = len.div_ceil(PIECE);
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cpus.saturating_sub(spare_cpus).clamp(1, MAX_THREADS).min(pieces as usize);
    let next = AtomicU64::new(0);
    // No thread populates before all have started: a thread's start maps its
    // stack and signal stack (the mmap lock again).
    let started = Barrier::new(threads);
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                started.wait();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= pieces || cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    let start = i * PIECE;
                    let n = PIECE.min(len - start);
                    guest.sub(start, n).populate_write();
                    Counters::add(&counters.pin_all_progress_bytes, n);
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::guest::testing::Mapping;
    use crate::host::pagemap::{entries, page_size, PM_PRESENT};

    /// Pages present in a fresh mapping of three pieces after `prefault`
    /// with `cancel` as given, and the progress it counted.
    fn prefaulted(cancelled: bool) -> (u64, u64) {
        let len = 3 * PIECE;
        let mem = Mapping::anonymous(len);
        let counters = Counters::default();
        prefault(mem.range(), 0, &AtomicBool::new(cancelled), &counters);
        let ptr = mem.range().addr() as *const u8;
        let present = entries(ptr, len / page_size(), PM_PRESENT).iter().filter(|&&e| e != 0).count();
        (present as u64, counters.pin_all_progress_bytes.load(Ordering::Relaxed))
    }

    #[test]
    fn prefault_populates_every_page_unless_cancelled() {
        let len = 3 * PIECE;
        assert_eq!(prefaulted(false), (len / page_size(), len));
        assert_eq!(prefaulted(true), (0, 0));
    }
}
