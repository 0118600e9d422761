//! Integration example (docs/integration/rust-vmm.md): a Rust VMM whose guest
//! memory is a `vm_memory::GuestMemoryMmap`, the memory crate of
//! cloud-hypervisor and Firecracker, migrates it through rdmamig's Rust API.
//!
//! Each region of the guest memory becomes a block of a [`RamBlocks`]
//! registry (its guest-physical address as the block's offset). The source's
//! memory is a `GuestMemoryMmap<AtomicBitmap>`: every write through
//! vm-memory marks its page in the region's dirty bitmap, whose words
//! (`AtomicBitmap::get_and_reset`) are exactly what [`Source::save_bitmap`]
//! takes. Precopy: round 0 sends every region whole while the guest keeps
//! writing, then rounds of the dirty pages, then a final round with the
//! guest stopped, then the device state in the stream. The destination (a
//! thread of this process, with a `GuestMemoryMmap` of its own) reads the
//! stream to its end and checks that the migration completed; then every
//! region is compared byte for byte. Exit status 0 only if all of it is
//! identical and both sides say `Completed`.
//!
//! ```text
//! cargo build --release --features rdma-tests --example vm_memory
//! vm_memory [--mib N]        RXE_VM_IP: the RDMA address (198.18.0.1)
//! ```

use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use rdmamig::{Config, Destination, Ending, Listener, RamBlocks, Read, SaveRange, Source};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MmapRegion};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
const TIMEOUT: Option<Duration> = Some(Duration::from_secs(60));
/// Precopy rounds with the guest running (round 0 included), before the final one.
const LIVE_ROUNDS: usize = 3;
/// Pages the guest writes during each live round.
const PAGES_PER_RUN: usize = 300;

/// The guest's memory layout: low RAM at 0 and high RAM at 4 GiB (above the
/// 32-bit MMIO hole), as a VMM lays out an x86 guest.
fn layout(mib: u64) -> [(GuestAddress, usize); 2] {
    let high = mib / 4;
    [(GuestAddress(0), ((mib - high) * MIB) as usize), (GuestAddress(1 << 32), (high * MIB) as usize)]
}

/// One block per region, named and placed by its guest-physical address.
///
/// # Safety
/// `mem` must outlive every connection made with the registry (its regions
/// stay mapped as long as `mem` lives).
unsafe fn ram_blocks<B: vm_memory::bitmap::Bitmap>(mem: &GuestMemoryMmap<B>) -> Result<RamBlocks, String> {
    let mut ram = RamBlocks::new();
    for region in mem.iter() {
        let gpa = region.start_addr().raw_value();
        // SAFETY: the caller keeps `mem`, and so the region's mapping, alive.
        unsafe { ram.add(&format!("ram@{gpa:#x}"), region.as_ptr(), gpa, region.len()) }
            .map_err(|e| format!("RamBlocks::add: {e}"))?;
    }
    Ok(ram)
}

