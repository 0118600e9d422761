//! `rdmamig bench`: a synthetic guest migrated in rounds between two
//! processes (or hosts), as a hypervisor's pre-copy would: round 1 sends all
//! RAM, later rounds the pages the "guest" (a dirtier thread) changed
//! meanwhile, the final round the rest with the guest stopped. The source
//! sends the SHA-256 of its final RAM through the migration stream; the
//! destination compares its own.

use std::fs::File;
use std::io::{IsTerminal, Read as _};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rdmamig::{
    AuthKey, Config, Destination, Ending, Listener, LogLevel, PostcopyPhase, PostcopyProgress, Read, Source, StalePages,
};
use serde_json::{json, Value};
use zeroize::Zeroizing;

use crate::guest_ram::{splitmix64, Ram, PAGE};
use crate::vcpus::Vcpus;
use crate::{human, BenchArgs};

/// The port when ADDR has none.
pub const DEFAULT_PORT: u16 = 4444;
/// How often the progress bars are redrawn.
const TICK: Duration = Duration::from_millis(100);
/// A library error as this program says it: the message (the library's
/// `Display` starts with its enum's name, which means nothing to a user),
/// and for a missing device where to look.
fn said(e: &rdmamig::Error) -> String {
    match e.kind {
        rdmamig::ErrorKind::NoDevice => {
            format!("no RDMA device is usable here ({}); `rdmamig doctor` lists what there is", e.message)
        }
        _ => e.message.clone(),
    }
}

/// The first line of the migration stream: what the source migrates.
const HELLO: &str = "rdmamig-bench 1";
/// Bytes read from a key file at most: more than any key has.
const KEY_FILE_LIMIT: u64 = 64 << 10;

pub fn run(args: BenchArgs) -> ExitCode {
    let show = !args.json && std::io::stderr().is_terminal();
    // The library's errors come back as this program's results; its warnings would go unsaid.
    let warn = |level, message: &str| {
        if level == LogLevel::Warn {
            eprintln!("rdmamig bench: {message}");
        }
    };
    rdmamig::set_log_hook(Some(Box::new(warn)), LogLevel::Warn).expect("set before any connection");
    let result = match &args.listen {
        Some(listen) => destination(&args, listen, show),
        None => source(&args, args.dest.as_deref().unwrap_or_default(), show),
    };
    let (value, ok) = match result {
        Ok(outcome) => outcome,
        Err(e) => {
            let role = if args.listen.is_some() { "destination" } else { "source" };
            (json!({"role": role, "ending": "failed", "error": e}), false)
        }
    };
    if args.json {
        println!("{value}");
    } else {
        print_summary(&value);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::EXIT_FAIL)
    }
}

/// `ADDR[:PORT]`: a host name, an IPv4 address, or an IPv6 address (in
/// brackets when a port follows).
pub fn split_addr(s: &str) -> Result<(String, u16), String> {
    let bad_port = |p: &str| format!("{s:?}: {p:?} is not a port number");
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| format!("{s:?}: no closing ']'"))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host.to_owned(), p.parse().map_err(|_| bad_port(p))?)),
            None if after.is_empty() => Ok((host.to_owned(), DEFAULT_PORT)),
            None => Err(format!("{s:?}: expected ':PORT' after ']'")),
        };
    }
    match s.matches(':').count() {
        0 => Ok((s.to_owned(), DEFAULT_PORT)),
        1 => {
            let (host, p) = s.split_once(':').expect("one colon");
            Ok((host.to_owned(), p.parse().map_err(|_| bad_port(p))?))
        }
        // A bare IPv6 address.
        _ => Ok((s.to_owned(), DEFAULT_PORT)),
    }
    .and_then(|(h, p)| if h.is_empty() { Err(format!("{s:?}: no address")) } else { Ok((h, p)) })
}

/// Pages changed since the last `take`: one bit per page.
struct DirtyMap {
    words: Vec<AtomicU64>,
}

