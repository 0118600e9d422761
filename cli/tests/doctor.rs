//! `rdmamig doctor` against rdma-core's `ibv_devinfo -v` and the shell's
//! `ulimit -l`, run in the same environment: on the build host (no RDMA
//! device: both must say so) and in the rxe guest (scripts/rdma-suite.sh
//! runs this binary there with RDMAMIG_EXPECT_DEVICE=rxe0). Also the exit
//! statuses, `--help` and the man pages.

use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::process::{Command, Output};

use serde_json::Value;

/// The binary under test (RDMAMIG_BIN overrides it: to show a broken build fails).
fn exe() -> String {
    std::env::var("RDMAMIG_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rdmamig").to_owned())
}

fn sh(script: &str) -> Output {
    Command::new("sh").arg("-c").arg(script).env("RDMAMIG", exe()).output().expect("sh runs")
}

/// What `ibv_devinfo -v` says about a port.
#[derive(Debug, Default, PartialEq)]
struct DevinfoPort {
    state: String,
    active_mtu: u32,
    max_mtu: u32,
    link_layer: String,
    /// index -> (16 bytes, type as printed: "RoCE v2", "IB", "" when not printed).
    gids: BTreeMap<u32, ([u8; 16], String)>,
}

/// device -> port -> facts, from `ibv_devinfo -v`'s text.
fn parse_devinfo(text: &str) -> BTreeMap<String, BTreeMap<u8, DevinfoPort>> {
    let mut out: BTreeMap<String, BTreeMap<u8, DevinfoPort>> = BTreeMap::new();
    let (mut dev, mut port) = (String::new(), 0u8);
    for line in text.lines() {
        let l = line.trim();
        let value = |key: &str| l.strip_prefix(key).map(|v| v.trim().to_owned());
        if let Some(v) = value("hca_id:") {
            (dev, port) = (v, 0);
            out.entry(dev.clone()).or_default();
        } else if let Some(v) = value("port:") {
            port = v.parse().expect("port number");
            out.get_mut(&dev).expect("a device").entry(port).or_default();
        } else if port != 0 {
            let p = out.get_mut(&dev).and_then(|d| d.get_mut(&port)).expect("a port");
            let first = |v: String| v.split_whitespace().next().unwrap_or_default().to_owned();
            if let Some(v) = value("state:") {
                p.state = first(v);
            } else if let Some(v) = value("active_mtu:") {
                p.active_mtu = first(v).parse().unwrap_or(0);
            } else if let Some(v) = value("max_mtu:") {
                p.max_mtu = first(v).parse().unwrap_or(0);
            } else if let Some(v) = value("link_layer:") {
                p.link_layer = v;
            } else if let Some(rest) = l.strip_prefix("GID[") {
                let (index, rest) = rest.split_once("]:").expect("GID[n]:");
                let (gid, kind) = rest.trim().split_once(", ").unwrap_or((rest.trim(), ""));
                p.gids.insert(index.trim().parse().expect("GID index"), (parse_gid(gid), kind.to_owned()));
            }
        }
    }
    out
}

/// A GID as ibv_devinfo prints it: inet_ntop's IPv6 form, or (older
/// rdma-core) eight groups of four hex digits, which parse as IPv6 too.
fn parse_gid(s: &str) -> [u8; 16] {
    s.parse::<Ipv6Addr>().unwrap_or_else(|e| panic!("GID {s:?}: {e}")).octets()
}

