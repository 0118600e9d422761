//! Post-copy over RDMA READ (rdmamig extension, issue 13).
//!
//! After its last pre-copy window, with the guest stopped, the source calls
//! [`Source::postcopy`](crate::engine::Source::postcopy) with the pages the
//! destination does not have right (dirtied since sent, or never sent). Its
//! transfer thread registers the 2 MiB windows of the blocks that hold stale
//! pages for remote read (regions, `source::regions`: registering memory
//! backs every page of it, and a guest's never-touched memory should stay
//! so; within its pin budget, or it refuses), sets up a second queue pair
//! for the destination's fault reads (`link::fault_qp`), registers each
//! block's table (its stale bitmap and regions) for remote read too, sends
//! one POSTCOPY request (where each block's table is, `wire::PostcopyBlock`)
//! and keeps the memory registered, which the caller must keep mapped and
//! unchanged, until the destination's POSTCOPY_DONE (or the connection's
//! end). The tables are read rather than sent: one message holds the bitmap
//! of about 16 GiB of guest RAM, and post-copy is for large guests.
//!
//! The destination's service thread takes the POSTCOPY message and becomes
//! the post-copy thread (`destination`): it reads and checks the tables
//! (`plan`, `wire::postcopy_table`), then opens a userfaultfd
//! itself, registers the blocks with stale pages in MISSING mode and drops the
//! stale pages (`MADV_REMOVE` from shared memory, `MADV_DONTNEED` from private
//! anonymous memory), so the next touch of one faults. It waits until every
//! registration the source could write into (released to the unregistration
//! worker when POSTCOPY came) is deregistered: from then on no key the
//! source was given opens this side's memory to its writes (the recovery
//! connection, made on the same protection domain, finds none either). Then the
//! hypervisor's [`Destination::wait_postcopy`](crate::engine::Destination::wait_postcopy)
//! returns and its vCPUs may run. The one thread serves faults first (a
//! 4 KiB RDMA READ on the fault QP into a registered staging slot, then
//! `UFFDIO_COPY`, which wakes the faulting threads) and pulls the rest in
//! the background (reads
//! of up to 64 KiB, a few in flight; the windows of recent faults and the
//! ones after them first, then in address order; the `installer` thread
//! installs their pages). `UFFDIO_COPY` never overwrites: a page
//! already present (a fault installed it, or the guest wrote it after its
//! fault) makes it fail with EEXIST, and that page is skipped. When no stale
//! page is left it closes the userfaultfd and answers POSTCOPY_DONE.
//!
//! Why the library registers the userfaultfd: it alone knows the stale set
//! when the message arrives, and a VMM whose own process maps guest RAM
//! (cloud-hypervisor-like, anonymous or memfd; or a test) needs nothing
//! else. Another process mapping the same (shared) memory, a vhost-user
//! backend, has a userfaultfd of its own, which the VMM reads, as QEMU's
//! postcopy arranges: it passes the faults on with
//! [`Destination::postcopy_fetch`](crate::engine::Destination::postcopy_fetch)
//! (`Fetches`: served as faults are) and wakes the backend's thread when
//! that returns. Not supported: hugetlbfs (4 KiB installs), and a VMM
//! handing over its own userfaultfd.
//!
//! Failure: the post-copy thread stops, the connection's error is stored
//! (`Destination::error`, its event fd becomes readable, `wait_postcopy`
//! fails), and it never installs a page it did not read from the source.
//! Then the threads blocked on a stale page are released: the post-copy
//! blocks become PROT_NONE and the waiters are woken, so they (and any later
//! access) get SIGSEGV, which the hypervisor handles by pausing the vCPU
//! (`destination::Blocked`). Closing the userfaultfd instead would let them
//! run on zero-filled pages; SIGBUS through `UFFDIO_POISON` needs Linux 6.6.

pub(crate) mod destination;
mod installer;
pub(crate) mod plan;
pub(crate) mod source;

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;

use std::time::Duration;

use parking_lot::Mutex;

use crate::host::wake::EventFd;

use crate::engine::Config;
use crate::wire::PostcopyRecovery;
use crate::{Error, ErrorKind, Result};

pub use crate::wire::PostcopySummary;

/// The stale pages of one block, for [`Source::postcopy`](crate::engine::Source::postcopy):
/// bit `i % 64` of `bitmap[i / 64]` set means page `i` (4 KiB,
/// [`wire::POSTCOPY_PAGE_SIZE`](crate::wire::POSTCOPY_PAGE_SIZE)) of block
/// `block` must be read from the source. Blocks not listed have none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StalePages {
    pub block: u32,
    pub bitmap: Vec<u64>,
}

