//! Interoperability: a real QEMU (qemu-system-x86_64 built with RDMA: Debian
//! 12's 7.2, bookworm-backports' 10.0) is the migration source, rdmamig's
//! `Destination` the destination.
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
//! With QEMU's return path the test plays the hypervisor on it too: it finds
//! QEMU's PING in the stream and answers PONG, and sends SHUT once the stream
//! has ended (`put_return`); QEMU's -trace lines show what QEMU took. QEMU
//! 7.2 and 10.0 refuse IPv6 over RoCE, which the IPv6 test checks. Every test
//! prints QEMU's total time and downtime (query-migrate).
//!
//! Runs the QEMU that `RDMAMIG_QEMU` names (a path to a qemu-system-x86_64),
//! or else `qemu-system-x86_64` on PATH (the test guest has the host's).
//! Each QEMU started prints its version; where QEMU versions behave
//! differently, a test expects what the one it runs does.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use rdmamig::{Config, Destination, Ending, ErrorKind, Listener, RamBlocks, Read};

use crate::migration::{rdma_ip, GuestRam, Rng, PAGE};

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

/// The QEMU the tests run: `RDMAMIG_QEMU`, or qemu-system-x86_64 on PATH.
pub(crate) fn qemu_binary() -> String {
    std::env::var("RDMAMIG_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into())
}

/// The first line of `qemu_binary() --version` ("QEMU emulator version
/// 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)") and its (major, minor).
pub(crate) fn qemu_version() -> &'static (String, (u32, u32)) {
    static VERSION: OnceLock<(String, (u32, u32))> = OnceLock::new();
    VERSION.get_or_init(|| {
        let qemu = qemu_binary();
        let out = Command::new(&qemu).arg("--version").output().unwrap_or_else(|e| panic!("{qemu} --version: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().next().unwrap_or_default().to_owned();
        let number = line.split_whitespace().skip_while(|w| *w != "version").nth(1);
        let mut parts = number.unwrap_or_default().split('.').map(str::parse);
        match (parts.next(), parts.next()) {
            (Some(Ok(major)), Some(Ok(minor))) => (line, (major, minor)),
            _ => panic!("no version in {qemu} --version: {text:?}"),
        }
    })
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
        report(&format!("[{role}] {}: {}", qemu_version().0, qemu_binary()));
        let log = dir.join(format!("{role}.log"));
        let out = fs::File::create(&log).unwrap();
        let loader = pattern.map(|p| format!("loader,file={},addr={PATTERN_ADDR:#x},force-raw=on", p.display()));
        let child = Command::new(qemu_binary())
            .args(["-nodefaults", "-display", "none", "-accel", "tcg"])
            .args(args)
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", dir.join(format!("{role}.qmp")).display()))
            .args(loader.iter().flat_map(|l| ["-device", l.as_str()]))
            // What its return-path thread took, and how the return path ended.
            .args(["-trace", "source_return_path_thread_*", "-trace", "migration_return_path_end_after"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", qemu_binary()));
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
        self.try_cmd(name, args).unwrap_or_else(|reply| panic!("QMP {name} failed: {reply}"))
    }

    /// Runs `name`: its "return" value, or the whole error reply.
    fn try_cmd(&mut self, name: &str, args: Value) -> Result<Value, Value> {
        let mut request = serde_json::to_string(&json!({ "execute": name, "arguments": args })).unwrap();
        request.push('\n');
        self.out.write_all(request.as_bytes()).expect("writing to QMP");
        loop {
            let reply = self.read();
            if reply.get("event").is_some() {
                continue;
            }
            return reply.get("return").cloned().ok_or(reply);
        }
    }

    pub(crate) fn hmp(&mut self, command: &str) -> String {
        self.cmd("human-monitor-command", json!({ "command-line": command })).as_str().unwrap().to_owned()
    }
}

/// `info ramblock` → (name, offset, used length), in list order (= migration
/// order). QEMU offers the list through HMP only (QMP's x-query-ramblock is
/// the same text), and its columns differ between versions (10.0 adds HVA and
/// RO after Total), so cells are found by their column's name in the header:
/// QEMU right-aligns each cell under its name, and a block name wider than its
/// column pushes the rest of its row right by as much.
pub(crate) fn parse_ramblocks(text: &str) -> Vec<(String, u64, u64)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("{s:?}: {e}"));
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().expect("info ramblock printed nothing");
    let column_end = |name: &str| {
        header.find(name).map(|at| at + name.len()).unwrap_or_else(|| panic!("no column {name:?} in {header:?}"))
    };
    let (name_end, offset_end, used_end) = (column_end("Block Name"), column_end("Offset"), column_end("Used"));
    lines
        .map(|line| {
            // Each token of the row with the position just past it.
            let tokens: Vec<(usize, &str)> =
                line.split_whitespace().map(|t| (t.as_ptr() as usize - line.as_ptr() as usize + t.len(), t)).collect();
            let (end, name) = tokens[0];
            let shift =
                end.checked_sub(name_end).unwrap_or_else(|| panic!("a block name left of its column: {line:?}"));
            let cell = |column_end: usize| {
                let at = tokens.iter().find(|t| t.0 == column_end + shift);
                at.unwrap_or_else(|| panic!("no cell under the header's column ending at {column_end}: {line:?}")).1
            };
            (name.to_owned(), hex(cell(offset_end)), hex(cell(used_end)))
        })
        .collect()
}

pub(crate) fn pattern() -> Vec<u8> {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    (0..PATTERN_LEN / 8).flat_map(|_| rng.next().to_le_bytes()).collect()
}

/// The pc.bios image QEMU loaded, when it can be found (for an extra check):
/// bios-256k.bin in the first of QEMU's data directories (`-L help`) that
/// has one, as QEMU looks for it.
fn bios_image(len: u64) -> Option<Vec<u8>> {
    let dirs = Command::new(qemu_binary()).args(["-L", "help"]).output().ok()?.stdout;
    let image = String::from_utf8_lossy(&dirs).lines().find_map(|d| fs::read(Path::new(d).join("bios-256k.bin")).ok());
    image.filter(|b| b.len() as u64 == len)
}

/// How QEMU migrates and how the destination serves it.
struct Setup {
    tag: &'static str,
    /// The destination's config; its `pin_all` turns QEMU's rdma-pin-all on too.
    config: Config,
    /// QEMU migration capabilities turned on besides rdma-pin-all.
    capabilities: &'static [&'static str],
    /// The address the destination listens on and QEMU migrates to.
    addr: String,
}

