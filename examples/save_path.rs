//! The source's save path on the host, no RDMA needed (prints figures):
//!
//! (a) the zero scan, each variant this CPU runs, against a plain read of the
//!     same 1 GiB of zero pages (a vectorised sum of its words), in GB/s;
//! (b) a 16 GiB block with 1 % of its 4 KiB pages dirty (at random) queued by
//!     one `save_bitmap` call against one `save` call per dirty page, through
//!     the real queueing front end (checks, window lock, queue, wake-ups),
//!     with a drain thread standing in for the transfer thread: it pops,
//!     counts and hands group buffers back, as the transfer thread does.
//!     The block is reserved, never touched: nothing reads guest RAM here.
//!
//! cargo run --release --features bench-internals --example save_path [zero|save]
//! (SAVE_PATH_ROUNDS=n: the median of n runs per figure, 7 by default)

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::bench_internals::{zero_scans, Front};
use rdmamig::RamBlocks;

const GIB: usize = 1 << 30;
const PAGE: u64 = 4096;
/// Runs per figure (the median is printed); `SAVE_PATH_ROUNDS` sets more, e.g. to profile.
fn rounds() -> usize {
    std::env::var("SAVE_PATH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(7)
}

/// An anonymous private mapping of `len` bytes, reserved but not backed.
fn map(len: usize) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap of {len} bytes: {}", std::io::Error::last_os_error());
    p as *mut u8
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to fill.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) }, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn zero_scan() {
    let len = GIB;
    let buf = map(len);
    // Real zero pages: a write fault gives each page its own frame (reading
    // an untouched mapping would read the kernel's one shared zero page).
    for off in (0..len).step_by(PAGE as usize) {
        // SAFETY: inside the mapping.
        unsafe { buf.add(off).write_volatile(0) };
    }
    // Each figure reads 1 GiB: the whole buffer once (from memory), or its
    // first 256 KiB over and over (from the L2 cache: what each variant
    // costs the CPU).
    for (what, region) in [("1 GiB of zero pages, from memory", len), ("256 KiB, 4096 times, from cache", 256 << 10)] {
        let repeats = len / region;
        // GB/s of `read` over `repeats` times `region` bytes: median, best.
        let rate = |read: &dyn Fn(*const u8, usize)| {
            let runs: Vec<f64> = (0..rounds())
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..repeats {
                        read(black_box(buf), region);
                    }
                    len as f64 / t.elapsed().as_secs_f64() / 1e9
                })
                .collect();
            (median(runs.clone()), runs.iter().cloned().fold(0.0, f64::max))
        };
        println!("(a) zero scan of {what}: GB/s, median of {} (best)", rounds());
        let plain = rate(&|p, n| {
            // SAFETY: the mapping is page aligned and `n` bytes of it are initialised.
            let words = unsafe { std::slice::from_raw_parts(p as *const u64, n / 8) };
            black_box(words.iter().fold(0u64, |a, &w| a.wrapping_add(w)));
        });
        println!("  {:<30} {:6.2} ({:6.2})", "plain read (sum of words)", plain.0, plain.1);
        for v in zero_scans() {
            // SAFETY: the mapping holds `n` bytes from `p`.
            let (m, best) = rate(&|p, n| assert!(unsafe { (v.scan)(p, n) }));
            println!("  {:<30} {m:6.2} ({best:6.2})  {:.2}x the plain read", v.name, m / plain.0);
        }
    }
    // SAFETY: unmaps what `map` mapped; nothing refers to it any more.
    unsafe { libc::munmap(buf as *mut _, len) };
}

/// What the drain thread has taken off the queue.
#[derive(Default)]
struct Drained {
    ranges: AtomicU64,
    bytes: AtomicU64,
    stop: AtomicBool,
}

