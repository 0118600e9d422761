//! Abort: the destination process dies in the middle of a transfer; a
//! destination whose link failed under it ends at once.

use std::process::{Child, Command};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use rdmamig::test_hooks::SEVER_AFTER_WINDOWS;
use rdmamig::{Config, Destination, ErrorKind, Source};

use crate::migration::{connect, listen, live_mrs, one_block, open_fds, rdma_ip, GuestRam, PAGE};

const MIB: u64 = 1 << 20;
const RAM: u64 = 64 * MIB;
const PORT_FILE_ENV: &str = "RDMAMIG_TEST_PORT_FILE";

/// Kills the child destination if the test fails before doing so itself.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs as a separate process (started by the test below): a destination that serves until killed.
#[test]
#[ignore = "child process of source_call_fails_fast_when_destination_is_killed"]
fn destination_process() {
    let Ok(port_file) = std::env::var(PORT_FILE_ENV) else { return };
    let ram = GuestRam::new(RAM, 0);
    let (listener, port) = listen(&Config::default());
    std::fs::write(&port_file, port.to_string()).unwrap();
    let _dest = Destination::accept(&listener, &one_block(&ram, RAM), Some(Duration::from_secs(60))).unwrap();
    thread::sleep(Duration::from_secs(120));
    panic!("the parent test should have killed this process");
}

#[test]
fn source_call_fails_fast_when_destination_is_killed() {
    let ram = GuestRam::new(RAM, 0);
    for off in (0..RAM).step_by(8) {
        ram.write_u64(off, off | 1);
    }
    // librdmacm opens the devices on first use and keeps them open: warm up first.
    drop(listen(&Config::default()));
    let fds_before = open_fds();
    let mrs_before = live_mrs();

    let port_file = std::env::temp_dir().join(format!("rdmamig-abort-{}", std::process::id()));
    let _ = std::fs::remove_file(&port_file);
    let mut child = KillOnDrop(Some(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "abort::destination_process", "--include-ignored", "--nocapture"])
            .env(PORT_FILE_ENV, &port_file)
            .spawn()
            .unwrap(),
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    let port: u16 = loop {
        if let Ok(s) = std::fs::read_to_string(&port_file) {
            if let Ok(p) = s.trim().parse() {
                break p;
            }
        }
        assert!(Instant::now() < deadline, "the destination process did not start listening");
        thread::sleep(Duration::from_millis(50));
    };

    let source = Source::connect(&rdma_ip(), port, &Config::default(), &one_block(&ram, RAM)).unwrap();
    assert!(live_mrs() > mrs_before, "the connection registered no memory region");
    let mut child = child.0.take().unwrap();
    let killer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(700));
        child.kill().unwrap();
        let killed = Instant::now();
        child.wait().unwrap();
        killed
    });
    let (failed_at, err) = loop {
        let round = (|| {
            source.iteration_begin()?;
            for off in (0..RAM).step_by(PAGE as usize) {
                source.save(0, off, PAGE)?;
            }
            source.iteration_end()
        })();
        if let Err(e) = round {
            eprintln!("source failed as expected: {e}");
            break (Instant::now(), e);
        }
        assert!(!killer.is_finished() || Instant::now() < deadline, "no error after the destination died");
    };
    let killed = killer.join().unwrap();
    let delay = failed_at.saturating_duration_since(killed);
    eprintln!("error {delay:?} after the kill");
    assert!(delay < Duration::from_secs(5), "the source noticed only after {delay:?}");
    // The README's failure table: a destination gone is a disconnect, whether the source heard
    // of it first from its connection or from a WRITE that met its registrations gone.
    assert_eq!(err.kind, ErrorKind::Disconnected, "{err}");
    assert!(err.message.contains("connection lost: the peer closed the connection, or its process ended"), "{err}");
    if err.message.contains("RDMA WRITE") {
        assert!(err.message.starts_with("the destination went away during an RDMA WRITE"), "{err}");
    }
    // Later calls return the stored error instead of hanging.
    assert!(source.iteration_begin().is_err());
    drop(source);
    let _ = std::fs::remove_file(&port_file);
    assert_eq!(live_mrs(), mrs_before, "memory regions left registered");
    assert_eq!(open_fds(), fds_before, "file descriptors leaked");
}

/// A destination whose QP failed under it (severed: a work request
/// completed in error) ends, and closes, without waiting out the ERROR's
/// grace (1 s): no ERROR can reach the source on that QP, and the credit it
/// waited for could not come.
#[test]
fn destination_whose_qp_failed_ends_without_the_error_grace() {
    const BOUND: Duration = Duration::from_millis(300);
    const LEN: u64 = 8 * MIB;
    let (src, dst) = (GuestRam::new(LEN, 0x5C), GuestRam::new(LEN, 0));
    let config = Config::default();
    let (source, dest) = connect(&one_block(&src, LEN), &config, one_block(&dst, LEN), &config);
    SEVER_AFTER_WINDOWS.store(1, Ordering::Relaxed);
    source.iteration_begin().unwrap();
    source.save(0, 0, LEN).unwrap();
    source.iteration_end().unwrap();
    let window_closed = Instant::now();
    let end = dest.wait_end(Some(Duration::from_secs(10)));
    let ended = window_closed.elapsed();
    let closing = Instant::now();
    dest.close();
    let closed = closing.elapsed();
    assert_eq!(SEVER_AFTER_WINDOWS.swap(0, Ordering::Relaxed), 0, "the link was not severed");
    let err = end.unwrap_err();
    eprintln!("the destination ended {ended:?} after the window closed ({err}), close took {closed:?}");
    assert_eq!(err.kind, ErrorKind::Verbs, "{err}");
    assert!(ended < BOUND, "the destination ended {ended:?} after its QP failed");
    assert!(closed < BOUND, "close took {closed:?}");
    assert!(source.close().is_err(), "the source completed a migration whose destination failed");
}
