//! Where the default pin budget and the reported cgroup limit come from:
//! RLIMIT_MEMLOCK, CAP_IPC_LOCK, and the process's cgroup memory limit.

use std::fs;

use crate::verbs::VerbsError;

/// Bit of CAP_IPC_LOCK in the capability sets of /proc/self/status.
const CAP_IPC_LOCK: u32 = 14;

/// The most bytes this process may pin, as the kernel counts them for RDMA
/// registrations: RLIMIT_MEMLOCK, or `None` (unlimited) when the limit is
/// infinite or the process has CAP_IPC_LOCK (the kernel then skips the check).
pub fn memlock_limit() -> Option<u64> {
    if has_ipc_lock() {
        return None;
    }
    memlock_rlimit().0
}

/// RLIMIT_MEMLOCK's soft and hard limits in bytes (`None`: infinite, or
/// unreadable), whatever the capabilities.
pub fn memlock_rlimit() -> (Option<u64>, Option<u64>) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into our struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return (None, None);
    }
    let finite = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    (finite(limit.rlim_cur), finite(limit.rlim_max))
}

/// Whether a failed registration is the kernel refusing to pin more memory
/// (ENOMEM, EPERM: RLIMIT_MEMLOCK without CAP_IPC_LOCK, or no memory it can
/// pin) rather than a fault of the call.
pub fn is_pin_refusal(e: &VerbsError) -> bool {
    e.errno == libc::ENOMEM || e.errno == libc::EPERM
}

/// What bounds this process's pinning and what to do about it, for the
/// message of a registration the kernel refused: the limit as `ulimit -l`
/// shows it (KiB), CAP_IPC_LOCK, and `rdmamig doctor`.
pub fn memlock_advice() -> String {
    if has_ipc_lock() {
        return "the process has CAP_IPC_LOCK, so RLIMIT_MEMLOCK does not bound it: the host has no more memory \
                the kernel can pin (`rdmamig doctor` checks the host)"
            .into();
    }
    match memlock_rlimit().0 {
        Some(limit) => format!(
            "RLIMIT_MEMLOCK (`ulimit -l`) is {} KiB here and the process lacks CAP_IPC_LOCK: raise the limit or \
             grant the capability (`rdmamig doctor` says how much a migration needs)",
            limit / 1024
        ),
        None => "RLIMIT_MEMLOCK is unlimited here: the host has no more memory the kernel can pin \
                 (`rdmamig doctor` checks the host)"
            .into(),
    }
}

/// Whether this process has CAP_IPC_LOCK in its effective set (the kernel
/// then lets it pin past RLIMIT_MEMLOCK).
pub fn has_ipc_lock() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    effective_caps(&status).is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The `CapEff:` mask of a /proc/<pid>/status text.
fn effective_caps(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The memory limit of this process's cgroup (v2 `memory.max`, or v1
/// `memory.limit_in_bytes`), if it has one that can be read.
pub fn cgroup_memory_limit() -> Option<u64> {
    let cgroups = fs::read_to_string("/proc/self/cgroup").ok()?;
    let (version, path) = memory_cgroup(&cgroups)?;
    let file = match version {
        2 => format!("/sys/fs/cgroup{path}/memory.max"),
        _ => format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"),
    };
    parse_limit(&fs::read_to_string(file).ok()?)
}

/// The memory cgroup of a /proc/<pid>/cgroup text: (1, path) for a v1
/// memory controller, else (2, path) for the unified hierarchy.
fn memory_cgroup(text: &str) -> Option<(u32, &str)> {
    let mut unified = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((1, path));
        }
        if controllers.is_empty() {
            unified = Some((2, path));
        }
    }
    unified
}

/// A cgroup limit file's value: bytes, or `None` for "max" and v1's "no limit" (close to i64::MAX).
fn parse_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes < (i64::MAX as u64 & !0xfff)).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_from_status() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_caps(status), Some(0x1ff_ffff_ffff));
        assert!(effective_caps(status).unwrap() & (1 << CAP_IPC_LOCK) != 0);
        assert_eq!(effective_caps("CapEff:\t0000000000000000\n"), Some(0));
        assert_eq!(effective_caps("Name: x\n"), None);
    }

    #[test]
    fn memory_cgroup_of_both_hierarchies() {
        assert_eq!(memory_cgroup("0::/user.slice/session-1.scope\n"), Some((2, "/user.slice/session-1.scope")));
        let v1 = "12:cpu,cpuacct:/a\n4:memory:/machine/vm1\n0::/\n";
        assert_eq!(memory_cgroup(v1), Some((1, "/machine/vm1")));
        assert_eq!(memory_cgroup("garbage"), None);
    }

    #[test]
    fn limits() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("1073741824\n"), Some(1 << 30));
    }
}
