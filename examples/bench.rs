//! The migration benchmark (`make bench`, scripts/bench.sh): rdmamig against
//! ib_write_bw and against QEMU → QEMU over RDMA, in one RDMA guest boot.
//!
//! 1. Anchors: `ib_write_bw -R -F -s 1048576 -t 16 --report_gbits`, and the
//!    same at `-s 4096` (server and client on this host's RDMA address),
//!    each twice, the better kept.
//! 2. QEMU → QEMU (`qemu-system-x86_64 -S`, pc.ram a shared file on tmpfs
//!    holding `--size` MiB of random non-zero pages), dynamic and pin-all;
//!    the time is QEMU's `total-time`; the destination's pc.ram file must
//!    come out byte-identical to the source's.
//! 3. rdmamig ↔ rdmamig, the same size of random pages, extensions on/off ×
//!    dynamic/pin-all, the destination in a second process (this program
//!    re-executed with `--dest`), which regenerates the content from the
//!    seed and compares. One window, one `save` per 4 KiB page (the issue's
//!    baseline); the time runs from before `Source::connect` to `close`
//!    returning. Also: registration round trips per GiB, and the source's
//!    CPU seconds per GiB (the process: getrusage; the engine thread
//!    "rdmamig-source": its /proc stat, read before `close`).
//! 4. Sparse guest: `--sparse-size` MiB files on tmpfs, 25 % written in
//!    64 KiB runs (one run of every four, at a random place), the rest never
//!    written: QEMU → QEMU (dynamic, and pin-all unless --quick) and rdmamig
//!    (dynamic, extensions on and off) with the RAM mapped MAP_SHARED from
//!    the file; the source's file allocation (st_blocks × 512) and VmRSS
//!    before and after.
//! 5. Final round: rdmamig (extensions on, dynamic) sends the whole guest in
//!    one window, then `--pages` changed scattered (never adjacent) pages in
//!    a second, timed from `iteration_begin` to `iteration_end` returning.
//!
//! Before the first, a warm-up (`warm_up`): the guest's free memory is
//! touched once and freed, and the RDMA devices are discovered, so that
//! neither one-off cost lands on whichever run comes first.
//!
//! Prints one table (figure, unit, ratios, the issue's targets, verified or
//! FAILED). Exit status 1 if any run failed or came out different, never
//! because of a ratio.
//!
//! ```text
//! cargo build --release --features rdma-tests --example bench
//! bench [--size MiB] [--sparse-size MiB] [--pages N] [--skip-qemu] [--quick]
//! ```
//!
//! Needs an RDMA device at `RXE_VM_IP` (default 198.18.0.1, device
//! `RXE_VM_DEV`, default rxe0), root (or a large `ulimit -l`), ib_write_bw,
//! qemu-system-x86_64 (unless --skip-qemu) and a tmpfs at /dev/shm with room
//! for two sparse files; scripts/bench.sh runs it in an rxe guest.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use rdmamig::{Config, Destination, Ending, Listener, RamBlocks, Source};

const MIB: u64 = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;
const PAGE: u64 = 4096;
/// Pages of a sparse guest's written runs (64 KiB).
const RUN_PAGES: u64 = 16;
const SEED: u64 = 0x5eed_0b5e_55ed_1234;
/// The seed of the pages changed for the final round.
const FINAL_SEED: u64 = 0xf1a1_f1a1_0000_0001;
const WAIT: Duration = Duration::from_secs(600);

#[path = "common/mod.rs"]
mod common;
use common::perftest::{better, ip, perftest};
use common::{mix, Ram};

type R<T> = Result<T, String>;

// ---------------------------------------------------------------------------
// Guest content: every page's bytes follow from (seed, page number), so the
// destination process regenerates what it must have received.

/// What a guest holds: `len` bytes of random pages (dense), or one 64 KiB run
/// of every four written (sparse); with `final_pages`, that many scattered
/// pages changed (from `FINAL_SEED`) for the final round.
#[derive(Clone, Copy, Debug)]
struct Content {
    len: u64,
    sparse: bool,
    final_pages: u64,
}

impl Content {
    fn dense(len: u64) -> Content {
        Content { len, sparse: false, final_pages: 0 }
    }

    fn sparse(len: u64) -> Content {
        Content { len, sparse: true, final_pages: 0 }
    }

    fn pages(&self) -> u64 {
        self.len / PAGE
    }

    /// Whether the page is written before the migration (a sparse guest's
    /// other pages are never written: holes in its file).
    fn written(&self, page: u64) -> bool {
        let run = page / RUN_PAGES;
        !self.sparse || run % 4 == mix(SEED ^ (run / 4)) % 4
    }

    /// The page changed in final-round slot `slot`: one per `pages / final_pages`
    /// pages, never the slot's last, so no two are adjacent.
    fn final_page(&self, slot: u64) -> u64 {
        let span = self.pages() / self.final_pages;
        slot * span + mix(FINAL_SEED ^ slot) % (span - 1)
    }

    fn is_final(&self, page: u64) -> bool {
        if self.final_pages == 0 {
            return false;
        }
        let slot = page / (self.pages() / self.final_pages);
        slot < self.final_pages && self.final_page(slot) == page
    }

    /// The page's seed at the end of the migration (`None`: all zero).
    fn seed_at_end(&self, page: u64) -> Option<u64> {
        if self.is_final(page) {
            Some(FINAL_SEED)
        } else {
            self.written(page).then_some(SEED)
        }
    }

