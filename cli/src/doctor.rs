//! `rdmamig doctor`: the library's `doctor::diagnose` report, as text or JSON.

mod findings;

use std::process::ExitCode;

use findings::words;
use rdmamig::doctor::{self, Report, Verdict};
use rdmamig::doctor::{ForkMode, GidType};
use serde_json::{json, Value};

use crate::{human, kib};

pub fn run(guest_size: Option<u64>, as_json: bool) -> ExitCode {
    let report = doctor::diagnose(guest_size);
    if as_json {
        println!("{}", serde_json::to_string_pretty(&to_json(&report)).expect("JSON of plain values"));
    } else {
        print!("{}", text(&report));
    }
    if report.verdict() == Verdict::Fail {
        ExitCode::from(crate::EXIT_FAIL)
    } else {
        ExitCode::SUCCESS
    }
}

/// A limit as `ulimit -l` prints it: KiB, or "unlimited".
fn ulimit_text(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".into(), |l| (l / 1024).to_string())
}

/// A limit in KiB with its unit, or "unlimited".
fn kib_text(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".into(), |l| format!("{} KiB", l / 1024))
}

fn fork_name(mode: ForkMode) -> &'static str {
    match mode {
        ForkMode::Unneeded => "kernel-copy-on-fork",
        ForkMode::Enabled => "ibv_fork_init",
        ForkMode::Disabled => "unprotected",
    }
}

