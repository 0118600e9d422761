//! The soak (scripts/soak.sh; CI's `soak:50` step in scripts/rdma-suite.sh):
//! migration after migration through ONE listener of ONE destination
//! process, checking that every completed one arrives byte-identical and
//! that nothing accumulates from one to the next.
//!
//! This process is the destination: it binds one `Listener` and accepts
//! every migration on it, into one 16 MiB guest RAM that it reuses. The
//! sources are other processes, this program re-executed with `--source`:
//! one long-lived source process for most runs (one `run N PORT` command
//! per migration on its stdin), and a fresh one for each run whose source
//! is killed.
//!
//! Run N (from 1):
//! - its mode: extensions on/off (off: QEMU's wire protocol, ending
//!   unverified) × dynamic registration/pin-all, in turn;
//! - every tenth run (N mod 10 = 5) has a faulted peer, in turn: the source
//!   process SIGKILLed, the source's `abort` inside its second window, the
//!   destination's `abort`; the kill and the destination's abort come once
//!   the first window is in, while the source keeps sending windows. The
//!   destination must end with the connection's failure, the long-lived
//!   source's calls must fail (`Aborted` after its own abort);
//! - every other run: stream bytes, a full window, a window of re-dirtied
//!   pages (some now zero), more stream bytes, close. Both sides must end
//!   `Completed` (extensions on) or `Unverified` (off), and the
//!   destination's RAM and stream must be byte-identical to what the source
//!   had. Every page and stream byte follows from a seed of N, so a page
//!   left over from an earlier run is caught.
//!
//! After every run, on both sides (but a killed source), the connection's
//! own pinned-bytes gauge (`Stats::pinned_bytes`) must be 0 once its
//! deregistrations are done.
//!
//! Figures at checkpoints (runs 10, 20, 50, 100, 200, 500, 1000, ... and
//! the last run), taken with both processes idle between migrations: open
//! file descriptors (/proc/self/fd), threads (/proc/self/task), VmRSS and
//! VmPin (/proc/self/status) and the bytes allocated on the heap
//! (`mallinfo2`, glibc's per-thread caches off: `TCACHE_OFF`) of this
//! process and of the long-lived source, and the RDMA objects of the whole
//! host (`rdma resource show`: this program's, when nothing else uses
//! RDMA). Flat: every figure at every checkpoint equal to its run-10 value,
//! but VmRSS, which may exceed it by `RSS_SLACK_KIB`, and the heap, which
//! may differ from it by `HEAP_SLACK` (see there).
//!
//! Prints a line per run and the table of checkpoints. Exit status 0 when
//! every run went as planned and every figure stayed flat, 1 otherwise (the
//! soak stops at the first run that did not).
//!
//! ```text
//! cargo build --release --features rdma-tests --example soak
//! soak [--runs N]    (default 1000, at least 11)
//! ```
//!
//! Needs an RDMA device at `RXE_VM_IP` (default 198.18.0.1), root (or a
//! large `ulimit -l`) and the `rdma` tool (iproute2).

use std::fs;
use std::io::{ErrorKind as IoErrorKind, Read as _, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, Ending, Listener, RamBlocks, Read, Source};

#[path = "common/mod.rs"]
mod common;
use common::perftest::ip;
use common::{mix, Ram};

type R<T> = Result<T, String>;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// Each migration's guest RAM.
const RAM: u64 = 16 * MIB;
const PAGES: u64 = RAM / PAGE;
/// A registration chunk (1 MiB): one whole chunk of every run's RAM is
/// zero, so that whole zero chunks travel as COMPRESS.
const CHUNK_PAGES: u64 = MIB / PAGE;
const SOAK_SEED: u64 = 0x50a6_0000_0000_0031;
/// The run whose figures every later checkpoint is compared with: what the
/// first runs set up for good (librdmacm's devices, the allocator's arenas,
/// cached thread stacks) is in place by then; each mode has run twice and
/// a source was killed (run 5).
const BASELINE: u64 = 10;
/// How far VmRSS may rise above its run-10 value (it is read after
/// `malloc_trim`, see `Figures::of_this_process`). Two things raise it
/// without a leak: the allocator's pages, more of them partly used as runs
/// go by (levelling off); and a new thread stack (glibc keeps freed ones for
/// reuse) that the kernel backs with a transparent huge page, 2 MiB at its
/// first touch (what each was seen to add: docs/testing.md, Soak). What a
/// leak allocates shows in the heap figure, to within `HEAP_SLACK`.
const RSS_SLACK_KIB: u64 = 4096;
/// How far the heap in use may move from its run-10 value: with the
/// allocator's per-thread caches off (`TCACHE_OFF`), what is allocated
/// between migrations is the same from run to run but for the size class
/// of an allocation here and there; a leak of a few bytes per run shows
/// over 1,000 runs.
const HEAP_SLACK: u64 = 1024;
/// glibc's per-thread caches keep up to 7 freed chunks of each size for the
/// thread that freed them, and these count as in use: off, so that the
/// heap figure counts what is really allocated. A tunable, read when the
/// process starts: this program re-executes itself once with it set, and
/// the source processes inherit it.
const TCACHE_OFF: &str = "glibc.malloc.tcache_count=0";
/// Guards against hangs only: a migration takes seconds under TCG.
const ACCEPT_WAIT: Duration = Duration::from_secs(60);
const END_WAIT: Duration = Duration::from_secs(120);
const REPLY_WAIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// What run N does and sends.

