//! `rdmamig`: the command-line tool over the rdmamig library.
//!
//! - `rdmamig doctor`: what is right and wrong with this host's RDMA setup
//!   for live migration (devices, ports, GIDs, rdma_cm, memlock and cgroup
//!   limits against a guest size, fork safety), with a verdict per item;
//! - `rdmamig bench`: a synthetic guest migrated in rounds between two
//!   processes or hosts, with live progress and a summary;
//! - `rdmamig fabric-plan`: the InfiniBand vSwitch reconfiguration planner:
//!   the SMPs that move a migrating VM's LID, and their cost.
//!
//! Exit status as rdma-core's tools: 0 success, 1 failure, 2 usage error.

mod bench;
mod doctor;
mod fabric;
mod guest_ram;
mod vcpus;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bench::DEFAULT_PORT;
use clap::{Args, CommandFactory, Parser, Subcommand};

/// Exit status: something checked failed (or the migration did).
pub const EXIT_FAIL: u8 = 1;
/// Exit status: the command line was wrong (clap exits with 2 too).
pub const EXIT_USAGE: u8 = 2;

const AFTER_HELP: &str = "\
Exit status: 0 success (doctor: no item failed), 1 failure, 2 usage error.

Sizes take the suffixes K, M, G, T (powers of 1024; KiB, MiB, GiB, TiB too).";

#[derive(Parser, Debug)]
#[command(
    name = "rdmamig",
    version = rdmamig::VERSION,
    about = "Live migration of VM memory over RDMA: check a host, benchmark a migration, plan the fabric",
    long_about = "Live migration of VM memory over RDMA (QEMU RDMA migration protocol v1 compatible).\n\n\
                  `rdmamig doctor` says what is right and wrong with this host's RDMA setup for migration; \
                  `rdmamig bench` migrates a synthetic guest between two processes or hosts and reports \
                  throughput, rounds and the final round's time; `rdmamig fabric-plan` lists the InfiniBand \
                  SMPs that move a migrating VM's LID (vSwitch SR-IOV) and what they cost.",
    after_help = AFTER_HELP,
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    Doctor(DoctorArgs),
    Bench(BenchArgs),
    #[command(name = "fabric-plan")]
    FabricPlan(fabric::FabricPlanArgs),
    /// Write the man pages (rdmamig.1, rdmamig-doctor.1, rdmamig-bench.1, rdmamig-fabric-plan.1) into DIR.
    #[command(hide = true, name = "generate-man")]
    GenerateMan {
        /// The directory to write them to (created if missing).
        dir: PathBuf,
    },
}

/// Check this host's RDMA setup for live migration.
///
/// Lists each RDMA device and its ports (state, link layer, active MTU, GIDs
/// with their IPv4/IPv6 form and type), checks that rdma_cm can bind to and
/// resolve each device's address, compares RLIMIT_MEMLOCK and the cgroup
/// memory limit with what pin-all (the whole guest pinned on both sides) and
/// dynamic registration need for a guest of SIZE (with the exact `ulimit -l`
/// value and systemd `LimitMEMLOCK=` line to set), and reports the
/// fork-safety mode. Each item gets a verdict (ok, warn, fail) and, unless
/// ok, what to change. Run it as the user and in the service context (unit,
/// cgroup) the hypervisor runs in: the limits are this process's.
#[derive(Args, Debug)]
#[command(after_help = "Exit status: 0 no item failed (warnings allowed), 1 an item failed (no RDMA device, \
                        rdma_cm broken, memlock or cgroup too small), 2 usage error.")]
struct DoctorArgs {
    /// The guest's RAM size to check the memlock and cgroup limits against (e.g. 16G).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    guest_size: Option<u64>,
    /// Print one JSON object on stdout instead of the report.
    #[arg(long)]
    json: bool,
}

