//! Peer liveness between two guests (`scripts/rxe-vm.sh --pair`, run by
//! scripts/rdma-suite.sh): one guest's link goes down and both sides must
//! fail within the configured liveness (plus a margin), then release
//! everything they held.
//!
//! Both guests run the same tests: guest 1 (198.18.0.1) is the destination,
//! guest 2 (198.18.0.2) the source. They meet at `rxe-vm-barrier` points,
//! which go through a 9p directory and so keep working with the link down.
//! The guest that takes its own link down times itself from just before
//! `ip link set down`; the other one from the barrier just before it, which
//! is earlier still. Outside a pair guest (no `RXE_VM_GUEST`) they do nothing.

use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, Error, ErrorKind, Listener, PostcopyPhase, Read, Source, StalePages};

use crate::migration::{live_mrs, one_block, open_fds, rdma_ip, GuestRam, PAGE};

const MIB: u64 = 1 << 20;
const LIVENESS: Duration = Duration::from_secs(3);
/// Both sides must fail within `LIVENESS + MARGIN` of the link going down.
const MARGIN: Duration = Duration::from_secs(3);
/// RAM of the mid-transfer test: one window takes a few seconds under TCG.
const RAM_BUSY: u64 = 64 * MIB;
const RAM_IDLE: u64 = 16 * MIB;
/// How long the idle test leaves the connection idle before the link goes
/// down: longer than the liveness, so probes must keep it alive meanwhile.
const IDLE: Duration = Duration::from_secs(5);
const PORT_BUSY: u16 = 18_515;
const PORT_IDLE: u16 = 18_516;
const PORT_POSTCOPY: u16 = 18_517;
/// How long a test waits for a failure before it gives up (the bound is far beyond liveness + margin).
const STUCK: Duration = Duration::from_secs(60);
/// Tolerated time for drop (teardown) and for calls after the failure.
const PROMPT: Duration = Duration::from_secs(2);

fn config() -> Config {
    Config { liveness: Some(LIVENESS), ..Config::default() }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    Destination,
    Source,
}

/// This guest's role, or None outside a `--pair` guest.
pub fn role(test: &str) -> Option<Role> {
    match std::env::var("RXE_VM_GUEST").as_deref() {
        Ok("1") => Some(Role::Destination),
        Ok("2") => Some(Role::Source),
        Ok(g) => panic!("RXE_VM_GUEST={g}: expected 1 or 2"),
        Err(_) => {
            eprintln!("{test}: not in a scripts/rxe-vm.sh --pair guest (no RXE_VM_GUEST): nothing to do");
            None
        }
    }
}

pub fn peer_ip() -> String {
    std::env::var("RXE_VM_PEER_IP").expect("RXE_VM_PEER_IP (set in --pair guests)")
}

/// Pings the peer until it answers (after a link went down and up, this
/// refreshes the neighbour entries before the next connection).
pub fn ping_peer() {
    for _ in 0..20 {
        let ok = Command::new("busybox").args(["ping", "-c", "1", "-W", "1", &peer_ip()]).output();
        if ok.is_ok_and(|o| o.status.success()) {
            return;
        }
    }
    panic!("the peer {} does not answer ping", peer_ip());
}

/// Returns once the other guest has reached the barrier `name` too.
pub fn barrier(name: &str) {
    let status =
        Command::new("rxe-vm-barrier").args([name, "120"]).status().expect("rxe-vm-barrier (on PATH in --pair guests)");
    assert!(status.success(), "barrier {name}: the other guest did not arrive");
}

/// Open fds and registered MRs, after librdmacm has opened the devices it
/// keeps open (it does so on first use).
fn baseline(config: &Config) -> (usize, usize) {
    drop(Listener::bind(&rdma_ip(), 0, config).expect("warm-up listen"));
    (open_fds(), live_mrs())
}

fn assert_released(before: (usize, usize), who: &str) {
    assert_eq!(live_mrs(), before.1, "{who}: memory regions left registered");
    assert_eq!(open_fds(), before.0, "{who}: file descriptors leaked");
}

/// This process's open userfaultfds.
fn userfaultfds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .ok()
                .and_then(|e| std::fs::read_link(e.path()).ok())
                .is_some_and(|l| l.to_string_lossy() == "anon_inode:[userfaultfd]")
        })
        .count()
}