/// The peer failure a run has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The source process SIGKILLed once the first window is in.
    Kill,
    /// The source's `abort` inside its second window.
    SourceAbort,
    /// The destination's `abort` once the first window is in.
    DestinationAbort,
}

#[derive(Clone, Copy, Debug)]
struct Plan {
    extensions: bool,
    pin_all: bool,
    fault: Option<Fault>,
}

impl Plan {
    /// Run N's plan: modes in turn, and every tenth run (N mod 10 = 5) a
    /// fault, in turn; the faulted runs take the four modes in turn too.
    fn of(run: u64) -> Plan {
        let (mode, fault) = if run % 10 == 5 {
            let k = run / 10;
            (k % 4, Some([Fault::Kill, Fault::SourceAbort, Fault::DestinationAbort][(k % 3) as usize]))
        } else {
            (run % 4, None)
        };
        Plan { extensions: mode < 2, pin_all: mode % 2 == 1, fault }
    }

    fn config(&self) -> Config {
        Config { extensions: self.extensions, pin_all: self.pin_all, ..Config::default() }
    }

    /// How a migration without a fault ends, on both sides.
    fn ending(&self) -> Ending {
        if self.extensions {
            Ending::Completed
        } else {
            Ending::Unverified
        }
    }

    fn describe(&self) -> String {
        let mode = format!(
            "ext={} {}",
            if self.extensions { "on" } else { "off" },
            if self.pin_all { "pin-all" } else { "dynamic" }
        );
        match self.fault {
            None => mode,
            Some(f) => format!("{mode} {f:?}"),
        }
    }
}

/// Run N's guest content and stream: every page's bytes follow from the
/// run's seed and the page number.
struct Content {
    run: u64,
    seed: u64,
}

impl Content {
    fn of(run: u64) -> Content {
        Content { run, seed: mix(SOAK_SEED ^ run) }
    }

    /// The page's seed for the first window (`None`: zero): one page in
    /// sixteen, and one whole chunk, are zero.
    fn first(&self, page: u64) -> Option<u64> {
        let zero_chunk = self.seed % (PAGES / CHUNK_PAGES);
        (page / CHUNK_PAGES != zero_chunk && mix(self.seed ^ page) % 16 != 0).then_some(self.seed)
    }

    /// Whether the page is re-dirtied before the second window (one in
    /// eight), and its new seed (`None`: zero, one in four of them).
    fn second(&self, page: u64) -> Option<Option<u64>> {
        let h = mix(!self.seed ^ page);
        (h % 8 == 0).then_some((h % 32 != 0).then_some(!self.seed))
    }

    /// The page's seed at the end of the migration.
    fn last(&self, page: u64) -> Option<u64> {
        self.second(page).unwrap_or_else(|| self.first(page))
    }

    /// Writes the first window's content into `mem`.
    fn write_first(&self, mem: &mut [u8]) {
        for (page, out) in mem.chunks_exact_mut(PAGE as usize).enumerate() {
            fill_page(out, self.first(page as u64), page as u64);
        }
    }

    /// Re-dirties the second window's pages in `mem`; returns them.
    fn write_second(&self, mem: &mut [u8]) -> Vec<u64> {
        let mut dirtied = Vec::new();
        for (page, out) in mem.chunks_exact_mut(PAGE as usize).enumerate() {
            if let Some(seed) = self.second(page as u64) {
                fill_page(out, seed, page as u64);
                dirtied.push(page as u64);
            }
        }
        dirtied
    }

