//! The post-copy benchmark (`make bench-postcopy`, scripts/postcopy-bench.sh):
//! fault service latency and background pull rate against perftest's RDMA
//! READ anchors, in one RDMA guest boot.
//!
//! First a warm-up (`common::warm_up`, as in the dense benchmark): the
//! guest's free memory touched once and freed, the RDMA devices discovered,
//! so that neither one-off cost lands on the first run.
//!
//! 1. Anchors, server and client on this host's RDMA address, each pair just
//!    before the runs it anchors (the host's load drifts):
//!    `ib_read_lat -s 4096` (t_typical, 99 % percentile; busy-polling, as
//!    perftest does by default), the same with `-e` (sleeping on CQ events,
//!    as the library's post-copy thread does; no target, for reading the
//!    gap), `ib_read_bw -s 65536` (the pull's read size; perftest's default
//!    outstanding reads, the device's maximum) and the same with `-o 4` (the
//!    pull's depth), each twice, the better kept. The pull's size and depth are private to the engine
//!    (`PULL_PAGES`, `PULL_DEPTH` in src/engine/postcopy/destination.rs):
//!    this program assumes 64 KiB × 4 and prints it.
//! 2. Fault service latency: a `--fault-mib` block, every page stale (one
//!    empty pre-copy window, so the destination has none of it), post-copy
//!    running; one vCPU thread (then four) touches random stale pages of the
//!    block's top quarter, each first touch timed in the vCPU thread
//!    (`clock_gettime(CLOCK_MONOTONIC)` around one 8-byte read of a page
//!    `mincore` says is missing). The engine has no pull-free phase: it pulls
//!    while any page is stale (the windows around recent faults first, then
//!    from the block's start; for 2 ms after a fault at most one read), so a
//!    timed touch may be served by a pull of its window: the latency a guest
//!    sees. The vCPUs stop touching before the address-order pull comes near
//!    their quarter (counting all pulled pages, the fault windows' too).
//!    p50, p99, max and count, ÷ `ib_read_lat` typical and p99; the
//!    issue's targets: p50 ≤ 1.5 × typical, p99 ≤ 3 × typical.
//! 3. Background pull: a `--pull-mib` block, no vCPU; stale dense (every
//!    page, empty pre-copy window) and sparse (one 64 KiB-aligned run of
//!    every four, the rest sent in the pre-copy window). Times: switch-over
//!    (the source's `postcopy` call → the destination `Running`: the source
//!    registers the block for remote read, POSTCOPY, the destination drops
//!    the pages and registers its userfaultfd), pull (`Running` → `Done`)
//!    and their sum; pages and bytes read; rate = bytes read ÷ pull time,
//!    ÷ `ib_read_bw -s 65536` and ÷ the same with `-o 4` (on rxe either can
//!    be the faster); the target, ≥ 0.9, is for the dense run (every read
//!    64 KiB) against both, so against the better one.
//!
//! Every run ends `Completed` on both sides and the destination's memory
//! must equal the source's final memory, byte for byte (the vCPUs only
//! read). Source and destination are two connections' ends in this one
//! process (the source's CPU plays no part in post-copy: READs are answered
//! by its NIC, here rxe in the kernel).
//!
//! Prints one table (figure, unit, ratios, the issue's target, verified or
//! FAILED). Exit status 1 if any run failed or came out different, never
//! because of a ratio.
//!
//! ```text
//! cargo build --release --features rdma-tests --example postcopy_bench
//! postcopy_bench [--fault-mib MiB] [--pull-mib MiB] [--faults N] [--think-us N]
//!                [--dump-faults DIR] [--quick] [--no-anchors]
//! ```
//!
//! `--quick`: 64 MiB blocks, 200 faults, short anchors; `--no-anchors`: no
//! perftest runs (no ratios; the smoke step of scripts/rdma-suite.sh).
//! `--dump-faults DIR` writes each timed fault as `vcpu address start_ns
//! end_ns` (CLOCK_MONOTONIC) to DIR/faults-RUN.txt, to line up with
//! timestamps taken elsewhere (the engine, instrumented locally).
//!
//! Needs an RDMA device at `RXE_VM_IP` (default 198.18.0.1, device
//! `RXE_VM_DEV`, default rxe0), root (userfaultfd, a large `ulimit -l`),
//! ib_read_lat and ib_read_bw; scripts/postcopy-bench.sh runs it in an rxe
//! guest.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, Ending, Listener, PostcopyPhase, Source, StalePages};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// The destination's background read (`PULL_PAGES` × 4 KiB) and reads in
/// flight (`PULL_DEPTH`), private to src/engine/postcopy/destination.rs.
const PULL_BYTES: u64 = 64 << 10;
const PULL_DEPTH: u32 = 4;
/// Pages of a sparse stale set's runs (64 KiB, aligned): one of every four.
const RUN_PAGES: u64 = 16;
const SEED: u64 = 0x5eed_0c0b_1e55_0013;
const WAIT: Duration = Duration::from_secs(600);

