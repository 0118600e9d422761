//! The destination's post-copy, on its service thread (which owns the
//! connection and so its completion queue): one loop serves faults first and
//! pulls the remaining stale pages in the background, around recent faults
//! first.
//!
//! Faults jump the queue: a fault's 4 KiB READ is posted as soon as its
//! message is read, on the fault QP (`link::fault_qp`, when the source set
//! one up), so it does not wait behind the background reads, which a
//! responder serves in order on the connection's QP; at most `PULL_DEPTH`
//! of those, of up to `PULL_PAGES` pages, are in flight, and after a fault
//! at most one, of `TRICKLE_PAGES` (`PULL_HOLD`, `PULL_TRICKLE`): on rxe posting a read costs
//! the posting thread most of the read. One thread serves faults and posts
//! the pull, rather than a fault thread and a puller: the completions of
//! both QPs arrive on the connection's one CQ, which only its owner polls;
//! the `installer` thread installs the pull's pages.

use std::collections::{HashSet, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::{self, Receiver, Sender};

mod installer;
pub(crate) mod plan;

use crate::bitmap::{self, next_clear, next_set};
use crate::engine::link::{self, protocol_error, Link};
use crate::engine::pin::{PinnedBuffer, Pins};
use crate::engine::postcopy;
use crate::engine::postcopy::{Fetch, Fetches, PostcopyLink, PostcopyPhase, Progress, Recovery};
use crate::host::pagemap::page_size;
use crate::host::uffd::{Installed, Userfault};
use crate::host::wake::{self, EventFd};
use crate::host::GuestRange;
use crate::logging;
use crate::verbs::Sge;
use crate::wire::{CommandType, PostcopySummary, QpEndpoint, POSTCOPY_PAGE_SIZE};
use crate::{Error, ErrorKind, Result};
use installer::{Done, Job};
use plan::{read_tables, PlanBlock};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const PAGE: u64 = POSTCOPY_PAGE_SIZE;
/// Pages per background read (64 KiB).
const PULL_PAGES: u64 = 16;
/// Background reads in flight at most.
const PULL_DEPTH: usize = 4;
/// Pull slots: the reads in flight, and completed ones being installed.
const PULL_SLOTS: usize = PULL_DEPTH + 2;
/// Fault reads in flight at most (more faults queue).
const FAULT_SLOTS: usize = 16;
/// After a fault, background reads are held back this long (at most one in
/// flight): a vCPU that faulted faults again soon, and on rxe posting a
/// read costs the posting thread most of the read, which a fault then waits for.
const PULL_HOLD: Duration = Duration::from_millis(2);
/// While held back, one background read at most this often, so that the
/// pull progresses under a steady stream of faults.
const PULL_TRICKLE: Duration = Duration::from_millis(20);
/// Pages per background read while held back (16 KiB): a fault that comes
/// while the thread posts one waits a quarter as long (the fault p99 against
/// full 64 KiB reads: docs/benchmarks.md); the pull gains a quarter as much
/// while faults keep coming.
const TRICKLE_PAGES: u64 = 4;
/// Present pages between two stale ones that a background read reads
/// along rather than split in two (a read costs about that much more than
/// a page on rxe and on hardware NICs alike).
const MERGE_GAP: u64 = 4;
/// How long the loop polls for the next fault after serving one, at most
/// (`spin`): waking the sleeping thread costs about as much as a fault's
/// read on rxe (docs/benchmarks.md).
const SPIN_MAX: Duration = Duration::from_micros(500);
/// Windows remembered around recent faults.
const HOT_WINDOWS: usize = 16;
/// Between two recovery connection attempts (the link may still be down).
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);
/// Read tags: pull slot `i` is `i`, fault slot `j` is `FAULT_TAG + j`.
const FAULT_TAG: u64 = 1 << 16;

/// The registered staging buffer the READs land in: `PULL_SLOTS` pull
/// slots, then `FAULT_SLOTS` pages.
struct Staging<'a>(PinnedBuffer<'a>);

