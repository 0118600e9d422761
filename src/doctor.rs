//! What `rdmamig doctor` reports: this host's RDMA devices and ports, whether
//! rdma_cm can use them, the pinning limits against a guest's size, and the
//! fork-safety mode, each finding with a verdict and the facts behind it (the
//! CLI puts them into words and says what to change). Facts come from
//! `verbs` (device queries, rdma_cm) and `host::limits` (RLIMIT_MEMLOCK,
//! CAP_IPC_LOCK, cgroup); the thresholds are the engine's own needs.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::engine::pin::{self, CONTROL_PINNED};
use crate::engine::source::REGISTER_BATCH;
use crate::host::limits;
use crate::verbs::{self, CmEventKind, CmId, EventChannel};
use crate::wire::CHUNK_SIZE;

/// The verbs facts a [`Report`] names.
pub use crate::verbs::{ForkMode, Gid, GidType, LinkLayer, PortState};

/// How long the rdma_cm check waits for each resolution.
const CM_TIMEOUT: Duration = Duration::from_secs(2);

/// A finding's verdict, worst last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Ok,
    /// Migration works, but slower or less safely than it could.
    Warn,
    /// Migration (or the checked mode) does not work until this is changed.
    Fail,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One checked item: what was found, and its verdict. The CLI words it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub verdict: Verdict,
    pub found: Found,
}

/// What a check found, with the facts that say so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// The device list could not be read, and why.
    DeviceListError(String),
    /// libibverbs lists no RDMA device.
    NoDevice,
    /// The RDMA devices, by name.
    Devices(Vec<String>),
    /// A device that could not be opened or queried, and why.
    DeviceError { device: String, error: String },
    /// A port that could not be queried, and why.
    PortError { device: String, port: u8, error: String },
    /// A port, and what keeps it from full use (`None`: nothing).
    Port { device: String, port: PortReport, issue: Option<PortIssue> },
    /// rdma_cm bound to `address` on the device and resolved it and a route to it.
    CmResolved { device: String, address: IpAddr },
    /// rdma_cm failed on `address`, and why.
    CmFailed { device: String, address: IpAddr, error: String },
    /// rdma_cm was not checked, and why (no address to check with).
    CmUnchecked { device: String, reason: String },
    /// No device has an active port with an address.
    NoUsablePort,
    /// The pinning limits against dynamic registration's needs: at `least`
    /// (below: fail), and for full registration batches (below: warn).
    MemlockDynamic { limits: MemoryLimits, least: u64, full_batches: u64 },
    /// The pinning limits against pin-all of a `guest`-byte guest, which
    /// needs `need` bytes pinned per process (not all: warn).
    MemlockPinAll { limits: MemoryLimits, guest: u64, need: u64 },
    /// The pinning limits, without a guest size to check pin-all against:
    /// it needs the guest's size plus `control` bytes per process.
    MemlockPinAllUnsized { limits: MemoryLimits, control: u64 },
    /// The process has no cgroup memory limit.
    NoCgroupLimit,
    /// The cgroup memory limit against the guest's size (`None`: not given;
    /// a guest that does not fit with the control channel: fail).
    CgroupLimit { limit: u64, guest: Option<u64> },
    /// The fork-safety mode, and the environment variable set for it (`NAME=value`).
    ForkSafety { mode: ForkMode, env: Option<String> },
}

/// Why a port that could be queried is not fully usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortIssue {
    /// Not PORT_ACTIVE: the link is down.
    Down,
    /// An Ethernet (RoCE) port without an IP address among its GIDs: rdma_cm
    /// cannot reach it.
    NoAddress,
    /// A RoCE port running below its max MTU: the interface's MTU bounds it.
    SmallMtu,
}

/// One GID table entry that is in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: Gid,
}

