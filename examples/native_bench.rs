//! The library's own CPU cost per GiB, natively, and its tables at the scale
//! of multi-TiB guests: no RDMA device, no guest (docs/benchmarks.md,
//! "Native CPU cost and scale"; `make bench-native` runs it through
//! scripts/bench-native.py, which draws the plots).
//!
//! path: both sides' CPU path for saved RAM (`CpuPath`: runs, merging,
//!   zero detection at a chunk's first touch, registrations served by the
//!   destination's dispatcher, the writes the link would post counted by a
//!   sink; nothing is transferred), per core (this thread's CPU time):
//!   - a chunk's first touch over populated memory, all-zero pages and data
//!     pages, beside a plain read of the same memory (the memory's limit);
//!   - later windows (every chunk registered) from a dirty bitmap
//!     (`save_bitmap`) and from the same pages as ranges (`save_ranges`),
//!     1, 10 and 100 % dirty, at random and clustered, beside a plain
//!     popcount of the bitmap.
//!
//! scale: RAM blocks of 1, 2 and 4 TiB (reserved, never touched), on both
//!   sides: the tables built (time, the library's heap), every chunk
//!   registered (time, heap), then 1 % of the pages dirty (at random) saved
//!   by `save_bitmap` and taken through the path.
//!
//! cargo run --release --features bench-internals --example native_bench -- [--quick] [--tsv FILE] [path|scale]
//! Each figure is the median of three runs (min and max beside it). --quick:
//! small sizes, to check that it runs (CI); its figures mean little.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use rdmamig::bench_internals::{zero_scans, CpuPath, Front};
use rdmamig::{RamBlocks, SaveRange};

/// Counts the heap in use: what the library's tables take.
struct Counting;

static HEAP: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is System's; the counter only adds up sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HEAP.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as `dealloc`, and the caller's new size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PAGE: u64 = 4096;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
const RUNS: usize = 3;
/// Dirty pages are saved in slices of this much guest RAM, each then taken
/// through the path: the front queues at most 64 GiB of bitmap at once.
const SLICE: u64 = 4 * GIB;

/// Sizes: the populated memory of the first-touch figures, the block of
/// the later-window figures, and the guests of the scale run.
struct Sizes {
    memory: u64,
    block: u64,
    guests: [u64; 3],
}

const FULL: Sizes = Sizes { memory: GIB, block: 64 * GIB, guests: [TIB, 2 * TIB, 4 * TIB] };
const QUICK: Sizes = Sizes { memory: 64 << 20, block: 4 * GIB, guests: [16 * GIB, 32 * GIB, 64 * GIB] };

/// The figures, printed as they come and kept for `--tsv`.
#[derive(Default)]
struct Report {
    tsv: String,
}

impl Report {
    /// One figure from its runs: median (min, max).
    fn figure(&mut self, section: &str, name: &str, unit: &str, runs: &[f64]) -> f64 {
        let mut v = runs.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let (med, min, max) = (v[v.len() / 2], v[0], v[v.len() - 1]);
        println!("  {name:<52} {med:>10.3} {unit:<9} ({min:.3} - {max:.3})");
        writeln!(self.tsv, "{section}\t{name}\t{med}\t{min}\t{max}\t{unit}").unwrap();
        med
    }

    fn note(&mut self, section: &str, name: &str, value: String) {
        println!("  {name}: {value}");
        writeln!(self.tsv, "{section}\t{name}\t{value}\t\t\t").unwrap();
    }
}

/// An anonymous private mapping of `len` bytes, reserved but not backed;
/// `None` if the kernel refuses it (overcommit_memory 2 ignores MAP_NORESERVE).
fn map(len: u64) -> Option<Mapping> {
    // SAFETY: a fresh anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(Mapping { ptr: p as *mut u8, len })
}

struct Mapping {
    ptr: *mut u8,
    len: u64,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps what `map` mapped; the registries over it were dropped first.
        unsafe { libc::munmap(self.ptr as *mut _, self.len as usize) };
    }
}

