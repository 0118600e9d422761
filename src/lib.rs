//! rdmamig: live migration of a VM's RAM and device state over RDMA, speaking
//! QEMU's RDMA migration protocol version 1 on the wire.
//!
//! Layers, each with one job:
//! - `wire`: the protocol codec (pure, no I/O, fuzzed);
//! - `verbs`: thin RAII over libibverbs/librdmacm, the only place with raw verbs `unsafe`;
//! - `host`: this host's kernel and memory (pagemap, zero scans, userfaultfd,
//!   eventfds, memlock limits);
//! - [`engine`]: source/destination state machines, control channel, RAM chunks;
//! - [`doctor`]: whether this host can migrate over RDMA: its findings, each with a verdict;
//! - the C ABI is its own crate (capi/, `librdmamig.so.0`), over this one;
//! - [`fabric`]: the InfiniBand vSwitch reconfiguration planner (pure, beside `wire`):
//!   which LFT SMPs move a migrating VM's LID, and what they cost.
//!
//! The Rust API: a destination binds a [`Listener`] and [`Destination::accept`]s
//! a source; a source calls [`Source::connect`]. Both describe their guest RAM
//! in a [`RamBlocks`] registry. The source sends RAM in iteration windows
//! (`iteration_begin`, `save`..., `iteration_end`) and device state with
//! `put`/`flush`; the destination reads it with `get` and learns of finished
//! windows with `wait_iteration`. `Source::close` and `Destination::wait_end`
//! say how the migration ended ([`Ending`]): completed (both sides agree),
//! unverified (a QEMU peer, which has no completion handshake), or failed.
//!
//! Event loops poll a connection's `event_fd` (level-triggered) and call
//! `get`/`wait_iteration`/`wait_end` with `Some(Duration::ZERO)`, which never
//! waits ([`ErrorKind::WouldBlock`]). The library is silent unless a log hook
//! is installed ([`set_log_hook`]).

// unsafe is for the foreign interfaces (verbs, host memory), each block with
// its argument.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod bitmap;
/// The README's Rust example, compiled and run (it only defines functions)
/// by `cargo test` so that it stays true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod fabric;
mod host;
pub(crate) mod logging;
pub mod recording;
// The codec and the verbs layer are the library's own; the `internals`
// feature opens them (and nothing else changes) for the fuzz targets, the
// golden and layout tests and the RDMA suite's crafted peers.
#[cfg(feature = "internals")]
pub mod verbs;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod verbs;
#[cfg(feature = "internals")]
pub mod wire;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unused_imports)]
mod wire;

pub use engine::{
    AuthKey, Config, Destination, Ending, Event, Hint, Listener, Negotiated, Observer, RamBlock, RamBlocks, Read,
    SaveRange, Source, SourcePrefix, Stats, Unregistration,
};
pub use engine::{PostcopyLink, PostcopyPhase, PostcopyProgress, PostcopySummary, StalePages};
pub use error::{Error, ErrorKind, Result};
pub use logging::{set_log_hook, Level as LogLevel, LogHook};

/// What the fuzz targets (`fuzz/`) drive directly, without a connection.
/// Not part of the API: only built with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::engine::destination::dispatch::{Dispatcher, Registrar, Reply, Step};
    pub use crate::engine::destination::postcopy::plan::PlanBlock;
    pub use crate::host::GuestRange;
}

/// What the benchmarks drive directly, without a connection: for the host
/// ones (`examples/save_path.rs`, `examples/native_bench.rs`; the
/// `bench-internals` feature) the source's queueing front end, both sides'
/// CPU path for saved RAM, and each zero scan; for the registration
/// benchmark on an RDMA device (`examples/registration_bench.rs`; the
/// `rdma-tests` feature) pin-all. Not part of the API.
#[cfg(any(feature = "bench-internals", feature = "rdma-tests"))]
#[doc(hidden)]
pub mod bench_internals {
    #[cfg(feature = "rdma-tests")]
    pub use crate::engine::pin::pin_all_blocks;
    #[cfg(feature = "bench-internals")]
    pub use crate::engine::source::cpu_path::{CpuPath, Posted};
    #[cfg(feature = "bench-internals")]
    pub use crate::engine::source::front::Front;
    #[cfg(feature = "bench-internals")]
    pub use crate::host::zero::{supported as zero_scans, Scan, Variant};
}

/// Failure injection for the RDMA test suite (`tests/rdma`). Not part of
/// the API: only built with the `rdma-tests` feature.
#[cfg(feature = "rdma-tests")]
#[doc(hidden)]
pub mod test_hooks {
    pub use crate::engine::destination::postcopy::SEVER_AFTER_PAGES;
    pub use crate::engine::destination::SEVER_AFTER_WINDOWS;
    pub use crate::engine::link::LAST_RECOVERY_REQUEST;
    pub use crate::engine::source::postcopy::{DEAF_TO_RECOVERY, RECOVERY_OFFER};
}

/// What the C ABI's unit tests (capi/) build their cases from. Not part of
/// the API: only built with the `test-support` feature.
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub mod test_support {
    /// A source with no peer and no transfer thread.
    pub fn detached_source() -> crate::Source {
        crate::Source::detached()
    }

    /// Logs `message` at `level` as the library does (to the installed hook).
    pub fn log(level: crate::LogLevel, message: std::fmt::Arguments<'_>) {
        crate::logging::log(level, message);
    }
}

/// The library version, as in Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