/// One port of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortReport {
    /// Numbered from 1.
    pub port: u8,
    pub state: PortState,
    pub link_layer: LinkLayer,
    /// Bytes.
    pub active_mtu: u32,
    pub max_mtu: u32,
    /// The GIDs in use (a non-zero interface ID, the lower 8 bytes), in table order.
    pub gids: Vec<GidEntry>,
    /// Why the port could not be queried (then the rest is empty/default).
    pub error: Option<String>,
}

impl PortReport {
    /// How many of its GIDs are IP addresses (RoCE's are; InfiniBand's are not).
    pub fn ip_gids(&self) -> usize {
        self.gids.iter().filter(|g| g.gid.gid_type != GidType::Ib).count()
    }
}

/// The rdma_cm check of one device: bind an id to the device's address, then
/// resolve that address and a route to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmCheck {
    /// The address tried (from the device's GIDs); `None`: none found.
    pub address: Option<IpAddr>,
    /// `Ok` when the bind landed on this device and both resolutions completed.
    pub result: Result<(), String>,
}

/// One RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceReport {
    pub name: String,
    pub fw_ver: String,
    pub node_guid: u64,
    pub ports: Vec<PortReport>,
    pub cm: CmCheck,
    /// Why the device could not be opened or queried.
    pub error: Option<String>,
}

/// This process's pinning limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimits {
    /// RLIMIT_MEMLOCK soft limit in bytes (`None`: unlimited), as `ulimit -l` shows it (in KiB).
    pub memlock_soft: Option<u64>,
    /// RLIMIT_MEMLOCK hard limit (`ulimit -H -l`).
    pub memlock_hard: Option<u64>,
    /// CAP_IPC_LOCK in the effective set: RLIMIT_MEMLOCK does not apply.
    pub cap_ipc_lock: bool,
    /// What a connection may pin (`None`: no limit): the soft limit, unless CAP_IPC_LOCK.
    pub effective: Option<u64>,
    /// The process's cgroup memory limit (`None`: none or unknown).
    pub cgroup_limit: Option<u64>,
}

/// What one side of a migration needs pinned, per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinNeeds {
    /// Pin-all: the whole guest stays registered (on both sides), plus the control channel.
    pub pin_all: Option<u64>,
    /// Dynamic registration at the least: one chunk registered and the
    /// smallest staging buffer, plus the control channel.
    pub dynamic_min: u64,
    /// Dynamic registration with full registration batches (the source asks
    /// for up to half its budget at once), or the whole guest if smaller.
    pub dynamic_full: u64,
}

impl PinNeeds {
    /// The needs for a guest of `guest_size` bytes (`None`: not known).
    pub fn for_guest(guest_size: Option<u64>) -> PinNeeds {
        let full_batches = 2 * REGISTER_BATCH as u64 * CHUNK_SIZE;
        let dynamic_min = 2 * CHUNK_SIZE + CONTROL_PINNED;
        PinNeeds {
            pin_all: guest_size.map(|g| g + CONTROL_PINNED),
            dynamic_min,
            dynamic_full: guest_size.map_or(full_batches, |g| g.min(full_batches)).max(2 * CHUNK_SIZE) + CONTROL_PINNED,
        }
    }
}

/// What the doctor found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub devices: Vec<DeviceReport>,
    /// Why the device list could not be read (not: that it is empty).
    pub device_list_error: Option<String>,
    pub memory: MemoryLimits,
    /// The guest size checked against (`--guest-size`).
    pub guest_size: Option<u64>,
    pub needs: PinNeeds,
    /// This process's fork safety, as the library sets it up (see `ForkMode`).
    pub fork_mode: ForkMode,
    /// `RDMAV_FORK_SAFE` or `IBV_FORK_SAFE` as set in the environment.
    pub fork_safe_env: Option<String>,
    /// Every finding, in report order.
    pub findings: Vec<Finding>,
}

impl Report {
    /// The worst verdict (`Ok` when nothing was found wrong).
    pub fn verdict(&self) -> Verdict {
        self.findings.iter().map(|f| f.verdict).max().unwrap_or(Verdict::Ok)
    }
}