    /// Checks the destination's RAM against the content at the end.
    fn check(&self, mem: &[u8]) -> R<()> {
        let mut want = vec![0u8; PAGE as usize];
        for (page, got) in mem.chunks_exact(PAGE as usize).enumerate() {
            fill_page(&mut want, self.last(page as u64), page as u64);
            if got != want {
                let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!("the destination's RAM differs at byte {:#x}", page * PAGE as usize + at));
            }
        }
        Ok(())
    }

    /// Stream part `part` (0: before the first window, 1: before close):
    /// a header naming the run, then 1-8 KiB of bytes of its own.
    fn stream(&self, part: u64) -> Vec<u8> {
        let mut bytes = format!("soak run {} part {part}\n", self.run).into_bytes();
        let mut x = mix(self.seed ^ part);
        let len = 1024 + x % (7 * 1024);
        bytes.extend((0..len).map(|_| {
            x = mix(x);
            x as u8
        }));
        bytes
    }
}

/// A page's bytes under `seed`: random, never all zero; zero for `None`.
fn fill_page(out: &mut [u8], seed: Option<u64>, page: u64) {
    let Some(seed) = seed else {
        out.fill(0);
        return;
    };
    let mut x = mix(seed ^ page.wrapping_mul(0xd6e8_feb8_6659_fd93)) | 1;
    for word in out.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&x.to_le_bytes());
    }
}

// ---------------------------------------------------------------------------
// The figures.

/// One process's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Figures {
    fds: u64,
    threads: u64,
    rss_kib: u64,
    pinned_kib: u64,
    /// Bytes the allocator has handed out and not got back (`mallinfo2`).
    heap: u64,
}

impl Figures {
    /// This process's. The heap first, before this function allocates;
    /// VmRSS after `malloc_trim`, since the allocator keeps what one
    /// migration freed for the next (10-15 MiB in the source, varying from
    /// run to run) unless asked to give it back (a leak is not given back).
    /// The listing of /proc/self/fd counts its own fd (always one).
    fn of_this_process() -> R<Figures> {
        // SAFETY: no preconditions; it returns free heap memory to the kernel.
        unsafe { libc::malloc_trim(0) };
        // SAFETY: no preconditions; it reads the allocator's counters.
        let heap = unsafe { libc::mallinfo2() };
        let heap = (heap.uordblks + heap.hblkhd) as u64;
        let entries = |dir: &str| fs::read_dir(dir).map(|d| d.count() as u64).map_err(|e| format!("{dir}: {e}"));
        let status = fs::read_to_string("/proc/self/status").map_err(|e| format!("/proc/self/status: {e}"))?;
        let kib = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .ok_or_else(|| format!("no {field} in /proc/self/status"))
        };
        Ok(Figures {
            fds: entries("/proc/self/fd")?,
            threads: settled_threads()?,
            rss_kib: kib("VmRSS:")?,
            pinned_kib: kib("VmPin:")?,
            heap,
        })
    }

    fn encode(&self) -> String {
        format!("{} {} {} {} {}", self.fds, self.threads, self.rss_kib, self.pinned_kib, self.heap)
    }

    fn decode(s: &str) -> R<Figures> {
        let v: Vec<u64> = s.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        match v[..] {
            [fds, threads, rss_kib, pinned_kib, heap] => Ok(Figures { fds, threads, rss_kib, pinned_kib, heap }),
            _ => Err(format!("bad figures {s:?}")),
        }
    }

    /// What is not flat against `base`, one line each.
    fn not_flat(&self, base: &Figures, who: &str, run: u64) -> Vec<String> {
        let mut out = Vec::new();
        for (what, now, then) in [
            ("open fds", self.fds, base.fds),
            ("threads", self.threads, base.threads),
            ("VmPin KiB", self.pinned_kib, base.pinned_kib),
        ] {
            if now != then {
                out.push(format!("{who} {what}: {now} at run {run}, {then} at run {BASELINE}"));
            }
        }
        if self.rss_kib > base.rss_kib + RSS_SLACK_KIB {
            out.push(format!(
                "{who} VmRSS: {} KiB at run {run}, {} KiB at run {BASELINE} (+{} KiB > {RSS_SLACK_KIB} KiB slack)",
                self.rss_kib,
                base.rss_kib,
                self.rss_kib - base.rss_kib
            ));
        }
        if self.heap.abs_diff(base.heap) > HEAP_SLACK {
            out.push(format!(
                "{who} heap: {} bytes in use at run {run}, {} at run {BASELINE} (more than {HEAP_SLACK} bytes apart)",
                self.heap, base.heap
            ));
        }
        out
    }
}

