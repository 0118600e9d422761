//! Kill points: one side of an rdmamig <-> rdmamig migration is SIGKILLed at a
//! known point of the source's script, in pin-all and in dynamic mode. The
//! survivor must never report a completed migration.
//!
//! The killed side runs as a child process (`child.rs`: this test binary
//! re-executed on one ignored test). The child reports on its stdout, one
//! `REPORT ...` line at a time, so the parent knows exactly where it is.
//!
//! - `source_killed_at_every_point`: the child is the source; it reports the
//!   point it reached and then blocks (sleeps) until the parent, the
//!   destination, kills it; at `in-close` it reports and then calls `close`.
//!   The destination must report a failure (never `Ending::Completed`) within
//!   5 s of the kill.
//! - `destination_killed_at_every_point`: the child is the destination; the
//!   parent, the source, kills it when its script reaches the point, runs the
//!   rest of the script ignoring errors, and `close` must fail.

use std::path::Path;
use std::process::ExitStatus;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, Ending, Error, Read, Result, Source};

use crate::child::{bounded, child_setting, kill, ChildExe, Peer, REPORT};
use crate::migration::{listen, rdma_ip, Layout, PAGE};

const MIB: u64 = 1 << 20;
const RAM: u64 = 16 * MIB;
/// Device state held back in the last window, so that `close` has to send it.
const CLOSE_STREAM: usize = 32 << 20;
/// How long after the child's `in-close` report the parent kills.
const CLOSE_KILL_DELAY: Duration = Duration::from_millis(25);
/// The destination must report the failure within this time of the kill.
const REPORT_BOUND: Duration = Duration::from_secs(5);
/// A run (one point, one mode) that takes longer than this has hung.
const RUN_BOUND: Duration = Duration::from_secs(60);

const SOURCE_CHILD_ENV: &str = "RDMAMIG_KILLPOINT_SOURCE";
const DEST_CHILD_ENV: &str = "RDMAMIG_KILLPOINT_DEST";
const IN_CLOSE: &str = "in-close";

/// Every point, in the order the source's script reaches them.
const POINTS: &[&str] = &[
    // Source::connect returned, nothing else done.
    "connected",
    // The first window is open (iteration_begin), nothing saved yet.
    "window-opened",
    // One page saved: the transfer thread runs the RAM-blocks exchange.
    "first-save",
    // Inside the first window, a quarter of RAM saved.
    "first-window-saves",
    // Between windows: the first window ended (iteration_end returned).
    "between-windows",
    // Inside the third window, after some saves.
    "later-window",
    // Every RAM window ended, no device state yet.
    "windows-done",
    // Device state streaming: 1 MiB put and flushed.
    "streaming",
    // 3 MiB more put, not flushed (whole pieces already queued).
    "streaming-unflushed",
    // The last window open with saves, the last put (32 MiB, held back by the window) done; close not called.
    "after-last-put",
    // Inside close: it ends the window, sends the 32 MiB, then END.
    IN_CLOSE,
];

fn config(pin_all: bool) -> Config {
    Config { pin_all, timeout: Duration::from_secs(10), ..Config::default() }
}

fn mode(pin_all: bool) -> &'static str {
    if pin_all {
        "pin-all"
    } else {
        "dynamic"
    }
}

fn layout() -> Layout {
    Layout { blocks: vec![("pc.ram", RAM, vec![])] }
}

/// The source's script, with a hook at every kill point.
struct Script<'a> {
    /// Called at each point; returns true once the peer has been (or is being) killed.
    at: &'a mut dyn FnMut(&'static str) -> bool,
    killed: bool,
    /// The first call that failed after the kill, and when.
    first_error: Option<(Instant, &'static str, Error)>,
}