/// rxe0's network interface.
pub fn netdev() -> String {
    if let Ok(i) = std::env::var("RXE_VM_IF") {
        if !i.is_empty() {
            return i;
        }
    }
    let dev = std::env::var("RXE_VM_DEV").unwrap_or_else(|_| "rxe0".into());
    let out = Command::new("rdma").args(["link", "show"]).output().expect("the rdma tool (iproute2)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.contains(&format!(" {dev}/")))
        .find_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.windows(2).find(|w| w[0] == "netdev").map(|w| w[1].to_string())
        })
        .unwrap_or_else(|| panic!("no netdev for {dev} in `rdma link show`: {text}"))
}

fn set_link(netdev: &str, state: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("ip").args(["link", "set", netdev, state]).status()
}

/// This guest's link, taken down; brought back up (and rxe0 active) on drop.
struct LinkDown {
    netdev: String,
    /// Just before `ip link set down` ran.
    at: Instant,
}

impl LinkDown {
    fn take() -> LinkDown {
        let netdev = netdev();
        let at = Instant::now();
        let status = set_link(&netdev, "down").expect("ip");
        assert!(status.success(), "ip link set {netdev} down: {status}");
        eprintln!("link {netdev} down ({:?} for the ip command)", at.elapsed());
        LinkDown { netdev, at }
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        match set_link(&self.netdev, "up") {
            Ok(s) if s.success() => {}
            r => eprintln!("ip link set {} up: {r:?}", self.netdev),
        }
        // The next test connects again: wait for the port to be active.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let out = Command::new("rdma").args(["link", "show"]).output();
            if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("state ACTIVE")) {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        eprintln!("rxe0 not ACTIVE 10 s after ip link set {} up", self.netdev);
    }
}

/// The destination guest's side of a pair test's connection: listens on
/// `port`, meets the source guest at the barrier `{name}-listening`, accepts.
fn accept_pair(ram: &GuestRam, len: u64, port: u16, config: &Config, name: &str) -> Destination {
    let listener = Listener::bind(&rdma_ip(), port, config).expect("listen");
    barrier(&format!("{name}-listening"));
    Destination::accept(&listener, &one_block(ram, len), Some(Duration::from_secs(60))).expect("accept")
}

/// The source guest's side: connects once the destination listens (`accept_pair`).
fn connect_pair(ram: &GuestRam, len: u64, port: u16, config: &Config, name: &str) -> Source {
    barrier(&format!("{name}-listening"));
    Source::connect(&peer_ip(), port, config, &one_block(ram, len)).expect("connect")
}

/// Checks that `failed` came after the link went down (at `down`) and within the bound.
fn detection(who: &str, err: &Error, down: Instant, failed: Instant) -> Duration {
    assert!(failed >= down, "{who} failed before the link went down: {err}");
    let delay = failed - down;
    eprintln!("{who}: error {delay:?} after the link went down (liveness {LIVENESS:?}): {err}");
    delay
}

fn assert_in_time(who: &str, delay: Duration) {
    assert!(
        delay < LIVENESS + MARGIN,
        "{who} noticed the link down only after {delay:?} (liveness {LIVENESS:?}, margin {MARGIN:?})"
    );
}

fn assert_liveness_error(who: &str, err: &Error) {
    assert_eq!(err.kind, ErrorKind::Disconnected, "{who}: {err}");
    assert!(err.message.contains("liveness"), "{who}: the message does not mention liveness: {err}");
}

/// Times `f`, asserting it is prompt.
fn prompt<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let r = f();
    let took = start.elapsed();
    eprintln!("{what} took {took:?}");
    assert!(took < PROMPT, "{what} took {took:?}");
    r
}