/// This process's threads: the fewest of ten listings 20 ms apart. A
/// thread that was joined may still be listed for a moment (`pthread_join`
/// returns once the kernel has released the thread's memory, before the
/// thread has left its group): under TCG the unregistration worker, joined
/// when its last connection closed, was. A thread that lives on is in every
/// listing.
fn settled_threads() -> R<u64> {
    let mut fewest = u64::MAX;
    for _ in 0..10 {
        let n = fs::read_dir("/proc/self/task").map_err(|e| format!("/proc/self/task: {e}"))?.count() as u64;
        fewest = fewest.min(n);
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(fewest)
}

/// The kinds of RDMA objects `rdma resource show` counts.
const RDMA_OBJECTS: [&str; 7] = ["pd", "cq", "qp", "cm_id", "mr", "ctx", "srq"];

/// The host's RDMA objects of each kind in `RDMA_OBJECTS`, summed over
/// devices (an array: the table of checkpoints allocates nothing as it grows).
fn rdma_objects() -> R<[u64; RDMA_OBJECTS.len()]> {
    let out = Command::new("rdma").args(["resource", "show"]).output().map_err(|e| format!("rdma: {e}"))?;
    if !out.status.success() {
        return Err(format!("rdma resource show: {}", String::from_utf8_lossy(&out.stderr)));
    }
    // "0: rxe0: pd 2 cq 4 qp 3 cm_id 2 mr 0 ctx 0 srq 0"
    let text = String::from_utf8_lossy(&out.stdout);
    let mut objects = [0; RDMA_OBJECTS.len()];
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().filter(|w| !w.ends_with(':')).collect();
        for pair in words.chunks_exact(2) {
            let n = pair[1].parse::<u64>().map_err(|_| format!("rdma resource show: bad line {line:?}"))?;
            if let Some(i) = RDMA_OBJECTS.iter().position(|&k| k == pair[0]) {
                objects[i] += n;
            }
        }
    }
    Ok(objects)
}

/// The figures at one checkpoint.
struct Row {
    run: u64,
    elapsed: Duration,
    destination: Figures,
    source: Figures,
    rdma: [u64; RDMA_OBJECTS.len()],
}

impl Row {
    fn measure(run: u64, started: Instant, source: &mut SourceProcess) -> R<Row> {
        Ok(Row {
            run,
            elapsed: started.elapsed(),
            destination: Figures::of_this_process()?,
            source: source.figures()?,
            rdma: rdma_objects()?,
        })
    }
}

/// The checkpoints: runs 10, 20, 50, 100, 200, 500, ... up to `runs`, and `runs`.
fn checkpoints(runs: u64) -> Vec<u64> {
    let mut at: Vec<u64> = (0..)
        .map(|e| BASELINE * 10u64.pow(e))
        .take_while(|&d| d <= runs)
        .flat_map(|d| [d, 2 * d, 5 * d])
        .filter(|&run| run < runs)
        .collect();
    at.push(runs);
    at
}

fn print_table(rows: &[Row]) {
    println!(
        "\nsoak: figures at checkpoints, both processes idle between migrations (destination: the \
         listener's process; source: the long-lived source process; heap: bytes allocated; rdma: the \
         host's RDMA objects: {})",
        RDMA_OBJECTS.join(" ")
    );
    let side = ["fds", "threads", "VmRSS KiB", "VmPin KiB", "heap B"];
    println!(
        "{:>6} {:>8} | dest {:>4} {:>7} {:>9} {:>9} {:>8} | src {:>4} {:>7} {:>9} {:>9} {:>8} | rdma",
        "run", "elapsed", side[0], side[1], side[2], side[3], side[4], side[0], side[1], side[2], side[3], side[4]
    );
    for r in rows {
        let rdma: Vec<String> = r.rdma.iter().map(u64::to_string).collect();
        let (d, s) = (&r.destination, &r.source);
        println!(
            "{:>6} {:>7.0}s |      {:>4} {:>7} {:>9} {:>9} {:>8} |     {:>4} {:>7} {:>9} {:>9} {:>8} | {}",
            r.run,
            r.elapsed.as_secs_f64(),
            d.fds,
            d.threads,
            d.rss_kib,
            d.pinned_kib,
            d.heap,
            s.fds,
            s.threads,
            s.rss_kib,
            s.pinned_kib,
            s.heap,
            rdma.join(" ")
        );
    }
}