impl DirtyMap {
    fn new(pages: u64) -> Self {
        DirtyMap { words: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// After the page was written (Release: a `take` that sees the bit sees the write).
    fn set(&self, page: u64) {
        self.words[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::Release);
    }

    fn count(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.load(Ordering::Relaxed).count_ones())).sum()
    }

    /// The dirty bitmap, cleared: pages dirtied later are in the next one.
    fn take(&self) -> Vec<u64> {
        self.words.iter().map(|w| w.swap(0, Ordering::Acquire)).collect()
    }
}

/// The running guest: changes `rate` random pages per second until `stop`.
fn dirtier(ram: &Ram, dirty: &DirtyMap, rate: u64, seed: u64, stop: &AtomicBool, changed: &AtomicU64) {
    let mut rng = seed ^ 0xd1b5_4a32_d192_ed03;
    let start = Instant::now();
    let pages = ram.pages();
    while !stop.load(Ordering::Relaxed) {
        let due = (rate as f64 * start.elapsed().as_secs_f64()) as u64;
        while changed.load(Ordering::Relaxed) < due && !stop.load(Ordering::Relaxed) {
            let page = splitmix64(&mut rng) % pages;
            ram.fill_page(page, &mut rng);
            dirty.set(page);
            changed.fetch_add(1, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------------------
// Source.

fn gbits(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e9
    } else {
        0.0
    }
}

fn round_bar(show: bool, round: u32, final_round: bool, bytes: u64) -> ProgressBar {
    let target = if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(bytes), target);
    let style = ProgressStyle::with_template("{prefix:>8} [{bar:32}] {bytes:>10}/{total_bytes:<10} {msg}")
        .expect("a valid template")
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(if final_round { "final".to_string() } else { format!("round {round}") });
    bar
}

/// One round: `save` queues its pages inside an open window; the window is
/// closed while the bar follows `bytes_written`.
#[allow(clippy::too_many_arguments)]
fn run_round(
    source: &mut Source,
    dirty: &DirtyMap,
    show: bool,
    round: u32,
    final_round: bool,
    pages: u64,
    save: impl FnOnce(&Source) -> rdmamig::Result<()>,
) -> Result<Value, String> {
    let bytes = pages * PAGE;
    let bar = round_bar(show, round, final_round, bytes);
    let before = source.stats().bytes_written;
    let start = Instant::now();
    source.iteration_begin().map_err(|e| format!("round {round}: iteration_begin: {}", said(&e)))?;
    let source = &*source;
    let done = AtomicBool::new(false);
    let update = |bar: &ProgressBar| {
        let sent = source.stats().bytes_written - before;
        bar.set_position(sent.min(bytes));
        let secs = start.elapsed().as_secs_f64();
        bar.set_message(format!("{:6.2} Gbit/s  {:>8} dirty pages", gbits(sent, secs), dirty.count()));
    };
    let (result, secs) = std::thread::scope(|s| {
        let updater = s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                update(&bar);
                std::thread::park_timeout(TICK);
            }
        });
        let r = save(source).and_then(|()| source.iteration_end());
        let secs = start.elapsed().as_secs_f64();
        // Woken, not waited out: up to a TICK's sleep would join the round's
        // time, and in the final round the guest's downtime.
        done.store(true, Ordering::Relaxed);
        updater.thread().unpark();
        (r, secs)
    });
    result.map_err(|e| format!("round {round}: {}", said(&e)))?;
    let sent = source.stats().bytes_written - before;
    update(&bar);
    bar.finish();
    Ok(json!({
        "round": round,
        "final": final_round,
        "pages": pages,
        "bytes_written": sent,
        "seconds": secs,
        "gbit_per_s": gbits(sent, secs),
        "dirty_pages_after": dirty.count(),
    }))
}

