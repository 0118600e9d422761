//! The bench destination's "vCPUs": threads that read one word of a random
//! guest page at a time while post-copy runs (a stale page faults and waits
//! for its RDMA READ). Reads only, so the guest's memory stays the source's.
//!
//! A failed post-copy makes the guest RAM PROT_NONE and wakes the threads
//! blocked on it: they get SIGSEGV there (the library's documented release).
//! This program then does what a hypervisor would: its SIGSEGV handler
//! pauses that vCPU for good (parks the thread), so the process survives to
//! report the failure.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::guest_ram::{splitmix64, Ram, PAGE};

/// The guest RAM the handler recognises, and the vCPUs it paused.
static GUEST_START: AtomicUsize = AtomicUsize::new(0);
static GUEST_END: AtomicUsize = AtomicUsize::new(0);
static PAUSED: AtomicU64 = AtomicU64::new(0);

/// SIGSEGV at a guest RAM address: a vCPU released by a failed post-copy;
/// it stays here (async-signal-safe: atomics and pause). Anywhere else: a
/// real crash, left to the default action.
extern "C" fn on_guest_fault(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    if !(GUEST_START.load(Ordering::Relaxed)..GUEST_END.load(Ordering::Relaxed)).contains(&addr) {
        // SAFETY: async-signal-safe; the fault repeats and kills the process.
        unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
        return;
    }
    PAUSED.fetch_add(1, Ordering::Relaxed);
    loop {
        // SAFETY: async-signal-safe.
        unsafe { libc::pause() };
    }
}

pub(crate) struct Vcpus {
    ram: Arc<Ram>,
    count: u32,
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Vcpus {
    pub(crate) fn new(ram: Arc<Ram>, count: u32) -> Self {
        let (stop, reads) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        Vcpus { ram, count, stop, reads, threads: Vec::new() }
    }

    pub(crate) fn start(&mut self) {
        let (start, len) = self.ram.span();
        GUEST_START.store(start, Ordering::Relaxed);
        GUEST_END.store(start + len, Ordering::Relaxed);
        // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_guest_fault as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut());
        }
        for i in 0..self.count {
            let (ram, stop, reads) = (self.ram.clone(), self.stop.clone(), self.reads.clone());
            let spawned = std::thread::Builder::new().name(format!("vcpu{i}")).spawn(move || {
                let mut rng = 0x5eed_0000 + u64::from(i);
                let pages = ram.pages();
                let mut sum = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let page = splitmix64(&mut rng) % pages;
                    let word = splitmix64(&mut rng) % (PAGE / 8);
                    // SAFETY: inside the mapping; volatile: the read must happen (and fault).
                    sum = sum.wrapping_add(unsafe { ram.read_u64(page * PAGE + word * 8) });
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                std::hint::black_box(sum);
            });
            // Fewer vCPUs if the system will not give us a thread.
            if let Ok(t) = spawned {
                self.threads.push(t);
            }
        }
    }

    /// Stops the vCPUs: joins each within a second, and leaves any that did
    /// not stop (paused by a failed post-copy; each holds its `Arc<Ram>`, so
    /// the guest RAM stays mapped).
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(1);
        for t in self.threads.drain(..) {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }

    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// vCPUs paused by a failed post-copy (SIGSEGV in guest RAM).
    pub(crate) fn paused() -> u64 {
        PAUSED.load(Ordering::Relaxed)
    }
}