impl<'a> Staging<'a> {
    fn new(pins: &'a Pins) -> Result<Staging<'a>> {
        let len = PULL_SLOTS as u64 * PULL_PAGES * PAGE + FAULT_SLOTS as u64 * PAGE;
        Ok(Staging(PinnedBuffer::new(pins, len as usize, "post-copy's staging buffer")?))
    }

    fn pull_slot(&self, i: usize) -> u64 {
        i as u64 * PULL_PAGES * PAGE
    }

    fn fault_slot(&self, j: usize) -> u64 {
        PULL_SLOTS as u64 * PULL_PAGES * PAGE + j as u64 * PAGE
    }

    fn sge(&self, at: u64, len: u64) -> Sge {
        self.0.sge(at as usize, len as usize)
    }

    /// The address of staging offset `at`, for UFFDIO_COPY to read.
    fn addr(&self, at: u64) -> u64 {
        self.0.addr(at as usize)
    }
}

struct Pull {
    block: usize,
    first: u64,
    pages: u64,
}

struct Puller<'a> {
    blocks: Vec<PlanBlock>,
    uffd: &'a Userfault,
    /// The userfaultfd is the hypervisor's: it reads the faults and forwards
    /// them as fetches, which then also place the pages that are not stale.
    hypervisors: bool,
    /// Outlives the installer thread, which reads it (declared before the thread scope).
    staging: &'a Staging<'a>,
    progress: &'a Progress,
    remaining: u64,
    /// Next page the background pull looks at: (block, page).
    cursor: (usize, u64),
    /// Windows (block, window) to pull before the cursor's, newest first:
    /// each fault's and the one after it (guests touch memory in runs).
    hot: VecDeque<(usize, u64)>,
    /// Busy pull slots: read in flight, or (`installing`) handed to the installer.
    pulls: [Option<Pull>; PULL_SLOTS],
    installing: [bool; PULL_SLOTS],
    installer: Sender<Job>,
    installed: Receiver<Done>,
    /// Signalled by the installer after each result (in the epoll set `pump` watches).
    installer_wake: &'a EventFd,
    faults: [Option<(usize, u64)>; FAULT_SLOTS],
    queued: VecDeque<(usize, u64)>,
    /// Pages with a fault read in flight or queued.
    faulting: HashSet<(usize, u64)>,
    done: Vec<u64>,
    addrs: Vec<u64>,
    /// When the last fault was read, and the last pull posted (`post_pulls`).
    last_fault: Option<Instant>,
    last_pull: Option<Instant>,
    /// When the last fault's page was installed, and how long after that
    /// the next fault came (the last time one did): how long `spin` polls.
    last_served: Option<Instant>,
    refault: Duration,
    /// Pages announced stale (never cleared): a fault on a page outside it is a zero page.
    announced: Vec<Vec<u64>>,
    /// The hypervisor's requests, and those not answered yet.
    fetches: &'a Fetches,
    pending: Vec<Fetch>,
}

/// Drops the stale pages of `guest` (inside a block; the guest does not run
/// yet, and the source rewrites these pages), so that the next touch faults
/// (`GuestRange::discard`). hugetlbfs fails on 4 KiB runs: refused.
fn discard(guest: GuestRange) -> Result<()> {
    guest.discard().map_err(|(remove, dontneed)| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "post-copy cannot drop stale guest pages (needs private anonymous or shared 4 KiB-page memory, not \
                 mlocked, not hugetlbfs): madvise(MADV_REMOVE): {remove}, madvise(MADV_DONTNEED): {dontneed}"
            ),
        )
    })
}

/// The userfaultfd of a post-copy and the blocks it covers. Dropped before
/// post-copy completed (it failed, or the service thread panicked), it
/// releases the threads blocked on missing pages: see the `Drop` impl.
pub(crate) struct Blocked {
    uffd: Option<Userfault>,
    /// Each block here, and where it lies for the userfaultfd.
    spans: Vec<(GuestRange, u64)>,
    /// `Config::postcopy_keep_blocked`: on failure, release nobody.
    keep_blocked: bool,
}

impl Blocked {
    /// Every stale page is in place: closing the library's userfaultfd
    /// unregisters the blocks, and a page missing now is one nobody wrote
    /// (zero-filled). The hypervisor's stays registered through its own
    /// descriptor, for it to close.
    fn completed(mut self) {
        drop(self.uffd.take());
    }
}

