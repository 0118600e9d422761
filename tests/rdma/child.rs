//! Child processes for tests that need a second process (one side killed, or
//! running with other credentials and limits): this test binary re-executed
//! on one ignored test, selected by an environment variable. The child
//! reports on its stdout, one `REPORT ...` line at a time; its stderr (panic
//! messages) goes straight to the parent's.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Prefix of a child's report lines on its stdout.
pub const REPORT: &str = "REPORT ";

/// A private copy of this test binary for the children, removed on drop. Other
/// builds may rewrite the binary in target/ while the runs go on (the guest
/// sees the host's tree live); a child exec'ing a half-written binary crashes.
pub struct ChildExe(pub PathBuf);

impl ChildExe {
    pub fn copy() -> ChildExe {
        static COPIES: AtomicU64 = AtomicU64::new(0);
        let n = COPIES.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("rdmamig-child-{}-{n}", std::process::id()));
        std::fs::copy("/proc/self/exe", &path).unwrap();
        ChildExe(path)
    }
}

impl Drop for ChildExe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A child process reporting `REPORT ...` lines on its stdout; killed on drop.
pub struct Peer {
    child: Option<Child>,
    lines: Receiver<String>,
    reader: Option<JoinHandle<()>>,
}

impl Peer {
    /// Runs the ignored test `test` (full path, e.g. `killpoints::source_child`)
    /// of `exe` with `env` set to `value`.
    pub fn spawn(exe: &Path, test: &str, env: &str, value: &str) -> Peer {
        let mut child = Command::new(exe)
            .args(["--ignored", "--exact", test, "--nocapture", "--test-threads=1"])
            .env(env, value)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest may have printed "test NAME ... " without a newline before the test's output.
                if let Some(at) = line.find(REPORT) {
                    if tx.send(line[at + REPORT.len()..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        Peer { child: Some(child), lines, reader: Some(reader) }
    }

    /// The child's next report; fails if it exits or stays silent for `timeout`.
    pub fn next(&mut self, timeout: Duration) -> String {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("the child reported nothing for {timeout:?}"),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.as_mut().map(|c| c.wait().unwrap());
                panic!("the child exited ({status:?}) without a report")
            }
        }
    }

    /// The child's next report must be `report` (within 60 s).
    pub fn expect(&mut self, report: &str) {
        let got = self.next(Duration::from_secs(60));
        assert_eq!(got, report, "unexpected report from the child");
    }

    /// Takes the child out, to be killed elsewhere.
    pub fn take(&mut self) -> Child {
        self.child.take().expect("the child was already killed")
    }

    /// SIGKILLs the child now; returns when the signal was sent.
    pub fn kill(&mut self) -> Instant {
        kill(self.take()).0
    }

    /// Reports the child made after the kill (its output ended with its death).
    pub fn rest(&mut self) -> Vec<String> {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.lines.try_iter().collect()
    }

    /// Waits up to `bound` for the child to exit by itself; returns its
    /// status and the reports not read yet. Fails (and kills it on drop) if
    /// it is still running after `bound`.
    pub fn finish(&mut self, bound: Duration) -> (ExitStatus, Vec<String>) {
        let deadline = Instant::now() + bound;
        let child = self.child.as_mut().expect("the child was already killed");
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the child still runs after {bound:?} (hang)");
            thread::sleep(Duration::from_millis(20));
        };
        self.child = None;
        (status, self.rest())
    }
}

/// SIGKILLs `child`; returns when the signal was sent and how the child ended.
pub fn kill(mut child: Child) -> (Instant, ExitStatus) {
    let at = Instant::now();
    child.kill().unwrap();
    let status = child.wait().unwrap();
    (at, status)
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            let _ = kill(c);
        }
    }
}

/// Runs `f` in a thread and fails if it takes longer than `bound` (a hang).
pub fn bounded<T: Send + 'static>(bound: Duration, what: String, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(bound) {
        Ok(v) => {
            handle.join().unwrap();
            v
        }
        Err(RecvTimeoutError::Timeout) => panic!("{what}: no result after {bound:?} (hang)"),
        Err(RecvTimeoutError::Disconnected) => std::panic::resume_unwind(handle.join().unwrap_err()),
    }
}

/// A child's setting: the whitespace-separated words of `env`, or `None`
/// when it is not set (the ignored test then runs as a plain test: it returns).
pub fn child_setting(env: &str) -> Option<Vec<String>> {
    std::env::var(env).ok().map(|v| v.split_whitespace().map(str::to_string).collect())
}
