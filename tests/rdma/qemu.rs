//! Interoperability: a real QEMU (Debian's qemu-system-x86_64 7.2, built with
//! RDMA) is the migration source, rdmamig's `Destination` the destination.
//!
//! The source is a paused `-M pc -m 64` VM whose RAM holds a 24 MiB
//! pseudo-random pattern at 1 MiB (put there by `-device loader`); the rest of
//! `pc.ram` is zero and travels as COMPRESS in dynamic mode. The destination's
//! block registry is built from the source's `info ramblock` (QEMU migrates its
//! blocks in that list order and checks only count and lengths), and its RAM
//! starts as 0xAA garbage, so every byte that ends up right was put there by
//! the migration. The device-state stream is drained with `get` until the
//! source disconnects.
//!
//! Needs `qemu-system-x86_64` on PATH (the test guest has the host's).

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use rdmamig::{Config, Destination, Ending, ErrorKind, RamBlocks, Read};

use crate::migration::{listen, rdma_ip, GuestRam, Rng, PAGE};

const MIB: u64 = 1 << 20;
/// Where `-device loader` puts the pattern in guest-physical memory (= in pc.ram).
pub(crate) const PATTERN_ADDR: u64 = 0x10_0000;
const PATTERN_LEN: u64 = 24 * MIB;
/// Legacy VGA window and BIOS shadow area: not checked.
const HOLE: (u64, u64) = (0xa_0000, 0x10_0000);
pub(crate) const MIGRATION_TIMEOUT: Duration = Duration::from_secs(180);

/// A scratch directory, removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("rdmamig-qemu-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The source QEMU process: killed and reaped on drop, whatever happened; its
/// output is printed when the test is failing.
pub(crate) struct Qemu {
    pub(crate) child: Child,
    log: PathBuf,
}

impl Qemu {
    fn start(dir: &Path, pattern: &Path) -> Qemu {
        let args = ["-M", "pc", "-m", "64", "-S"].map(String::from);
        Qemu::spawn(dir, "src", &args, Some(pattern))
    }

    /// A `-nodefaults` TCG QEMU with `args`, its QMP socket at `dir/ROLE.qmp`,
    /// its output in `dir/ROLE.log`, and `pattern` loaded at PATTERN_ADDR.
    pub(crate) fn spawn(dir: &Path, role: &str, args: &[String], pattern: Option<&Path>) -> Qemu {
        let log = dir.join(format!("{role}.log"));
        let out = fs::File::create(&log).unwrap();
        let loader = pattern.map(|p| format!("loader,file={},addr={PATTERN_ADDR:#x},force-raw=on", p.display()));
        let child = Command::new("qemu-system-x86_64")
            .args(["-nodefaults", "-display", "none", "-accel", "tcg"])
            .args(args)
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", dir.join(format!("{role}.qmp")).display()))
            .args(loader.iter().flat_map(|l| ["-device", l.as_str()]))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("cannot start qemu-system-x86_64");
        Qemu { child, log }
    }

    pub(crate) fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!("--- QEMU output ({}):\n{}", self.log.display(), self.log());
        }
    }
}

/// Stops the destination (joining its service thread) before the RAM it
/// writes is unmapped, whoever else still holds it.
struct Closer(Arc<Destination>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A minimal QMP client: one command at a time, events skipped.
pub(crate) struct Qmp {
    out: UnixStream,
    input: BufReader<UnixStream>,
}

impl Qmp {
    pub(crate) fn connect(path: &Path, qemu: &mut Qemu) -> Qmp {
        let deadline = Instant::now() + Duration::from_secs(20);
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) => {
                    if let Some(status) = qemu.child.try_wait().unwrap() {
                        panic!("QEMU exited ({status}) before its QMP socket came up");
                    }
                    assert!(Instant::now() < deadline, "QMP socket {}: {e}", path.display());
                    thread::sleep(Duration::from_millis(50));
                }
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut qmp = Qmp { out: stream.try_clone().unwrap(), input: BufReader::new(stream) };
        let greeting = qmp.read();
        assert!(greeting.get("QMP").is_some(), "not a QMP greeting: {greeting}");
        qmp.cmd("qmp_capabilities", json!({}));
        qmp
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        let n = self.input.read_line(&mut line).expect("reading from QMP");
        assert!(n > 0, "QMP closed the connection");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad QMP line {line:?}: {e}"))
    }

    /// Runs `name` and returns its "return" value; panics on an error reply.
    pub(crate) fn cmd(&mut self, name: &str, args: Value) -> Value {
        let mut request = serde_json::to_string(&json!({ "execute": name, "arguments": args })).unwrap();
        request.push('\n');
        self.out.write_all(request.as_bytes()).expect("writing to QMP");
        loop {
            let reply = self.read();
            if reply.get("event").is_some() {
                continue;
            }
            match reply.get("return") {
                Some(r) => return r.clone(),
                None => panic!("QMP {name} failed: {reply}"),
            }
        }
    }

    pub(crate) fn hmp(&mut self, command: &str) -> String {
        self.cmd("human-monitor-command", json!({ "command-line": command })).as_str().unwrap().to_owned()
    }
}

