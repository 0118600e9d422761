//! Pin budgets on a real device: what each side keeps registered stays under
//! its budget for the whole run, and a migration of more guest RAM than the
//! budgets hold still completes byte for byte.
//!
//! - `a_guest_four_times_the_budget_migrates_within_it_as_non_root`: both
//!   sides are child processes (`child.rs`) that lower RLIMIT_MEMLOCK to
//!   64 MiB and drop root (so CAP_IPC_LOCK too) before touching RDMA, then
//!   migrate 256 MiB with the default budget, which that limit decides.
//! - `a_destination_refuses_a_source_that_asks_past_its_budget`: a QEMU-mode
//!   source (which never unpins) against a destination with a 32 MiB budget.
//! - `an_rdmamig_source_plans_within_the_destination_budget`: an unlimited
//!   rdmamig source keeps a 32 MiB destination within its announced budget.
//! - `a_source_keeps_its_own_budget`: a 32 MiB source toward an unlimited
//!   destination, rdmamig and QEMU-compatible.
//! - `memlock_refusals_name_their_cause`: a non-root child with a 64 KiB
//!   RLIMIT_MEMLOCK, too little for one control buffer, as source and as
//!   destination: each error names the limit and what to do, and so does
//!   the source the destination rejected.
//!
//! A sampler thread reads `stats()` every millisecond on each side it checks.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, Ending, ErrorKind, SaveRange, Source, Stats};

use crate::child::{child_setting, ChildExe, Peer, REPORT};
use crate::migration::{connect, listen, one_block, rdma_ip, GuestRam, Rng, PAGE};

const MIB: u64 = 1 << 20;
/// RLIMIT_MEMLOCK of the non-root children.
const MEMLOCK: u64 = 64 * MIB;
/// RLIMIT_MEMLOCK of the child of `memlock_refusals_name_their_cause`:
/// less than one 512 KiB control buffer.
const TINY_MEMLOCK: u64 = 64 << 10;
/// Guest RAM per side in the non-root test: four times the limit.
const GUEST_RAM: u64 = 256 * MIB;
/// The destination's configured budget in the one-process tests.
const DEST_BUDGET: u64 = 32 * MIB;
/// The source's configured budget in `a_source_keeps_its_own_budget`.
const SOURCE_BUDGET: u64 = 32 * MIB;
/// Guest RAM in the one-process tests: four times those budgets.
const RAM: u64 = 128 * MIB;
/// The unprivileged user and group the children become (nobody, nogroup).
const NOBODY: u32 = 65534;
const SEED: u64 = 0x5EED_F00D;

const DEST_CHILD_ENV: &str = "RDMAMIG_PINNING_DEST";
const SOURCE_CHILD_ENV: &str = "RDMAMIG_PINNING_SOURCE";
const TINY_MEMLOCK_CHILD_ENV: &str = "RDMAMIG_PINNING_TINY_MEMLOCK";
/// How long a child may take (a hang detector; a run takes far less).
const CHILD_BOUND: Duration = Duration::from_secs(120);

/// Pages written again between the first and the second window: one in
/// eight, so the second window touches every chunk again.
fn redirtied(page: u64) -> bool {
    page % 8 == 3
}

/// The first `len` bytes of `ram` as words, to write.
///
/// # Safety
/// Nothing else reads or writes them meanwhile (no transfer: before
/// connecting, between windows, after the end).
unsafe fn words_mut(ram: &mut GuestRam, len: u64) -> &mut [u64] {
    // The mapping is page aligned and at least `len` long.
    std::slice::from_raw_parts_mut(ram.ptr() as *mut u64, (len / 8) as usize)
}

/// The first `len` bytes of `ram` as words, to read (nothing writes them meanwhile).
fn words(ram: &GuestRam, len: u64) -> &[u64] {
    // SAFETY: the mapping is page aligned and at least `len` long.
    unsafe { std::slice::from_raw_parts(ram.ptr() as *const u64, (len / 8) as usize) }
}

/// Fills `len` bytes of `ram` with the pattern of `seed`.
fn fill(ram: &mut GuestRam, len: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    // SAFETY: called before connecting.
    unsafe { words_mut(ram, len) }.iter_mut().for_each(|w| *w = rng.next());
}

