//! What the unregistration worker saves at the end of a migration: one
//! process migrates a guest of `--mib` MiB from a source to a destination
//! over RDMA (dynamic registration, 1 MiB chunks), once with the worker and
//! once without (`Config::unregister_worker`, both sides), and prints for
//! each: the time of the first and of the final `iteration_end`, of the
//! source's `close`, of the destination's end (`wait_end` after the source
//! closed, then `close`), the memory still pinned right after (the kernel's
//! count for the process, /proc/self/status VmPin, both sides together; the
//! destination's `pinned_bytes`), and, with the worker, how long
//! `Unregistration::flush` then takes (the source's handle, from
//! `Source::unregistration`, is held past `close` so that `close` does not
//! wait for the deregistrations).
//!
//! ```text
//! cargo build --release --features rdma-tests --example unregister_bench
//! unregister_bench [--mib N] [--final-mib N] [--budget-mib N] [--modes on,off]
//! ```
//!
//! `--final-mib` (default 64): the final window sends that many 1 MiB
//! chunks, spread over the block and changed first. `--budget-mib`: a pin
//! budget for the source (default none), so that windows unpin chunks (and
//! the final one waits for deregistrations without the worker). Needs an
//! RDMA device at `RXE_VM_IP` (default 198.18.0.1) and root or a large
//! `ulimit -l`; scripts/bench-unregister.sh runs it in an rxe guest. Each
//! mode prints one `unregister_bench: mode=...` line of `key=value` figures
//! (times in ms, sizes in MiB).
//!
//! Both sides share this process, and so its one unregistration worker: a
//! flush (and, with a budget, the source's wait for room) also waits for the
//! destination's deregistrations, and VmPin counts both sides.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, Ending, Listener, Source, Unregistration};

#[path = "common/mod.rs"]
mod common;
use common::Ram;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
const WAIT: Duration = Duration::from_secs(600);

/// This benchmark's writes into guest RAM.
impl Ram {
    fn fill(&self, byte: u8) {
        // SAFETY: within the mapping; nothing reads it concurrently.
        unsafe { std::ptr::write_bytes(self.ptr, byte, self.len) }
    }

    /// Writes a distinct non-zero word into every page of `[start, start + len)`.
    fn stamp(&self, start: u64, len: u64, seed: u64) {
        for off in (start..start + len).step_by(PAGE as usize) {
            let value = (off ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            // SAFETY: within the mapping, 8-byte aligned.
            unsafe { (self.ptr.add(off as usize + 64) as *mut u64).write_volatile(value) }
        }
    }
}

/// The kernel's count of this process's pinned memory (VmPin), in bytes.
fn vm_pin() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(u64::MAX, |kb| kb * 1024)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB as f64)
}

struct Args {
    mib: u64,
    final_mib: u64,
    budget_mib: Option<u64>,
    modes: Vec<bool>,
}

fn usage() -> ! {
    eprintln!("usage: unregister_bench [--mib N] [--final-mib N] [--budget-mib N] [--modes on,off]");
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut args = Args { mib: 1024, final_mib: 64, budget_mib: None, modes: vec![true, false] };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        let number = |v: String| v.parse::<u64>().unwrap_or_else(|_| usage());
        match a.as_str() {
            "--mib" => args.mib = number(value()),
            "--final-mib" => args.final_mib = number(value()),
            "--budget-mib" => args.budget_mib = Some(number(value())),
            "--modes" => {
                args.modes = value()
                    .split(',')
                    .map(|m| match m {
                        "on" => true,
                        "off" => false,
                        _ => usage(),
                    })
                    .collect()
            }
            _ => usage(),
        }
    }
    if args.mib == 0 || args.final_mib == 0 || args.final_mib > args.mib {
        usage();
    }
    args
}

