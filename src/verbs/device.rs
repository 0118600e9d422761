//! Device enumeration and `ibv_context`.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use super::{sys, Result, VerbsError};

/// Calls `f` with the current device list (empty when the host has no RDMA
/// devices: `ibv_get_device_list` then returns NULL, typically with ENOSYS).
fn with_device_list<T>(f: impl FnOnce(&[*mut sys::ibv_device]) -> T) -> Result<T> {
    let mut num: libc::c_int = 0;
    // SAFETY: num is a valid out-pointer.
    let list = unsafe { sys::ibv_get_device_list(&mut num) };
    if list.is_null() {
        let e = super::last_errno();
        if e == libc::ENOMEM {
            return Err(VerbsError::new("ibv_get_device_list", e));
        }
        return Ok(f(&[]));
    }
    let num = usize::try_from(num).unwrap_or(0);
    // SAFETY: the list holds `num` device pointers (plus a NULL terminator)
    // and stays valid until ibv_free_device_list.
    let devices = unsafe { std::slice::from_raw_parts(list, num) };
    let out = f(devices);
    // SAFETY: list came from ibv_get_device_list; freed once.
    unsafe { sys::ibv_free_device_list(list) };
    Ok(out)
}

fn device_name(dev: *mut sys::ibv_device) -> String {
    // SAFETY: dev is a live device from the list (or a context's device);
    // the name is a NUL-terminated string owned by it.
    let p = unsafe { sys::ibv_get_device_name(dev) };
    if p.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Names of the RDMA devices on this host (e.g. `["rxe0"]`); empty when there are none.
pub fn device_names() -> Result<Vec<String>> {
    with_device_list(|devs| devs.iter().map(|&d| device_name(d)).collect())
}

/// An open device (`ibv_context`). Closed on drop.
///
/// Only needed to inspect devices: connections get their device context
/// from rdma_cm (see [`CmId`](super::CmId)).
pub struct Context {
    raw: NonNull<sys::ibv_context>,
}

// SAFETY: an ibv_context may be used from any thread (rdma-core verbs are
// thread-safe); we only read its immutable `device` pointer.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name`, or the first device if `None`.
    /// Fails with ENODEV ([`VerbsError::is_no_device`]) when there is no such device.
    pub fn open(name: Option<&str>) -> Result<Context> {
        let wanted = name.map(|n| CString::new(n).unwrap_or_default());
        let found = with_device_list(|devs| {
            let dev = devs.iter().copied().find(|&d| match &wanted {
                None => true,
                Some(w) => device_name(d).as_bytes() == w.as_bytes(),
            })?;
            // SAFETY: dev is live until the list is freed; the opened context
            // stays valid after that.
            Some(unsafe { sys::ibv_open_device(dev) })
        })?;
        match found {
            None => Err(VerbsError::new("ibv_get_device_list", libc::ENODEV)),
            Some(ctx) => match NonNull::new(ctx) {
                Some(raw) => Ok(Context { raw }),
                None => Err(VerbsError::last("ibv_open_device")),
            },
        }
    }

    /// The kernel device name, e.g. `"rxe0"`.
    pub fn name(&self) -> String {
        // SAFETY: the context is open; `device` is set by ibv_open_device.
        device_name(unsafe { (*self.raw.as_ptr()).device })
    }

    pub fn raw(&self) -> *mut sys::ibv_context {
        self.raw.as_ptr()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device, closed exactly once.
        unsafe { sys::ibv_close_device(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name()).finish()
    }
}