#[path = "common/mod.rs"]
mod common;
use common::perftest::{better, ip, perftest};
use common::{mix, Ram};

type R<T> = Result<T, String>;

/// CLOCK_MONOTONIC in nanoseconds (the vDSO: no system call).
fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

// ---------------------------------------------------------------------------
// 1. Anchors.

/// The result line under perftest's `#bytes ...` header, by column name
/// ("99%" and "99.9%" stand for "99% percentile[usec]" and so on).
fn columns(out: &str) -> Vec<(String, f64)> {
    let mut lines = out.lines().skip_while(|l| !l.trim_start().starts_with("#bytes"));
    let (Some(header), Some(values)) = (lines.next(), lines.next()) else { return Vec::new() };
    let mut names = Vec::new();
    let mut tokens = header.split_whitespace().peekable();
    while let Some(t) = tokens.next() {
        if t.ends_with('%') && tokens.peek().is_some_and(|n| n.starts_with("percentile")) {
            tokens.next();
        }
        names.push(t.to_owned());
    }
    names.into_iter().zip(values.split_whitespace().map(|v| v.parse::<f64>().unwrap_or(f64::NAN))).collect()
}

struct Latency {
    typical: f64,
    p99: f64,
    min: f64,
}

/// `ib_read_lat -s 4096 -n iters [-e]`: microseconds.
fn read_lat(iters: u32, events: bool) -> R<Latency> {
    let n = iters.to_string();
    let mut args = vec!["-s", "4096", "-n", &n];
    if events {
        args.push("-e");
    }
    let out = perftest("ib_read_lat", &args)?;
    let cols = columns(&out);
    let get = |name: &str| cols.iter().find(|(n, _)| n == name).map(|&(_, v)| v).filter(|v| v.is_finite());
    match (get("t_typical[usec]"), get("99%"), get("t_min[usec]")) {
        (Some(typical), Some(p99), Some(min)) => Ok(Latency { typical, p99, min }),
        _ => Err(format!("ib_read_lat {}: no t_typical / 99% / t_min in\n{out}", args.join(" "))),
    }
}

/// `ib_read_bw -s PULL_BYTES -D secs [-o outstanding] --report_gbits`: its average, Gbit/s.
fn read_bw(secs: u32, outstanding: Option<u32>) -> R<f64> {
    let (size, secs) = (PULL_BYTES.to_string(), secs.to_string());
    let o = outstanding.map(|o| o.to_string());
    let mut args = vec!["-s", &size, "-D", &secs, "--report_gbits"];
    if let Some(o) = &o {
        args.extend(["-o", o]);
    }
    let out = perftest("ib_read_bw", &args)?;
    // "#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]": the fourth value.
    let line = out.lines().skip_while(|l| !l.trim_start().starts_with("#bytes")).nth(1);
    line.and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("ib_read_bw {}: no average in\n{out}", args.join(" ")))
}

// ---------------------------------------------------------------------------
// Guest RAM and the stale sets.

