//! `rdmamig_stats`: a connection's counters, in a struct that can grow.

use std::mem::{offset_of, size_of};

use super::conn::{rdmamig_conn, run};
use super::last_error::Failure;
use super::status::rdmamig_status;
use super::versioned::{self, VersionedBySize};
use rdmamig::Stats;

/// The size of the first version of `rdmamig_stats` (every field up to
/// `stream_bytes`), and the smallest `size` `rdmamig_conn_get_stats` accepts.
pub const RDMAMIG_STATS_SIZE_V1: u32 = 88;

/// A snapshot of a connection's counters, filled by `rdmamig_conn_get_stats`.
///
/// Zero it first (`rdmamig_stats st = {0};` or `memset`), then set `size` to
/// `sizeof(rdmamig_stats)`: the library fills the fields that fit in `size`
/// bytes and writes back the number of bytes it filled, so a program built
/// against an older or newer header works with any library. The struct only
/// grows, with fields added at the end: version 1 (`RDMAMIG_STATS_SIZE_V1`)
/// ends with `stream_bytes`, version 2 (`RDMAMIG_STATS_SIZE_V2`) adds
/// `pin_budget` to `staged_bytes`. Fields the library does not know are left
/// untouched.
//
// The counters are generated from the library's one list of them
// (`Stats::FIELDS`, src/engine/stats.rs): add a counter there, then
// `make generate` rewrites the lines between the markers below and the
// header. (cbindgen reads this plain struct for the header: it cannot expand
// macros on stable Rust; capi/src/generated.rs.) The test
// `generated_stats_counters` fails while they differ.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdmamig_stats {
    /// In: `sizeof(rdmamig_stats)` as the caller knows it (at least
    /// `RDMAMIG_STATS_SIZE_V1`). Out: the bytes filled.
    pub size: u32,
    /// Reserved (where the first counter's alignment leaves 4 bytes): zero
    /// it. The library sets it to 0.
    pub reserved: u32,
    // BEGIN generated from rdmamig::Stats::FIELDS (make generate)
    /// Bytes of guest RAM written with RDMA WRITE (source).
    pub bytes_written: u64,
    /// 1 MiB chunks registered for remote access: asked for (source) or
    /// served (destination).
    pub chunks_registered: u64,
    /// All-zero ranges sent (source) or applied (destination) as COMPRESS
    /// messages instead of being written.
    pub zero_chunks: u64,
    /// REGISTER_REQUEST/RESULT round trips (one per message, however many
    /// chunks it carries); with pin-all, the RAM-blocks exchange, which
    /// registers every block.
    pub registration_round_trips: u64,
    /// Bytes this side has registered (pinned) now, under its pin budget:
    /// guest memory, and its own staging and post-copy buffers.
    pub pinned_bytes: u64,
    /// The most bytes this side had registered at once (as `pinned_bytes`).
    pub pinned_bytes_peak: u64,
    /// Control messages sent and received, READY included.
    pub control_messages: u64,
    /// Completed iteration windows (REGISTER_FINISHED sent or received).
    pub iterations: u64,
    /// Total time spent inside `iteration_end` (`rdmamig_conn_iteration_end`),
    /// in nanoseconds (source).
    pub iteration_end_ns: u64,
    /// Device-state stream bytes sent (source) or received (destination).
    pub stream_bytes: u64,
    /// The pin budget this side keeps `pinned_bytes` under (the largest
    /// value, `UINT64_MAX`: unlimited; see `rdmamig_config_set_pin_budget`).
    pub pin_budget: u64,
    /// The memory limit of this process's cgroup (the largest value,
    /// `UINT64_MAX`: none or unknown).
    pub cgroup_memory_limit: u64,
    /// Registrations dropped to stay under a pin budget (source: chunks
    /// unpinned here, with the destination's registration when the peer is
    /// rdmamig; destination: registrations the source unregistered).
    pub unpins: u64,
    /// Of those, registrations of ranges hinted cold (`RDMAMIG_HINT_COLD`).
    pub unpins_cold: u64,
    /// Registrations retried after the kernel refused them (ENOMEM, EPERM).
    pub registration_retries: u64,
    /// Time spent waiting for released memory to be deregistered before a
    /// registration fit the budget, in nanoseconds.
    pub pin_wait_ns: u64,
    /// Registrations queued for the unregistration worker and not yet deregistered.
    pub unregister_queue_depth: u64,
    /// How registered memory survives `fork()`: 0 the kernel copies pinned
    /// pages for the child (Linux >= 5.13), 1 rdma-core's fork support is on
    /// (`ibv_fork_init`), 2 neither: a forked child that shares registered
    /// pages can make transfers read stale memory.
    pub fork_mode: u64,
    /// Pin-all: bytes of guest RAM pre-faulted or registered so far.
    pub pin_all_progress_bytes: u64,
    /// Source: bytes written through the staging buffer, from chunks not
    /// pinned because pinning would allocate or copy their pages (never
    /// touched, the shared zero page, shared by KSM or with a forked child).
    pub staged_bytes: u64,
    // END generated
}

/// The size of the second version of `rdmamig_stats` (every field up to
/// `staged_bytes`).
pub const RDMAMIG_STATS_SIZE_V2: u32 = 168;