/// The source saves 256 MiB per window, window after window; once one has
/// completed, the source guest takes its own link down. The source's call
/// (a save or iteration_end) and the destination's `wait_end(None)` fail.
#[test]
#[ignore = "needs two guests: scripts/rxe-vm.sh --pair (see scripts/rdma-suite.sh)"]
fn pair_link_down_mid_transfer_fails_both_sides() {
    let Some(role) = role("pair_link_down_mid_transfer_fails_both_sides") else { return };
    let config = config();
    let before = baseline(&config);
    ping_peer();
    match role {
        Role::Destination => {
            let ram = GuestRam::new(RAM_BUSY, 0);
            let dest = accept_pair(&ram, RAM_BUSY, PORT_BUSY, &config, "busy");
            barrier("busy-connected");
            // The source guest takes its link down right after this barrier.
            let down = thread::spawn(|| {
                barrier("busy-down");
                Instant::now()
            });
            let end = dest.wait_end(None);
            let failed = Instant::now();
            let down = down.join().expect("barrier busy-down");
            let err = end.expect_err("the migration ended without an error");
            let delay = detection("destination (wait_end)", &err, down, failed);
            assert!(dest.iterations() >= 1, "no window completed before the link went down");
            let mut buf = [0u8; 16];
            let again = prompt("destination: get after the failure", || dest.get(&mut buf, None));
            assert!(again.is_err(), "get after the failure: {again:?}");
            prompt("destination: drop", || drop(dest));
            barrier("busy-done");
            assert_released(before, "destination");
            assert_in_time("destination", delay);
        }
        Role::Source => {
            let ram = GuestRam::new(RAM_BUSY, 0x5A);
            let source = connect_pair(&ram, RAM_BUSY, PORT_BUSY, &config, "busy");
            barrier("busy-connected");
            let (tx, rx) = mpsc::channel();
            let mut link_down: Option<LinkDown> = None;
            let mut windows = 0u64;
            let (err, failed) = loop {
                let start = Instant::now();
                let window = (|| {
                    source.iteration_begin()?;
                    for off in (0..RAM_BUSY).step_by(MIB as usize) {
                        source.save(0, off, MIB)?;
                    }
                    source.iteration_end()
                })();
                if let Err(e) = window {
                    break (e, Instant::now());
                }
                windows += 1;
                eprintln!("window {windows}: {:?}", start.elapsed());
                if windows == 1 {
                    // Down while the next window is under way.
                    let tx = tx.clone();
                    thread::spawn(move || {
                        barrier("busy-down");
                        let _ = tx.send(LinkDown::take());
                    });
                }
                match rx.try_recv() {
                    Ok(d) => link_down = Some(d),
                    Err(mpsc::TryRecvError::Empty) => {}
                    Err(mpsc::TryRecvError::Disconnected) => panic!("taking the link down failed"),
                }
                if let Some(d) = &link_down {
                    assert!(d.at.elapsed() < Duration::from_secs(60), "no error 60 s after the link went down");
                }
            };
            let link_down = link_down.or_else(|| rx.recv().ok()).expect("taking the link down failed");
            let delay = detection("source (window)", &err, link_down.at, failed);
            assert!(windows >= 1, "the first window failed: {err}");
            let again = prompt("source: iteration_begin after the failure", || source.iteration_begin());
            assert!(again.is_err(), "iteration_begin after the failure succeeded");
            // (Link up before or after the drop: either way, a new connection
            // between these two guests then fails, see scripts/rdma-suite.sh.)
            drop(link_down);
            prompt("source: drop", || drop(source));
            barrier("busy-done");
            assert_released(before, "source");
            assert_in_time("source", delay);
        }
    }
}

/// The source sends a window and a few stream bytes, then stays idle; the
/// destination reads them and waits in `get(buf, None)`. After `IDLE` (longer
/// than the liveness: nothing may fail meanwhile) the destination guest takes
/// its own link down: `get` fails, and so does the source's idle engine
/// (`Source::error`, then its next call).
#[test]
#[ignore = "needs two guests: scripts/rxe-vm.sh --pair (see scripts/rdma-suite.sh)"]
fn pair_link_down_while_idle_fails_both_sides() {
    let Some(role) = role("pair_link_down_while_idle_fails_both_sides") else { return };
    let config = config();
    let before = baseline(&config);
    const HELLO: &[u8] = b"hello from the source";
    match role {
        Role::Destination => {
            let ram = GuestRam::new(RAM_IDLE, 0);
            let dest = accept_pair(&ram, RAM_IDLE, PORT_IDLE, &config, "idle");
            barrier("idle-connected");
            let mut buf = [0u8; 64];
            let mut got = Vec::new();
            while got.len() < HELLO.len() {
                match dest.get(&mut buf, Some(Duration::from_secs(30))).expect("get") {
                    Read::Bytes(n) => got.extend_from_slice(&buf[..n]),
                    Read::End(e) => panic!("the stream ended: {e:?}"),
                }
            }
            assert_eq!(got, HELLO);
            dest.wait_iteration(1, Some(Duration::from_secs(30))).expect("window 1");
            let idle_from = Instant::now();
            let down = thread::spawn(|| {
                thread::sleep(IDLE);
                barrier("idle-down");
                LinkDown::take()
            });
            let r = dest.get(&mut buf, None);
            let failed = Instant::now();
            let link_down = down.join().expect("taking the link down failed");
            let err = match r {
                Err(e) => e,
                Ok(read) => panic!("get returned {read:?} instead of failing"),
            };
            eprintln!("destination: idle for {:?} before the link went down", link_down.at - idle_from);
            let delay = detection("destination (get)", &err, link_down.at, failed);
            let again = prompt("destination: wait_end after the failure", || dest.wait_end(None));
            assert!(again.is_err(), "wait_end after the failure: {again:?}");
            prompt("destination: drop", || drop(dest));
            drop(link_down);
            barrier("idle-done");
            assert_released(before, "destination");
            assert_liveness_error("destination", &err);
            assert_in_time("destination", delay);
        }
        Role::Source => {
            let ram = GuestRam::new(RAM_IDLE, 0x5A);
            let source = connect_pair(&ram, RAM_IDLE, PORT_IDLE, &config, "idle");
            barrier("idle-connected");
            source.iteration_begin().unwrap();
            source.save(0, 0, RAM_IDLE).unwrap();
            source.iteration_end().unwrap();
            source.put(HELLO).unwrap();
            source.flush().unwrap();
            // Idle: only the engine thread's probes go out.
            barrier("idle-down");
            let down = Instant::now();
            if let Some(e) = source.error() {
                panic!("the idle connection failed before the link went down: {e}");
            }
            let (err, failed) = loop {
                if let Some(e) = source.error() {
                    break (e, Instant::now());
                }
                assert!(down.elapsed() < Duration::from_secs(60), "no error 60 s after the link went down");
                thread::sleep(Duration::from_millis(10));
            };
            let delay = detection("source (idle engine)", &err, down, failed);
            let next = prompt("source: iteration_begin after the failure", || source.iteration_begin());
            let next = next.expect_err("iteration_begin after the failure succeeded");
            assert_eq!(next, err, "the next call returns the stored error");
            prompt("source: drop", || drop(source));
            barrier("idle-done");
            assert_released(before, "source");
            assert_liveness_error("source", &err);
            assert_in_time("source", delay);
        }
    }
}