/// The vCPUs' and the benchmark's own uses of guest RAM.
impl Ram {
    /// Fills every page with random non-zero bytes (before any connection).
    fn fill(&mut self, seed: u64) {
        for (page, out) in self.bytes_mut().chunks_exact_mut(PAGE as usize).enumerate() {
            let mut x = mix(seed ^ (page as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)) | 1;
            for word in out.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                word.copy_from_slice(&x.to_le_bytes());
            }
        }
    }

    /// Whether `page` is not resident: touching it faults.
    fn missing(&self, page: u64) -> bool {
        let mut v = 0u8;
        // SAFETY: one page inside the mapping, one byte of result.
        let rc = unsafe { libc::mincore(self.ptr.add((page * PAGE) as usize).cast(), PAGE as usize, &mut v) };
        rc == 0 && v & 1 == 0
    }

    /// One 8-byte read of `page` (a vCPU's touch).
    fn touch(&self, page: u64) -> u64 {
        // SAFETY: an aligned word inside the mapping; a missing page faults
        // and the library installs it before the read returns.
        unsafe { (self.ptr.add((page * PAGE) as usize) as *const u64).read_volatile() }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Every page stale.
    Dense,
    /// One 64 KiB-aligned run of every four stale (25 %).
    Sparse,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Dense => "dense",
            Layout::Sparse => "sparse 25 %",
        }
    }

    fn bitmap(self, pages: u64) -> Vec<u64> {
        let mut bits = vec![0u64; pages.div_ceil(64) as usize];
        for page in 0..pages {
            let run = page / RUN_PAGES;
            if self == Layout::Dense || run % 4 == mix(SEED ^ (run / 4)) % 4 {
                bits[(page / 64) as usize] |= 1 << (page % 64);
            }
        }
        bits
    }
}

fn is_set(bits: &[u64], page: u64) -> bool {
    bits[(page / 64) as usize] >> (page % 64) & 1 != 0
}

// ---------------------------------------------------------------------------
// 2 and 3. One post-copy migration.

/// The vCPUs of a fault run.
#[derive(Clone, Copy)]
struct Vcpus {
    threads: u64,
    /// Timed faults to collect, all threads together.
    faults: usize,
    think: Duration,
}

/// What one post-copy migration measured.
struct Run {
    stale_pages: u64,
    /// The source's `postcopy` call → the destination `Running`.
    switch_secs: f64,
    /// `Running` → `Done`.
    pull_secs: f64,
    bytes_read: u64,
    faults_served: u64,
    /// Timed first touches, nanoseconds, sorted.
    faults: Vec<u64>,
    /// The destination's memory against the source's final memory.
    verified: R<()>,
}

