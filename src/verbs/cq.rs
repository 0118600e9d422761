//! Completion channels, completion queues and work completions.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{sys, CmId, Result, VerbsError};

/// A completion event channel (`ibv_comp_channel`); its fd is non-blocking.
/// Destroyed on drop, after every CQ using it (they hold an `Arc`).
pub struct CompletionChannel {
    raw: NonNull<sys::ibv_comp_channel>,
    _id: Arc<CmId>,
}

// SAFETY: ibv_get_cq_event on a channel is thread-safe (a read() of one
// event from the kernel); the struct itself is immutable.
unsafe impl Send for CompletionChannel {}
// SAFETY: as for `Send`.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    pub fn new(id: &Arc<CmId>) -> Result<Arc<Self>> {
        let ctx = id.verbs("ibv_create_comp_channel")?;
        // SAFETY: live device context of `id`, kept alive through `_id`.
        let raw = unsafe { sys::ibv_create_comp_channel(ctx) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_create_comp_channel"))?;
        let ch = CompletionChannel { raw, _id: id.clone() };
        super::fd::set_nonblocking(ch.fd(), "fcntl(ibv_comp_channel)")?;
        Ok(Arc::new(ch))
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: fd is immutable after creation.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    pub fn raw(&self) -> *mut sys::ibv_comp_channel {
        self.raw.as_ptr()
    }
}

impl std::fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionChannel").field("fd", &self.fd()).finish()
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: no CQ uses it any more.
        unsafe { sys::ibv_destroy_comp_channel(self.raw.as_ptr()) };
    }
}

/// A completion queue (`ibv_cq`) with a completion channel for sleeping.
///
/// # Waiting for completions
///
/// ```text
/// loop {
///     let n = cq.poll(&mut wcs)?;          // 1. poll
///     if n > 0 { handle(&wcs[..n]); continue; }
///     if !cq.wait(timeout)? { /* timed out */ }  // 2. arm, poll, sleep
/// }                                          // 3. poll again
/// ```
///
/// [`wait`](Self::wait) arms the CQ (`ibv_req_notify_cq`), then polls it
/// once more so a completion that arrived between the caller's last poll and
/// the arming is not missed (such completions are kept and returned first by
/// the next [`poll`](Self::poll)); only if the CQ is still empty does it sleep
/// on the channel. So it never sleeps while completions are ready, and may
/// return early (spurious wake-ups are possible): always poll afterwards.
///
/// If several CQs share one [`CompletionChannel`], a `wait` on one may
/// consume (and acknowledge) the event of another; that other CQ's waiter
/// then sleeps until its timeout. Give each CQ its own channel when different
/// threads wait on them, or have one thread wait on the shared channel's fd.
pub struct CompletionQueue {
    raw: NonNull<sys::ibv_cq>,
    channel: Arc<CompletionChannel>,
    _id: Arc<CmId>,
    /// Completions taken off the CQ by `wait` (see above), returned first by `poll`.
    stash: Mutex<VecDeque<sys::ibv_wc>>,
    stashed: AtomicUsize,
}

// SAFETY: polling and arming a CQ are thread-safe in rdma-core providers
// (rxe/mlx5 lock the CQ); the stash is behind a mutex.
unsafe impl Send for CompletionQueue {}
// SAFETY: as for `Send`.
unsafe impl Sync for CompletionQueue {}

/// How many completions `wait` takes off the CQ while checking it.
const STASH_BATCH: usize = 16;

