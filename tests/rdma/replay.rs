//! rdmamig's source against a real QEMU destination, by record and replay:
//! a real QEMU source (`crate::qemu::qemu_binary`, the same QEMU both ways)
//! migrates into `Recording::record` (an rdmamig destination that keeps
//! every stream byte, each window's place in the stream, and the final RAM);
//! the recording goes through its file format;
//! then `Recording::replay` (an rdmamig source, extensions off) migrates it
//! into a real QEMU destination (`-incoming rdma:...`, `-S`, RAM in a
//! file-backed memory backend). QEMU's destination parses the stream and
//! enforces its protocol rules; success is its incoming migration completed,
//! the VM paused, and its RAM file byte-identical to the recorded RAM.
//!
//! Sizes are not powers of two; "running" guests run their firmware
//! (SeaBIOS, no boot device), which keeps writing RAM between rounds.

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use rdmamig::recording::{BlockLayout, RangeKind, Recording};
use rdmamig::{Config, Ending};

use crate::migration::{listen, rdma_ip};
use crate::qemu::{
    ends_with_vm_eof, parse_ramblocks, pattern, print_qemu_times, report, Qemu, Qmp, TempDir, MIGRATION_TIMEOUT,
};

const MIB: u64 = 1 << 20;

/// Polls `query-migrate` until the status is final; returns the last answer.
fn wait_migration(qmp: &mut Qmp, qemu: &mut Qemu, done: &str) -> Value {
    let start = Instant::now();
    let mut zero_time = 0;
    loop {
        let info = qmp.cmd("query-migrate", json!({}));
        match info["status"].as_str().unwrap_or("") {
            // total-time can still read 0 at the instant the status turns: ask again.
            s if s == done && (info.get("total-time").is_none() || info["total-time"].as_u64() > Some(0)) => {
                return info
            }
            s if s == done && zero_time == 20 => return info,
            s if s == done => zero_time += 1,
            "failed" | "cancelled" => panic!("QEMU migration {}: {info}\n{}", info["status"], qemu.log()),
            _ => {}
        }
        assert!(start.elapsed() < MIGRATION_TIMEOUT, "migration not done after {MIGRATION_TIMEOUT:?}: {info}");
        thread::sleep(Duration::from_millis(100));
    }
}

/// A real QEMU source (`size_mib` of RAM, the pattern loaded at 1 MiB,
/// paused or running) migrated into the recorder.
fn record(dir: &TempDir, tag: &str, size_mib: u64, pin_all: bool, running: bool) -> Recording {
    let pattern_file = dir.0.join("pattern.bin");
    fs::write(&pattern_file, pattern()).unwrap();
    let mut args = vec!["-M".into(), "pc".into(), "-m".into(), format!("{size_mib}")];
    if !running {
        args.push("-S".into());
    }
    let mut qemu = Qemu::spawn(&dir.0, "src", &args, Some(&pattern_file));
    let mut qmp = Qmp::connect(&dir.0.join("src.qmp"), &mut qemu);
    if pin_all {
        qmp.cmd(
            "migrate-set-capabilities",
            json!({ "capabilities": [{ "capability": "rdma-pin-all", "state": true }] }),
        );
    }
    qmp.cmd("migrate-set-parameters", json!({ "max-bandwidth": 1u64 << 34 }));
    let layout: Vec<BlockLayout> = parse_ramblocks(&qmp.hmp("info ramblock"))
        .into_iter()
        .map(|(name, offset, length)| BlockLayout { name, offset, length })
        .collect();
    assert_eq!(layout[0].length, size_mib * MIB, "{layout:?}");

    let (listener, port) = listen(&Config { pin_all: true, ..Config::default() });
    let recorder = thread::spawn(move || Recording::record(&listener, &layout, Some(Duration::from_secs(60))));
    let start = Instant::now();
    qmp.cmd("migrate", json!({ "uri": format!("rdma:{}:{port}", rdma_ip()) }));
    let info = wait_migration(&mut qmp, &mut qemu, "completed");
    let (recording, ending) = recorder.join().unwrap().expect("recording QEMU's migration");
    print_qemu_times(&format!("record {tag}"), &info);
    eprintln!(
        "record: dirty-sync-count {}, {} windows ({} with ranges), {} stream bytes; recorded after {:?}",
        info["ram"]["dirty-sync-count"],
        recording.windows.len(),
        recording.windows.iter().filter(|w| !w.ranges.is_empty()).count(),
        recording.stream.len(),
        start.elapsed()
    );
    assert_eq!(ending, Ending::Unverified);
    assert_eq!(recording.pin_all, pin_all);
    assert!(ends_with_vm_eof(&recording.stream), "the recorded stream does not end in QEMU_VM_EOF");
    // Setup (the RAM-blocks exchange), at least one round, and the final one.
    assert!(recording.windows.len() >= 3, "{:?}", recording.windows.len());
    assert!(recording.windows.iter().all(|w| w.stream_begin == w.stream_end), "QEMU sent stream bytes in a window");
    if !pin_all {
        let registered = |k| recording.windows.iter().flat_map(|w| &w.ranges).filter(|r| r.kind == k).count();
        assert!(registered(RangeKind::Registered) >= 24, "the pattern spans 24 chunks");
        assert!(registered(RangeKind::Zeroed) > 0, "QEMU sends zero ranges as COMPRESS");
    }
    // Pages QEMU sent (zero or not) against the pages it has: a running
    // guest dirtied some after they were sent, and they went again.
    let count = |key: &str| info["ram"][key].as_u64().unwrap_or_else(|| panic!("no ram.{key}: {info}"));
    let (sent, pages) = (count("normal") + count("duplicate"), count("total") / count("page-size"));
    eprintln!("record: QEMU sent {sent} pages of {pages}");
    if running {
        assert!(sent > pages, "the running guest dirtied no page after it was sent: {info}");
    } else {
        assert_eq!(sent, pages, "{info}");
    }

    // Through the file format and back.
    let file = dir.0.join("migration.rec");
    recording.write_to(fs::File::create(&file).unwrap()).unwrap();
    let read = Recording::read_from(fs::File::open(&file).unwrap()).unwrap();
    assert!(read == recording, "the recording read back differs");
    read
}

