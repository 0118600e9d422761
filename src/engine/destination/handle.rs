//! The destination's handle: what hypervisor threads call. The service
//! thread serves the source; the handle reads what it reports (stream bytes,
//! windows, the end) and sends on a QEMU source's return path.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::dispatch::Observer;
use super::service::Service;
use super::shared::{Shared, State, SuppliedUserfault};
use crate::engine::link::{self, Link, Listener, Negotiated};
use crate::engine::pin::{self, Pins, Unregistration};
use crate::engine::postcopy::{Fetch, Fetches, LinkWatch, PostcopyLink, PostcopyPhase, PostcopyProgress, Progress};
use crate::engine::ram::RamBlocks;
use crate::engine::stats::{Counters, Stats};
use crate::engine::Ending;
use crate::host::readiness::Readiness;
use crate::host::uffd::Userfault;
use crate::logging;
use crate::wire::{CommandType, POSTCOPY_PAGE_SIZE, SEND_INCREMENT};
use crate::{Error, ErrorKind, Result};

/// What `Destination::get` read: stream bytes, or the end of a stream that
/// ended without a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    Bytes(usize),
    End(Ending),
}

/// A QEMU source's return-path connection.
enum ReturnChannel {
    /// None was accepted (`Config::return_path` off, or an rdmamig source).
    Absent,
    Open(Box<Link>),
    /// Torn down by `abort` or `close`, or after this failure of `put_return`.
    Closed(Option<Error>),
}

/// The destination end of a migration connection.
///
/// Thread safety: every method takes `&self` and may be called from any thread.
/// Progress never needs the hypervisor: the library's own service thread
/// serves the source and calls nothing back (but the log hook, `set_log_hook`).
pub struct Destination {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    negotiated: Negotiated,
    thread: Mutex<Option<JoinHandle<()>>>,
    return_channel: Mutex<ReturnChannel>,
    has_return_path: bool,
    /// Keeps the unregistration worker running past `close`, so that close
    /// does not wait for the deregistrations it queued.
    unregistration: Option<Arc<Unregistration>>,
    ram: RamBlocks,
    /// `Config::hypervisor_userfaultfd`.
    hypervisor_userfaultfd: bool,
}

impl Destination {
    /// Waits (up to `timeout`, or for ever) for a source to connect on
    /// `listener` and starts serving it. `ram` lists this side's blocks; for a
    /// QEMU source, in the source's block order. With the listener's
    /// `Config::return_path`, a QEMU source's return-path connection is
    /// accepted too before this returns. A request that fails a check is
    /// refused and the wait goes on (see `rdmamig_listener_accept` for the
    /// rules, which are these).
    pub fn accept(listener: &Listener, ram: &RamBlocks, timeout: Option<Duration>) -> Result<Destination> {
        Self::accept_with(listener, ram, timeout, None)
    }

    /// As [`accept`](Self::accept), and tells `observer` every [`Event`] of
    /// the connection as it is served, on the service thread: the source's
    /// next message waits while it runs, so it should be quick.
    ///
    /// [`Event`]: crate::engine::Event
    pub fn accept_observed(
        listener: &Listener,
        ram: &RamBlocks,
        timeout: Option<Duration>,
        observer: Observer,
    ) -> Result<Destination> {
        Self::accept_with(listener, ram, timeout, Some(observer))
    }