/// Writes the redirtied pages again, with a second pattern; returns their offsets.
fn redirty(ram: &mut GuestRam, len: u64, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(!seed);
    // SAFETY: called between windows: no transfer reads the RAM.
    let w = unsafe { words_mut(ram, len) };
    let pages: Vec<u64> = (0..len / PAGE).filter(|&p| redirtied(p)).collect();
    for &p in &pages {
        let first = (p * PAGE / 8) as usize;
        w[first..first + (PAGE / 8) as usize].iter_mut().for_each(|x| *x = rng.next());
    }
    pages.into_iter().map(|p| p * PAGE).collect()
}

/// Checks `ram` against what `fill` then `redirty` wrote, without a second copy.
fn check(ram: &GuestRam, len: u64, seed: u64) -> std::result::Result<(), String> {
    let (mut base, mut again) = (Rng::new(seed), Rng::new(!seed));
    let mut wrong = 0u64;
    let mut first = None;
    for (i, &got) in words(ram, len).iter().enumerate() {
        let old = base.next();
        let want = if redirtied(i as u64 * 8 / PAGE) { again.next() } else { old };
        if got != want {
            wrong += 1;
            first.get_or_insert(i as u64 * 8);
        }
    }
    match first {
        None => Ok(()),
        Some(at) => Err(format!("{wrong} of {} words differ, the first at offset {at:#x}", len / 8)),
    }
}

/// This process's pinned memory as the kernel counts it (`VmPin`, bytes).
fn vm_pin() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// What a sampler saw.
#[derive(Debug, Default)]
struct Samples {
    count: u64,
    max_pinned: u64,
    max_vm_pin: u64,
    /// Samples with pinned_bytes over pin_budget, or pin_budget over the limit.
    violations: u64,
    first_violation: Option<Stats>,
}

impl Samples {
    fn assert_within(&self, side: &str, limit: u64) {
        assert!(self.count > 0, "{side}: no samples");
        assert_eq!(
            self.violations, 0,
            "{side}: {} of {} samples had pinned_bytes over pin_budget or pin_budget over {limit}; the first: {:?}",
            self.violations, self.count, self.first_violation
        );
        assert!(self.max_pinned <= limit, "{side}: sampled {} pinned bytes, over {limit}", self.max_pinned);
    }

    fn describe(&self) -> String {
        format!(
            "samples={} max_sampled_pinned={} max_vm_pin={} violations={}",
            self.count, self.max_pinned, self.max_vm_pin, self.violations
        )
    }
}

