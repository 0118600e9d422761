//! Protection domains and memory regions.

use std::ops::{BitOr, BitOrAssign};
use std::ptr::NonNull;
use std::sync::Arc;

use super::{sys, CmId, Result, Sge, VerbsError};

/// How registered memory survives the process's `fork()` (rdma-core's `enum ibv_fork_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForkMode {
    /// The kernel copies pinned pages into the child at fork (Linux >= 5.13): nothing to do.
    Unneeded = 0,
    /// rdma-core marks registered ranges MADV_DONTFORK (`ibv_fork_init`).
    Enabled = 1,
    /// Neither: a child that shares registered pages copy-on-write can make the
    /// parent's page move away from the NIC's DMA target.
    Disabled = 2,
}

/// Makes registrations fork-safe where the kernel does not: `ibv_fork_init()`
/// unless rdma-core reports copy-on-fork (or fork support is already on).
/// Process-wide, and effective only before the process's first verbs object.
pub fn fork_init() -> ForkMode {
    // SAFETY: both calls take no arguments and only read or set rdma-core's process state.
    unsafe {
        match sys::ibv_is_fork_initialized() {
            sys::IBV_FORK_UNNEEDED => ForkMode::Unneeded,
            sys::IBV_FORK_ENABLED => ForkMode::Enabled,
            _ if sys::ibv_fork_init() == 0 => ForkMode::Enabled,
            _ => ForkMode::Disabled,
        }
    }
}

/// A protection domain (`ibv_pd`) on the device of a [`CmId`]. Deallocated
/// on drop, after every MR and QP using it (they hold an `Arc`).
pub struct ProtectionDomain {
    raw: NonNull<sys::ibv_pd>,
    /// The id whose device context the PD is on (kept alive with it).
    id: Arc<CmId>,
}

// SAFETY: PDs are immutable handles; verbs using them are thread-safe.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as for `Send`.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// `ibv_alloc_pd(id->verbs)`. The id must have a device (address
    /// resolved, or a connection request id); otherwise ENODEV.
    pub fn new(id: &Arc<CmId>) -> Result<Arc<Self>> {
        let ctx = id.verbs("ibv_alloc_pd")?;
        // SAFETY: ctx is the live device context of `id`, which we keep alive.
        let raw = unsafe { sys::ibv_alloc_pd(ctx) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_alloc_pd"))?;
        Ok(Arc::new(ProtectionDomain { raw, id: id.clone() }))
    }

    /// Whether `id`'s device is this PD's: a QP of `id` may use it.
    /// (librdmacm opens each device once per process: ids on one device share its context.)
    pub fn is_on(&self, id: &CmId) -> bool {
        id.verbs("ibv_create_qp").ok() == self.id.verbs("ibv_alloc_pd").ok()
    }

    /// Registers `len` bytes at `addr` (`ibv_reg_mr`).
    ///
    /// # Safety
    /// The memory must stay mapped until the returned `MemoryRegion` is
    /// dropped. While it is registered the NIC reads it for the sends and
    /// writes posted from it and writes it for the receives and READs posted
    /// into it (and, with remote access, the peer reads or writes it at any
    /// time): the caller accepts this, and holds no Rust reference to bytes
    /// that a posted work request or the peer may be writing.
    pub unsafe fn register(self: &Arc<Self>, addr: *mut u8, len: usize, access: Access) -> Result<MemoryRegion> {
        // SAFETY: a live PD; the memory's validity is this function's contract.
        let raw = unsafe { sys::ibv_reg_mr(self.raw.as_ptr(), addr.cast(), len, access.0 as libc::c_int) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last("ibv_reg_mr"))?;
        // SAFETY: the MR ibv_reg_mr just returned.
        let mr = unsafe { &*raw.as_ptr() };
        Ok(MemoryRegion { raw, lkey: mr.lkey, rkey: mr.rkey, addr: addr as u64, len, _pd: self.clone() })
    }

    pub fn raw(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: no MR or QP uses it any more (they hold Arcs).
        unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain").field("raw", &self.raw).finish()
    }
}

/// Memory region access flags (`enum ibv_access_flags`); combine with `|`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    pub const LOCAL_WRITE: Access = Access(sys::IBV_ACCESS_LOCAL_WRITE as u32);
    pub const REMOTE_WRITE: Access = Access(sys::IBV_ACCESS_REMOTE_WRITE as u32);
    pub const REMOTE_READ: Access = Access(sys::IBV_ACCESS_REMOTE_READ as u32);

    pub const fn empty() -> Access {
        Access(0)
    }
    pub const fn bits(self) -> u32 {
        self.0
    }
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

/// A registered memory region (`ibv_mr`); deregistered on drop.
pub struct MemoryRegion {
    raw: NonNull<sys::ibv_mr>,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: an MR is an immutable handle; we only read cached copies of its keys.
unsafe impl Send for MemoryRegion {}
// SAFETY: as for `Send`.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Start address of the registered range (as the peer uses it for RDMA).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather entry for `len` bytes at `offset` into this region,
    /// or `None` if that range is not inside it.
    pub fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
        let end = offset.checked_add(len as usize)?;
        (end <= self.len).then(|| Sge::new(self.addr + offset as u64, len, self.lkey))
    }

    /// A scatter/gather entry for `len` bytes at address `addr`, or `None`
    /// if that range is not inside this region.
    pub fn sge_at(&self, addr: u64, len: u32) -> Option<Sge> {
        let offset = addr.checked_sub(self.addr)?;
        self.sge(usize::try_from(offset).ok()?, len)
    }

    pub fn raw(&self) -> *mut sys::ibv_mr {
        self.raw.as_ptr()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once.
        unsafe { sys::ibv_dereg_mr(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}