/// `info ramblock` → (name, offset, used length), in list order (= migration order).
pub(crate) fn parse_ramblocks(text: &str) -> Vec<(String, u64, u64)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("{s:?}: {e}"));
    text.lines()
        .map(str::split_whitespace)
        .map(Iterator::collect::<Vec<_>>)
        .filter(|t| !t.is_empty() && t[0] != "Block")
        .map(|t| {
            // Block Name, PSize (value unit), Offset, Used, Total
            assert!(t.len() >= 6, "unexpected info ramblock line: {t:?}");
            let n = t.len();
            (t[0].to_owned(), hex(t[n - 3]), hex(t[n - 2]))
        })
        .collect()
}

pub(crate) fn pattern() -> Vec<u8> {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    (0..PATTERN_LEN / 8).flat_map(|_| rng.next().to_le_bytes()).collect()
}

/// The pc.bios image QEMU loaded, when it can be found (for an extra check).
fn bios_image(len: u64) -> Option<Vec<u8>> {
    ["/usr/share/qemu/bios-256k.bin", "/usr/share/seabios/bios-256k.bin"]
        .iter()
        .filter_map(|p| fs::read(p).ok())
        .find(|b| b.len() as u64 == len)
}

/// A real QEMU source migrating (paused, the pattern loaded) into an rdmamig
/// destination. Fields drop in order: the destination stops before QEMU goes
/// and before the RAM it writes is unmapped.
struct Migration {
    _closer: Closer,
    dest: Arc<Destination>,
    qmp: Qmp,
    qemu: Qemu,
    ram: Vec<GuestRam>,
    /// QEMU's RAM blocks: (name, offset, used length), in migration order.
    blocks: Vec<(String, u64, u64)>,
    pattern: Vec<u8>,
    start: Instant,
    connected: Duration,
    _dir: TempDir,
}

impl Migration {
    /// Starts QEMU, accepts its connection after `migrate` and returns at once.
    fn start(tag: &str, pin_all: bool, liveness: Option<Duration>) -> Migration {
        let dir = TempDir::new(tag);
        let pattern = pattern();
        let pattern_file = dir.0.join("pattern.bin");
        fs::write(&pattern_file, &pattern).unwrap();

        let mut qemu = Qemu::start(&dir.0, &pattern_file);
        let mut qmp = Qmp::connect(&dir.0.join("src.qmp"), &mut qemu);
        let caps: Vec<String> = qmp
            .cmd("query-migrate-capabilities", json!({}))
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["capability"].as_str().unwrap().to_owned())
            .collect();
        assert!(caps.iter().any(|c| c == "rdma-pin-all"), "QEMU has no rdma-pin-all capability: {caps:?}");
        if pin_all {
            qmp.cmd(
                "migrate-set-capabilities",
                json!({ "capabilities": [{ "capability": "rdma-pin-all", "state": true }] }),
            );
        }
        // The default 32 MiB/s limit would only make the test slower.
        qmp.cmd("migrate-set-parameters", json!({ "max-bandwidth": 1u64 << 34 }));

        // The destination's blocks, in the source's order, full of garbage.
        let blocks = parse_ramblocks(&qmp.hmp("info ramblock"));
        eprintln!("source RAM blocks (migration order): {blocks:x?}");
        assert_eq!(blocks.first().map(|b| b.0.as_str()), Some("pc.ram"), "QEMU lists its largest block first");
        let ram: Vec<GuestRam> = blocks.iter().map(|b| GuestRam::new(b.2, 0xAA)).collect();
        let mut registry = RamBlocks::new();
        for ((name, offset, len), mem) in blocks.iter().zip(&ram) {
            // SAFETY: `ram` outlives the destination: the Closer stops it first, even on a panic.
            unsafe { registry.add(name, mem.ptr(), *offset, *len).unwrap() };
        }

        let config = Config { pin_all, liveness, ..Config::default() };
        let (listener, port) = listen(&config);
        let accept = thread::spawn(move || Destination::accept(&listener, &registry, Some(Duration::from_secs(60))));
        let uri = format!("rdma:{}:{port}", rdma_ip());
        let start = Instant::now();
        qmp.cmd("migrate", json!({ "uri": uri }));
        let dest = Arc::new(accept.join().unwrap().expect("accepting QEMU's connection"));
        let connected = start.elapsed();
        assert_eq!(dest.negotiated().pin_all, pin_all, "{:?}", dest.negotiated());
        assert!(!dest.negotiated().extensions, "QEMU offers no rdmamig extensions: {:?}", dest.negotiated());
        Migration { _closer: Closer(dest.clone()), dest, qmp, qemu, ram, blocks, pattern, start, connected, _dir: dir }
    }
}

