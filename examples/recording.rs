//! Record and replay a migration (`rdmamig::recording`).
//!
//! ```text
//! recording record HOST PORT FILE NAME:OFFSET:LENGTH...
//! recording replay FILE HOST PORT
//! ```
//!
//! `record` serves one source (a real QEMU, or rdmamig) as an rdmamig
//! destination on HOST:PORT and writes what it sent to FILE. The blocks are
//! the source's RAM blocks in its migration order: for QEMU, `info ramblock`
//! (Offset and Used, hex with 0x or decimal), e.g.
//! `recording record 198.18.0.1 4444 vm.rec pc.ram:0:0x8000000 pc.bios:0x8000000:0x40000 ...`,
//! then on QEMU: `migrate rdma:198.18.0.1:4444`.
//!
//! `replay` sends FILE to a destination on HOST:PORT as the recorded source
//! did, with rdmamig's extensions off, so that a real QEMU destination
//! (`qemu-system-x86_64 ... -incoming rdma:HOST:PORT`, with the recorded
//! source's machine and RAM size) can load it.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdmamig::recording::{BlockLayout, Recording};
use rdmamig::{Config, Listener};

const USAGE: &str =
    "usage: recording record HOST PORT FILE NAME:OFFSET:LENGTH...\n       recording replay FILE HOST PORT";

fn number(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))
}

fn block(arg: &str) -> Result<BlockLayout, String> {
    let mut parts = arg.rsplitn(3, ':');
    let (length, offset, name) = (parts.next(), parts.next(), parts.next());
    match (name, offset, length) {
        (Some(name), Some(offset), Some(length)) => {
            Ok(BlockLayout { name: name.to_owned(), offset: number(offset)?, length: number(length)? })
        }
        _ => Err(format!("{arg:?} is not NAME:OFFSET:LENGTH")),
    }
}

fn record(args: &[String]) -> Result<(), String> {
    let [host, port, file, blocks @ ..] = args else {
        return Err(USAGE.into());
    };
    let port: u16 = port.parse().map_err(|e| format!("port {port:?}: {e}"))?;
    let layout = blocks.iter().map(|b| block(b)).collect::<Result<Vec<_>, _>>()?;
    if layout.is_empty() {
        return Err("no RAM blocks given".into());
    }
    // Pin-all is the source's choice: this side allows it.
    let listener =
        Listener::bind(host, port, &Config { pin_all: true, ..Config::default() }).map_err(|e| e.to_string())?;
    eprintln!("record: listening on {host} port {}", listener.port());
    let (recording, ending) =
        Recording::record(&listener, &layout, Some(Duration::from_secs(600))).map_err(|e| e.to_string())?;
    let out = std::fs::File::create(file).map_err(|e| format!("{file}: {e}"))?;
    recording.write_to(out).map_err(|e| e.to_string())?;
    eprintln!(
        "record: {ending:?}; {} stream bytes, {} windows, pin-all {}; written to {file}",
        recording.stream.len(),
        recording.windows.len(),
        recording.pin_all
    );
    Ok(())
}

fn replay(args: &[String]) -> Result<(), String> {
    let [file, host, port] = args else {
        return Err(USAGE.into());
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
    let result = match args.split_first() {
        Some((command, rest)) if command == "record" => record(rest),
        Some((command, rest)) if command == "replay" => replay(rest),
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("recording: {e}");
            ExitCode::FAILURE
        }
    }
}