/// Blocks `name0..` of `len` bytes each over consecutive parts of `m`.
fn blocks(m: &Mapping, count: u64, len: u64) -> RamBlocks {
    let mut ram = RamBlocks::new();
    for i in 0..count {
        // SAFETY: inside the mapping, which outlives every registry made from it here.
        unsafe { ram.add(&format!("ram-node{i}"), m.ptr.add((i * len) as usize), i * len, len) }.expect("block");
    }
    ram
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to fill.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) }, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `f` and returns its CPU time on this thread, in seconds.
fn cpu_secs(f: impl FnOnce()) -> f64 {
    let t = thread_cpu();
    f();
    (thread_cpu() - t).as_secs_f64()
}

/// A xorshift generator: the same pages every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// A bitmap of `pages` with a share `ratio` dirty: each page at random, or
/// (`cluster` > 1) runs of `cluster` pages placed at random.
fn dirty_bitmap(pages: u64, ratio: f64, cluster: u64) -> Vec<u64> {
    let mut bits = vec![0u64; pages.div_ceil(64) as usize];
    if ratio >= 1.0 {
        bits.iter_mut().for_each(|w| *w = !0);
        if pages % 64 != 0 {
            *bits.last_mut().unwrap() = (1 << (pages % 64)) - 1;
        }
        return bits;
    }
    // Gaps between runs are geometric: each run starts with probability p.
    let p = ratio / cluster as f64;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut at = 0u64;
    loop {
        at += (rng.unit().ln() / (1.0 - p).ln()) as u64;
        if at >= pages {
            return bits;
        }
        for page in at..(at + cluster).min(pages) {
            bits[(page / 64) as usize] |= 1 << (page % 64);
        }
        at += cluster;
    }
}

/// The runs of set bits of `bits`, as ranges of block `block`.
fn ranges_of(bits: &[u64], pages: u64, block: u32) -> Vec<SaveRange> {
    let mut ranges = Vec::new();
    let mut page = 0;
    while page < pages {
        if bits[(page / 64) as usize] >> (page % 64) & 1 == 0 {
            page += 1;
            continue;
        }
        let start = page;
        while page < pages && bits[(page / 64) as usize] >> (page % 64) & 1 != 0 {
            page += 1;
        }
        ranges.push(SaveRange { block, offset: start * PAGE, len: (page - start) * PAGE });
    }
    ranges
}

/// Saves the dirty pages of `bits` (block `block`, every page of it) slice
/// by slice, each taken through `path`: by `save_bitmap`, or as `ranges`.
fn save(front: &Front, path: &mut CpuPath, block: u32, bits: &[u64], pages: u64, ranges: Option<&[SaveRange]>) {
    let slice = SLICE / PAGE;
    let mut rest = ranges;
    for first in (0..pages).step_by(slice as usize) {
        let n = slice.min(pages - first);
        match &mut rest {
            None => {
                let words = &bits[(first / 64) as usize..(first + n).div_ceil(64) as usize];
                front.save_bitmap(block, words, first, n, PAGE).unwrap();
            }
            Some(rs) => {
                let end = rs.partition_point(|r| r.offset < (first + n) * PAGE);
                front.save_ranges(rs[..end].iter().copied()).unwrap();
                *rs = &rs[end..];
            }
        }
        path.drain(front).unwrap();
    }
}

/// One window: every block's dirty pages in `bits` (`per_block` pages each) saved.
fn window(front: &Front, path: &mut CpuPath, bits: &[u64], per_block: u64, ranges: Option<&[SaveRange]>) {
    front.open_window();
    for (b, words) in bits.chunks((per_block / 64) as usize).enumerate() {
        save(front, path, b as u32, words, per_block, ranges);
    }
    assert!(front.close_window());
}

/// GB/s of a plain sequential read of `len` bytes at `p` (a sum of its words).
fn plain_read(p: *const u8, len: u64) -> f64 {
    // SAFETY: `len` populated bytes of the mapping at `p`, page aligned.
    let words = unsafe { std::slice::from_raw_parts(p as *const u64, (len / 8) as usize) };
    let secs = cpu_secs(|| {
        black_box(words.iter().fold(0u64, |a, &w| a.wrapping_add(w)));
    });
    len as f64 / secs / 1e9
}

