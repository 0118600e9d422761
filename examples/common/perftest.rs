//! Shared by the benchmark examples (`#[path]` module): perftest's tools
//! (ib_write_bw, ib_read_lat, ib_read_bw) run as server and client over
//! the guest's rxe device, the anchors every figure is a ratio to.

use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

/// This host's RDMA address (the rxe guest's).
pub fn ip() -> String {
    std::env::var("RXE_VM_IP").unwrap_or_else(|_| "198.18.0.1".into())
}

/// The better of two measurements of one anchor (either, if the other
/// failed): on a loaded host one run can lose much of its rate to the
/// guest's vCPUs being preempted, and a low anchor flatters every ratio.
pub fn better(a: Result<f64, String>, b: Result<f64, String>) -> Result<f64, String> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(a.max(b)),
        (Ok(v), Err(_)) | (Err(_), Ok(v)) => Ok(v),
        (Err(e), Err(_)) => Err(e),
    }
}

/// One perftest measurement: server, then (2 s later) client on this host's
/// RDMA address; the client's output. Three tries: in a loaded guest the
/// client can reach the server before it listens.
pub fn perftest(tool: &str, args: &[&str]) -> Result<String, String> {
    let mut result = perftest_once(tool, args);
    for _ in 1..3 {
        if result.is_ok() {
            break;
        }
        eprintln!("perftest: {tool} {} failed, again: {}", args.join(" "), result.as_ref().unwrap_err());
        result = perftest_once(tool, args);
    }
    result
}

fn perftest_once(tool: &str, args: &[&str]) -> Result<String, String> {
    let dev = std::env::var("RXE_VM_DEV").unwrap_or_else(|_| "rxe0".into());
    let spawn = |client: bool| {
        let mut c = Command::new("timeout");
        c.args(["60", tool, "-R", "-F", "-d", &dev])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .stdout(Stdio::piped());
        if client {
            c.arg(ip());
        }
        c.spawn().map_err(|e| format!("{tool}: {e}"))
    };
    let server = spawn(false)?;
    thread::sleep(Duration::from_secs(2));
    let client = spawn(true).and_then(|c| c.wait_with_output().map_err(|e| e.to_string()));
    if !client.as_ref().is_ok_and(|c| c.status.success()) {
        // The server waits for a client until `timeout` ends it: end it now.
        // SAFETY: kill has no memory preconditions; the pid is our unreaped child's.
        unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGTERM) };
    }
    let server = server.wait_with_output().map_err(|e| e.to_string())?;
    let client = client?;
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    if client.status.success() && server.status.success() && out.contains("#bytes") {
        Ok(out)
    } else {
        Err(format!(
            "{tool} {}: client {} server {}\n{out}{}{}",
            args.join(" "),
            client.status,
            server.status,
            String::from_utf8_lossy(&client.stderr),
            String::from_utf8_lossy(&server.stderr)
        ))
    }
}