fn bitmap_save() {
    let len: u64 = 16 << 30;
    let pages = len / PAGE;
    let host = map(len as usize);
    let mut ram = RamBlocks::new();
    // SAFETY: the mapping stays until the end of this function, after the front is gone.
    unsafe { ram.add("pc.ram", host, 0, len) }.expect("block");
    let front = Arc::new(Front::new(ram, None));
    let drained = Arc::new(Drained::default());
    let drain = {
        let (front, drained) = (front.clone(), drained.clone());
        thread::spawn(move || {
            while !drained.stop.load(Ordering::Relaxed) {
                match front.drain_one() {
                    Some((r, b)) => {
                        drained.ranges.fetch_add(r, Ordering::Relaxed);
                        drained.bytes.fetch_add(b, Ordering::Release);
                    }
                    // As the transfer thread does when idle.
                    None => thread::park_timeout(Duration::from_millis(100)),
                }
            }
        })
    };
    front.set_consumer(drain.thread().clone());

    // 1 % of the pages dirty, at random.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut bitmap = vec![0u64; pages.div_ceil(64) as usize];
    let mut dirty = Vec::new();
    for page in 0..pages {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x % 100 == 0 {
            bitmap[(page / 64) as usize] |= 1 << (page % 64);
            dirty.push(page);
        }
    }
    let bytes = dirty.len() as u64 * PAGE;
    // Times one window's saves, in ms: the call(s) (wall clock, and this
    // thread's CPU time, which leaves out time the host scheduled others),
    // and until the drain thread has all of it.
    let window = |save: &dyn Fn()| {
        let before = drained.bytes.load(Ordering::Acquire);
        front.open_window();
        let (t, cpu) = (Instant::now(), thread_cpu());
        save();
        let (called, called_cpu) = (t.elapsed(), thread_cpu() - cpu);
        while drained.bytes.load(Ordering::Acquire) < before + bytes {
            std::hint::spin_loop();
        }
        let all = t.elapsed();
        assert!(front.close_window());
        [called.as_secs_f64() * 1e3, called_cpu.as_secs_f64() * 1e3, all.as_secs_f64() * 1e3]
    };
    let by_bitmap = || front.save_bitmap(0, &bitmap, 0, pages, PAGE).unwrap();
    let per_page = || dirty.iter().for_each(|&p| front.save(0, p * PAGE, PAGE).unwrap());
    let ranges_before = drained.ranges.load(Ordering::Relaxed);
    window(&by_bitmap);
    let runs = drained.ranges.load(Ordering::Relaxed) - ranges_before;
    window(&per_page);
    let (mut b, mut p) = (Vec::new(), Vec::new());
    for _ in 0..rounds() {
        b.push(window(&by_bitmap));
        p.push(window(&per_page));
    }
    drained.stop.store(true, Ordering::Relaxed);
    drain.thread().unpark();
    drain.join().unwrap();

    println!(
        "(b) 16 GiB block, {} of {pages} pages dirty (1 %), {runs} runs; median of {} windows",
        dirty.len(),
        rounds()
    );
    let med = |v: &[[f64; 3]], i: usize| median(v.iter().map(|t| t[i]).collect());
    let min = |v: &[[f64; 3]], i: usize| v.iter().map(|t| t[i]).fold(f64::MAX, f64::min);
    println!("  {:<31} {:>21} {:>12} {:>17}", "", "call(s): wall (min)", "call(s) CPU", "until all popped");
    for (name, v) in [("save_bitmap, one call", &b), ("save, one call per dirty page", &p)] {
        println!("  {name:<31} {:>9.3} ms ({:.3}) {:>9.3} ms {:>14.3} ms", med(v, 0), min(v, 0), med(v, 1), med(v, 2));
    }
    println!(
        "  per-page / bitmap: {:.1}x (call wall), {:.1}x (call wall, min), {:.1}x (call CPU), {:.1}x (until all popped)",
        med(&p, 0) / med(&b, 0),
        min(&p, 0) / min(&b, 0),
        med(&p, 1) / med(&b, 1),
        med(&p, 2) / med(&b, 2)
    );
    drop(front);
    // SAFETY: the front (and its registry) is gone; nothing refers to the mapping.
    unsafe { libc::munmap(host as *mut _, len as usize) };
}

/// `save_path [zero|save]`: both parts, or one (to profile it alone).
fn main() {
    let only = std::env::args().nth(1);
    if only.as_deref() != Some("save") {
        zero_scan();
    }
    if only.as_deref() != Some("zero") {
        bitmap_save();
    }
}
