//! Load and concurrency: many migrations at once through one listener, and
//! the documented thread-safety rules exercised while transfers run.
//!
//! - `eight_sources_migrate_at_once_through_one_listener`: 8 source processes
//!   (`child.rs`) connect at the same moment to one `Listener` of this
//!   process, which accepts in a loop on one thread (while the first
//!   sources already transfer) and serves each connection on its own
//!   thread. Each source migrates its own pattern (two blocks, a full window,
//!   then, once all 8 are connected, 3 windows of re-dirtied pages; a
//!   stream), half of them with pin-all; every RAM image and stream arrives
//!   byte-identical and every migration ends `Completed`. A poller reads the
//!   8 destinations' stats meanwhile.
//! - `stats_polled_in_tight_loops_on_both_sides_never_go_backwards`: rule
//!   "`stats` from any thread" (both sides), under a pin budget so that the
//!   pinned gauge goes up and down while the counters may only grow.
//! - `source_abort_from_another_thread_unblocks_both_sides` and
//!   `destination_abort_from_another_thread_unblocks_both_sides`: rule
//!   "`abort` from any thread, while other calls run": the calls blocked on
//!   both sides return promptly with the abort or the peer's failure, an
//!   aborted source stops writing, the connection's fds and MRs are
//!   released, and the same listener then serves a new migration.
//! - `four_threads_save_disjoint_ranges_of_one_window`: rule "`save` may be
//!   called from several threads at once" (`Source`'s doc): 4 threads save
//!   interleaved stripes of the same chunks in each window, dynamic and
//!   pin-all.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, Ending, ErrorKind, Listener, RamBlocks, Read, Source, Stats, Unregistration};

use crate::child::{bounded, child_setting, ChildExe, Peer, REPORT};
use crate::migration::{connect, listen, live_mrs, open_fds, rdma_ip, read_stream, GuestRam, Layout, Rng, PAGE};

const MIB: u64 = 1 << 20;

/// Sources migrating at once in `eight_sources_migrate_at_once_through_one_listener`.
const SOURCES: u64 = 8;
/// Windows after the first (full) one, each re-sending the pages re-dirtied before it.
const ROUNDS: u64 = 3;
/// Stream header: tells the destination which source a connection is.
const HEADER_LEN: usize = 16;
const SOURCE_CHILD_ENV: &str = "RDMAMIG_LOAD_SOURCE";
/// The whole eight-source test, children included (it should take well under 90 s).
const EIGHT_BOUND: Duration = Duration::from_secs(240);
/// Any other test of this file.
const TEST_BOUND: Duration = Duration::from_secs(120);
/// Blocked calls must return this soon after an abort (the ERROR waits up to 1 s for a credit).
const ABORT_BOUND: Duration = Duration::from_secs(5);

/// Each source's guest: two blocks, with a zero region travelling as COMPRESS (dynamic mode).
fn load_layout() -> Layout {
    Layout { blocks: vec![("pc.ram", 32 * MIB, vec![(4 * MIB, 2 * MIB)]), ("vga.vram", 16 * MIB, vec![])] }
}

fn pin_all_for(index: u64) -> bool {
    index % 2 == 0
}

/// Every page of `layout`, as (block, offset).
fn all_pages(layout: &Layout) -> Vec<(u32, u64)> {
    let blocks = layout.blocks.iter().enumerate();
    blocks.flat_map(|(b, (_, len, _))| (0..*len).step_by(PAGE as usize).map(move |off| (b as u32, off))).collect()
}

/// Rewrites one page in sixteen (outside the zero regions, a different slice
/// for each `seed` and `round`) with a new pattern; returns those pages. Only
/// between windows: no transfer reads the RAM meanwhile.
fn redirty(layout: &Layout, ram: &[GuestRam], seed: u64, round: u64) -> Vec<(u32, u64)> {
    let mut rng = Rng::new(seed << 8 | round);
    let mut pages = Vec::new();
    for (b, (_, len, zeros)) in layout.blocks.iter().enumerate() {
        for off in (0..*len).step_by(PAGE as usize) {
            let page = off / PAGE;
            if (page + seed + round * 5) % 16 != 0 || zeros.iter().any(|&(z, zl)| off + PAGE > z && off < z + zl) {
                continue;
            }
            for word in (0..PAGE).step_by(8) {
                ram[b].write_u64(off + word, rng.next());
            }
            pages.push((b as u32, off));
        }
    }
    pages
}

/// What source `index` of the eight-source test holds at its end: its pattern, then every round's re-dirtying.
fn final_image(layout: &Layout, index: u64) -> Vec<GuestRam> {
    let ram = layout.source_ram(seed_of(index));
    for round in 1..=ROUNDS {
        redirty(layout, &ram, seed_of(index), round);
    }
    ram
}