/// Where a destination's post-copy is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PostcopyPhase {
    /// No POSTCOPY message yet.
    Idle = 0,
    /// The stale pages are dropped and faults are served: vCPUs may run.
    Running = 1,
    /// Every stale page is installed; POSTCOPY_DONE was sent.
    Done = 2,
}

/// A destination's post-copy progress ([`Destination::postcopy_progress`](crate::engine::Destination::postcopy_progress)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostcopyProgress {
    pub phase: PostcopyPhase,
    /// Stale pages announced by the source.
    pub pages_total: u64,
    /// Stale pages not installed yet.
    pub pages_remaining: u64,
    /// Faults served with a read of their own.
    pub faults_served: u64,
    /// Stale pages found present when they were to be installed (the guest
    /// or another install got there first): skipped, never overwritten.
    pub pages_skipped: u64,
    /// Bytes read from the source.
    pub bytes_pulled: u64,
    /// Lost connections post-copy got back (`Config::postcopy_recovery`).
    pub recoveries: u64,
}

/// The live counters behind [`PostcopyProgress`], updated by the post-copy thread.
#[derive(Default)]
pub(crate) struct Progress {
    phase: AtomicU8,
    pages_total: AtomicU64,
    pages_remaining: AtomicU64,
    faults_served: AtomicU64,
    pages_skipped: AtomicU64,
    bytes_pulled: AtomicU64,
    recoveries: AtomicU64,
}

impl Progress {
    pub fn snapshot(&self) -> PostcopyProgress {
        let phase = match self.phase.load(Ordering::Acquire) {
            0 => PostcopyPhase::Idle,
            1 => PostcopyPhase::Running,
            _ => PostcopyPhase::Done,
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PostcopyProgress {
            phase,
            pages_total: get(&self.pages_total),
            pages_remaining: get(&self.pages_remaining),
            faults_served: get(&self.faults_served),
            pages_skipped: get(&self.pages_skipped),
            bytes_pulled: get(&self.bytes_pulled),
            recoveries: get(&self.recoveries),
        }
    }

    pub(crate) fn set_phase(&self, p: PostcopyPhase) {
        self.phase.store(p as u8, Ordering::Release);
    }
}

/// How a destination's post-copy gets a lost connection back: its own
/// config (`postcopy_recovery`, the window) and where its source listens
/// (POSTCOPY_RECOVERY).
pub(crate) struct Recovery<'a> {
    pub config: &'a Config,
    pub window: Duration,
    pub source: PostcopyRecovery,
}

/// Whether a post-copy connection that failed with `e` may be got back:
/// the transport failed or the peer went silent; not the peer's ERROR, nor
/// the hypervisor's abort, nor a malformed message or a local fault.
pub(crate) fn recoverable(e: &Error) -> bool {
    matches!(e.kind, ErrorKind::Disconnected | ErrorKind::Verbs | ErrorKind::Timeout)
}

/// Pages the hypervisor asks for before anything here faults on them
/// ([`Destination::postcopy_fetch`](crate::engine::Destination::postcopy_fetch)),
/// handed to the post-copy thread, which watches `wake`.
pub(crate) struct Fetches {
    queue: Mutex<Vec<Fetch>>,
    /// Requests pushed since the last `take`: spares the post-copy loop a
    /// system call and a lock per pass when there are none (nearly always).
    queued: AtomicUsize,
    wake: EventFd,
}

/// One request: `len` bytes at host address `addr`; `done` gets `()` once
/// none of its pages is stale (dropped unanswered if post-copy fails).
pub(crate) struct Fetch {
    pub addr: u64,
    pub len: u64,
    pub done: SyncSender<()>,
}

impl Fetches {
    pub fn new() -> Result<Fetches> {
        Ok(Fetches { queue: Mutex::new(Vec::new()), queued: AtomicUsize::new(0), wake: EventFd::new()? })
    }

    /// Queue, signal, then count: a signal `take` has not drained belongs to
    /// a request counted after it, so the eventfd never stays readable with
    /// nothing counted (the loop would spin).
    pub fn push(&self, fetch: Fetch) {
        self.queue.lock().push(fetch);
        self.wake.signal();
        self.queued.fetch_add(1, Ordering::Release);
    }

    /// Moves the requests queued so far into `into`: the count is reset
    /// first, then the eventfd, then the queue is taken, so a request whose
    /// signal this drains is in the queue taken.
    fn take(&self, into: &mut Vec<Fetch>) {
        if self.queued.load(Ordering::Acquire) == 0 {
            return;
        }
        self.queued.store(0, Ordering::SeqCst);
        self.wake.drain();
        into.append(&mut self.queue.lock());
    }

    fn fd(&self) -> RawFd {
        self.wake.fd()
    }
}
