//! Reliable-connected queue pairs created through rdma_cm.

use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{sys, CmId, CompletionQueue, ProtectionDomain, Result, VerbsError};

/// Requested (and, from [`QueuePair::caps`], actual) queue sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
}

/// One scatter/gather entry: `len` bytes at `addr` inside a registered MR
/// with local key `lkey`. Only a [`MemoryRegion`](super::MemoryRegion) makes
/// one ([`sge`](super::MemoryRegion::sge), [`sge_at`](super::MemoryRegion::sge_at)),
/// for a range inside itself: so every entry names memory that was
/// registered, whose pages the kernel keeps pinned while the key is valid,
/// and the NIC refuses a key that is no longer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    addr: u64,
    len: u32,
    lkey: u32,
}

impl Sge {
    /// An entry for `len` bytes at `addr` under `lkey`; the caller, a
    /// memory region, checked that the range is its own.
    pub(super) fn new(addr: u64, len: u32, lkey: u32) -> Sge {
        Sge { addr, len, lkey }
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn raw(&self) -> sys::ibv_sge {
        sys::ibv_sge { addr: self.addr, length: self.len, lkey: self.lkey }
    }
}

/// An RC queue pair: made with `rdma_create_qp` on a [`CmId`] (which then
/// drives its state transitions on connect/accept; destroyed with
/// `rdma_destroy_qp`), or a companion of such a QP made with
/// `ibv_create_qp` and connected by hand ([`QueuePair::companion`],
/// [`QueuePair::connect_like`]; destroyed with `ibv_destroy_qp`). Holds the
/// id, the PD and both CQs.
pub struct QueuePair {
    qp: NonNull<sys::ibv_qp>,
    caps: QpCaps,
    /// The rdma_cm id that made it, or none for a companion.
    id: Option<Arc<CmId>>,
    _pd: Arc<ProtectionDomain>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
}

// SAFETY: posting to a QP is thread-safe in rdma-core providers (the send
// and receive queues each have a lock); the struct itself is immutable.
unsafe impl Send for QueuePair {}
// SAFETY: as for `Send`.
unsafe impl Sync for QueuePair {}

/// An RC QP's creation attributes: both CQs and the requested sizes.
fn init_attr(send_cq: &CompletionQueue, recv_cq: &CompletionQueue, caps: QpCaps) -> sys::ibv_qp_init_attr {
    sys::ibv_qp_init_attr {
        qp_context: ptr::null_mut(),
        send_cq: send_cq.raw(),
        recv_cq: recv_cq.raw(),
        srq: ptr::null_mut(),
        cap: sys::ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: 0,
        },
        qp_type: sys::IBV_QPT_RC,
        sq_sig_all: 0,
    }
}

/// The sizes the provider gave (written back into the creation attributes).
impl From<sys::ibv_qp_cap> for QpCaps {
    fn from(cap: sys::ibv_qp_cap) -> QpCaps {
        QpCaps {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
        }
    }
}

impl QueuePair {
    /// Creates the QP of `id` (one per id: a second one fails with EEXIST).
    pub fn new(
        id: &Arc<CmId>,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Arc<Self>> {
        if id.has_qp.swap(true, Ordering::AcqRel) {
            return Err(VerbsError::new("rdma_create_qp", libc::EEXIST));
        }
        let mut attr = init_attr(send_cq, recv_cq, caps);
        // SAFETY: live id, PD and CQs (all kept alive by the QP); attr is
        // read and its `cap` updated with the actual sizes.
        let rc = unsafe { sys::rdma_create_qp(id.raw(), pd.raw(), &mut attr) };
        // SAFETY: a live id, whose `qp` rdma_create_qp just set.
        let qp = if rc == 0 { NonNull::new(unsafe { (*id.raw()).qp }) } else { None };
        let Some(qp) = qp else {
            let e =
                if rc == 0 { VerbsError::new("rdma_create_qp", libc::EIO) } else { VerbsError::last("rdma_create_qp") };
            id.has_qp.store(false, Ordering::Release);
            return Err(e);
        };
        let caps = QpCaps::from(attr.cap);
        Ok(Arc::new(QueuePair {
            qp,
            caps,
            id: Some(id.clone()),
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
        }))
    }

    /// A second RC QP beside an rdma_cm-connected one, on the same PD and
    /// CQ, in the RESET state: [`connect_like`](Self::connect_like) connects
    /// it to a QP of the same peer, whose number the two sides exchange over
    /// the first connection. (A separate send queue: its work requests do
    /// not wait behind the first QP's.)
    pub fn companion(pd: &Arc<ProtectionDomain>, cq: &Arc<CompletionQueue>, caps: QpCaps) -> Result<Arc<Self>> {
        let mut attr = init_attr(cq, cq, caps);
        // SAFETY: live PD and CQ (kept alive by the QP); attr is read and its
        // `cap` updated with the actual sizes.
        let qp = NonNull::new(unsafe { sys::ibv_create_qp(pd.raw(), &mut attr) })
            .ok_or_else(|| VerbsError::last("ibv_create_qp"))?;
        let caps = QpCaps::from(attr.cap);
        Ok(Arc::new(QueuePair { qp, caps, id: None, _pd: pd.clone(), _send_cq: cq.clone(), _recv_cq: cq.clone() }))
    }

    /// The QP number, which the peer connects its companion to.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { sys::rmv_qp_num(self.qp.as_ptr()) }
    }