    fn accept_with(
        listener: &Listener,
        ram: &RamBlocks,
        timeout: Option<Duration>,
        observer: Option<Observer>,
    ) -> Result<Destination> {
        if ram.is_empty() {
            return Err(Error::new(ErrorKind::InvalidArgument, "the RAM block registry is empty"));
        }
        let counters = Arc::new(Counters::new());
        let event = Readiness::new()?;
        let link = link::accept(listener, ram.total_bytes(), counters.clone(), timeout).inspect_err(|e| {
            let level = if e.kind == ErrorKind::Cancelled { logging::Level::Info } else { logging::Level::Error };
            logging::log(level, format_args!("destination: accepting a source failed: {e}"));
        })?;
        // QEMU opens it right after the first is established, before it sends
        // anything on the first (an rdmamig source opens none).
        let return_channel = if listener.config().return_path && !link.negotiated.extensions {
            ReturnChannel::Open(Box::new(link::accept_return(listener, &link, ram.total_bytes(), counters.clone())?))
        } else {
            ReturnChannel::Absent
        };
        let has_return_path = matches!(return_channel, ReturnChannel::Open(_));
        if logging::enabled(logging::Level::Info) {
            let from = link.peer_addr().map_or_else(|| "?".to_string(), |a| a.to_string());
            let rp = if has_return_path { ", with a return path" } else { "" };
            logging::info(format_args!("destination: accepted a source from {from}: {}{rp}", link.negotiated));
        }
        let pins = Pins::new(link.pd.clone(), listener.config(), counters.clone())?;
        let unregistration = pins.worker();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            counters,
            event,
            postcopy: Progress::default(),
            fetches: Fetches::new()?,
            postcopy_link: LinkWatch::new(listener.config().postcopy_recovery_by_hypervisor),
        });
        let negotiated = link.negotiated;
        let stop = link.stop.clone();
        let service = Service::new(link, pins, ram.clone(), shared.clone(), observer, listener.config());
        let thread = thread::Builder::new()
            .name("rdmamig-dest".into())
            .spawn(move || service.run())
            .map_err(|e| Error::new(ErrorKind::State, format!("cannot start the service thread: {e}")))?;
        Ok(Destination {
            shared,
            stop,
            negotiated,
            thread: Mutex::new(Some(thread)),
            return_channel: Mutex::new(return_channel),
            has_return_path,
            unregistration,
            ram: ram.clone(),
            hypervisor_userfaultfd: listener.config().hypervisor_userfaultfd,
        })
    }

    pub fn negotiated(&self) -> Negotiated {
        self.negotiated
    }

    /// Post-copy's progress (rdmamig sources only): phase, stale pages
    /// left, faults served, bytes read. Any thread, at any time.
    pub fn postcopy_progress(&self) -> PostcopyProgress {
        self.shared.postcopy.snapshot()
    }

    /// Waits (up to `timeout`, or for ever) until post-copy reached `phase`:
    /// [`PostcopyPhase::Running`]: the source's POSTCOPY arrived, its stale
    /// pages are dropped and faults on them are served, so the vCPUs may run
    /// (not before); [`PostcopyPhase::Done`]: every stale page is in place.
    /// Fails with the connection's error if it ends first, or with
    /// `Timeout`; `Duration::ZERO` never waits (`WouldBlock` while the phase
    /// is not reached). Right after a failure in post-copy is visible the
    /// post-copy blocks become PROT_NONE and threads blocked on them get
    /// SIGSEGV (docs/postcopy.md, failure semantics; complete once
    /// `close` returns), or with `Config::postcopy_keep_blocked` they stay
    /// blocked: stop the VM. Any thread.
    pub fn wait_postcopy(&self, phase: PostcopyPhase, timeout: Option<Duration>) -> Result<PostcopyProgress> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.shared.state.lock();
        loop {
            let progress = self.shared.postcopy.snapshot();
            if progress.phase >= phase {
                return Ok(progress);
            }
            match &state.end {
                Some(Err(e)) => return Err(e.clone()),
                Some(Ok(_)) => {
                    return Err(Error::new(ErrorKind::State, "the connection ended without post-copy"));
                }
                None => {}
            }
            let wait = deadline.map_or(Duration::from_millis(100), |d| d.saturating_duration_since(Instant::now()));
            if timeout == Some(Duration::ZERO) {
                return Err(Error::new(ErrorKind::WouldBlock, format!("post-copy has not reached {phase:?} yet")));
            }
            if wait.is_zero() {
                return Err(Error::new(ErrorKind::Timeout, format!("post-copy did not reach {phase:?} in time")));
            }
            self.shared.changed.wait_for(&mut state, wait.min(Duration::from_millis(100)));
        }
    }

    /// Where post-copy's connection is: waits until it is not `known` (up to
    /// `timeout`; `None`: for ever) and returns where it is then (still
    /// `known` if the time ran out). For a hypervisor that shows its own
    /// states: `Lost` (paused), `Recovering`, `Up` again; `Ended` once the
    /// connection ended (`wait_postcopy` or `error` say how). Any thread.
    pub fn wait_postcopy_link(&self, known: PostcopyLink, timeout: Option<Duration>) -> PostcopyLink {
        self.shared.postcopy_link.wait_change(known, timeout)
    }

    /// With `Config::postcopy_recovery_by_hypervisor`, after post-copy's
    /// connection was lost (`PostcopyLink::Lost`): reconnect to the source
    /// now (within what is left of the window). `State` without the setting
    /// or when the link is not lost. Any thread.
    pub fn postcopy_recover(&self) -> Result<()> {
        self.shared.postcopy_link.recover()
    }

    /// Hands over the hypervisor's userfaultfd for post-copy (with
    /// `Config::hypervisor_userfaultfd`): the library keeps a duplicate of
    /// `uffd` until post-copy ends, installs pages through it and never
    /// reads it. Call it before post-copy runs, with guest RAM registered
    /// with `uffd` in missing mode (its API handshake done); the library
    /// checks that each block is, then drops the stale pages. `at`: where
    /// each block of the registry (by index) lies in the address space of
    /// the process that registered `uffd`, when that is not this one (a
    /// separate migration process that received the descriptor); `None`:
    /// at its host address here. From `PostcopyPhase::Running` on, forward
    /// every fault read from `uffd` with [`postcopy_fetch`](Self::postcopy_fetch),
    /// which then places every page of its range, stale or not, and wakes
    /// the threads waiting on them. Fails with `State` without the setting,
    /// once post-copy runs or a userfaultfd was handed over;
    /// `InvalidArgument` for a descriptor that is no userfaultfd, or an
    /// `at` of another length than the registry or with an address not
    /// 4 KiB-aligned. Any thread.
    pub fn postcopy_userfaultfd(&self, uffd: BorrowedFd<'_>, at: Option<&[u64]>) -> Result<()> {
        if !self.hypervisor_userfaultfd {
            return Err(Error::new(
                ErrorKind::State,
                "the listener's configuration has post-copy use the library's own userfaultfd \
                 (Config::hypervisor_userfaultfd is off)",
            ));
        }
        if let Some(at) = at {
            if at.len() != self.ram.len() {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("{} block addresses for {} RAM blocks", at.len(), self.ram.len()),
                ));
            }
            if let Some(a) = at.iter().find(|&&a| a % POSTCOPY_PAGE_SIZE != 0) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("block address {a:#x} is not 4 KiB-aligned"),
                ));
            }
        }
        let uffd = Userfault::supplied(uffd)?;
        let mut state = self.shared.state.lock();
        if self.shared.postcopy.snapshot().phase != PostcopyPhase::Idle || state.userfaultfd_handed {
            return Err(Error::new(ErrorKind::State, "post-copy runs already, or has a userfaultfd handed over"));
        }
        state.userfaultfd = Some(SuppliedUserfault { uffd, at: at.map(<[u64]>::to_vec) });
        state.userfaultfd_handed = true;
        self.shared.update(&state);
        Ok(())
    }

    /// Reads the stale pages among the `len` bytes at `offset` of block
    /// `block` from the source now, as faults on them would, and returns
    /// once none of them is missing any more (at once when none is stale, or
    /// post-copy is done), waiting up to `timeout` (or for ever). For faults
    /// the library does not see: a second process mapping the same shared
    /// guest memory (a vhost-user backend) whose userfaultfd the hypervisor
    /// reads; once this returns, it wakes the backend's thread there
    /// (`UFFDIO_WAKE`). Pages that are not stale are left as they are (a
    /// missing one is zero: the hypervisor places it, `UFFDIO_ZEROPAGE`),
    /// unless post-copy runs on the hypervisor's userfaultfd
    /// ([`postcopy_userfaultfd`](Self::postcopy_userfaultfd)): then the
    /// faults the hypervisor reads come here, and every page of the range is
    /// placed and its waiters woken.
    /// `Duration::ZERO` only asks: `WouldBlock` unless no page is missing
    /// (post-copy is done), and the pages come all the same. Fails with
    /// `State` before post-copy runs, with the connection's error if it
    /// fails first, or with `Timeout`. Any thread.
    pub fn postcopy_fetch(&self, block: u32, offset: u64, len: u64, timeout: Option<Duration>) -> Result<()> {
        let b = self.ram.get(block)?;
        b.check_range(offset, len)?;
        match self.shared.postcopy.snapshot().phase {
            PostcopyPhase::Idle => return Err(Error::new(ErrorKind::State, "post-copy is not running")),
            PostcopyPhase::Done => return Ok(()),
            PostcopyPhase::Running => {}
        }
        let (done, answer) = mpsc::sync_channel(1);
        self.shared.fetches.push(Fetch { block: block as usize, offset, len, done });
        if timeout == Some(Duration::ZERO) {
            return Err(Error::new(ErrorKind::WouldBlock, "the pages are on their way"));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let wait = deadline.map_or(Duration::from_millis(100), |d| d.saturating_duration_since(Instant::now()));
            match answer.recv_timeout(wait.min(Duration::from_millis(100))) {
                Ok(()) => return Ok(()),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // The post-copy thread dropped the request: it failed, and
                // is about to say so (or it never took it: it had ended).
                Err(mpsc::RecvTimeoutError::Disconnected) => thread::sleep(Duration::from_millis(10)),
            }
            if self.shared.postcopy.snapshot().phase == PostcopyPhase::Done {
                return Ok(());
            }
            if let Some(Err(e)) = &self.shared.state.lock().end {
                return Err(e.clone());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::new(ErrorKind::Timeout, "the pages did not arrive in time"));
            }
        }
    }

    /// Whether a return-path connection was accepted (see [`put_return`](Self::put_return)).
    pub fn has_return_path(&self) -> bool {
        self.has_return_path
    }

    /// Sends `data` to a QEMU source over its return path: QEMU_FILE
    /// messages of at most 32 KiB, each after the source's READY (its return
    /// path thread sends one whenever it wants to read). The bytes are
    /// QEMU's return-path messages (MIG_RP_MSG_*: be16 type, be16 length,
    /// payload), which the hypervisor builds from what it finds in the
    /// stream; QEMU needs SHUT (value 0) to complete. Returns once every
    /// message is sent, waiting at most the config's timeout for each READY.
    /// A failure aborts the migration and closes both connections.
    pub fn put_return(&self, data: &[u8]) -> Result<()> {
        let mut channel = self.return_channel.lock();
        let link = match &mut *channel {
            ReturnChannel::Open(link) => link,
            ReturnChannel::Absent => {
                return Err(Error::new(
                    ErrorKind::State,
                    "no return path: none was accepted (Config::return_path off, or not a QEMU source)",
                ))
            }
            ReturnChannel::Closed(Some(e)) => return Err(e.clone()),
            ReturnChannel::Closed(None) => {
                return Err(Error::new(ErrorKind::Aborted, "the return path was closed by abort or close"))
            }
        };
        let sent = data
            .chunks(SEND_INCREMENT)
            .try_for_each(|piece| link.post_message(CommandType::QemuFile, |w| w.push_bytes(piece)));
        if let Err(e) = &sent {
            let e = Error::new(e.kind, format!("return path: {}", e.message));
            *channel = ReturnChannel::Closed(Some(e.clone()));
            drop(channel);
            self.abort();
            return Err(e);
        }
        Ok(())
    }

    /// The unregistration worker this connection uses (see `Source::unregistration`).
    pub fn unregistration(&self) -> Option<Arc<Unregistration>> {
        self.unregistration.clone()
    }

    /// Reads stream bytes into `buf`: blocks until at least one byte is there
    /// (at most `timeout`; `None`: for ever) and returns how many were copied.
    /// Once the connection has ended and every byte was read, returns how it
    /// ended: [`Read::End`], or the failure. An empty `buf` reads 0 bytes at
    /// once. A timeout of `Duration::ZERO` never waits: with nothing to
    /// return it fails with `ErrorKind::WouldBlock` (see [`event_fd`](Self::event_fd)).
    pub fn get(&self, buf: &mut [u8], timeout: Option<Duration>) -> Result<Read> {
        if buf.is_empty() {
            return Ok(Read::Bytes(0));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.shared.state.lock();
        loop {
            if !state.stream.is_empty() {
                let (front, back) = state.stream.as_slices();
                let n = buf.len().min(front.len() + back.len());
                let from_front = n.min(front.len());
                buf[..from_front].copy_from_slice(&front[..from_front]);
                buf[from_front..n].copy_from_slice(&back[..n - from_front]);
                state.stream.drain(..n);
                self.shared.update(&state);
                return Ok(Read::Bytes(n));
            }
            if let Some(end) = &state.end {
                return end.clone().map(Read::End);
            }
            self.wait(&mut state, timeout, deadline, "stream bytes")?;
        }
    }

    /// Waits until the connection has ended and returns how: completed,
    /// closed without proof (a QEMU source), or the failure. Stream bytes not
    /// read yet stay readable with `get`. `Duration::ZERO` never waits
    /// (`ErrorKind::WouldBlock` while the connection lasts).
    pub fn wait_end(&self, timeout: Option<Duration>) -> Result<Ending> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.shared.state.lock();
        loop {
            if let Some(end) = &state.end {
                return end.clone();
            }
            self.wait(&mut state, timeout, deadline, "the end of the migration")?;
        }
    }

    /// Waits until at least `n` iteration windows have completed (all RAM
    /// written in them is in place) and returns the number completed, which
    /// also clears the windows' part of the event fd's readiness.
    /// `Duration::ZERO` never waits (`ErrorKind::WouldBlock` while fewer
    /// than `n` completed); `n == 0` returns the count at once.
    pub fn wait_iteration(&self, n: u64, timeout: Option<Duration>) -> Result<u64> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.shared.state.lock();
        loop {
            if state.iterations >= n {
                state.reported = state.iterations;
                self.shared.event.set(state.ready());
                return Ok(state.iterations);
            }
            match &state.end {
                Some(Err(e)) => return Err(e.clone()),
                Some(Ok(_)) => {
                    return Err(Error::new(
                        ErrorKind::Disconnected,
                        format!("the source ended the migration after {} iteration windows", state.iterations),
                    ))
                }
                None => self.wait(&mut state, timeout, deadline, "an iteration to complete")?,
            }
        }
    }

    /// Waits for the state to change, until `deadline`; with a timeout of
    /// zero, fails with `WouldBlock` at once instead.
    fn wait(
        &self,
        state: &mut parking_lot::MutexGuard<State>,
        timeout: Option<Duration>,
        deadline: Option<Instant>,
        what: &str,
    ) -> Result<()> {
        if timeout == Some(Duration::ZERO) {
            return Err(Error::new(ErrorKind::WouldBlock, format!("waiting for {what} would block")));
        }
        match deadline {
            None => self.shared.changed.wait(state),
            Some(d) => {
                if self.shared.changed.wait_until(state, d).timed_out() {
                    return Err(Error::new(ErrorKind::Timeout, format!("timed out waiting for {what}")));
                }
            }
        }
        Ok(())
    }

    /// A file descriptor to poll (POLLIN, EPOLLIN) instead of blocking in
    /// [`get`](Self::get), [`wait_iteration`](Self::wait_iteration) or
    /// [`wait_end`](Self::wait_end). Level-triggered: it is readable exactly
    /// while at least one of these holds, and the library changes it only
    /// together with what it reports:
    ///
    /// - stream bytes wait to be read (`get` with `Duration::ZERO` returns
    ///   some): until `get` has taken the last of them;
    /// - an iteration window completed that no `wait_iteration` call has
    ///   returned yet: until a `wait_iteration` call returns a count that
    ///   includes it (`wait_iteration(0, Some(Duration::ZERO))` always does);
    /// - the connection has ended (`wait_end` with `Duration::ZERO` returns
    ///   how): from then on, for good.
    ///
    /// So an event loop, once the fd is readable, calls `get` with
    /// `Duration::ZERO` until `ErrorKind::WouldBlock` (or the end),
    /// `wait_iteration(0, Some(Duration::ZERO))`, and polls again: it is never
    /// woken for nothing, and never misses a change (the fd is readable
    /// again before the next change is visible to those calls). Do not read
    /// from or write to the fd: it is the library's (an eventfd), valid until
    /// the `Destination` is dropped. Other threads may poll it too.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.shared.event.fd()
    }

    pub fn iterations(&self) -> u64 {
        self.shared.state.lock().iterations
    }

    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// The failure that ended the connection, if it ended with one.
    pub fn error(&self) -> Option<Error> {
        self.shared.state.lock().end.clone().and_then(|end| end.err())
    }

    /// Aborts the migration without waiting: the service thread sends ERROR to
    /// a source still migrating (see `Link::send_error` for when it can) and
    /// tears the connection down; calls blocked in `get`, `wait_end`,
    /// `wait_iteration` or `put_return` then return. The return path is
    /// closed here (or by a `put_return` under way, which fails). May be
    /// called from any thread.
    pub fn abort(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(mut channel) = self.return_channel.try_lock() {
            close_return(&mut channel);
        }
    }

    /// Aborts (if still connected) and waits until the connection is torn down.
    pub fn close(&self) {
        self.abort();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
        pin::settle_at_close(self.unregistration.as_deref());
        close_return(&mut self.return_channel.lock());
    }
}

/// Disconnects an open return path (QEMU then fails the migration unless it
/// has taken SHUT).
fn close_return(channel: &mut ReturnChannel) {
    if let ReturnChannel::Open(_) = channel {
        *channel = ReturnChannel::Closed(None);
    }
}

impl Drop for Destination {
    fn drop(&mut self) {
        self.close();
    }
}
