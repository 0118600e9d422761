//! Post-copy through the hypervisor's userfaultfd (issue 33 item 1,
//! `Config::hypervisor_userfaultfd`): the hypervisor registers guest RAM
//! with a userfaultfd of its own and reads its faults; it hands the
//! descriptor over, and forwards each fault with `postcopy_fetch`, which
//! installs the page through it and wakes the faulting thread. As QEMU's
//! destination does (one process), and as a separate migration process does
//! that received the VMM's guest memory and userfaultfd over a UNIX socket,
//! whose faults are in the VMM's address space.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use rdmamig::{set_log_hook, Config, Destination, Ending, ErrorKind, LogLevel, PostcopyPhase, RamBlocks, StalePages};

use super::child::{child_setting, ChildExe, Peer, REPORT};
use super::migration::{connect, mix, one_block, GuestRam, PAGE};

const LEN: u64 = 16 << 20;
const PAGES: u64 = LEN / PAGE;
const WAIT: Option<Duration> = Some(Duration::from_secs(60));

/// Three pages in four change after pre-copy: stale.
fn is_stale(page: u64) -> bool {
    page % 4 != 0
}

/// Word `w` of `page`: as pre-copy sends it (round 0), as it ends (round 1);
/// a function of page, word and round, so each process knows it without a copy.
fn word(page: u64, w: u64, round: u64) -> u64 {
    mix((page << 20) ^ (w << 2) ^ round)
}

fn final_word(page: u64, w: u64) -> u64 {
    word(page, w, u64::from(is_stale(page)))
}

fn write_round(ram: &GuestRam, pages: impl Iterator<Item = u64>, round: u64) {
    for p in pages {
        for w in 0..PAGE / 8 {
            ram.write_u64(p * PAGE + w * 8, word(p, w, round));
        }
    }
}

fn stale_bitmap() -> Vec<u64> {
    let mut bitmap = vec![0u64; (PAGES / 64) as usize];
    for p in (0..PAGES).filter(|&p| is_stale(p)) {
        bitmap[(p / 64) as usize] |= 1 << (p % 64);
    }
    bitmap
}

/// The first page of `base..+LEN` (read through `base`) that does not hold
/// its final content, if any.
fn first_wrong(base: *const u64, pages: impl Iterator<Item = u64>) -> Option<u64> {
    pages.into_iter().find(|&p| {
        (0..PAGE / 8).any(|w| {
            // SAFETY: `base` maps LEN bytes; a read of a missing page faults and waits for its install.
            let got = unsafe { base.add((p * PAGE / 8 + w) as usize).read_volatile() };
            got != final_word(p, w)
        })
    })
}

// <linux/userfaultfd.h>, as a hypervisor has it.
const UFFD_API: u64 = 0xaa;
const UFFDIO_API: u64 = (3 << 30) | (24 << 16) | (0xaa << 8) | 0x3f;
const UFFDIO_REGISTER: u64 = (3 << 30) | (32 << 16) | (0xaa << 8);
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;

/// The hypervisor's userfaultfd.
struct Uffd(OwnedFd);

impl Uffd {
    fn new() -> Uffd {
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
        let uffd = Uffd(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        let mut api = [UFFD_API, 0, 0];
        assert_eq!(unsafe { libc::ioctl(uffd.0.as_raw_fd(), UFFDIO_API as _, api.as_mut_ptr()) }, 0, "UFFDIO_API");
        uffd
    }

    fn register(&self, addr: *mut u8, len: u64) {
        let mut arg = [addr as u64, len, UFFDIO_REGISTER_MODE_MISSING, 0];
        let rc = unsafe { libc::ioctl(self.0.as_raw_fd(), UFFDIO_REGISTER as _, arg.as_mut_ptr()) };
        assert_eq!(rc, 0, "UFFDIO_REGISTER: {}", std::io::Error::last_os_error());
    }
}

/// The hypervisor's fault thread: forwards each fault on `uffd` (addresses
/// from `base` on are block 0's) to `dest` until `stop`; returns how many.
fn forward_faults(uffd: &impl AsRawFd, base: u64, dest: &Destination, stop: &AtomicBool) -> u64 {
    let mut forwarded = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd { fd: uffd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
            continue;
        }
        let mut msgs = [[0u8; 32]; 16];
        let n = unsafe { libc::read(uffd.as_raw_fd(), msgs.as_mut_ptr().cast(), std::mem::size_of_val(&msgs)) };
        if n < 0 {
            continue; // EAGAIN: another reader, or a spurious wake.
        }
        for m in msgs.iter().take(n as usize / 32).filter(|m| m[0] == UFFD_EVENT_PAGEFAULT) {
            let addr = u64::from_ne_bytes(m[16..24].try_into().unwrap()) & !(PAGE - 1);
            dest.postcopy_fetch(0, addr - base, PAGE, WAIT).unwrap();
            forwarded += 1;
        }
    }
    forwarded
}

