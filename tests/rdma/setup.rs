//! Setting up and tearing down without a peer: cancelling an accept, names
//! that do not resolve, addresses that never answer, and saves racing the end
//! of their window.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, ErrorKind, Listener, Source};

use crate::migration::{connect, listen, one_block, GuestRam, Layout, PAGE};

const MIB: u64 = 1 << 20;

#[test]
fn accept_without_timeout_is_cancelled_from_another_thread() {
    let (listener, _) = listen(&Config::default());
    let listener = Arc::new(listener);
    let ram = GuestRam::new(MIB, 0);
    let registry = one_block(&ram, MIB);
    let accept = {
        let (listener, registry) = (listener.clone(), registry.clone());
        thread::spawn(move || Destination::accept(&listener, &registry, None).err().map(|e| (e, Instant::now())))
    };
    thread::sleep(Duration::from_millis(300));
    let cancelled = Instant::now();
    listener.cancel();
    let (err, returned) = accept.join().unwrap().expect("accept must fail once cancelled");
    let took = returned.duration_since(cancelled);
    eprintln!("accept returned {took:?} after the cancel: {err}");
    assert_eq!(err.kind, ErrorKind::Cancelled, "{err}");
    assert!(took < Duration::from_millis(500), "{took:?}");
    // Later accepts fail at once.
    let err = Destination::accept(&listener, &registry, Some(Duration::from_secs(10))).err().unwrap();
    assert_eq!(err.kind, ErrorKind::Cancelled, "{err}");
}

/// `Source::connect` to `host` fails within the config's timeout plus a margin.
fn connect_fails_in_time(host: &str) -> rdmamig::Error {
    let config = Config { timeout: Duration::from_secs(2), ..Config::default() };
    let ram = GuestRam::new(MIB, 0);
    let start = Instant::now();
    let err = Source::connect(host, 4444, &config, &one_block(&ram, MIB)).err().expect("connect must fail");
    let took = start.elapsed();
    eprintln!("connect to {host}: {err} after {took:?}");
    assert!(took < config.timeout + Duration::from_millis(1500), "{took:?}");
    err
}

#[test]
fn connecting_to_a_name_that_does_not_resolve_fails_within_the_timeout() {
    let err = connect_fails_in_time("no-such-host.invalid");
    assert!(matches!(err.kind, ErrorKind::Connect | ErrorKind::Timeout), "{err}");
    assert!(err.message.contains("no-such-host.invalid"), "{err}");
}

#[test]
fn connecting_to_an_address_that_never_answers_fails_within_the_timeout() {
    // On the RDMA netdev's subnet, but nobody has it: address resolution never completes.
    let err = connect_fails_in_time("198.18.0.77");
    assert!(matches!(err.kind, ErrorKind::Connect | ErrorKind::Timeout), "{err}");
}

#[test]
fn listener_on_a_name_that_does_not_resolve_fails() {
    let config = Config { timeout: Duration::from_secs(2), ..Config::default() };
    let start = Instant::now();
    let err = Listener::bind("no-such-host.invalid", 0, &config).err().expect("bind must fail");
    assert!(matches!(err.kind, ErrorKind::Connect | ErrorKind::Timeout), "{err}");
    assert!(start.elapsed() < config.timeout + Duration::from_millis(1500));
}

/// Threads keep saving while another ends the window: every save either
/// fails with `State` or its page is in place when the destination counts the
/// window complete; none is written after the window's end. Each round saves
/// pages never written before and changes them in the source as soon as
/// `iteration_end` returns; a save queued after the window's end would be
/// written later, when the transfer thread idles: the bytes written must not
/// grow after `iteration_end` returned.
#[test]
fn saves_racing_iteration_end_land_inside_the_window_or_fail() {
    const ROUNDS: u64 = 4;
    let layout = Layout { blocks: vec![("pc.ram", 16 * MIB, vec![])] };
    let src_ram = layout.source_ram(21);
    let dst_ram = layout.dest_ram();
    let config = Config::default();
    let (source, dest) = connect(&layout.registry(&src_ram, 0), &config, layout.registry(&dst_ram, 0), &config);
    let per_round = 16 * MIB / PAGE / ROUNDS;
    let mut accepted = 0;
    for round in 0..ROUNDS {
        let first = round * per_round;
        source.iteration_begin().unwrap();
        let saving = AtomicBool::new(false);
        let (source, saving, src) = (&source, &saving, &src_ram[0]);
        let (saved, before, written): (Vec<u64>, Vec<u8>, u64) = thread::scope(|s| {
            let workers: Vec<_> = (0..3u64)
                .map(|t| {
                    s.spawn(move || {
                        let mut ok = Vec::new();
                        for i in 0.. {
                            let page = first + (t * per_round / 3 + i * 5) % per_round;
                            match source.save(0, page * PAGE, PAGE) {
                                Ok(()) => ok.push(page),
                                Err(e) => {
                                    assert_eq!(e.kind, ErrorKind::State, "{e}");
                                    return ok;
                                }
                            }
                            saving.store(true, Ordering::Relaxed);
                        }
                        ok
                    })
                })
                .collect();
            while !saving.load(Ordering::Relaxed) {
                thread::yield_now();
            }
            thread::sleep(Duration::from_millis(5 + 5 * round));
            source.iteration_end().unwrap();
            let written = source.stats().bytes_written;
            // The window is over: its memory is the hypervisor's again.
            let start = first * PAGE;
            let before = src.bytes()[start as usize..][..(per_round * PAGE) as usize].to_vec();
            for (i, word) in before.chunks_exact(8).enumerate() {
                src.write_u64(start + 8 * i as u64, !u64::from_le_bytes(word.try_into().unwrap()));
            }
            (workers.into_iter().flat_map(|w| w.join().unwrap()).collect(), before, written)
        });
        thread::sleep(Duration::from_millis(300)); // more than the idle engine's 100 ms
        assert_eq!(source.stats().bytes_written, written, "round {round}: a save was written after its window ended");
        assert_eq!(dest.wait_iteration(round + 1, Some(Duration::from_secs(30))).unwrap(), round + 1);
        let d = dst_ram[0].bytes();
        for &page in &saved {
            let at = ((page - first) * PAGE) as usize;
            let got = &d[(page * PAGE) as usize..][..PAGE as usize];
            assert!(got == &before[at..at + PAGE as usize], "round {round}: page {page} was saved but is not in place");
        }
        accepted += saved.len();
    }
    eprintln!("{accepted} saves landed inside their windows; 3 per round were refused after the end");
    drop(source);
}

