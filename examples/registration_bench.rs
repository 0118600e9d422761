//! Registration at the kernel's rate: pin-all as a connection runs it
//! (`bench_internals::pin_all_blocks`: pre-faulting on its threads, then
//! one `ibv_reg_mr` per block) against a bare `ibv_reg_mr` loop over the
//! same memory, in one process, on one thread and on every CPU. The bare
//! loop is the local limit: each of its threads registers an equal share
//! of the block (one registration each; with one thread, the whole block
//! in one call, as pin-all registers it).
//!
//! ```text
//! cargo build --release --features rdma-tests --example registration_bench
//! registration_bench [--mib N] [--reps N] [--quick]
//! ```
//!
//! Two states of the memory, one block of `--mib` MiB (default 1024):
//! `populated` (every page written beforehand: a running guest's RAM, as
//! the source registers it) and `fresh` (a new mapping each time, never
//! touched: the destination's RAM, which registration must allocate and
//! zero). For each state and thread count the two alternate `--reps` times
//! (default 3, the first of each pair alternating; each rep's times go to
//! stderr); each prints one `registration_bench: memory=... threads=N`
//! line of `key=value` figures: GB/s (10^9 bytes) of each, median over the
//! reps, and `ratio`, the median of the reps' pin-all rate over the bare
//! loop's beside it. `--quick` (CI): 64 MiB, one rep, no warm-up
//! (`common::warm_up`); it checks that everything runs, not its rates. Exits 1 when a registration fails.
//! Needs an RDMA device at `RXE_VM_IP` (default 198.18.0.1) and root or a
//! large `ulimit -l`; scripts/bench-registration.sh runs it in rxe guests.

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::bench_internals::pin_all_blocks;
use rdmamig::verbs::{Access, CmId, EventChannel, MemoryRegion, ProtectionDomain};

#[path = "common/mod.rs"]
mod common;
use common::Ram;

const MIB: u64 = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)?.parse::<u64>().ok());
    let quick = args.iter().any(|a| a == "--quick");
    let mib = value("--mib").unwrap_or(if quick { 64 } else { 1024 });
    let reps = value("--reps").unwrap_or(if quick { 1 } else { 3 }) as usize;
    // The warm-up matters only to timing, which a quick run does not check.
    if !quick {
        common::warm_up();
    }
    if let Err(e) = run(mib * MIB, reps.max(1)) {
        eprintln!("registration_bench: {e}");
        std::process::exit(1);
    }
}

fn run(len: u64, reps: usize) -> Result<(), String> {
    let pd = protection_domain()?;
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let mut counts = vec![1, cpus];
    counts.dedup();
    let populated = Ram::anonymous(len)?;
    // SAFETY: the whole mapping, ours; nothing else uses it yet.
    unsafe { std::ptr::write_bytes(populated.ptr, 0x5a, populated.len) };
    for state in ["populated", "fresh"] {
        for &threads in &counts {
            let (mut bare_gbs, mut pin_all_gbs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for rep in 0..reps {
                // Fresh memory: a new mapping for each registration, unmapped after it.
                let fresh = || if state == "fresh" { Ram::anonymous(len).map(Some) } else { Ok(None) };
                let bare = || fresh().and_then(|m| bare_loop(&pd, m.as_ref().unwrap_or(&populated), threads));
                let pin_all =
                    || fresh().and_then(|m| through_pin_all(&pd, m.as_ref().unwrap_or(&populated), cpus - threads));
                // Which goes first alternates: neither gains from coming second.
                let (b, p) = if rep % 2 == 0 {
                    (bare()?, pin_all()?)
                } else {
                    let p = pin_all()?;
                    (bare()?, p)
                };
                eprintln!(
                    "registration_bench: memory={state} threads={threads} rep={rep} bare_ms={:.1} pin_all_ms={:.1}",
                    b.as_secs_f64() * 1e3,
                    p.as_secs_f64() * 1e3
                );
                bare_gbs.push(gbs(len, b));
                pin_all_gbs.push(gbs(len, p));
                ratios.push(b.as_secs_f64() / p.as_secs_f64());
            }
            println!(
                "registration_bench: memory={state} threads={threads} mib={} bare_gbs={:.3} pin_all_gbs={:.3} \
                 ratio={:.3}",
                len / MIB,
                median(bare_gbs),
                median(pin_all_gbs),
                median(ratios)
            );
        }
    }
    Ok(())
}

/// A protection domain on the RDMA device at `RXE_VM_IP`.
fn protection_domain() -> Result<Arc<ProtectionDomain>, String> {
    let ip = std::env::var("RXE_VM_IP").unwrap_or_else(|_| "198.18.0.1".into());
    let addr: SocketAddr = format!("{ip}:0").parse().map_err(|e| format!("RXE_VM_IP {ip}: {e}"))?;
    let id = EventChannel::new().and_then(|ch| CmId::new(&ch)).map_err(|e| e.to_string())?;
    id.bind_addr(&addr).map_err(|e| format!("binding {ip}: {e}"))?;
    ProtectionDomain::new(&id).map_err(|e| e.to_string())
}

/// The local limit: `threads` threads each register an equal share of
/// `ram` (the last one the rest) at once; the time until all have.
fn bare_loop(pd: &Arc<ProtectionDomain>, ram: &Ram, threads: usize) -> Result<Duration, String> {
    let page = 4096;
    let share = (ram.len / threads).next_multiple_of(page);
    let base = ram.ptr as usize;
    let started = Barrier::new(threads + 1);
    let (mrs, took) = thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let (start, started) = (i * share, &started);
                let len = share.min(ram.len - start);
                s.spawn(move || {
                    started.wait();
                    // SAFETY: within the mapping, which outlives the registration
                    // (dropped below); nothing is posted to or from it.
                    unsafe { pd.register((base + start) as *mut u8, len, access()) }
                })
            })
            .collect();
        started.wait();
        let clock = Instant::now();
        let mrs: Vec<_> = workers.into_iter().map(|w| w.join().expect("a registering thread")).collect();
        (mrs, clock.elapsed())
    });
    let mrs: Vec<MemoryRegion> = mrs.into_iter().collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    drop(mrs);
    Ok(took)
}

/// Pin-all of `ram` as one block, as the library runs it with all CPUs but
/// `spare_cpus` pre-faulting; the time until every block is registered.
fn through_pin_all(pd: &Arc<ProtectionDomain>, ram: &Ram, spare_cpus: usize) -> Result<Duration, String> {
    let blocks = ram.registry();
    let clock = Instant::now();
    let mrs = pin_all_blocks(pd.clone(), &blocks, access(), spare_cpus).map_err(|e| e.to_string())?;
    let took = clock.elapsed();
    drop(mrs);
    Ok(took)
}

/// As the destination registers (the source registers `LOCAL_WRITE` only:
/// both pin every page for writing).
fn access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE
}

fn gbs(len: u64, took: Duration) -> f64 {
    len as f64 / took.as_secs_f64() / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