/// Pre-copy of the whole block, then the stale pages change on the source.
fn precopy(src: &GuestRam, dst: RamBlocks, dst_config: &Config) -> (rdmamig::Source, Destination) {
    write_round(src, 0..PAGES, 0);
    let (source, dest) = connect(&one_block(src, LEN), &Config::default(), dst, dst_config);
    source.iteration_begin().unwrap();
    source.save(0, 0, LEN).unwrap();
    source.iteration_end().unwrap();
    dest.wait_iteration(1, WAIT).unwrap();
    write_round(src, (0..PAGES).filter(|&p| is_stale(p)), 1);
    (source, dest)
}

fn hypervisors() -> Config {
    Config { hypervisor_userfaultfd: true, ..Config::default() }
}

/// QEMU's model: one process. The userfaultfd is handed over once the
/// library said it waits for it (its log record); four vCPU threads read
/// every page while post-copy runs, each fault forwarded by the fault thread;
/// every page holds the source's final content. And what is refused: a
/// descriptor that is no userfaultfd, addresses for another number of
/// blocks, a second hand-over.
#[test]
fn postcopy_through_the_hypervisors_userfaultfd() {
    let src = GuestRam::new(LEN, 0);
    let dst = GuestRam::new(LEN, 0);
    let (source, dest) = precopy(&src, one_block(&dst, LEN), &hypervisors());
    let uffd = Uffd::new();
    uffd.register(dst.ptr(), LEN);
    let null = std::fs::File::open("/dev/null").unwrap();
    let err = dest.postcopy_userfaultfd(null.as_fd(), None).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{err}");
    let err = dest.postcopy_userfaultfd(uffd.0.as_fd(), Some(&[0, 1 << 30])).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{err}");
    let (stop, forwarded) = (AtomicBool::new(false), AtomicU64::new(0));
    let (waiting, waits) = std::sync::mpsc::sync_channel(1);
    let hook = move |_: LogLevel, message: &str| {
        if message.contains("waiting up to") && message.contains("userfaultfd") {
            let _ = waiting.try_send(());
        }
    };
    set_log_hook(Some(Box::new(hook)), LogLevel::Info).unwrap();
    thread::scope(|s| {
        let postcopy = s.spawn(|| source.postcopy(&[StalePages { block: 0, bitmap: stale_bitmap() }]));
        // The request is in; the library waits for the hypervisor's descriptor.
        waits.recv_timeout(Duration::from_secs(60)).expect("the library never said it waits for the userfaultfd");
        set_log_hook(None, LogLevel::Info).unwrap();
        assert_eq!(dest.postcopy_progress().phase, PostcopyPhase::Idle);
        dest.postcopy_userfaultfd(uffd.0.as_fd(), None).unwrap();
        let err = dest.postcopy_userfaultfd(uffd.0.as_fd(), None).unwrap_err();
        assert_eq!(err.kind, ErrorKind::State, "{err}");
        let faults =
            s.spawn(|| forwarded.store(forward_faults(&uffd.0, dst.ptr() as u64, &dest, &stop), Ordering::Relaxed));
        dest.wait_postcopy(PostcopyPhase::Running, WAIT).unwrap();
        let base = dst.ptr() as *const u64 as usize;
        let vcpus: Vec<_> = (0..4u64)
            .map(|v| s.spawn(move || first_wrong(base as *const u64, (0..PAGES / 4).rev().map(move |i| i * 4 + v))))
            .collect();
        for (v, vcpu) in vcpus.into_iter().enumerate() {
            assert_eq!(vcpu.join().unwrap(), None, "vCPU {v} read a page without its final content");
        }
        postcopy.join().unwrap().unwrap();
        stop.store(true, Ordering::Relaxed);
        faults.join().unwrap();
    });
    let done = dest.wait_postcopy(PostcopyPhase::Done, WAIT).unwrap();
    let forwarded = forwarded.load(Ordering::Relaxed);
    assert!(forwarded > 0 && done.faults_served > 0, "no fault went through the hypervisor ({forwarded} forwarded)");
    assert_eq!(first_wrong(dst.ptr() as *const u64, 0..PAGES), None);
    assert_eq!(source.close().unwrap(), Ending::Completed);
    assert_eq!(dest.wait_end(WAIT).unwrap(), Ending::Completed);
}