fn hex(raw: &[u8; 16]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn doctor_matches_ibv_devinfo_and_ulimit() {
    // One shell: the limits the doctor reads are the ones `ulimit` prints.
    let out = sh(r#"ulimit -l; ulimit -H -l; exec "$RDMAMIG" doctor --json --guest-size 1G"#);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.splitn(3, '\n');
    let (soft, hard, json) = (lines.next().unwrap(), lines.next().unwrap(), lines.next().unwrap_or_default());
    let report: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("doctor --json: {e}\n{stdout}"));
    assert_eq!(report["memlock"]["ulimit_l"], soft, "RLIMIT_MEMLOCK vs `ulimit -l`");
    assert_eq!(report["memlock"]["ulimit_hard_l"], hard, "hard RLIMIT_MEMLOCK vs `ulimit -H -l`");

    let devinfo = Command::new("ibv_devinfo").arg("-v").output();
    let devices = report["devices"].as_array().expect("devices");
    let expected = match devinfo {
        Ok(o) => parse_devinfo(&String::from_utf8_lossy(&o.stdout)),
        Err(e) => {
            assert!(devices.is_empty(), "doctor found devices but ibv_devinfo cannot run ({e}): install ibverbs-utils");
            eprintln!("ibv_devinfo cannot run ({e}): only the no-device case is checked");
            BTreeMap::new()
        }
    };
    if let Ok(want) = std::env::var("RDMAMIG_EXPECT_DEVICE") {
        assert!(expected.contains_key(&want), "ibv_devinfo does not list {want}: {expected:?}");
    }
    let names: Vec<&str> = devices.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, expected.keys().map(String::as_str).collect::<Vec<_>>(), "devices vs ibv_devinfo");

    let verdict_of = |item: &str| {
        report["findings"].as_array().unwrap().iter().find(|f| f["item"] == item).map(|f| f["verdict"].clone())
    };
    if devices.is_empty() {
        // No device: said cleanly, as a failure, exit status 1.
        assert_eq!(verdict_of("devices"), Some("fail".into()));
        assert_eq!(report["verdict"], "fail");
        assert_eq!(out.status.code(), Some(1), "no device is a failure");
    }
    for d in devices {
        let name = d["name"].as_str().unwrap();
        let want_ports = &expected[name];
        let ports = d["ports"].as_array().unwrap();
        assert_eq!(ports.len(), want_ports.len(), "{name}: ports");
        for p in ports {
            let n = p["port"].as_u64().unwrap() as u8;
            let want = &want_ports[&n];
            assert_eq!(p["state"], want.state.as_str(), "{name} port {n}: state");
            assert_eq!(p["active_mtu"], want.active_mtu, "{name} port {n}: active MTU");
            assert_eq!(p["max_mtu"], want.max_mtu, "{name} port {n}: max MTU");
            assert_eq!(p["link_layer"], want.link_layer.as_str(), "{name} port {n}: link layer");
            let gids: BTreeMap<u32, (String, String)> = p["gids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| {
                    let index = g["index"].as_u64().unwrap() as u32;
                    (index, (g["raw"].as_str().unwrap().to_owned(), g["type"].as_str().unwrap().to_owned()))
                })
                .collect();
            let want_gids: BTreeMap<u32, String> = want.gids.iter().map(|(i, (raw, _))| (*i, hex(raw))).collect();
            let got_gids: BTreeMap<u32, String> = gids.iter().map(|(i, (raw, _))| (*i, raw.clone())).collect();
            assert_eq!(got_gids, want_gids, "{name} port {n}: GIDs");
            for (i, (_, kind)) in &want.gids {
                // Older ibv_devinfo prints no type.
                if !kind.is_empty() {
                    assert!(gids[i].1.eq_ignore_ascii_case(kind), "{name} port {n} GID {i}: {} vs {kind}", gids[i].1);
                }
            }
            // The IPv4 form of a mapped GID.
            for g in p["gids"].as_array().unwrap() {
                let ip: Ipv6Addr = g["ipv6"].as_str().unwrap().parse().unwrap();
                assert_eq!(g["ipv4"].as_str().map(str::to_owned), ip.to_ipv4_mapped().map(|v| v.to_string()));
            }
            println!(
                "{name} port {n}: {} {} MTU {} GIDs {:?}",
                want.state, want.link_layer, want.active_mtu, want_gids
            );
        }
        // In the guest: rdma_cm works on the device's address.
        if std::env::var("RDMAMIG_EXPECT_DEVICE").as_deref() == Ok(name) {
            assert_eq!(d["rdma_cm"]["ok"], true, "{name}: rdma_cm: {}", d["rdma_cm"]);
            assert_ne!(report["verdict"], "fail", "{report:#}");
            assert_eq!(out.status.code(), Some(0));
        }
    }
}