fn source(args: &BenchArgs, addr: &str, show: bool) -> Result<(Value, bool), String> {
    let (host, port) = split_addr(addr)?;
    if args.size % PAGE != 0 {
        return Err(format!("--size must be a multiple of {PAGE} bytes"));
    }
    let config = Config { pin_all: args.pin_all, extensions: !args.qemu_compat, ..config(args)? };
    let ram = Ram::new(args.size)?;
    let pages = ram.pages();
    let mut rng = args.seed;
    for page in 0..pages {
        ram.fill_page(page, &mut rng);
    }
    let registry = ram.registry().map_err(|e| said(&e))?;
    if show {
        eprintln!(
            "rdmamig bench: {} guest to {host}:{port}, {}, dirty rate {} pages/s",
            human(args.size),
            if args.pin_all { "pin-all requested" } else { "dynamic registration" },
            args.dirty_rate
        );
    }

    let start = Instant::now();
    let mut source = Source::connect(&host, port, &config, &registry).map_err(|e| format!("connect: {}", said(&e)))?;
    let connect_secs = start.elapsed().as_secs_f64();
    let negotiated = source.negotiated();
    source
        .put(format!("{HELLO} size={} seed={}\n", args.size, args.seed).as_bytes())
        .map_err(|e| format!("put: {}", said(&e)))?;

    let dirty = DirtyMap::new(pages);
    let stop = AtomicBool::new(false);
    let changed = AtomicU64::new(0);
    let mut rounds = Vec::new();
    // Post-copy: the pages dirtied since they were last sent, once the guest stopped.
    let mut stale = None;
    let (final_secs, final_pages) = std::thread::scope(|s| -> Result<(f64, u64), String> {
        let guest = (args.dirty_rate > 0)
            .then(|| s.spawn(|| dirtier(&ram, &dirty, args.dirty_rate, args.seed, &stop, &changed)));
        let stop_guest = || {
            stop.store(true, Ordering::Relaxed);
            if let Some(g) = guest {
                let _ = g.join();
            }
        };
        let mut round = 1;
        let r = run_round(&mut source, &dirty, show, round, false, pages, |src| src.save(0, 0, args.size));
        let r = r.and_then(|v| {
            rounds.push(v);
            loop {
                let waiting = dirty.count();
                let last = match args.postcopy_after {
                    Some(n) => round >= n,
                    None => waiting <= args.final_pages || round + 1 >= args.max_rounds,
                };
                if last {
                    return Ok(());
                }
                round += 1;
                let bitmap = dirty.take();
                let n = bitmap.iter().map(|w| u64::from(w.count_ones())).sum();
                rounds.push(run_round(&mut source, &dirty, show, round, false, n, |src| {
                    src.save_bitmap(0, &bitmap, 0, pages, PAGE)
                })?);
            }
        });
        // The guest stops (also when a round failed: the scope joins it).
        let stopped = Instant::now();
        stop_guest();
        r?;
        let bitmap = dirty.take();
        if args.postcopy_after.is_some() {
            let n = bitmap.iter().map(|w| u64::from(w.count_ones())).sum();
            stale = Some(bitmap);
            return Ok((0.0, n));
        }
        let n = bitmap.iter().map(|w| u64::from(w.count_ones())).sum();
        rounds.push(run_round(&mut source, &dirty, show, round + 1, true, n, |src| {
            src.save_bitmap(0, &bitmap, 0, pages, PAGE)
        })?);
        Ok((stopped.elapsed().as_secs_f64(), n))
    })?;
    // The guest is stopped: its RAM is final.
    let mut total_secs = start.elapsed().as_secs_f64();
    let digest = ram.sha256();
    let mut postcopy = Value::Null;
    let sent = source.put(format!("sha256 {digest}\n").as_bytes()).and_then(|()| {
        let Some(bitmap) = stale.take() else { return Ok(()) };
        // Always said (a test kills the source on it), on stderr.
        eprintln!("post-copy: the destination pulls {final_pages} stale pages");
        let started = Instant::now();
        let summary = source.postcopy(&[StalePages { block: 0, bitmap }])?;
        total_secs = start.elapsed().as_secs_f64();
        postcopy = json!({
            "pages": summary.pages,
            "faults_served": summary.faults,
            "bytes_pulled": summary.bytes,
            "seconds": started.elapsed().as_secs_f64(),
        });
        Ok(())
    });
    let stats = source.stats();
    let end = sent.and_then(|()| source.close());
    let (ending, error) = match end {
        Ok(Ending::Completed) => ("completed", None),
        Ok(Ending::Unverified) => ("unverified", None),
        Err(e) => ("failed", Some(format!("close: {}", said(&e)))),
    };
    drop(registry);
    let ok = error.is_none();
    let value = json!({
        "role": "source",
        "destination": format!("{host}:{port}"),
        "size_bytes": args.size,
        "pages": pages,
        "seed": args.seed,
        "dirty_rate": args.dirty_rate,
        "pin_all": negotiated.pin_all,
        "pin_all_requested": args.pin_all,
        "extensions": negotiated.extensions,
        "authenticated": negotiated.authenticated,
        "rounds": rounds.len(),
        "round_details": rounds,
        "pages_dirtied": changed.load(Ordering::Relaxed),
        "connect_seconds": connect_secs,
        "total_seconds": total_secs,
        "final_round_seconds": args.postcopy_after.is_none().then_some(final_secs),
        "final_round_pages": args.postcopy_after.is_none().then_some(final_pages),
        "postcopy_after": args.postcopy_after,
        "postcopy_stale_pages": args.postcopy_after.is_some().then_some(final_pages),
        "postcopy": postcopy,
        "bytes_written": stats.bytes_written,
        "gbit_per_s": gbits(stats.bytes_written, total_secs),
        "zero_chunks": stats.zero_chunks,
        "registration_round_trips": stats.registration_round_trips,
        "pinned_bytes_peak": stats.pinned_bytes_peak,
        "stream_bytes": stats.stream_bytes,
        "sha256": digest,
        "ending": ending,
        "error": error,
    });
    Ok((value, ok))
}