/// The guest runs: writes `PAGES_PER_RUN` pages through vm-memory (which
/// marks them dirty), each with a pattern of `(page address, generation)`.
fn guest_runs(mem: &GuestMemoryMmap<AtomicBitmap>, rng: &mut u64, generation: u64) {
    let regions: Vec<(u64, u64)> = mem.iter().map(|r| (r.start_addr().raw_value(), r.len())).collect();
    let total: u64 = regions.iter().map(|r| r.1 / PAGE).sum();
    let mut page = vec![0u8; PAGE as usize];
    for _ in 0..PAGES_PER_RUN {
        // The n-th page of the guest, counting through the regions.
        let mut n = xorshift(rng) % total;
        let mut addr = GuestAddress(0);
        for &(base, len) in &regions {
            if n < len / PAGE {
                addr = GuestAddress(base + n * PAGE);
                break;
            }
            n -= len / PAGE;
        }
        fill(&mut page, addr.raw_value() ^ generation << 48);
        mem.write_slice(&page, addr).expect("inside guest memory");
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut s = seed ^ 0x9e37_79b9_7f4a_7c15;
    for w in buf.chunks_mut(8) {
        let n = w.len();
        w.copy_from_slice(&xorshift(&mut s).to_le_bytes()[..n]);
    }
}

/// Takes (and clears) a region's dirty bitmap: bit `i % 64` of word `i / 64`
/// is the region's page `i`, the layout `Source::save_bitmap` reads.
fn take_dirty(region: &vm_memory::GuestRegionMmap<AtomicBitmap>) -> Vec<u64> {
    let mapping: &MmapRegion<AtomicBitmap> = region;
    mapping.bitmap().get_and_reset()
}

/// The device state a VMM would serialize (vCPU registers, devices' state).
fn device_state() -> Vec<u8> {
    let mut state = vec![0u8; 70_001];
    fill(&mut state, 0xdeu64 << 40);
    state
}

fn source(mem: &GuestMemoryMmap<AtomicBitmap>, ram: &RamBlocks, ip: &str, port: u16) -> Result<Ending, String> {
    let e = |what: &'static str| move |err: rdmamig::Error| format!("source: {what}: {err}");
    let source = Source::connect(ip, port, &Config::default(), ram).map_err(e("connect"))?;
    let mut rng = 0x5eed_u64;
    for round in 0..=LIVE_ROUNDS {
        source.iteration_begin().map_err(e("iteration_begin"))?;
        for (block, region) in mem.iter().enumerate() {
            let dirty = take_dirty(region);
            if round == 0 {
                // Every page, whatever the bitmap says.
                let whole = SaveRange { block: block as u32, offset: 0, len: region.len() };
                source.save_ranges([whole]).map_err(e("save_ranges"))?;
            } else {
                source.save_bitmap(block as u32, &dirty, 0, region.len() / PAGE, PAGE).map_err(e("save_bitmap"))?;
            }
        }
        if round < LIVE_ROUNDS {
            // The guest keeps running during the round: `save` only queues,
            // the library reads the pages by the time `iteration_end` returns,
            // and a page written meanwhile is dirty again for the next round.
            guest_runs(mem, &mut rng, round as u64 + 1);
        }
        source.iteration_end().map_err(e("iteration_end"))?;
    }
    // The guest is stopped: device state, then close (the completion handshake).
    source.put(&device_state()).map_err(e("put"))?;
    source.flush().map_err(e("flush"))?;
    let stats = source.stats();
    let ending = source.close().map_err(e("close"))?;
    println!(
        "vm_memory: source: {} regions, {} rounds, {} bytes written, {} zero ranges, {} stream bytes, {ending:?}",
        mem.num_regions(),
        LIVE_ROUNDS + 1,
        stats.bytes_written,
        stats.zero_chunks,
        stats.stream_bytes
    );
    Ok(ending)
}

fn destination(listener: Listener, ram: RamBlocks) -> Result<(Vec<u8>, Ending), String> {
    let dest = Destination::accept(&listener, &ram, TIMEOUT).map_err(|err| format!("accept: {err}"))?;
    let mut state = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let read_end = loop {
        match dest.get(&mut buf, TIMEOUT).map_err(|err| format!("destination: get: {err}"))? {
            Read::Bytes(n) => state.extend_from_slice(&buf[..n]),
            Read::End(ending) => break ending,
        }
    };
    // The stream's end proves nothing about RAM: the migration's end does.
    let ending = dest.wait_end(TIMEOUT).map_err(|err| format!("destination: wait_end: {err}"))?;
    dest.close();
    if read_end != ending {
        return Err(format!("destination: the stream ended {read_end:?}, the migration {ending:?}"));
    }
    Ok((state, ending))
}

fn run(mib: u64) -> Result<(), String> {
    let ip = std::env::var("RXE_VM_IP").unwrap_or_else(|_| "198.18.0.1".into());
    let src: GuestMemoryMmap<AtomicBitmap> =
        GuestMemoryMmap::from_ranges(&layout(mib)).map_err(|err| format!("source memory: {err}"))?;
    let dst: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&layout(mib)).map_err(|err| format!("memory: {err}"))?;
    // The guest at boot: every fourth MiB left zero (sent as zero ranges), the rest a pattern.
    let mut page = vec![0u8; PAGE as usize];
    for region in src.iter() {
        for off in (0..region.len()).step_by(PAGE as usize) {
            if (off / MIB) % 4 != 3 {
                let addr = region.start_addr().unchecked_add(off);
                fill(&mut page, addr.raw_value());
                src.write_slice(&page, addr).map_err(|err| format!("write_slice: {err}"))?;
            }
        }
    }
    dst.iter().for_each(|r| {
        // SAFETY: the region is mapped and nothing else uses it yet.
        unsafe { std::ptr::write_bytes(r.as_ptr(), 0xaa, r.len() as usize) }
    });

    // SAFETY: `src` and `dst` outlive both connections (closed in this function).
    let (src_ram, dst_ram) = unsafe { (ram_blocks(&src)?, ram_blocks(&dst)?) };
    let listener = Listener::bind(&ip, 0, &Config::default()).map_err(|err| format!("listen: {err}"))?;
    let port = listener.port();
    let dest = thread::spawn(move || destination(listener, dst_ram));
    let source_ending = source(&src, &src_ram, &ip, port);
    let (state, dest_ending) = dest.join().map_err(|_| "the destination thread panicked".to_string())??;
    let source_ending = source_ending?;
    if source_ending != Ending::Completed || dest_ending != Ending::Completed {
        return Err(format!("the migration ended {source_ending:?} (source), {dest_ending:?} (destination)"));
    }
    if state != device_state() {
        return Err(format!("the device state differs ({} bytes received)", state.len()));
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (s, d) in src.iter().zip(dst.iter()) {
        a.resize(s.len() as usize, 0);
        b.resize(d.len() as usize, 0);
        src.read_slice(&mut a, s.start_addr()).map_err(|err| format!("read_slice: {err}"))?;
        dst.read_slice(&mut b, d.start_addr()).map_err(|err| format!("read_slice: {err}"))?;
        if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
            let at = s.start_addr().raw_value() + i as u64;
            return Err(format!("guest memory differs at {at:#x} (page {:#x})", at / PAGE * PAGE));
        }
    }
    println!(
        "vm_memory: destination: guest memory identical ({mib} MiB in {} regions), device state identical ({} bytes), \
         Completed",
        dst.num_regions(),
        state.len()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let mib = match args.as_slice() {
        [_] => 32,
        [_, flag, n] if flag == "--mib" => match n.parse::<u64>() {
            Ok(n) if n >= 4 && n % 4 == 0 => n,
            _ => return usage(),
        },
        _ => return usage(),
    };
    match run(mib) {
        Ok(()) => {
            println!("vm_memory: PASS");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("vm_memory: FAIL {err}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: vm_memory [--mib N (a multiple of 4)]");
    ExitCode::from(2)
}