impl Setup {
    fn new(tag: &'static str, config: Config) -> Setup {
        Setup { tag, config, capabilities: &[], addr: rdma_ip() }
    }
}

/// Why a migration did not get as far as a connected destination.
struct NotStarted {
    /// Why the destination's accept failed (`None`: cancelled, QEMU failed first).
    accept: Option<rdmamig::Error>,
    /// QEMU's error reply to `migrate`, or its query-migrate once it had
    /// failed (or when the accept failed).
    info: Value,
    log: String,
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
    tag: &'static str,
    start: Instant,
    connected: Duration,
    _dir: TempDir,
}

impl Migration {
    /// Starts QEMU, accepts its connection after `migrate` and returns at once.
    fn start(setup: &Setup) -> Migration {
        Migration::try_start(setup).unwrap_or_else(|n| {
            panic!("[{}] no connection: {:?}\nQEMU: {}\n--- QEMU output:\n{}", setup.tag, n.accept, n.info, n.log)
        })
    }

    /// As `start`, or why the destination got no connection.
    fn try_start(setup: &Setup) -> Result<Migration, NotStarted> {
        let tag = setup.tag;
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
        let pin_all = setup.config.pin_all;
        let on: Vec<Value> = pin_all
            .then_some("rdma-pin-all")
            .iter()
            .chain(setup.capabilities)
            .map(|c| json!({ "capability": c, "state": true }))
            .collect();
        if !on.is_empty() {
            qmp.cmd("migrate-set-capabilities", json!({ "capabilities": on }));
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

        let addr = &setup.addr;
        let listener =
            Arc::new(Listener::bind(addr, 0, &setup.config).unwrap_or_else(|e| panic!("listen on {addr}: {e}")));
        let port = listener.port();
        let accept = {
            let listener = listener.clone();
            thread::spawn(move || Destination::accept(&listener, &registry, Some(Duration::from_secs(60))))
        };
        let uri = if addr.contains(':') { format!("rdma:[{addr}]:{port}") } else { format!("rdma:{addr}:{port}") };
        let start = Instant::now();
        // QEMU may give up before it connects: at once (an error reply), or later.
        let mut failed = qmp.try_cmd("migrate", json!({ "uri": uri })).err();
        while failed.is_none() && !accept.is_finished() {
            let info = qmp.cmd("query-migrate", json!({}));
            if info["status"] == "failed" {
                failed = Some(info);
            }
            thread::sleep(Duration::from_millis(50));
        }
        if failed.is_some() {
            // A QEMU that connected before it failed was accepted all the same.
            listener.cancel();
        }
        let dest = match accept.join().unwrap() {
            Ok(dest) => Arc::new(dest),
            Err(e) => {
                let info = failed.unwrap_or_else(|| {
                    thread::sleep(Duration::from_millis(500));
                    qmp.cmd("query-migrate", json!({}))
                });
                let accept = Some(e).filter(|e| e.kind != ErrorKind::Cancelled);
                return Err(NotStarted { accept, info, log: fs::read_to_string(&qemu.log).unwrap_or_default() });
            }
        };
        let connected = start.elapsed();
        assert_eq!(dest.negotiated().pin_all, pin_all, "{:?}", dest.negotiated());
        assert!(!dest.negotiated().extensions, "QEMU offers no rdmamig extensions: {:?}", dest.negotiated());
        Ok(Migration {
            _closer: Closer(dest.clone()),
            dest,
            qmp,
            qemu,
            ram,
            blocks,
            pattern,
            tag,
            start,
            connected,
            _dir: dir,
        })
    }

    /// Polls query-migrate until QEMU's migration has ended (completed,
    /// failed or cancelled) and returns its last answer; prints QEMU's times.
    fn wait_final(&mut self) -> Value {
        let mut zero_time = 0;
        let info = loop {
            let info = self.qmp.cmd("query-migrate", json!({}));
            match info["status"].as_str().unwrap_or("") {
                // total-time can still read 0 at the instant the status turns: ask again.
                "completed" if info["total-time"].as_u64().unwrap_or(0) > 0 || zero_time == 20 => break info,
                "completed" => zero_time += 1,
                "failed" | "cancelled" => break info,
                _ => {}
            }
            assert!(
                self.start.elapsed() < MIGRATION_TIMEOUT,
                "migration not done after {MIGRATION_TIMEOUT:?}: {info}\ndestination stats {:?}",
                self.dest.stats()
            );
            thread::sleep(Duration::from_millis(100));
        };
        print_qemu_times(self.tag, &info);
        info
    }

    /// `wait_final`, which must be a completion.
    fn wait_completed(&mut self) -> Value {
        let info = self.wait_final();
        assert_eq!(
            info["status"],
            "completed",
            "QEMU migration: {info}\ndestination error: {:?}, stats {:?}",
            self.dest.error(),
            self.dest.stats()
        );
        info
    }

    /// What QEMU printed so far (its -trace lines among it).
    fn qemu_log(&self) -> String {
        fs::read_to_string(&self.qemu.log).unwrap_or_default()
    }
}

/// One line with QEMU's own figures for a run (query-migrate, milliseconds).
pub(crate) fn print_qemu_times(tag: &str, info: &Value) {
    let ms = |key: &str| info[key].as_u64().map_or_else(|| "-".to_string(), |v| v.to_string());
    let status = info.get("status").unwrap_or(&info["error"]["class"]);
    report(&format!("[{tag}] QEMU total-time {} ms, downtime {} ms ({status})", ms("total-time"), ms("downtime")));
}

/// Writes a line to stderr past libtest's output capture (which takes only
/// `print!`/`eprint!`), so that each interop run's figures are in the
/// suite's log even when the test passes.
pub(crate) fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// What the test, as the hypervisor, answers on the return path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// No return path.
    Nothing,
    /// PONG to QEMU's PING, SHUT(0) once the stream has ended.
    PongAndShut,
    /// PONG only; stops reading once the stream has ended.
    PongOnly,
}