// ---------------------------------------------------------------------------
// Destination.

fn destination(args: &BenchArgs, listen: &str, show: bool) -> Result<(Value, bool), String> {
    let (host, port) = split_addr(listen)?;
    // Allows pin-all; the source decides.
    let config = Config { pin_all: true, extensions: !args.qemu_compat, ..config(args)? };
    // Shared with the vCPU threads, which may outlive a failed post-copy (blocked on a page).
    let ram = Arc::new(Ram::new(args.size)?);
    let registry = ram.registry().map_err(|e| said(&e))?;
    let listener =
        Listener::bind(&host, port, &config).map_err(|e| format!("listen on {host}:{port}: {}", said(&e)))?;
    // Always said (tests wait for it), on stderr: stdout is the result's.
    eprintln!("rdmamig bench: listening on {host}:{}, guest {}", listener.port(), human(args.size));
    let dest = Destination::accept(&listener, &registry, None).map_err(|e| format!("accept: {}", said(&e)))?;
    let start = Instant::now();
    let negotiated = dest.negotiated();

    let spinner = if show { ProgressBar::new_spinner() } else { ProgressBar::hidden() };
    spinner.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("a valid template"));
    let mut vcpus = Vcpus::new(ram.clone(), args.vcpus);
    let mut postcopy_bar: Option<ProgressBar> = None;
    let (stream, ending, vcpus, postcopy_time) = std::thread::scope(|s| {
        let reader = s.spawn(|| read_stream(&dest));
        // The hypervisor's part: the vCPUs run from the moment post-copy does
        // (never before), and stop once every page is in (this program's choice).
        let dest = &dest;
        let pilot = s.spawn(move || {
            let running = dest.wait_postcopy(PostcopyPhase::Running, None).ok()?;
            // Always said (a test kills the source on it), on stderr.
            eprintln!("post-copy: running, {} stale pages", running.pages_total);
            let started = Instant::now();
            vcpus.start();
            let done = dest.wait_postcopy(PostcopyPhase::Done, None);
            vcpus.stop();
            Some((vcpus, done.ok().map(|_| started.elapsed().as_secs_f64())))
        });
        while !reader.is_finished() {
            let pc = dest.postcopy_progress();
            if pc.phase == PostcopyPhase::Idle {
                let st = dest.stats();
                spinner.set_message(format!(
                    "receiving: {} windows done, {} registered, {} pinned",
                    dest.iterations(),
                    st.chunks_registered,
                    human(st.pinned_bytes)
                ));
                spinner.tick();
            } else {
                let bar = postcopy_bar.get_or_insert_with(|| {
                    spinner.finish_and_clear();
                    postcopy_bar_for(show, pc.pages_total)
                });
                update_postcopy_bar(bar, &pc);
            }
            std::thread::sleep(TICK);
        }
        let (stream, ending) = reader.join().expect("the stream reader does not panic");
        // The pilot ends with the connection (wait_postcopy fails once it has ended).
        match pilot.join().expect("the vCPU pilot does not panic") {
            Some((vcpus, secs)) => (stream, ending, Some(vcpus), secs),
            None => (stream, ending, None, None),
        }
    });
    spinner.finish_and_clear();
    let postcopy = dest.postcopy_progress();
    if let Some(bar) = postcopy_bar {
        update_postcopy_bar(&bar, &postcopy);
        bar.finish();
    }
    let secs = start.elapsed().as_secs_f64();
    let stats = dest.stats();
    let windows = dest.iterations();
    dest.close();
    drop(dest);
    drop(registry);

    let text = String::from_utf8_lossy(&stream);
    let hello = text.lines().next().unwrap_or_default().to_owned();
    let expected = text.lines().find_map(|l| l.strip_prefix("sha256 ")).map(str::to_owned);
    let (ending, mut error) = match ending {
        Ok(Ending::Completed) => ("completed", None),
        Ok(Ending::Unverified) => ("unverified", None),
        Err(e) => ("failed", Some(said(&e))),
    };
    if error.is_none() && !hello.starts_with(HELLO) {
        error = Some(format!("the stream does not start with {HELLO:?}: {hello:?}"));
    }
    if error.is_none() && postcopy.phase == PostcopyPhase::Running {
        error = Some("the connection ended with post-copy unfinished".into());
    }
    // Only with every page present (a failed post-copy leaves some missing).
    let digest = error.is_none().then(|| ram.sha256());
    let identical = matches!((&digest, &expected), (Some(d), Some(e)) if d == e);
    if error.is_none() && !identical {
        error = Some(match expected {
            None => "the source sent no SHA-256".into(),
            Some(_) => "the guest RAM differs from the source's (SHA-256 mismatch)".into(),
        });
    }
    let value = json!({
        "role": "destination",
        "listen": format!("{host}:{}", listener.port()),
        "size_bytes": args.size,
        "source": hello,
        "pin_all": negotiated.pin_all,
        "extensions": negotiated.extensions,
        "authenticated": negotiated.authenticated,
        "windows": windows,
        "seconds": secs,
        "chunks_registered": stats.chunks_registered,
        "zero_chunks": stats.zero_chunks,
        "registration_round_trips": stats.registration_round_trips,
        "pinned_bytes_peak": stats.pinned_bytes_peak,
        "stream_bytes": stats.stream_bytes,
        "postcopy": (postcopy.phase != PostcopyPhase::Idle).then(|| json!({
            "pages": postcopy.pages_total - postcopy.pages_remaining,
            "stale_pages": postcopy.pages_total,
            "pages_remaining": postcopy.pages_remaining,
            "faults_served": postcopy.faults_served,
            "pages_skipped": postcopy.pages_skipped,
            "bytes_pulled": postcopy.bytes_pulled,
            "recoveries": postcopy.recoveries,
            "seconds": postcopy_time,
            "vcpus": args.vcpus,
            "vcpu_reads": vcpus.as_ref().map_or(0, Vcpus::reads),
            "vcpus_paused": Vcpus::paused(),
        })),
        "sha256_expected": expected,
        "sha256": digest,
        "identical": identical,
        "ending": ending,
        "error": error,
    });
    let ok = value["error"].is_null();
    Ok((value, ok))
}