fn seed_of(index: u64) -> u64 {
    0x10AD_0000 + index
}

/// A cheap digest of RAM contents, for the source process to report what it had.
fn digest(ram: &[GuestRam]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for block in ram {
        for word in block.bytes().chunks_exact(8) {
            h = (h ^ u64::from_le_bytes(word.try_into().unwrap())).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Source `index`'s device state: a header naming it, then its own bytes.
fn stream_of(index: u64) -> Vec<u8> {
    let mut rng = Rng::new(0x5712_EA00 + index);
    let mut s = format!("load source {index:3}\n").into_bytes();
    assert_eq!(s.len(), HEADER_LEN);
    s.extend((0..200_000 + index as usize * 4099).map(|_| rng.next() as u8));
    s
}

/// Where the first block-level difference between two RAM images is, if any.
fn first_difference(got: &[GuestRam], want: &[GuestRam]) -> Option<(usize, usize)> {
    got.iter().zip(want).enumerate().find_map(|(b, (g, w))| {
        let (g, w) = (g.bytes(), w.bytes());
        (g != w).then(|| (b, g.iter().zip(w).position(|(x, y)| x != y).unwrap_or(g.len().min(w.len()))))
    })
}

fn assert_same_ram(what: &str, got: &[GuestRam], want: &[GuestRam]) {
    if let Some((block, at)) = first_difference(got, want) {
        panic!("{what}: block {block} differs from the source's, first at offset {at:#x}");
    }
}

/// Saves `pages` one page per call.
fn save_pages(source: &Source, pages: &[(u32, u64)]) {
    for &(b, off) in pages {
        source.save(b, off, PAGE).unwrap();
    }
}

/// One window saving `pages`.
fn window(source: &mut Source, pages: &[(u32, u64)]) {
    source.iteration_begin().unwrap();
    save_pages(source, pages);
    source.iteration_end().unwrap();
}

/// Accepts on `listener` in a thread while a source over `src` connects to it.
fn connect_on(listener: &Listener, src: &RamBlocks, config: &Config, dst: &RamBlocks) -> (Source, Destination) {
    thread::scope(|s| {
        let dest = s.spawn(|| Destination::accept(listener, dst, Some(Duration::from_secs(30))).unwrap());
        let source = Source::connect(&rdma_ip(), listener.port(), config, src).unwrap();
        (source, dest.join().unwrap())
    })
}

/// The destination's end: the rest of the stream read, then `Completed` from
/// `wait_end` and from `get`.
fn assert_completed(dest: &Destination, stream: &[u8]) {
    assert!(read_stream(dest, stream.len()) == stream, "the stream differs");
    assert_eq!(dest.wait_end(Some(Duration::from_secs(60))).unwrap(), Ending::Completed);
    assert_eq!(dest.get(&mut [0u8; 1], Some(Duration::from_secs(10))).unwrap(), Read::End(Ending::Completed));
    assert!(dest.error().is_none(), "{:?}", dest.error());
}

/// Prints how long a test took when dropped, also when the test fails.
struct Took(&'static str, Instant);

impl Took {
    fn start(test: &'static str) -> Took {
        Took(test, Instant::now())
    }
}

impl Drop for Took {
    fn drop(&mut self) {
        println!("{} took {:?}", self.0, self.1.elapsed());
    }
}

// ---- stats pollers -------------------------------------------------------

/// The fields of `Stats` that only ever grow. The others are gauges
/// (pinned_bytes, unregister_queue_depth) or set once at connect (pin_budget,
/// cgroup_memory_limit, fork_mode).
fn counters(s: &Stats) -> [(&'static str, u64); 15] {
    [
        ("bytes_written", s.bytes_written),
        ("chunks_registered", s.chunks_registered),
        ("zero_chunks", s.zero_chunks),
        ("registration_round_trips", s.registration_round_trips),
        ("pinned_bytes_peak", s.pinned_bytes_peak),
        ("control_messages", s.control_messages),
        ("iterations", s.iterations),
        ("iteration_end_ns", s.iteration_end_ns),
        ("stream_bytes", s.stream_bytes),
        ("unpins", s.unpins),
        ("unpins_cold", s.unpins_cold),
        ("registration_retries", s.registration_retries),
        ("pin_wait_ns", s.pin_wait_ns),
        ("pin_all_progress_bytes", s.pin_all_progress_bytes),
        ("staged_bytes", s.staged_bytes),
    ]
}

/// What one poller saw of one connection.
#[derive(Debug, Default)]
struct Watch {
    last: Option<Stats>,
    reads: u64,
    /// Reads whose counters differed from the previous read's.
    changes: u64,
    /// Reads whose pinned_bytes differed from the previous read's (a gauge: it goes up and down).
    pinned_moves: u64,
}

impl Watch {
    fn see(&mut self, who: &str, conn: usize, now: Stats) {
        if let Some(last) = &self.last {
            for ((name, was), (_, is)) in counters(last).into_iter().zip(counters(&now)) {
                assert!(is >= was, "{who} {conn}: {name} went backwards from {was} to {is} (read {})", self.reads);
            }
            self.changes += u64::from(counters(last) != counters(&now));
            self.pinned_moves += u64::from(last.pinned_bytes != now.pinned_bytes);
        }
        self.reads += 1;
        self.last = Some(now);
    }

    /// The counters of `now`, read after the poller stopped, are not behind the poller's last read.
    fn not_behind(&self, who: &str, now: &Stats) {
        let last = self.last.as_ref().expect("the poller read nothing");
        for ((name, was), (_, is)) in counters(last).into_iter().zip(counters(now)) {
            assert!(is >= was, "{who}: {name} is {is} after the poller saw {was}");
        }
    }
}

/// Reads the stats of every connection `read` returns, over and over until
/// `stop` (one last round after it): a tight loop that only yields, or with a
/// `pause` between rounds. Fails as soon as a counter goes backwards.
fn poll(who: &str, stop: &AtomicBool, pause: Option<Duration>, read: impl Fn() -> Vec<Stats>) -> Vec<Watch> {
    let mut watches: Vec<Watch> = Vec::new();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        for (i, stats) in read().into_iter().enumerate() {
            if i == watches.len() {
                watches.push(Watch::default());
            }
            watches[i].see(who, i, stats);
        }
        if stopping {
            return watches;
        }
        match pause {
            Some(p) => thread::sleep(p),
            None => thread::yield_now(),
        }
    }
}

/// Sets its flags when dropped, also while a panic unwinds (so pollers stop).
struct StopOnDrop<'a>(Vec<&'a AtomicBool>);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.iter().for_each(|f| f.store(true, Ordering::Relaxed));
    }
}

// ---- 1. eight sources through one listener -----------------------------

/// Waits (at most 2 minutes) until the parent creates `path`: a barrier between processes.
fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        assert!(Instant::now() < deadline, "no {} after 2 minutes", path.display());
        thread::sleep(Duration::from_millis(5));
    }
}

