//! Page-aligned, zeroed heap memory for buffers the NIC reads or writes
//! (rdma-core's fork support marks whole pages of a registration
//! `MADV_DONTFORK`, so a registered buffer must not share a page with other
//! heap data).

use std::alloc::{self, Layout};
use std::sync::Arc;

use crate::verbs::{self, Access, MemoryRegion, ProtectionDomain, Sge};

pub(crate) struct PageBuffer {
    ptr: *mut u8,
    layout: Layout,
}

impl PageBuffer {
    /// `len` bytes (rounded up to a page, at least one), zeroed.
    pub fn new(len: usize) -> PageBuffer {
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(4096), 4096).expect("a buffer's size fits");
        // SAFETY: the size is not zero.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        PageBuffer { ptr, layout }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The whole buffer (its rounded size).
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// The bytes, while no read or write by the NIC into them is in flight.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: our own allocation of this size, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len()) }
    }
}

impl Drop for PageBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr, self.layout) };
    }
}

// SAFETY: plain heap memory, owned by one thread at a time (and the NIC).
unsafe impl Send for PageBuffer {}

/// A page buffer registered for the NIC, which owns its memory: the
/// registration is declared first, so it is dropped (deregistered) before
/// the memory is freed, and no work request can reach freed memory.
pub(crate) struct RegisteredBuffer {
    mr: MemoryRegion,
    mem: PageBuffer,
}

impl RegisteredBuffer {
    /// `len` bytes (rounded up to a page), zeroed, registered with `pd`.
    ///
    /// Its users borrow its bytes (`bytes`, `bytes_mut`) only where no
    /// posted receive or READ (nor, with remote access, the peer) is writing
    /// them: each slot is read after its work request completed.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: Access) -> verbs::Result<RegisteredBuffer> {
        let mem = PageBuffer::new(len);
        // SAFETY: `mem` is ours and outlives `mr` (field order); the NIC's
        // accesses are the purpose, and the bytes are borrowed only where
        // none is in flight (above).
        let mr = unsafe { pd.register(mem.ptr(), mem.len(), access)? };
        Ok(RegisteredBuffer { mr, mem })
    }

    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    /// The whole buffer (its rounded size).
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// An entry for `len` bytes at `at`.
    ///
    /// # Panics
    /// When they are not inside the buffer (a bug of the caller's slots).
    pub fn sge(&self, at: usize, len: usize) -> Sge {
        self.mr.sge(at, len as u32).expect("inside the registered buffer")
    }

    /// The address of byte `at`, for the kernel to read (UFFDIO_COPY).
    pub fn addr(&self, at: usize) -> u64 {
        assert!(at <= self.len(), "{at} outside the buffer");
        self.mem.ptr() as u64 + at as u64
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: our own allocation of this size (see `new` for the NIC).
        unsafe { std::slice::from_raw_parts(self.mem.ptr(), self.len()) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.mem.bytes_mut()
    }

    /// Deregisters here and now, then frees the memory.
    pub fn release(self) -> usize {
        let len = self.mr.len();
        drop(self);
        len
    }
}
