//! What the benchmark examples share (each includes it with `#[path]`):
//! perftest's anchors, guest RAM, a mixing function, the warm-up. Each program uses part
//! of it, so the parts another program uses are dead code in this one.
#![allow(dead_code)]

pub mod perftest;
mod ram;

pub use ram::Ram;

use std::time::{Duration, Instant};

/// splitmix64's finaliser: a well-mixed 64-bit value of `z`.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Before anything is timed, two one-off costs that would land on whichever
/// run comes first: TCG backs guest memory on the host only at its first
/// touch (so the guest's free memory is touched once and given back), and
/// librdmacm discovers the devices once per process (done here through the
/// doctor's rdma_cm check; ib_write_bw's clock also starts after its setup,
/// and a hypervisor pays this once, not per migration; the first connect of
/// a process takes several times a later one's: docs/benchmarks.md). Returns
/// the bytes touched and the time it all took.
pub fn warm_up() -> (u64, Duration) {
    let started = Instant::now();
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find(|l| l.starts_with("MemAvailable:"))?.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .unwrap_or(0)
        * 1024;
    // Room is left for the page cache and the processes that are running.
    let len = available.saturating_sub(1 << 30);
    populate_fresh(len);
    let _ = rdmamig::doctor::diagnose(None);
    (len, started.elapsed())
}

/// Maps `len` bytes of fresh anonymous memory, has the kernel allocate
/// (and zero) every page, as a destination's registrations of fresh guest
/// RAM do, and unmaps it; returns how long the populating took.
pub fn populate_fresh(len: u64) -> Duration {
    if len == 0 {
        return Duration::ZERO;
    }
    // SAFETY: a fresh private mapping, populated and unmapped here only.
    unsafe {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let p = libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        if p == libc::MAP_FAILED {
            return Duration::ZERO;
        }
        let started = Instant::now();
        libc::madvise(p, len as usize, libc::MADV_POPULATE_WRITE);
        let took = started.elapsed();
        libc::munmap(p, len as usize);
        took
    }
}