/// Migrate a synthetic guest over RDMA and measure it.
///
/// Run the destination first (`rdmamig bench --listen ADDR`), then the
/// source (`rdmamig bench ADDR`) with the same --size. The source fills a
/// guest of SIZE with random non-zero pages (from --seed) and migrates it in
/// rounds: round 1 sends every page; while it runs, a dirtier thread changes
/// random pages at --dirty-rate pages per second, and each later round sends
/// the pages changed meanwhile, until at most --final-pages are dirty or
/// --max-rounds is reached; then the "guest" stops and the final round sends
/// the rest. The source sends the SHA-256 of its final RAM through the
/// migration stream; the destination compares its own and reports whether
/// the memory arrived byte-identical. A live progress bar per round (on
/// stderr, when it is a terminal) shows bytes, Gbit/s and the dirty pages
/// waiting; the summary gives total time, rounds, bytes, Gbit/s, the final
/// round's time (the guest's downtime: from its stop to the end of the last
/// window, which costs a round trip even when no page is left), zero
/// chunks, registration round trips and the pinned peak (registrations at
/// their most, as RLIMIT_MEMLOCK counts them: memory registered twice counts
/// twice).
///
/// With --postcopy-after N the source runs exactly N rounds, then stops the
/// guest and switches to post-copy instead of a final round: the destination
/// pulls the stale pages itself with RDMA READs while --vcpus threads read
/// random guest pages (a progress bar shows the pages remaining); both
/// summaries add the post-copy pages, faults served, bytes pulled and time
/// (source: from the switch to the destination's last page, the
/// destination's switch-over included, in which it deregisters every
/// registration the source could write into; destination: from its vCPUs
/// running to its last page). The source's pinned peak then reaches up to
/// twice the guest: it registers the stale pages' regions for the
/// destination's reads while its pre-copy registrations of the same memory
/// are still held.
///
/// With --key-file on both sides each proves the pre-shared key to the other
/// before any guest memory is registered; both summaries say whether the
/// peer was authenticated. The library's warnings (a source refused, pinning
/// the kernel refused) go to stderr.
#[derive(Args, Debug)]
#[command(after_help = "Exit status: 0 the migration completed (destination: and the memory is byte-identical), \
                        1 it failed, 2 usage error.\n\n\
                        Example:\n  host-b$ rdmamig bench --listen 198.18.0.2 --size 4G\n  \
                        host-a$ rdmamig bench 198.18.0.2 --size 4G --dirty-rate 20000")]