/// What the hypervisor read and did.
struct Served {
    stream: Vec<u8>,
    /// How the connection ended (`None`: still open, `Answer::PongOnly`).
    ending: Option<Ending>,
    /// The PING value found in the stream and answered.
    ping: Option<u32>,
}

/// QEMU's return-path message types (MIG_RP_MSG_*, migration.c).
const RP_MSG_SHUT: u16 = 1;
const RP_MSG_PONG: u16 = 2;

/// A return-path message with a be32 payload: be16 type, be16 length, payload.
fn rp_message(kind: u16, value: u32) -> Vec<u8> {
    [&kind.to_be_bytes()[..], &4u16.to_be_bytes(), &value.to_be_bytes()].concat()
}

/// The value of the PING QEMU sends right after asking the destination to
/// open the return path: QEMU_VM_COMMAND (0x08) MIG_CMD_OPEN_RETURN_PATH
/// (be16 1, length 0), then QEMU_VM_COMMAND MIG_CMD_PING (be16 2, length 4,
/// be32 value), just after the stream header and configuration section.
fn find_ping(stream: &[u8]) -> Option<u32> {
    const OPEN_THEN_PING: [u8; 10] = [0x08, 0, 1, 0, 0, 0x08, 0, 2, 0, 4];
    let head = &stream[..stream.len().min(1024)];
    head.windows(14).find(|w| w[..10] == OPEN_THEN_PING).map(|w| u32::from_be_bytes(w[10..].try_into().unwrap()))
}

