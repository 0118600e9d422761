//! Replays a recording (made by `record`) into a destination: as QEMU's
//! source did, with rdmamig's extensions off, so a real QEMU destination
//! (`qemu-system-x86_64 ... -incoming rdma:HOST:PORT`, same machine and RAM
//! size as the recorded source) can load it.
//!
//! ```text
//! replay FILE HOST PORT
//! ```

use std::process::ExitCode;
use std::time::Instant;

use rdmamig::recording::Recording;
use rdmamig::Config;

fn run(args: &[String]) -> Result<(), String> {
    let [file, host, port] = args else {
        return Err("usage: replay FILE HOST PORT".into());
    };
    let port: u16 = port.parse().map_err(|e| format!("port {port:?}: {e}"))?;
    let input = std::fs::File::open(file).map_err(|e| format!("{file}: {e}"))?;
    let mut recording = Recording::read_from(input).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let ending =
        recording.replay(host, port, &Config { extensions: false, ..Config::default() }).map_err(|e| e.to_string())?;
    eprintln!(
        "replay: {ending:?} after {:?}: {} stream bytes, {} windows, pin-all {}",
        start.elapsed(),
        recording.stream.len(),
        recording.windows.len(),
        recording.pin_all
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replay: {e}");
            ExitCode::FAILURE
        }
    }
}