/// What both sides take from the command line.
fn config(args: &BenchArgs) -> Result<Config, String> {
    Ok(Config {
        postcopy_recovery: args.postcopy_recovery.map(|s| Duration::from_secs(s.into())),
        auth_key: args.key_file.as_deref().map(read_key).transpose()?,
        ..Config::default()
    })
}

/// The pre-shared key in `path`: the file's bytes as they are, from a file
/// only its owner may read or write (like ssh's private keys). The bytes
/// read are wiped once the key has its own copy.
fn read_key(path: &Path) -> Result<AuthKey, String> {
    let refused = |why: String| format!("--key-file {}: {why}", path.display());
    let mut file = File::open(path).map_err(|e| refused(e.to_string()))?;
    let mode = file.metadata().map_err(|e| refused(e.to_string()))?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(refused(format!("group or others may access it (mode {:o}): chmod 600 it", mode & 0o777)));
    }
    // Room for all it may read: the vector never moves (leaving a copy behind).
    let mut key = Zeroizing::new(Vec::with_capacity(KEY_FILE_LIMIT as usize + 1));
    file.by_ref().take(KEY_FILE_LIMIT).read_to_end(&mut key).map_err(|e| refused(e.to_string()))?;
    AuthKey::new(&key).map_err(|e| refused(e.message))
}

