//! Records a migration: serves one source (a real QEMU, or rdmamig) as an
//! rdmamig destination and writes what it sent to a recording file
//! (`rdmamig::recording`), for `replay` to send again.
//!
//! ```text
//! record HOST PORT FILE NAME:OFFSET:LENGTH...
//! ```
//!
//! The blocks are the source's RAM blocks in its migration order: for QEMU,
//! `info ramblock` (Offset and Used, hex with 0x or decimal), e.g.
//! `record 198.18.0.1 4444 vm.rec pc.ram:0:0x8000000 pc.bios:0x8000000:0x40000 ...`
//! then on QEMU: `migrate rdma:198.18.0.1:4444`.

use std::process::ExitCode;
use std::time::Duration;

use rdmamig::recording::{BlockLayout, Recording};
use rdmamig::{Config, Listener};

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

fn run(args: &[String]) -> Result<(), String> {
    let [host, port, file, blocks @ ..] = args else {
        return Err("usage: record HOST PORT FILE NAME:OFFSET:LENGTH...".into());
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("record: {e}");
            ExitCode::FAILURE
        }
    }
}
