//! Each of the doctor's findings in words: the item checked, what was found,
//! and what to change.

use rdmamig::doctor::{Finding, ForkMode, Found, LinkLayer, MemoryLimits, PortIssue, Verdict};

use crate::{human, kib};

/// A finding as `rdmamig doctor` prints it.
pub struct Words {
    /// What was checked, e.g. `"rxe0 port 1"`, `"memlock (pin-all)"`.
    pub item: String,
    /// What was found.
    pub detail: String,
    /// What to change (for warn and fail).
    pub fix: Option<String>,
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

/// What bounds pinning: RLIMIT_MEMLOCK, unless CAP_IPC_LOCK.
fn bound(limits: &MemoryLimits) -> String {
    if limits.cap_ipc_lock {
        format!("CAP_IPC_LOCK: no limit (RLIMIT_MEMLOCK {} does not apply)", limit_text(limits.memlock_soft))
    } else {
        format!("RLIMIT_MEMLOCK {} (hard {})", limit_text(limits.memlock_soft), limit_text(limits.memlock_hard))
    }
}

/// The words for `finding`.
pub fn words(finding: &Finding) -> Words {
    let verdict = finding.verdict;
    let (item, detail, fix): (String, String, Option<String>) = match &finding.found {
        Found::DeviceListError(e) => ("devices".into(), format!("cannot list RDMA devices: {e}"), None),
        Found::NoDevice => (
            "devices".into(),
            "no RDMA device on this host (libibverbs lists none)".into(),
            Some(
                "load the NIC's RDMA driver (check with `ibv_devices`), or for Soft-RoCE: `modprobe rdma_rxe; \
                 rdma link add rxe0 type rxe netdev ETH`"
                    .into(),
            ),
        ),
        Found::Devices(names) => ("devices".into(), format!("{} RDMA device(s): {}", names.len(), names.join(", ")), None),
        Found::DeviceError { device, error } => {
            (device.clone(), format!("cannot open or query the device: {error}"), None)
        }
        Found::PortError { device, port, error } => {
            (format!("{device} port {port}"), format!("cannot query the port: {error}"), None)
        }
        Found::Port { device, port, issue } => {
            let detail = format!(
                "{}, {}, active MTU {} (max {}), {} GID(s){}",
                port.state.name(),
                port.link_layer.name(),
                port.active_mtu,
                port.max_mtu,
                port.gids.len(),
                if port.link_layer == LinkLayer::Ethernet {
                    format!(", {} with an IP address", port.ip_gids())
                } else {
                    "".into()
                }
            );
            let fix = issue.map(|issue| match issue {
                PortIssue::Down => "bring the link up (`ip link set ETH up`, cabling, subnet manager)".into(),
                PortIssue::NoAddress => {
                    "give the port's network interface an IP address: RoCE GIDs are its IP addresses".into()
                }
                PortIssue::SmallMtu => format!(
                    "RoCE's MTU follows the interface's: set the interface MTU to at least {} (e.g. 9000) for {}-byte RDMA packets",
                    port.max_mtu + 100,
                    port.max_mtu
                ),
            });
            (format!("{device} port {}", port.port), detail, fix)
        }
        Found::CmResolved { device, address } => {
            (format!("{device} rdma_cm"), format!("bound, address and route resolved on {address}"), None)
        }
        Found::CmFailed { device, address, error } => (
            format!("{device} rdma_cm"),
            format!("on {address}: {error}"),
            Some("check `rdma link show` and that the interface has this address; load rdma_ucm (`modprobe rdma_ucm`)".into()),
        ),
        Found::CmUnchecked { device, reason } => (
            format!("{device} rdma_cm"),
            format!("not checked: {reason}"),
            Some("rdma_cm connects by IP address: give the device's network interface (RoCE) or IPoIB interface an address".into()),
        ),
        Found::NoUsablePort => ("ports".into(), "no active port with an address".into(), None),
        Found::MemlockDynamic { limits, least, full_batches } => {
            let detail = format!(
                "{}; dynamic registration needs at least {} ({} KiB), {} ({} KiB) for full registration batches",
                bound(limits),
                human(*least),
                kib(*least),
                human(*full_batches),
                kib(*full_batches)
            );
            let (detail, fix) = match verdict {
                Verdict::Ok => (detail, None),
                Verdict::Warn => (format!("{detail}: registrations go in smaller batches"), Some(memlock_fix(*full_batches))),
                Verdict::Fail => (detail, Some(memlock_fix(*full_batches))),
            };
            ("memlock (dynamic)".into(), detail, fix)
        }
        Found::MemlockPinAll { limits, guest, need } => {
            let detail = format!(
                "{}; pin-all pins the whole guest ({}) on each side: {} ({} KiB) per process",
                bound(limits),
                human(*guest),
                human(*need),
                kib(*need)
            );
            let (detail, fix) = match verdict {
                Verdict::Ok => (detail, None),
                _ => (
                    format!("{detail}: pin-all would be dropped at connect (dynamic registration instead)"),
                    Some(memlock_fix(*need)),
                ),
            };
            ("memlock (pin-all)".into(), detail, fix)
        }
        Found::MemlockPinAllUnsized { limits, control } => (
            "memlock (pin-all)".into(),
            format!(
                "{}; pin-all needs the guest's size plus {} per process: give --guest-size to check",
                bound(limits),
                human(*control)
            ),
            None,
        ),
        Found::NoCgroupLimit => ("cgroup memory".into(), "no cgroup memory limit".into(), None),
        Found::CgroupLimit { limit, guest } => {
            let (detail, fix) = match (guest, verdict) {
                (Some(guest), Verdict::Fail) => (
                    format!(
                        "cgroup memory limit {} is below the guest's {}: pinned pages are charged to the cgroup and cannot be reclaimed",
                        human(*limit),
                        human(*guest)
                    ),
                    Some(format!(
                        "raise the cgroup's memory.max (systemd: `MemoryMax=`) above {} plus the hypervisor's own memory",
                        human(*guest)
                    )),
                ),
                (Some(guest), _) => {
                    (format!("cgroup memory limit {} holds the guest's {} pinned", human(*limit), human(*guest)), None)
                }
                (None, _) => (
                    format!(
                        "cgroup memory limit {}: pinned guest memory counts against it; give --guest-size to check",
                        human(*limit)
                    ),
                    None,
                ),
            };
            ("cgroup memory".into(), detail, fix)
        }
        Found::ForkSafety { mode, env } => {
            let env = env.as_deref().map_or_else(String::new, |e| format!(" ({e})"));
            let (detail, fix) = match mode {
                ForkMode::Unneeded => (
                    "the kernel copies pinned pages into a forked child (Linux >= 5.13): fork() is safe, no MADV_DONTFORK needed".into(),
                    None,
                ),
                ForkMode::Enabled => (
                    format!("rdma-core's fork support is on{env} (ibv_fork_init: registrations marked MADV_DONTFORK; registration costs a little more)"),
                    None,
                ),
                ForkMode::Disabled => (
                    format!("neither the kernel nor rdma-core protects registered memory across fork(){env}"),
                    Some("use Linux >= 5.13, or set RDMAV_FORK_SAFE=1; a hypervisor that forks should exec at once or use posix_spawn".into()),
                ),
            };
            ("fork safety".into(), detail, fix)
        }
    };
    Words { item, detail, fix }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_fix_gives_the_values_to_set() {
        let limits = MemoryLimits {
            memlock_soft: Some(8 << 20),
            memlock_hard: Some(8 << 20),
            cap_ipc_lock: false,
            effective: Some(8 << 20),
            cgroup_limit: None,
        };
        // `ulimit -l` takes KiB: a need of a byte past 1 GiB asks for a KiB more.
        let found = Found::MemlockPinAll { limits, guest: 1 << 30, need: (1 << 30) + 1 };
        let w = words(&Finding { verdict: Verdict::Warn, found: found.clone() });
        assert_eq!(w.item, "memlock (pin-all)");
        let fix = w.fix.expect("a fix");
        assert!(fix.contains("`ulimit -l 1048577`") && fix.contains("`LimitMEMLOCK=1048577K`"), "{fix}");
        assert!(
            w.detail.ends_with(": pin-all would be dropped at connect (dynamic registration instead)"),
            "{}",
            w.detail
        );
        let w = words(&Finding { verdict: Verdict::Ok, found });
        assert!(w.fix.is_none() && w.detail.ends_with("per process"), "{}", w.detail);
    }
}