fn postcopy_bar_for(show: bool, pages: u64) -> ProgressBar {
    let target = if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(pages), target);
    let style =
        ProgressStyle::with_template("post-copy [{bar:32}] {msg}").expect("a valid template").progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// The bar fills as pages arrive; the message says how many remain.
fn update_postcopy_bar(bar: &ProgressBar, pc: &PostcopyProgress) {
    bar.set_position(pc.pages_total.saturating_sub(pc.pages_remaining));
    bar.set_message(format!(
        "{:>8} pages remaining, {} faults served, {} pulled",
        pc.pages_remaining,
        pc.faults_served,
        human(pc.bytes_pulled)
    ));
}

/// Every stream byte, and how the connection ended.
fn read_stream(dest: &Destination) -> (Vec<u8>, rdmamig::Result<Ending>) {
    let mut stream = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match dest.get(&mut buf, None) {
            Ok(Read::Bytes(n)) => stream.extend_from_slice(&buf[..n]),
            Ok(Read::End(ending)) => return (stream, Ok(ending)),
            Err(e) => return (stream, Err(e)),
        }
    }
}

// ---------------------------------------------------------------------------
// The human summary.

fn print_summary(v: &Value) {
    let num = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let int = |k: &str| v[k].as_u64().unwrap_or(0);
    let err = v["error"].as_str();
    match v["role"].as_str() {
        Some("source") if v.get("rounds").is_some() => {
            println!("rdmamig bench summary (source)");
            println!(
                "  guest              {} ({} pages), seed {}",
                human(int("size_bytes")),
                int("pages"),
                int("seed")
            );
            println!(
                "  mode               {}, extensions {}",
                if v["pin_all"].as_bool() == Some(true) { "pin-all" } else { "dynamic registration" },
                if v["extensions"].as_bool() == Some(true) { "on" } else { "off (QEMU's protocol)" }
            );
            print_authenticated(v);
            println!("  total time         {:.3} s (connect {:.3} s)", num("total_seconds"), num("connect_seconds"));
            println!(
                "  rounds             {} ({} pages dirtied at {} pages/s)",
                int("rounds"),
                int("pages_dirtied"),
                int("dirty_rate")
            );
            println!("  bytes written      {} ({})", int("bytes_written"), human(int("bytes_written")));
            println!("  throughput         {:.2} Gbit/s", num("gbit_per_s"));
            if v["postcopy_after"].is_null() {
                println!("  final round        {}", final_round(num("final_round_seconds"), int("final_round_pages")));
            } else {
                print_postcopy(&v["postcopy"], int("postcopy_stale_pages"));
            }
            println!("  zero chunks        {}", int("zero_chunks"));
            println!("  registration RTTs  {}", int("registration_round_trips"));
            println!(
                "  pinned peak        {}",
                pinned_peak(int("pinned_bytes_peak"), int("size_bytes"), !v["postcopy_after"].is_null())
            );
            println!("  sha256             {}", v["sha256"].as_str().unwrap_or("-"));
            println!("  ending             {}", v["ending"].as_str().unwrap_or("-"));
        }
        Some("destination") if v.get("windows").is_some() => {
            println!("rdmamig bench summary (destination)");
            println!("  guest              {}", human(int("size_bytes")));
            print_authenticated(v);
            println!("  windows            {} in {:.3} s", int("windows"), num("seconds"));
            println!("  chunks registered  {}, zero chunks {}", int("chunks_registered"), int("zero_chunks"));
            println!("  pinned peak        {}", human(int("pinned_bytes_peak")));
            let pc = &v["postcopy"];
            if !pc.is_null() {
                print_postcopy(pc, pc["stale_pages"].as_u64().unwrap_or(0));
                println!(
                    "  vCPU reads         {} by {} threads while post-copy ran",
                    pc["vcpu_reads"].as_u64().unwrap_or(0),
                    pc["vcpus"].as_u64().unwrap_or(0)
                );
                let paused = pc["vcpus_paused"].as_u64().unwrap_or(0);
                if paused > 0 {
                    println!("  vCPUs paused       {paused} (SIGSEGV in guest RAM: post-copy failed)");
                }
            }
            println!("  sha256             {}", v["sha256"].as_str().unwrap_or("-"));
            println!("  source's sha256    {}", v["sha256_expected"].as_str().unwrap_or("-"));
            println!("  byte-identical     {}", if v["identical"].as_bool() == Some(true) { "yes" } else { "NO" });
            println!("  ending             {}", v["ending"].as_str().unwrap_or("-"));
        }
        _ => {}
    }
    if let Some(e) = err {
        eprintln!("rdmamig bench: {e}");
    }
}