/// Samples `stats()` about every millisecond until `stop`: each sample's
/// pinned_bytes must be within its pin_budget, and that within `limit`.
fn sample(stop: &AtomicBool, limit: u64, stats: impl Fn() -> Stats) -> Samples {
    let mut s = Samples::default();
    loop {
        // One last sample after `stop`.
        let stopping = stop.load(Ordering::Relaxed);
        let st = stats();
        s.count += 1;
        s.max_pinned = s.max_pinned.max(st.pinned_bytes);
        if st.pinned_bytes > st.pin_budget || st.pin_budget > limit {
            s.violations += 1;
            s.first_violation.get_or_insert(st);
        }
        if s.count % 16 == 1 {
            s.max_vm_pin = s.max_vm_pin.max(vm_pin());
        }
        if stopping {
            return s;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Sets the flag when dropped, also while a panic unwinds.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `work` with a sampler of `stats` (see `sample`) beside it; the
/// sampler stops when `work` returns or panics.
fn sampled<T>(limit: u64, stats: impl Fn() -> Stats + Sync, work: impl FnOnce() -> T) -> (T, Samples) {
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        let sampler = s.spawn(|| sample(&stop, limit, &stats));
        let stopping = SetOnDrop(&stop);
        let out = work();
        drop(stopping);
        (out, sampler.join().unwrap())
    })
}

fn stat_line(s: &Stats) -> String {
    format!(
        "pin_budget={} pinned_bytes_peak={} pinned_bytes={} unpins={} unpins_cold={} registration_retries={} \
         pin_wait_ns={} chunks_registered={} registration_round_trips={} unregister_queue_depth={} fork_mode={}",
        s.pin_budget,
        s.pinned_bytes_peak,
        s.pinned_bytes,
        s.unpins,
        s.unpins_cold,
        s.registration_retries,
        s.pin_wait_ns,
        s.chunks_registered,
        s.registration_round_trips,
        s.unregister_queue_depth,
        s.fork_mode,
    )
}

/// Lowers RLIMIT_MEMLOCK to `memlock` bytes and drops root for good (groups,
/// gid, uid; the capabilities go with the uid), before anything touches RDMA.
fn limit_memlock_and_drop_root(memlock: u64) {
    let os = io::Error::last_os_error;
    // SAFETY (all): plain system calls on this process.
    unsafe {
        assert_eq!(libc::geteuid(), 0, "the test must start as root (the rxe guest runs it as root)");
        let limit = libc::rlimit { rlim_cur: memlock, rlim_max: memlock };
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit), 0, "setrlimit: {}", os());
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0, "setgroups: {}", os());
        assert_eq!(libc::setgid(NOBODY), 0, "setgid: {}", os());
        assert_eq!(libc::setuid(NOBODY), 0, "setuid: {}", os());
        assert_ne!(libc::getuid(), 0);
        assert_ne!(libc::geteuid(), 0);
        assert_ne!(libc::getegid(), 0);
        // Root is gone for good: it cannot be taken back, nor the limit raised.
        assert_ne!(libc::setuid(0), 0, "setuid(0) succeeded after dropping root");
        let raised = libc::rlimit { rlim_cur: 2 * memlock, rlim_max: 2 * memlock };
        assert_ne!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised), 0, "RLIMIT_MEMLOCK could be raised");
        let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut now), 0);
        assert_eq!((now.rlim_cur, now.rlim_max), (memlock, memlock));
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cap_eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(str::trim);
    assert_eq!(cap_eff, Some("0000000000000000"), "capabilities left after dropping root");
}

/// The budget a default config gets from the 64 MiB limit: below it, by no more than the control buffers.
fn assert_budget_from_memlock(side: &str, budget: u64) {
    assert!(
        (MEMLOCK - 2 * MIB..=MEMLOCK).contains(&budget),
        "{side}: pin_budget {budget} is not derived from the {MEMLOCK}-byte RLIMIT_MEMLOCK"
    );
}

/// The source's script: window 1 saves all `len` bytes of `ram`, a chunk per
/// save; then one page in eight is written again (`redirty`) and window 2
/// saves those, a page per save, while a sampler reads the stats under the
/// read lock (the lock is for `close`, which takes the source). Returns the
/// pages saved in window 2.
fn two_windows(source: &RwLock<Source>, ram: &mut GuestRam, len: u64, seed: u64) -> rdmamig::Result<u64> {
    let src = source.read().unwrap();
    src.iteration_begin()?;
    for off in (0..len).step_by(MIB as usize) {
        src.save(0, off, MIB)?;
    }
    src.iteration_end()?;
    drop(src);
    let pages = redirty(ram, len, seed);
    let src = source.read().unwrap();
    src.iteration_begin()?;
    for &off in &pages {
        src.save(0, off, PAGE)?;
    }
    src.iteration_end()?;
    Ok(pages.len() as u64)
}

fn source_stats(source: &RwLock<Source>) -> Stats {
    source.read().unwrap_or_else(|e| e.into_inner()).stats()
}

/// Child process: the destination of the non-root test. Reports `port N`, then `done ...`.
#[test]
#[ignore = "child process of a_guest_four_times_the_budget_migrates_within_it_as_non_root"]
fn budget_destination_child() {
    let Some(setting) = child_setting(DEST_CHILD_ENV) else { return };
    let seed: u64 = setting[0].parse().unwrap();
    limit_memlock_and_drop_root(MEMLOCK);
    let ram = GuestRam::new(GUEST_RAM, 0xAA);
    let (listener, port) = listen(&Config::default());
    println!("{REPORT}port {port}");
    let dest = Destination::accept(&listener, &one_block(&ram, GUEST_RAM), Some(Duration::from_secs(60))).unwrap();
    assert!(!dest.negotiated().pin_all);
    assert!(dest.negotiated().extensions);
    let budget = dest.stats().pin_budget;
    assert_budget_from_memlock("destination", budget);
    let start = Instant::now();
    let (end, samples) = sampled(MEMLOCK, || dest.stats(), || dest.wait_end(Some(Duration::from_secs(90))));
    let elapsed = start.elapsed();
    let stats = dest.stats();
    println!(
        "{REPORT}info destination wait_end {end:?} after {elapsed:?}; {}; {}",
        samples.describe(),
        stat_line(&stats)
    );
    assert_eq!(end.unwrap(), Ending::Completed);
    samples.assert_within("destination", budget);
    assert!(
        stats.pinned_bytes_peak <= budget,
        "destination: peak {} over the budget {budget}",
        stats.pinned_bytes_peak
    );
    assert!(stats.unpins > 0, "destination: the source unregistered nothing here: {stats:?}");
    drop(dest);
    check(&ram, GUEST_RAM, seed).unwrap_or_else(|e| panic!("destination RAM differs from the source's: {e}"));
    println!("{REPORT}done destination ram=identical");
}