fn run_postcopy(len: u64, layout: Layout, vcpus: Option<Vcpus>, dump: Option<(&str, &str)>) -> R<Run> {
    let pages = len / PAGE;
    let stale = layout.bitmap(pages);
    let stale_pages: u64 = stale.iter().map(|w| w.count_ones() as u64).sum();
    let mut src = Ram::anonymous(len)?;
    src.fill(SEED ^ len);
    let dst = Ram::anonymous(len)?;
    let config = Config::default();
    let listener = Listener::bind(&ip(), 0, &config).map_err(|e| format!("listen: {e}"))?;
    let port = listener.port();
    let dst_registry = dst.registry();
    let accept = thread::spawn(move || Destination::accept(&listener, &dst_registry, Some(Duration::from_secs(60))));
    let source = Source::connect(&ip(), port, &config, &src.registry()).map_err(|e| format!("connect: {e}"));
    let dest = accept.join().map_err(|_| "the accepting thread panicked")?.map_err(|e| format!("accept: {e}"))?;
    let source = source?;

    // The pre-copy window: the pages that are not stale (none when dense).
    source.iteration_begin().map_err(|e| format!("iteration_begin: {e}"))?;
    if layout != Layout::Dense {
        let sent: Vec<u64> = stale.iter().map(|w| !w).collect();
        source.save_bitmap(0, &sent, 0, pages, PAGE).map_err(|e| format!("save_bitmap: {e}"))?;
    }
    source.iteration_end().map_err(|e| format!("iteration_end: {e}"))?;
    dest.wait_iteration(1, Some(WAIT)).map_err(|e| format!("wait_iteration: {e}"))?;

    let mut run = Run {
        stale_pages,
        switch_secs: 0.0,
        pull_secs: 0.0,
        bytes_read: 0,
        faults_served: 0,
        faults: Vec::new(),
        verified: Ok(()),
    };
    let dumped = Mutex::new(String::new());
    let called = Instant::now();
    let result = thread::scope(|s| -> R<()> {
        let stale_for_source = stale.clone();
        let source_side = s.spawn(move || -> R<()> {
            let summary = source
                .postcopy(&[StalePages { block: 0, bitmap: stale_for_source }])
                .map_err(|e| format!("postcopy (source): {e}"))?;
            if summary.pages != stale_pages {
                return Err(format!("the destination reports {} pages of {stale_pages}", summary.pages));
            }
            match source.close().map_err(|e| format!("close: {e}"))? {
                Ending::Completed => Ok(()),
                e => Err(format!("the source's migration ended {e:?}")),
            }
        });
        let running = dest.wait_postcopy(PostcopyPhase::Running, Some(WAIT));
        let running_at = Instant::now();
        let running = running.map_err(|e| format!("wait_postcopy(Running): {e}"))?;
        if running.pages_total != stale_pages {
            return Err(format!("the destination has {} stale pages, not {stale_pages}", running.pages_total));
        }
        run.switch_secs = running_at.duration_since(called).as_secs_f64();
        let mut touchers = Vec::new();
        if let Some(v) = vcpus {
            // The top quarter is theirs; the address-order pull starts at
            // page 0. They stop once the pages installed without a fault
            // (that pull's and their windows') come within 1024 pages of it.
            let first = pages - pages / 4;
            let (dst, dest, dumped) = (&dst, &dest, &dumped);
            let quota = v.faults.div_ceil(v.threads as usize);
            for t in 0..v.threads {
                touchers.push(s.spawn(move || {
                    let mut rng = mix(SEED ^ (t + 1) << 32);
                    let mut times = Vec::with_capacity(quota);
                    let mut log = String::new();
                    while times.len() < quota {
                        let p = dest.postcopy_progress();
                        let pulled = p.pages_total - p.pages_remaining - p.faults_served;
                        if pulled + 1024 >= first {
                            break;
                        }
                        rng = mix(rng);
                        let page = first + rng % (pages - first);
                        if !dst.missing(page) {
                            continue;
                        }
                        if !v.think.is_zero() {
                            thread::sleep(v.think);
                        }
                        let start = now_ns();
                        dst.touch(page);
                        let end = now_ns();
                        times.push(end - start);
                        if dump.is_some() {
                            let addr = dst.ptr as u64 + page * PAGE;
                            let _ = writeln!(log, "{t} {addr:#x} {start} {end}");
                        }
                    }
                    dumped.lock().unwrap().push_str(&log);
                    times
                }));
            }
        }
        let done = dest.wait_postcopy(PostcopyPhase::Done, Some(WAIT));
        run.pull_secs = running_at.elapsed().as_secs_f64();
        if let (Err(e), false) = (&done, touchers.is_empty()) {
            // A failed post-copy releases the vCPUs blocked on missing pages
            // with SIGSEGV (documented), which this program does not handle:
            // they cannot be joined, so exit now (a SIGSEGV may come first).
            println!("FAILED: wait_postcopy(Done) with vCPU threads running: {e}: exiting");
            std::process::exit(1);
        }
        for t in touchers {
            run.faults.extend(t.join().map_err(|_| "a vCPU thread panicked")?);
        }
        let done = done.map_err(|e| format!("wait_postcopy(Done): {e}"))?;
        run.bytes_read = done.bytes_pulled;
        run.faults_served = done.faults_served;
        source_side.join().map_err(|_| "the source thread panicked")??;
        match dest.wait_end(Some(WAIT)).map_err(|e| format!("wait_end: {e}"))? {
            Ending::Completed => Ok(()),
            e => Err(format!("the destination's migration ended {e:?}")),
        }
    });
    dest.close();
    drop(dest);
    result?;
    run.faults.sort_unstable();
    if let Some((dir, name)) = dump {
        let path = format!("{dir}/faults-{name}.txt");
        std::fs::write(&path, dumped.into_inner().unwrap()).map_err(|e| format!("{path}: {e}"))?;
    }
    // Source final memory, byte for byte (the vCPUs only read).
    run.verified =
        match src.bytes().chunks(PAGE as usize).zip(dst.bytes().chunks(PAGE as usize)).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(page) => Err(format!(
                "destination page {page} (stale: {}) differs from the source's final memory",
                is_set(&stale, page as u64)
            )),
        };
    Ok(run)
}