fn gid_hex(raw: &[u8; 16]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

fn to_json(r: &Report) -> Value {
    let devices: Vec<Value> = r
        .devices
        .iter()
        .map(|d| {
            let ports: Vec<Value> = d
                .ports
                .iter()
                .map(|p| {
                    let gids: Vec<Value> = p
                        .gids
                        .iter()
                        .map(|g| {
                            json!({
                                "index": g.index,
                                "raw": gid_hex(&g.gid.raw),
                                "ipv6": g.gid.ipv6().to_string(),
                                "ipv4": g.gid.ipv4().map(|ip| ip.to_string()),
                                "type": g.gid.gid_type.name(),
                            })
                        })
                        .collect();
                    json!({
                        "port": p.port,
                        "state": p.state.name(),
                        "state_raw": p.state.raw(),
                        "link_layer": p.link_layer.name(),
                        "active_mtu": p.active_mtu,
                        "max_mtu": p.max_mtu,
                        "gids": gids,
                        "error": p.error,
                    })
                })
                .collect();
            json!({
                "name": d.name,
                "fw_ver": d.fw_ver,
                "node_guid": format!("{:016x}", d.node_guid),
                "ports": ports,
                "rdma_cm": {
                    "address": d.cm.address.map(|a| a.to_string()),
                    "ok": d.cm.result.is_ok(),
                    "error": d.cm.result.as_ref().err(),
                },
                "error": d.error,
            })
        })
        .collect();
    let m = &r.memory;
    let findings: Vec<Value> = r
        .findings
        .iter()
        .map(|f| {
            let w = words(f);
            json!({"item": w.item, "verdict": f.verdict.name(), "detail": w.detail, "fix": w.fix})
        })
        .collect();
    json!({
        "version": rdmamig::VERSION,
        "verdict": r.verdict().name(),
        "devices": devices,
        "device_list_error": r.device_list_error,
        "memlock": {
            "soft_bytes": m.memlock_soft,
            "hard_bytes": m.memlock_hard,
            "ulimit_l": ulimit_text(m.memlock_soft),
            "ulimit_hard_l": ulimit_text(m.memlock_hard),
            "cap_ipc_lock": m.cap_ipc_lock,
            "effective_bytes": m.effective,
        },
        "cgroup_memory_limit_bytes": m.cgroup_limit,
        "guest_size_bytes": r.guest_size,
        "needs": {
            "pin_all_bytes": r.needs.pin_all,
            "pin_all_ulimit_l": r.needs.pin_all.map(kib),
            "dynamic_min_bytes": r.needs.dynamic_min,
            "dynamic_min_ulimit_l": kib(r.needs.dynamic_min),
            "dynamic_full_bytes": r.needs.dynamic_full,
            "dynamic_full_ulimit_l": kib(r.needs.dynamic_full),
        },
        "fork": {"mode": fork_name(r.fork_mode), "env": r.fork_safe_env},
        "findings": findings,
    })
}

fn text(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "rdmamig doctor (rdmamig {})", rdmamig::VERSION);
    let _ = writeln!(s, "\nRDMA devices");
    if r.devices.is_empty() {
        let why = r.device_list_error.as_deref().unwrap_or("libibverbs lists none");
        let _ = writeln!(s, "  none ({why})");
    }
    for d in &r.devices {
        let g = d.node_guid;
        let _ = writeln!(
            s,
            "  {}: fw {}, node GUID {:04x}:{:04x}:{:04x}:{:04x}",
            d.name,
            if d.fw_ver.is_empty() { "-" } else { &d.fw_ver },
            g >> 48,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        );
        if let Some(e) = &d.error {
            let _ = writeln!(s, "    error: {e}");
        }
        for p in &d.ports {
            let _ = writeln!(
                s,
                "    port {}: {}, {}, active MTU {} (max {})",
                p.port,
                p.state.name(),
                p.link_layer.name(),
                p.active_mtu,
                p.max_mtu
            );
            for g in &p.gids {
                let ip = match (g.gid.gid_type, g.gid.ipv4()) {
                    (GidType::Ib, _) => String::new(),
                    (_, Some(v4)) => format!("IPv4 {v4}"),
                    (_, None) => format!("IPv6 {}", g.gid.ipv6()),
                };
                let _ = writeln!(s, "      GID[{:3}] {:<40} {:<8} {ip}", g.index, g.gid.ipv6(), g.gid.gid_type.name());
            }
            if let Some(e) = &p.error {
                let _ = writeln!(s, "      error: {e}");
            }
        }
        match (&d.cm.address, &d.cm.result) {
            (Some(a), Ok(())) => {
                let _ = writeln!(s, "    rdma_cm: bind and resolve on {a}: ok");
            }
            (Some(a), Err(e)) => {
                let _ = writeln!(s, "    rdma_cm: on {a}: {e}");
            }
            (None, Err(e)) => {
                let _ = writeln!(s, "    rdma_cm: not checked ({e})");
            }
            (None, Ok(())) => {}
        }
    }
    let m = &r.memory;
    let _ = writeln!(s, "\nLimits of this process");
    let _ = writeln!(
        s,
        "  RLIMIT_MEMLOCK   soft {}, hard {} (`ulimit -l`: {}); CAP_IPC_LOCK: {}",
        kib_text(m.memlock_soft),
        kib_text(m.memlock_hard),
        ulimit_text(m.memlock_soft),
        if m.cap_ipc_lock { "yes (no memlock limit applies)" } else { "no" }
    );
    let _ = writeln!(s, "  cgroup memory    {}", m.cgroup_limit.map_or_else(|| "no limit".into(), human));
    let n = &r.needs;
    match (r.guest_size, n.pin_all) {
        (Some(g), Some(p)) => {
            let _ = writeln!(
                s,
                "  guest {}:      pin-all needs {} KiB per side; dynamic {} KiB at least, {} KiB for full batches",
                human(g),
                kib(p),
                kib(n.dynamic_min),
                kib(n.dynamic_full)
            );
        }
        _ => {
            let _ = writeln!(
                s,
                "  needs            dynamic {} KiB at least, {} KiB for full batches; pin-all: the guest's size \
                 (--guest-size)",
                kib(n.dynamic_min),
                kib(n.dynamic_full)
            );
        }
    }
    let _ = writeln!(
        s,
        "  fork safety      {}{}",
        fork_name(r.fork_mode),
        r.fork_safe_env.as_deref().map_or_else(String::new, |e| format!(" ({e})"))
    );
    let _ = writeln!(s, "\nVerdicts");
    for f in &r.findings {
        let w = words(f);
        let _ = writeln!(s, "  [{:>4}] {}: {}", f.verdict.name(), w.item, w.detail);
        if let Some(fix) = &w.fix {
            let _ = writeln!(s, "         fix: {fix}");
        }
    }
    let fails = r.findings.iter().filter(|f| f.verdict == Verdict::Fail).count();
    let warns = r.findings.iter().filter(|f| f.verdict == Verdict::Warn).count();
    let _ = writeln!(
        s,
        "\n{}: {} ok, {warns} warning(s), {fails} failure(s)",
        match r.verdict() {
            Verdict::Fail => "FAIL",
            Verdict::Warn => "OK with warnings",
            Verdict::Ok => "OK",
        },
        r.findings.len() - fails - warns
    );
    s
}