/// One migration of `src` into `dst` with the worker on or off; prints its line.
fn migrate(args: &Args, src: &Ram, dst: &Ram, worker: bool, seed: u64) {
    let ip = common::perftest::ip();
    let len = args.mib * MIB;
    let dst_config = Config { unregister_worker: worker, ..Config::default() };
    let src_config =
        Config { unregister_worker: worker, pin_budget: args.budget_mib.map(|m| m * MIB), ..dst_config.clone() };
    let listener = Listener::bind(&ip, 0, &dst_config).expect("listen");
    let port = listener.port();
    let dst_ram = dst.registry();
    let accept = thread::spawn(move || Destination::accept(&listener, &dst_ram, Some(WAIT)).expect("accept"));
    let source = Source::connect(&ip, port, &src_config, &src.registry()).expect("connect");
    let dest = accept.join().unwrap();

    // Window 1: the whole guest.
    let t = Instant::now();
    source.iteration_begin().unwrap();
    for off in (0..len).step_by(MIB as usize) {
        source.save(0, off, MIB.min(len - off)).unwrap();
    }
    source.iteration_end().unwrap();
    let first = t.elapsed();

    // The final window: `final_mib` chunks spread over the block, changed first.
    let chunks = args.mib;
    let step = chunks / args.final_mib;
    let finals: Vec<u64> = (0..args.final_mib).map(|i| i * step).collect();
    for &c in &finals {
        src.stamp(c * MIB, MIB.min(len - c * MIB), seed);
    }
    let t = Instant::now();
    source.iteration_begin().unwrap();
    for &c in &finals {
        source.save(0, c * MIB, MIB.min(len - c * MIB)).unwrap();
    }
    source.iteration_end().unwrap();
    let last = t.elapsed();
    let s = source.stats();

    // Close: the source's handle on the worker stays held past it.
    let handle: Option<Arc<Unregistration>> = source.unregistration();
    assert_eq!(handle.is_some(), worker);
    let t = Instant::now();
    assert_eq!(source.close().expect("source close"), Ending::Completed);
    let close = t.elapsed();
    let t = Instant::now();
    assert_eq!(dest.wait_end(Some(WAIT)).expect("destination end"), Ending::Completed);
    let wait_end = t.elapsed();
    let t = Instant::now();
    dest.close();
    let dest_close = t.elapsed();
    let pinned_after_close = vm_pin();
    let d = dest.stats();

    let mut line = format!(
        "unregister_bench: mode={} mib={} final_mib={} budget_mib={} first_iteration_end_ms={} \
         final_iteration_end_ms={} source_close_ms={} dest_wait_end_ms={} dest_close_ms={} \
         vmpin_after_close_mib={} dest_pinned_after_close_mib={} dest_queue_after_close={} \
         source_pinned_before_close_mib={} source_unpins={} source_pin_wait_ms={}",
        if worker { "worker" } else { "inline" },
        args.mib,
        args.final_mib,
        args.budget_mib.map_or("none".to_string(), |b| b.to_string()),
        ms(first),
        ms(last),
        ms(close),
        ms(wait_end),
        ms(dest_close),
        mib(pinned_after_close),
        mib(d.pinned_bytes),
        d.unregister_queue_depth,
        mib(s.pinned_bytes),
        s.unpins,
        ms(Duration::from_nanos(s.pin_wait_ns)),
    );
    drop(dest);
    if let Some(handle) = handle {
        let t = Instant::now();
        handle.flush();
        let flush = t.elapsed();
        let pinned_after_flush = vm_pin();
        // The last handle: joins the (idle) worker.
        let t = Instant::now();
        drop(handle);
        let join = t.elapsed();
        assert!(Unregistration::running().is_none(), "something else holds the unregistration worker");
        line += &format!(
            " flush_ms={} vmpin_after_flush_mib={} worker_join_ms={}",
            ms(flush),
            mib(pinned_after_flush),
            ms(join)
        );
    } else {
        line += &format!(" flush_ms=0 vmpin_after_flush_mib={} worker_join_ms=0", mib(vm_pin()));
    }
    println!("{line}");
    assert!(src.bytes() == dst.bytes(), "the destination's RAM differs from the source's");
}

fn main() {
    let args = parse_args();
    let len = args.mib * MIB;
    let t = Instant::now();
    let src = Ram::anonymous(len).expect("guest RAM");
    src.fill(0x5a);
    src.stamp(0, len, 0);
    // Faulted in up front, so neither mode pays for the destination's page faults.
    let dst = Ram::anonymous(len).expect("guest RAM");
    dst.fill(0xaa);
    eprintln!("unregister_bench: {} MiB per side ready in {} ms", args.mib, ms(t.elapsed()));
    for (i, &worker) in args.modes.iter().enumerate() {
        migrate(&args, &src, &dst, worker, i as u64 + 1);
    }
}