/// The source's final round: the guest's downtime, from its stop to the
/// end of the last window, which costs a round trip even without a page.
fn final_round(secs: f64, pages: u64) -> String {
    let empty = if pages == 0 { ": an empty last window, one round trip" } else { "" };
    format!("{:.1} ms ({pages} pages, guest stopped{empty})", secs * 1e3)
}

/// The source's pinned peak: registrations at their most, as RLIMIT_MEMLOCK
/// counts them, so memory registered twice counts twice; post-copy registers
/// the stale pages' regions for reading while pre-copy's registrations of
/// the same memory are still held.
fn pinned_peak(peak: u64, guest: u64, postcopy: bool) -> String {
    let why = match (peak > guest, postcopy) {
        (false, _) => "",
        (true, true) => {
            " (as RLIMIT_MEMLOCK counts: post-copy's read registrations of the stale pages' regions on top of \
             pre-copy's, still held, of the same memory)"
        }
        (true, false) => " (as RLIMIT_MEMLOCK counts: memory registered twice counts twice)",
    };
    format!("{}{why}", human(peak))
}

/// Whether the peer proved the pre-shared key, on either side's summary.
fn print_authenticated(v: &Value) {
    let how = match v["authenticated"].as_bool() {
        Some(true) => "yes (pre-shared key)",
        _ => "no",
    };
    println!("  peer authenticated {how}");
}

