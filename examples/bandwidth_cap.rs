//! Whether the bandwidth cap holds (`Config::max_bandwidth`,
//! `Source::set_max_bandwidth`): one process migrates a guest of `--mib` MiB
//! of random data from a source to a destination over RDMA, one connection,
//! three windows each sending all of it: uncapped (the link's pace here),
//! then capped at each `--caps` value (MB/s, 10^6 bytes), set on the running
//! connection before its window. Prints, per window, the bytes written and
//! the rate reached (from `iteration_begin` to `iteration_end`) against the
//! cap; the destination's RAM is checked byte-identical at the end.
//!
//! ```text
//! cargo build --release --features rdma-tests --example bandwidth_cap
//! bandwidth_cap [--mib N] [--caps A,B]
//! ```
//!
//! Needs an RDMA device at `RXE_VM_IP` (default 198.18.0.1) and root or a
//! large `ulimit -l` (e.g. `scripts/rxe-vm.sh 'target/release/examples/bandwidth_cap'`).

use std::thread;
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, Ending, Listener, RamBlocks, SaveRange, Source};

const MIB: u64 = 1 << 20;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.into())
}

fn main() {
    let mib: u64 = arg("--mib", "64").parse().expect("--mib N");
    let caps: Vec<u64> =
        arg("--caps", "10,20").split(',').map(|c| c.parse::<u64>().expect("--caps A,B") * 1_000_000).collect();
    let ip = std::env::var("RXE_VM_IP").unwrap_or_else(|_| "198.18.0.1".into());
    let len = mib * MIB;

    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut src: Vec<u8> = (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    let mut dst = vec![0xAAu8; len as usize];
    let registry = |mem: &mut Vec<u8>| {
        let mut r = RamBlocks::new();
        // SAFETY: both buffers outlive the connection (closed below, before they drop).
        unsafe { r.add("pc.ram", mem.as_mut_ptr(), 0, len).unwrap() };
        r
    };
    let (src_ram, dst_ram) = (registry(&mut src), registry(&mut dst));

    let listener = Listener::bind(&ip, 0, &Config::default()).expect("listen");
    let port = listener.port();
    let dest = thread::spawn(move || Destination::accept(&listener, &dst_ram, Some(Duration::from_secs(30))).unwrap());
    let source = Source::connect(&ip, port, &Config::default(), &src_ram).expect("connect");
    let dest = dest.join().unwrap();

    let whole: Vec<SaveRange> = (0..mib).map(|i| SaveRange { block: 0, offset: i * MIB, len: MIB }).collect();
    let windows = std::iter::once(None).chain(caps.iter().copied().map(Some));
    for cap in windows {
        source.set_max_bandwidth(cap);
        let before = source.stats().bytes_written;
        let start = Instant::now();
        source.iteration_begin().unwrap();
        source.save_ranges(whole.iter().copied()).unwrap();
        source.iteration_end().unwrap();
        let secs = start.elapsed().as_secs_f64();
        let bytes = source.stats().bytes_written - before;
        let rate = bytes as f64 / secs;
        match cap {
            None => println!("bandwidth_cap: cap=none bytes={bytes} s={secs:.3} MB/s={:.2}", rate / 1e6),
            Some(c) => println!(
                "bandwidth_cap: cap={} bytes={bytes} s={secs:.3} MB/s={:.2} ratio={:.3}",
                c / 1_000_000,
                rate / 1e6,
                rate / c as f64
            ),
        }
    }
    assert_eq!(source.close().unwrap(), Ending::Completed);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(30))).unwrap(), Ending::Completed);
    dest.close();
    assert!(src == dst, "the destination's RAM differs");
    println!("bandwidth_cap: destination byte-identical ({mib} MiB)");
}
