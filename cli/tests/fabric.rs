//! `rdmamig fabric-plan` (host only): the JSON of a same-leaf and of a
//! worst-case move on the 324-node tree of Table I, the table itself, a
//! topology read from a JSON file, the exit statuses and the man page.

use std::process::{Command, Output};

use serde_json::Value;

fn exe() -> String {
    std::env::var("RDMAMIG_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rdmamig").to_owned())
}

fn run(args: &[&str]) -> Output {
    Command::new(exe()).arg("fabric-plan").args(args).output().expect("rdmamig runs")
}

fn json(args: &[&str]) -> Value {
    let out = run(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The 324-node tree of Table I: 18 leaves, 18 spines, 9 hypervisors per leaf with a PF and a VF.
const TREE: [&str; 8] = ["--fat-tree", "36", "--width", "18", "--hosts", "9", "--vfs", "1"];

#[test]
fn same_leaf_and_worst_case_moves_as_json() {
    let same = json(&[&TREE[..], &["--pair", "same-leaf", "--json"]].concat());
    assert_eq!(same["check"], "ok");
    assert_eq!(same["same_switch"], true);
    assert_eq!(same["counts"]["lft_smps"], 1);
    assert_eq!(same["counts"]["switches_touched"], 1);
    assert_eq!(same["counts"]["hypervisor_smps"], 3);
    assert_eq!(same["counts"]["total"], 4);
    assert_eq!(same["counts"]["full_reconfiguration"], 216);
    let smp = &same["lft_smps"][0];
    assert_eq!(smp["ports"].as_array().unwrap().len(), 64);
    // The two LIDs exchange their ports, nothing else changes.
    let (vm, partner) = (same["vm_lid"].as_u64().unwrap(), same["partner_lid"].as_u64().unwrap());
    let changes = smp["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 2);
    assert_eq!(
        (changes[0]["lid"].as_u64(), changes[1]["lid"].as_u64()),
        (Some(vm.min(partner)), Some(vm.max(partner)))
    );
    assert_eq!(changes[0]["old_port"], changes[1]["new_port"]);
    let kinds: Vec<&str> =
        same["hypervisor_smps"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["vf_lid", "vf_lid", "vguid"]);

    let worst = json(&[&TREE[..], &["--pair", "worst-case", "--json"]].concat());
    assert_eq!(worst["check"], "ok");
    assert_eq!(worst["counts"]["lft_smps"], 72, "2 x 36 switches");
    assert_eq!(worst["counts"]["switches_touched"], 36);
    assert_eq!(worst["counts"]["total"], 75);
    assert_eq!(worst["lft_smps"].as_array().unwrap().len(), 72);
    let copy = json(&[&TREE[..], &["--pair", "worst-case", "--mode", "copy", "--json"]].concat());
    assert_eq!(copy["check"], "ok");
    assert!(copy["counts"]["lft_smps"].as_u64().unwrap() <= 36);

    // The same worst case named explicitly.
    let (vm, from, to) =
        (worst["vm_lid"].to_string(), worst["from"]["name"].as_str().unwrap(), worst["to"]["index"].to_string());
    let named = json(&[&TREE[..], &["--vm-lid", &vm, "--from", from, "--to", &to, "--json"]].concat());
    assert_eq!(named["counts"], worst["counts"]);
}

#[test]
fn table_i() {
    let rows = json(&["--table-i", "--json"]);
    let got: Vec<[u64; 7]> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let f = |k: &str| r[k].as_u64().unwrap();
            [
                f("nodes"),
                f("switches"),
                f("lids"),
                f("lft_blocks_per_switch"),
                f("full_min"),
                f("swap_min"),
                f("swap_max"),
            ]
        })
        .collect();
    assert_eq!(
        got,
        [
            [324, 36, 360, 6, 216, 1, 72],
            [648, 54, 702, 11, 594, 1, 108],
            [5832, 972, 6804, 107, 104004, 1, 1944],
            [11664, 1620, 13284, 208, 336960, 1, 3240]
        ]
    );
    let text = String::from_utf8(run(&["--table-i"]).stdout).unwrap();
    assert!(text.contains("11664") && text.contains("336960"), "{text}");
}

#[test]
fn a_topology_file() {
    // Two leaves (LIDs 1, 2) on one spine (3); h0 on leaf 1, h1 and h2 on leaf 2.
    let lft = |ports: &[(u16, u8)]| {
        let mut v = vec![255u8; 40];
        for &(lid, p) in ports {
            v[usize::from(lid)] = p;
        }
        v
    };
    let leaf1 = lft(&[(1, 0), (10, 1), (11, 1), (20, 4), (21, 4), (30, 4), (31, 4)]);
    let leaf2 = lft(&[(2, 0), (10, 4), (11, 4), (20, 1), (21, 1), (30, 2), (31, 2)]);
    let spine = lft(&[(3, 0), (10, 1), (11, 1), (20, 2), (21, 2), (30, 2), (31, 2)]);
    let topo = serde_json::json!({
        "switches": [
            {"lid": 1, "ports": 4, "lft": leaf1},
            {"lid": 2, "ports": 4, "lft": leaf2},
            {"lid": 3, "ports": 4, "lft": spine},
        ],
        "links": [[1, 4, 3, 1], [2, 4, 3, 2]],
        "hypervisors": [
            {"name": "h0", "switch": 1, "port": 1, "pf_lid": 10, "vf_lids": [11]},
            {"name": "h1", "switch": 2, "port": 1, "pf_lid": 20, "vf_lids": [21], "vfs_in_use": [21]},
            {"name": "h2", "switch": 2, "port": 2, "pf_lid": 30, "vf_lids": [31]},
        ],
    });
    let path = std::env::temp_dir().join(format!("rdmamig-fabric-{}.json", std::process::id()));
    std::fs::write(&path, topo.to_string()).unwrap();
    let file = path.to_str().unwrap();
    let p = json(&["--topology", file, "--vm-lid", "11", "--from", "h0", "--to", "h2", "--mode", "copy", "--json"]);
    assert_eq!(p["check"], "ok");
    assert_eq!((p["counts"]["lft_smps"].as_u64(), p["partner_lid"].as_u64()), (Some(3), Some(31)));
    // h1's only VF is in use: nothing to move onto.
    let out = run(&["--topology", file, "--vm-lid", "11", "--from", "h0", "--to", "h1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no free VF"));
    std::fs::write(&path, "{\"switches\": [{\"lid\": 0, \"ports\": 4}], \"hypervisors\": []}").unwrap();
    let out = run(&["--topology", file, "--vm-lid", "11", "--from", "h0", "--to", "h1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("switches[0]"), "{out:?}");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn exit_statuses_help_and_man_page() {
    let out = run(&[&TREE[..], &["--vm-lid", "1", "--from", "0", "--to", "1"]].concat());
    assert_eq!(out.status.code(), Some(1), "a PF LID is not a VM's");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not on a VF of the source"));
    for args in [
        &["--fat-tree", "8"][..],
        &["--table-i", "--fat-tree", "8"],
        &["--fat-tree", "8", "--levels", "4", "--pair", "same-leaf"],
    ] {
        assert_eq!(run(args).status.code(), Some(2), "{args:?}: usage error");
    }
    let help = String::from_utf8(run(&["--help"]).stdout).unwrap();
    for w in ["--fat-tree", "--topology", "--vm-lid", "--mode", "--dest-vf", "--json", "--table-i", "Exit status"] {
        assert!(help.contains(w), "--help lacks {w}");
    }
    let dir = std::env::temp_dir().join(format!("rdmamig-fabric-man-{}", std::process::id()));
    let out = Command::new(exe()).arg("generate-man").arg(&dir).output().unwrap();
    assert!(out.status.success());
    let page = std::fs::read_to_string(dir.join("rdmamig-fabric-plan.1")).expect("rdmamig-fabric-plan.1");
    for w in ["\\-\\-fat\\-tree", "\\-\\-topology", "\\-\\-table\\-i", "vf_lids"] {
        assert!(page.contains(w), "the man page lacks {w}");
    }
    assert!(std::fs::read_to_string(dir.join("rdmamig.1")).unwrap().contains("fabric\\-plan"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Output piped into a reader that stops early (`| head`): the program ends
/// by SIGPIPE, quietly, as command-line tools do, and does not panic. The
/// worst-case plan's JSON (about 70 KB) outgrows the pipe's buffer.
#[test]
fn a_reader_that_stops_early_ends_it_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;

    let mut child = Command::new(exe())
        .arg("fabric-plan")
        .args([&TREE[..], &["--pair", "worst-case", "--json"]].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rdmamig runs");
    let mut first = [0u8; 16];
    child.stdout.take().expect("piped").read_exact(&mut first).expect("the first bytes");
    let out = child.wait_with_output().expect("rdmamig ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}: {stderr}", out.status);
}