/// A destination without the setting refuses a userfaultfd; one whose
/// userfaultfd does not cover guest RAM fails post-copy before it drops a
/// page (a dropped page there would read as zero), saying why.
#[test]
fn postcopy_refuses_a_hypervisor_userfaultfd_without_guest_ram() {
    let src = GuestRam::new(LEN, 0);
    let dst = GuestRam::new(LEN, 0);
    let uffd = Uffd::new();
    let (source, dest) = precopy(&src, one_block(&dst, LEN), &Config::default());
    let err = dest.postcopy_userfaultfd(uffd.0.as_fd(), None).unwrap_err();
    assert_eq!(err.kind, ErrorKind::State, "{err}");
    source.abort();
    drop(dest);
    let (source, dest) = precopy(&src, one_block(&dst, LEN), &hypervisors());
    dest.postcopy_userfaultfd(uffd.0.as_fd(), None).unwrap();
    let result = source.postcopy(&[StalePages { block: 0, bitmap: stale_bitmap() }]);
    let err = dest.wait_postcopy(PostcopyPhase::Running, WAIT).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{err}");
    assert!(err.message.contains("not registered with the hypervisor's userfaultfd"), "{err}");
    assert!(result.is_err(), "the source's post-copy ended well: {result:?}");
}

const CHILD_ENV: &str = "RDMAMIG_HYPERVISOR_UFFD";

/// Sends `fds` and `data` over `sock` (SCM_RIGHTS).
fn send_fds(sock: &UnixStream, fds: &[RawFd], data: &[u8]) {
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), fds.len());
    }
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    assert_eq!(n, data.len() as isize, "sendmsg: {}", std::io::Error::last_os_error());
}

/// Receives two descriptors and 8 bytes sent by `send_fds`.
fn receive_fds(sock: &UnixStream) -> ([OwnedFd; 2], [u8; 8]) {
    let mut data = [0u8; 8];
    let space = unsafe { libc::CMSG_SPACE(2 * std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    assert_eq!(n, 8, "recvmsg: {}", std::io::Error::last_os_error());
    let mut fds = [-1 as RawFd; 2];
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        assert!(!cmsg.is_null() && (*cmsg).cmsg_type == libc::SCM_RIGHTS, "no descriptors came");
        std::ptr::copy_nonoverlapping(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fds.as_mut_ptr(), 2);
    }
    (fds.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }), data)
}

