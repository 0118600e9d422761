//! `rdmamig bench` between two processes over rxe (feature `rdma-tests`;
//! scripts/rdma-suite.sh runs this binary in its guest): each mode migrates a
//! small guest while it is being dirtied, both sides report with `--json`,
//! and the destination must find its memory byte-identical (the source's
//! SHA-256 travels in the stream).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

fn exe() -> String {
    std::env::var("RDMAMIG_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rdmamig").to_owned())
}

fn ip() -> String {
    std::env::var("RXE_VM_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

/// A destination process and the port it listens on (read from its stderr).
fn spawn_destination(args: &[&str]) -> (Child, u16) {
    let (child, port, mut stderr) = start_destination(args);
    // Keep draining its stderr so it never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::stderr()));
    (child, port)
}

/// As `spawn_destination`, with the rest of its stderr for the caller to read (and drain).
fn start_destination(args: &[&str]) -> (Child, u16, BufReader<ChildStderr>) {
    let mut child = Command::new(exe())
        .args(["bench", "--json", "--listen", &format!("{}:0", ip())])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the destination starts");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let port = loop {
        line.clear();
        if !matches!(stderr.read_line(&mut line), Ok(n) if n > 0) {
            break None;
        }
        if let Some(rest) = line.trim().strip_prefix("rdmamig bench: listening on ") {
            let addr = rest.split(',').next().unwrap_or_default();
            break addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
        }
        eprint!("destination: {line}");
    };
    let Some(port) = port else {
        let _ = child.kill();
        let status = child.wait();
        panic!("the destination did not say where it listens ({line:?}); it exited: {status:?}");
    };
    (child, port, stderr)
}

/// Runs one migration; the source's and the destination's JSON and exit statuses.
fn migrate(source_args: &[&str], dest_args: &[&str]) -> ((Value, Option<i32>), (Value, Option<i32>)) {
    let (dest, port) = spawn_destination(dest_args);
    let src = Command::new(exe())
        .args(["bench", "--json", &format!("{}:{port}", ip())])
        .args(source_args)
        .stderr(Stdio::inherit())
        .output()
        .expect("the source runs");
    let dst = dest.wait_with_output().expect("the destination ends");
    let parse = |out: &[u8], who: &str| -> Value {
        serde_json::from_slice(out).unwrap_or_else(|e| panic!("{who} --json: {e}: {}", String::from_utf8_lossy(out)))
    };
    let s = parse(&src.stdout, "source");
    let d = parse(&dst.stdout, "destination");
    println!("source: {s}\ndestination: {d}");
    ((s, src.status.code()), (d, dst.status.code()))
}

fn check_migrated(s: &Value, d: &Value, size: u64, ending: &str, pin_all: bool) {
    assert_eq!(s["role"], "source");
    assert_eq!(d["role"], "destination");
    assert_eq!(s["error"], Value::Null, "{s}");
    assert_eq!(d["error"], Value::Null, "{d}");
    assert_eq!(s["ending"], ending);
    assert_eq!(d["ending"], ending);
    assert_eq!(s["pin_all"], pin_all);
    assert_eq!(d["pin_all"], pin_all);
    assert_eq!(s["size_bytes"], size);
    // Rounds: the details add up, the last is the final round.
    let rounds = s["round_details"].as_array().unwrap();
    assert_eq!(s["rounds"].as_u64().unwrap() as usize, rounds.len());
    assert!(rounds.len() >= 2, "round 1 and the final round at least");
    assert!(rounds.last().unwrap()["final"] == true && rounds[..rounds.len() - 1].iter().all(|r| r["final"] == false));
    assert_eq!(rounds[0]["pages"], size / 4096, "round 1 sends every page");
    assert_eq!(rounds.last().unwrap()["pages"], s["final_round_pages"]);
    let written: u64 = rounds.iter().map(|r| r["bytes_written"].as_u64().unwrap()).sum();
    assert_eq!(written, s["bytes_written"].as_u64().unwrap(), "round bytes add up to the total");
    let pages: u64 = rounds.iter().map(|r| r["pages"].as_u64().unwrap()).sum();
    assert_eq!(written, pages * 4096, "every page sent was written (none is zero)");
    assert_eq!(d["windows"].as_u64().unwrap() as usize, rounds.len(), "one window per round");
    // The summary's figures.
    for k in ["total_seconds", "final_round_seconds", "gbit_per_s"] {
        assert!(s[k].as_f64().unwrap() > 0.0, "{k}: {}", s[k]);
    }
    assert!(s["total_seconds"].as_f64().unwrap() >= s["final_round_seconds"].as_f64().unwrap());
    assert_eq!(s["zero_chunks"], 0, "random non-zero pages");
    assert!(s["registration_round_trips"].as_u64().unwrap() > 0 || pin_all, "{s}");
    assert!(s["pinned_bytes_peak"].as_u64().unwrap() > 0);
    // Byte-identical.
    let sha = s["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64);
    assert_eq!(d["sha256_expected"], sha);
    assert_eq!(d["sha256"], sha);
    assert_eq!(d["identical"], true);
}

#[test]
fn bench_migrates_byte_identical_in_every_mode() {
    const SIZE: u64 = 64 << 20;
    let size = "64M";
    // Dynamic registration, dirtied while rounds run.
    let ((s, sc), (d, dc)) = migrate(
        &["--size", size, "--dirty-rate", "4000", "--max-rounds", "6", "--final-pages", "64"],
        &["--size", size],
    );
    check_migrated(&s, &d, SIZE, "completed", false);
    assert!(s["pages_dirtied"].as_u64().unwrap() > 0, "the guest was dirtied");
    assert_eq!((&s["authenticated"], &d["authenticated"]), (&Value::Bool(false), &Value::Bool(false)), "no key");
    assert_eq!((sc, dc), (Some(0), Some(0)));
    // Pin-all.
    let ((s, sc), (d, dc)) = migrate(&["--size", size, "--dirty-rate", "2000", "--pin-all"], &["--size", size]);
    check_migrated(&s, &d, SIZE, "completed", true);
    assert_eq!((sc, dc), (Some(0), Some(0)));
    // QEMU's protocol (no completion handshake: unverified, but the hash says identical).
    let ((s, sc), (d, dc)) =
        migrate(&["--size", size, "--dirty-rate", "2000", "--qemu-compat"], &["--size", size, "--qemu-compat"]);
    check_migrated(&s, &d, SIZE, "unverified", false);
    assert_eq!(s["extensions"], false);
    assert_eq!((sc, dc), (Some(0), Some(0)));
}

/// `--postcopy-after 2`: two pre-copy rounds while the guest is dirtied,
/// then post-copy of the pages dirtied since they were sent, with the
/// destination's vCPU threads reading guest pages meanwhile; byte-identical.
#[test]
fn bench_postcopy_pulls_the_stale_pages_byte_identical() {
    const SIZE: u64 = 64 << 20;
    let ((s, sc), (d, dc)) = migrate(
        &["--size", "64M", "--dirty-rate", "4000", "--postcopy-after", "2", "--postcopy-recovery", "30"],
        &["--size", "64M", "--vcpus", "3", "--postcopy-recovery", "30"],
    );
    assert_eq!(s["error"], Value::Null, "{s}");
    assert_eq!(d["error"], Value::Null, "{d}");
    assert_eq!((s["ending"].as_str(), d["ending"].as_str()), (Some("completed"), Some("completed")));
    assert_eq!((sc, dc), (Some(0), Some(0)));
    // Exactly two pre-copy rounds, no final round.
    assert_eq!(s["postcopy_after"], 2);
    let rounds = s["round_details"].as_array().unwrap();
    assert_eq!(rounds.len(), 2);
    assert!(rounds.iter().all(|r| r["final"] == false));
    assert_eq!(rounds[0]["pages"], SIZE / 4096, "round 1 sends every page");
    assert_eq!(d["windows"], 2);
    assert_eq!(s["final_round_pages"], Value::Null);
    // Post-copy: the pages dirtied during round 2 (the dirtier ran through it), all pulled.
    let stale = s["postcopy_stale_pages"].as_u64().unwrap();
    assert!(stale > 0, "the guest was dirtied during round 2: {s}");
    let (sp, dp) = (&s["postcopy"], &d["postcopy"]);
    assert_eq!(sp["pages"], stale);
    assert_eq!((dp["stale_pages"].as_u64(), dp["pages"].as_u64()), (Some(stale), Some(stale)));
    assert_eq!(dp["pages_remaining"], 0);
    assert_eq!(dp["recoveries"], 0);
    assert_eq!(sp["faults_served"], dp["faults_served"]);
    assert_eq!(sp["bytes_pulled"], dp["bytes_pulled"]);
    let skipped = dp["pages_skipped"].as_u64().unwrap();
    assert!(sp["bytes_pulled"].as_u64().unwrap() >= (stale - skipped) * 4096, "{sp}");
    assert!(sp["seconds"].as_f64().unwrap() > 0.0 && dp["seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(dp["vcpus"], 3);
    assert!(dp["vcpu_reads"].as_u64().unwrap() > 0, "the vCPUs ran during post-copy: {dp}");
    // Byte-identical: the vCPUs only read.
    let sha = s["sha256"].as_str().unwrap();
    assert_eq!((d["sha256_expected"].as_str(), d["sha256"].as_str()), (Some(sha), Some(sha)));
    assert_eq!(d["identical"], true);
}

/// The source killed during post-copy: the destination reports the failure
/// and exits 1 (its vCPU threads, released by SIGSEGV, are paused by its
/// handler rather than killing it). Both sides have `--postcopy-recovery`:
/// the destination's one reconnection attempt finds the source's listener
/// gone and gives up at once.
#[test]
fn bench_postcopy_source_killed_destination_reports_and_survives() {
    let recovery = ["--postcopy-recovery", "30"];
    let (dest, port, mut dest_err) = start_destination(&[&["--size", "128M", "--vcpus", "4"][..], &recovery].concat());
    let mut src = Command::new(exe())
        .args(["bench", "--json", &format!("{}:{port}", ip())])
        .args(["--size", "128M", "--dirty-rate", "20000", "--postcopy-after", "2"])
        .args(recovery)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the source starts");
    // Once the destination runs post-copy, let its vCPUs fault on stale pages; then the source is gone.
    let mut line = String::new();
    while !line.starts_with("post-copy: running") {
        line.clear();
        assert!(matches!(dest_err.read_line(&mut line), Ok(n) if n > 0), "the destination ended before post-copy");
        eprint!("destination: {line}");
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    src.kill().unwrap();
    let killed = std::time::Instant::now();
    let _ = src.wait();
    std::thread::spawn(move || std::io::copy(&mut dest_err, &mut std::io::stderr()));
    let out = dest.wait_with_output().expect("the destination ends");
    let ended = killed.elapsed();
    assert_eq!(out.status.code(), Some(1), "the destination exits 1 (not killed by a signal): {:?}", out.status);
    let d: Value = serde_json::from_slice(&out.stdout).expect("the destination's --json");
    println!("destination: {d}");
    assert_eq!(d["ending"], "failed", "{d}");
    // A failed READ (the source's memory is gone) or the disconnect, whichever
    // comes first; then no recovery (it does not wait out the 30 s).
    assert!(d["error"].as_str().is_some_and(|e| e.contains("no recovery")), "{d}");
    assert!(ended < std::time::Duration::from_secs(20), "the destination ended {ended:?} after the kill");
    let pc = &d["postcopy"];
    assert!(pc["pages_remaining"].as_u64().is_some_and(|n| n > 0), "the kill came after post-copy ended: {d}");
    assert!(pc["vcpus_paused"].as_u64().is_some_and(|n| n <= 4), "{d}");
    assert_eq!(d["identical"], false);
}

#[test]
fn bench_fails_cleanly_when_the_sizes_differ() {
    let ((s, sc), (d, dc)) = migrate(&["--size", "8M"], &["--size", "16M"]);
    assert_eq!(s["ending"], "failed", "{s}");
    assert_eq!(d["ending"], "failed", "{d}");
    assert!(s["error"].as_str().is_some() && d["error"].as_str().is_some());
    assert_eq!((sc, dc), (Some(1), Some(1)));
}

/// A key file (owner-only, as the bench requires) holding `key`.
fn key_file(dir: &Path, name: &str, key: &[u8]) -> PathBuf {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
    f.write_all(key).unwrap();
    path
}

/// `--key-file` on both sides: each proves the key to the other, and both
/// summaries (JSON and text) say so. With different keys the source fails
/// with an authentication error, and the destination refuses it and goes on
/// listening, as it says on stderr.
#[test]
fn bench_with_a_key_file_on_both_sides_authenticates_the_peer() {
    const SIZE: u64 = 16 << 20;
    let dir = std::env::temp_dir().join(format!("rdmamig-bench-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = key_file(&dir, "key", b"rdmamig bench test: the shared key\n");
    let other = key_file(&dir, "other", b"rdmamig bench test: another key\n");
    let keyed = ["--size", "16M", "--key-file", key.to_str().unwrap()];
    let ((s, sc), (d, dc)) = migrate(&keyed, &keyed);
    check_migrated(&s, &d, SIZE, "completed", false);
    assert_eq!((&s["authenticated"], &d["authenticated"]), (&Value::Bool(true), &Value::Bool(true)));
    assert_eq!((sc, dc), (Some(0), Some(0)));

    // The source's text summary.
    let (dest, port) = spawn_destination(&keyed);
    let src = Command::new(exe())
        .args(["bench", &format!("{}:{port}", ip())])
        .args(keyed)
        .stderr(Stdio::inherit())
        .output()
        .expect("the source runs");
    let text = String::from_utf8_lossy(&src.stdout);
    println!("{text}");
    assert!(text.contains("peer authenticated yes (pre-shared key)"), "{text}");
    assert_eq!(src.status.code(), Some(0));
    assert_eq!(dest.wait_with_output().expect("the destination ends").status.code(), Some(0));

    // Different keys.
    let (mut dest, port, dest_err) = start_destination(&keyed);
    let (said, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in dest_err.lines().map_while(std::result::Result::ok) {
            eprintln!("destination: {line}");
            let _ = said.send(line);
        }
    });
    let src = Command::new(exe())
        .args(["bench", "--json", &format!("{}:{port}", ip())])
        .args(["--size", "16M", "--key-file", other.to_str().unwrap()])
        .stderr(Stdio::inherit())
        .output()
        .expect("the source runs");
    let s: Value = serde_json::from_slice(&src.stdout).expect("the source's --json");
    println!("source: {s}");
    assert_eq!(src.status.code(), Some(1));
    assert_eq!(s["ending"], "failed");
    // The library's message, not its enum's name ("Auth: ").
    let refused = "connect: the destination failed to prove the pre-shared key";
    assert!(s["error"].as_str().is_some_and(|e| e.starts_with(refused)), "{s}");
    let refusal = loop {
        let line = lines.recv_timeout(Duration::from_secs(30)).expect("the destination says it refused the source");
        if line.contains("still listening") {
            break line;
        }
    };
    assert!(refusal.contains("authenticate"), "{refusal}");
    assert!(dest.try_wait().unwrap().is_none(), "the destination stopped listening");
    dest.kill().unwrap();
    let _ = dest.wait();
    std::fs::remove_dir_all(&dir).unwrap();
}