// ---------------------------------------------------------------------------
// 4. The table.

struct Row {
    what: String,
    value: Option<f64>,
    unit: &'static str,
    /// ÷ ib_read_lat typical (faults) or ÷ ib_read_bw (rates).
    ratio_a: Option<f64>,
    /// ÷ ib_read_lat 99 % (faults) or ÷ ib_read_bw -o 4 (rates).
    ratio_b: Option<f64>,
    target: &'static str,
    met: Option<bool>,
    check: R<()>,
    /// The check column of a row that verified no data ("ok": an anchor, "-": derived).
    unverified: Option<&'static str>,
}

impl Row {
    fn new(what: impl Into<String>, value: Option<f64>, unit: &'static str, check: &R<()>) -> Row {
        Row {
            what: what.into(),
            value,
            unit,
            ratio_a: None,
            ratio_b: None,
            target: "",
            met: None,
            check: check.clone(),
            unverified: None,
        }
    }

    fn unverified(mut self, label: &'static str) -> Row {
        self.unverified = Some(label);
        self
    }

    fn ratios(mut self, a: Option<f64>, b: Option<f64>) -> Row {
        (self.ratio_a, self.ratio_b) = (a, b);
        self
    }

    fn target(mut self, target: &'static str, figure: Option<f64>, meets: impl Fn(f64) -> bool) -> Row {
        self.target = target;
        self.met = figure.map(meets);
        self
    }
}

fn print_table(title: &str, rows: &[Row]) {
    let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    println!("\n{title}");
    println!(
        "{:<52} {:>10} {:<6} {:>6} {:>6}  {:<16} {:<4} check",
        "measurement", "value", "unit", "÷A", "÷B", "target", "met"
    );
    println!("{}", "-".repeat(120));
    for r in rows {
        let check = match &r.check {
            Ok(()) => r.unverified.unwrap_or("verified").into(),
            Err(e) => format!("FAILED: {}", e.lines().next().unwrap_or("")),
        };
        println!(
            "{:<52} {:>10} {:<6} {:>6} {:>6}  {:<16} {:<4} {check}",
            r.what,
            r.value.map_or_else(|| "-".into(), |v| format!("{v:.3}")),
            r.unit,
            f(r.ratio_a),
            f(r.ratio_b),
            r.target,
            r.met.map_or("-", |m| if m { "yes" } else { "NO" }),
        );
    }
    println!(
        "÷A: fault latency ÷ ib_read_lat -s 4096 t_typical, rate ÷ ib_read_bw -s {PULL_BYTES}; \
         ÷B: fault latency ÷ ib_read_lat 99 %, rate ÷ ib_read_bw -s {PULL_BYTES} -o {PULL_DEPTH}."
    );
}

// ---------------------------------------------------------------------------
// Arguments, the measurements in order, main.

struct Args {
    fault_mib: u64,
    pull_mib: u64,
    faults: usize,
    think: Duration,
    dump: Option<String>,
    quick: bool,
    anchors: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: postcopy_bench [--fault-mib MiB] [--pull-mib MiB] [--faults N] [--think-us N] [--dump-faults DIR] \
         [--quick] [--no-anchors]"
    );
    std::process::exit(2)
}

fn parse_args(args: &[String]) -> Args {
    let mut a = Args {
        fault_mib: 512,
        pull_mib: 256,
        faults: 2000,
        think: Duration::ZERO,
        dump: None,
        quick: false,
        anchors: true,
    };
    let (mut fault, mut pull, mut faults) = (None, None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().unwrap_or_else(|| usage());
        let mut number = || value().parse::<u64>().unwrap_or_else(|_| usage());
        match arg.as_str() {
            "--fault-mib" => fault = Some(number()),
            "--pull-mib" => pull = Some(number()),
            "--faults" => faults = Some(number() as usize),
            "--think-us" => a.think = Duration::from_micros(number()),
            "--dump-faults" => a.dump = Some(value()),
            "--quick" => a.quick = true,
            "--no-anchors" => a.anchors = false,
            _ => usage(),
        }
    }
    if a.quick {
        (a.fault_mib, a.pull_mib, a.faults) = (64, 64, 200);
    }
    a.fault_mib = fault.unwrap_or(a.fault_mib);
    a.pull_mib = pull.unwrap_or(a.pull_mib);
    a.faults = faults.unwrap_or(a.faults);
    // The fault runs' quarter must lie beyond the pull's 1024-page margin.
    if a.fault_mib < 32 || a.pull_mib == 0 || a.faults == 0 {
        usage();
    }
    a
}