/// The hypervisor's stream reader: reads the device-state stream until the
/// source leaves, answering on the return path as `answer` says.
fn serve(dest: &Arc<Destination>, answer: Answer) -> thread::JoinHandle<rdmamig::Result<Served>> {
    let dest = dest.clone();
    thread::spawn(move || {
        let mut served = Served { stream: Vec::new(), ending: None, ping: None };
        let mut shut = false;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match dest.get(&mut buf, Some(MIGRATION_TIMEOUT))? {
                Read::Bytes(n) => served.stream.extend_from_slice(&buf[..n]),
                // QEMU has no completion handshake: its stream must prove itself.
                Read::End(ending) => {
                    served.ending = Some(ending);
                    return Ok(served);
                }
            }
            if answer == Answer::Nothing {
                continue;
            }
            if served.ping.is_none() {
                served.ping = find_ping(&served.stream);
                if let Some(ping) = served.ping {
                    dest.put_return(&rp_message(RP_MSG_PONG, ping))?;
                }
            }
            if !shut && ends_with_vm_eof(&served.stream) {
                if answer == Answer::PongOnly {
                    return Ok(served);
                }
                // QEMU's destination sends it once its stream is loaded; 0: no error.
                dest.put_return(&rp_message(RP_MSG_SHUT, 0))?;
                shut = true;
            }
        }
    })
}

/// QEMU's side of the story and the destination's: QEMU completed, the
/// stream is whole, and the RAM and the counters are right.
/// Returns the PING value the hypervisor answered.
fn check_migrated(m: &mut Migration, served: thread::JoinHandle<rdmamig::Result<Served>>) -> Option<u32> {
    let info = m.wait_completed();
    let completed = m.start.elapsed();
    let Migration { ref dest, ref ram, ref blocks, ref pattern, tag, start, connected, .. } = *m;
    let served =
        served.join().unwrap().unwrap_or_else(|e| panic!("reading the stream: {e} (stats {:?})", dest.stats()));
    let stream = &served.stream;
    assert_eq!(served.ending, Some(Ending::Unverified), "a QEMU source's clean end is closed-without-proof");
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
    assert!(ends_with_vm_eof(stream), "the stream does not end in QEMU_VM_EOF + VM description");
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
    if dest.negotiated().pin_all {
        assert_eq!(stats.zero_chunks, 0, "QEMU sends no COMPRESS with pin-all: {stats:?}");
        // QEMU sends no REGISTER with pin-all: the blocks exchange is the one registration round trip.
        assert_eq!(stats.registration_round_trips, 1, "pin-all registers at the blocks exchange only: {stats:?}");
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
    served.ping
}

fn qemu_source_to_rdmamig(pin_all: bool) {
    let tag = if pin_all { "pin-all" } else { "dynamic" };
    // A short liveness: the destination's zero-length-WRITE probes reach
    // QEMU's QP whenever QEMU is quiet for 100 ms (seen: answered in
    // 0.4-2 ms), and must change nothing for QEMU.
    let config = Config { pin_all, liveness: Some(Duration::from_millis(300)), ..Config::default() };
    let mut m = Migration::start(&Setup::new(tag, config));
    assert!(!m.dest.has_return_path());
    let err = m.dest.put_return(&rp_message(RP_MSG_SHUT, 0)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::State, "{err}");
    let served = serve(&m.dest, Answer::Nothing);
    check_migrated(&mut m, served);
}

/// The capabilities that make QEMU use a return path over RDMA: in 7.2
/// `return-path` alone opens no connection for it (see
/// `qemu_source_with_return_path_alone`), `postcopy-ram` does (postcopy
/// never starts here); from 8.0 `return-path` alone does, and 10.2 refuses
/// `postcopy-ram` with RDMA ("RDMA and postcopy-ram can't be used together").
fn return_path_capabilities() -> &'static [&'static str] {
    if qemu_version().1 < (8, 0) {
        &["return-path", "postcopy-ram"]
    } else {
        &["return-path"]
    }
}

