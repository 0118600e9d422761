//! Event-loop integration over rxe: the connection's event fd is
//! level-triggered (readable exactly while there is something to take), the
//! calls given `Duration::ZERO` never wait, and the log hook sees a
//! connection's milestones on the threads that produce them.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdmamig::{set_log_hook, Config, Destination, Ending, ErrorKind, LogLevel, Read, Source};

use crate::migration::{connect, one_block, GuestRam, Rng, PAGE};

const MIB: u64 = 1 << 20;
const ZERO: Option<Duration> = Some(Duration::ZERO);

/// Whether `fd` is readable within `ms` milliseconds (0: now).
fn readable(fd: BorrowedFd<'_>, ms: i32) -> bool {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1 && p.revents & libc::POLLIN != 0
}

/// Long enough for anything the peer already did to arrive.
const SOON: i32 = 10_000;

#[test]
fn destination_event_fd_is_readable_exactly_while_there_is_something_to_take() {
    let src_ram = GuestRam::new(8 * MIB, 0);
    let mut rng = Rng::new(5);
    for off in (0..8 * MIB).step_by(8) {
        src_ram.write_u64(off, rng.next());
    }
    let dst_ram = GuestRam::new(8 * MIB, 0xAA);
    let config = Config::default();
    let (source, dest) = connect(&one_block(&src_ram, 8 * MIB), &config, one_block(&dst_ram, 8 * MIB), &config);
    let fd = dest.event_fd();
    assert_eq!(fd.as_raw_fd(), dest.event_fd().as_raw_fd(), "the same fd every time");

    // Nothing yet: not readable, and nothing waits.
    assert!(!readable(fd, 0));
    let mut buf = [0u8; 1000];
    assert_eq!(dest.get(&mut buf, ZERO).unwrap_err().kind, ErrorKind::WouldBlock);
    assert_eq!(dest.wait_iteration(1, ZERO).unwrap_err().kind, ErrorKind::WouldBlock);
    assert_eq!(dest.wait_end(ZERO).unwrap_err().kind, ErrorKind::WouldBlock);
    assert_eq!(dest.wait_iteration(0, ZERO).unwrap(), 0);
    assert!(!readable(fd, 0), "a WouldBlock does not make it readable");

    // Stream bytes: readable until the last of them is taken.
    let blob: Vec<u8> = (0..1000u32).map(|i| (i * 13 + 1) as u8).collect();
    source.put(&blob).unwrap();
    source.flush().unwrap();
    assert!(readable(fd, SOON), "stream bytes arrived but the fd is not readable");
    assert_eq!(dest.get(&mut buf[..400], ZERO).unwrap(), Read::Bytes(400));
    assert!(readable(fd, 0), "level-triggered: 600 bytes are still there");
    assert_eq!(dest.get(&mut buf[400..], ZERO).unwrap(), Read::Bytes(600));
    assert_eq!(buf[..], blob[..]);
    assert!(!readable(fd, 0), "every byte was taken");
    assert_eq!(dest.get(&mut buf, ZERO).unwrap_err().kind, ErrorKind::WouldBlock);

    // A window: readable until a wait_iteration returns it, whatever get says.
    source.iteration_begin().unwrap();
    for off in (0..8 * MIB).step_by(PAGE as usize) {
        source.save(0, off, PAGE).unwrap();
    }
    source.iteration_end().unwrap();
    assert!(readable(fd, SOON), "a window completed but the fd is not readable");
    assert_eq!(dest.get(&mut buf, ZERO).unwrap_err().kind, ErrorKind::WouldBlock);
    assert!(readable(fd, 0), "the window is not reported yet");
    assert_eq!(dest.wait_iteration(2, ZERO).unwrap_err().kind, ErrorKind::WouldBlock);
    assert!(readable(fd, 0), "a WouldBlock reports nothing");
    assert_eq!(dest.wait_iteration(0, ZERO).unwrap(), 1);
    assert!(!readable(fd, 0), "the window was reported");
    assert!(src_ram.bytes() == dst_ram.bytes(), "RAM differs after the window");

    // Stream bytes and a window together: both must be taken.
    source.put(&blob[..10]).unwrap();
    source.iteration_begin().unwrap();
    source.save(0, 0, PAGE).unwrap();
    source.iteration_end().unwrap();
    assert!(readable(fd, SOON));
    // The stream bytes go out first and may wake the poll before the window
    // has arrived: this wait is for the window, not for the fd.
    assert_eq!(dest.wait_iteration(2, Some(Duration::from_secs(10))).unwrap(), 2);
    assert!(readable(fd, 0), "10 stream bytes are still there");
    assert_eq!(dest.get(&mut buf, ZERO).unwrap(), Read::Bytes(10));
    assert!(!readable(fd, 0));

    // The end: readable for good, and every call says how it ended without waiting.
    assert_eq!(source.close().unwrap(), Ending::Completed);
    assert!(readable(fd, SOON), "the connection ended but the fd is not readable");
    assert_eq!(dest.wait_end(ZERO).unwrap(), Ending::Completed);
    assert_eq!(dest.get(&mut buf, ZERO).unwrap(), Read::End(Ending::Completed));
    assert_eq!(dest.wait_iteration(0, ZERO).unwrap(), 2);
    assert!(readable(fd, 0), "the end stays readable");
}