fn qemu_source_to_rdmamig(pin_all: bool) {
    let tag = if pin_all { "pin-all" } else { "dynamic" };
    // A short liveness: the destination's zero-length-WRITE probes reach
    // QEMU's QP whenever QEMU is quiet for 100 ms (seen: answered in
    // 0.4-2 ms), and must change nothing for QEMU.
    let mut m = Migration::start(tag, pin_all, Some(Duration::from_millis(300)));
    let Migration { ref dest, ref mut qmp, ref ram, ref blocks, ref pattern, start, connected, .. } = m;

    // The device-state stream, read until the source leaves.
    let reader = {
        let dest = dest.clone();
        thread::spawn(move || -> rdmamig::Result<(Vec<u8>, Ending)> {
            let mut stream = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match dest.get(&mut buf, Some(MIGRATION_TIMEOUT))? {
                    Read::Bytes(n) => stream.extend_from_slice(&buf[..n]),
                    // QEMU has no completion handshake: its stream must prove itself.
                    Read::End(ending) => return Ok((stream, ending)),
                }
            }
        })
    };

    // QEMU's side of the story.
    let mut zero_time = 0;
    let info = loop {
        let info = qmp.cmd("query-migrate", json!({}));
        match info["status"].as_str().unwrap_or("") {
            // total-time can still read 0 at the instant the status turns: ask again.
            "completed" if info["total-time"].as_u64().unwrap_or(0) > 0 || zero_time == 20 => break info,
            "completed" => zero_time += 1,
            "failed" | "cancelled" => panic!(
                "QEMU migration {}: {info}\ndestination error: {:?}, stats {:?}",
                info["status"],
                dest.error(),
                dest.stats()
            ),
            _ => {}
        }
        assert!(
            start.elapsed() < MIGRATION_TIMEOUT,
            "migration not done after {MIGRATION_TIMEOUT:?}: {info}\ndestination stats {:?}",
            dest.stats()
        );
        thread::sleep(Duration::from_millis(100));
    };
    let completed = start.elapsed();
    let (stream, ending) =
        reader.join().unwrap().unwrap_or_else(|e| panic!("reading the stream: {e} (stats {:?})", dest.stats()));
    assert_eq!(ending, Ending::Unverified, "a QEMU source's clean end is closed-without-proof");
    assert_eq!(dest.wait_end(Some(Duration::ZERO)).unwrap(), Ending::Unverified);
    let drained = start.elapsed();
    let stats = dest.stats();
    eprintln!(
        "[{tag}] connected after {connected:?}, QEMU completed after {completed:?}, stream drained after {drained:?}\n\
         QEMU query-migrate: {info}\n\
         rdmamig destination: {stats:?}, {} stream bytes",
        stream.len()
    );
    assert!(dest.error().is_none(), "destination failed: {:?}", dest.error());

    // The stream is QEMU's ordinary migration stream: "QEVM", version 3, and
    // it proves itself whole by its end: QEMU_VM_EOF, then the VM description.
    assert!(!stream.is_empty(), "no stream bytes");
    assert!(ends_with_vm_eof(&stream), "the stream does not end in QEMU_VM_EOF + VM description");
    assert_eq!(stream.len() as u64, stats.stream_bytes);
    assert_eq!(&stream[..8], &[0x51, 0x45, 0x56, 0x4d, 0, 0, 0, 3], "stream header");

    // RAM: the pattern at 1 MiB, zeros elsewhere in pc.ram, no garbage page anywhere.
    let pc = ram[0].bytes();
    let at = PATTERN_ADDR as usize;
    if let Some(i) = (0..pattern.len()).find(|&i| pc[at + i] != pattern[i]) {
        panic!("pc.ram differs from the pattern at {:#x}: {:#x} != {:#x}", at + i, pc[at + i], pattern[i]);
    }
    let outside = |i: usize| !((HOLE.0 as usize..at + pattern.len()).contains(&i));
    if let Some(i) = (0..pc.len()).find(|&i| outside(i) && pc[i] != 0) {
        panic!("pc.ram byte {i:#x} is {:#x}, not zero", pc[i]);
    }
    for ((name, _, len), mem) in blocks.iter().zip(ram) {
        let garbage = mem.bytes().chunks(PAGE as usize).position(|p| p.iter().all(|&b| b == 0xAA));
        assert!(garbage.is_none(), "block {name} ({len:#x} bytes): page {:?} was never written", garbage);
    }
    if let Some((i, (_, _, len))) = blocks.iter().enumerate().find(|(_, b)| b.0 == "pc.bios") {
        match bios_image(*len) {
            Some(image) => assert!(ram[i].bytes() == &image[..], "pc.bios differs from the BIOS image"),
            None => eprintln!("(BIOS image not found: pc.bios not compared)"),
        }
    }

    // Counters.
    assert!(stats.iterations >= 1, "{stats:?}");
    if pin_all {
        assert_eq!(stats.zero_chunks, 0, "QEMU sends no COMPRESS with pin-all: {stats:?}");
        assert_eq!(stats.registration_round_trips, 0, "QEMU sends no REGISTER with pin-all: {stats:?}");
        let chunks: u64 = blocks.iter().map(|b| b.2.div_ceil(MIB)).sum();
        assert_eq!(stats.chunks_registered, chunks, "every block registered whole: {stats:?}");
    } else {
        assert!(stats.zero_chunks > 0, "no zero range arrived as COMPRESS: {stats:?}");
        assert!(stats.chunks_registered > 0, "{stats:?}");
        // The pattern spans 24 chunks of pc.ram at least.
        assert!(stats.chunks_registered >= PATTERN_LEN / MIB, "{stats:?}");
    }
    assert_eq!(info["ram"]["total"].as_u64(), Some(blocks.iter().map(|b| b.2).sum::<u64>()), "{info}");

    // The connection is gone (the source left); closing frees everything.
    dest.close();
    assert_eq!(dest.stats().pinned_bytes, 0);
}

