//! The destination's service thread: it owns the connection, grants the
//! source one READY credit at a time, hands each message to the dispatcher
//! and sends its answer, runs pin-all, and reports how the connection ended.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::dispatch::{Dispatcher, Observer, Registrar, Reply, Step};
use super::postcopy::plan::PlanBlock;
use super::postcopy::{self, Blocked};
use super::shared::{Shared, SuppliedUserfault};
use crate::engine::link::{self, Link};
use crate::engine::pin::{PinAll, Pins};
use crate::engine::postcopy::{PostcopyLink, PostcopyPhase, Recovery};
use crate::engine::ram::RamBlocks;
use crate::engine::{Config, Ending};
use crate::host::pagemap;
use crate::host::uffd::Userfault;
use crate::host::GuestRange;
use crate::logging;
use crate::verbs::{Access, MemoryRegion};
use crate::wire::{CommandType, PostcopyRecovery};
use crate::{Error, ErrorKind, Result};

/// Test hook (`rdma-tests`): once a destination has completed this many
/// iteration windows, its QPs go to the error state without a connection
/// event (a lost link), before it grants the source its next credit; once.
/// 0: off.
#[cfg(feature = "rdma-tests")]
pub static SEVER_AFTER_WINDOWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Stream bytes buffered at most before the service thread stops granting credits.
const MAX_BUFFERED_STREAM: usize = 256 << 20;

/// Access for what the source writes into: its RDMA writes, and zeroing here.
fn written_by_source() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE
}

/// Chunks the source asks for, registered under this side's pin budget.
impl Registrar for Pins {
    type Registration = MemoryRegion;

    fn check_budget(&self, len: u64) -> Result<()> {
        if self.fits_after_release(len) {
            Ok(())
        } else {
            Err(self.over_budget(len))
        }
    }

    fn register_remote(&mut self, guest: &GuestRange) -> Result<MemoryRegion> {
        self.settle_for(guest.len());
        match self.register_guest(guest, written_by_source()) {
            Err(e) if e.kind == ErrorKind::PinBudget => {
                // Nothing here can be unpinned; what the worker still holds can.
                self.retried();
                self.settle();
                self.register_guest(guest, written_by_source())
            }
            r => r,
        }
    }

    fn rkey(mr: &MemoryRegion) -> u32 {
        mr.rkey()
    }

    fn release_remote(&mut self, mr: MemoryRegion) {
        self.release(mr);
    }
}

pub(super) struct Service {
    link: Link,
    pins: Pins,
    /// Pin-all registrations under way, taken when the source asks for the blocks.
    pin_all: Option<PinAll>,
    dispatcher: Dispatcher<Pins>,
    shared: Arc<Shared>,
    /// A post-copy's userfaultfd while it runs; left here by a failure, so
    /// that the blocked threads are released after the failure is reported.
    postcopy_blocked: Option<Blocked>,
    /// This side's settings (post-copy's recovery reconnects with them).
    config: Config,
    /// Where the source takes a recovery connection (POSTCOPY_RECOVERY).
    recovery: Option<PostcopyRecovery>,
}

impl Service {
    pub fn new(
        link: Link,
        pins: Pins,
        ram: RamBlocks,
        shared: Arc<Shared>,
        observer: Option<Observer>,
        config: &Config,
    ) -> Service {
        let mut dispatcher = Dispatcher::new(ram, link.negotiated, shared.counters.clone(), link.stop.clone());
        if let Some(observer) = observer {
            dispatcher.set_observer(observer);
        }
        Service {
            link,
            pins,
            pin_all: None,
            dispatcher,
            shared,
            postcopy_blocked: None,
            config: config.clone(),
            recovery: None,
        }
    }