/// Post-copy with every page stale (after an empty window): while the
/// destination pulls (a few seconds for 64 MiB between two TCG guests), the
/// source guest takes its own link down. No disconnect reaches either side,
/// so only liveness can end the waits: the destination's (post-copy never
/// ends) and the source's `postcopy` call (which waits for the destination
/// to hold every page). Both fail in time and release everything.
#[test]
#[ignore = "needs two guests: scripts/rxe-vm.sh --pair (see scripts/rdma-suite.sh)"]
fn pair_link_down_in_postcopy_fails_both_sides() {
    let Some(role) = role("pair_link_down_in_postcopy_fails_both_sides") else { return };
    let config = config();
    let before = baseline(&config);
    ping_peer();
    match role {
        Role::Destination => {
            let ram = GuestRam::new(RAM_BUSY, 0);
            let userfaultfds_before = userfaultfds();
            let dest = accept_pair(&ram, RAM_BUSY, PORT_POSTCOPY, &config, "postcopy");
            dest.wait_postcopy(PostcopyPhase::Running, Some(Duration::from_secs(60))).expect("post-copy running");
            barrier("postcopy-running");
            // The source guest takes its link down right after this barrier.
            let down = thread::spawn(|| {
                barrier("postcopy-down");
                Instant::now()
            });
            // Bounded, unlike a hypervisor's wait: a liveness failure fails the test rather than hang the guests.
            let end = dest.wait_postcopy(PostcopyPhase::Done, Some(STUCK));
            let failed = Instant::now();
            let down = down.join().expect("barrier postcopy-down");
            let err = end.expect_err("post-copy ended before the link went down");
            let delay = detection("destination (wait_postcopy)", &err, down, failed);
            assert!(dest.postcopy_progress().pages_remaining > 0);
            prompt("destination: drop", || drop(dest));
            barrier("postcopy-done");
            // The userfaultfd stays open, as documented: a missing page of
            // the failed post-copy must block, never read as zero.
            assert_eq!(
                userfaultfds(),
                userfaultfds_before + 1,
                "destination: the failed post-copy's userfaultfd is not kept open"
            );
            assert_released((before.0 + 1, before.1), "destination");
            assert_liveness_error("destination", &err);
            assert_in_time("destination", delay);
        }
        Role::Source => {
            let ram = GuestRam::new(RAM_BUSY, 0x5A);
            let source = connect_pair(&ram, RAM_BUSY, PORT_POSTCOPY, &config, "postcopy");
            source.iteration_begin().expect("iteration_begin");
            source.iteration_end().expect("iteration_end");
            let bitmap = vec![!0u64; (RAM_BUSY / PAGE / 64) as usize];
            let (tx, postcopy) = mpsc::channel();
            thread::spawn(move || {
                let r = source.postcopy(&[StalePages { block: 0, bitmap }]);
                let _ = tx.send((Instant::now(), r, source));
            });
            barrier("postcopy-running");
            barrier("postcopy-down");
            let link_down = LinkDown::take();
            let (failed, r, source) =
                postcopy.recv_timeout(STUCK).expect("postcopy still waits 60 s after the link went down");
            let err = r.expect_err("post-copy ended although the link went down");
            let delay = detection("source (postcopy)", &err, link_down.at, failed);
            drop(link_down);
            prompt("source: drop", || drop(source));
            barrier("postcopy-done");
            assert_released(before, "source");
            assert_liveness_error("source", &err);
            assert_in_time("source", delay);
        }
    }
}

