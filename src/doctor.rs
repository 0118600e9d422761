//! What `rdmamig doctor` reports: this host's RDMA devices and ports, whether
//! rdma_cm can use them, the pinning limits against a guest's size, and the
//! fork-safety mode, each with a verdict and what to change. Facts come from
//! `verbs` (device queries, rdma_cm) and `pin` (RLIMIT_MEMLOCK,
//! CAP_IPC_LOCK, cgroup); the thresholds are the engine's own needs.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::engine::pin::{self, CONTROL_PINNED};
use crate::engine::source::REGISTER_BATCH;
use crate::host::limits;
use crate::verbs::{self, CmEventKind, CmId, EventChannel, Gid, LinkLayer, PortState};
use crate::wire::CHUNK_SIZE;

/// The verbs facts a [`Report`] names.
pub use crate::verbs::{ForkMode, GidType};

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

/// One checked item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What was checked, e.g. `"rxe0 port 1"`, `"memlock (pin-all)"`.
    pub item: String,
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// What to change (for warn and fail).
    pub fix: Option<String>,
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

/// Bytes as `ulimit -l` takes them: KiB, rounded up.
pub fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024)
}

/// Bytes for people: "1.5 GiB", "64 MiB".
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// What to set for a memlock limit of `bytes`.
fn memlock_fix(bytes: u64) -> String {
    let k = kib(bytes);
    format!(
        "raise RLIMIT_MEMLOCK to at least {k} KiB: `ulimit -l {k}` in the shell that starts the hypervisor \
         (the hard limit must allow it: /etc/security/limits.conf `memlock`), or `LimitMEMLOCK={k}K` in its \
         systemd unit's [Service] section; or give it CAP_IPC_LOCK"
    )
}

fn limit_text(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".into(), |l| format!("{} ({} KiB)", human(l), kib(l)))
}