impl CompletionQueue {
    /// `ibv_create_cq` with room for at least `cqe` completions.
    pub fn new(id: &Arc<CmId>, cqe: i32, channel: &Arc<CompletionChannel>) -> Result<Arc<Self>> {
        let ctx = id.verbs("ibv_create_cq")?;
        // SAFETY: live context and channel, both kept alive by the CQ.
        let raw = unsafe { sys::ibv_create_cq(ctx, cqe, ptr::null_mut(), channel.raw(), 0) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_create_cq"))?;
        Ok(Arc::new(CompletionQueue {
            raw,
            channel: channel.clone(),
            _id: id.clone(),
            stash: Mutex::new(VecDeque::new()),
            stashed: AtomicUsize::new(0),
        }))
    }

    /// Takes up to `out.len()` completions without blocking; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let mut n = 0;
        if self.stashed.load(Ordering::Acquire) > 0 {
            let mut stash = self.stash.lock();
            while n < out.len() {
                match stash.pop_front() {
                    Some(wc) => {
                        out[n] = WorkCompletion(wc);
                        n += 1;
                    }
                    None => break,
                }
            }
            self.stashed.store(stash.len(), Ordering::Release);
        }
        if n < out.len() {
            match self.poll_raw(&mut out[n..]) {
                Ok(m) => n += m,
                // Hand out what we have; the error will show up on the next call.
                Err(_) if n > 0 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn poll_raw(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let want = out.len().min(i32::MAX as usize) as libc::c_int;
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc; `out` has room for `want`.
        let rc = unsafe { sys::rmv_poll_cq(self.raw.as_ptr(), want, out.as_mut_ptr().cast()) };
        if rc < 0 {
            return Err(VerbsError::new("ibv_poll_cq", if rc < -1 { -rc } else { libc::EIO }));
        }
        Ok(rc as usize)
    }

    /// Blocks until the CQ (probably) has completions or `timeout` passes:
    /// arm (`ibv_req_notify_cq`), check the CQ once, then `poll()` the
    /// channel fd and consume the event (`ibv_get_cq_event` +
    /// `ibv_ack_cq_events`). `Ok(false)` on timeout. Poll again after it
    /// returns (see the type's docs).
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        self.wait_or(timeout, None)
    }

    /// As [`wait`](Self::wait), but also returns (`Ok(true)`) as soon as
    /// `other` is readable: one thread waits for completions and, say, a
    /// userfaultfd at once.
    pub fn wait_or(&self, timeout: Duration, other: Option<libc::c_int>) -> Result<bool> {
        if self.stashed.load(Ordering::Acquire) > 0 {
            return Ok(true);
        }
        // SAFETY: live CQ.
        let rc = unsafe { sys::rmv_req_notify_cq(self.raw.as_ptr(), 0) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_req_notify_cq", rc));
        }
        let mut batch = [WorkCompletion::default(); STASH_BATCH];
        let n = self.poll_raw(&mut batch)?;
        if n > 0 {
            let mut stash = self.stash.lock();
            stash.extend(batch[..n].iter().map(|wc| wc.0));
            self.stashed.store(stash.len(), Ordering::Release);
            return Ok(true);
        }
        let deadline = Instant::now().checked_add(timeout);
        if let Some(other) = other {
            match super::fd::poll_readable_either(self.channel.fd(), other, deadline)? {
                (false, false) => return Ok(false),
                (false, true) => return Ok(true),
                _ => {}
            }
        } else if !super::fd::poll_readable(self.channel.fd(), deadline)? {
            return Ok(false);
        }
        let mut cq = ptr::null_mut();
        let mut ctx = ptr::null_mut();
        // SAFETY: live channel; non-blocking fd, so EAGAIN if another thread
        // took the event first.
        let rc = unsafe { sys::ibv_get_cq_event(self.channel.raw(), &mut cq, &mut ctx) };
        if rc != 0 {
            let e = super::error::last_errno();
            if e == libc::EAGAIN || e == libc::EWOULDBLOCK || e == libc::EINTR {
                return Ok(true); // spurious: the caller polls anyway
            }
            return Err(VerbsError::new("ibv_get_cq_event", e));
        }
        // SAFETY: `cq` is the CQ the event is for (ours, or another CQ on a
        // shared channel, which cannot be destroyed before this ack since
        // ibv_destroy_cq waits for it).
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        Ok(true)
    }

    pub fn channel(&self) -> &Arc<CompletionChannel> {
        &self.channel
    }

    pub fn raw(&self) -> *mut sys::ibv_cq {
        self.raw.as_ptr()
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: the QPs using it hold Arcs, so are gone; every event we got
        // was acked immediately.
        unsafe { sys::ibv_destroy_cq(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue").field("raw", &self.raw).finish()
    }
}

/// One work completion (`struct ibv_wc`).
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkCompletion(pub sys::ibv_wc);

impl WorkCompletion {
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    pub fn is_success(&self) -> bool {
        self.0.status == sys::IBV_WC_SUCCESS
    }
    /// The work request ran out of transport retries: the remote NIC
    /// acknowledged none of them (`IBV_WC_RETRY_EXC_ERR`).
    pub fn is_retry_exceeded(&self) -> bool {
        self.0.status == sys::IBV_WC_RETRY_EXC_ERR
    }
    /// The remote NIC refused the work request (`IBV_WC_REM_INV_REQ_ERR`,
    /// `IBV_WC_REM_ACCESS_ERR`, `IBV_WC_REM_OP_ERR`): a key or a queue pair
    /// it no longer has, an access the key does not grant.
    pub fn is_remote_error(&self) -> bool {
        matches!(self.0.status, sys::IBV_WC_REM_INV_REQ_ERR | sys::IBV_WC_REM_ACCESS_ERR | sys::IBV_WC_REM_OP_ERR)
    }
    /// `enum ibv_wc_status` (`sys::IBV_WC_*`).
    pub fn status(&self) -> u32 {
        self.0.status
    }
    /// `ibv_wc_status_str`, e.g. "transport retry counter exceeded".
    pub fn status_str(&self) -> &'static str {
        // SAFETY: returns a pointer to a static string (or "unknown").
        let p = unsafe { sys::ibv_wc_status_str(self.0.status) };
        if p.is_null() {
            return "unknown";
        }
        // SAFETY: a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("unknown")
    }
    /// `enum ibv_wc_opcode` (`sys::IBV_WC_SEND`, `IBV_WC_RDMA_WRITE`, `IBV_WC_RECV`, ...);
    /// only valid for successful completions.
    pub fn opcode(&self) -> u32 {
        self.0.opcode
    }
    /// Bytes received (receive completions).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
    /// Immediate data (host order) if the completion carries any.
    pub fn imm_data(&self) -> Option<u32> {
        (self.0.wc_flags & sys::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(self.0.imm_data))
    }
}

impl std::fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &format_args!("{} ({})", self.status(), self.status_str()))
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .finish()
    }
}