/// The second barrier's file: every source is connected.
fn all_accepted_file(go: &Path) -> PathBuf {
    go.with_extension("all-accepted")
}

/// Runs as a separate process: source `index` of the eight-source test.
/// Reports `ready` once its RAM is filled; connects when the go file
/// appears; migrates its first window (while the parent still accepts the
/// others); waits until every source is connected, so that the later windows
/// of all 8 run at the same time; closes, and reports
/// `done <close result> digest=<its final RAM> ...`.
#[test]
#[ignore = "child process of eight_sources_migrate_at_once_through_one_listener"]
fn source_child() {
    let Some(setting) = child_setting(SOURCE_CHILD_ENV) else { return };
    let port: u16 = setting[0].parse().unwrap();
    let index: u64 = setting[1].parse().unwrap();
    let go = PathBuf::from(&setting[2]);
    let layout = load_layout();
    let ram = layout.source_ram(seed_of(index));
    println!("{REPORT}ready");
    // All sources connect at the same moment.
    wait_for_file(&go);
    let start = Instant::now();
    // One thread accepts the 8 in turn: under TCG the last connect waits for
    // 7 accepts (measured up to 16 s), close to the default 30 s timeout.
    let config = Config { pin_all: pin_all_for(index), timeout: Duration::from_secs(60), ..Config::default() };
    let mut source = Source::connect(&rdma_ip(), port, &config, &layout.registry(&ram, 1 << 40)).unwrap();
    let connected = start.elapsed();
    assert_eq!(source.negotiated().pin_all, pin_all_for(index));
    assert!(source.negotiated().extensions);
    let stream = stream_of(index);
    let (head, rest) = stream.split_at(HEADER_LEN);
    let (middle, tail) = rest.split_at(rest.len() / 2);
    // The header goes out before the first window (iteration_begin flushes it).
    source.put(head).unwrap();
    window(&mut source, &all_pages(&layout));
    source.put(middle).unwrap();
    source.flush().unwrap();
    wait_for_file(&all_accepted_file(&go));
    for round in 1..=ROUNDS {
        let pages = redirty(&layout, &ram, seed_of(index), round);
        window(&mut source, &pages);
    }
    source.put(tail).unwrap();
    let stats = source.stats();
    let closed = source.close();
    println!(
        "{REPORT}done {closed:?} digest={:#x} connect={connected:?} total={:?} windows={} bytes_written={} \
         chunks_registered={} zero_chunks={}",
        digest(&ram),
        start.elapsed(),
        stats.iterations,
        stats.bytes_written,
        stats.chunks_registered,
        stats.zero_chunks,
    );
}