fn path(report: &mut Report, sizes: &Sizes) {
    let s = "path";
    // (a) A chunk's first touch over populated memory.
    let len = sizes.memory;
    println!("path (a): first touch of {} MiB of populated memory, GB/s per core", len >> 20);
    let memory = map(len).expect("mmap");
    let dest = map(len).expect("mmap");
    let mut anchor = Vec::new();
    for (what, byte) in [("all-zero pages", 0u8), ("data pages", 0x5a)] {
        // Each page gets a frame of its own (a read of an untouched page would map the shared zero page).
        // SAFETY: the mapping's `len` bytes.
        unsafe { std::ptr::write_bytes(memory.ptr, byte, len as usize) };
        let bits = dirty_bitmap(len / PAGE, 1.0, 1);
        let (mut rates, mut reads) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            reads.push(plain_read(memory.ptr, len));
            let front = Front::new(blocks(&memory, 1, len), None);
            let mut path = CpuPath::new(blocks(&memory, 1, len), blocks(&dest, 1, len)).unwrap();
            let secs = cpu_secs(|| window(&front, &mut path, &bits, len / PAGE, None));
            let posted = path.posted;
            assert_eq!(posted.bytes + posted.zero_bytes, len, "every byte written or zeroed");
            rates.push(len as f64 / secs / 1e9);
        }
        anchor.extend_from_slice(&reads);
        let plain = report.figure(s, &format!("plain read of the same memory ({what})"), "GB/s", &reads);
        if byte == 0 {
            // The scan the library picks, alone, a call per 4 KiB page as at a first touch.
            let scan = zero_scans().pop().expect("the word loop is always there");
            let alone: Vec<f64> = (0..RUNS)
                .map(|_| {
                    let secs = cpu_secs(|| {
                        for off in (0..len).step_by(PAGE as usize) {
                            // SAFETY: a page of the mapping.
                            assert!(unsafe { (scan.scan)(memory.ptr.add(off as usize), PAGE as usize) });
                        }
                    });
                    len as f64 / secs / 1e9
                })
                .collect();
            let alone = report.figure(s, &format!("zero scan alone ({}), by 4 KiB page", scan.name), "GB/s", &alone);
            report.note(s, "zero scan alone: of the plain read", format!("{:.2}", alone / plain));
        }
        let path = report.figure(s, &format!("first touch, {what}"), "GB/s", &rates);
        report.note(s, &format!("first touch, {what}: of the plain read"), format!("{:.2}", path / plain));
    }
    drop((memory, dest));

    // (b) Later windows: every chunk registered.
    let len = sizes.block;
    let pages = len / PAGE;
    println!("path (b): later windows over a {} GiB block, dirty GB/s per core (covered GB/s)", len / GIB);
    let memory = map(len).expect("mmap");
    let dest = map(len).expect("mmap");
    let front = Front::new(blocks(&memory, 1, len), None);
    let mut path = CpuPath::new(blocks(&memory, 1, len), blocks(&dest, 1, len)).unwrap();
    path.register_all().unwrap();
    for ratio in [0.01, 0.1, 1.0] {
        for (pattern, cluster) in [("random", 1), ("clustered", 64)] {
            if ratio == 1.0 && cluster > 1 {
                continue;
            }
            let bits = dirty_bitmap(pages, ratio, cluster);
            let dirty: u64 = bits.iter().map(|w| u64::from(w.count_ones())).sum::<u64>() * PAGE;
            let ranges = ranges_of(&bits, pages, 0);
            let pattern = if ratio == 1.0 { "all" } else { pattern };
            let label = format!("{}% {pattern}", ratio * 100.0);
            let popcount: Vec<f64> = (0..RUNS)
                .map(|_| {
                    let secs = cpu_secs(|| {
                        black_box(bits.iter().map(|w| u64::from(w.count_ones())).sum::<u64>());
                    });
                    len as f64 / secs / 1e9
                })
                .collect();
            report.figure(s, &format!("{label}: popcount of the bitmap, covered"), "GB/s", &popcount);
            for (input, rs) in [("save_bitmap", None), ("save_ranges", Some(&ranges[..]))] {
                let mut secs = Vec::new();
                for _ in 0..RUNS {
                    let before = path.posted;
                    secs.push(cpu_secs(|| window(&front, &mut path, &bits, pages, rs)));
                    assert_eq!(path.posted.bytes - before.bytes, dirty, "every dirty byte written");
                }
                let dirty_rate: Vec<f64> = secs.iter().map(|t| dirty as f64 / t / 1e9).collect();
                let covered: Vec<f64> = secs.iter().map(|t| len as f64 / t / 1e9).collect();
                report.figure(s, &format!("{label}: {input}, dirty"), "GB/s", &dirty_rate);
                report.figure(s, &format!("{label}: {input}, covered"), "GB/s", &covered);
            }
        }
    }
    report.figure(s, "plain read (the memory's limit), all runs of (a)", "GB/s", &anchor);
}