/// Every figure that is not flat from run 10 on, one line each.
fn not_flat(rows: &[Row]) -> Vec<String> {
    let Some(base) = rows.iter().find(|r| r.run == BASELINE) else {
        return vec![format!("no figures at run {BASELINE}")];
    };
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.run > BASELINE) {
        out.extend(r.destination.not_flat(&base.destination, "destination", r.run));
        out.extend(r.source.not_flat(&base.source, "source", r.run));
        if r.rdma != base.rdma {
            out.push(format!("RDMA objects: {:?} at run {}, {:?} at run {BASELINE}", r.rdma, r.run, base.rdma));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The source processes.

/// A private copy of this program for the source processes, removed on
/// drop: a build may rewrite the one in target/ while the soak runs.
struct ExeCopy(PathBuf);

impl ExeCopy {
    fn new() -> R<ExeCopy> {
        let path = std::env::temp_dir().join(format!("rdmamig-soak-{}", std::process::id()));
        fs::copy("/proc/self/exe", &path).map_err(|e| format!("copying /proc/self/exe to {}: {e}", path.display()))?;
        Ok(ExeCopy(path))
    }
}

impl Drop for ExeCopy {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A source process: takes commands on its stdin, answers one line each
/// on its stdout. Killed and reaped on drop.
struct SourceProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    buffered: Vec<u8>,
}

/// A source process's report on one migration: `DONE ok ENDING PINNED` or
/// `DONE failed KIND PINNED MESSAGE`, PINNED its connection's pinned bytes
/// after close.
struct Done {
    ok: bool,
    what: String,
    pinned: u64,
    message: String,
    line: String,
}

impl SourceProcess {
    fn spawn(exe: &Path) -> R<SourceProcess> {
        let mut child = Command::new(exe)
            .arg("--source")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("a source process: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        Ok(SourceProcess { child, stdin, stdout, buffered: Vec::with_capacity(64 << 10) })
    }

    fn send(&mut self, command: &str) -> R<()> {
        let stdin = self.stdin.as_mut().expect("open until finish");
        writeln!(stdin, "{command}").map_err(|e| format!("the source process's stdin: {e}"))
    }

    /// The next line, within `REPLY_WAIT`.
    fn line(&mut self) -> R<String> {
        let deadline = Instant::now() + REPLY_WAIT;
        loop {
            if let Some(at) = self.buffered.iter().position(|&b| b == b'\n') {
                let line = String::from_utf8_lossy(&self.buffered[..at]).into_owned();
                self.buffered.drain(..=at);
                return Ok(line);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("the source process said nothing for {REPLY_WAIT:?}"));
            }
            let mut fd = libc::pollfd { fd: self.stdout.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd, for at most `left`.
            if unsafe { libc::poll(&mut fd, 1, left.as_millis().min(i32::MAX as u128) as i32) } <= 0 {
                continue;
            }
            let mut chunk = [0u8; 4096];
            match self.stdout.read(&mut chunk) {
                Ok(0) => return Err(format!("the source process exited ({:?})", self.child.wait())),
                Ok(n) => self.buffered.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == IoErrorKind::Interrupted => {}
                Err(e) => return Err(format!("the source process's stdout: {e}")),
            }
        }
    }

    fn done(&mut self) -> R<Done> {
        let line = self.line()?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["DONE", status @ ("ok" | "failed"), what, pinned, ref message @ ..] => Ok(Done {
                ok: status == "ok",
                what: what.to_string(),
                pinned: pinned.parse().map_err(|_| format!("the source process: {line}"))?,
                message: message.join(" "),
                line: line.clone(),
            }),
            _ => Err(format!("the source process: {line}")),
        }
    }

    fn figures(&mut self) -> R<Figures> {
        self.send("measure")?;
        let line = self.line()?;
        Figures::decode(line.strip_prefix("FIGURES ").ok_or_else(|| format!("the source process: {line}"))?)
    }

    /// SIGKILL, and reaped.
    fn kill(&mut self) -> R<()> {
        self.child.kill().map_err(|e| format!("kill: {e}"))?;
        self.child.wait().map(drop).map_err(|e| format!("wait: {e}"))
    }

    /// Closes its stdin; it must exit with status 0.
    fn finish(mut self) -> R<()> {
        drop(self.stdin.take());
        let status = self.child.wait().map_err(|e| format!("wait: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("the source process exited with {status}"))
        }
    }
}

impl Drop for SourceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The source process's main: one migration per `run N PORT` line, its
/// figures per `measure` line, until its stdin closes.
fn source_process() -> i32 {
    let mut ram = match Ram::anonymous(RAM) {
        Ok(ram) => ram,
        Err(e) => {
            eprintln!("soak --source: {e}");
            return 1;
        }
    };
    let registry = ram.registry();
    for line in std::io::stdin().lines() {
        let line = line.unwrap_or_default();
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words[..] {
            ["run", run, port] => match (run.parse(), port.parse()) {
                (Ok(run), Ok(port)) => Some(send(&mut ram, &registry, run, port)),
                _ => None,
            },
            ["measure"] => Some(match Figures::of_this_process() {
                Ok(f) => format!("FIGURES {}", f.encode()),
                Err(e) => format!("ERROR {e}"),
            }),
            _ => None,
        };
        let Some(reply) = reply else {
            eprintln!("soak --source: bad command {line:?}");
            return 2;
        };
        println!("{reply}");
    }
    0
}

/// Run `run`'s migration to the destination at `port`; the `DONE` line.
fn send(ram: &mut Ram, registry: &RamBlocks, run: u64, port: u16) -> String {
    let plan = Plan::of(run);
    let content = Content::of(run);
    content.write_first(ram.bytes_mut());
    let source = match Source::connect(&ip(), port, &plan.config(), registry) {
        Ok(s) => s,
        Err(e) => return format!("DONE failed {:?} 0 connect: {}", e.kind, e.message),
    };
    let unregistration = source.unregistration();
    let sent = migrate(&source, ram, &content, plan.fault);
    // Always closed, as a hypervisor does after a failure too: close joins
    // the transfer thread, which hands every registration to the worker;
    // once it has deregistered them, the gauge must be 0.
    let ended = source.close();
    if let Some(u) = &unregistration {
        u.flush();
    }
    let pinned = source.stats().pinned_bytes;
    match sent.and(ended) {
        Ok(ending) => format!("DONE ok {ending:?} {pinned}"),
        Err(e) => format!("DONE failed {:?} {pinned} {}", e.kind, e.message.replace('\n', " ")),
    }
}

/// The source's side of a run up to its close.
fn migrate(source: &Source, ram: &mut Ram, content: &Content, fault: Option<Fault>) -> rdmamig::Result<()> {
    source.put(&content.stream(0))?;
    source.iteration_begin()?;
    source.save(0, 0, RAM)?;
    source.iteration_end()?;
    let dirtied = content.write_second(ram.bytes_mut());
    match fault {
        None => {
            source.iteration_begin()?;
            for &page in &dirtied {
                source.save(0, page * PAGE, PAGE)?;
            }
            source.iteration_end()?;
            source.put(&content.stream(1))
        }
        Some(Fault::SourceAbort) => {
            source.iteration_begin()?;
            for &page in &dirtied[..dirtied.len() / 2] {
                source.save(0, page * PAGE, PAGE)?;
            }
            source.abort();
            Ok(())
        }
        // Whole windows until the destination's abort or the kill ends them.
        Some(Fault::Kill | Fault::DestinationAbort) => loop {
            source.iteration_begin()?;
            source.save(0, 0, RAM)?;
            source.iteration_end()?;
        },
    }
}

// ---------------------------------------------------------------------------
// The destination: one run.

/// Every stream byte until the connection ended, and how it ended (`Err`:
/// the connection's failure); fails if it did not end within `END_WAIT`.
fn read_to_end(dest: &Destination) -> R<(Vec<u8>, rdmamig::Result<Ending>)> {
    let mut stream = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match dest.get(&mut buf, Some(END_WAIT)) {
            Ok(Read::Bytes(n)) => stream.extend_from_slice(&buf[..n]),
            Ok(Read::End(ending)) => return Ok((stream, Ok(ending))),
            Err(e) => return dest.error().map(|failure| (stream, Err(failure))).ok_or(format!("get: {e}")),
        }
    }
}

/// After a fault: the connection must have failed, but for a source without
/// rdmamig extensions killed between windows, which QEMU's protocol cannot
/// tell from a close: the destination then ends `Unverified` with the
/// stream cut short, as the hypervisor's stream parser finds (QEMU's source
/// sends QEMU_VM_EOF last). What it saw.
fn failure(dest: &Destination, run: u64, plan: &Plan) -> R<String> {
    let (stream, end) = read_to_end(dest)?;
    match end {
        Err(e) => Ok(format!("the destination failed ({e})")),
        Ok(Ending::Unverified) if !plan.extensions && plan.fault == Some(Fault::Kill) => {
            if stream == Content::of(run).stream(0) {
                Ok("the destination ended Unverified, the stream cut short".into())
            } else {
                Err(format!("the destination ended Unverified with {} stream bytes", stream.len()))
            }
        }
        Ok(ending) => Err(format!("the destination ended {ending:?} instead of failing")),
    }
}

/// The destination's side of run `run` while connected, against `source`
/// (the process running its source); what happened.
fn serve(dest: &Destination, source: &mut SourceProcess, run: u64, plan: &Plan) -> R<String> {
    let first_window = || dest.wait_iteration(1, Some(END_WAIT)).map_err(|e| format!("the first window: {e}"));
    match plan.fault {
        None => {
            let content = Content::of(run);
            let (stream, end) = read_to_end(dest)?;
            let ending = end.map_err(|e| format!("the destination failed: {e}"))?;
            let mut want = content.stream(0);
            want.extend(content.stream(1));
            if stream != want {
                let at = stream.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(stream.len().min(want.len()));
                return Err(format!("the stream differs from byte {at} ({} bytes, {} sent)", stream.len(), want.len()));
            }
            let done = source.done()?;
            if ending != plan.ending() || !done.ok || done.what != format!("{:?}", plan.ending()) {
                return Err(format!("the destination ended {ending:?}; the source: {}", done.line));
            }
            check_source_pins(&done)?;
            Ok(format!("{ending:?} on both sides"))
        }
        Some(Fault::Kill) => {
            first_window()?;
            source.kill()?;
            Ok(format!("source killed after the first window; {}", failure(dest, run, plan)?))
        }
        Some(Fault::SourceAbort) => {
            let seen = failure(dest, run, plan)?;
            let done = source.done()?;
            if done.ok || done.what != "Aborted" {
                return Err(format!("the source's abort: {}", done.line));
            }
            check_source_pins(&done)?;
            Ok(format!("source aborted; {seen}"))
        }
        Some(Fault::DestinationAbort) => {
            first_window()?;
            dest.abort();
            let seen = failure(dest, run, plan)?;
            let done = source.done()?;
            if done.ok {
                return Err(format!("the source went on after the destination's abort: {}", done.line));
            }
            check_source_pins(&done)?;
            Ok(format!("destination aborted: {seen}; the source failed ({}: {})", done.what, done.message))
        }
    }
}

fn check_source_pins(done: &Done) -> R<()> {
    if done.pinned != 0 {
        return Err(format!("the source's connection still counts {} bytes pinned after close", done.pinned));
    }
    Ok(())
}

/// Run `run`: its source is the long-lived source process, or (a run whose
/// source is killed) a fresh one. Checks the RAM after a completed run and
/// the connection's pinned bytes after every one; what happened.
fn run_once(
    listener: &Listener,
    ram: &Ram,
    registry: &RamBlocks,
    long_lived: &mut SourceProcess,
    exe: &Path,
    run: u64,
) -> R<String> {
    let plan = Plan::of(run);
    let mut fresh = match plan.fault {
        Some(Fault::Kill) => Some(SourceProcess::spawn(exe)?),
        _ => None,
    };
    let source = fresh.as_mut().unwrap_or(long_lived);
    source.send(&format!("run {run} {}", listener.port()))?;
    let dest = Destination::accept(listener, registry, Some(ACCEPT_WAIT)).map_err(|e| format!("accept: {e}"))?;
    let unregistration = dest.unregistration();
    let served = serve(&dest, source, run, &plan);
    dest.close();
    // Its deregistrations finish on the worker: then the gauge must be 0.
    if let Some(u) = &unregistration {
        u.flush();
    }
    let pinned = dest.stats().pinned_bytes;
    drop(dest);
    let what = served?;
    if pinned != 0 {
        return Err(format!("the destination's connection still counts {pinned} bytes pinned after close"));
    }
    if plan.fault.is_none() {
        Content::of(run).check(ram.bytes())?;
        return Ok(format!("{what}, RAM and stream byte-identical"));
    }
    Ok(what)
}

// ---------------------------------------------------------------------------
// Main.

fn usage() -> ! {
    eprintln!("usage: soak [--runs N]   (N > {BASELINE}, default 1000)");
    std::process::exit(2)
}

/// Re-executes this program with `TCACHE_OFF` added to `GLIBC_TUNABLES`, unless it is there.
fn turn_tcache_off() {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if tunables.split(':').any(|t| t == TCACHE_OFF) {
        return;
    }
    let tunables = if tunables.is_empty() { TCACHE_OFF.to_string() } else { format!("{tunables}:{TCACHE_OFF}") };
    // Not /proc/self/exe: under valgrind that is valgrind's own.
    let e = match std::env::current_exe() {
        Ok(exe) => Command::new(exe).args(std::env::args_os().skip(1)).env("GLIBC_TUNABLES", tunables).exec(),
        Err(e) => e,
    };
    eprintln!("soak: re-executing itself with GLIBC_TUNABLES: {e}");
    std::process::exit(1);
}

fn main() {
    turn_tcache_off();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let runs = match argv.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["--source"] => std::process::exit(source_process()),
        [] => 1000,
        ["--runs", n] => n.parse().ok().filter(|&n| n > BASELINE).unwrap_or_else(|| usage()),
        _ => usage(),
    };
    match soak(runs) {
        Ok(()) => println!("soak: PASS"),
        Err(e) => {
            println!("soak: FAIL {e}");
            std::process::exit(1);
        }
    }
}

fn soak(runs: u64) -> R<()> {
    let exe = ExeCopy::new()?;
    let ram = Ram::anonymous(RAM)?;
    let registry = ram.registry();
    // Pin-all allowed: each source asks for it or not.
    let listener =
        Listener::bind(&ip(), 0, &Config { pin_all: true, ..Config::default() }).map_err(|e| format!("listen: {e}"))?;
    let mut source = SourceProcess::spawn(&exe.0)?;
    println!("soak: {runs} migrations of {} MiB through one listener (port {})", RAM / MIB, listener.port());
    let started = Instant::now();
    let checkpoints = checkpoints(runs);
    // Allocated once: the heap is measured as it fills.
    let mut rows = Vec::with_capacity(checkpoints.len());
    let mut failed = None;
    for run in 1..=runs {
        let t = Instant::now();
        let plan = Plan::of(run);
        match run_once(&listener, &ram, &registry, &mut source, &exe.0, run) {
            Ok(what) => println!("soak: run {run} {}: {what} [{:.2} s]", plan.describe(), t.elapsed().as_secs_f64()),
            Err(e) => {
                failed = Some(format!("run {run} ({}): {e}", plan.describe()));
                break;
            }
        }
        if checkpoints.contains(&run) {
            match Row::measure(run, started, &mut source) {
                Ok(row) => rows.push(row),
                Err(e) => {
                    failed = Some(format!("the figures at run {run}: {e}"));
                    break;
                }
            }
        }
    }
    print_table(&rows);
    if let Some(e) = failed {
        return Err(e);
    }
    source.finish()?;
    let not_flat = not_flat(&rows);
    for line in &not_flat {
        println!("soak: NOT FLAT: {line}");
    }
    if !not_flat.is_empty() {
        return Err(format!("{} figures not flat from run {BASELINE} to run {runs}", not_flat.len()));
    }
    let last = rows.last().expect("the last run is a checkpoint");
    let base = rows.iter().find(|r| r.run == BASELINE).expect("checked by not_flat");
    let growth = |now: u64, then: u64| now as i64 - then as i64;
    let (d, d0, s, s0) = (&last.destination, &base.destination, &last.source, &base.source);
    println!(
        "soak: {runs} runs in {:.0} s; flat from run {BASELINE} to run {runs}: fds, threads, VmPin and RDMA objects \
         equal; VmRSS {:+} KiB (destination), {:+} KiB (source), slack {RSS_SLACK_KIB} KiB; heap {:+} bytes \
         (destination), {:+} bytes (source), slack {HEAP_SLACK} bytes",
        last.elapsed.as_secs_f64(),
        growth(d.rss_kib, d0.rss_kib),
        growth(s.rss_kib, s0.rss_kib),
        growth(d.heap, d0.heap),
        growth(s.heap, s0.heap)
    );
    Ok(())
}