/// What the destination checked of one connection.
struct Served {
    /// The destination's RAM, kept mapped while its connection exists.
    _ram: Vec<GuestRam>,
    index: u64,
    pin_all: bool,
    digest: u64,
    stats: Stats,
    took: Duration,
}

/// Serves one accepted connection: the header names the source, then the
/// stream, the ending and the RAM image are checked against that source's.
fn serve(dest: &Destination, ram: Vec<GuestRam>, layout: &Layout, accepted: Instant) -> Served {
    let head = read_stream(dest, HEADER_LEN);
    let header = String::from_utf8_lossy(&head);
    let index: u64 = header.trim().strip_prefix("load source").and_then(|i| i.trim().parse().ok()).expect(&header);
    let stream = stream_of(index);
    assert_eq!(head, stream[..HEADER_LEN]);
    // Long gaps between stream pieces (the barrier, the other sources'
    // windows): wait for the end first, then read the buffered stream.
    assert_eq!(dest.wait_end(Some(Duration::from_secs(180))), Ok(Ending::Completed), "source {index}");
    assert_completed(dest, &stream[HEADER_LEN..]);
    let took = accepted.elapsed();
    let want = final_image(layout, index);
    assert_same_ram(&format!("source {index}"), &ram, &want);
    let stats = dest.stats();
    assert_eq!(stats.iterations, 1 + ROUNDS, "source {index}: {stats:?}");
    Served { _ram: ram, index, pin_all: dest.negotiated().pin_all, digest: digest(&want), stats, took }
}

#[test]
fn eight_sources_migrate_at_once_through_one_listener() {
    let _took = Took::start("eight_sources_migrate_at_once_through_one_listener");
    bounded(EIGHT_BOUND, "eight sources through one listener".into(), eight_sources);
}