/// The verdicts on what `report` holds (its `findings` are ignored).
pub fn findings(report: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut push = |item: String, verdict: Verdict, detail: String, fix: Option<String>| {
        out.push(Finding { item, verdict, detail, fix });
    };

    // Devices, ports, rdma_cm.
    match (&report.device_list_error, report.devices.is_empty()) {
        (Some(e), _) => push("devices".into(), Verdict::Fail, format!("cannot list RDMA devices: {e}"), None),
        (None, true) => push(
            "devices".into(),
            Verdict::Fail,
            "no RDMA device on this host (libibverbs lists none)".into(),
            Some(
                "load the NIC's RDMA driver (check with `ibv_devices`), or for Soft-RoCE: `modprobe rdma_rxe; \
                 rdma link add rxe0 type rxe netdev ETH`"
                    .into(),
            ),
        ),
        (None, false) => {
            let names: Vec<&str> = report.devices.iter().map(|d| d.name.as_str()).collect();
            push("devices".into(), Verdict::Ok, format!("{} RDMA device(s): {}", names.len(), names.join(", ")), None)
        }
    }
    let mut usable = false;
    for dev in &report.devices {
        if let Some(e) = &dev.error {
            push(dev.name.clone(), Verdict::Fail, format!("cannot open or query the device: {e}"), None);
            continue;
        }
        for port in &dev.ports {
            let item = format!("{} port {}", dev.name, port.port);
            if let Some(e) = &port.error {
                push(item, Verdict::Fail, format!("cannot query the port: {e}"), None);
                continue;
            }
            let ips = port.gids.iter().filter(|g| g.gid.gid_type != GidType::Ib).count();
            let detail = format!(
                "{}, {}, active MTU {} (max {}), {} GID(s){}",
                port.state.name(),
                port.link_layer.name(),
                port.active_mtu,
                port.max_mtu,
                port.gids.len(),
                if port.link_layer == LinkLayer::Ethernet { format!(", {ips} with an IP address") } else { "".into() }
            );
            if port.state != PortState::Active {
                push(
                    item,
                    Verdict::Warn,
                    detail,
                    Some("bring the link up (`ip link set ETH up`, cabling, subnet manager)".into()),
                );
            } else if port.link_layer == LinkLayer::Ethernet && ips == 0 {
                push(
                    item,
                    Verdict::Warn,
                    detail,
                    Some("give the port's network interface an IP address: RoCE GIDs are its IP addresses".into()),
                );
            } else if port.link_layer == LinkLayer::Ethernet && port.active_mtu < port.max_mtu {
                usable = true;
                push(
                    item,
                    Verdict::Warn,
                    detail,
                    Some(format!(
                        "RoCE's MTU follows the interface's: set the interface MTU to at least {} (e.g. 9000) for {}-byte RDMA packets",
                        port.max_mtu + 100,
                        port.max_mtu
                    )),
                );
            } else {
                usable = true;
                push(item, Verdict::Ok, detail, None);
            }
        }
        let item = format!("{} rdma_cm", dev.name);
        match (&dev.cm.address, &dev.cm.result) {
            (Some(ip), Ok(())) => push(item, Verdict::Ok, format!("bound, address and route resolved on {ip}"), None),
            (Some(ip), Err(e)) => push(
                item,
                Verdict::Fail,
                format!("on {ip}: {e}"),
                Some("check `rdma link show` and that the interface has this address; load rdma_ucm (`modprobe rdma_ucm`)".into()),
            ),
            (None, Err(e)) => push(
                item,
                Verdict::Warn,
                format!("not checked: {e}"),
                Some("rdma_cm connects by IP address: give the device's network interface (RoCE) or IPoIB interface an address".into()),
            ),
            (None, Ok(())) => {}
        }
    }
    if !report.devices.is_empty() && !usable {
        push("ports".into(), Verdict::Fail, "no active port with an address".into(), None);
    }

    // Pinning.
    let mem = &report.memory;
    let needs = &report.needs;
    let limit = mem.effective;
    let why_limit = if mem.cap_ipc_lock {
        format!("CAP_IPC_LOCK: no limit (RLIMIT_MEMLOCK {} does not apply)", limit_text(mem.memlock_soft))
    } else {
        format!("RLIMIT_MEMLOCK {} (hard {})", limit_text(mem.memlock_soft), limit_text(mem.memlock_hard))
    };
    let fits = |need: u64| limit.is_none_or(|l| l >= need);
    let dyn_detail = format!(
        "{why_limit}; dynamic registration needs at least {} ({} KiB), {} ({} KiB) for full registration batches",
        human(needs.dynamic_min),
        kib(needs.dynamic_min),
        human(needs.dynamic_full),
        kib(needs.dynamic_full)
    );
    if !fits(needs.dynamic_min) {
        push("memlock (dynamic)".into(), Verdict::Fail, dyn_detail, Some(memlock_fix(needs.dynamic_full)));
    } else if !fits(needs.dynamic_full) {
        push(
            "memlock (dynamic)".into(),
            Verdict::Warn,
            format!("{dyn_detail}: registrations go in smaller batches"),
            Some(memlock_fix(needs.dynamic_full)),
        );
    } else {
        push("memlock (dynamic)".into(), Verdict::Ok, dyn_detail, None);
    }
    match (report.guest_size, needs.pin_all) {
        (Some(guest), Some(need)) => {
            let detail = format!(
                "{why_limit}; pin-all pins the whole guest ({}) on each side: {} ({} KiB) per process",
                human(guest),
                human(need),
                kib(need)
            );
            if fits(need) {
                push("memlock (pin-all)".into(), Verdict::Ok, detail, None);
            } else {
                push(
                    "memlock (pin-all)".into(),
                    Verdict::Warn,
                    format!("{detail}: pin-all would be dropped at connect (dynamic registration instead)"),
                    Some(memlock_fix(need)),
                );
            }
        }
        _ => push(
            "memlock (pin-all)".into(),
            Verdict::Ok,
            format!(
                "{why_limit}; pin-all needs the guest's size plus {} per process: give --guest-size to check",
                human(CONTROL_PINNED)
            ),
            None,
        ),
    }
    match (mem.cgroup_limit, report.guest_size) {
        (None, _) => push("cgroup memory".into(), Verdict::Ok, "no cgroup memory limit".into(), None),
        (Some(cg), Some(guest)) if cg < guest + CONTROL_PINNED => push(
            "cgroup memory".into(),
            Verdict::Fail,
            format!("cgroup memory limit {} is below the guest's {}: pinned pages are charged to the cgroup and cannot be reclaimed", human(cg), human(guest)),
            Some(format!("raise the cgroup's memory.max (systemd: `MemoryMax=`) above {} plus the hypervisor's own memory", human(guest))),
        ),
        (Some(cg), Some(guest)) => push(
            "cgroup memory".into(),
            Verdict::Ok,
            format!("cgroup memory limit {} holds the guest's {} pinned", human(cg), human(guest)),
            None,
        ),
        (Some(cg), None) => push(
            "cgroup memory".into(),
            Verdict::Ok,
            format!("cgroup memory limit {}: pinned guest memory counts against it; give --guest-size to check", human(cg)),
            None,
        ),
    }

    // Fork safety.
    let env = report.fork_safe_env.as_deref().map_or_else(String::new, |e| format!(" ({e})"));
    match report.fork_mode {
        ForkMode::Unneeded => push(
            "fork safety".into(),
            Verdict::Ok,
            "the kernel copies pinned pages into a forked child (Linux >= 5.13): fork() is safe, no MADV_DONTFORK needed".into(),
            None,
        ),
        ForkMode::Enabled => push(
            "fork safety".into(),
            Verdict::Ok,
            format!("rdma-core's fork support is on{env} (ibv_fork_init: registrations marked MADV_DONTFORK; registration costs a little more)"),
            None,
        ),
        ForkMode::Disabled => push(
            "fork safety".into(),
            Verdict::Warn,
            format!("neither the kernel nor rdma-core protects registered memory across fork(){env}"),
            Some("use Linux >= 5.13, or set RDMAV_FORK_SAFE=1; a hypervisor that forks should exec at once or use posix_spawn".into()),
        ),
    }
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

    fn verdict_of(report: &Report, item: &str) -> Verdict {
        findings(report).into_iter().find(|f| f.item == item).unwrap_or_else(|| panic!("no {item}")).verdict
    }

    #[test]
    fn memlock_against_the_guest() {
        let g = 1 << 30;
        // Debian's default 8 MiB: dynamic works (small batches), pin-all of 1 GiB does not.
        let r = host(Some(8 << 20), false, None, Some(g));
        assert_eq!(verdict_of(&r, "memlock (dynamic)"), Verdict::Warn);
        assert_eq!(verdict_of(&r, "memlock (pin-all)"), Verdict::Warn);
        let fix = findings(&r).into_iter().find(|f| f.item == "memlock (pin-all)").unwrap().fix.unwrap();
        let k = kib(g + CONTROL_PINNED);
        assert!(fix.contains(&format!("ulimit -l {k}`")) && fix.contains(&format!("LimitMEMLOCK={k}K")), "{fix}");
        // 64 KiB (old distributions): dynamic cannot work.
        assert_eq!(verdict_of(&host(Some(64 << 10), false, None, Some(g)), "memlock (dynamic)"), Verdict::Fail);
        // CAP_IPC_LOCK, or unlimited: everything fits.
        for r in [host(Some(64 << 10), true, None, Some(g)), host(None, false, None, Some(g))] {
            assert_eq!(verdict_of(&r, "memlock (dynamic)"), Verdict::Ok);
            assert_eq!(verdict_of(&r, "memlock (pin-all)"), Verdict::Ok);
        }
        // Exactly enough is enough.
        let r = host(Some(g + CONTROL_PINNED), false, None, Some(g));
        assert_eq!(verdict_of(&r, "memlock (pin-all)"), Verdict::Ok);
        let r = host(Some(g + CONTROL_PINNED - 1), false, None, Some(g));
        assert_eq!(verdict_of(&r, "memlock (pin-all)"), Verdict::Warn);
    }

    #[test]
    fn cgroup_and_devices() {
        let r = host(None, false, Some(512 << 20), Some(1 << 30));
        assert_eq!(verdict_of(&r, "cgroup memory"), Verdict::Fail);
        assert_eq!(verdict_of(&host(None, false, Some(4 << 30), Some(1 << 30)), "cgroup memory"), Verdict::Ok);
        // No device: a failure that says so.
        let f = findings(&r).into_iter().find(|f| f.item == "devices").unwrap();
        assert_eq!(f.verdict, Verdict::Fail);
        assert!(f.detail.contains("no RDMA device"), "{}", f.detail);
        let mut r = host(None, false, None, None);
        r.findings = findings(&r);
        assert_eq!(r.verdict(), Verdict::Fail);
    }

    #[test]
    fn sizes() {
        assert_eq!(kib(1), 1);
        assert_eq!(kib(1024), 1);
        assert_eq!(kib(1025), 2);
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(100), "100 bytes");
    }
}