/// Child process: the source of the non-root test. Reports `done ...`.
#[test]
#[ignore = "child process of a_guest_four_times_the_budget_migrates_within_it_as_non_root"]
fn budget_source_child() {
    let Some(setting) = child_setting(SOURCE_CHILD_ENV) else { return };
    let port: u16 = setting[0].parse().unwrap();
    let seed: u64 = setting[1].parse().unwrap();
    limit_memlock_and_drop_root(MEMLOCK);
    let mut ram = GuestRam::new(GUEST_RAM, 0);
    fill(&mut ram, GUEST_RAM, seed);
    let source = Source::connect(&rdma_ip(), port, &Config::default(), &one_block(&ram, GUEST_RAM)).unwrap();
    assert!(!source.negotiated().pin_all);
    assert!(source.negotiated().extensions);
    let budget = source.stats().pin_budget;
    assert_budget_from_memlock("source", budget);
    let source = RwLock::new(source);
    let start = Instant::now();
    let (windows, samples) =
        sampled(MEMLOCK, || source_stats(&source), || two_windows(&source, &mut ram, GUEST_RAM, seed));
    let source = source.into_inner().unwrap();
    let stats = source.stats();
    let closed = source.close();
    let elapsed = start.elapsed();
    println!(
        "{REPORT}info source windows {windows:?} (pages saved again), close {closed:?} after {elapsed:?}; {}; {}",
        samples.describe(),
        stat_line(&stats)
    );
    windows.unwrap();
    assert_eq!(closed.unwrap(), Ending::Completed);
    samples.assert_within("source", budget);
    assert!(stats.pinned_bytes_peak <= budget, "source: peak {} over the budget {budget}", stats.pinned_bytes_peak);
    assert!(stats.unpins > 0, "source: nothing was unpinned: {stats:?}");
    assert_eq!(stats.iterations, 2);
    println!("{REPORT}done source");
}

/// Acceptance: 256 MiB per side, 64 MiB RLIMIT_MEMLOCK, neither side root.
#[test]
fn a_guest_four_times_the_budget_migrates_within_it_as_non_root() {
    let exe = ChildExe::copy();
    let start = Instant::now();
    let mut dest = Peer::spawn(&exe.0, "pinning::budget_destination_child", DEST_CHILD_ENV, &SEED.to_string());
    let report = dest.next(Duration::from_secs(60));
    let port: u16 = report.strip_prefix("port ").and_then(|p| p.parse().ok()).expect("a port report");
    let mut source = Peer::spawn(&exe.0, "pinning::budget_source_child", SOURCE_CHILD_ENV, &format!("{port} {SEED}"));
    let (source_status, source_reports) = source.finish(CHILD_BOUND);
    let (dest_status, dest_reports) = dest.finish(CHILD_BOUND);
    println!("pinning non-root run: {:?}", start.elapsed());
    for r in source_reports.iter().chain(&dest_reports) {
        println!("  {r}");
    }
    assert!(source_status.success(), "the source child failed ({source_status}): {source_reports:?}");
    assert!(dest_status.success(), "the destination child failed ({dest_status}): {dest_reports:?}");
    assert!(source_reports.iter().any(|r| r == "done source"), "{source_reports:?}");
    assert!(dest_reports.iter().any(|r| r.starts_with("done destination")), "{dest_reports:?}");
}

