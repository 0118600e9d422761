//! End-to-end migrations between a source and a destination over rxe.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::{Config, Destination, Ending, ErrorKind, Listener, RamBlocks, Read, Source};

pub const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;

/// The address rxe0 is bound to in the test guest (or a real NIC's, when set).
pub fn rdma_ip() -> String {
    std::env::var("RXE_VM_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

/// Memory standing in for guest RAM (private anonymous unless `shared`); written with volatile stores
/// because the transfer reads it concurrently.
pub struct GuestRam {
    ptr: *mut u8,
    len: usize,
}

unsafe impl Send for GuestRam {}
unsafe impl Sync for GuestRam {}

impl GuestRam {
    pub fn new(len: u64, fill: u8) -> GuestRam {
        GuestRam::map(len, fill, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    }

    /// Zero pages, none backed until touched, and no swap reserved for them:
    /// more RAM than the guest has, as long as few pages are touched (no
    /// transparent huge pages: a touch backs 4 KiB).
    pub fn sparse(len: u64) -> GuestRam {
        let ram = GuestRam::map(len, 0, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1);
        let rc = unsafe { libc::madvise(ram.ptr.cast(), ram.len, libc::MADV_NOHUGEPAGE) };
        assert_eq!(rc, 0, "madvise(MADV_NOHUGEPAGE): {}", std::io::Error::last_os_error());
        ram
    }

    /// Shared memory (a memfd, as vhost-user setups back guest RAM).
    pub fn shared(len: u64, fill: u8) -> GuestRam {
        let fd = unsafe { libc::memfd_create(c"guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        assert_eq!(unsafe { libc::ftruncate(fd, len as libc::off_t) }, 0);
        let ram = GuestRam::map(len, fill, libc::MAP_SHARED, fd);
        unsafe { libc::close(fd) };
        ram
    }

    fn map(len: u64, fill: u8, flags: libc::c_int, fd: libc::c_int) -> GuestRam {
        let len = len as usize;
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap of {len} bytes failed");
        let ram = GuestRam { ptr: ptr as *mut u8, len };
        if fill != 0 {
            unsafe { std::ptr::write_bytes(ram.ptr, fill, len) };
        }
        ram
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn write_u64(&self, offset: u64, value: u64) {
        assert!(offset as usize + 8 <= self.len);
        unsafe { (self.ptr.add(offset as usize) as *mut u64).write_volatile(value) }
    }

    /// Only when nothing writes concurrently.
    pub fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// xorshift64*: a fast deterministic pattern.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A block: name, length, and its all-zero ranges as (offset, length).
pub type BlockSpec = (&'static str, u64, Vec<(u64, u64)>);

pub struct Layout {
    pub blocks: Vec<BlockSpec>,
}

impl Layout {
    /// 128 MiB in two blocks with all-zero regions (whole chunks and a partial one).
    pub fn standard() -> Layout {
        Layout {
            blocks: vec![
                ("pc.ram", 120 * MIB, vec![(8 * MIB, 16 * MIB), (64 * MIB + 256 * 1024, 512 * 1024)]),
                ("vga.vram", 8 * MIB, vec![(2 * MIB, 4 * MIB)]),
            ],
        }
    }

    /// Source RAM: random pattern except the zero regions.
    pub fn source_ram(&self, seed: u64) -> Vec<GuestRam> {
        let mut rng = Rng::new(seed);
        self.blocks
            .iter()
            .map(|(_, len, zeros)| {
                let ram = GuestRam::new(*len, 0);
                for off in (0..*len).step_by(8) {
                    if !zeros.iter().any(|&(z, zl)| off >= z && off < z + zl) {
                        ram.write_u64(off, rng.next());
                    }
                }
                ram
            })
            .collect()
    }

    /// Destination RAM: garbage, so zero ranges must really be zeroed.
    pub fn dest_ram(&self) -> Vec<GuestRam> {
        self.blocks.iter().map(|(_, len, _)| GuestRam::new(*len, 0xAA)).collect()
    }

    /// Registry over `ram`, with offsets that differ between the sides to check translation.
    pub fn registry(&self, ram: &[GuestRam], base: u64) -> RamBlocks {
        let mut r = RamBlocks::new();
        let mut offset = base;
        for ((name, len, _), mem) in self.blocks.iter().zip(ram) {
            unsafe { r.add(name, mem.ptr(), offset, *len).unwrap() };
            offset += len + 64 * MIB;
        }
        r
    }
}

/// A registry of one block, "pc.ram", over the first `len` bytes of `ram` at RAM offset 0.
pub fn one_block(ram: &GuestRam, len: u64) -> RamBlocks {
    let mut r = RamBlocks::new();
    unsafe { r.add("pc.ram", ram.ptr(), 0, len).unwrap() };
    r
}

/// This process's open file descriptors.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Memory regions registered on the guest's RDMA devices (`rdma resource`
/// summary): this test's, as long as nothing else in the guest registers any.
pub fn live_mrs() -> usize {
    let out = std::process::Command::new("rdma").args(["resource", "show"]).output().expect("the rdma tool (iproute2)");
    assert!(out.status.success(), "rdma resource show: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "mr")
        .map(|w| w[1].parse::<usize>().expect("mr count"))
        .sum()
}

/// Binds a listener on a free port.
pub fn listen(config: &Config) -> (Listener, u16) {
    let l = Listener::bind(&rdma_ip(), 0, config).expect("listen");
    let port = l.port();
    (l, port)
}

/// Connects a source over `src` to a destination over `dst` on a free port
/// (the destination accepts in a thread). The caller keeps the RAM mapped.
pub fn connect(src: &RamBlocks, src_config: &Config, dst: RamBlocks, dst_config: &Config) -> (Source, Destination) {
    let (listener, port) = listen(dst_config);
    let dest = thread::spawn(move || Destination::accept(&listener, &dst, Some(Duration::from_secs(30))).unwrap());
    let source = Source::connect(&rdma_ip(), port, src_config, src).unwrap();
    (source, dest.join().unwrap())
}

/// splitmix64 of `x`: memory whose content is a function of page and word
/// (and a round) is known to every process without a copy.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Dirty-page bitmap, one bit per page of each block.
struct Dirty {
    bits: Vec<Vec<AtomicU64>>,
}

impl Dirty {
    fn new(layout: &Layout) -> Dirty {
        Dirty {
            bits: layout
                .blocks
                .iter()
                .map(|(_, len, _)| (0..(len / PAGE).div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
                .collect(),
        }
    }
    fn mark(&self, block: usize, page: u64) {
        self.bits[block][(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::Release);
    }
    /// Takes and clears the dirty pages of every block.
    fn take(&self) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        for (b, words) in self.bits.iter().enumerate() {
            for (w, word) in words.iter().enumerate() {
                let mut bits = word.swap(0, Ordering::Acquire);
                while bits != 0 {
                    let i = bits.trailing_zeros() as u64;
                    bits &= bits - 1;
                    out.push((b as u32, (w as u64 * 64 + i) * PAGE));
                }
            }
        }
        out
    }
}

/// Source side of a precopy: a full round, dirty rounds while a writer keeps
/// dirtying pages, then a last round with the writer stopped.
fn precopy(source: &mut Source, layout: &Layout, ram: &Arc<Vec<GuestRam>>, rounds: usize) {
    let dirty = Arc::new(Dirty::new(layout));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (dirty, stop, ram) = (dirty.clone(), stop.clone(), ram.clone());
        let lens: Vec<u64> = layout.blocks.iter().map(|b| b.1).collect();
        // The zero regions stay zero, so they must travel as COMPRESS.
        let zeros: Vec<Vec<(u64, u64)>> = layout.blocks.iter().map(|b| b.2.clone()).collect();
        thread::spawn(move || {
            let mut rng = Rng::new(77);
            let mut writes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let b = (rng.next() % lens.len() as u64) as usize;
                let page = rng.next() % (lens[b] / PAGE);
                if zeros[b].iter().any(|&(z, zl)| page * PAGE + PAGE > z && page * PAGE < z + zl) {
                    continue;
                }
                ram[b].write_u64(page * PAGE + (rng.next() % (PAGE / 8)) * 8, rng.next());
                dirty.mark(b, page);
                writes += 1;
                if writes % 64 == 0 {
                    thread::sleep(Duration::from_micros(200));
                }
            }
            writes
        })
    };
    // Round 0: every page.
    source.iteration_begin().unwrap();
    for (b, (_, len, _)) in layout.blocks.iter().enumerate() {
        for off in (0..*len).step_by(PAGE as usize) {
            source.save(b as u32, off, PAGE).unwrap();
        }
    }
    source.iteration_end().unwrap();
    for round in 0..rounds {
        if round + 1 == rounds {
            stop.store(true, Ordering::Relaxed);
        }
        let pages = dirty.take();
        source.iteration_begin().unwrap();
        for (b, off) in pages {
            source.save(b, off, PAGE).unwrap();
        }
        source.iteration_end().unwrap();
    }
    let writes = writer.join().unwrap();
    assert!(writes > 0, "the writer thread dirtied nothing");
    // Pages dirtied after the last take.
    source.iteration_begin().unwrap();
    for (b, off) in dirty.take() {
        source.save(b, off, PAGE).unwrap();
    }
    source.iteration_end().unwrap();
}

pub fn migrate(source_config: Config, dest_config: Config, expect_pin_all: bool) {
    let layout = Layout::standard();
    let src_ram = Arc::new(layout.source_ram(1));
    let dst_ram = layout.dest_ram();
    let (mut source, dest) =
        connect(&layout.registry(&src_ram, 1 << 40), &source_config, layout.registry(&dst_ram, 0), &dest_config);
    assert_eq!(source.negotiated().pin_all, expect_pin_all);
    assert_eq!(dest.negotiated(), source.negotiated());

    let start = Instant::now();
    precopy(&mut source, &layout, &src_ram, 3);
    let blob: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
    source.put(&blob).unwrap();
    source.flush().unwrap();
    let src_stats = source.stats();
    let iterations = src_stats.iterations;
    dest.wait_iteration(iterations, Some(Duration::from_secs(30))).unwrap();
    assert!(read_stream(&dest, blob.len()) == blob, "device state differs");
    let elapsed = start.elapsed();
    for (i, (s, d)) in src_ram.iter().zip(&dst_ram).enumerate() {
        assert!(s.bytes() == d.bytes(), "block {i} differs after migration");
    }
    let dst_stats = dest.stats();
    eprintln!("migrated 128 MiB in {elapsed:?}: source {src_stats:?}\ndestination {dst_stats:?}");
    assert!(src_stats.bytes_written >= 100 * MIB);
    if expect_pin_all {
        assert_eq!(src_stats.zero_chunks, 0, "QEMU sends no COMPRESS with pin-all");
        assert_eq!(dst_stats.zero_chunks, 0);
    } else {
        // The 16 + 4 whole zero chunks travel as COMPRESS and are never registered
        // (the partial zero range shares a chunk with data). Toward QEMU one
        // COMPRESS carries at most a chunk; rdmamig peers get coalesced ranges.
        let min_ranges = if source.negotiated().extensions { 2 } else { 20 };
        assert!(src_stats.zero_chunks >= min_ranges, "zero regions were not sent as COMPRESS: {src_stats:?}");
        assert_eq!(dst_stats.zero_chunks, src_stats.zero_chunks);
        assert!(src_stats.chunks_registered > 0 && src_stats.chunks_registered <= 128 - 20, "{src_stats:?}");
    }
    assert_eq!(dst_stats.iterations, iterations);
    // Between rdmamig peers the handshake proves completion; in QEMU-compatible mode nothing can.
    let ending = if source.negotiated().extensions { Ending::Completed } else { Ending::Unverified };
    assert_eq!(source.close().unwrap(), ending);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(10))).unwrap(), ending);
    // The stream is drained: get reports the same ending.
    let mut one = [0u8; 1];
    assert_eq!(dest.get(&mut one, Some(Duration::from_secs(10))).unwrap(), Read::End(ending));
    assert!(dest.error().is_none(), "{:?}", dest.error());
}

/// Reads exactly `len` stream bytes from `dest`.
pub fn read_stream(dest: &Destination, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    let mut n = 0;
    while n < len {
        match dest.get(&mut got[n..], Some(Duration::from_secs(30))).unwrap() {
            Read::Bytes(k) => n += k,
            Read::End(e) => panic!("the stream ended ({e:?}) after {n} of {len} bytes"),
        }
    }
    got
}

#[test]
fn dynamic_registration_migrates_128_mib_while_pages_change() {
    migrate(Config::default(), Config::default(), false);
}

#[test]
fn pin_all_migrates_128_mib_while_pages_change() {
    let config = Config { pin_all: true, ..Config::default() };
    migrate(config.clone(), config, true);
}

#[test]
fn qemu_compatible_mode_migrates_128_mib() {
    // Both sides without rdmamig extensions: the wire is QEMU's, message for message.
    let config = Config { extensions: false, ..Config::default() };
    migrate(config.clone(), config, false);
}

#[test]
fn destination_refusing_pin_all_turns_it_off() {
    let source = Config { pin_all: true, ..Config::default() };
    migrate(source, Config::default(), false);
}

#[test]
fn version_mismatch_fails_on_both_sides() {
    let (listener, port) = listen(&Config::default());
    let dest = thread::spawn(move || {
        let ram = GuestRam::new(MIB, 0);
        let mut r = RamBlocks::new();
        unsafe { r.add("pc.ram", ram.ptr(), 0, MIB).unwrap() };
        Destination::accept(&listener, &r, Some(Duration::from_secs(30))).map(|_| ())
    });
    let ram = GuestRam::new(MIB, 0);
    let mut r = RamBlocks::new();
    unsafe { r.add("pc.ram", ram.ptr(), 0, MIB).unwrap() };
    let config = Config { protocol_version: 2, ..Config::default() };
    let err = Source::connect(&rdma_ip(), port, &config, &r).err().expect("connect must fail");
    assert_eq!(err.kind, ErrorKind::Version, "{err}");
    let err = dest.join().unwrap().unwrap_err();
    assert_eq!(err.kind, ErrorKind::Version, "{err}");
}

#[test]
fn stream_of_10_mib_in_odd_pieces_interleaved_with_windows() {
    let layout = Layout { blocks: vec![("pc.ram", 16 * MIB, vec![])] };
    let src_ram = layout.source_ram(5);
    let dst_ram = layout.dest_ram();
    let config = Config::default();
    let (source, dest) = connect(&layout.registry(&src_ram, 0), &config, layout.registry(&dst_ram, 0), &config);
    let dest = Arc::new(dest);

    const TOTAL: usize = 10 << 20;
    let mut rng = Rng::new(9);
    let data: Arc<Vec<u8>> = Arc::new((0..TOTAL).map(|_| rng.next() as u8).collect());
    let reader = {
        let (dest, data) = (dest.clone(), data.clone());
        thread::spawn(move || {
            let mut got = Vec::with_capacity(TOTAL);
            let mut rng = Rng::new(11);
            while got.len() < TOTAL {
                let mut buf = vec![0u8; 1 + (rng.next() % 70_000) as usize];
                let Read::Bytes(n) = dest.get(&mut buf, Some(Duration::from_secs(60))).unwrap() else {
                    panic!("the stream ended early")
                };
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got[..] == data[..], "stream bytes differ");
        })
    };
    let mut sent = 0;
    let mut window = 0u64;
    while sent < TOTAL {
        let n = (1 + (rng.next() % 99_991) as usize).min(TOTAL - sent);
        source.put(&data[sent..sent + n]).unwrap();
        sent += n;
        if rng.next() % 8 == 0 {
            source.flush().unwrap();
            source.iteration_begin().unwrap();
            source.save(0, (window % 16) * MIB, MIB).unwrap();
            source.iteration_end().unwrap();
            window += 1;
        }
    }
    source.flush().unwrap();
    reader.join().unwrap();
    assert!(window > 0);
    assert_eq!(dest.wait_iteration(window, Some(Duration::from_secs(30))).unwrap(), window);
    assert_eq!(source.stats().stream_bytes, TOTAL as u64);
    assert_eq!(dest.stats().stream_bytes, TOTAL as u64);
    assert_eq!(source.close().unwrap(), Ending::Completed);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(10))).unwrap(), Ending::Completed);
    // Closed (`close` takes `&self`): no failure to report, a second close refused, nothing more sent.
    assert!(source.error().is_none(), "{:?}", source.error());
    assert_eq!(source.close().unwrap_err().kind, ErrorKind::State);
    assert!(source.put(b"late").is_err());
}

/// Migrates between mismatched block lists: both sides must fail with
/// BlockMismatch, the destination's message containing every string of
/// `expect`, the source's every string of `source_expect`.
fn block_mismatch(source_layout: Layout, dest_layout: Layout, expect: &[&str], source_expect: &[&str]) {
    let src_ram = source_layout.source_ram(3);
    let dst_ram = dest_layout.dest_ram();
    let config = Config::default();
    let (source, dest) =
        connect(&source_layout.registry(&src_ram, 0), &config, dest_layout.registry(&dst_ram, 0), &config);
    source.iteration_begin().unwrap();
    source.save(0, 0, MIB).unwrap();
    let err = source.iteration_end().unwrap_err();
    assert_eq!(err.kind, ErrorKind::BlockMismatch, "{err}");
    for e in source_expect {
        assert!(err.message.contains(e), "{err}");
    }
    let err = dest.wait_iteration(1, Some(Duration::from_secs(30))).unwrap_err();
    assert_eq!(err.kind, ErrorKind::BlockMismatch, "{err}");
    for e in expect {
        assert!(err.message.contains(e), "{err}");
    }
    // Later calls return the stored error.
    assert_eq!(source.iteration_begin().unwrap_err().kind, ErrorKind::BlockMismatch);
}

#[test]
fn missing_block_fails_on_both_sides() {
    block_mismatch(
        Layout { blocks: vec![("pc.ram", 4 * MIB, vec![]), ("vga.vram", MIB, vec![])] },
        Layout { blocks: vec![("pc.ram", 4 * MIB, vec![])] },
        &["vga.vram"],
        &["matched none of this side's 2 blocks", "'vga.vram' of 0x100000 bytes"],
    );
}

#[test]
fn length_mismatch_fails_on_both_sides() {
    block_mismatch(
        Layout { blocks: vec![("pc.ram", 4 * MIB, vec![])] },
        Layout { blocks: vec![("pc.ram", 8 * MIB, vec![])] },
        &["pc.ram", "0x400000", "0x800000"],
        &["block 'pc.ram' has length 0x400000 here and 0x800000 on the destination"],
    );
}

#[test]
fn connecting_where_nobody_listens_is_a_connect_error() {
    // Bind and drop a listener to find a port that is free now.
    let port = listen(&Config::default()).1;
    let ram = GuestRam::new(MIB, 0);
    let mut r = RamBlocks::new();
    unsafe { r.add("pc.ram", ram.ptr(), 0, MIB).unwrap() };
    let err = Source::connect(&rdma_ip(), port, &Config::default(), &r).err().expect("connect must fail");
    assert_eq!(err.kind, ErrorKind::Connect, "{err}");
    let cause = format!("no listener on {} port {port} (is the destination listening yet?)", rdma_ip());
    assert!(err.message.contains(&cause), "{err}");
}

#[test]
fn source_abort_reaches_the_destination_as_a_peer_error() {
    let layout = Layout { blocks: vec![("pc.ram", 8 * MIB, vec![])] };
    let src_ram = layout.source_ram(4);
    let dst_ram = layout.dest_ram();
    let config = Config::default();
    let (source, dest) = connect(&layout.registry(&src_ram, 0), &config, layout.registry(&dst_ram, 0), &config);
    source.iteration_begin().unwrap();
    source.save(0, 0, 8 * MIB).unwrap();
    source.iteration_end().unwrap();
    source.abort();
    let err = dest.wait_iteration(2, Some(Duration::from_secs(10))).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PeerError, "{err}");
    assert_eq!(dest.error().map(|e| e.kind), Some(ErrorKind::PeerError));
    let err = source.iteration_begin().unwrap_err();
    assert_eq!(err.kind, ErrorKind::Aborted, "{err}");
}

/// The destination listens on an IPv6 address, then on a host name; a
/// migration window and a stream message go through each.
#[test]
fn ipv6_addresses_and_host_names_connect() {
    let ip6 = std::env::var("RXE_VM_IP6").expect("RXE_VM_IP6: the RDMA netdev's IPv6 address (the harness sets it)");
    let host = std::env::var("RXE_VM_HOST").expect("RXE_VM_HOST: a name of the RDMA netdev's address");
    let layout = Layout { blocks: vec![("pc.ram", 4 * MIB, vec![])] };
    for addr in [ip6.as_str(), host.as_str()] {
        let src_ram = layout.source_ram(8);
        let dst_ram = layout.dest_ram();
        let config = Config::default();
        let listener = Listener::bind(addr, 0, &config).unwrap_or_else(|e| panic!("listen on {addr}: {e}"));
        let port = listener.port();
        let dst_registry = layout.registry(&dst_ram, 0);
        let dest = thread::spawn(move || {
            Destination::accept(&listener, &dst_registry, Some(Duration::from_secs(30))).unwrap()
        });
        let source = Source::connect(addr, port, &config, &layout.registry(&src_ram, 0))
            .unwrap_or_else(|e| panic!("connect to [{addr}]:{port}: {e}"));
        let dest = dest.join().unwrap();
        source.iteration_begin().unwrap();
        source.save(0, 0, 4 * MIB).unwrap();
        source.iteration_end().unwrap();
        source.put(addr.as_bytes()).unwrap();
        source.flush().unwrap();
        dest.wait_iteration(1, Some(Duration::from_secs(30))).unwrap();
        assert_eq!(read_stream(&dest, addr.len()), addr.as_bytes());
        assert!(src_ram[0].bytes() == dst_ram[0].bytes(), "RAM differs over {addr}");
        assert_eq!(source.close().unwrap(), Ending::Completed);
        drop(dest);
    }
}
