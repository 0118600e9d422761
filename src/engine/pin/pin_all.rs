//! Pin-all that scales: whole RAM blocks registered on a background thread
//! that starts at connect, overlapping the RAM-blocks exchange. Each block
//! is first pre-faulted by several threads (`prefault`: allocating and
//! zeroing pages is most of a registration's cost), then registered in one
//! `ibv_reg_mr` (one key per block, as the protocol wants), which then only
//! walks present pages.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use parking_lot::Mutex;

use crate::engine::pagemap::page_size;
use crate::engine::ram::RamBlocks;
use crate::engine::stats::Counters;
use crate::verbs::{Access, MemoryRegion, ProtectionDomain};
use crate::{Error, ErrorKind, Result};

/// Bytes one pre-faulting thread takes at a time: one `madvise`, which holds the
/// process's mmap lock for reading throughout, so every mmap or munmap of the
/// process (a thread's start included) waits for it. 4 MiB take about 2.5 ms
/// on rxe's TCG guest; with 64 MiB (32 ms) the second thread often could not
/// start until the first had done nearly all.
const PIECE: u64 = 4 << 20;
/// Pre-faulting threads at most.
const MAX_THREADS: usize = 8;

/// Where the pin-all thread leaves its result.
#[derive(Default)]
struct Slot {
    result: Option<Result<Vec<MemoryRegion>>>,
    /// Nobody will take the result: the thread drops it itself.
    abandoned: bool,
}

/// Registrations of whole blocks under way; `wait` for them. Dropped
/// unfinished, the registrations are dropped (and uncounted) when done.
pub(crate) struct PinAll {
    slot: Arc<Mutex<Slot>>,
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
        let slot = Arc::new(Mutex::new(Slot::default()));
        let (theirs, counting) = (slot.clone(), counters.clone());
        thread::Builder::new()
            .name("rdmamig-pinall".into())
            .spawn(move || {
                let result = ram
                    .blocks()
                    .iter()
                    .map(|b| {
                        prefault(b.host, b.length, spare_cpus, &counting);
                        // SAFETY: the hypervisor keeps registered blocks mapped for the connection's life.
                        let mr = unsafe { pd.register(b.host_ptr(0), b.length as usize, access) }
                            .map_err(|e| super::refusal(e, b.length, counting.pinned_bytes.load(Ordering::Relaxed)))?;
                        counting.pin(b.length);
                        Ok(mr)
                    })
                    .collect();
                let mut slot = theirs.lock();
                if slot.abandoned {
                    release(result, &counting);
                } else {
                    slot.result = Some(result);
                }
            })
            .map_err(|e| Error::new(ErrorKind::State, format!("cannot start the pin-all thread: {e}")))?;
        Ok(PinAll { slot, counters })
    }

    /// The registrations, one per block, once all are done; gives up when `stop` is set.
    pub fn wait(self, stop: &AtomicBool) -> Result<Vec<MemoryRegion>> {
        loop {
            if let Some(result) = self.slot.lock().result.take() {
                return result;
            }
            if stop.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Aborted, "aborted while pinning all guest RAM"));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PinAll {
    fn drop(&mut self) {
        let mut slot = self.slot.lock();
        match slot.result.take() {
            Some(result) => release(result, &self.counters),
            None => slot.abandoned = true,
        }
    }
}

/// Deregisters registrations nobody took, and uncounts them.
fn release(result: Result<Vec<MemoryRegion>>, counters: &Counters) {
    for mr in result.into_iter().flatten() {
        let bytes = mr.len() as u64;
        drop(mr);
        counters.unpin(bytes);
    }
}

/// Populates `len` bytes at `host` for writing, in pieces on as many threads
/// as there are CPUs but `spare_cpus`. Best effort: a kernel without
/// MADV_POPULATE_WRITE (before 5.14) leaves the faulting to the registration itself.
fn prefault(host: usize, len: u64, spare_cpus: usize, counters: &Counters) {
    let page = page_size();
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
                    if i >= pieces {
                        return;
                    }
                    let start = host as u64 + i * PIECE;
                    let end = (start + PIECE).min(host as u64 + len);
                    // madvise wants page-aligned ranges; the pages around the block's ends are mapped too.
                    let aligned = start & !(page - 1);
                    let span = (end - aligned).next_multiple_of(page);
                    // SAFETY: populating neither changes memory contents nor the mapping.
                    unsafe { libc::madvise(aligned as *mut libc::c_void, span as usize, libc::MADV_POPULATE_WRITE) };
                    Counters::add(&counters.pin_all_progress_bytes, end - start);
                }
            });
        }
    });
}