impl Script<'_> {
    fn new(at: &mut dyn FnMut(&'static str) -> bool) -> Script<'_> {
        Script { at, killed: false, first_error: None }
    }

    fn point(&mut self, point: &'static str) {
        if (self.at)(point) {
            self.killed = true;
        }
    }

    /// Before the kill every call must succeed; after it errors are expected and ignored.
    fn check(&mut self, what: &'static str, r: Result<()>) {
        if let Err(e) = r {
            assert!(self.killed, "{what} failed before any kill: {e}");
            if self.first_error.is_none() {
                self.first_error = Some((Instant::now(), what, e));
            }
        }
    }

    fn save_pages(&mut self, source: &Source, from: u64, to: u64) {
        for off in (from..to).step_by(PAGE as usize) {
            self.check("save", source.save(0, off, PAGE));
        }
    }

    fn window(&mut self, source: &mut Source, from: u64, to: u64) {
        self.check("iteration_begin", source.iteration_begin());
        self.save_pages(source, from, to);
        self.check("iteration_end", source.iteration_end());
    }

    fn run(&mut self, mut source: Source) -> Result<Ending> {
        let stream: Vec<u8> = (0..CLOSE_STREAM as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        self.point("connected");
        self.check("iteration_begin", source.iteration_begin());
        self.point("window-opened");
        self.check("save", source.save(0, 0, PAGE));
        self.point("first-save");
        self.save_pages(&source, PAGE, RAM / 4);
        self.point("first-window-saves");
        self.save_pages(&source, RAM / 4, RAM);
        self.check("iteration_end", source.iteration_end());
        self.point("between-windows");
        self.window(&mut source, 0, 2 * MIB);
        self.check("iteration_begin", source.iteration_begin());
        self.save_pages(&source, 2 * MIB, 6 * MIB);
        self.point("later-window");
        self.save_pages(&source, 6 * MIB, 10 * MIB);
        self.check("iteration_end", source.iteration_end());
        self.point("windows-done");
        self.check("put", source.put(&stream[..MIB as usize]));
        self.check("flush", source.flush());
        self.point("streaming");
        self.check("put", source.put(&stream[MIB as usize..4 * MIB as usize]));
        self.point("streaming-unflushed");
        self.check("iteration_begin", source.iteration_begin());
        self.save_pages(&source, 10 * MIB, 12 * MIB);
        self.check("put", source.put(&stream));
        self.point("after-last-put");
        self.point(IN_CLOSE);
        source.close()
    }
}

/// Runs as a separate process: a source that reports the point it reached and blocks there.
#[test]
#[ignore = "child process of source_killed_at_every_point"]
fn source_child() {
    let Some(setting) = child_setting(SOURCE_CHILD_ENV) else { return };
    let port: u16 = setting[0].parse().unwrap();
    let target = setting[1].clone();
    let pin_all: bool = setting[2].parse().unwrap();
    let layout = layout();
    let ram = layout.source_ram(21);
    let source = Source::connect(&rdma_ip(), port, &config(pin_all), &layout.registry(&ram, 1 << 40)).unwrap();
    assert_eq!(source.negotiated().pin_all, pin_all);
    let mut at = |point: &'static str| {
        if point == target {
            println!("{REPORT}reached {point}");
            if point != IN_CLOSE {
                thread::sleep(Duration::from_secs(120));
                panic!("the parent test should have killed this process at {point}");
            }
        }
        false
    };
    let closed = Script::new(&mut at).run(source);
    // Only reached if the kill came too late: the parent shows this report.
    println!("{REPORT}close returned {closed:?}");
    thread::sleep(Duration::from_secs(120));
    panic!("the parent test should have killed this process in close");
}

/// Runs as a separate process: a destination that serves until killed.
#[test]
#[ignore = "child process of destination_killed_at_every_point"]
fn destination_child() {
    let Some(setting) = child_setting(DEST_CHILD_ENV) else { return };
    let pin_all: bool = setting[0].parse().unwrap();
    let layout = layout();
    let ram = layout.dest_ram();
    let (listener, port) = listen(&config(pin_all));
    println!("{REPORT}port {port}");
    let dest = Destination::accept(&listener, &layout.registry(&ram, 0), Some(Duration::from_secs(60))).unwrap();
    println!("{REPORT}accepted");
    // Only returns if the kill came too late (or never): the parent shows this report.
    let end = dest.wait_end(None);
    println!("{REPORT}wait_end returned {end:?}");
    thread::sleep(Duration::from_secs(120));
    panic!("the parent test should have killed this process");
}

fn describe(r: &Result<impl std::fmt::Debug>) -> String {
    match r {
        Ok(v) => format!("Ok({v:?})"),
        Err(e) => format!("Err({:?}: {})", e.kind, e.message),
    }
}

/// The parent is the destination; the child source is killed at `point`.
fn kill_source_at(exe: &Path, point: &'static str, pin_all: bool) -> String {
    let config = config(pin_all);
    let layout = layout();
    let ram = layout.dest_ram();
    let (listener, port) = listen(&config);
    let mut peer = Peer::spawn(exe, "killpoints::source_child", SOURCE_CHILD_ENV, &format!("{port} {point} {pin_all}"));
    let dest = Destination::accept(&listener, &layout.registry(&ram, 0), Some(Duration::from_secs(60))).unwrap();
    assert_eq!(dest.negotiated().pin_all, pin_all);
    assert!(dest.negotiated().extensions);
    peer.expect(&format!("reached {point}"));
    if point == IN_CLOSE {
        thread::sleep(CLOSE_KILL_DELAY);
    }
    let killed = peer.kill();
    let end = dest.wait_end(Some(Duration::from_secs(30)));
    let reported = killed.elapsed();
    let stats = dest.stats();
    let late = peer.rest();
    let line = format!(
        "killpoint source-killed {point:<19} {:<7} destination wait_end: {} after {reported:?} \
         (windows {}, stream bytes {})",
        mode(pin_all),
        describe(&end),
        stats.iterations,
        stats.stream_bytes,
    );
    println!("{line}");
    assert!(
        end.is_err(),
        "{point}, {}: the destination reported {end:?} for a killed source (child: {late:?})",
        mode(pin_all)
    );
    assert!(reported < REPORT_BOUND, "{point}, {}: the destination reported only after {reported:?}", mode(pin_all));
    // The stream drains, then ends with the same failure, never with an Ending.
    let mut buf = vec![0u8; 4 << 20];
    loop {
        match dest.get(&mut buf, Some(Duration::from_secs(10))) {
            Ok(Read::Bytes(_)) => {}
            Ok(Read::End(e)) => panic!("{point}, {}: get reported the end {e:?} for a killed source", mode(pin_all)),
            Err(e) => {
                assert_eq!(Some(&e), end.as_ref().err(), "get and wait_end disagree");
                break;
            }
        }
    }
    assert!(dest.error().is_some());
    line
}

/// The parent is the source; the child destination is killed when the script reaches `point`.
fn kill_destination_at(exe: &Path, point: &'static str, pin_all: bool) -> String {
    let config = config(pin_all);
    let layout = layout();
    let ram = layout.source_ram(22);
    let mut peer = Peer::spawn(exe, "killpoints::destination_child", DEST_CHILD_ENV, &pin_all.to_string());
    let report = peer.next(Duration::from_secs(60));
    let port: u16 = report.strip_prefix("port ").and_then(|p| p.parse().ok()).expect("a port report");
    let source = Source::connect(&rdma_ip(), port, &config, &layout.registry(&ram, 1 << 40)).unwrap();
    assert_eq!(source.negotiated().pin_all, pin_all);
    assert!(source.negotiated().extensions);
    peer.expect("accepted");

    let mut killed: Option<Instant> = None;
    let mut delayed: Option<JoinHandle<(Instant, ExitStatus)>> = None;
    let mut at = |p: &'static str| {
        if p != point {
            return killed.is_some() || delayed.is_some();
        }
        if p == IN_CLOSE {
            let child = peer.take();
            delayed = Some(thread::spawn(move || {
                thread::sleep(CLOSE_KILL_DELAY);
                kill(child)
            }));
        } else {
            killed = Some(peer.kill());
        }
        true
    };
    let mut script = Script::new(&mut at);
    let closed = script.run(source);
    let returned = Instant::now();
    let first_error = script.first_error.take();
    let killed = killed.unwrap_or_else(|| delayed.take().expect("the point was never reached").join().unwrap().0);
    let late = peer.rest();
    let first = match &first_error {
        Some((t, what, e)) => {
            format!("first error {:?} after the kill, in {what}: {e}", t.saturating_duration_since(killed))
        }
        None => "no error before close".to_string(),
    };
    let line = format!(
        "killpoint destination-killed {point:<19} {:<7} source close: {} {:?} after the kill; {first}",
        mode(pin_all),
        describe(&closed),
        returned.saturating_duration_since(killed),
    );
    println!("{line}");
    assert!(
        closed.is_err(),
        "{point}, {}: close returned {closed:?} with the destination killed (child: {late:?})",
        mode(pin_all)
    );
    line
}

/// Runs `run` for every point in both modes, each bounded; prints a summary.
fn every_point(direction: &str, run: fn(&Path, &'static str, bool) -> String) {
    let exe = std::sync::Arc::new(ChildExe::copy());
    let start = Instant::now();
    let mut lines = Vec::new();
    for pin_all in [true, false] {
        for &point in POINTS {
            let what = format!("{direction}, {point}, {}", mode(pin_all));
            let exe = exe.clone();
            lines.push(bounded(RUN_BOUND, what, move || run(&exe.0, point, pin_all)));
        }
    }
    println!("killpoint summary, {direction}: {} runs in {:?}", lines.len(), start.elapsed());
    for line in lines {
        println!("  {line}");
    }
}

#[test]
fn source_killed_at_every_point() {
    every_point("source killed", kill_source_at);
}

#[test]
fn destination_killed_at_every_point() {
    every_point("destination killed", kill_destination_at);
}