fn eight_sources() {
    let exe = ChildExe::copy();
    let go = std::env::temp_dir().join(format!("rdmamig-load-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let _ = std::fs::remove_file(all_accepted_file(&go));
    let layout = load_layout();
    // The destination allows pin-all; each source decides whether it asks.
    let (listener, port) = listen(&Config { pin_all: true, ..Config::default() });
    let start = Instant::now();
    let mut peers: Vec<Peer> = (0..SOURCES)
        .map(|i| Peer::spawn(&exe.0, "load::source_child", SOURCE_CHILD_ENV, &format!("{port} {i} {}", go.display())))
        .collect();
    peers.iter_mut().for_each(|p| p.expect("ready"));
    let ready = start.elapsed();
    std::fs::write(&go, b"go").unwrap();
    let go_at = Instant::now();
    let accepted: Mutex<Vec<Arc<Destination>>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let (served, all_accepted, watches) = thread::scope(|s| {
        let poller = s.spawn(|| {
            let read = || accepted.lock().unwrap().iter().map(|d| d.stats()).collect();
            poll("destination", &stop, Some(Duration::from_millis(1)), read)
        });
        let stopping = StopOnDrop(vec![&stop]);
        // One thread accepts, each connection is served on its own thread.
        let (listener, layout, accepted) = (&listener, &layout, &accepted);
        let go = &go;
        let acceptor = s.spawn(move || {
            let servers = (0..SOURCES)
                .map(|n| {
                    let ram = layout.dest_ram();
                    let dest = Destination::accept(listener, &layout.registry(&ram, 0), Some(Duration::from_secs(60)))
                        .unwrap_or_else(|e| panic!("accept {n} of {SOURCES}: {e}"));
                    let at = Instant::now();
                    let dest = Arc::new(dest);
                    accepted.lock().unwrap().push(dest.clone());
                    s.spawn(move || serve(&dest, ram, layout, at))
                })
                .collect::<Vec<_>>();
            std::fs::write(all_accepted_file(go), b"go").unwrap();
            (Instant::now(), servers)
        });
        let (all_accepted, servers) = acceptor.join().unwrap();
        let served: Vec<Served> = servers.into_iter().map(|t| t.join().unwrap()).collect();
        drop(stopping);
        (served, all_accepted, poller.join().unwrap())
    });
    let migrated = go_at.elapsed();
    // The RAM stays mapped until the connections are gone.
    drop(accepted);
    let reports: Vec<Vec<String>> = peers
        .iter_mut()
        .enumerate()
        .map(|(i, p)| {
            let (status, reports) = p.finish(Duration::from_secs(60));
            assert!(status.success(), "source {i} failed ({status}): {reports:?}");
            reports
        })
        .collect();
    println!(
        "load: {SOURCES} sources ready {ready:?} after spawning; all migrated {migrated:?} after the go \
         ({} MiB each, {ROUNDS} re-dirtied windows; the 8 accepted {:?} after the go); total {:?}",
        layout.blocks.iter().map(|b| b.1).sum::<u64>() / MIB,
        all_accepted.duration_since(go_at),
        start.elapsed()
    );
    let mut indexes: Vec<u64> = served.iter().map(|s| s.index).collect();
    indexes.sort();
    assert_eq!(indexes, (0..SOURCES).collect::<Vec<_>>(), "each source must be served exactly once");
    for s in &served {
        let done = reports[s.index as usize].iter().find(|r| r.starts_with("done ")).expect("a done report");
        println!(
            "  source {} pin_all={} served in {:?}: {done}; destination chunks_registered={} zero_chunks={} \
             pin_all_progress_bytes={} stream_bytes={}",
            s.index,
            s.pin_all,
            s.took,
            s.stats.chunks_registered,
            s.stats.zero_chunks,
            s.stats.pin_all_progress_bytes,
            s.stats.stream_bytes,
        );
        assert_eq!(s.pin_all, pin_all_for(s.index), "source {}", s.index);
        let want = format!("done Ok(Completed) digest={:#x} ", s.digest);
        assert!(done.starts_with(&want), "source {}: {done} (the destination holds digest {:#x})", s.index, s.digest);
    }
    let reads: u64 = watches.iter().map(|w| w.reads).sum();
    let changes: u64 = watches.iter().map(|w| w.changes).sum();
    println!(
        "  destination stats poller: {reads} reads of {} connections, {changes} with counters moved",
        watches.len()
    );
    assert_eq!(watches.len() as u64, SOURCES);
    assert!(changes > 0, "the poller never saw a transfer move");
    let _ = std::fs::remove_file(&go);
    let _ = std::fs::remove_file(all_accepted_file(&go));
}

// ---- 2a. stats from other threads ----------------------------------------

/// Pollers per side.
const POLLERS: usize = 2;

/// A source shared with pollers: its calls run under the read lock; `close`
/// takes it out under the write lock, so pollers stop once it is closed.
struct SharedSource(RwLock<Option<Source>>);

impl SharedSource {
    fn with<T>(&self, f: impl FnOnce(&Source) -> T) -> T {
        f(self.0.read().unwrap().as_ref().expect("the source is closed"))
    }

    fn stats(&self) -> Vec<Stats> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(Source::stats).into_iter().collect()
    }

    fn close(&self) -> rdmamig::Result<Ending> {
        self.0.write().unwrap().take().expect("the source is closed").close()
    }
}

#[test]
fn stats_polled_in_tight_loops_on_both_sides_never_go_backwards() {
    let _took = Took::start("stats_polled_in_tight_loops_on_both_sides_never_go_backwards");
    bounded(TEST_BOUND, "stats pollers".into(), stats_pollers);
}

fn stats_pollers() {
    let layout = Layout { blocks: vec![("pc.ram", 24 * MIB, vec![(8 * MIB, 4 * MIB)])] };
    let src_ram = layout.source_ram(51);
    let dst_ram = layout.dest_ram();
    // A pin budget: the source unpins, so pinned_bytes goes down while the counters grow.
    let src_config = Config { pin_budget: Some(8 * MIB), ..Config::default() };
    let (source, dest) =
        connect(&layout.registry(&src_ram, 0), &src_config, layout.registry(&dst_ram, 0), &Config::default());
    let source = SharedSource(RwLock::new(Some(source)));
    let stream = stream_of(51);
    let (stop_source, stop_dest) = (AtomicBool::new(false), AtomicBool::new(false));
    let start = Instant::now();
    let (source_watches, dest_watches, source_stats) = thread::scope(|s| {
        let (source, dest, stop_source, stop_dest) = (&source, &dest, &stop_source, &stop_dest);
        let source_pollers: Vec<_> =
            (0..POLLERS).map(|_| s.spawn(move || poll("source", stop_source, None, || source.stats()))).collect();
        let dest_pollers: Vec<_> = (0..POLLERS)
            .map(|_| s.spawn(move || poll("destination", stop_dest, None, || vec![dest.stats()])))
            .collect();
        let stopping = StopOnDrop(vec![stop_source, stop_dest]);
        for round in 0..=ROUNDS {
            let pages = if round == 0 { all_pages(&layout) } else { redirty(&layout, &src_ram, 51, round) };
            source.with(|src| src.iteration_begin().unwrap());
            source.with(|src| {
                save_pages(src, &pages);
                src.iteration_end().unwrap();
            });
            if round == 0 {
                source.with(|src| src.put(&stream).unwrap());
                source.with(|src| src.flush().unwrap());
            }
        }
        assert_eq!(dest.wait_iteration(1 + ROUNDS, Some(Duration::from_secs(30))).unwrap(), 1 + ROUNDS);
        stop_source.store(true, Ordering::Relaxed);
        let source_watches: Vec<Watch> = source_pollers.into_iter().flat_map(|p| p.join().unwrap()).collect();
        let source_stats = source.with(Source::stats);
        assert_eq!(source.close().unwrap(), Ending::Completed);
        // The destination's pollers go on through the end of the connection.
        assert_completed(dest, &stream);
        drop(stopping);
        let dest_watches: Vec<Watch> = dest_pollers.into_iter().flat_map(|p| p.join().unwrap()).collect();
        (source_watches, dest_watches, source_stats)
    });
    let took = start.elapsed();
    assert_same_ram("stats pollers", &dst_ram, &src_ram);
    let dest_stats = dest.stats();
    for (side, watches, last) in
        [("source", &source_watches, &source_stats), ("destination", &dest_watches, &dest_stats)]
    {
        assert_eq!(watches.len(), POLLERS);
        for w in watches.iter() {
            println!(
                "stats poller, {side}: {} reads, {} with counters moved, pinned_bytes moved {} times",
                w.reads, w.changes, w.pinned_moves
            );
            assert!(w.changes > 0, "{side}: the poller never saw the transfer move: {w:?}");
            w.not_behind(side, last);
        }
    }
    println!("stats pollers: migrated 24 MiB in {} windows in {took:?}; source {source_stats:?}", 1 + ROUNDS);
    assert!(source_stats.unpins > 0, "the pin budget never made the source unpin: {source_stats:?}");
    assert!(source_watches.iter().any(|w| w.pinned_moves > 0), "pinned_bytes never moved under the pollers");
}

// ---- 2b. abort from another thread ---------------------------------------

/// RAM of the aborted migration: enough that the window is still running when the abort comes.
const ABORT_RAM: u64 = 96 * MIB;
/// The abort comes once this much of the window is written.
const ABORT_AT: u64 = 16 * MIB;
/// What the source may still write after an abort: the writes it had posted
/// already (it keeps at most 16 MiB in flight) and one more 4 MiB write.
const WRITES_AFTER_ABORT: u64 = 20 * MIB;

#[derive(Clone, Copy, Debug)]
enum Side {
    Source,
    Destination,
}

/// A call that blocked: what it returned, and when.
struct Call {
    what: &'static str,
    result: Result<String, rdmamig::Error>,
    at: Instant,
}

fn timed<T: std::fmt::Debug>(what: &'static str, r: rdmamig::Result<T>) -> Call {
    Call { what, result: r.map(|v| format!("{v:?}")), at: Instant::now() }
}

impl Call {
    /// The call's error if it failed with one of `kinds` within
    /// `ABORT_BOUND` of `aborted`; otherwise what it did instead.
    fn failed_promptly(&self, side: Side, kinds: &[ErrorKind], aborted: Instant) -> Result<rdmamig::Error, String> {
        let after = self.at.saturating_duration_since(aborted);
        println!("abort by the {side:?}: {} returned {:?} {after:?} after the abort", self.what, self.result);
        match &self.result {
            Ok(v) => Err(format!("{} returned Ok({v}) {after:?} after the abort, not a failure", self.what)),
            Err(e) if !kinds.contains(&e.kind) => Err(format!("{} failed with {e}, not one of {kinds:?}", self.what)),
            Err(_) if after >= ABORT_BOUND => Err(format!("{} returned only {after:?} after the abort", self.what)),
            Err(e) => Ok(e.clone()),
        }
    }
}

/// The hypervisor aborts `side` from another thread while the source is
/// inside `iteration_end` of a big window and three destination threads wait
/// without a timeout (`get`, `wait_end`, `wait_iteration`). Each blocked
/// call must fail promptly (the aborted side with `Aborted`, the other with
/// the peer's ERROR or the disconnect), an aborted source must stop writing,
/// the connection's fds and MRs must be released, and the same listener must
/// then serve a new migration. Wrong outcomes of the abort itself are
/// collected and reported at the end, so the rest still runs.
fn abort_mid_transfer(side: Side) {
    let layout = Layout { blocks: vec![("pc.ram", ABORT_RAM, vec![])] };
    let (listener, _) = listen(&Config::default());
    // librdmacm opened the device for the listener: the counts from here on are the connection's.
    let (fds, mrs) = (open_fds(), live_mrs());
    let src_ram = layout.source_ram(61);
    let dst_ram = layout.dest_ram();
    let config = Config::default();
    let (source, dest) = connect_on(&listener, &layout.registry(&src_ram, 0), &config, &layout.registry(&dst_ram, 0));
    source.iteration_begin().unwrap();
    save_pages(&source, &all_pages(&layout));
    let in_end = AtomicBool::new(false);
    let (ended, waits, aborted, written) = thread::scope(|s| {
        let (source, dest, in_end) = (&source, &dest, &in_end);
        let waits = [
            s.spawn(move || timed("destination get", dest.get(&mut [0u8; 64], None))),
            s.spawn(move || timed("destination wait_end", dest.wait_end(None))),
            s.spawn(move || timed("destination wait_iteration(1)", dest.wait_iteration(1, None))),
        ];
        let aborter = s.spawn(move || {
            // Mid-transfer: the source is inside iteration_end and part of the window is written.
            while !in_end.load(Ordering::Relaxed) || source.stats().bytes_written < ABORT_AT {
                thread::sleep(Duration::from_millis(1));
            }
            let written = source.stats().bytes_written;
            match side {
                Side::Source => source.abort(),
                Side::Destination => dest.abort(),
            }
            (Instant::now(), written)
        });
        in_end.store(true, Ordering::Relaxed);
        let ended = timed("source iteration_end", source.iteration_end());
        let (aborted, written) = aborter.join().unwrap();
        (ended, waits.map(|w| w.join().unwrap()), aborted, written)
    });
    let mut problems = Vec::new();
    let (source_kinds, dest_kinds): (&[ErrorKind], &[ErrorKind]) = match side {
        Side::Source => (&[ErrorKind::Aborted], &[ErrorKind::PeerError, ErrorKind::Disconnected]),
        Side::Destination => (&[ErrorKind::PeerError, ErrorKind::Disconnected], &[ErrorKind::Aborted]),
    };
    // A destination's abort reaches the source with the ERROR or the
    // disconnect, which wait (up to 1 s) for the source's next message: a
    // window that completes meanwhile ends fine, and the source's next one
    // must fail instead.
    let source_call = match (side, &ended.result) {
        (Side::Destination, Ok(_)) => {
            println!("abort by the Destination: the window ended before the source learned of the abort");
            let next = (|| {
                source.iteration_begin()?;
                source.save(0, 0, PAGE)?;
                source.iteration_end()
            })();
            timed("source's next window", next)
        }
        _ => ended,
    };
    for call in std::iter::once(&source_call).chain(&waits) {
        let kinds = if call.what.starts_with("source") { source_kinds } else { dest_kinds };
        if let Err(p) = call.failed_promptly(side, kinds, aborted) {
            problems.push(p);
        }
    }
    // The destination's calls returned after its teardown: nothing may write its RAM any more.
    let frozen = digest(&dst_ram);
    let after = source.stats().bytes_written - written;
    let whole_window = first_difference(&dst_ram, &src_ram).is_none();
    println!(
        "abort by the {side:?}: {written} of {ABORT_RAM} bytes written at the abort, {after} after it; \
         the destination holds the whole window: {whole_window}"
    );
    // The aborted source must stop writing (a destination's source writes on
    // until it learns of the abort: the ERROR, or the disconnect after the 1 s grace).
    if matches!(side, Side::Source) && after > WRITES_AFTER_ABORT {
        problems.push(format!(
            "the source went on writing after its abort: {after} bytes after it ({written} before), \
             the destination holds the whole window: {whole_window}"
        ));
    }
    // Torn down: later calls fail at once with the stored error, and
    // dropping both ends releases what the connection held.
    let stored = source.error().expect("the source has no error after the abort");
    assert!(source_kinds.contains(&stored.kind), "{side:?} abort: the source's stored error is {stored}");
    assert_eq!(source.iteration_begin().unwrap_err(), stored);
    let stored = dest.error().expect("the destination has no error after the abort");
    assert!(dest_kinds.contains(&stored.kind), "{side:?} abort: the destination's stored error is {stored}");
    assert_eq!(dest.wait_iteration(2, Some(Duration::from_secs(1))).unwrap_err(), stored);
    let dropped = Instant::now();
    bounded(Duration::from_secs(10), format!("{side:?} abort: dropping both ends"), move || drop((source, dest)));
    if let Some(worker) = Unregistration::running() {
        worker.flush();
    }
    println!("abort by the {side:?}: both ends dropped in {:?}", dropped.elapsed());
    if digest(&dst_ram) != frozen {
        problems.push("the destination's RAM changed after its blocked calls returned".into());
    }
    assert_eq!(live_mrs(), mrs, "{side:?} abort: memory regions left registered");
    assert_eq!(open_fds(), fds, "{side:?} abort: file descriptors left open");
    drop((src_ram, dst_ram));
    // The listener serves a new migration.
    let small = Layout { blocks: vec![("pc.ram", 4 * MIB, vec![])] };
    let src_ram = small.source_ram(62);
    let dst_ram = small.dest_ram();
    let (mut source, dest) = connect_on(&listener, &small.registry(&src_ram, 0), &config, &small.registry(&dst_ram, 0));
    window(&mut source, &all_pages(&small));
    source.put(b"after the abort").unwrap();
    assert_eq!(source.close().unwrap(), Ending::Completed);
    assert_completed(&dest, b"after the abort");
    assert_same_ram("the migration after the abort", &dst_ram, &src_ram);
    println!("abort by the {side:?}: a new migration on the same listener completed");
    assert!(problems.is_empty(), "abort by the {side:?}:\n  {}", problems.join("\n  "));
}

#[test]
fn source_abort_from_another_thread_unblocks_both_sides() {
    let _took = Took::start("source_abort_from_another_thread_unblocks_both_sides");
    bounded(TEST_BOUND, "source abort".into(), || abort_mid_transfer(Side::Source));
}

#[test]
fn destination_abort_from_another_thread_unblocks_both_sides() {
    let _took = Took::start("destination_abort_from_another_thread_unblocks_both_sides");
    bounded(TEST_BOUND, "destination abort".into(), || abort_mid_transfer(Side::Destination));
}

// ---- 2c. saves from several threads --------------------------------------

const SAVERS: u64 = 4;

/// Adjacent pages merged into ranges (block, offset, length).
fn runs(pages: &[(u32, u64)]) -> Vec<(u32, u64, u64)> {
    let mut out: Vec<(u32, u64, u64)> = Vec::new();
    for &(b, off) in pages {
        match out.last_mut() {
            Some((lb, lo, ll)) if *lb == b && *lo + *ll == off => *ll += PAGE,
            _ => out.push((b, off, PAGE)),
        }
    }
    out
}

/// Saves `pages` from `SAVERS` threads started together: thread t saves the
/// pages of 64 KiB stripes t, t + 4, ... (so every chunk gets saves from
/// every thread), the even threads a page per call, the odd ones runs of
/// adjacent pages. Returns the saves each thread made.
fn save_from_threads(source: &Source, pages: &[(u32, u64)]) -> Vec<usize> {
    let start = Barrier::new(SAVERS as usize);
    thread::scope(|s| {
        let savers: Vec<_> = (0..SAVERS)
            .map(|t| {
                let mine: Vec<(u32, u64)> =
                    pages.iter().copied().filter(|&(_, off)| off / (16 * PAGE) % SAVERS == t).collect();
                let ranges =
                    if t % 2 == 0 { mine.iter().map(|&(b, off)| (b, off, PAGE)).collect() } else { runs(&mine) };
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    for &(b, off, len) in &ranges {
                        source.save(b, off, len).unwrap();
                    }
                    ranges.len()
                })
            })
            .collect();
        savers.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn four_threads_save_disjoint_ranges_of_one_window() {
    let _took = Took::start("four_threads_save_disjoint_ranges_of_one_window");
    for pin_all in [false, true] {
        bounded(TEST_BOUND, format!("four savers, pin_all {pin_all}"), move || four_savers(pin_all));
    }
}

fn four_savers(pin_all: bool) {
    let layout = Layout { blocks: vec![("pc.ram", 32 * MIB, vec![(20 * MIB, MIB)]), ("vga.vram", 8 * MIB, vec![])] };
    let src_ram = layout.source_ram(71);
    let dst_ram = layout.dest_ram();
    let config = Config { pin_all, ..Config::default() };
    let (source, dest) = connect(&layout.registry(&src_ram, 1 << 40), &config, layout.registry(&dst_ram, 0), &config);
    assert_eq!(source.negotiated().pin_all, pin_all);
    let start = Instant::now();
    for window in 1..=2u64 {
        let pages = if window == 1 { all_pages(&layout) } else { redirty(&layout, &src_ram, 71, window) };
        source.iteration_begin().unwrap();
        let saves = save_from_threads(&source, &pages);
        source.iteration_end().unwrap();
        assert_eq!(dest.wait_iteration(window, Some(Duration::from_secs(30))).unwrap(), window);
        // The window is complete: every page any thread saved is in place.
        assert_same_ram(&format!("pin_all {pin_all}, window {window}"), &dst_ram, &src_ram);
        println!("four savers, pin_all {pin_all}, window {window}: {} pages, saves per thread {saves:?}", pages.len());
    }
    let stream = stream_of(71);
    source.put(&stream).unwrap();
    let stats = source.stats();
    assert_eq!(source.close().unwrap(), Ending::Completed);
    assert_completed(&dest, &stream);
    println!("four savers, pin_all {pin_all}: {:?}; source {stats:?}", start.elapsed());
}