/// RAM of the recovery test: every page stale, so that the pull still runs
/// (a few seconds under TCG) when the link goes down.
const RAM_RECOVER: u64 = 128 * MIB;
const PORT_RECOVER: u16 = 18_518;
/// How long the link stays down: past both sides' detection (liveness).
const RECOVER_DOWN: Duration = Duration::from_secs(6);

/// The recovery test's guest RAM: word `i` is a function of `i`, so the
/// destination guest checks every word without the source's copy.
fn recover_word(i: u64) -> u64 {
    let mut x = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The source guest's link goes down in post-copy for longer than the
/// liveness, then comes back: with post-copy recovery on, both sides notice
/// the loss, the source waits on its recovery listener, the destination
/// reconnects once the link is back (its attempts fail meanwhile), and the
/// migration completes over the new connection, byte for byte.
#[test]
#[ignore = "needs two guests: scripts/rxe-vm.sh --pair (see scripts/rdma-suite.sh)"]
fn pair_link_down_in_postcopy_recovers() {
    let Some(role) = role("pair_link_down_in_postcopy_recovers") else { return };
    let start = Instant::now();
    let hook = move |level, message: &str| eprintln!("[{:>7.3} s] {level:?}: {message}", start.elapsed().as_secs_f64());
    rdmamig::set_log_hook(Some(Box::new(hook)), rdmamig::LogLevel::Debug).unwrap();
    // Short connection attempts, so the destination tries again soon after the link is back.
    let config =
        Config { postcopy_recovery: Some(Duration::from_secs(40)), timeout: Duration::from_secs(5), ..config() };
    ping_peer();
    let words = RAM_RECOVER / 8;
    match role {
        Role::Destination => {
            let ram = GuestRam::new(RAM_RECOVER, 0);
            let dest = accept_pair(&ram, RAM_RECOVER, PORT_RECOVER, &config, "recover");
            dest.wait_postcopy(PostcopyPhase::Running, Some(Duration::from_secs(60))).expect("post-copy running");
            barrier("recover-running");
            let started = Instant::now();
            let done = loop {
                match dest.wait_postcopy(PostcopyPhase::Done, Some(Duration::from_secs(2))) {
                    Err(e) if e.kind == ErrorKind::Timeout && started.elapsed() < STUCK => {
                        eprintln!("destination: {:?}", dest.postcopy_progress());
                    }
                    r => break r.expect("post-copy over a recovered link"),
                }
            };
            eprintln!("destination: {done:?}");
            assert_eq!((done.recoveries, done.pages_remaining), (1, 0), "{done:?}");
            assert_eq!(dest.wait_end(Some(STUCK)).expect("the migration's end"), rdmamig::Ending::Completed);
            let got = ram.bytes().chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().unwrap()));
            let bad = got.enumerate().filter(|&(i, w)| w != recover_word(i as u64)).count();
            assert_eq!(bad, 0, "destination: {bad} words differ from the source's");
            barrier("recover-done");
        }
        Role::Source => {
            let ram = GuestRam::new(RAM_RECOVER, 0);
            for i in 0..words {
                ram.write_u64(i * 8, recover_word(i));
            }
            let source = connect_pair(&ram, RAM_RECOVER, PORT_RECOVER, &config, "recover");
            source.iteration_begin().expect("iteration_begin");
            source.iteration_end().expect("iteration_end");
            let bitmap = vec![!0u64; (RAM_RECOVER / PAGE / 64) as usize];
            let (tx, postcopy) = mpsc::channel();
            thread::spawn(move || {
                let r = source.postcopy(&[StalePages { block: 0, bitmap }]);
                let _ = tx.send((r, source));
            });
            barrier("recover-running");
            let link_down = LinkDown::take();
            thread::sleep(RECOVER_DOWN);
            drop(link_down);
            eprintln!("source: link up again");
            let (r, source) = postcopy.recv_timeout(STUCK).expect("postcopy still waits 60 s after the link came back");
            let summary = r.expect("post-copy over a recovered link");
            eprintln!("source: {summary:?}");
            assert_eq!(source.close().expect("close"), rdmamig::Ending::Completed);
            barrier("recover-done");
        }
    }
}