struct BenchArgs {
    #[arg(long, value_name = "ADDR[:PORT]", conflicts_with_all = ["dest", "dirty_rate", "pin_all", "seed", "max_rounds", "final_pages", "postcopy_after"],
          help = format!("Destination: listen on ADDR[:PORT] (an IPv4/IPv6 address or host name of an RDMA device; \
                          IPv6 in brackets with a port; PORT {DEFAULT_PORT} when none is given, 0 picks a free \
                          one) and receive one migration"))]
    listen: Option<String>,
    #[arg(value_name = "ADDR[:PORT]", required_unless_present = "listen",
          help = format!("Source: the destination's ADDR[:PORT] to migrate to (PORT {DEFAULT_PORT} when none is given)"))]
    dest: Option<String>,
    /// The guest's RAM size; the same on both sides.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1G")]
    size: u64,
    /// Source: pages (4 KiB) the guest changes per second while the rounds run (0: none).
    #[arg(long, value_name = "PAGES_PER_S", default_value_t = 0)]
    dirty_rate: u64,
    /// Source: register the whole guest up front on both sides (QEMU's x-rdma-pin-all)
    /// instead of chunk by chunk; the destination allows it unless it has --qemu-compat
    /// or too small a memlock limit.
    #[arg(long)]
    pin_all: bool,
    /// Speak QEMU's protocol exactly: rdmamig's extensions off (no completion handshake,
    /// 32 KiB stream messages, no pin budget exchange).
    #[arg(long)]
    qemu_compat: bool,
    /// Source: the seed of the guest's contents and of the dirtier's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Source: the most rounds, the final one included.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(2..))]
    max_rounds: u32,
    /// Source: stop the guest for the final round once at most N pages are dirty.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    final_pages: u64,
    /// Source: switch to post-copy after N pre-copy rounds (round 1 sends every page; the
    /// dirtier runs through all N): the guest stops, the SHA-256 goes out as the device
    /// state, and the destination pulls the pages changed since they were sent with RDMA
    /// READs while its vCPU threads run (rdmamig destinations only). Replaces the final round.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..),
          conflicts_with_all = ["qemu_compat", "max_rounds", "final_pages"])]
    postcopy_after: Option<u32>,
    /// Destination: threads that read random guest pages as vCPUs would, from the moment
    /// post-copy runs until it is done (reads only: the SHA-256 compares the source's
    /// final memory). Used only when the source switches to post-copy.
    #[arg(long, value_name = "N", default_value_t = 4)]
    vcpus: u32,
    /// Post-copy recovery, set on both sides: when post-copy's connection is lost, the
    /// destination reconnects to the source for up to SECONDS (its vCPU threads wait
    /// meanwhile) and the pull goes on. Without it a lost connection fails post-copy.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..))]
    postcopy_recovery: Option<u32>,
    /// Both sides: authenticate the peer with the pre-shared key in FILE, the same file on
    /// both hosts. The key is the file's bytes as they are, 16 to 1024 of them (a final
    /// newline counts): random bytes, e.g. `head -c 32 /dev/urandom > bench.key`. The file
    /// must be accessible to its owner only (chmod 600): it is refused otherwise. A side
    /// with a key refuses a peer that does not prove the same key (a keyed destination goes
    /// on listening and says so on stderr). Needs rdmamig's extensions (not --qemu-compat).
    #[arg(long, value_name = "FILE", conflicts_with = "qemu_compat")]
    key_file: Option<PathBuf>,
    /// Print one JSON object on stdout instead of the progress bars and summary.
    #[arg(long)]
    json: bool,
}

/// A size: a number of bytes with an optional K/M/G/T suffix (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let num: u64 = num.parse().map_err(|_| format!("{s:?} is not a size (e.g. 4096, 512M, 16G)"))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => return Err(format!("unknown size suffix {other:?} (K, M, G, T)")),
    };
    num.checked_mul(1 << shift).filter(|&n| n > 0).ok_or_else(|| format!("{s:?}: size must be > 0 and fit 64 bits"))
}

/// Bytes for people: "1.5 GiB", "64 MiB".
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Bytes as `ulimit -l` takes them: KiB, rounded up.
fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024)
}

/// Writes the man pages of `cmd` and of each visible subcommand into `dir`.
fn generate_man(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let cmd = Cli::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    std::fs::write(dir.join("rdmamig.1"), page)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("rdmamig-{}", sub.get_name());
        let sub = sub.clone().name(name.clone()).version(rdmamig::VERSION);
        let mut page = Vec::new();
        clap_mangen::Man::new(sub).render(&mut page)?;
        std::fs::write(dir.join(format!("{name}.1")), page)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    // Output piped into `head` and the like: end quietly when the reader
    // goes away, as command-line tools do, instead of panicking in println!
    // (Rust ignores SIGPIPE by default).
    // SAFETY: at the start of main, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match cli.command {
        Command::Doctor(args) => doctor::run(args.guest_size, args.json),
        Command::Bench(args) => bench::run(args),
        Command::FabricPlan(args) => fabric::run(args),
        Command::GenerateMan { dir } => match generate_man(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rdmamig generate-man: {}: {e}", dir.display());
                ExitCode::from(EXIT_FAIL)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(100), "100 bytes");
        assert_eq!(kib(1), 1);
        assert_eq!(kib(1024), 1);
        assert_eq!(kib(1025), 2);
    }
}