/// Lines of QEMU's -trace output.
const RP_PONG_1: &str = "source_return_path_thread_pong 0x1";
const RP_SHUT_0: &str = "source_return_path_thread_shut 0x0";
const RP_ENDED: &str = "migration_return_path_end_after";

/// QEMU's trace line for its return path's end: 7.2 traces the error (0:
/// none), 10.0 only the end (its migration's status tells how).
fn rp_ended(error: u8) -> String {
    if qemu_version().1 < (10, 0) {
        format!("{RP_ENDED} {error}")
    } else {
        RP_ENDED.to_owned()
    }
}

/// QEMU with a return path: the destination keeps QEMU's second connection;
/// the test, as the hypervisor, answers the PING it finds in the stream with
/// PONG and sends SHUT(0) once the stream has ended. QEMU's trace shows it
/// took both, and it completes.
#[test]
fn qemu_source_with_return_path() {
    migrate_with_return_path("return-path", return_path_capabilities());
}

fn migrate_with_return_path(tag: &'static str, capabilities: &'static [&'static str]) {
    let config = Config { return_path: true, ..Config::default() };
    let mut m = Migration::start(&Setup { capabilities, ..Setup::new(tag, config) });
    assert!(m.dest.has_return_path());
    let served = serve(&m.dest, Answer::PongAndShut);
    let ping = check_migrated(&mut m, served);
    assert_eq!(ping, Some(1), "QEMU pings (1) right after opening the return path");
    let log = m.qemu_log();
    for line in [RP_PONG_1, RP_SHUT_0, &rp_ended(0)] {
        assert!(log.contains(line), "QEMU's trace lacks {line:?}:\n{log}");
    }
    // Both connections are gone.
    let err = m.dest.put_return(&rp_message(RP_MSG_SHUT, 0)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Aborted, "{err}");
}

/// Without SHUT, QEMU waits: it has sent everything (the stream ends with
/// QEMU_VM_EOF and the VM description) and its migration stays in one state
/// for as long as the return path is open (5 s here): "active" in QEMU 7.2,
/// "device" in 10.0 (which always enters it to switch over, where 7.2 did
/// only with pause-before-switchover). Once the destination closes, QEMU's
/// migration fails.
#[test]
fn qemu_source_waits_for_shut() {
    let waiting_state = if qemu_version().1 < (10, 0) { "active" } else { "device" };
    let config = Config { return_path: true, ..Config::default() };
    let mut m = Migration::start(&Setup { capabilities: return_path_capabilities(), ..Setup::new("no-shut", config) });
    let served = serve(&m.dest, Answer::PongOnly).join().unwrap().unwrap();
    assert!(ends_with_vm_eof(&served.stream) && served.ending.is_none());
    let waiting = Instant::now();
    while waiting.elapsed() < Duration::from_secs(5) {
        let info = m.qmp.cmd("query-migrate", json!({}));
        assert_eq!(info["status"], waiting_state, "QEMU without SHUT: {info}");
        thread::sleep(Duration::from_millis(250));
    }
    m.dest.close();
    let closed = Instant::now();
    let info = m.wait_final();
    eprintln!("[no-shut] QEMU ended {:?} after the destination closed: {info}", closed.elapsed());
    assert_eq!(info["status"], "failed", "{info}");
    let log = m.qemu_log();
    assert!(log.contains(RP_PONG_1) && log.contains(&rp_ended(1)), "QEMU's trace:\n{log}");
}

/// `return-path` alone (no postcopy-ram). QEMU 7.2 opens no connection for
/// it (fixed in QEMU 8.0, "migration/rdma: Fix return-path case"), yet
/// starts its return-path thread: that thread's first read fails, and
/// closing its file closes the channel the migration runs on. So QEMU 7.2
/// fails the migration right after setup, whatever the destination does:
/// here the destination gets the stream's first bytes (up to
/// MIG_CMD_OPEN_RETURN_PATH) and the disconnect, and the stream never ends
/// in QEMU_VM_EOF. A later QEMU opens its return path as with postcopy-ram,
/// and migrates as in `qemu_source_with_return_path`.
#[test]
fn qemu_source_with_return_path_alone() {
    if qemu_version().1 >= (8, 0) {
        migrate_with_return_path("return-path-alone", &["return-path"]);
        return;
    }
    let setup = Setup { capabilities: &["return-path"], ..Setup::new("return-path-alone", Config::default()) };
    let mut m = Migration::start(&setup);
    let served = serve(&m.dest, Answer::Nothing);
    let info = m.wait_final();
    assert_eq!(info["status"], "failed", "{info}");
    let log = m.qemu_log();
    assert!(log.contains("source_return_path_thread_bad_end"), "QEMU's trace:\n{log}");
    assert!(!log.contains(RP_ENDED), "QEMU got as far as completing:\n{log}");
    let served = served.join().unwrap().unwrap_or_else(|e| panic!("the destination failed otherwise: {e}"));
    eprintln!("[{}] the destination got {} stream bytes, then {:?}", m.tag, served.stream.len(), served.ending);
    assert!(!ends_with_vm_eof(&served.stream), "QEMU sent a whole stream");
    assert_eq!(served.ending, Some(Ending::Unverified), "QEMU left between windows");
}

/// A destination with `return_path` and a QEMU source that opens no return
/// path: once the config's timeout has run out, the accept fails and says
/// why, and QEMU, left without its connection, fails its migration.
#[test]
fn return_path_destination_refuses_a_qemu_source_without_one() {
    let config = Config { return_path: true, timeout: Duration::from_secs(3), ..Config::default() };
    let setup = Setup::new("no-return-path", config);
    let Err(refused) = Migration::try_start(&setup) else { panic!("a return path was accepted") };
    print_qemu_times(setup.tag, &refused.info);
    let err = refused.accept.expect("the destination's accept fails");
    assert_eq!(err.kind, ErrorKind::Connect, "{err}");
    assert!(err.message.contains("no return-path connection within 3s"), "{err}");
    assert_eq!(refused.info["status"], "failed", "{}", refused.info);
}

/// QEMU migrating to the destination's IPv6 address (RXE_VM_IP6, which the
/// harness puts on the RDMA netdev). QEMU 7.2 and 10.0 refuse IPv6 on a host
/// with RoCE or iWARP devices and no InfiniBand one (`qemu_rdma_broken_ipv6_kernel`):
/// `migrate` fails at once, before any connection request. Where it connects (an InfiniBand
/// device, or a QEMU without that check), the whole migration is checked.
#[test]
fn qemu_source_over_ipv6() {
    let ip6 = std::env::var("RXE_VM_IP6").expect("RXE_VM_IP6: the RDMA netdev's IPv6 address (the harness sets it)");
    let setup = Setup { addr: ip6, ..Setup::new("ipv6", Config::default()) };
    match Migration::try_start(&setup) {
        Ok(mut m) => {
            let served = serve(&m.dest, Answer::Nothing);
            check_migrated(&mut m, served);
        }
        Err(refused) => {
            print_qemu_times(setup.tag, &refused.info);
            assert!(refused.accept.is_none(), "QEMU connected, then: {:?}\n{}", refused.accept, refused.log);
            let why = refused.info["error"]["desc"].as_str().unwrap_or_default();
            assert!(
                why.contains("IPv6 over RoCE / iWARP is not supported"),
                "QEMU failed for another reason: {}\n{}",
                refused.info,
                refused.log
            );
            eprintln!("[ipv6] {} refuses IPv6 over RoCE before connecting: {why}", qemu_version().0);
        }
    }
}

/// Whether a QEMU stream (7.2, 10.0) ends as a whole one does: QEMU_VM_EOF (0x00),
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
        let mut m = Migration::start(&Setup::new("killed", Config::default()));
        let deadline = Instant::now() + Duration::from_secs(60);
        // The pattern alone needs 24 chunks: kill just after the 8th is registered.
        while m.dest.stats().chunks_registered < 8 {
            assert!(Instant::now() < deadline, "QEMU registered no chunks: {:?}", m.dest.stats());
            thread::yield_now();
        }
        m.qemu.child.kill().unwrap();
        let killed = Instant::now();
        print_qemu_times(m.tag, &json!({ "status": "killed: no query-migrate" }));
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

/// `info ramblock` as QEMU answers human-monitor-command, verbatim, for
/// `-M pc -m 64 -device pci-bridge,id=br0,chassis_nr=1 -device e1000,bus=br0,addr=1`
/// (the e1000's ROM has a name wider than its column).
const RAMBLOCK_7_2: &str = concat!(
    "              Block Name    PSize              Offset               Used              Total\r\n",
    "                  pc.ram    4 KiB  0x0000000000000000 0x0000000004000000 0x0000000004000000\r\n",
    "    /rom@etc/acpi/tables    4 KiB  0x00000000040c0000 0x0000000000020000 0x0000000000200000\r\n",
    "                 pc.bios    4 KiB  0x0000000004000000 0x0000000000040000 0x0000000000040000\r\n",
    "0000:00:02.0:01.0/e1000.rom    4 KiB  0x0000000004080000 0x0000000000040000 0x0000000000040000\r\n",
    "                  pc.rom    4 KiB  0x0000000004040000 0x0000000000020000 0x0000000000020000\r\n",
    "   /rom@etc/table-loader    4 KiB  0x00000000042c0000 0x0000000000001000 0x0000000000010000\r\n",
    "      /rom@etc/acpi/rsdp    4 KiB  0x0000000004300000 0x0000000000001000 0x0000000000001000\r\n",
);
const RAMBLOCK_10_0: &str = concat!(
    "              Block Name    PSize              Offset               Used              Total                HVA  RO\r\n",
    "                  pc.ram    4 KiB  0x0000000000000000 0x0000000004000000 0x0000000004000000 0x00007f8d3be00000  rw\r\n",
    "    /rom@etc/acpi/tables    4 KiB  0x00000000040c0000 0x0000000000020000 0x0000000000200000 0x00007f8d46a00000  ro\r\n",
    "                 pc.bios    4 KiB  0x0000000004000000 0x0000000000040000 0x0000000000040000 0x00007f8d8c400000  ro\r\n",
    "0000:00:02.0:01.0/e1000.rom    4 KiB  0x0000000004080000 0x0000000000040000 0x0000000000040000 0x00007f8d46e00000  ro\r\n",
    "                  pc.rom    4 KiB  0x0000000004040000 0x0000000000020000 0x0000000000020000 0x00007f8d8c200000  ro\r\n",
    "   /rom@etc/table-loader    4 KiB  0x00000000042c0000 0x0000000000001000 0x0000000000010000 0x00007f8d46800000  ro\r\n",
    "      /rom@etc/acpi/rsdp    4 KiB  0x0000000004300000 0x0000000000001000 0x0000000000001000 0x00007f8d46600000  ro\r\n",
);

/// Both versions' lists read alike: names, offsets and used lengths, not
/// QEMU 10's Total, HVA or RO. Needs no RDMA device.
#[test]
fn ramblocks_read_by_column_name() {
    let blocks = [
        ("pc.ram", 0, 0x400_0000),
        ("/rom@etc/acpi/tables", 0x40c_0000, 0x2_0000),
        ("pc.bios", 0x400_0000, 0x4_0000),
        ("0000:00:02.0:01.0/e1000.rom", 0x408_0000, 0x4_0000),
        ("pc.rom", 0x404_0000, 0x2_0000),
        ("/rom@etc/table-loader", 0x42c_0000, 0x1000),
        ("/rom@etc/acpi/rsdp", 0x430_0000, 0x1000),
    ]
    .map(|(name, offset, used)| (name.to_owned(), offset, used));
    for text in [RAMBLOCK_7_2, RAMBLOCK_10_0] {
        assert_eq!(parse_ramblocks(text), blocks, "{text}");
    }
}