/// Replays `recording` into a fresh real QEMU destination; returns it (and
/// its QMP) once the replay returned, with the replay's result.
fn replay(
    dir: &TempDir,
    case: &str,
    role: &str,
    recording: &mut Recording,
    port: u16,
) -> (Qemu, Qmp, rdmamig::Result<Ending>) {
    let size = recording.blocks[0].ram.len() as u64;
    let ram_file = dir.0.join(format!("{role}.ram"));
    let args = [
        "-M".into(),
        "pc,memory-backend=pc.ram".into(),
        "-m".into(),
        format!("{}", size / MIB),
        "-object".into(),
        format!("memory-backend-file,id=pc.ram,size={size},mem-path={},share=on", ram_file.display()),
        // Paused after the migration, so the RAM stays as it arrived.
        "-S".into(),
        "-incoming".into(),
        format!("rdma:{}:{port}", rdma_ip()),
    ];
    let mut qemu = Qemu::spawn(&dir.0, role, &args, None);
    // QEMU listens before its QMP socket comes up.
    let qmp = Qmp::connect(&dir.0.join(format!("{role}.qmp")), &mut qemu);
    let config = Config { extensions: false, ..Config::default() };
    let start = Instant::now();
    let result = recording.replay(&rdma_ip(), port, &config);
    report(&format!("[replay {case}, {role}] rdmamig source into QEMU: {result:?} after {:?}", start.elapsed()));
    (qemu, qmp, result)
}

fn record_and_replay(size_mib: u64, pin_all: bool, running: bool, corrupt_first: bool) {
    let tag = format!(
        "{}-{}-{size_mib}",
        if pin_all { "pin-all" } else { "dynamic" },
        if running { "running" } else { "paused" }
    );
    let dir = TempDir::new(&format!("replay-{tag}"));
    let mut recording = record(&dir, &tag, size_mib, pin_all, running);
    let port = 20000 + (std::process::id() % 20000) as u16;

    if corrupt_first {
        // The first window opened 3 stream bytes early: QEMU's destination
        // gets a RAM_BLOCKS_REQUEST while it still reads the stream.
        let mut bad = recording.clone();
        bad.windows[0].stream_begin -= 3;
        bad.windows[0].stream_end -= 3;
        let (mut qemu, _qmp, result) = replay(&dir, &tag, "corrupt", &mut bad, port);
        let status = wait_exit(&mut qemu, Duration::from_secs(30));
        let log = qemu.log();
        eprintln!("corrupted replay: {result:?}; QEMU destination {status:?}:\n{log}");
        assert!(result.is_err(), "our source must see the destination fail");
        assert!(status.is_some_and(|s| !s.success()), "QEMU's destination must fail: {status:?}");
        assert!(log.contains("load of migration failed"), "{log}");
    }

    let (mut qemu, mut qmp, result) = replay(&dir, &tag, "dest", &mut recording, port + 1);
    assert_eq!(result.unwrap_or_else(|e| panic!("replay: {e}\n{}", qemu.log())), Ending::Unverified);
    let info = wait_migration(&mut qmp, &mut qemu, "completed");
    let status = qmp.cmd("query-status", json!({}));
    eprintln!("[{tag}] QEMU destination: {info}, {status}");
    // A source never started (-S) hands over "prelaunch"; a running one with -S here, "paused".
    let expected = if running { "paused" } else { "prelaunch" };
    assert_eq!(status["status"], expected, "{status}");
    assert_eq!(status["running"], false, "{status}");

    // The destination's pc.ram, byte for byte.
    let ram = fs::read(dir.0.join("dest.ram")).unwrap();
    let want = &recording.blocks[0].ram;
    assert_eq!(ram.len(), want.len());
    if let Some(i) = (0..ram.len()).find(|&i| ram[i] != want[i]) {
        panic!("QEMU's pc.ram differs from the recording at {i:#x}: {:#x} != {:#x}", ram[i], want[i]);
    }
    assert!(want.iter().any(|&b| b != 0), "an all-zero RAM proves nothing");
}

/// Waits up to `limit` for the process to exit.
fn wait_exit(qemu: &mut Qemu, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = qemu.child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn replay_dynamic_paused() {
    record_and_replay(72, false, false, true);
}

#[test]
fn replay_pin_all_paused() {
    record_and_replay(136, true, false, false);
}

#[test]
fn replay_dynamic_running() {
    record_and_replay(136, false, true, false);
}

#[test]
fn replay_pin_all_running() {
    record_and_replay(72, true, true, false);
}