/// Child process of `memlock_refusals_name_their_cause`, with a 64 KiB
/// RLIMIT_MEMLOCK and no root: as a source, connects (to a port nobody
/// listens on: it fails before its request) and reports `source KIND
/// MESSAGE`; then listens, reports `port N`, and reports `destination KIND
/// MESSAGE` once its accept gave up on the parent's request.
#[test]
#[ignore = "child process of memlock_refusals_name_their_cause"]
fn tiny_memlock_child() {
    if child_setting(TINY_MEMLOCK_CHILD_ENV).is_none() {
        return;
    }
    limit_memlock_and_drop_root(TINY_MEMLOCK);
    let ram = GuestRam::new(MIB, 0);
    let registry = one_block(&ram, MIB);
    let err = Source::connect(&rdma_ip(), 1, &Config::default(), &registry).err().expect("a source pinned its buffers");
    println!("{REPORT}source {:?} {}", err.kind, err.message);
    let (listener, port) = listen(&Config::default());
    println!("{REPORT}port {port}");
    let err = Destination::accept(&listener, &registry, Some(Duration::from_secs(10))).err().expect("accepted");
    println!("{REPORT}destination {:?} {}", err.kind, err.message);
}

/// Each report's words, and the source's error when the destination could not pin.
#[test]
fn memlock_refusals_name_their_cause() {
    // What names the limit and the ways out, on the side that hit it.
    let limit_words = ["RLIMIT_MEMLOCK (`ulimit -l`) is 64 KiB here", "CAP_IPC_LOCK", "`rdmamig doctor`"];
    let exe = ChildExe::copy();
    let mut child = Peer::spawn(&exe.0, "pinning::tiny_memlock_child", TINY_MEMLOCK_CHILD_ENV, "1");
    let report = child.next(Duration::from_secs(60));
    println!("tiny memlock: {report}");
    let source = report.strip_prefix("source Verbs ").unwrap_or_else(|| panic!("a Verbs error: {report}"));
    assert!(source.contains("registering a 512 KiB control buffer: ibv_reg_mr"), "{source}");
    for w in limit_words {
        assert!(source.contains(w), "{w:?} not in: {source}");
    }
    let report = child.next(Duration::from_secs(60));
    let port: u16 = report.strip_prefix("port ").and_then(|p| p.parse().ok()).expect("a port report");
    let ram = GuestRam::new(MIB, 0);
    let err = Source::connect(&rdma_ip(), port, &Config::default(), &one_block(&ram, MIB)).err().expect("admitted");
    println!("tiny memlock: the rejected source: {err}");
    assert_eq!(err.kind, ErrorKind::Connect, "{err}");
    for w in ["the destination's kernel refused to pin memory", "RLIMIT_MEMLOCK", "CAP_IPC_LOCK", "`rdmamig doctor`"] {
        assert!(err.message.contains(w), "{w:?} not in: {err}");
    }
    let report = child.next(Duration::from_secs(60));
    println!("tiny memlock: {report}");
    let destination = report.strip_prefix("destination Verbs ").unwrap_or_else(|| panic!("a Verbs error: {report}"));
    assert!(destination.contains("1 refused"), "{destination}");
    for w in limit_words {
        assert!(destination.contains(w), "{w:?} not in: {destination}");
    }
    let (status, rest) = child.finish(CHILD_BOUND);
    assert!(status.success(), "the child failed ({status}): {rest:?}");
}

fn dest_config() -> Config {
    Config { pin_budget: Some(DEST_BUDGET), ..Config::default() }
}