type Records = Arc<Mutex<Vec<(LogLevel, String, String)>>>;

/// Installs a hook keeping every record with its thread's name.
fn collect(max: LogLevel) -> Records {
    let records: Records = Arc::default();
    let r = records.clone();
    let hook = move |level, message: &str| {
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        r.lock().unwrap().push((level, message.to_string(), thread));
    };
    set_log_hook(Some(Box::new(hook)), max).unwrap();
    records
}

/// The record containing `text`, or a panic listing them all.
fn find(records: &Records, text: &str) -> (LogLevel, String, String) {
    let all = records.lock().unwrap();
    all.iter()
        .find(|(_, m, _)| m.contains(text))
        .cloned()
        .unwrap_or_else(|| panic!("no record with {text:?} in {all:#?}"))
}

#[test]
fn source_event_fd_is_readable_once_the_connection_failed_and_the_failure_is_logged() {
    let records = collect(LogLevel::Warn);
    let src_ram = GuestRam::new(4 * MIB, 1);
    let dst_ram = GuestRam::new(4 * MIB, 0);
    let config = Config::default();
    let (source, dest) = connect(&one_block(&src_ram, 4 * MIB), &config, one_block(&dst_ram, 4 * MIB), &config);
    let fd = source.event_fd();
    assert!(!readable(fd, 0), "a healthy source's fd is not readable");
    assert!(!readable(dest.event_fd(), 0));
    dest.abort();
    assert!(readable(fd, SOON), "the destination aborted but the source's fd is not readable");
    let err = source.error().expect("the source knows it failed");
    assert!(matches!(err.kind, ErrorKind::PeerError | ErrorKind::Disconnected), "{err}");
    assert!(readable(fd, 0), "for good");
    assert!(readable(dest.event_fd(), SOON), "the destination ended");
    assert_eq!(dest.wait_end(ZERO).unwrap_err().kind, ErrorKind::Aborted);
    drop(source);
    drop(dest);
    set_log_hook(None, LogLevel::Debug).unwrap();
    let (level, message, thread) = find(&records, "source: the connection failed");
    eprintln!("{level:?} on {thread}: {message}");
    assert_eq!((level, thread.as_str()), (LogLevel::Error, "rdmamig-source"));
    let (level, _, thread) = find(&records, "destination: the connection failed");
    assert_eq!((level, thread.as_str()), (LogLevel::Error, "rdmamig-dest"));
    assert!(records.lock().unwrap().iter().all(|(l, _, _)| *l <= LogLevel::Warn), "a record above the hook's level");
}