/// A connection left idle for many liveness periods stays up: each side's
/// zero-length RDMA WRITE probes are answered by the peer's NIC (and touch
/// no memory); the migration then completes.
#[test]
fn idle_connection_survives_its_liveness_probes() {
    let layout = Layout { blocks: vec![("pc.ram", 4 * MIB, vec![])] };
    let src_ram = layout.source_ram(31);
    let dst_ram = layout.dest_ram();
    let config = Config { liveness: Some(Duration::from_millis(600)), ..Config::default() };
    let (source, dest) = connect(&layout.registry(&src_ram, 0), &config, layout.registry(&dst_ram, 0), &config);
    source.iteration_begin().unwrap();
    source.save(0, 0, 4 * MIB).unwrap();
    source.iteration_end().unwrap();
    // About 10 probe periods with nothing else on the wire, each side waiting
    // (the destination for the next message, the source's engine idle).
    thread::sleep(Duration::from_secs(2));
    assert!(source.error().is_none(), "{:?}", source.error());
    assert!(dest.error().is_none(), "{:?}", dest.error());
    source.put(b"after the idle time").unwrap();
    assert_eq!(source.close().unwrap(), rdmamig::Ending::Completed);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(10))).unwrap(), rdmamig::Ending::Completed);
    assert!(src_ram[0].bytes() == dst_ram[0].bytes());
}

/// Pin-all is only negotiated when a side's pin budget holds all its RAM:
/// otherwise that side does not offer (source) or grant (destination) it,
/// both register dynamically, and the migration stays within the budget.
#[test]
fn pin_all_past_a_pin_budget_falls_back_to_dynamic_registration() {
    let len = 32 * MIB;
    for (src_budget, dst_budget) in [(Some(8 * MIB), None), (None, Some(8 * MIB))] {
        let src_ram = GuestRam::new(len, 0x5a);
        let dst_ram = GuestRam::new(len, 0);
        let src_config = Config { pin_all: true, pin_budget: src_budget, ..Config::default() };
        let dst_config = Config { pin_all: true, pin_budget: dst_budget, ..Config::default() };
        let (source, dest) = connect(&one_block(&src_ram, len), &src_config, one_block(&dst_ram, len), &dst_config);
        assert!(!source.negotiated().pin_all && !dest.negotiated().pin_all, "budgets {src_budget:?}/{dst_budget:?}");
        source.iteration_begin().unwrap();
        source.save(0, 0, len).unwrap();
        source.iteration_end().unwrap();
        let (src_stats, dst_stats) = (source.stats(), dest.stats());
        assert_eq!(source.close().unwrap(), rdmamig::Ending::Completed);
        assert_eq!(dest.wait_end(Some(Duration::from_secs(30))).unwrap(), rdmamig::Ending::Completed);
        assert!(src_ram.bytes() == dst_ram.bytes(), "RAM differs");
        for (side, stats, budget) in [("source", src_stats, src_budget), ("destination", dst_stats, dst_budget)] {
            assert!(stats.pinned_bytes_peak <= budget.unwrap_or(u64::MAX), "{side} pinned {stats:?}");
            assert_eq!(stats.pin_all_progress_bytes, 0, "{side} started pin-all");
        }
        assert!(src_stats.chunks_registered >= len / MIB, "dynamic registration: {src_stats:?}");
    }
}