fn scale(report: &mut Report, sizes: &Sizes) {
    let s = "scale";
    println!("scale: four blocks on each side, reserved and never touched");
    for guest in sizes.guests {
        let (Some(memory), Some(dest)) = (map(guest), map(guest)) else {
            let overcommit = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
            report.note(
                s,
                "skipped",
                format!(
                    "the kernel refused a {} GiB MAP_NORESERVE mapping (vm.overcommit_memory {}; 2 ignores \
                     MAP_NORESERVE)",
                    guest / GIB,
                    overcommit.trim()
                ),
            );
            return;
        };
        let size = if guest >= TIB { format!("{} TiB", guest / TIB) } else { format!("{} GiB", guest / GIB) };
        println!(" {size}");
        let pages = guest / PAGE;
        let bits = dirty_bitmap(pages, 0.01, 1);
        let dirty: u64 = bits.iter().map(|w| u64::from(w.count_ones())).sum::<u64>() * PAGE;
        let (mut setup, mut heap, mut register, mut registered_heap, mut saved, mut saved_wall) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..RUNS {
            let heap_before = HEAP.load(Ordering::Relaxed);
            let t = Instant::now();
            let front = Front::new(blocks(&memory, 4, guest / 4), None);
            let mut path = CpuPath::new(blocks(&memory, 4, guest / 4), blocks(&dest, 4, guest / 4)).unwrap();
            setup.push(t.elapsed().as_secs_f64());
            heap.push((HEAP.load(Ordering::Relaxed) - heap_before) as f64);
            register.push(cpu_secs(|| path.register_all().unwrap()));
            registered_heap.push((HEAP.load(Ordering::Relaxed) - heap_before) as f64);
            let t = Instant::now();
            saved.push(cpu_secs(|| window(&front, &mut path, &bits, pages / 4, None)));
            saved_wall.push(t.elapsed().as_secs_f64());
            assert_eq!(path.posted.bytes, dirty, "every dirty byte written");
        }
        let tib = guest as f64 / TIB as f64;
        let per_tib = |v: &[f64]| v.iter().map(|x| x / tib).collect::<Vec<f64>>();
        let share = |v: &[f64]| v.iter().map(|x| x / guest as f64 * 100.0).collect::<Vec<f64>>();
        report.figure(s, &format!("{size}: tables built (both sides), wall"), "s", &setup);
        report.figure(s, &format!("{size}: tables built, per TiB"), "s/TiB", &per_tib(&setup));
        report.figure(s, &format!("{size}: library heap, tables built"), "bytes", &heap);
        report.figure(s, &format!("{size}: library heap, tables built, of guest RAM"), "%", &share(&heap));
        report.figure(s, &format!("{size}: every chunk registered (both sides), CPU"), "s", &register);
        report.figure(s, &format!("{size}: library heap, every chunk registered"), "bytes", &registered_heap);
        report.figure(
            s,
            &format!("{size}: library heap, every chunk registered, of guest RAM"),
            "%",
            &share(&registered_heap),
        );
        report.figure(s, &format!("{size}: 1% dirty saved (save_bitmap through the path), CPU"), "s", &saved);
        report.figure(s, &format!("{size}: 1% dirty saved, wall"), "s", &saved_wall);
        report.figure(s, &format!("{size}: 1% dirty saved, per TiB, CPU"), "s/TiB", &per_tib(&saved));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let tsv = args.iter().position(|a| a == "--tsv").map(|i| args.get(i + 1).expect("--tsv FILE").clone());
    let only = args.iter().find(|a| matches!(a.as_str(), "path" | "scale"));
    let sizes = if quick { &QUICK } else { &FULL };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap().trim().to_owned())
        })
        .unwrap_or_default();
    let mut report = Report::default();
    report.note("host", "cpu", cpu);
    report.note("host", "mode", if quick { "quick".into() } else { "full".into() });
    if only.is_none_or(|o| o == "path") {
        path(&mut report, sizes);
    }
    if only.is_none_or(|o| o == "scale") {
        scale(&mut report, sizes);
    }
    if let Some(file) = tsv {
        std::fs::write(&file, &report.tsv).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}