/// Runs as a separate process: the VMM. Its guest RAM is a memfd, registered
/// with its userfaultfd; it sends both (and where the RAM lies here) to the
/// migration process, then, told that post-copy runs, reads every page as
/// its vCPUs would, and reports whether each held its final content.
#[test]
#[ignore = "child process of postcopy_through_the_userfaultfd_of_another_process"]
fn hypervisor_uffd_child() {
    let Some(setting) = child_setting(CHILD_ENV) else { return };
    let memfd = unsafe { libc::memfd_create(c"guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(memfd >= 0 && unsafe { libc::ftruncate(memfd, LEN as libc::off_t) } == 0);
    let flags = libc::MAP_SHARED;
    let ram =
        unsafe { libc::mmap(std::ptr::null_mut(), LEN as usize, libc::PROT_READ | libc::PROT_WRITE, flags, memfd, 0) };
    assert_ne!(ram, libc::MAP_FAILED);
    let uffd = Uffd::new();
    uffd.register(ram.cast(), LEN);
    let mut sock = UnixStream::connect(&setting[0]).unwrap();
    send_fds(&sock, &[memfd, uffd.0.as_raw_fd()], &(ram as u64).to_ne_bytes());
    println!("{REPORT}sent");
    let mut go = [0u8];
    sock.read_exact(&mut go).unwrap();
    let wrong = first_wrong(ram as *const u64, 0..PAGES);
    println!("{REPORT}read {wrong:?}");
    sock.write_all(b"k").unwrap();
    // Until the parent is done with this process's memory.
    let _ = sock.read(&mut go);
}

/// The Cloud Hypervisor model: the VMM (a child process) registers its
/// guest RAM (a memfd) with its userfaultfd and sends both over a UNIX
/// socket to this process, which migrates: it maps the memfd as its block,
/// hands the library the VMM's userfaultfd with where the block lies in the
/// VMM, and forwards the VMM's faults. The VMM reads every page while
/// post-copy runs, each with its final content, installed into its address
/// space through its own userfaultfd.
#[test]
fn postcopy_through_the_userfaultfd_of_another_process() {
    let exe = ChildExe::copy();
    let path = std::env::temp_dir().join(format!("rdmamig-uffd-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let mut vmm = Peer::spawn(&exe.0, "hypervisor_uffd::hypervisor_uffd_child", CHILD_ENV, path.to_str().unwrap());
    let (mut sock, _) = listener.accept().unwrap();
    let ([memfd, uffd], at) = receive_fds(&sock);
    vmm.expect("sent");
    let _ = std::fs::remove_file(&path);
    let vmm_base = u64::from_ne_bytes(at);
    let flags = libc::MAP_SHARED;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let ram = unsafe { libc::mmap(std::ptr::null_mut(), LEN as usize, prot, flags, memfd.as_raw_fd(), 0) };
    assert_ne!(ram, libc::MAP_FAILED);
    let mut blocks = RamBlocks::new();
    unsafe { blocks.add("pc.ram", ram.cast(), 0, LEN).unwrap() };
    let src = GuestRam::new(LEN, 0);
    let (source, dest) = precopy(&src, blocks, &hypervisors());
    dest.postcopy_userfaultfd(uffd.as_fd(), Some(&[vmm_base])).unwrap();
    let (stop, forwarded) = (AtomicBool::new(false), AtomicU64::new(0));
    thread::scope(|s| {
        let postcopy = s.spawn(|| source.postcopy(&[StalePages { block: 0, bitmap: stale_bitmap() }]));
        let faults = s.spawn(|| forwarded.store(forward_faults(&uffd, vmm_base, &dest, &stop), Ordering::Relaxed));
        dest.wait_postcopy(PostcopyPhase::Running, WAIT).unwrap();
        sock.write_all(b"g").unwrap();
        assert_eq!(vmm.next(Duration::from_secs(120)), "read None", "the VMM read a page without its final content");
        postcopy.join().unwrap().unwrap();
        stop.store(true, Ordering::Relaxed);
        faults.join().unwrap();
    });
    dest.wait_postcopy(PostcopyPhase::Done, WAIT).unwrap();
    assert!(forwarded.load(Ordering::Relaxed) > 0, "no fault of the VMM came through its userfaultfd");
    assert_eq!(first_wrong(ram as *const u64, 0..PAGES), None, "through this process's mapping");
    assert_eq!(source.close().unwrap(), Ending::Completed);
    assert_eq!(dest.wait_end(WAIT).unwrap(), Ending::Completed);
    drop(sock);
    let (status, _) = vmm.finish(Duration::from_secs(30));
    assert!(status.success(), "the VMM process: {status}");
    unsafe { libc::munmap(ram, LEN as usize) };
}