    /// The bytes of the guest's written pages.
    fn written_bytes(&self) -> u64 {
        (0..self.pages()).step_by(RUN_PAGES as usize).filter(|&p| self.written(p)).count() as u64 * RUN_PAGES * PAGE
    }
}

/// Page `page`'s bytes under `seed`: random, never all zero.
fn fill_page(out: &mut [u8], seed: u64, page: u64) {
    let mut x = mix(seed ^ page.wrapping_mul(0xd6e8_feb8_6659_fd93)) | 1;
    for word in out.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes());
    }
    out[0] |= 1;
}

/// Writes the guest's initial content to `mem`.
fn fill(mem: &mut [u8], content: &Content) {
    for (page, out) in mem.chunks_exact_mut(PAGE as usize).enumerate() {
        if content.written(page as u64) {
            fill_page(out, SEED, page as u64);
        }
    }
}

/// A new file of `content.len` bytes on tmpfs with the guest's initial
/// content: only the written runs are written (the rest stays holes).
fn write_file(path: &Path, content: &Content) -> R<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.set_len(content.len).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut run = vec![0u8; (RUN_PAGES * PAGE) as usize];
    for first in (0..content.pages()).step_by(RUN_PAGES as usize) {
        if content.written(first) {
            for (i, out) in run.chunks_exact_mut(PAGE as usize).enumerate() {
                fill_page(out, SEED, first + i as u64);
            }
            file.write_all_at(&run, first * PAGE).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(file)
}

/// Checks `bytes`, the guest's memory from `offset` on, against its content at the end.
fn check(content: &Content, offset: u64, bytes: &[u8]) -> R<()> {
    let mut want = vec![0u8; PAGE as usize];
    for (i, got) in bytes.chunks_exact(PAGE as usize).enumerate() {
        let page = offset / PAGE + i as u64;
        match content.seed_at_end(page) {
            Some(seed) => fill_page(&mut want, seed, page),
            None => want.fill(0),
        }
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("differs at byte {:#x}", page * PAGE + at as u64));
        }
    }
    Ok(())
}

/// Checks a file against the content, reading it (holes read as zeros and stay holes).
fn check_file(path: &Path, content: &Content) -> R<()> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buf = vec![0u8; MIB as usize];
    for offset in (0..content.len).step_by(MIB as usize) {
        let n = MIB.min(content.len - offset) as usize;
        file.read_exact_at(&mut buf[..n], offset).map_err(|e| format!("{}: {e}", path.display()))?;
        check(content, offset, &buf[..n])?;
    }
    Ok(())
}