    /// Moves a [`companion`](Self::companion) QP from RESET to RTS,
    /// connected to QP `remote_qpn` (first PSN `remote_psn`) of the peer that
    /// `like`, a connected QP, reaches: port, P_Key, address vector, path
    /// MTU, timeouts and READ depths are `like`'s. `access` is what the peer
    /// may do here (remote read, write). This side's first PSN is `local_psn`.
    pub fn connect_like(
        &self,
        like: &QueuePair,
        access: super::Access,
        remote_qpn: u32,
        remote_psn: u32,
        local_psn: u32,
    ) -> Result<()> {
        // SAFETY: two live QPs; the shim only queries `like` and modifies `self`.
        let rc = unsafe {
            sys::rmv_qp_connect_like(
                self.qp.as_ptr(),
                like.raw(),
                access.bits() as i32,
                remote_qpn,
                remote_psn,
                local_psn,
            )
        };
        if rc != 0 {
            return Err(VerbsError::new("ibv_modify_qp (companion QP to RTS)", rc));
        }
        Ok(())
    }

    /// Moves the QP to the error state: its work requests flush, and the
    /// peer is told nothing (its requests go unanswered).
    pub fn to_error(&self) -> Result<()> {
        // SAFETY: live QP.
        let rc = unsafe { sys::rmv_qp_to_error(self.qp.as_ptr()) };
        if rc != 0 {
            return Err(VerbsError::new("ibv_modify_qp (to the error state)", rc));
        }
        Ok(())
    }

    /// The queue sizes the provider actually gave (at least the requested ones).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    pub fn raw(&self) -> *mut sys::ibv_qp {
        self.qp.as_ptr()
    }

    /// Posts a SEND of `sge`. What it sends is what the entry's bytes hold
    /// when the NIC reads them: leave them alone until the work request
    /// completes.
    pub fn post_send(&self, wr_id: u64, sge: Sge, signaled: bool) -> Result<()> {
        // SAFETY: the entry lies in a registration (only a memory region
        // makes an `Sge`): its pages are pinned while the key is valid, the
        // NIC refuses a stale key, and whoever registered the memory
        // accepted the NIC's accesses to it (`ProtectionDomain::register`).
        unsafe { self.post_wr(wr_id, sys::IBV_WR_SEND, Some(sge), None, signaled) }
    }

    /// Posts an RDMA WRITE of `sge` to `remote_addr` in the peer's MR `rkey`
    /// (the NIC reads the entry, as for [`post_send`](Self::post_send)).
    pub fn post_write(&self, wr_id: u64, sge: Sge, remote_addr: u64, rkey: u32, signaled: bool) -> Result<()> {
        // SAFETY: as in `post_send`.
        unsafe { self.post_wr(wr_id, sys::IBV_WR_RDMA_WRITE, Some(sge), Some((remote_addr, rkey)), signaled) }
    }

    /// Posts an RDMA READ of `sge.len` bytes at `remote_addr` in the peer's
    /// MR `rkey` (registered with remote read) into `sge`, whose bytes the
    /// NIC writes until the work request completes. The QP needs initiator
    /// depth (rdma_cm's `initiator_depth` here, the peer's
    /// `responder_resources`): at most that many READs are in flight, the
    /// provider queues the rest.
    pub fn post_read(&self, wr_id: u64, sge: Sge, remote_addr: u64, rkey: u32, signaled: bool) -> Result<()> {
        // SAFETY: as in `post_send`; the registration's owner accepted that
        // the NIC writes it (`ProtectionDomain::register`).
        unsafe { self.post_wr(wr_id, sys::IBV_WR_RDMA_READ, Some(sge), Some((remote_addr, rkey)), signaled) }
    }

    /// Posts a zero-length RDMA WRITE: it touches no memory on either side
    /// (a zero-length operation carries no key that the responder checks,
    /// IBA C9-88) and completes on the responder without a work completion,
    /// so the peer's application never sees it; its completion here proves
    /// that the peer's NIC acknowledged it.
    pub fn post_zero_write(&self, wr_id: u64, signaled: bool) -> Result<()> {
        // SAFETY: no scatter/gather entry, so no local memory is referenced.
        unsafe { self.post_wr(wr_id, sys::IBV_WR_RDMA_WRITE, None, Some((0, 0)), signaled) }
    }

    /// Posts a receive buffer, which the NIC writes until the work request
    /// completes (or is flushed).
    pub fn post_recv(&self, wr_id: u64, sge: Sge) -> Result<()> {
        let mut sg = sge.raw();
        let mut wr = sys::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: &mut sg, num_sge: 1 };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live; `wr` and `sg` outlive the call; the entry
        // lies in a registration whose owner accepted that the NIC writes it
        // (`ProtectionDomain::register`).
        let rc = unsafe { sys::rmv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_post_recv", rc));
        }
        Ok(())
    }

    /// Posts every write of `list` with one `ibv_post_send` and empties it.
    /// On failure the writes before the refused one were posted (the error
    /// ends the connection, whose teardown flushes them).
    pub fn post_writes(&self, list: &mut WriteList) -> Result<()> {
        let n = list.wrs.len();
        if n == 0 {
            return Ok(());
        }
        // Chained here, not at push: both vectors may have moved while growing.
        for i in 0..n {
            list.wrs[i].sg_list = &mut list.sges[i];
            list.wrs[i].next = if i + 1 < n { &mut list.wrs[i + 1] } else { ptr::null_mut() };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the chain and its entries live in `list` for the call; the
        // memory they name is valid until completion (`WriteList::push`'s contract).
        let rc = unsafe { sys::rmv_post_send(self.qp.as_ptr(), list.wrs.as_mut_ptr(), &mut bad) };
        list.wrs.clear();
        list.sges.clear();
        list.bytes = 0;
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_post_send", rc));
        }
        Ok(())
    }

    /// One send work request with at most one scatter/gather entry.
    /// Errors: ENOMEM ([`VerbsError::is_queue_full`]) when the send queue is full.
    unsafe fn post_wr(
        &self,
        wr_id: u64,
        opcode: u32,
        sge: Option<Sge>,
        rdma: Option<(u64, u32)>,
        signaled: bool,
    ) -> Result<()> {
        let mut sg = sge.map(|s| s.raw());
        // SAFETY: all-zero is a valid ibv_send_wr (null pointers, zero ints).
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        if let Some(sg) = sg.as_mut() {
            wr.sg_list = sg;
            wr.num_sge = 1;
        }
        wr.opcode = opcode;
        wr.send_flags = if signaled { sys::IBV_SEND_SIGNALED } else { 0 };
        if let Some((remote_addr, rkey)) = rdma {
            wr.wr.rdma = sys::ibv_send_wr_rdma { remote_addr, rkey };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: a live QP; `wr` and `sg` outlive the call; the entry's
        // memory is the caller's contract.
        let rc = unsafe { sys::rmv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_post_send", rc));
        }
        Ok(())
    }
}

