//! Hints order which chunks the source unpins when its pin budget is full:
//! cold first, hot last, least recently used within a class.
//!
//! The stats count unpins (and cold ones) but do not name the chunk; which
//! chunk went is read back from `chunks_registered` when it is sent again: a
//! chunk still pinned is written with its registration, an unpinned one is
//! registered anew (on both sides: toward an rdmamig destination an unpin
//! drops the destination's registration too).

use std::time::Duration;

use rdmamig::{Config, Destination, Ending, Hint, Source, Stats};

use crate::migration::{connect, Layout, Rng};

const MIB: u64 = 1 << 20;
const CHUNKS: u64 = 16;

/// What one window changed in the source's stats.
#[derive(Debug, PartialEq, Eq)]
struct Delta {
    registered: u64,
    unpins: u64,
    unpins_cold: u64,
}

fn delta(before: &Stats, after: &Stats) -> Delta {
    Delta {
        registered: after.chunks_registered - before.chunks_registered,
        unpins: after.unpins - before.unpins,
        unpins_cold: after.unpins_cold - before.unpins_cold,
    }
}

fn d(registered: u64, unpins: u64, unpins_cold: u64) -> Delta {
    Delta { registered, unpins, unpins_cold }
}

struct Run {
    source: Source,
    dest: Destination,
    windows: u64,
    label: &'static str,
}

impl Run {
    /// One window saving `chunks` (1 MiB each); returns the change in the
    /// source's stats, checking that the destination counted the same.
    fn window(&mut self, chunks: &[u64]) -> Delta {
        let before = self.source.stats();
        self.source.iteration_begin().unwrap();
        for &c in chunks {
            self.source.save(0, c * MIB, MIB).unwrap();
        }
        self.source.iteration_end().unwrap();
        self.windows += 1;
        assert_eq!(self.dest.wait_iteration(self.windows, Some(Duration::from_secs(30))).unwrap(), self.windows);
        let (after, dst) = (self.source.stats(), self.dest.stats());
        // The destination serves what the source asks and drops what it unregisters.
        assert_eq!(dst.chunks_registered, after.chunks_registered, "{}: {dst:?}", self.label);
        assert_eq!(dst.unpins, after.unpins, "{}: {dst:?}", self.label);
        assert!(after.pinned_bytes_peak <= 4 * MIB, "{}: over the budget: {after:?}", self.label);
        let delta = delta(&before, &after);
        eprintln!("{}: window {} saved chunks {chunks:?}: {delta:?}", self.label, self.windows);
        delta
    }
}

/// Source with a 4 MiB (4-chunk) pin budget, destination unlimited, rdmamig
/// extensions on, a 16 MiB block of random data. Every window's expected
/// change in the stats follows from the LRU: see the comments.
fn unpin_order(hinted: bool) {
    let label = if hinted { "hinted" } else { "no hints" };
    let layout = Layout { blocks: vec![("pc.ram", CHUNKS * MIB, vec![])] };
    let src_ram = layout.source_ram(if hinted { 21 } else { 22 });
    let dst_ram = layout.dest_ram();
    let src_config = Config { pin_budget: Some(4 * MIB), ..Config::default() };
    let dst_config = Config::default();
    let (source, dest) = connect(&layout.registry(&src_ram, 0), &src_config, layout.registry(&dst_ram, 0), &dst_config);
    assert!(source.negotiated().extensions && !source.negotiated().pin_all);
    assert_eq!(source.stats().pin_budget, 4 * MIB, "the guest's RLIMIT_MEMLOCK lowered the source's budget");
    // An unlimited destination announces no budget: only the source's counts.
    assert_eq!(dest.stats().pin_budget, u64::MAX, "the destination has a pin budget (RLIMIT_MEMLOCK?)");
    let mut run = Run { source, dest, windows: 0, label };
    let mut rng = Rng::new(if hinted { 31 } else { 32 });
    // Changes a word of each page of chunk `c` (never to zero: a page that
    // was zero when registered would make the chunk's registration stale).
    let change = |rng: &mut Rng, c: u64| {
        for page in 0..MIB / 4096 {
            src_ram[0].write_u64(c * MIB + page * 4096 + (rng.next() % 512) * 8, rng.next() | 1);
        }
    };

    // 1: chunks 0..=3 fill the budget (registered two per request: half the
    //    budget); LRU order 0, 1, 2, 3.
    assert_eq!(run.window(&[0, 1, 2, 3]), d(4, 0, 0));
    if hinted {
        // Order now: 3 (cold), 1, 2, 0 (hot).
        run.source.hint(0, 3 * MIB, MIB, Hint::Cold).unwrap();
        run.source.hint(0, 0, MIB, Hint::Hot).unwrap();
    }
    // 2: chunk 4 needs room: one unpin, of chunk 3 (cold) or, without hints,
    //    of chunk 0 (least recently used).
    assert_eq!(run.window(&[4]), d(1, 1, hinted as u64));
    // 3: chunk 5: one more unpin, chunk 1 either way (the oldest normal one
    //    with hints, as chunk 0 is hot; the oldest without).
    assert_eq!(run.window(&[5]), d(1, 1, 0));
    // 4: chunk 0 again. Hot, it stayed pinned: written with its
    //    registrations, nothing registered or unpinned. Without hints it was
    //    the first to go: registered again, unpinning chunk 2.
    change(&mut rng, 0);
    assert_eq!(run.window(&[0]), if hinted { d(0, 0, 0) } else { d(1, 1, 0) });
    // 5: chunk 3 again. With hints it was unpinned in window 2: registered
    //    again, unpinning chunk 2 (chunk 3 itself is cold again but is the one
    //    being written). Without hints it is still pinned.
    change(&mut rng, 3);
    assert_eq!(run.window(&[3]), if hinted { d(1, 1, 0) } else { d(0, 0, 0) });
    // 6: chunk 1 (unpinned in window 3 either way) again: registered, and
    //    with hints the victim is chunk 3, pinned again but still cold (a hint
    //    outlives the registration); without hints chunk 4, the oldest.
    change(&mut rng, 1);
    assert_eq!(run.window(&[1]), d(1, 1, hinted as u64));

    // Last window: every chunk, so the destination ends byte-identical (the
    // source unpins as it goes; the chunks changed above were sent again).
    run.window(&(0..CHUNKS).collect::<Vec<_>>());
    let stats = run.source.stats();
    eprintln!("{label}: source {stats:?}");
    assert_eq!(run.source.close().unwrap(), Ending::Completed);
    assert_eq!(run.dest.wait_end(Some(Duration::from_secs(10))).unwrap(), Ending::Completed);
    assert!(src_ram[0].bytes() == dst_ram[0].bytes(), "{label}: the destination's RAM differs");
}

#[test]
fn hints_choose_which_chunks_are_unpinned_first() {
    unpin_order(true);
}

/// The control: the same windows without hints unpin in LRU order.
#[test]
fn without_hints_the_least_recently_used_chunk_is_unpinned_first() {
    unpin_order(false);
}