#[test]
fn log_hook_sees_connect_accept_windows_and_the_end() {
    let records = collect(LogLevel::Debug);
    let src_ram = GuestRam::new(4 * MIB, 3);
    let dst_ram = GuestRam::new(4 * MIB, 0);
    let config = Config::default();
    let (source, dest) = connect(&one_block(&src_ram, 4 * MIB), &config, one_block(&dst_ram, 4 * MIB), &config);
    for _ in 0..2 {
        source.iteration_begin().unwrap();
        source.save(0, 0, 4 * MIB).unwrap();
        source.iteration_end().unwrap();
    }
    assert_eq!(source.close().unwrap(), Ending::Completed);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(10))).unwrap(), Ending::Completed);
    drop(dest);
    set_log_hook(None, LogLevel::Debug).unwrap();
    for r in records.lock().unwrap().iter() {
        eprintln!("{:?} [{}] {}", r.0, r.2, r.1);
    }
    let me = std::thread::current().name().unwrap_or("?").to_string();
    let (level, message, thread) = find(&records, "source: connected to");
    assert_eq!((level, &thread), (LogLevel::Info, &me), "connect logs on the caller's thread");
    assert!(message.contains("pin-all off, rdmamig extensions on, not authenticated"), "{message}");
    let (level, message, _) = find(&records, "destination: accepted a source from");
    assert_eq!(level, LogLevel::Info);
    assert!(message.contains("pin-all off, rdmamig extensions on"), "{message}");
    assert_eq!(find(&records, "source: iteration window 2 complete").0, LogLevel::Debug);
    let (level, _, thread) = find(&records, "destination: iteration window 2 complete");
    assert_eq!((level, thread.as_str()), (LogLevel::Debug, "rdmamig-dest"));
    assert_eq!(find(&records, "source: migration completed").0, LogLevel::Info);
    assert_eq!(find(&records, "destination: migration completed").0, LogLevel::Info);
    let all = records.lock().unwrap();
    assert!(!all.iter().any(|(l, _, _)| *l <= LogLevel::Warn), "a warning or error in a clean migration: {all:#?}");
    assert!(all.len() <= 12, "records are sparse, never per page: {all:#?}");
}

#[test]
fn listener_event_fd_says_when_accepting_will_not_wait() {
    let src_ram = GuestRam::new(4 * MIB, 0x11);
    let dst_ram = GuestRam::new(4 * MIB, 0xAA);
    let config = Config::default();
    let (listener, port) = crate::migration::listen(&config);
    let fd = listener.event_fd();
    assert!(!readable(fd, 0), "readable before any source connected");
    let err = Destination::accept(&listener, &one_block(&dst_ram, 4 * MIB), ZERO).map(drop).unwrap_err();
    assert_eq!(err.kind, ErrorKind::WouldBlock, "{err}");
    let src_blocks = one_block(&src_ram, 4 * MIB);
    let source = std::thread::spawn(move || Source::connect(&crate::migration::rdma_ip(), port, &config, &src_blocks));
    assert!(readable(fd, SOON), "a connection request did not make the listener's fd readable");
    let dest =
        Destination::accept(&listener, &one_block(&dst_ram, 4 * MIB), ZERO).expect("accept with a request waiting");
    let source = source.join().unwrap().expect("connect");
    assert!(!readable(listener.event_fd(), 0), "still readable after the request was taken");
    source.iteration_begin().unwrap();
    source.save(0, 0, 4 * MIB).unwrap();
    source.iteration_end().unwrap();
    assert_eq!(source.close().unwrap(), Ending::Completed);
    assert_eq!(dest.wait_end(Some(Duration::from_secs(30))).unwrap(), Ending::Completed);
    assert!(src_ram.bytes() == dst_ram.bytes());
}
