//! What `Destination::wait_iteration` promises: every page saved in a window
//! is in place when the window is reported. The source gathers small RDMA
//! WRITEs for one post; they must go out before the window's end message
//! (RC delivers in order, so the destination then sees them first). And the
//! zero ranges of the window (COMPRESS) must go out before its end, even
//! those of chunks first touched after every other chunk was registered.

use std::time::{Duration, Instant};

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
    let (source, dest) = connect(&one_block(&src, len), &config, one_block(&dst, len), &config);
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

/// Every page of a data chunk is saved, and once the source has asked for
/// all of them (it goes idle and registers them), the pages of an all-zero
/// chunk follow: they travel as a zero range with no registration to carry
/// it, and the window's end must not leave it behind.
fn zero_chunk_saved_after_the_rest_is_zeroed_in_its_window(config: Config) {
    const MIB: u64 = 1 << 20;
    let len = 4 * MIB;
    let src = GuestRam::new(len, 1);
    // The last chunk is zero on the source, garbage on the destination.
    unsafe { std::ptr::write_bytes(src.ptr().add((3 * MIB) as usize), 0, MIB as usize) };
    let dst = GuestRam::new(len, 0xAA);
    let (source, dest) = connect(&one_block(&src, len), &config, one_block(&dst, len), &config);
    source.iteration_begin().unwrap();
    source.save(0, 0, 3 * MIB).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while source.stats().chunks_registered < 3 {
        assert!(Instant::now() < deadline, "the source never asked for its 3 data chunks: {:?}", source.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    for page in (3 * MIB..len).step_by(PAGE as usize) {
        source.save(0, page, PAGE).unwrap();
    }
    source.iteration_end().unwrap();
    dest.wait_iteration(1, WAIT).unwrap();
    // SAFETY: inside the mapping; the window is over, nothing writes it.
    let zero_chunk = unsafe { std::slice::from_raw_parts(dst.ptr().add((3 * MIB) as usize), MIB as usize) };
    let not_zero = zero_chunk.iter().position(|&b| b != 0);
    assert_eq!(not_zero, None, "the zero chunk was not zeroed when its window was reported");
    assert!(src.bytes() == dst.bytes());
    source.close().unwrap();
    dest.wait_end(WAIT).unwrap();
}

#[test]
fn zero_chunk_saved_after_the_rest_is_zeroed_in_its_window_between_rdmamig_peers() {
    zero_chunk_saved_after_the_rest_is_zeroed_in_its_window(Config::default());
}

#[test]
fn zero_chunk_saved_after_the_rest_is_zeroed_in_its_window_qemu_compatible() {
    zero_chunk_saved_after_the_rest_is_zeroed_in_its_window(Config { extensions: false, ..Config::default() });
}