impl Drop for Blocked {
    /// The failure release (unless `keep_blocked`, see below): every
    /// post-copy block becomes PROT_NONE, then
    /// every thread waiting on the userfaultfd is woken. A woken thread
    /// retries its access and gets SIGSEGV (SEGV_ACCERR) at the address (in
    /// KVM, KVM_RUN fails with EFAULT); later accesses get it at once. So no
    /// vCPU stays blocked and none runs on a page the source never sent.
    /// mprotect before the wake: it takes the mmap lock for writing, so a
    /// thread that passed the access check before it has queued itself on
    /// the userfaultfd by then, and the wake reaches it. The userfaultfd
    /// stays open (leaked): were a block made accessible again, a missing
    /// page would block rather than read as zero. Only this process's
    /// mappings are protected: a hypervisor whose userfaultfd is another
    /// process's stops its vCPUs itself (its fetches fail).
    ///
    /// With `keep_blocked` nothing is released: the blocked threads stay
    /// blocked, and so does any later touch of a missing page, for the
    /// hypervisor to stop the VM. The userfaultfd (the library's own, or its
    /// duplicate of the hypervisor's) is leaked too: the blocks stay
    /// registered even if the hypervisor closes its descriptor.
    fn drop(&mut self) {
        let Some(uffd) = self.uffd.take() else { return };
        if self.keep_blocked {
            uffd.leak();
            logging::error(format_args!(
                "destination: post-copy failed: threads blocked on the missing pages of its {} guest RAM blocks \
                 stay blocked (keep-blocked): stop the VM",
                self.spans.len()
            ));
            return;
        }
        for (span, uffd_addr) in &self.spans {
            // Only the block's protection changes (the library never touches it again).
            if let Err(e) = span.protect_none() {
                // Woken, its threads would only fault and block again.
                logging::error(format_args!(
                    "destination: post-copy failure: mprotect(PROT_NONE) of a block: {e}: threads blocked on it \
                     stay blocked"
                ));
                continue;
            }
            if let Err(e) = uffd.wake(*uffd_addr, span.len()) {
                logging::error(format_args!("destination: post-copy failure: waking blocked threads: {e}"));
            }
        }
        uffd.leak();
        logging::error(format_args!(
            "destination: post-copy failed: its {} guest RAM blocks are PROT_NONE, threads blocked on them are \
             woken (SIGSEGV): stop the VM",
            self.spans.len()
        ));
    }
}

/// Runs post-copy to the end: registers a userfaultfd of the library's own
/// (or, given the hypervisor's, `supplied`, checks that it covers the
/// blocks), discards the stale pages, waits until the registrations released to the
/// unregistration worker (the source's, at POSTCOPY) are deregistered, calls
/// `running` (the vCPUs may run from then on), serves
/// faults and pulls every stale page. The userfaultfd is kept in `blocked`
/// while it runs: on failure it stays there, for the caller to drop (the
/// release of blocked threads) once the failure is reported.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    link: &mut Link,
    pins: &Pins,
    mut blocks: Vec<PlanBlock>,
    progress: &Progress,
    fetches: &Fetches,
    running: &dyn Fn(),
    blocked: &mut Option<Blocked>,
    recovery: Option<Recovery>,
    supplied: Option<Userfault>,
    keep_blocked: bool,
) -> Result<PostcopySummary> {
    let host_page = page_size();
    if host_page != PAGE {
        return Err(Error::new(ErrorKind::InvalidArgument, format!("post-copy needs 4 KiB pages, not {host_page}")));
    }
    read_tables(link, pins, &mut blocks)?;
    let spans = blocks.iter().map(|b| (b.guest, b.uffd_addr)).collect();
    let hypervisors = supplied.is_some();
    let uffd = match supplied {
        Some(uffd) => uffd,
        None => Userfault::new()?,
    };
    let uffd = blocked.insert(Blocked { uffd: Some(uffd), spans, keep_blocked }).uffd.as_ref().expect("just set");
    let total: u64 = blocks.iter().map(|b| b.source.stale_pages).sum();
    for b in &blocks {
        if hypervisors {
            // Before the drop: an unregistered block would read zeros.
            uffd.check_registered(b.uffd_addr, PAGE)?;
        } else {
            uffd.register(&b.guest)?;
        }
        let pages = b.length / PAGE;
        let mut i = 0;
        while let Some(first) = next_set(&b.stale, i, pages) {
            let end = next_clear(&b.stale, first, pages);
            discard(b.guest.sub(first * PAGE, (end - first) * PAGE))?;
            i = end;
        }
    }
    let staging = Staging::new(pins)?;
    // The fence: the registrations the source wrote into, released when
    // POSTCOPY came, must all be deregistered before the guest runs, or a
    // key still valid (pin-all's cover whole blocks) would let the source
    // overwrite pages the guest has changed. The worker got on with them
    // while the tables were read and the stale pages dropped.
    let fence = Instant::now();
    pins.wait_released();
    let fenced = fence.elapsed();
    progress.pages_total.store(total, Ordering::Relaxed);
    progress.pages_remaining.store(total, Ordering::Relaxed);
    progress.set_phase(PostcopyPhase::Running);
    logging::info(format_args!(
        "destination: post-copy: {total} stale pages in {} blocks dropped, the source's write registrations \
         deregistered (waited {fenced:?} for them), serving faults",
        blocks.len()
    ));
    running();
    let announced = blocks.iter().map(|b| b.stale.clone()).collect();
    let installer_wake = EventFd::new()?;
    // The hypervisor reads its userfaultfd itself: its faults come as fetches.
    let events = if hypervisors {
        wake::epoll_of(&[installer_wake.fd(), fetches.fd()])?
    } else {
        wake::epoll_of(&[uffd.fd(), installer_wake.fd(), fetches.fd()])?
    };
    let (jobs, job_queue) = mpsc::channel();
    let (results, installed) = mpsc::channel();
    std::thread::scope(|s| {
        let wake = &installer_wake;
        std::thread::Builder::new()
            .name("rdmamig-install".into())
            .spawn_scoped(s, move || installer::run(uffd, PAGE, job_queue, results, wake))
            .map_err(|e| Error::new(ErrorKind::State, format!("cannot start the post-copy installer thread: {e}")))?;
        // Dropping the puller (its job sender) ends the installer, which the scope joins.
        let mut p = Puller {
            blocks,
            uffd,
            hypervisors,
            staging: &staging,
            progress,
            remaining: total,
            cursor: (0, 0),
            hot: VecDeque::with_capacity(HOT_WINDOWS),
            pulls: Default::default(),
            installing: [false; PULL_SLOTS],
            installer: jobs,
            installed,
            installer_wake: wake,
            faults: Default::default(),
            queued: VecDeque::new(),
            faulting: HashSet::new(),
            done: Vec::new(),
            addrs: Vec::new(),
            announced,
            last_fault: None,
            last_pull: None,
            last_served: None,
            refault: SPIN_MAX,
            fetches,
            pending: Vec::new(),
        };
        p.serve_recovering(link, events.as_raw_fd(), recovery.as_ref())
    })?;
    let summary = PostcopySummary {
        pages: total,
        faults: progress.faults_served.load(Ordering::Relaxed),
        bytes: progress.bytes_pulled.load(Ordering::Relaxed),
    };
    blocked.take().expect("kept while running").completed();
    Ok(summary)
}