/// Whether a QEMU 7.2 stream ends as a whole one does: QEMU_VM_EOF (0x00),
/// then QEMU_VM_VMDESCRIPTION (0x06), a big-endian u32 length and that many
/// bytes of JSON, up to the last byte.
pub(crate) fn ends_with_vm_eof(stream: &[u8]) -> bool {
    (0..stream.len().saturating_sub(6)).rev().any(|p| {
        let len = u32::from_be_bytes(stream[p + 2..p + 6].try_into().unwrap()) as usize;
        stream[p..p + 2] == [0x00, 0x06] && stream.get(p + 6) == Some(&b'{') && p + 6 + len == stream.len()
    })
}

#[test]
fn qemu_source_dynamic_registration() {
    qemu_source_to_rdmamig(false);
}

#[test]
fn qemu_source_pin_all() {
    qemu_source_to_rdmamig(true);
}

/// QEMU (dynamic registration) SIGKILLed right after a REGISTER_REQUEST, so
/// while it writes inside a window: the destination reports a failure within
/// 5 s, from `wait_end` and from `get` alike, never an end of stream. QEMU
/// closes a window every 50 ms or so, and a kill that lands between two is a
/// disconnect outside any window, which a QEMU source's clean end is too
/// (`Unverified`, for the stream to disprove); such a run is repeated.
#[test]
fn qemu_source_killed_inside_a_window_is_a_failure() {
    for attempt in 1..=5 {
        let mut m = Migration::start("killed", false, Config::default().liveness);
        let deadline = Instant::now() + Duration::from_secs(60);
        // The pattern alone needs 24 chunks: kill just after the 8th is registered.
        while m.dest.stats().chunks_registered < 8 {
            assert!(Instant::now() < deadline, "QEMU registered no chunks: {:?}", m.dest.stats());
            thread::yield_now();
        }
        m.qemu.child.kill().unwrap();
        let killed = Instant::now();
        let stats = m.dest.stats();
        let end = m.dest.wait_end(Some(Duration::from_secs(10)));
        let detected = killed.elapsed();
        eprintln!(
            "attempt {attempt}: QEMU killed after {:?} ({stats:?}): {end:?} after {detected:?}",
            m.start.elapsed()
        );
        assert!(detected < Duration::from_secs(5), "{detected:?}");
        let err = match end {
            Ok(Ending::Unverified) => continue,
            other => other.expect_err("a killed source must not complete"),
        };
        assert_eq!(err.kind, ErrorKind::Disconnected, "{err}");
        assert!(err.message.contains("inside an iteration window"), "{err}");
        let mut buf = vec![0u8; 64 * 1024];
        let end = loop {
            match m.dest.get(&mut buf, Some(Duration::from_secs(5))) {
                Ok(Read::Bytes(_)) => continue,
                other => break other,
            }
        };
        assert_eq!(end.map_err(|e| e.kind), Err(ErrorKind::Disconnected), "get must fail, not end the stream");
        return;
    }
    panic!("no kill landed inside a window in 5 attempts");
}