/// Compares two files byte for byte.
fn compare_files(a: &Path, b: &Path) -> R<()> {
    let open = |p: &Path| File::open(p).map_err(|e| format!("{}: {e}", p.display()));
    let (fa, fb) = (open(a)?, open(b)?);
    let len = fa.metadata().map_err(|e| e.to_string())?.len();
    if fb.metadata().map_err(|e| e.to_string())?.len() != len {
        return Err(format!("{} and {} differ in length", a.display(), b.display()));
    }
    let (mut x, mut y) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    for offset in (0..len).step_by(MIB as usize) {
        let n = MIB.min(len - offset) as usize;
        fa.read_exact_at(&mut x[..n], offset).map_err(|e| e.to_string())?;
        fb.read_exact_at(&mut y[..n], offset).map_err(|e| e.to_string())?;
        if let Some(at) = x[..n].iter().zip(&y[..n]).position(|(p, q)| p != q) {
            return Err(format!("the destination's pc.ram differs at byte {:#x}", offset + at as u64));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Guest RAM and what the source process measures.

/// The registry of a sparse guest mapped from `file` (offset 0): with the
/// backing file given, the library finds the never-written pages (holes)
/// without reading them.
fn sparse_registry(ram: &Ram, file: &File) -> R<RamBlocks> {
    let mut registry = ram.registry();
    registry.set_backing(0, file.as_fd(), 0).map_err(|e| format!("set_backing: {e}"))?;
    Ok(registry)
}

/// A line's value in /proc/PID/status, in bytes ("VmRSS:  1234 kB").
fn vm_rss(pid: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Bytes the file system allocated for the file (st_blocks × 512).
fn allocated(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

/// User + system CPU seconds of this process.
fn process_cpu() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// User + system CPU seconds of this process's thread named `name` (0 if none).
fn thread_cpu(name: &str) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let Ok(tasks) = fs::read_dir("/proc/self/task") else { return 0.0 };
    for task in tasks.flatten() {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // After "(comm)": state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        return (field(14) + field(15)) / ticks;
    }
    0.0
}

/// The source's memory before and after a migration of a sparse guest.
#[derive(Clone, Copy, Debug, Default)]
struct Memory {
    file_before: u64,
    file_after: u64,
    rss_before: u64,
    rss_after: u64,
}

// ---------------------------------------------------------------------------
// 1. Anchors.

/// `ib_write_bw -R -F -d DEV -s size -t 16 -D secs --report_gbits`, server and
/// client on this host's RDMA address: its average, Gbit/s.
/// A loaded guest may not have the server listening when the client
/// connects (the client then fails with a rejected connection): three tries.
fn anchor(size: u64, secs: u32) -> R<f64> {
    let (size_arg, secs_arg) = (size.to_string(), secs.to_string());
    let out = perftest("ib_write_bw", &["-s", &size_arg, "-t", "16", "-D", &secs_arg, "--report_gbits"])?;
    // The line after the "#bytes #iterations BW peak BW average MsgRate" header.
    out.lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"))
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("ib_write_bw -s {size}: no bandwidth in its output\n{out}"))
}

// ---------------------------------------------------------------------------
// 2. QEMU → QEMU: a minimal QMP client and the two QEMUs.

/// One command at a time, events skipped.
struct Qmp {
    out: UnixStream,
    input: BufReader<UnixStream>,
}

impl Qmp {
    fn connect(path: &Path, qemu: &mut Child) -> R<Qmp> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => return Err(format!("QMP {}: {e}", path.display())),
                Err(_) => {
                    if let Ok(Some(status)) = qemu.try_wait() {
                        return Err(format!("QEMU exited ({status}) before its QMP socket came up"));
                    }
                    thread::sleep(Duration::from_millis(50));
                }
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
        let mut qmp = Qmp { out: stream.try_clone().map_err(|e| e.to_string())?, input: BufReader::new(stream) };
        qmp.read()?;
        qmp.cmd("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    fn read(&mut self) -> R<Value> {
        let mut line = String::new();
        match self.input.read_line(&mut line) {
            Ok(0) => Err("QMP closed the connection".into()),
            Ok(_) => serde_json::from_str(&line).map_err(|e| format!("bad QMP line {line:?}: {e}")),
            Err(e) => Err(format!("reading QMP: {e}")),
        }
    }

    /// Runs `name`: its "return" value, or the error reply as the error.
    fn cmd(&mut self, name: &str, args: Value) -> R<Value> {
        let request = json!({ "execute": name, "arguments": args }).to_string() + "\n";
        self.out.write_all(request.as_bytes()).map_err(|e| format!("writing QMP: {e}"))?;
        loop {
            let reply = self.read()?;
            if reply.get("event").is_none() {
                return reply.get("return").cloned().ok_or_else(|| format!("QMP {name}: {reply}"));
            }
        }
    }
}

/// A paused `-nodefaults` TCG QEMU whose pc.ram is `ram_file` (shared), with
/// `-incoming defer` if `incoming`; killed and reaped on drop.
struct Qemu {
    child: Child,
    qmp: Qmp,
    log: PathBuf,
}

impl Qemu {
    fn start(dir: &Path, role: &str, ram_file: &Path, len: u64, incoming: bool) -> R<Qemu> {
        let log = dir.join(format!("{role}.log"));
        let qmp_path = dir.join(format!("{role}.qmp"));
        let out = File::create(&log).map_err(|e| e.to_string())?;
        let mut child = Command::new("qemu-system-x86_64")
            .args(["-nodefaults", "-display", "none", "-accel", "tcg", "-S"])
            .args(["-M", "pc,memory-backend=pc.ram", "-m", &format!("{}", len / MIB), "-object"])
            .arg(format!("memory-backend-file,id=pc.ram,size={len},mem-path={},share=on", ram_file.display()))
            .args(if incoming { &["-incoming", "defer"][..] } else { &[][..] })
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp_path.display()))
            .stdin(Stdio::null())
            .stdout(out.try_clone().map_err(|e| e.to_string())?)
            .stderr(out)
            .spawn()
            .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
        match Qmp::connect(&qmp_path, &mut child) {
            Ok(qmp) => Ok(Qemu { child, qmp, log }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("{e}\n{}", fs::read_to_string(&log).unwrap_or_default()))
            }
        }
    }

    /// Polls `query-migrate` until completed; returns the last answer.
    fn wait_completed(&mut self) -> R<Value> {
        let start = Instant::now();
        loop {
            let info = self.qmp.cmd("query-migrate", json!({}))?;
            match info["status"].as_str().unwrap_or("") {
                // total-time can still read 0 at the instant the status turns.
                "completed" if info["total-time"].as_u64() != Some(0) => return Ok(info),
                "failed" | "cancelled" => {
                    return Err(format!("QEMU migration {info}\n{}", fs::read_to_string(&self.log).unwrap_or_default()))
                }
                _ if start.elapsed() > WAIT => return Err(format!("QEMU migration not done: {info}")),
                _ => thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn set_pin_all(qmp: &mut Qmp) -> R<()> {
    qmp.cmd("migrate-set-capabilities", json!({ "capabilities": [{ "capability": "rdma-pin-all", "state": true }] }))
        .map(drop)
}

/// A QEMU → QEMU migration of a paused guest with `content` over RDMA.
struct QemuRun {
    secs: f64,
    memory: Memory,
    /// Whether the destination's pc.ram came out byte-identical.
    verified: R<()>,
}

fn qemu_migrate(dir: &Path, content: &Content, pin_all: bool, port: u16) -> R<QemuRun> {
    let (src_file, dst_file) = (dir.join("qemu-src.ram"), dir.join("qemu-dst.ram"));
    let result = (|| {
        write_file(&src_file, content)?;
        File::create(&dst_file).map_err(|e| e.to_string())?;
        let uri = format!("rdma:{}:{port}", ip());
        let mut dst = Qemu::start(dir, "dst", &dst_file, content.len, true)?;
        let mut src = Qemu::start(dir, "src", &src_file, content.len, false)?;
        if pin_all {
            set_pin_all(&mut dst.qmp)?;
            set_pin_all(&mut src.qmp)?;
        }
        dst.qmp.cmd("migrate-incoming", json!({ "uri": uri }))?;
        // QEMU's default max-bandwidth is 32 MiB/s.
        src.qmp.cmd("migrate-set-parameters", json!({ "max-bandwidth": 1u64 << 40 }))?;
        let pid = src.child.id().to_string();
        let (file_before, rss_before) = (allocated(&src_file), vm_rss(&pid));
        src.qmp.cmd("migrate", json!({ "uri": uri }))?;
        let info = src.wait_completed()?;
        dst.wait_completed()?;
        let memory = Memory { file_before, file_after: allocated(&src_file), rss_before, rss_after: vm_rss(&pid) };
        let ms = info["total-time"].as_u64().ok_or_else(|| format!("no total-time: {info}"))?;
        drop((src, dst));
        Ok(QemuRun { secs: ms as f64 / 1e3, memory, verified: compare_files(&src_file, &dst_file) })
    })();
    let _ = fs::remove_file(&src_file);
    let _ = fs::remove_file(&dst_file);
    result
}

// ---------------------------------------------------------------------------
// 3-5. rdmamig ↔ rdmamig, the destination in a child process.

/// The destination process: this program with `--dest`; reports `PORT n`,
/// then `RESULT ...` on its stdout. Killed and reaped on drop.
struct DestProcess {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl DestProcess {
    fn spawn(
        content: &Content,
        extensions: bool,
        pin_all: bool,
        prealloc: bool,
        file: Option<&Path>,
    ) -> R<(DestProcess, u16)> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let flag = |b: bool| if b { "1" } else { "0" };
        let mut child = Command::new(exe)
            .arg("--dest")
            .args([content.len.to_string(), flag(content.sparse).into(), content.final_pages.to_string()])
            .args([flag(extensions), flag(pin_all), flag(prealloc)])
            .arg(file.map_or_else(|| "-".into(), |f| f.display().to_string()))
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("the destination process: {e}"))?;
        let lines = BufReader::new(child.stdout.take().expect("piped"));
        let mut dest = DestProcess { child, lines };
        let line = dest.line()?;
        let port = line.strip_prefix("PORT ").and_then(|p| p.parse().ok()).ok_or(format!("destination: {line}"))?;
        Ok((dest, port))
    }

    fn line(&mut self) -> R<String> {
        let mut line = String::new();
        match self.lines.read_line(&mut line) {
            Ok(n) if n > 0 => Ok(line.trim_end().to_owned()),
            _ => Err(format!("the destination process exited ({:?}) without a report", self.child.wait())),
        }
    }

    /// Its verdict: Ok once it found its RAM as the content says.
    fn result(mut self) -> R<()> {
        let line = self.line()?;
        let status = self.child.wait().map_err(|e| e.to_string())?;
        match line.strip_prefix("RESULT ") {
            Some("ok") if status.success() => Ok(()),
            _ => Err(format!("destination: {line} ({status})")),
        }
    }
}

impl Drop for DestProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The destination process's main: receives, then checks its RAM.
fn destination(args: &[String]) -> i32 {
    let [len, sparse, final_pages, extensions, pin_all, prealloc, file] = args else {
        eprintln!("bench --dest: bad arguments {args:?}");
        return 2;
    };
    let num = |s: &String| s.parse::<u64>().unwrap_or(0);
    let content = Content { len: num(len), sparse: sparse == "1", final_pages: num(final_pages) };
    let config = Config { extensions: extensions == "1", pin_all: pin_all == "1", ..Config::default() };
    let file = (file != "-").then(|| PathBuf::from(file));
    let verdict = receive(&content, &config, prealloc == "1", file.as_deref());
    println!("RESULT {}", verdict.as_ref().map_or_else(|e| format!("FAILED: {e}"), |()| "ok".into()));
    i32::from(verdict.is_err())
}

/// `prealloc`: the RAM is populated before listening (as QEMU's
/// `-mem-prealloc` does), so that no registration allocates it.
fn receive(content: &Content, config: &Config, prealloc: bool, file: Option<&Path>) -> R<()> {
    let (ram, registry) = match file {
        // A fresh tmpfs file: all holes.
        Some(path) => {
            let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path);
            let f = f.map_err(|e| format!("{}: {e}", path.display()))?;
            f.set_len(content.len).map_err(|e| e.to_string())?;
            let ram = Ram::shared(&f, content.len)?;
            let registry = sparse_registry(&ram, &f)?;
            (ram, registry)
        }
        None => {
            let mut ram = Ram::anonymous(content.len)?;
            if prealloc {
                let mem = ram.bytes_mut();
                // SAFETY: populating changes neither the contents nor the mapping.
                unsafe { libc::madvise(mem.as_mut_ptr().cast(), mem.len(), libc::MADV_POPULATE_WRITE) };
            }
            let registry = ram.registry();
            (ram, registry)
        }
    };
    let listener = Listener::bind(&ip(), 0, config).map_err(|e| e.to_string())?;
    println!("PORT {}", listener.port());
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let dest = Destination::accept(&listener, &registry, Some(Duration::from_secs(120)));
    let dest = dest.map_err(|e| format!("accept: {e}"))?;
    let ending = dest.wait_end(Some(WAIT)).map_err(|e| format!("wait_end: {e}"));
    dest.close();
    drop(dest);
    let want = if config.extensions { Ending::Completed } else { Ending::Unverified };
    match ending? {
        e if e == want => {}
        e => return Err(format!("the migration ended {e:?}")),
    }
    match file {
        // Read through the file: holes stay holes.
        Some(path) => check_file(path, content),
        None => check(content, 0, ram.bytes()),
    }
}

/// Turns a library error into this program's, saying what failed.
fn e(what: &'static str) -> impl Fn(rdmamig::Error) -> String {
    move |err| format!("{what}: {err}")
}

/// What an rdmamig migration measured on the source.
struct RdmaRun {
    secs: f64,
    round_trips: u64,
    bytes_written: u64,
    /// Bytes written through the staging buffer (chunks not pinned).
    staged_bytes: u64,
    cpu_process: f64,
    cpu_engine: f64,
    /// The final round's window (when asked for).
    final_secs: Option<f64>,
    memory: Memory,
    /// Whether the migration completed and the destination found its RAM as sent.
    verified: R<()>,
}

/// One migration of a guest with `content` to a destination process. The
/// source's RAM: anonymous memory (dense), or `dir`'s tmpfs file mapped
/// shared (sparse). With `content.final_pages`, a second, timed window
/// sends the changed pages. `prealloc`: the destination populates its RAM
/// before it listens.
fn rdmamig_migrate(dir: &Path, content: &Content, extensions: bool, pin_all: bool, prealloc: bool) -> R<RdmaRun> {
    let (src_file, dst_file) = (dir.join("rdmamig-src.ram"), dir.join("rdmamig-dst.ram"));
    let result = (|| {
        let (mut ram, registry, file) = if content.sparse {
            let file = write_file(&src_file, content)?;
            let ram = Ram::shared(&file, content.len)?;
            let registry = sparse_registry(&ram, &file)?;
            (ram, registry, Some(file))
        } else {
            let mut ram = Ram::anonymous(content.len)?;
            fill(ram.bytes_mut(), content);
            let registry = ram.registry();
            (ram, registry, None)
        };
        let dst = file.as_ref().map(|_| dst_file.as_path());
        let (dest, port) = DestProcess::spawn(content, extensions, pin_all, prealloc, dst)?;
        let config = Config { extensions, pin_all, ..Config::default() };

        let rss_before = vm_rss("self");
        let file_before = allocated(&src_file);
        let cpu_before = process_cpu();
        let start = Instant::now();
        let source = Source::connect(&ip(), port, &config, &registry).map_err(e("connect"))?;
        let connected = start.elapsed().as_secs_f64();
        source.iteration_begin().map_err(e("iteration_begin"))?;
        for page in 0..content.pages() {
            source.save(0, page * PAGE, PAGE).map_err(e("save"))?;
        }
        source.iteration_end().map_err(e("iteration_end"))?;
        let window = start.elapsed().as_secs_f64() - connected;
        let final_secs = if content.final_pages > 0 {
            let mem = ram.bytes_mut();
            let finals: Vec<u64> = (0..content.final_pages).map(|slot| content.final_page(slot)).collect();
            for &page in &finals {
                fill_page(&mut mem[(page * PAGE) as usize..][..PAGE as usize], FINAL_SEED, page);
            }
            let t = Instant::now();
            source.iteration_begin().map_err(e("iteration_begin"))?;
            for &page in &finals {
                source.save(0, page * PAGE, PAGE).map_err(e("save"))?;
            }
            source.iteration_end().map_err(e("iteration_end"))?;
            Some(t.elapsed().as_secs_f64())
        } else {
            None
        };
        let cpu_engine = thread_cpu("rdmamig-source");
        let stats = source.stats();
        let closing = start.elapsed().as_secs_f64();
        let ending = source.close().map_err(e("close"))?;
        let secs = start.elapsed().as_secs_f64();
        // Where the time went (stderr only: no target is about the phases).
        progress(&format!("  connect {connected:.3} s, first window {window:.3} s, close {:.3} s", secs - closing));
        let cpu_process = process_cpu() - cpu_before;
        let memory = Memory { file_before, file_after: allocated(&src_file), rss_before, rss_after: vm_rss("self") };
        drop(registry);
        drop(ram);
        let want = if extensions { Ending::Completed } else { Ending::Unverified };
        let verified =
            if ending == want { dest.result() } else { Err(format!("the source's migration ended {ending:?}")) };
        Ok(RdmaRun {
            secs,
            round_trips: stats.registration_round_trips,
            bytes_written: stats.bytes_written,
            staged_bytes: stats.staged_bytes,
            cpu_process,
            cpu_engine,
            final_secs,
            memory,
            verified,
        })
    })();
    let _ = fs::remove_file(&src_file);
    let _ = fs::remove_file(&dst_file);
    result
}

// ---------------------------------------------------------------------------
// 6. The table.

/// One row: a figure, its unit, its ratios, the issue's target, and whether
/// the run behind it came out byte-identical (`Err`: why not).
struct Row {
    what: String,
    value: Option<f64>,
    unit: &'static str,
    /// Rate ÷ ib_write_bw at 1 MiB.
    vs_1m: Option<f64>,
    /// Rate ÷ ib_write_bw at 4 KiB.
    vs_4k: Option<f64>,
    /// Time ÷ QEMU → QEMU's in the same mode.
    vs_qemu: Option<f64>,
    target: &'static str,
    /// Whether the figure meets the target (`None`: no target, or no figure).
    met: Option<bool>,
    check: R<()>,
    /// What the check column says when `check` is Ok and the row verified
    /// no data ("ok" for an anchor, "-" for a derived figure).
    unverified: Option<&'static str>,
}

impl Row {
    fn new(what: impl Into<String>, value: Option<f64>, unit: &'static str, check: &R<()>) -> Row {
        let check = check.as_ref().map(|_| ()).map_err(Clone::clone);
        Row {
            what: what.into(),
            value,
            unit,
            vs_1m: None,
            vs_4k: None,
            vs_qemu: None,
            target: "",
            met: None,
            check,
            unverified: None,
        }
    }

    /// A row with no migrated data to verify: `label` when it went well.
    fn unverified(mut self, label: &'static str) -> Row {
        self.unverified = Some(label);
        self
    }

    /// The issue's target for this row, and whether `figure` meets it.
    fn target(mut self, target: &'static str, figure: Option<f64>, meets: impl Fn(f64) -> bool) -> Row {
        self.target = target;
        self.met = figure.map(meets);
        self
    }
}

/// A row's check: the run failed (no figures), or it ran and was `verified` or not.
fn outcome<T>(run: &R<T>, verified: impl Fn(&T) -> &R<()>) -> R<()> {
    run.as_ref().map_err(Clone::clone).and_then(|t| verified(t).clone())
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 * 8.0 / secs / 1e9
}

fn print_table(title: &str, rows: &[Row]) {
    let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    println!("\n{title}");
    println!(
        "{:<58} {:>9} {:<6} {:>6} {:>6} {:>6}  {:<16} {:<4} check",
        "measurement", "value", "unit", "÷ib1M", "÷ib4K", "÷QEMU", "target", "met"
    );
    println!("{}", "-".repeat(130));
    for r in rows {
        let check = match &r.check {
            Ok(()) => r.unverified.unwrap_or("verified").into(),
            Err(e) => format!("FAILED: {}", e.lines().next().unwrap_or("")),
        };
        println!(
            "{:<58} {:>9} {:<6} {:>6} {:>6} {:>6}  {:<16} {:<4} {check}",
            r.what,
            r.value.map_or_else(|| "-".into(), |v| format!("{v:.3}")),
            r.unit,
            f(r.vs_1m),
            f(r.vs_4k),
            f(r.vs_qemu),
            r.target,
            r.met.map_or("-", |m| if m { "yes" } else { "NO" }),
        );
    }
    println!("÷ib1M, ÷ib4K: rate ÷ ib_write_bw's (1 MiB, 4 KiB messages); ÷QEMU: time ÷ QEMU → QEMU's, same mode.");
}

// ---------------------------------------------------------------------------
// The measurements, in order, and main.

struct Args {
    size_mib: u64,
    sparse_mib: u64,
    pages: u64,
    skip_qemu: bool,
    quick: bool,
}

fn usage() -> ! {
    eprintln!("usage: bench [--size MiB] [--sparse-size MiB] [--pages N] [--skip-qemu] [--quick]");
    std::process::exit(2)
}

fn parse_args(args: &[String]) -> Args {
    let mut a = Args { size_mib: 256, sparse_mib: 1024, pages: 8192, skip_qemu: false, quick: false };
    let (mut size, mut sparse, mut pages) = (None, None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut number = || it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or_else(|| usage());
        match arg.as_str() {
            "--size" => size = Some(number()),
            "--sparse-size" => sparse = Some(number()),
            "--pages" => pages = Some(number()),
            "--skip-qemu" => a.skip_qemu = true,
            "--quick" => a.quick = true,
            _ => usage(),
        }
    }
    if a.quick {
        (a.size_mib, a.sparse_mib, a.pages) = (32, 64, 1024);
    }
    a.size_mib = size.unwrap_or(a.size_mib);
    a.sparse_mib = sparse.unwrap_or(a.sparse_mib);
    a.pages = pages.unwrap_or(a.pages);
    // The final round's pages: at least two pages per slot (never adjacent).
    if a.size_mib == 0 || a.sparse_mib == 0 || a.pages == 0 || a.pages > a.size_mib * MIB / PAGE / 2 {
        usage();
    }
    a
}

const MODES: [(bool, bool); 4] = [(true, false), (true, true), (false, false), (false, true)];

fn mode_name(extensions: bool, pin_all: bool) -> String {
    format!("ext={} {}", if extensions { "on" } else { "off" }, if pin_all { "pin-all" } else { "dynamic" })
}

fn registration(pin_all: bool) -> &'static str {
    if pin_all {
        "pin-all"
    } else {
        "dynamic"
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("--dest") {
        std::process::exit(destination(&argv[1..]));
    }
    let args = parse_args(&argv);
    let dir = PathBuf::from(format!("/dev/shm/rdmamig-bench-{}", std::process::id()));
    if let Err(e) = fs::create_dir_all(&dir) {
        eprintln!("bench: {}: {e}", dir.display());
        std::process::exit(1);
    }
    let rows = run(&args, &dir);
    let _ = fs::remove_dir_all(&dir);
    let title = format!(
        "bench: dense guest {} MiB (one save per 4 KiB page, one window); sparse guest {} MiB, {} MiB written; \
         final round {} pages; times: QEMU total-time, rdmamig connect → close",
        args.size_mib,
        args.sparse_mib,
        Content::sparse(args.sparse_mib * MIB).written_bytes() / MIB,
        args.pages
    );
    print_table(&title, &rows);
    // A failed anchor leaves ratios out but verifies nothing: it does not
    // change the exit status.
    let failed: Vec<&Row> = rows.iter().filter(|r| r.check.is_err() && r.unverified.is_none()).collect();
    // Each failure in full, once (the rows of one run share it).
    let mut reasons: Vec<&String> = rows.iter().filter_map(|r| r.check.as_ref().err()).collect();
    reasons.dedup();
    for reason in reasons {
        println!("FAILED: {reason}");
    }
    let anchors_failed = rows.iter().filter(|r| r.check.is_err() && r.unverified.is_some()).count();
    println!("bench: {} rows, {} failed, {anchors_failed} anchors failed", rows.len(), failed.len());
    std::process::exit(i32::from(!failed.is_empty()));
}

fn progress(what: &str) {
    eprintln!("bench: {what}");
}

fn run(args: &Args, dir: &Path) -> Vec<Row> {
    let (touched, took) = common::warm_up();
    progress(&format!(
        "warmed up: {} MiB of guest memory touched, RDMA devices discovered ({:.1} s)",
        touched / MIB,
        took.as_secs_f64()
    ));
    let mut rows = Vec::new();
    let dense = Content::dense(args.size_mib * MIB);
    let sparse = Content::sparse(args.sparse_mib * MIB);
    let anchor_secs = if args.quick { 2 } else { 5 };
    let mut port = 20000 + (std::process::id() % 20000) as u16;
    let mut next_port = || {
        port += 1;
        port
    };

    // 1. Anchors.
    progress("ib_write_bw anchors");
    // Twice each, interleaved, the better kept (`perftest::better`).
    let (a1m, a4k) = (anchor(MIB, anchor_secs), anchor(PAGE, anchor_secs));
    let a1m = better(a1m, anchor(MIB, anchor_secs));
    let a4k = better(a4k, anchor(PAGE, anchor_secs));
    for (what, a) in [("ib_write_bw -s 1048576 -t 16", &a1m), ("ib_write_bw -s 4096 -t 16", &a4k)] {
        rows.push(Row::new(what, a.as_ref().ok().copied(), "Gbit/s", &a.clone().map(drop)).unverified("ok"));
    }
    let (a1m, a4k) = (a1m.ok(), a4k.ok());
    // What every destination pays and ib_write_bw (whose buffer is ready
    // before its clock starts) does not: the kernel allocating and zeroing
    // fresh guest RAM as it is registered.
    let populate = common::populate_fresh(args.size_mib * MIB).as_secs_f64();
    rows.push(
        Row::new(format!("populate {} MiB of fresh memory", args.size_mib), Some(populate), "s", &Ok(()))
            .unverified("-"),
    );
    let vs = |anchor: Option<f64>, rate: f64| anchor.map(|a| rate / a);

    // 2. QEMU → QEMU, dense.
    let mut qemu_dense = [None, None];
    for pin_all in [false, true] {
        if args.skip_qemu || (args.quick && pin_all) {
            continue;
        }
        progress(&format!("QEMU → QEMU, {} MiB dense, {}", args.size_mib, registration(pin_all)));
        let r = qemu_migrate(dir, &dense, pin_all, next_port());
        let check = outcome(&r, |r| &r.verified);
        let secs = r.as_ref().ok().map(|r| r.secs);
        let what = format!("QEMU→QEMU dense {}", registration(pin_all));
        let mut row = Row::new(format!("{what}: rate"), secs.map(|s| gbps(dense.len, s)), "Gbit/s", &check);
        row.vs_1m = secs.and_then(|s| vs(a1m, gbps(dense.len, s)));
        rows.push(row);
        rows.push(Row::new(format!("{what}: time"), secs, "s", &check));
        qemu_dense[usize::from(pin_all)] = secs;
    }

    // 3. rdmamig ↔ rdmamig, dense, four modes.
    for (extensions, pin_all) in MODES {
        let mode = mode_name(extensions, pin_all);
        progress(&format!("rdmamig ↔ rdmamig, {} MiB dense, {mode}", args.size_mib));
        let r = rdmamig_migrate(dir, &dense, extensions, pin_all, false);
        let check = outcome(&r, |r| &r.verified);
        let r = r.ok();
        let gib = dense.len as f64 / GIB;
        let secs = r.as_ref().map(|r| r.secs);
        let what = format!("rdmamig dense {mode}");
        let vs_1m = secs.and_then(|s| vs(a1m, gbps(dense.len, s)));
        let mut rate = Row::new(format!("{what}: rate"), secs.map(|s| gbps(dense.len, s)), "Gbit/s", &check).target(
            "÷ib1M ≥ 0.95",
            vs_1m,
            |v| v >= 0.95,
        );
        rate.vs_1m = vs_1m;
        rows.push(rate);
        let vs_qemu = secs.zip(qemu_dense[usize::from(pin_all)]).map(|(s, q)| s / q);
        let mut time =
            Row::new(format!("{what}: time"), secs, "s", &check).target("÷QEMU ≤ 0.65", vs_qemu, |v| v <= 0.65);
        time.vs_qemu = vs_qemu;
        rows.push(time);
        let per_gib = |v: f64| v / gib;
        let trips = r.as_ref().map(|r| per_gib(r.round_trips as f64));
        let mut trips_row = Row::new(format!("{what}: registration round trips"), trips, "/GiB", &check);
        // The target is between rdmamig peers (extensions on).
        if extensions {
            trips_row = trips_row.target("≤ 8 /GiB", trips, |v| v <= 8.0);
        }
        rows.push(trips_row);
        rows.push(Row::new(
            format!("{what}: source CPU (process)"),
            r.as_ref().map(|r| per_gib(r.cpu_process)),
            "s/GiB",
            &check,
        ));
        rows.push(Row::new(
            format!("{what}: source CPU (engine thread)"),
            r.as_ref().map(|r| per_gib(r.cpu_engine)),
            "s/GiB",
            &check,
        ));
    }

    // For reference, no target: the same with the destination's RAM
    // populated before it listens (as with QEMU's -mem-prealloc), which
    // takes the kernel's zeroing of fresh memory out of the time.
    for pin_all in [false, true] {
        let mode = mode_name(true, pin_all);
        progress(&format!("rdmamig ↔ rdmamig, {} MiB dense, {mode}, destination RAM preallocated", args.size_mib));
        let r = rdmamig_migrate(dir, &dense, true, pin_all, true);
        let check = outcome(&r, |r| &r.verified);
        let rate = r.ok().map(|r| gbps(dense.len, r.secs));
        let mut row = Row::new(format!("rdmamig dense {mode}, destination preallocated: rate"), rate, "Gbit/s", &check);
        row.vs_1m = rate.and_then(|r| vs(a1m, r));
        rows.push(row);
    }

    // 5. Final round (after the dense ones: the same guest, one more window).
    progress(&format!("rdmamig final round, {} MiB then {} scattered pages", args.size_mib, args.pages));
    let content = Content { final_pages: args.pages, ..dense };
    let r = rdmamig_migrate(dir, &content, true, false, false);
    let check = outcome(&r, |r| &r.verified);
    let secs = r.ok().and_then(|r| r.final_secs);
    let bytes = args.pages * PAGE;
    let what = "rdmamig final round ext=on dynamic";
    let vs_4k = secs.and_then(|s| vs(a4k, gbps(bytes, s)));
    let mut rate = Row::new(format!("{what}: rate"), secs.map(|s| gbps(bytes, s)), "Gbit/s", &check).target(
        "÷ib4K ≥ 0.9",
        vs_4k,
        |v| v >= 0.9,
    );
    rate.vs_1m = secs.and_then(|s| vs(a1m, gbps(bytes, s)));
    rate.vs_4k = vs_4k;
    rows.push(rate);
    rows.push(Row::new(format!("{what}: time"), secs.map(|s| s * 1e3), "ms", &check));

    // 4. Sparse guest.
    let written = sparse.written_bytes();
    // The target is rdmamig's (`targeted`); QEMU's figures are for comparison.
    let memory_rows = |rows: &mut Vec<Row>, what: &str, m: Option<Memory>, check: &R<()>, targeted: bool| {
        let mib = |v: u64| v as f64 / MIB as f64;
        let grown = |a: u64, b: u64| mib(b.saturating_sub(a));
        rows.push(Row::new(format!("{what}: file allocated before"), m.map(|m| mib(m.file_before)), "MiB", check));
        let bound = mib(written) * 1.05;
        let target = |row: Row, figure: Option<f64>| {
            if targeted {
                row.target("≤ written + 5 %", figure, |v| v <= bound)
            } else {
                row
            }
        };
        let after = m.map(|m| mib(m.file_after));
        rows.push(target(Row::new(format!("{what}: file allocated after"), after, "MiB", check), after));
        let growth = m.map(|m| grown(m.rss_before, m.rss_after));
        rows.push(target(Row::new(format!("{what}: VmRSS growth"), growth, "MiB", check), growth));
    };
    rows.push(
        Row::new("sparse: written (64 KiB runs)", Some(written as f64 / MIB as f64), "MiB", &Ok(())).unverified("-"),
    );
    let mut qemu_sparse = [None, None];
    for pin_all in [false, true] {
        if args.skip_qemu || (args.quick && pin_all) {
            continue;
        }
        progress(&format!("QEMU → QEMU, {} MiB sparse, {}", args.sparse_mib, registration(pin_all)));
        let r = qemu_migrate(dir, &sparse, pin_all, next_port());
        let check = outcome(&r, |r| &r.verified);
        let what = format!("QEMU→QEMU sparse {}", registration(pin_all));
        let secs = r.as_ref().ok().map(|r| r.secs);
        rows.push(Row::new(format!("{what}: time"), secs, "s", &check));
        memory_rows(&mut rows, &what, r.ok().map(|r| r.memory), &check, false);
        qemu_sparse[usize::from(pin_all)] = secs;
    }
    for extensions in [true, false] {
        let mode = mode_name(extensions, false);
        progress(&format!("rdmamig ↔ rdmamig, {} MiB sparse, {mode}", args.sparse_mib));
        let r = rdmamig_migrate(dir, &sparse, extensions, false, false);
        let check = outcome(&r, |r| &r.verified);
        let r = r.ok();
        let what = format!("rdmamig sparse {mode}");
        let secs = r.as_ref().map(|r| r.secs);
        let vs_qemu = secs.zip(qemu_sparse[0]).map(|(s, q)| s / q);
        let mut time =
            Row::new(format!("{what}: time"), secs, "s", &check).target("÷QEMU ≤ 0.35", vs_qemu, |v| v <= 0.35);
        time.vs_qemu = vs_qemu;
        rows.push(time);
        rows.push(Row::new(
            format!("{what}: bytes written"),
            r.as_ref().map(|r| r.bytes_written as f64 / MIB as f64),
            "MiB",
            &check,
        ));
        rows.push(Row::new(
            format!("{what}: of which staged (unpinned)"),
            r.as_ref().map(|r| r.staged_bytes as f64 / MIB as f64),
            "MiB",
            &check,
        ));
        memory_rows(&mut rows, &what, r.map(|r| r.memory), &check, true);
    }
    rows
}