#[test]
fn a_destination_refuses_a_source_that_asks_past_its_budget() {
    let mut src_ram = GuestRam::new(RAM, 0);
    fill(&mut src_ram, RAM, SEED);
    let dst_ram = GuestRam::new(RAM, 0xAA);
    // QEMU's wire behaviour: nothing ever unregistered; one chunk per request, as the even
    // chunks are saved before the odd ones (consecutive chunks would share one registration).
    let src_config = Config { extensions: false, ..Config::default() };
    let (source, dest) = connect(&one_block(&src_ram, RAM), &src_config, one_block(&dst_ram, RAM), &dest_config());
    assert!(!source.negotiated().extensions);
    assert!(!source.negotiated().pin_all);
    assert_eq!(dest.stats().pin_budget, DEST_BUDGET);
    let start = Instant::now();
    let ((sent, closed, end), samples) = sampled(
        DEST_BUDGET,
        || dest.stats(),
        || {
            let sent = (|| -> rdmamig::Result<()> {
                source.iteration_begin()?;
                for off in (0..RAM).step_by(2 * MIB as usize).chain((MIB..RAM).step_by(2 * MIB as usize)) {
                    source.save(0, off, MIB)?;
                }
                source.iteration_end()
            })();
            let closed = source.close();
            let end = dest.wait_end(Some(Duration::from_secs(30)));
            (sent, closed, end)
        },
    );
    let stats = dest.stats();
    println!(
        "pinning refusal after {:?}: source saves {sent:?}, close {closed:?}; destination end {end:?}; \
         destination {}; {}",
        start.elapsed(),
        samples.describe(),
        stat_line(&stats)
    );
    let err = end.expect_err("the destination accepted a source past its budget");
    assert_eq!(err.kind, ErrorKind::PinBudget, "{err}");
    assert!(err.message.contains(&DEST_BUDGET.to_string()), "the message does not name the budget: {err}");
    let closed = closed.expect_err("the source completed although the destination refused it");
    println!("pinning refusal: the source failed with {:?}: {closed}", closed.kind);
    samples.assert_within("destination", DEST_BUDGET);
    assert!(stats.pinned_bytes_peak <= DEST_BUDGET, "destination peak {} over the budget", stats.pinned_bytes_peak);
    // It served the source up to its budget, and no further.
    assert_eq!(stats.pinned_bytes_peak, DEST_BUDGET, "the destination refused before its budget was full");
}

#[test]
fn an_rdmamig_source_plans_within_the_destination_budget() {
    // Source unlimited (root in the guest), destination 32 MiB: the source
    // must plan by the budget the destination announced.
    let mut src_ram = GuestRam::new(RAM, 0);
    fill(&mut src_ram, RAM, SEED);
    let dst_ram = GuestRam::new(RAM, 0xAA);
    let (source, dest) =
        connect(&one_block(&src_ram, RAM), &Config::default(), one_block(&dst_ram, RAM), &dest_config());
    assert!(source.negotiated().extensions);
    assert!(!source.negotiated().pin_all);
    assert_eq!(dest.stats().pin_budget, DEST_BUDGET);
    assert_eq!(source.stats().pin_budget, u64::MAX, "the source must be unlimited here (root in the guest)");
    let start = Instant::now();
    let ((windows, src_stats, closed, end), samples) = sampled(
        DEST_BUDGET,
        || dest.stats(),
        || {
            let source = RwLock::new(source);
            let windows = two_windows(&source, &mut src_ram, RAM, SEED);
            let source = source.into_inner().unwrap();
            let src_stats = source.stats();
            let closed = source.close();
            (windows, src_stats, closed, dest.wait_end(Some(Duration::from_secs(30))))
        },
    );
    let stats = dest.stats();
    println!(
        "pinning planned after {:?}: windows {windows:?}, close {closed:?}, destination end {end:?}\n  \
         destination {}; {}\n  source {}",
        start.elapsed(),
        samples.describe(),
        stat_line(&stats),
        stat_line(&src_stats)
    );
    windows.unwrap();
    assert_eq!(closed.unwrap(), Ending::Completed);
    assert_eq!(end.unwrap(), Ending::Completed);
    assert!(src_ram.bytes() == dst_ram.bytes(), "destination RAM differs from the source's");
    check(&dst_ram, RAM, SEED).unwrap();
    samples.assert_within("destination", DEST_BUDGET);
    assert!(stats.pinned_bytes_peak <= DEST_BUDGET, "destination peak {} over the budget", stats.pinned_bytes_peak);
    assert!(stats.unpins > 0, "the source unregistered nothing on the destination: {stats:?}");
    assert!(src_stats.unpins > 0, "{src_stats:?}");
}

