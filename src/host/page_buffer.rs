//! Page-aligned, zeroed heap memory for buffers the NIC reads or writes
//! (rdma-core's fork support marks whole pages of a registration
//! `MADV_DONTFORK`, so a registered buffer must not share a page with other
//! heap data).

use std::alloc::{self, Layout};

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
