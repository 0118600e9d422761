//! What `Destination::wait_iteration` promises: every page saved in a window
//! is in place when the window is reported. The source gathers small RDMA
//! WRITEs for one post; they must go out before the window's end message
//! (RC delivers in order, so the destination then sees them first).

use std::time::Duration;

use rdmamig::Config;

use crate::migration::{connect, one_block, GuestRam, Rng, PAGE};

const PAGES: u64 = 4096;
const WINDOWS: u64 = 20;
/// Scattered pages per window, at least (even pages only: never adjacent,
/// one write each); windows vary the count so that most leave a partly
/// filled gathering of writes at their end.
const PER_WINDOW: u64 = 33;
const WAIT: Option<Duration> = Some(Duration::from_secs(30));

fn reported_windows_have_their_pages_in_place(config: Config) {
    let len = PAGES * PAGE;
    let (src, dst) = (GuestRam::new(len, 1), GuestRam::new(len, 0));
    let (mut source, dest) = connect(&one_block(&src, len), &config, one_block(&dst, len), &config);
    source.iteration_begin().unwrap();
    source.save(0, 0, len).unwrap();
    source.iteration_end().unwrap();
    dest.wait_iteration(1, WAIT).unwrap();
    let mut rng = Rng::new(11);
    for window in 2..=WINDOWS + 1 {
        let pages: Vec<u64> = (0..PER_WINDOW + window % 13).map(|_| rng.next() % (PAGES / 2) * 2).collect();
        source.iteration_begin().unwrap();
        for &p in &pages {
            src.write_u64(p * PAGE, window << 32 | p);
            source.save(0, p * PAGE, PAGE).unwrap();
        }
        source.iteration_end().unwrap();
        dest.wait_iteration(window, WAIT).unwrap();
        // The last saves first: they are what an early end message would overtake.
        for &p in pages.iter().rev() {
            // SAFETY: inside the mapping; read while nothing writes it (the window is over).
            let got = unsafe { (dst.ptr().add((p * PAGE) as usize) as *const u64).read_volatile() };
            assert_eq!(got, window << 32 | p, "window {window}: page {p} not in place when the window was reported");
        }
    }
    source.close().unwrap();
    dest.wait_end(WAIT).unwrap();
}

#[test]
fn reported_windows_have_their_pages_in_place_between_rdmamig_peers() {
    reported_windows_have_their_pages_in_place(Config::default());
}

#[test]
fn reported_windows_have_their_pages_in_place_qemu_compatible() {
    reported_windows_have_their_pages_in_place(Config { extensions: false, ..Config::default() });
}