#[test]
fn a_qemu_run_fits_the_sources_budget() {
    // Toward a QEMU-compatible destination one REGISTER_REQUEST registers a
    // run of consecutive chunks, and the run's chunks cannot be unpinned
    // before the writes its response allows are posted. With the whole RAM
    // saved in one call, the chunks queue up behind the first request: the
    // next run must still fit the source's budget (8 MiB: 4 chunks a run),
    // or the writes of its later chunks find nothing to unpin.
    const BUDGET: u64 = 8 * MIB;
    let mut src_ram = GuestRam::new(RAM, 0);
    fill(&mut src_ram, RAM, SEED);
    let dst_ram = GuestRam::new(RAM, 0xAA);
    let src_config = Config { pin_budget: Some(BUDGET), extensions: false, ..Config::default() };
    let dst_config = Config { extensions: false, ..Config::default() };
    let (source, dest) = connect(&one_block(&src_ram, RAM), &src_config, one_block(&dst_ram, RAM), &dst_config);
    source.iteration_begin().unwrap();
    source.save_ranges([SaveRange { block: 0, offset: 0, len: RAM }]).unwrap();
    source.iteration_end().unwrap();
    let stats = source.stats();
    assert_eq!(source.close().unwrap(), Ending::Unverified);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(30))).unwrap(), Ending::Unverified);
    assert!(src_ram.bytes() == dst_ram.bytes(), "destination RAM differs from the source's");
    assert!(stats.pinned_bytes_peak <= BUDGET, "source peak {} over its budget", stats.pinned_bytes_peak);
    // Runs, not one request per chunk.
    assert!(stats.registration_round_trips < RAM / MIB, "{stats:?}");
}

#[test]
fn a_source_keeps_its_own_budget() {
    // Source 32 MiB, destination unlimited (root in the guest, no budget
    // announced): the source's own budget is the only one that binds. (In the
    // other tests the source's registrations are a subset of the ones it
    // keeps on the destination, so its own budget never binds first.) Toward
    // a QEMU-compatible destination (no extensions) only the source's own
    // registrations can go: the destination keeps what it registered.
    for extensions in [true, false] {
        let mut src_ram = GuestRam::new(RAM, 0);
        fill(&mut src_ram, RAM, SEED);
        let dst_ram = GuestRam::new(RAM, 0xAA);
        let src_config = Config { pin_budget: Some(SOURCE_BUDGET), extensions, ..Config::default() };
        let dst_config = Config { extensions, ..Config::default() };
        let (source, dest) = connect(&one_block(&src_ram, RAM), &src_config, one_block(&dst_ram, RAM), &dst_config);
        assert_eq!(source.negotiated().extensions, extensions);
        assert!(!source.negotiated().pin_all);
        assert_eq!(source.stats().pin_budget, SOURCE_BUDGET);
        assert_eq!(dest.stats().pin_budget, u64::MAX, "the destination must be unlimited here (root in the guest)");
        let source = RwLock::new(source);
        let start = Instant::now();
        let (windows, samples) =
            sampled(SOURCE_BUDGET, || source_stats(&source), || two_windows(&source, &mut src_ram, RAM, SEED));
        let source = source.into_inner().unwrap();
        let src_stats = source.stats();
        let closed = source.close();
        let end = dest.wait_end(Some(Duration::from_secs(30)));
        let stats = dest.stats();
        println!(
            "pinning own budget (extensions {extensions}) after {:?}: windows {windows:?}, close {closed:?}, \
             destination end {end:?}\n  source {}; {}\n  destination {}",
            start.elapsed(),
            samples.describe(),
            stat_line(&src_stats),
            stat_line(&stats)
        );
        windows.unwrap();
        let ending = if extensions { Ending::Completed } else { Ending::Unverified };
        assert_eq!(closed.unwrap(), ending);
        assert_eq!(end.unwrap(), ending);
        assert!(src_ram.bytes() == dst_ram.bytes(), "destination RAM differs from the source's");
        check(&dst_ram, RAM, SEED).unwrap();
        samples.assert_within("source", SOURCE_BUDGET);
        assert!(
            src_stats.pinned_bytes_peak <= SOURCE_BUDGET,
            "source peak {} over its budget",
            src_stats.pinned_bytes_peak
        );
        assert!(src_stats.unpins > 0, "the source unpinned nothing: {src_stats:?}");
        // Its unpins unregister on an rdmamig destination too, so that stays small as well.
        assert_eq!(stats.unpins > 0, extensions, "{stats:?}");
    }
}