/// The post-copy lines of either side's summary (`pc`: its "postcopy" object, null if it did not finish).
fn print_postcopy(pc: &Value, stale: u64) {
    let int = |k: &str| pc[k].as_u64().unwrap_or(0);
    println!("  post-copy pages    {} ({} stale)", int("pages"), stale);
    println!("  faults served      {}", int("faults_served"));
    println!("  bytes pulled       {} ({})", int("bytes_pulled"), human(int("bytes_pulled")));
    if let Some(n) = pc["recoveries"].as_u64() {
        println!("  recoveries         {n}");
    }
    match pc["seconds"].as_f64() {
        Some(secs) => println!("  post-copy time     {:.3} s", secs),
        None => println!("  post-copy time     -"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lines_explain_their_figures() {
        assert_eq!(final_round(0.1073, 337), "107.3 ms (337 pages, guest stopped)");
        assert_eq!(final_round(0.0043, 0), "4.3 ms (0 pages, guest stopped: an empty last window, one round trip)");
        assert_eq!(pinned_peak(64 << 20, 64 << 20, true), "64 MiB");
        let doubled = pinned_peak((128 << 20) + 4096, 64 << 20, true);
        assert!(
            doubled.starts_with("128.0 MiB (as RLIMIT_MEMLOCK counts: post-copy's read registrations"),
            "{doubled}"
        );
        assert!(pinned_peak(65 << 20, 64 << 20, false).ends_with("memory registered twice counts twice)"));
    }

    #[test]
    fn said_gives_the_message_not_the_kind() {
        let e =
            rdmamig::Error::new(rdmamig::ErrorKind::NoDevice, "rdma_create_event_channel: No such device (errno 19)");
        assert_eq!(
            said(&e),
            "no RDMA device is usable here (rdma_create_event_channel: No such device (errno 19)); `rdmamig doctor` \
             lists what there is"
        );
        let e = rdmamig::Error::new(rdmamig::ErrorKind::Connect, "no listener on 198.18.0.1 port 1");
        assert_eq!(said(&e), "no listener on 198.18.0.1 port 1");
    }

    #[test]
    fn addresses() {
        assert_eq!(split_addr("198.18.0.1"), Ok(("198.18.0.1".into(), DEFAULT_PORT)));
        assert_eq!(split_addr("198.18.0.1:7000"), Ok(("198.18.0.1".into(), 7000)));
        assert_eq!(split_addr("host:0"), Ok(("host".into(), 0)));
        assert_eq!(split_addr("fe80::1"), Ok(("fe80::1".into(), DEFAULT_PORT)));
        assert_eq!(split_addr("[::1]:9"), Ok(("::1".into(), 9)));
        assert_eq!(split_addr("[::1]"), Ok(("::1".into(), DEFAULT_PORT)));
        assert!(split_addr("[::1").is_err());
        assert!(split_addr("a:b").is_err());
        assert!(split_addr(":5").is_err());
        assert!(split_addr("1.2.3.4:70000").is_err());
    }

    #[test]
    fn dirty_map() {
        let d = DirtyMap::new(130);
        d.set(0);
        d.set(129);
        d.set(129);
        assert_eq!(d.count(), 2);
        let words = d.take();
        assert_eq!(words, vec![1, 0, 2]);
        assert_eq!(d.count(), 0);
    }

    #[test]
    fn key_files() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir().join(format!("rdmamig-bench-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, mode: u32, bytes: &[u8]| {
            let path = dir.join(name);
            let _ = std::fs::remove_file(&path);
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&path).unwrap();
            std::io::Write::write_all(&mut f, bytes).unwrap();
            path
        };
        let refused = |path: &Path, words: &[&str]| {
            let e = read_key(path).map(drop).unwrap_err();
            assert!(words.iter().all(|w| e.contains(w)), "{words:?} not in: {e}");
        };
        let key = b"0123456789abcdef0123456789abcdef\n";
        assert_eq!(read_key(&file("own", 0o600, key)).unwrap(), AuthKey::new(key).unwrap(), "the bytes as they are");
        assert!(read_key(&file("read-only", 0o400, key)).is_ok());
        refused(&file("group", 0o640, key), &["--key-file", "group", "mode 640", "chmod 600"]);
        refused(&file("others", 0o604, key), &["mode 604"]);
        refused(&file("short", 0o600, &key[..15]), &["16 to 1024", "not 15"]);
        refused(&file("long", 0o600, &[7; 1025]), &["not 1025"]);
        refused(&dir.join("missing"), &["missing"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