    pub fn run(mut self) {
        pagemap::keep_open();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()))
            .unwrap_or_else(|_| Err(Error::new(ErrorKind::State, "the service thread panicked")));
        // A pin-all still under way stops first, not after the ERROR's grace
        // (its drop waits for its thread: close returns with the RAM untouched).
        drop(self.pin_all.take());
        let end = self.judge(result);
        match &end {
            Ok(Ending::Completed) => logging::info(format_args!("destination: migration completed (END acknowledged)")),
            Ok(Ending::Unverified) => logging::info(format_args!(
                "destination: the source closed outside a window without a completion handshake (a QEMU source): \
                 unverified, the stream must prove it"
            )),
            Err(e) => logging::error(format_args!("destination: the connection failed: {e}")),
        }
        if let Err(e) = &end {
            if !matches!(e.kind, ErrorKind::PeerError | ErrorKind::Disconnected) {
                self.link.send_error();
            }
        }
        // Destroy the QP, CQ and id (no more remote writes), hand every
        // registration to the worker, then report the end.
        let Service { link, mut pins, mut dispatcher, shared, postcopy_blocked, .. } = self;
        drop(link);
        dispatcher.release_all(&mut pins);
        let mut state = shared.state.lock();
        state.end = Some(end);
        shared.update(&state);
        drop(state);
        drop(postcopy_blocked);
        shared.postcopy_link.set(PostcopyLink::Ended);
    }

    /// How the connection ended. Only the completion handshake completes a
    /// migration; a QEMU source (no handshake) that disconnects outside a
    /// window ends it without proof; everything else is a failure.
    fn judge(&self, result: Result<Ending>) -> Result<Ending> {
        let e = match result {
            Ok(ending) => return Ok(ending),
            Err(e) if e.kind != ErrorKind::Disconnected => return Err(e),
            Err(e) => e,
        };
        let why = if self.dispatcher.in_window() {
            "inside an iteration window: the RAM of that window is incomplete"
        } else if self.link.negotiated.extensions {
            "before completing the migration (no END)"
        } else if self.link.closed_by_peer() {
            return Ok(Ending::Unverified);
        } else {
            "between iteration windows"
        };
        Err(Error::new(ErrorKind::Disconnected, format!("the source disconnected {why} ({})", e.message)))
    }

    fn serve(&mut self) -> Result<Ending> {
        // Pin-all starts here, on its own thread, while the source gets ready
        // to ask for the blocks; the first READY goes out without waiting for it.
        // It pre-faults on every CPU: the guest does not run here yet, and the
        // source waits for it. (One thread leaves the other CPUs idle.)
        if self.link.negotiated.pin_all {
            self.pin_all = Some(self.pins.pin_all(self.dispatcher.ram(), written_by_source(), 0)?);
        }
        loop {
            self.wait_for_room()?;
            let (dispatcher, pins, shared) = (&mut self.dispatcher, &mut self.pins, &self.shared);
            let step = self.link.receive(|m| {
                let step = dispatcher.dispatch(m, pins)?;
                // The payload lives in the receive buffer, which the link reuses.
                if let Step::Stream = step {
                    let mut state = shared.state.lock();
                    state.stream.extend(m.payload);
                    shared.update(&state);
                }
                Ok(step)
            })?;
            match step {
                Step::Stream | Step::Applied => {}
                Step::WindowClosed => {
                    let mut state = self.shared.state.lock();
                    state.iterations += 1;
                    self.shared.update(&state);
                    let n = state.iterations;
                    drop(state);
                    logging::debug(format_args!("destination: iteration window {n} complete"));
                    #[cfg(feature = "rdma-tests")]
                    if SEVER_AFTER_WINDOWS.compare_exchange(n, 0, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                        link::sever_for_test(&self.link)?;
                    }
                }
                Step::Answer(reply) => self.answer(&reply)?,
                Step::Blocks => {
                    if let Some(job) = self.pin_all.take() {
                        self.dispatcher.pinned_all(job.wait(&self.link.stop)?);
                    }
                    self.answer(&self.dispatcher.blocks_result())?;
                }
                Step::Postcopy(plan) => self.postcopy(plan)?,
                Step::FaultQp(remote) => link::accept_fault_qp(&mut self.link, remote)?,
                Step::Recovery(source) => self.recovery = Some(source),
                Step::Last(reply, end) => {
                    self.answer(&reply)?;
                    return end;
                }
            }
        }
    }

    /// Post-copy on this thread (it owns the completion queue the READs
    /// complete on), then POSTCOPY_DONE; the waiters of `wait_postcopy` are
    /// woken when it runs and when it is done.
    fn postcopy(&mut self, mut plan: Vec<PlanBlock>) -> Result<()> {
        let shared = self.shared.clone();
        let notify = move || {
            let state = shared.state.lock();
            shared.update(&state);
        };
        // The source writes no more: its registrations go (`run` waits until
        // they are deregistered before the guest may run), and their budget
        // serves post-copy's buffers.
        self.dispatcher.release_all(&mut self.pins);
        let supplied = match self.config.hypervisor_userfaultfd {
            true => Some(self.hypervisors_userfaultfd(&mut plan)?),
            false => None,
        };
        let recovery = match (self.config.postcopy_recovery, self.recovery) {
            (Some(window), Some(source)) => {
                Some(Recovery { config: &self.config, window, source, watch: &self.shared.postcopy_link })
            }
            _ => None,
        };
        let summary = postcopy::run(
            &mut self.link,
            &self.pins,
            plan,
            &self.shared.postcopy,
            &self.shared.fetches,
            &notify,
            &mut self.postcopy_blocked,
            recovery,
            supplied,
            self.config.postcopy_keep_blocked,
        )?;
        link::close_fault_qp(&mut self.link);
        self.link.respond(CommandType::PostcopyDone, |w| w.push(&summary))?;
        self.shared.postcopy.set_phase(PostcopyPhase::Done);
        notify();
        logging::info(format_args!(
            "destination: post-copy done: {} pages, {} faults served, {} bytes read",
            summary.pages, summary.faults, summary.bytes
        ));
        Ok(())
    }

    /// The userfaultfd the hypervisor hands over (`Destination::postcopy_userfaultfd`),
    /// waited for up to the timeout, with where each block of `plan` lies for it.
    fn hypervisors_userfaultfd(&mut self, plan: &mut [PlanBlock]) -> Result<Userfault> {
        let deadline = Instant::now() + self.config.timeout;
        let mut state = self.shared.state.lock();
        if state.userfaultfd.is_none() {
            logging::info(format_args!(
                "destination: post-copy requested: waiting up to {:?} for the hypervisor's userfaultfd \
                 (postcopy_userfaultfd)",
                self.config.timeout
            ));
        }
        let SuppliedUserfault { uffd, at } = loop {
            if let Some(supplied) = state.userfaultfd.take() {
                break supplied;
            }
            if self.link.stop.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Aborted, "closed by the hypervisor"));
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "post-copy: the hypervisor did not hand over its userfaultfd (postcopy_userfaultfd) within {:?} \
                         of the source's request",
                        self.config.timeout
                    ),
                ));
            }
            self.shared.changed.wait_for(&mut state, Duration::from_millis(100));
        };
        drop(state);
        if let Some(at) = at {
            for b in plan.iter_mut() {
                b.uffd_addr = at[b.index];
            }
        }
        Ok(uffd)
    }

    fn answer(&mut self, reply: &Reply) -> Result<()> {
        self.link.respond(reply.kind(), |w| reply.write(w))
    }

    /// Holds the next credit back while the hypervisor is behind on reading the stream.
    fn wait_for_room(&mut self) -> Result<()> {
        let mut state = self.shared.state.lock();
        while state.stream.len() >= MAX_BUFFERED_STREAM {
            self.shared.changed.wait_for(&mut state, Duration::from_millis(100));
            if self.link.stop.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Aborted, "closed by the hypervisor"));
            }
        }
        Ok(())
    }
}