/// Examines this host for migrating a guest of `guest_size` bytes (`None`:
/// size-dependent checks say what they would need). Opens each RDMA device
/// and sets up the library's fork-safety mode in this process, as a first
/// connection would.
pub fn diagnose(guest_size: Option<u64>) -> Report {
    // Before any verbs object: ibv_fork_init only works then.
    let fork_mode = pin::fork_mode();
    let (devices, device_list_error) = match verbs::device_names() {
        Ok(names) => (names.iter().map(|n| device_report(n)).collect(), None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let (memlock_soft, memlock_hard) = limits::memlock_rlimit();
    let cap_ipc_lock = limits::has_ipc_lock();
    let memory = MemoryLimits {
        memlock_soft,
        memlock_hard,
        cap_ipc_lock,
        effective: if cap_ipc_lock { None } else { memlock_soft },
        cgroup_limit: limits::cgroup_memory_limit(),
    };
    let fork_safe_env = ["RDMAV_FORK_SAFE", "IBV_FORK_SAFE"]
        .iter()
        .find_map(|v| std::env::var(v).ok().map(|value| format!("{v}={value}")));
    let mut report = Report {
        devices,
        device_list_error,
        memory,
        guest_size,
        needs: PinNeeds::for_guest(guest_size),
        fork_mode,
        fork_safe_env,
        findings: Vec::new(),
    };
    report.findings = findings(&report);
    report
}

fn device_report(name: &str) -> DeviceReport {
    let mut report = DeviceReport {
        name: name.to_owned(),
        fw_ver: String::new(),
        node_guid: 0,
        ports: Vec::new(),
        cm: CmCheck { address: None, result: Err("not checked".into()) },
        error: None,
    };
    let ctx = match verbs::Context::open(Some(name)) {
        Ok(ctx) => ctx,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    let attr = match ctx.query_device() {
        Ok(a) => a,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    report.fw_ver = attr.fw_ver;
    report.node_guid = attr.node_guid;
    for port in 1..=attr.phys_port_cnt {
        report.ports.push(port_report(&ctx, port));
    }
    drop(ctx);
    report.cm = match cm_address(&report.ports) {
        None => CmCheck { address: None, result: Err("no IP address in the device's GID table".into()) },
        Some(ip) => CmCheck { address: Some(ip), result: cm_check(name, ip) },
    };
    report
}

fn port_report(ctx: &verbs::Context, port: u8) -> PortReport {
    let mut report = PortReport {
        port,
        state: PortState::Nop,
        link_layer: LinkLayer::Unspecified,
        active_mtu: 0,
        max_mtu: 0,
        gids: Vec::new(),
        error: None,
    };
    let attr = match ctx.query_port(port) {
        Ok(a) => a,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    report.state = attr.state;
    report.link_layer = attr.link_layer;
    report.active_mtu = attr.active_mtu;
    report.max_mtu = attr.max_mtu;
    for index in 0..attr.gid_tbl_len {
        match ctx.query_gid(port, index) {
            // A GID without an interface ID is an unused entry (ibv_devinfo skips it too).
            Ok(Some(gid)) if gid.raw[8..] != [0; 8] => report.gids.push(GidEntry { index, gid }),
            Ok(_) => {}
            Err(e) => {
                report.error = Some(e.to_string());
                break;
            }
        }
    }
    report
}

/// The address to check rdma_cm with: an active port's IPv4 RoCE GID, else
/// a global IPv6 one (a link-local one needs an interface to be used).
fn cm_address(ports: &[PortReport]) -> Option<IpAddr> {
    let gids = || {
        ports
            .iter()
            .filter(|p| p.state == PortState::Active && p.link_layer == LinkLayer::Ethernet)
            .flat_map(|p| p.gids.iter().map(|g| g.gid))
            .filter(|g| matches!(g.gid_type, GidType::RoceV2 | GidType::RoceV1))
    };
    gids()
        .find_map(|g| g.ipv4().map(IpAddr::V4))
        .or_else(|| gids().map(|g| g.ipv6()).find(|ip| ip.segments()[0] & 0xffc0 != 0xfe80).map(IpAddr::V6))
}

/// Binds an rdma_cm id to `ip` (it must land on `device`), then resolves the
/// address and a route to it, as a connecting source does.
fn cm_check(device: &str, ip: IpAddr) -> Result<(), String> {
    let channel = EventChannel::new().map_err(|e| e.to_string())?;
    let bound = CmId::new(&channel).map_err(|e| e.to_string())?;
    bound.bind_addr(&SocketAddr::new(ip, 0)).map_err(|e| e.to_string())?;
    match bound.device_name() {
        Some(name) if name == device => {}
        Some(name) => return Err(format!("binding to {ip} lands on device {name}, not {device}")),
        None => return Err(format!("binding to {ip} found no RDMA device")),
    }
    let id = CmId::new(&channel).map_err(|e| e.to_string())?;
    let ms = CM_TIMEOUT.as_millis() as i32;
    id.resolve_addr(&SocketAddr::new(ip, 0), ms).map_err(|e| e.to_string())?;
    expect(&channel, CmEventKind::AddrResolved)?;
    id.resolve_route(ms).map_err(|e| e.to_string())?;
    expect(&channel, CmEventKind::RouteResolved)
}

fn expect(channel: &EventChannel, kind: CmEventKind) -> Result<(), String> {
    let deadline = Instant::now() + CM_TIMEOUT + Duration::from_secs(1);
    let event = channel
        .get_event(Some(deadline.saturating_duration_since(Instant::now())))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no rdma_cm event within {:?} (waiting for {kind:?})", CM_TIMEOUT))?;
    if event.kind() != kind {
        return Err(format!("expected {kind:?}, got {:?} (status {})", event.kind(), event.status()));
    }
    Ok(())
}

/// The verdicts on what `report` holds (its `findings` are ignored).
pub fn findings(report: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut push = |verdict: Verdict, found: Found| out.push(Finding { verdict, found });

    // Devices, ports, rdma_cm.
    match (&report.device_list_error, report.devices.is_empty()) {
        (Some(e), _) => push(Verdict::Fail, Found::DeviceListError(e.clone())),
        (None, true) => push(Verdict::Fail, Found::NoDevice),
        (None, false) => push(Verdict::Ok, Found::Devices(report.devices.iter().map(|d| d.name.clone()).collect())),
    }
    let mut usable = false;
    for dev in &report.devices {
        let device = || dev.name.clone();
        if let Some(e) = &dev.error {
            push(Verdict::Fail, Found::DeviceError { device: device(), error: e.clone() });
            continue;
        }
        for port in &dev.ports {
            if let Some(e) = &port.error {
                push(Verdict::Fail, Found::PortError { device: device(), port: port.port, error: e.clone() });
                continue;
            }
            let ethernet = port.link_layer == LinkLayer::Ethernet;
            let issue = if port.state != PortState::Active {
                Some(PortIssue::Down)
            } else if ethernet && port.ip_gids() == 0 {
                Some(PortIssue::NoAddress)
            } else if ethernet && port.active_mtu < port.max_mtu {
                Some(PortIssue::SmallMtu)
            } else {
                None
            };
            usable |= matches!(issue, None | Some(PortIssue::SmallMtu));
            let verdict = if issue.is_some() { Verdict::Warn } else { Verdict::Ok };
            push(verdict, Found::Port { device: device(), port: port.clone(), issue });
        }
        match (dev.cm.address, &dev.cm.result) {
            (Some(address), Ok(())) => push(Verdict::Ok, Found::CmResolved { device: device(), address }),
            (Some(address), Err(e)) => {
                push(Verdict::Fail, Found::CmFailed { device: device(), address, error: e.clone() })
            }
            (None, Err(e)) => push(Verdict::Warn, Found::CmUnchecked { device: device(), reason: e.clone() }),
            (None, Ok(())) => {}
        }
    }
    if !report.devices.is_empty() && !usable {
        push(Verdict::Fail, Found::NoUsablePort);
    }

    // Pinning.
    let limits = report.memory;
    let needs = &report.needs;
    let fits = |need: u64| limits.effective.is_none_or(|l| l >= need);
    let dynamic = Found::MemlockDynamic { limits, least: needs.dynamic_min, full_batches: needs.dynamic_full };
    if !fits(needs.dynamic_min) {
        push(Verdict::Fail, dynamic);
    } else if !fits(needs.dynamic_full) {
        push(Verdict::Warn, dynamic);
    } else {
        push(Verdict::Ok, dynamic);
    }
    match (report.guest_size, needs.pin_all) {
        (Some(guest), Some(need)) => {
            let verdict = if fits(need) { Verdict::Ok } else { Verdict::Warn };
            push(verdict, Found::MemlockPinAll { limits, guest, need });
        }
        _ => push(Verdict::Ok, Found::MemlockPinAllUnsized { limits, control: CONTROL_PINNED }),
    }
    match (limits.cgroup_limit, report.guest_size) {
        (None, _) => push(Verdict::Ok, Found::NoCgroupLimit),
        (Some(limit), Some(guest)) if limit < guest + CONTROL_PINNED => {
            push(Verdict::Fail, Found::CgroupLimit { limit, guest: Some(guest) })
        }
        (Some(limit), guest) => push(Verdict::Ok, Found::CgroupLimit { limit, guest }),
    }

    // Fork safety.
    let verdict = if report.fork_mode == ForkMode::Disabled { Verdict::Warn } else { Verdict::Ok };
    push(verdict, Found::ForkSafety { mode: report.fork_mode, env: report.fork_safe_env.clone() });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(memlock: Option<u64>, cap: bool, cgroup: Option<u64>, guest: Option<u64>) -> Report {
        Report {
            devices: Vec::new(),
            device_list_error: None,
            memory: MemoryLimits {
                memlock_soft: memlock,
                memlock_hard: memlock,
                cap_ipc_lock: cap,
                effective: if cap { None } else { memlock },
                cgroup_limit: cgroup,
            },
            guest_size: guest,
            needs: PinNeeds::for_guest(guest),
            fork_mode: ForkMode::Unneeded,
            fork_safe_env: None,
            findings: Vec::new(),
        }
    }

    /// The verdict of the one finding `check` picks.
    fn verdict_of(report: &Report, check: fn(&Found) -> bool) -> Verdict {
        let mut picked = findings(report).into_iter().filter(|f| check(&f.found));
        let finding = picked.next().expect("a finding");
        assert!(picked.next().is_none(), "one finding");
        finding.verdict
    }

    const DYNAMIC: fn(&Found) -> bool = |f| matches!(f, Found::MemlockDynamic { .. });
    const PIN_ALL: fn(&Found) -> bool = |f| matches!(f, Found::MemlockPinAll { .. });
    const CGROUP: fn(&Found) -> bool = |f| matches!(f, Found::CgroupLimit { .. });

    #[test]
    fn memlock_against_the_guest() {
        let g = 1 << 30;
        // Debian's default 8 MiB: dynamic works (small batches), pin-all of 1 GiB does not.
        let r = host(Some(8 << 20), false, None, Some(g));
        assert_eq!(verdict_of(&r, DYNAMIC), Verdict::Warn);
        assert_eq!(verdict_of(&r, PIN_ALL), Verdict::Warn);
        // What the fix must raise the limit to: the guest and the control channel.
        let pin_all = findings(&r).into_iter().find(|f| PIN_ALL(&f.found)).unwrap().found;
        assert_eq!(pin_all, Found::MemlockPinAll { limits: r.memory, guest: g, need: g + CONTROL_PINNED });
        // 64 KiB (old distributions): dynamic cannot work.
        assert_eq!(verdict_of(&host(Some(64 << 10), false, None, Some(g)), DYNAMIC), Verdict::Fail);
        // CAP_IPC_LOCK, or unlimited: everything fits.
        for r in [host(Some(64 << 10), true, None, Some(g)), host(None, false, None, Some(g))] {
            assert_eq!(verdict_of(&r, DYNAMIC), Verdict::Ok);
            assert_eq!(verdict_of(&r, PIN_ALL), Verdict::Ok);
        }
        // Exactly enough is enough.
        let r = host(Some(g + CONTROL_PINNED), false, None, Some(g));
        assert_eq!(verdict_of(&r, PIN_ALL), Verdict::Ok);
        let r = host(Some(g + CONTROL_PINNED - 1), false, None, Some(g));
        assert_eq!(verdict_of(&r, PIN_ALL), Verdict::Warn);
        // No guest size: pin-all says what it would need on top of the guest.
        let r = host(Some(8 << 20), false, None, None);
        assert!(findings(&r)
            .iter()
            .any(|f| f.found == Found::MemlockPinAllUnsized { limits: r.memory, control: CONTROL_PINNED }));
    }

    #[test]
    fn cgroup_and_devices() {
        let r = host(None, false, Some(512 << 20), Some(1 << 30));
        assert_eq!(verdict_of(&r, CGROUP), Verdict::Fail);
        assert_eq!(verdict_of(&host(None, false, Some(4 << 30), Some(1 << 30)), CGROUP), Verdict::Ok);
        // No device: a failure that says so.
        assert_eq!(verdict_of(&r, |f| *f == Found::NoDevice), Verdict::Fail);
        let mut r = host(None, false, None, None);
        r.findings = findings(&r);
        assert_eq!(r.verdict(), Verdict::Fail);
    }

    /// A RoCE port of rxe0, up, with an IPv4 GID, at its max MTU.
    fn roce_port(port: u8) -> PortReport {
        let mut raw = [0; 16];
        raw[10..].copy_from_slice(&[0xff, 0xff, 198, 18, 0, 1]);
        PortReport {
            port,
            state: PortState::Active,
            link_layer: LinkLayer::Ethernet,
            active_mtu: 4096,
            max_mtu: 4096,
            gids: vec![GidEntry { index: 1, gid: Gid { raw, gid_type: GidType::RoceV2 } }],
            error: None,
        }
    }

    #[test]
    fn ports_and_what_keeps_them_from_use() {
        let down = PortReport { state: PortState::Down, ..roce_port(1) };
        let no_address = PortReport { gids: Vec::new(), ..roce_port(2) };
        let small_mtu = PortReport { active_mtu: 1024, ..roce_port(3) };
        let mut r = host(None, false, None, None);
        r.devices = vec![DeviceReport {
            name: "rxe0".into(),
            fw_ver: String::new(),
            node_guid: 0,
            ports: vec![down, no_address, small_mtu, roce_port(4)],
            cm: CmCheck { address: None, result: Err("no address".into()) },
            error: None,
        }];
        let issues: Vec<_> = findings(&r)
            .into_iter()
            .filter_map(|f| match f.found {
                Found::Port { port, issue, .. } => Some((port.port, issue, f.verdict)),
                _ => None,
            })
            .collect();
        assert_eq!(
            issues,
            [
                (1, Some(PortIssue::Down), Verdict::Warn),
                (2, Some(PortIssue::NoAddress), Verdict::Warn),
                (3, Some(PortIssue::SmallMtu), Verdict::Warn),
                (4, None, Verdict::Ok)
            ]
        );
        // A port below its max MTU is usable; one down or without an address is not.
        r.devices[0].ports.truncate(3);
        assert!(!findings(&r).iter().any(|f| f.found == Found::NoUsablePort), "a port below its MTU is usable");
        r.devices[0].ports.truncate(2);
        assert_eq!(verdict_of(&r, |f| *f == Found::NoUsablePort), Verdict::Fail);
    }
}