/// With a lowered RLIMIT_MEMLOCK (and, as root, without CAP_IPC_LOCK), the
/// verdicts and the values to set follow the limit.
#[test]
fn doctor_memlock_verdicts_follow_the_limit() {
    // SAFETY: geteuid has no preconditions.
    let drop_cap = if unsafe { libc::geteuid() } == 0 && Command::new("setpriv").arg("--version").output().is_ok() {
        "setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock"
    } else {
        ""
    };
    let out =
        sh(&format!(r#"ulimit -l 1024 && ulimit -l && exec {drop_cap} "$RDMAMIG" doctor --json --guest-size 1G"#));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (soft, json) = stdout.split_once('\n').expect("ulimit output");
    assert_eq!(soft, "1024", "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(json).expect("doctor --json");
    assert_eq!(report["memlock"]["ulimit_l"], "1024");
    let finding =
        |item: &str| report["findings"].as_array().unwrap().iter().find(|f| f["item"] == item).cloned().expect(item);
    if report["memlock"]["cap_ipc_lock"] == true {
        eprintln!("CAP_IPC_LOCK cannot be dropped here: only the reading of the limit is checked");
        return;
    }
    // 1 MiB: too little for dynamic registration, far too little for pin-all of 1 GiB.
    assert_eq!(finding("memlock (dynamic)")["verdict"], "fail");
    let pin_all = finding("memlock (pin-all)");
    assert_eq!(pin_all["verdict"], "warn");
    let k = report["needs"]["pin_all_ulimit_l"].as_u64().unwrap();
    assert!(k > (1 << 20), "1 GiB guest needs more than 1 GiB of KiB: {k}");
    let fix = pin_all["fix"].as_str().unwrap();
    assert!(fix.contains(&format!("`ulimit -l {k}`")), "{fix}");
    assert!(fix.contains(&format!("`LimitMEMLOCK={k}K`")), "{fix}");
    assert_eq!(out.status.code(), Some(1), "a failed item: exit status 1");
}

#[test]
fn doctor_text_and_usage_errors() {
    let out = Command::new(exe()).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Verdicts") && text.contains("fork safety"), "{text}");
    if text.contains("libibverbs lists none") {
        assert!(text.contains("[fail] devices: no RDMA device on this host"), "{text}");
        assert_eq!(out.status.code(), Some(1));
    }
    for args in [
        &["doctor", "--guest-size", "0"][..],
        &["doctor", "--bogus"],
        &["bench"],
        &["bench", "--size", "1Q", "x"],
        // A key needs rdmamig's extensions.
        &["bench", "--key-file", "k", "--qemu-compat", "x"],
    ] {
        let out = Command::new(exe()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: usage error");
    }
}

/// A bench that cannot connect says the library's message, not the name of
/// its error enum: on the build host there is no device, in the rxe guest
/// nothing listens on port 1. Its --help says the default port.
#[test]
fn bench_errors_say_the_message_and_help_the_default_port() {
    let ip = std::env::var("RXE_VM_IP").unwrap_or_else(|_| "198.18.0.1".into());
    let out = Command::new(exe()).args(["bench", "--json", "--size", "4M", &format!("{ip}:1")]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).expect("--json");
    let error = report["error"].as_str().expect("an error");
    let said = if std::env::var("RDMAMIG_EXPECT_DEVICE").is_ok() {
        format!("connect: no listener on {ip} port 1 (is the destination listening yet?)")
    } else {
        "connect: no RDMA device is usable here (".into()
    };
    assert!(error.starts_with(&said), "{error}");
    let help = Command::new(exe()).args(["bench", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("ADDR[:PORT] to migrate to (PORT 4444 when none is given)"), "{help}");
}

/// Output into a pipe whose reader is gone (`| head` that stopped): every
/// command ends by SIGPIPE, quietly, as command-line tools do, and does not
/// panic (Rust ignores SIGPIPE unless told; `cli/tests/fabric.rs` has the
/// reader that stops after the first bytes).
#[test]
fn every_command_ends_quietly_when_its_output_pipe_is_closed() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;

    // The pipe's reader is gone before the program starts: its first write fails.
    let closed_pipe = || {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills both descriptors, each owned once below.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(reader);
        Stdio::from(writer)
    };
    // The bench fails before any RDMA use (the size is not a page multiple): its JSON still goes out.
    for args in [&["doctor"][..], &["doctor", "--json"], &["bench", "--json", "--size", "1000", "x"], &["--help"]] {
        let out = Command::new(exe()).args(args).stdout(closed_pipe()).output().expect("rdmamig runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{args:?}: {:?}: {stderr}", out.status);
    }
}

#[test]
fn help_and_man_pages_cover_every_option() {
    let dir = std::env::temp_dir().join(format!("rdmamig-man-{}", std::process::id()));
    let out = Command::new(exe()).arg("generate-man").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pages = [
        ("rdmamig.1", None, &["doctor", "bench"][..]),
        ("rdmamig-doctor.1", Some("doctor"), &["\\-\\-guest\\-size", "\\-\\-json"][..]),
        (
            "rdmamig-bench.1",
            Some("bench"),
            &[
                "\\-\\-listen",
                "\\-\\-size",
                "\\-\\-dirty\\-rate",
                "\\-\\-pin\\-all",
                "\\-\\-qemu\\-compat",
                "\\-\\-key\\-file",
                "\\-\\-json",
            ][..],
        ),
    ];
    for (file, sub, words) in pages {
        let page = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(page.starts_with(".ie") || page.contains(".TH"), "{file} is a man page");
        for w in words {
            assert!(page.contains(w), "{file} lacks {w}");
        }
        let help = Command::new(exe()).args(sub).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(help.contains("Exit status"), "{sub:?} --help");
        for w in words {
            assert!(help.contains(&w.replace('\\', "")), "{sub:?} --help lacks {w}");
        }
    }
    assert!(!std::fs::read_to_string(dir.join("rdmamig.1")).unwrap().contains("generate"), "hidden stays hidden");
    std::fs::remove_dir_all(&dir).unwrap();
}
