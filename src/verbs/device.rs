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
        let e = super::error::last_errno();
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

/// The name of the device of an open context (`ctx->device`).
///
/// # Safety
/// `ctx` is a live `ibv_context`.
pub(crate) unsafe fn context_device_name(ctx: *mut sys::ibv_context) -> String {
    // SAFETY: `ctx` is live (this function's contract).
    device_name(unsafe { (*ctx).device })
}

fn device_name(dev: *mut sys::ibv_device) -> String {
    // SAFETY: dev is a live device from the list (or a context's device);
    // the name is a NUL-terminated string owned by it.
    let p = unsafe { sys::ibv_get_device_name(dev) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: as above.
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
// SAFETY: as for `Send`.
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

    /// `ibv_query_device`: the device's firmware version, node GUID and port count.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: all-zero is a valid rmv_device_info (integers and a char array).
        let mut out: sys::rmv_device_info = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `out` is a valid out-pointer.
        let rc = unsafe { sys::rmv_query_device(self.raw(), &mut out) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_query_device", rc));
        }
        // SAFETY: the shim NUL-terminates fw_ver.
        let fw = unsafe { CStr::from_ptr(out.fw_ver.as_ptr()) }.to_string_lossy().into_owned();
        Ok(DeviceAttr {
            fw_ver: fw,
            node_guid: u64::from_be(out.node_guid),
            phys_port_cnt: u8::try_from(out.phys_port_cnt).unwrap_or(u8::MAX),
        })
    }

    /// `ibv_query_port` of port `port` (numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut out = sys::rmv_port_info::default();
        // SAFETY: the context is open; `out` is a valid out-pointer.
        let rc = unsafe { sys::rmv_query_port(self.raw(), port, &mut out) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_query_port", rc));
        }
        Ok(PortAttr {
            state: PortState::from_raw(out.state),
            max_mtu: mtu_bytes(out.max_mtu),
            active_mtu: mtu_bytes(out.active_mtu),
            link_layer: LinkLayer::from_raw(out.link_layer),
            gid_tbl_len: out.gid_tbl_len,
        })
    }

    /// `ibv_query_gid_ex`: GID `index` of port `port`; `None` for an empty entry.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Option<Gid>> {
        let (mut raw, mut kind) = ([0u8; 16], 0u32);
        // SAFETY: the context is open; `raw` holds the 16 bytes the shim writes, `kind` one u32.
        let rc = unsafe { sys::rmv_query_gid(self.raw(), u32::from(port), index, raw.as_mut_ptr(), &mut kind) };
        match rc {
            0 => Ok(Some(Gid { raw, gid_type: GidType::from_raw(kind) })),
            _ => {
                let e = VerbsError::from_ret("ibv_query_gid_ex", rc);
                // ENODATA: an unused table entry; some providers say EINVAL.
                if e.errno == libc::ENODATA || e.errno == libc::EINVAL {
                    Ok(None)
                } else {
                    Err(e)
                }
            }
        }
    }
}

/// What [`Context::query_device`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    /// In host byte order (`ibv_devinfo` prints it as four 16-bit groups).
    pub node_guid: u64,
    pub phys_port_cnt: u8,
}

/// What [`Context::query_port`] reports. MTUs in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub link_layer: LinkLayer,
    pub gid_tbl_len: u32,
}

/// `enum ibv_port_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Other(u32),
}

impl PortState {
    fn from_raw(v: u32) -> Self {
        match v {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            v => PortState::Other(v),
        }
    }

    /// The value of `enum ibv_port_state`.
    pub fn raw(self) -> u32 {
        match self {
            PortState::Nop => 0,
            PortState::Down => 1,
            PortState::Init => 2,
            PortState::Armed => 3,
            PortState::Active => 4,
            PortState::ActiveDefer => 5,
            PortState::Other(v) => v,
        }
    }

    /// rdma-core's name (`ibv_port_state_str`, as `ibv_devinfo` prints it).
    pub fn name(self) -> &'static str {
        match self {
            PortState::Nop => "PORT_NOP",
            PortState::Down => "PORT_DOWN",
            PortState::Init => "PORT_INIT",
            PortState::Armed => "PORT_ARMED",
            PortState::Active => "PORT_ACTIVE",
            PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
            PortState::Other(_) => "invalid state",
        }
    }
}

/// A port's link layer (`IBV_LINK_LAYER_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// Unspecified: InfiniBand by rdma-core's convention.
    Unspecified,
    InfiniBand,
    /// RoCE (and iWARP).
    Ethernet,
    Other(u32),
}

impl LinkLayer {
    fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_LINK_LAYER_UNSPECIFIED => LinkLayer::Unspecified,
            sys::IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            sys::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            v => LinkLayer::Other(v),
        }
    }

    /// As `ibv_devinfo` prints it.
    pub fn name(self) -> &'static str {
        match self {
            LinkLayer::Unspecified | LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Other(_) => "Unknown",
        }
    }
}

/// `enum ibv_gid_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    Ib,
    RoceV1,
    RoceV2,
    Other(u32),
}

impl GidType {
    fn from_raw(v: u32) -> Self {
        match v {
            sys::IBV_GID_TYPE_IB => GidType::Ib,
            sys::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            sys::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            v => GidType::Other(v),
        }
    }

    /// As `ibv_devinfo -v` prints it after a GID ("" for InfiniBand).
    pub fn name(self) -> &'static str {
        match self {
            GidType::Ib => "IB",
            GidType::RoceV1 => "RoCE v1",
            GidType::RoceV2 => "RoCE v2",
            GidType::Other(_) => "unknown",
        }
    }
}

/// One GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gid {
    pub raw: [u8; 16],
    pub gid_type: GidType,
}

impl Gid {
    /// The GID as an IPv6 address (RoCE GIDs are the port's IP addresses; IPv4 ones mapped, ::ffff:a.b.c.d).
    pub fn ipv6(&self) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::from(self.raw)
    }

    /// The IPv4 address of an IPv4-mapped GID.
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        self.ipv6().to_ipv4_mapped()
    }
}

/// Bytes of an `enum ibv_mtu` value (0 when unknown).
fn mtu_bytes(v: u32) -> u32 {
    match v {
        1..=5 => 128 << v,
        _ => 0,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_on_host() {
        // The build/CI host has no RDMA device. (On an RDMA host this checks
        // that a bogus name is reported as "no device".)
        let names = device_names().expect("device_names");
        match Context::open(None) {
            Ok(ctx) => assert!(names.contains(&ctx.name())),
            Err(e) => {
                assert!(names.is_empty());
                assert!(e.is_no_device(), "{e}");
            }
        }
        let e = Context::open(Some("no-such-rdma-device")).expect_err("bogus device opened");
        assert!(e.is_no_device(), "{e}");
    }
}