fn progress(what: &str) {
    eprintln!("postcopy-bench: {what}");
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 * 8.0 / secs / 1e9
}

/// The value at quantile `q` of sorted `v` (nearest rank).
fn quantile(v: &[u64], q: f64) -> Option<u64> {
    (!v.is_empty()).then(|| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1])
}

fn run(args: &Args) -> Vec<Row> {
    let (touched, took) = common::warm_up();
    progress(&format!(
        "warmed up: {} MiB of guest memory touched, RDMA devices discovered ({:.1} s)",
        touched >> 20,
        took.as_secs_f64()
    ));
    let mut rows = Vec::new();
    let (lat_iters, bw_secs) = if args.quick { (2000, 2) } else { (10000, 5) };

    let over = |v: f64, anchor: Option<f64>| anchor.map(|a| v / a);
    // Each group's anchors run just before it: the host's load drifts.
    // 1a. Latency anchors.
    let mut lat = None;
    if args.anchors {
        progress("anchors: ib_read_lat -s 4096 (polling, then CQ events)");
        let polled = read_lat(lat_iters, false);
        let events = read_lat(lat_iters, true);
        for (name, l) in [("ib_read_lat -s 4096", &polled), ("ib_read_lat -s 4096 -e (CQ events)", &events)] {
            let check = l.as_ref().map(drop).map_err(Clone::clone);
            let l = l.as_ref().ok();
            rows.push(Row::new(format!("{name}: t_typical"), l.map(|l| l.typical), "µs", &check).unverified("ok"));
            rows.push(Row::new(format!("{name}: 99 %"), l.map(|l| l.p99), "µs", &check).unverified("ok"));
            rows.push(Row::new(format!("{name}: t_min"), l.map(|l| l.min), "µs", &check).unverified("ok"));
        }
        lat = polled.ok();
    }

    // 2. Fault service latency.
    for threads in [1, 4] {
        let v = Vcpus { threads, faults: args.faults, think: args.think };
        let what = format!("fault {} MiB dense, {threads} vCPU", args.fault_mib);
        progress(&format!("{what}: up to {} timed faults", args.faults));
        let name = format!("{threads}vcpu");
        let dump = args.dump.as_deref().map(|d| (d, name.as_str()));
        let r = run_postcopy(args.fault_mib * MIB, Layout::Dense, Some(v), dump);
        let check = r.as_ref().map_err(Clone::clone).and_then(|r| r.verified.clone());
        let r = r.ok();
        let faults = r.as_ref().map(|r| r.faults.as_slice()).unwrap_or_default();
        let us = |q: f64| quantile(faults, q).map(|ns| ns as f64 / 1e3);
        let (p50, p99) = (us(0.5), us(0.99));
        let a = |v: Option<f64>| v.and_then(|v| over(v, lat.as_ref().map(|l| l.typical)));
        let b = |v: Option<f64>| v.and_then(|v| over(v, lat.as_ref().map(|l| l.p99)));
        rows.push(Row::new(format!("{what}: p50"), p50, "µs", &check).ratios(a(p50), b(p50)).target(
            "÷A ≤ 1.5",
            a(p50),
            |v| v <= 1.5,
        ));
        rows.push(Row::new(format!("{what}: p99"), p99, "µs", &check).ratios(a(p99), b(p99)).target(
            "÷A ≤ 3",
            a(p99),
            |v| v <= 3.0,
        ));
        let max = us(1.0);
        rows.push(Row::new(format!("{what}: max"), max, "µs", &check).ratios(a(max), b(max)));
        rows.push(Row::new(format!("{what}: timed faults"), Some(faults.len() as f64), "", &check));
        let served = r.as_ref().map(|r| r.faults_served as f64);
        rows.push(Row::new(format!("{what}: faults served (engine)"), served, "", &check));
    }

    // 1b. Bandwidth anchors.
    let (mut bw, mut bw4) = (None, None);
    if args.anchors {
        progress(&format!("anchors: ib_read_bw -s {PULL_BYTES} (default outstanding reads, then -o {PULL_DEPTH})"));
        // Twice each, interleaved, the better kept (`perftest::better`).
        let (default, depth) = (read_bw(bw_secs, None), read_bw(bw_secs, Some(PULL_DEPTH)));
        let default = better(default, read_bw(bw_secs, None));
        let depth = better(depth, read_bw(bw_secs, Some(PULL_DEPTH)));
        let names = [format!("ib_read_bw -s {PULL_BYTES}"), format!("ib_read_bw -s {PULL_BYTES} -o {PULL_DEPTH}")];
        for (name, b) in names.into_iter().zip([&default, &depth]) {
            let check = b.as_ref().map(drop).map_err(Clone::clone);
            rows.push(Row::new(name, b.as_ref().ok().copied(), "Gbit/s", &check).unverified("ok"));
        }
        (bw, bw4) = (default.ok(), depth.ok());
    }

    // 3. Background pull.
    for layout in [Layout::Dense, Layout::Sparse] {
        let what = format!("pull {} MiB {}", args.pull_mib, layout.name());
        progress(&format!("{what}, no vCPU"));
        let r = run_postcopy(args.pull_mib * MIB, layout, None, None);
        let check = r.as_ref().map_err(Clone::clone).and_then(|r| r.verified.clone());
        let r = r.ok();
        let get = |f: fn(&Run) -> f64| r.as_ref().map(f);
        rows.push(Row::new(
            format!("{what}: stale"),
            get(|r| (r.stale_pages * PAGE) as f64 / MIB as f64),
            "MiB",
            &check,
        ));
        rows.push(Row::new(format!("{what}: bytes read"), get(|r| r.bytes_read as f64 / MIB as f64), "MiB", &check));
        rows.push(Row::new(format!("{what}: switch-over (call → Running)"), get(|r| r.switch_secs), "s", &check));
        rows.push(Row::new(format!("{what}: pull (Running → Done)"), get(|r| r.pull_secs), "s", &check));
        rows.push(Row::new(format!("{what}: total"), get(|r| r.switch_secs + r.pull_secs), "s", &check));
        let rate = get(|r| gbps(r.bytes_read, r.pull_secs));
        let mut row = Row::new(format!("{what}: pull rate"), rate, "Gbit/s", &check)
            .ratios(rate.and_then(|v| over(v, bw)), rate.and_then(|v| over(v, bw4)));
        if layout == Layout::Dense {
            // Against the better of the two anchors: both ratios.
            let worse = row.ratio_a.zip(row.ratio_b).map(|(a, b)| a.min(b));
            row = row.target("÷A, ÷B ≥ 0.9", worse, |v| v >= 0.9);
        }
        rows.push(row);
    }
    rows
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = parse_args(&argv);
    if let Some(dir) = &args.dump {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("postcopy-bench: {dir}: {e}");
            std::process::exit(1);
        }
    }
    let rows = run(&args);
    let title = format!(
        "postcopy-bench: faults on a {} MiB dense stale set ({} timed, the pull running), pull of {} MiB; \
         assumed pull reads {} KiB × {PULL_DEPTH} in flight",
        args.fault_mib,
        args.faults,
        args.pull_mib,
        PULL_BYTES >> 10
    );
    print_table(&title, &rows);
    let failed = rows.iter().filter(|r| r.check.is_err() && r.unverified.is_none()).count();
    let mut reasons: Vec<&String> = rows.iter().filter_map(|r| r.check.as_ref().err()).collect();
    reasons.dedup();
    for reason in reasons {
        println!("FAILED: {reason}");
    }
    let anchors_failed = rows.iter().filter(|r| r.check.is_err() && r.unverified.is_some()).count();
    println!("postcopy-bench: {} rows, {failed} failed, {anchors_failed} anchor rows failed", rows.len());
    std::process::exit(i32::from(failed > 0));
}