impl Puller<'_> {
    /// The loop, and with `recovery` a new connection in place of each one
    /// lost (`recover`), until every stale page is in place.
    /// A connection that fails before a page came through it is not tried
    /// again: what fails is then more likely the peer than the link.
    fn serve_recovering(&mut self, link: &mut Link, events: RawFd, recovery: Option<&Recovery>) -> Result<()> {
        let mut remaining_at_recovery = None;
        loop {
            let lost = match self.serve(link, events) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            match recovery {
                Some(r) if postcopy::recoverable(&lost) && remaining_at_recovery != Some(self.remaining) => {
                    self.recover(link, r, lost)?;
                    remaining_at_recovery = Some(self.remaining);
                }
                _ => return Err(lost),
            }
        }
    }

    /// Gets a lost connection back: gives it up, forgets the reads in
    /// flight on it (their pages are read again), reconnects to the
    /// source's recovery listener until the window ends (every
    /// `RECONNECT_PAUSE`, each attempt within the config's timeout; no more
    /// once the listener is gone: the source died), connects the source's
    /// new fault QP and takes its POSTCOPY_RESUME. The vCPUs that wait for
    /// pages meanwhile stay blocked.
    fn recover(&mut self, link: &mut Link, r: &Recovery, lost: Error) -> Result<()> {
        // A recovering source sends no disconnect (`link::abandon`): one that
        // did has ended (its process died, or it closed): nobody to reconnect to.
        if link.closed_by_peer() {
            return Err(Error::new(lost.kind, format!("{}; the source closed it: no recovery", lost.message)));
        }
        logging::warn(format_args!(
            "destination: post-copy's connection is lost ({lost}): reconnecting to the source for up to {:?}, \
             {} stale pages left",
            r.window, self.remaining
        ));
        link::abandon(link);
        r.watch.set(PostcopyLink::Lost);
        for j in 0..FAULT_SLOTS {
            if let Some(fault) = self.faults[j].take() {
                self.queued.push_front(fault);
            }
        }
        for i in 0..PULL_SLOTS {
            if !self.installing[i] {
                self.pulls[i] = None;
            }
        }
        // The pull's cursor is past the pages of those reads: it starts over.
        self.cursor = (0, 0);
        let deadline = Instant::now() + r.window;
        if r.config.postcopy_recovery_by_hypervisor {
            logging::warn(format_args!("destination: post-copy recovery waits for the hypervisor's postcopy_recover"));
            r.watch.await_go(deadline, &lost, || link.check_stop("post-copy's recovery"))?;
        }
        r.watch.set(PostcopyLink::Recovering);
        let new = loop {
            link.check_stop("post-copy's recovery")?;
            match link::reconnect(link, r.config, r.source.port, r.source.token) {
                Ok(new) => break new,
                Err(e) if e.kind == ErrorKind::Aborted => return Err(e),
                Err(e) if e.kind == ErrorKind::Disconnected || Instant::now() >= deadline => {
                    return Err(Error::new(lost.kind, format!("{}; no recovery: {}", lost.message, e.message)));
                }
                Err(e) => {
                    logging::debug(format_args!("destination: post-copy recovery: {e}; trying again"));
                    std::thread::sleep(RECONNECT_PAUSE.min(deadline.saturating_duration_since(Instant::now())));
                }
            }
        };
        // The lost link's QPs are destroyed here, before anything is posted
        // on the new one: no read of theirs lands in a slot used again.
        *link = new;
        // The source's fault QP, then its POSTCOPY_RESUME.
        let remote = link.receive_expected(CommandType::PostcopyFaultQp, |m| {
            m.entries::<QpEndpoint>().next().expect("decode_message checked one entry").map_err(protocol_error)
        })?;
        link::accept_fault_qp(link, remote)?;
        link.receive_expected(CommandType::PostcopyResume, |_| Ok(()))?;
        self.progress.recoveries.fetch_add(1, Ordering::Relaxed);
        r.watch.set(PostcopyLink::Up);
        logging::info(format_args!("destination: post-copy's connection is back; the pull goes on"));
        Ok(())
    }

    /// The loop; `events` is readable when the userfaultfd or the installer has news.
    fn serve(&mut self, link: &mut Link, events: RawFd) -> Result<()> {
        loop {
            #[cfg(feature = "rdma-tests")]
            self.sever_for_test(link)?;
            self.take_faults()?;
            self.take_fetches()?;
            self.post_faults(link)?;
            // Completions before new pulls: a fault's completion installs its
            // page (and wakes its vCPU) without waiting behind a pull's post.
            link.take_reads(&mut self.done);
            let done = std::mem::take(&mut self.done);
            for tag in &done {
                self.completed(*tag)?;
            }
            self.done = done;
            self.done.clear();
            self.take_installed()?;
            self.answer_fetches();
            let hold = self.post_pulls(link)?;
            let idle = self.pulls.iter().all(Option::is_none) && self.faults.iter().all(Option::is_none);
            if self.remaining == 0 && idle {
                return Ok(());
            }
            if self.spin(link)? {
                continue;
            }
            link.pump(events, hold.unwrap_or(Duration::from_millis(100)))?;
        }
    }

    /// After a fault was served, polls for the next fault and for
    /// completions rather than sleep, when faults follow each other
    /// closely: up to twice the last time from an install to the next
    /// fault, if that was under `SPIN_MAX`. A vCPU that faulted often
    /// faults again soon, and waking the sleeping thread costs about as
    /// much as the read. It yields the CPU on each pass: with more runnable
    /// threads than CPUs a busy spin slowed the faulting vCPUs (figures with
    /// and without the spin: docs/benchmarks.md). Returns whether anything came.
    fn spin(&mut self, link: &mut Link) -> Result<bool> {
        let Some(served) = self.last_served else { return Ok(false) };
        if self.refault >= SPIN_MAX {
            return Ok(false);
        }
        let until = served + 2 * self.refault;
        while Instant::now() < until {
            link.check_stop("post-copy")?;
            if self.take_faults()? > 0 || self.fetches.any() || link.reap()? > 0 {
                return Ok(true);
            }
            // The CPU goes to a runnable vCPU thread, if one waits for it.
            std::thread::yield_now();
        }
        Ok(false)
    }

    /// The installer's results: frees their slots and counts their pages
    /// (those still stale: a fault may have installed some meanwhile).
    fn take_installed(&mut self) -> Result<()> {
        self.installer_wake.drain();
        while let Ok(done) = self.installed.try_recv() {
            let skipped = done.skipped?;
            let pull = self.pulls[done.slot].take().ok_or_else(|| stray(done.slot as u64))?;
            self.installing[done.slot] = false;
            self.progress.pages_skipped.fetch_add(skipped, Ordering::Relaxed);
            self.no_longer_stale(pull.block, pull.first, pull.pages);
        }
        Ok(())
    }

    /// Pages `first..first + n` of `block` are installed: those still
    /// stale no longer are.
    fn no_longer_stale(&mut self, block: usize, first: u64, n: u64) {
        self.remaining -= bitmap::take_range(&mut self.blocks[block].stale, first, first + n);
        self.progress.pages_remaining.store(self.remaining, Ordering::Relaxed);
    }

    /// Reads the fault messages waiting and sorts each fault out; returns how many there were.
    fn take_faults(&mut self) -> Result<usize> {
        if self.hypervisors {
            return Ok(0);
        }
        self.addrs.clear();
        self.uffd.read_faults(&mut self.addrs)?;
        for i in 0..self.addrs.len() {
            if let Some(served) = self.last_served.take() {
                self.refault = served.elapsed();
            }
            let addr = self.addrs[i] & !(PAGE - 1);
            let Some(block) = self.block_of(addr) else { continue };
            let page = (addr - self.blocks[block].uffd_addr) / PAGE;
            if bitmap::test(&self.blocks[block].stale, page) {
                self.fault(block, page);
            } else if bitmap::test(&self.announced[block], page) {
                // Installed already: its install woke the waiters; wake late ones too.
                self.uffd.wake(addr, PAGE)?;
            } else {
                // Not stale, so this side had it right, and it is missing: it is zero.
                self.uffd.zero(addr, PAGE)?;
            }
        }
        Ok(self.addrs.len())
    }

    /// The post-copy block holding address `addr` (the userfaultfd's), if one does.
    fn block_of(&self, addr: u64) -> Option<usize> {
        self.blocks.iter().position(|b| (b.uffd_addr..b.uffd_addr + b.length).contains(&addr))
    }

    /// Stale page `page` is wanted now: its read jumps the queue (unless a
    /// pull in flight, or being installed, brings it).
    fn fault(&mut self, block: usize, page: u64) {
        let pulling = self.in_flight(block, page).is_some();
        if !pulling && self.faulting.insert((block, page)) {
            self.queued.push_back((block, page));
            self.fault_nearby(block, page);
            self.last_fault = Some(Instant::now());
        }
    }

    /// The hypervisor's new requests: their stale pages are read as faults
    /// are. Through its own userfaultfd they are its vCPUs' faults: a page
    /// that is not stale is placed too (a zero page if it is missing, else
    /// its waiters are woken), as `take_faults` does.
    fn take_fetches(&mut self) -> Result<()> {
        let first = self.pending.len();
        self.fetches.take(&mut self.pending);
        if self.hypervisors && self.pending.len() > first {
            if let Some(served) = self.last_served.take() {
                self.refault = served.elapsed();
            }
        }
        for i in first..self.pending.len() {
            let Some((block, from, end)) = self.fetch_pages(&self.pending[i]) else { continue };
            let mut page = from;
            while let Some(p) = next_set(&self.blocks[block].stale, page, end) {
                self.fault(block, p);
                page = p + 1;
            }
            let mut page = from;
            while self.hypervisors && page < end {
                page = next_clear(&self.blocks[block].stale, page, end);
                if page < end {
                    self.uffd.zero(self.blocks[block].uffd_addr + page * PAGE, PAGE)?;
                    page += 1;
                }
            }
        }
        Ok(())
    }

    /// Answers the requests none of whose pages is stale any more.
    fn answer_fetches(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.retain(|f| {
            let stale =
                self.fetch_pages(f).is_some_and(|(b, from, end)| next_set(&self.blocks[b].stale, from, end).is_some());
            if !stale {
                // The caller may have given up waiting: nobody to tell.
                let _ = f.done.try_send(());
            }
            stale
        });
        self.pending = pending;
    }

    /// A request's pages in a post-copy block: (block, first, end).
    fn fetch_pages(&self, f: &Fetch) -> Option<(usize, u64, u64)> {
        let block = self.blocks.iter().position(|b| b.index == f.block)?;
        let b = &self.blocks[block];
        Some((block, f.offset / PAGE, (f.offset + f.len).div_ceil(PAGE).min(b.length / PAGE)))
    }

    fn post_faults(&mut self, link: &mut Link) -> Result<()> {
        for j in 0..FAULT_SLOTS {
            if self.faults[j].is_some() {
                continue;
            }
            let Some((block, page)) = self.queued.pop_front() else { return Ok(()) };
            let b = &self.blocks[block];
            let sge = self.staging.sge(self.staging.fault_slot(j), PAGE);
            let (remote, rkey, _) = b.remote(page);
            // The slot is free (nothing reads or writes it until the
            // completion); the page lies in a region the source registered.
            link.post_read(FAULT_TAG + j as u64, sge, remote, rkey, true)?;
            self.faults[j] = Some((block, page));
        }
        Ok(())
    }

    /// Posts background reads up to `PULL_DEPTH`, unless faults are recent:
    /// then at most one is in flight, of `TRICKLE_PAGES`, posted only
    /// `PULL_TRICKLE` after the previous one, so that faults (which come in bursts) find the thread
    /// and the link free, and the pull still progresses. Returns how long
    /// pulls are held back, if they are.
    fn post_pulls(&mut self, link: &mut Link) -> Result<Option<Duration>> {
        let since_fault = self.last_fault.map(|t| t.elapsed());
        let held = self.faults_recent();
        if held {
            let since_pull = self.last_pull.map_or(Duration::MAX, |t| t.elapsed());
            if self.reading() > 0 || since_pull < PULL_TRICKLE {
                let hold_left = PULL_HOLD.saturating_sub(since_fault.unwrap_or_default());
                let trickle_left = PULL_TRICKLE.saturating_sub(since_pull);
                return Ok(Some(hold_left.min(trickle_left).max(Duration::from_micros(100))));
            }
        }
        for i in 0..PULL_SLOTS {
            if self.reading() >= PULL_DEPTH {
                break;
            }
            if self.pulls[i].is_some() {
                continue;
            }
            let most = if held { TRICKLE_PAGES } else { PULL_PAGES };
            let Some(pull) = self.next_pull(most) else { break };
            let b = &self.blocks[pull.block];
            let sge = self.staging.sge(self.staging.pull_slot(i), pull.pages * PAGE);
            let (remote, rkey, _) = b.remote(pull.first);
            // As in `post_faults` (`pull_in` keeps a read inside one region).
            link.post_read(i as u64, sge, remote, rkey, false)?;
            self.pulls[i] = Some(pull);
            self.last_pull = Some(Instant::now());
            if held {
                break;
            }
        }
        Ok(None)
    }

    /// The next background read, of at most `most` pages: stale pages of a
    /// window around a recent fault, else the next ones after the cursor.
    fn next_pull(&mut self, most: u64) -> Option<Pull> {
        while let Some((block, window)) = self.hot.pop_front() {
            let end = ((window + 1) * PULL_PAGES).min(self.blocks[block].length / PAGE);
            if let Some(pull) = self.pull_in(block, window * PULL_PAGES, end, most) {
                if pull.first + pull.pages < end {
                    self.hot.push_front((block, window)); // more of it next time
                }
                return Some(pull);
            }
        }
        while self.cursor.0 < self.blocks.len() {
            let (block, from) = self.cursor;
            match self.pull_in(block, from, self.blocks[block].length / PAGE, most) {
                None => self.cursor = (block + 1, 0),
                Some(pull) => {
                    self.cursor = (block, pull.first + pull.pages);
                    return Some(pull);
                }
            }
        }
        None
    }

    /// The first read of stale pages in `[from, end)` that no read in flight
    /// covers: from the first such page, at most `most` pages, ending
    /// at a stale page, with gaps of at most `MERGE_GAP` present pages read
    /// along (cheaper than another read).
    fn pull_in(&self, block: usize, from: u64, end: u64, most: u64) -> Option<Pull> {
        let stale = &self.blocks[block].stale;
        let mut at = from;
        let first = loop {
            let page = next_set(stale, at, end)?;
            match self.in_flight(block, page) {
                Some(past) => at = past,
                None => break page,
            }
        };
        let limit = (first + most).min(end).min(first + self.blocks[block].remote(first).2);
        let mut last = first;
        while let Some(page) = next_set(stale, last + 1, limit) {
            if page - last - 1 > MERGE_GAP || self.in_flight(block, page).is_some() {
                break;
            }
            last = page;
        }
        Some(Pull { block, first, pages: last + 1 - first })
    }

    /// Background reads in flight (busy slots not handed to the installer).
    fn reading(&self) -> usize {
        (0..PULL_SLOTS).filter(|&j| self.pulls[j].is_some() && !self.installing[j]).count()
    }

    /// If a busy pull slot (read in flight, or being installed) covers
    /// `page`: the page after that read.
    fn in_flight(&self, block: usize, page: u64) -> Option<u64> {
        let pull =
            self.pulls.iter().flatten().find(|p| p.block == block && (p.first..p.first + p.pages).contains(&page));
        pull.map(|p| p.first + p.pages)
    }

    /// Pull the rest of a fault's window and the next one soon.
    fn fault_nearby(&mut self, block: usize, page: u64) {
        let windows = (self.blocks[block].length / PAGE).div_ceil(PULL_PAGES);
        let window = page / PULL_PAGES;
        for w in [window + 1, window].into_iter().filter(|&w| w < windows) {
            if self.hot.len() == HOT_WINDOWS {
                self.hot.pop_back();
            }
            self.hot.push_front((block, w));
        }
    }

    fn completed(&mut self, tag: u64) -> Result<()> {
        if tag >= FAULT_TAG {
            let j = (tag - FAULT_TAG) as usize;
            let (block, page) = self.faults.get_mut(j).and_then(Option::take).ok_or_else(|| stray(tag))?;
            self.faulting.remove(&(block, page));
            self.progress.bytes_pulled.fetch_add(PAGE, Ordering::Relaxed);
            let at = self.staging.fault_slot(j);
            if bitmap::test(&self.blocks[block].stale, page) {
                self.install(block, page, 1, at)?;
                self.progress.faults_served.fetch_add(1, Ordering::Relaxed);
                self.last_served = Some(Instant::now());
            } else {
                self.uffd.wake(self.blocks[block].uffd_addr + page * PAGE, PAGE)?;
            }
            return Ok(());
        }
        let i = tag as usize;
        let pull = match self.pulls.get(i) {
            Some(Some(pull)) if !self.installing[i] => pull,
            _ => return Err(stray(tag)),
        };
        self.progress.bytes_pulled.fetch_add(pull.pages * PAGE, Ordering::Relaxed);
        // The runs of pages still stale (a fault may have installed some).
        let (block, pulled, base) = (pull.block, pull.first, self.staging.pull_slot(i));
        let (stale, end) = (&self.blocks[block].stale, pull.first + pull.pages);
        let mut runs = Vec::new();
        let mut at = pull.first;
        while let Some(first) = next_set(stale, at, end) {
            let last = next_clear(stale, first, end);
            runs.push((first, last - first));
            at = last;
        }
        if runs.is_empty() || self.faults_recent() {
            // While faults come, installed here: no second thread competes
            // with the fault path for a CPU.
            self.pulls[i] = None;
            for (first, n) in runs {
                self.install(block, first, n, base + (first - pulled) * PAGE)?;
            }
            return Ok(());
        }
        // Else by the installer; the slot stays busy until it is done.
        let base_addr = self.blocks[block].uffd_addr;
        let runs = runs
            .into_iter()
            .map(|(first, n)| (base_addr + first * PAGE, self.staging.addr(base + (first - pulled) * PAGE), n * PAGE))
            .collect();
        self.installing[i] = true;
        self.installer
            .send(Job { slot: i, runs })
            .map_err(|_| Error::new(ErrorKind::State, "post-copy: the installer thread is gone"))
    }

    /// Whether faults are recent: one is being served, or the last came
    /// less than `PULL_HOLD` ago.
    fn faults_recent(&self) -> bool {
        !self.faulting.is_empty() || self.last_fault.is_some_and(|t| t.elapsed() < PULL_HOLD)
    }

    /// UFFDIO_COPY of `n` stale pages from staging offset `at`; pages found
    /// present are skipped. Either way they are no longer stale.
    fn install(&mut self, block: usize, first: u64, n: u64, at: u64) -> Result<()> {
        let dst = self.blocks[block].uffd_addr + first * PAGE;
        // The slot holds the completed read; `dst` lies in a registered block.
        let got = self.uffd.copy(dst, self.staging.addr(at), n * PAGE, PAGE)?;
        if let Installed::Some { installed } = got {
            self.progress.pages_skipped.fetch_add(n - installed, Ordering::Relaxed);
        }
        self.no_longer_stale(block, first, n);
        Ok(())
    }
}

/// Test hook (`rdma-tests`): once a destination's post-copy has installed
/// this many stale pages, its QPs go to the error state without a
/// connection event (a lost link), once. 0: off.
#[cfg(feature = "rdma-tests")]
pub static SEVER_AFTER_PAGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(feature = "rdma-tests")]
impl Puller<'_> {
    fn sever_for_test(&mut self, link: &Link) -> Result<()> {
        let after = SEVER_AFTER_PAGES.load(Ordering::Relaxed);
        let installed = self.progress.pages_total.load(Ordering::Relaxed) - self.remaining;
        if after != 0 && installed >= after && SEVER_AFTER_PAGES.swap(0, Ordering::Relaxed) == after {
            logging::warn(format_args!("destination: test hook: post-copy's link severed after {installed} pages"));
            link::sever_for_test(link)?;
        }
        Ok(())
    }
}

fn stray(tag: u64) -> Error {
    Error::new(ErrorKind::State, format!("post-copy: a completion for read {tag:#x}, which is not in flight"))
}