/// RDMA WRITEs gathered for one [`QueuePair::post_writes`]: providers ring
/// the doorbell once per `ibv_post_send` call, which on rxe is a system call
/// and a run of the kernel's requester.
#[derive(Default)]
pub struct WriteList {
    wrs: Vec<sys::ibv_send_wr>,
    sges: Vec<sys::ibv_sge>,
    bytes: u64,
}

// SAFETY: the raw pointers in the gathered work requests point into the
// list's own vectors; they are set and used only inside `post_writes` (with
// `&mut`, which empties the list), and pushed entries hold null ones. What
// the list holds is plain data, so moving or sharing it between threads is
// sound.
unsafe impl Send for WriteList {}
// SAFETY: as for `Send`.
unsafe impl Sync for WriteList {}

impl WriteList {
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// Bytes the gathered writes carry.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Adds an RDMA WRITE of `sge` to `remote_addr` in the peer's MR `rkey`
    /// (as [`QueuePair::post_write`], posted by [`QueuePair::post_writes`]).
    pub fn push(&mut self, wr_id: u64, sge: Sge, remote_addr: u64, rkey: u32, signaled: bool) {
        // SAFETY: all-zero is a valid ibv_send_wr (null pointers, zero ints).
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.num_sge = 1;
        wr.opcode = sys::IBV_WR_RDMA_WRITE;
        wr.send_flags = if signaled { sys::IBV_SEND_SIGNALED } else { 0 };
        wr.wr.rdma = sys::ibv_send_wr_rdma { remote_addr, rkey };
        self.wrs.push(wr);
        self.sges.push(sge.raw());
        self.bytes += u64::from(sge.len);
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // Nobody can post any more (we are the last Arc); the id, PD and
        // CQs are still alive (we hold them).
        match &self.id {
            Some(id) => {
                // SAFETY: as above; the QP was made by rdma_create_qp on `id`.
                unsafe { sys::rdma_destroy_qp(id.raw()) };
                id.has_qp.store(false, Ordering::Release);
            }
            None => {
                // SAFETY: as above; the QP was made by ibv_create_qp.
                unsafe { sys::ibv_destroy_qp(self.qp.as_ptr()) };
            }
        }
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair").field("raw", &self.qp).field("caps", &self.caps).finish()
    }
}