const _: () = assert!(size_of::<rdmamig_stats>() >= RDMAMIG_STATS_SIZE_V2 as usize);
const _: () = assert!(offset_of!(rdmamig_stats, bytes_written) == 8);

// SAFETY: `size`, `reserved`, then only `u64` counters (the generated
// block; the test `generated_stats_counters` checks they are `Stats::FIELDS`).
unsafe impl VersionedBySize for rdmamig_stats {
    const NAME: &'static str = "rdmamig_stats";
    const SIZE_V1: (u32, &'static str) = (RDMAMIG_STATS_SIZE_V1, "RDMAMIG_STATS_SIZE_V1");
}

/// Fills `out` with the connection's counters (see `rdmamig_stats`): zero
/// `*out` and set `out->size = sizeof(rdmamig_stats)` first. On `RDMAMIG_OK` the fields that
/// fit in `out->size` bytes are filled and `out->size` is set to the bytes
/// filled. A `size` below `RDMAMIG_STATS_SIZE_V1` gives
/// `RDMAMIG_ERR_INVALID_ARGUMENT` and writes nothing; a closed connection
/// gives `RDMAMIG_ERR_STATE` (read the counters before `rdmamig_conn_close`).
///
/// Thread safety: may run concurrently with other `const` uses of `conn`
/// (e.g. from a monitoring thread while `rdmamig_conn_save` runs).
#[no_mangle]
pub extern "C" fn rdmamig_conn_get_stats(conn: *const rdmamig_conn, out: *mut rdmamig_stats) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_get_stats";
        run(conn, F, |c| {
            let size = versioned::caller_size(out, F)?.ok_or_else(|| Failure::null(F, "out"))?;
            let stats = c.stats(F)?;
            // SAFETY: the caller's struct has at least `size` bytes.
            unsafe { fill(out, size, &stats) };
            Ok(())
        })
    }
}

/// Writes the counters of `s` that end within `size` bytes of `out`, then
/// `out->size` = the bytes filled.
///
/// # Safety
/// `out` must point to at least `size` writable bytes, `size >= 8`.
unsafe fn fill(out: *mut rdmamig_stats, size: u32, s: &Stats) {
    let mut full = rdmamig_stats { size: size_of::<rdmamig_stats>() as u32, ..Default::default() };
    versioned::set_counters(&mut full, &s.values());
    // SAFETY: as this function's contract.
    unsafe { versioned::fill(out, size, &full) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::Connection;
    use crate::generated::{check_or_rewrite, doc_comment};
    use crate::handle::to_boxed_mut_ptr;
    use rdmamig_status::*;

    #[test]
    fn size_checks() {
        let conn = to_boxed_mut_ptr::<rdmamig_conn>(Connection::closed());
        let mut s = rdmamig_stats { size: RDMAMIG_STATS_SIZE_V1 - 8, ..Default::default() };
        assert_eq!(rdmamig_conn_get_stats(conn, &mut s), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(s.size, RDMAMIG_STATS_SIZE_V1 - 8, "nothing written");
        s.size = RDMAMIG_STATS_SIZE_V1;
        assert_eq!(rdmamig_conn_get_stats(conn, &mut s), RDMAMIG_ERR_STATE);
        assert_eq!(rdmamig_conn_get_stats(conn, std::ptr::null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_get_stats(std::ptr::null(), &mut s), RDMAMIG_ERR_NULL_PARAMETER);
        crate::conn::rdmamig_conn_free(conn);
    }

    /// The counters between the markers are `Stats::FIELDS`, each with its
    /// doc; `RDMAMIG_REGENERATE=1` rewrites them (`make generate`).
    #[test]
    fn generated_stats_counters() {
        let fields: String =
            Stats::FIELDS.iter().map(|f| format!("{}    pub {}: u64,\n", doc_comment("    ", f.doc), f.name)).collect();
        check_or_rewrite("stats.rs", "rdmamig::Stats::FIELDS", &fields);
    }

    #[test]
    fn fill_writes_what_fits() {
        let stats = Stats { bytes_written: 1, stream_bytes: 10, fork_mode: 2, ..Default::default() };
        // A caller built against the first header: nothing past its struct is written.
        const JUNK: u64 = 0x5555_5555_5555_5555;
        let mut buf = [JUNK; 23];
        let out = buf.as_mut_ptr().cast::<rdmamig_stats>();
        // SAFETY: `buf` holds 184 bytes.
        unsafe { fill(out, RDMAMIG_STATS_SIZE_V1, &stats) };
        assert_eq!(buf[0] as u32, RDMAMIG_STATS_SIZE_V1);
        assert_eq!(buf[0] >> 32, 0, "reserved is set to 0");
        assert_eq!((buf[1], buf[10]), (1, 10));
        assert_eq!(&buf[11..], &[JUNK; 12]);
        // A caller with a newer, bigger struct: the tail is left alone.
        // SAFETY: `buf` holds 184 bytes.
        unsafe { fill(out, 184, &stats) };
        // SAFETY: `fill` wrote the struct.
        let got = unsafe { *out };
        assert_eq!(
            got,
            rdmamig_stats {
                size: RDMAMIG_STATS_SIZE_V2,
                bytes_written: 1,
                stream_bytes: 10,
                fork_mode: 2,
                ..Default::default()
            }
        );
        assert_eq!(buf[22], JUNK);
    }
}
