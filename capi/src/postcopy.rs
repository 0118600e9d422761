//! Post-copy over RDMA READ (rdmamig peers only): the source's switch-over
//! (`rdmamig_conn_postcopy`) and the destination's waits and progress
//! (`rdmamig_conn_wait_postcopy`, `rdmamig_conn_postcopy_progress`). The
//! logic is the engine's (`Source::postcopy`, `Destination::wait_postcopy`).

use super::args::{items, opt_out};
use super::conn::{rdmamig_conn, run};
use super::last_error::Failure;
use super::status::rdmamig_status;
use super::versioned::{self, VersionedBySize};
use super::wait::wait_of;
use rdmamig::{PostcopyPhase, PostcopyProgress, StalePages};
use std::ffi::c_int;
use std::mem::{offset_of, size_of};
use std::os::fd::BorrowedFd;

/// Where a destination's post-copy is (`rdmamig_postcopy_progress.phase`,
/// the `phase` of `rdmamig_conn_wait_postcopy`). The values are part of the
/// ABI and only ever added to; they are ordered: a later phase has a larger
/// value.
//
// The one list of the phases in the C API: the engine's `PostcopyPhase`
// converts to it with an exhaustive match (`phase_of`), and the C values
// come from it (cbindgen).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum rdmamig_postcopy_phase {
    /// No post-copy yet: the source's POSTCOPY request has not arrived.
    RDMAMIG_POSTCOPY_IDLE = 0,
    /// The stale pages are dropped and faults on them are served: the vCPUs
    /// may run (not before).
    RDMAMIG_POSTCOPY_RUNNING = 1,
    /// Every stale page is in place (POSTCOPY_DONE sent to the source).
    RDMAMIG_POSTCOPY_DONE = 2,
}

impl rdmamig_postcopy_phase {
    /// Every value, in numeric order.
    pub(crate) const ALL: [rdmamig_postcopy_phase; 3] = {
        use rdmamig_postcopy_phase::*;
        [RDMAMIG_POSTCOPY_IDLE, RDMAMIG_POSTCOPY_RUNNING, RDMAMIG_POSTCOPY_DONE]
    };

    /// The engine's phase for a C value (`None`: not a phase). A value from C
    /// goes through this (an out-of-range enum value is UB in Rust).
    fn engine(v: u32) -> Option<PostcopyPhase> {
        Self::ALL.iter().find(|p| **p as u32 == v).map(|p| match p {
            Self::RDMAMIG_POSTCOPY_IDLE => PostcopyPhase::Idle,
            Self::RDMAMIG_POSTCOPY_RUNNING => PostcopyPhase::Running,
            Self::RDMAMIG_POSTCOPY_DONE => PostcopyPhase::Done,
        })
    }
}

/// The C value of an engine phase.
fn phase_of(p: PostcopyPhase) -> rdmamig_postcopy_phase {
    match p {
        PostcopyPhase::Idle => rdmamig_postcopy_phase::RDMAMIG_POSTCOPY_IDLE,
        PostcopyPhase::Running => rdmamig_postcopy_phase::RDMAMIG_POSTCOPY_RUNNING,
        PostcopyPhase::Done => rdmamig_postcopy_phase::RDMAMIG_POSTCOPY_DONE,
    }
}

/// The stale pages of one RAM block, for `rdmamig_conn_postcopy`: bit
/// `i % 64` of `bitmap[i / 64]` set means 4 KiB page `i` of block `block`
/// is not right on the destination (dirtied since it was sent, or never
/// sent). `bitmap` holds `bitmap_words` words, at least
/// `(block length / 4096 + 63) / 64`; bits past the block's last page must be
/// clear. Zero the struct first: `reserved` must be 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdmamig_stale_pages {
    /// The RAM block's index in the registry.
    pub block: u32,
    /// Must be 0.
    pub reserved: u32,
    /// The block's stale bitmap (4 KiB pages); read during the call only.
    pub bitmap: *const u64,
    /// The number of 64-bit words at `bitmap`.
    pub bitmap_words: usize,
}

/// What the destination reports when post-copy is done
/// (`rdmamig_conn_postcopy`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdmamig_postcopy_summary {
    /// Stale pages installed (by faults or by the background pull).
    pub pages: u64,
    /// Faults served with an RDMA READ of their own.
    pub faults: u64,
    /// Bytes the destination read from the source.
    pub bytes: u64,
}

/// The size of the first version of `rdmamig_postcopy_progress` (every field
/// up to `bytes_pulled`), and the smallest `size` `rdmamig_conn_postcopy_progress`
/// and `rdmamig_conn_wait_postcopy` accept.
pub const RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1: u32 = 48;

/// A destination's post-copy progress, filled by
/// `rdmamig_conn_postcopy_progress` and `rdmamig_conn_wait_postcopy`.
///
/// As `rdmamig_stats`: zero it, set `size` to
/// `sizeof(rdmamig_postcopy_progress)`; the library fills the fields that fit
/// in `size` bytes and writes back the number of bytes it filled. The struct
/// only grows, with fields added at the end: version 1
/// (`RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1`) ends with `bytes_pulled`, version 2
/// (`RDMAMIG_POSTCOPY_PROGRESS_SIZE_V2`, since 0.10) adds `recoveries`.
//
// The counters are generated from the library's one list of them
// (`PostcopyProgress::FIELDS`, src/engine/postcopy/progress.rs), as
// `rdmamig_stats`' are (capi/src/generated.rs): the test
// `generated_postcopy_progress_counters` fails while they differ.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdmamig_postcopy_progress {
    /// In: `sizeof(rdmamig_postcopy_progress)` as the caller knows it (at
    /// least `RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1`). Out: the bytes filled.
    pub size: u32,
    /// An `rdmamig_postcopy_phase` value.
    pub phase: u32,
    // BEGIN generated from rdmamig::PostcopyProgress::FIELDS (make generate)
    /// Stale pages the source announced.
    pub pages_total: u64,
    /// Stale pages not installed yet.
    pub pages_remaining: u64,
    /// Faults served with an RDMA READ of their own.
    pub faults_served: u64,
    /// Stale pages found present when they were to be installed (a vCPU's
    /// fault, or another install, got there first): skipped, never overwritten.
    pub pages_skipped: u64,
    /// Bytes read from the source.
    pub bytes_pulled: u64,
    /// Lost connections post-copy got back (`Config::postcopy_recovery`,
    /// in C `rdmamig_config_set_postcopy_recovery_ms`).
    pub recoveries: u64,
    // END generated
}

/// The size of `rdmamig_postcopy_progress` up to `recoveries` (0.10).
pub const RDMAMIG_POSTCOPY_PROGRESS_SIZE_V2: u32 = 56;

const _: () = assert!(size_of::<rdmamig_postcopy_progress>() >= RDMAMIG_POSTCOPY_PROGRESS_SIZE_V2 as usize);
const _: () = assert!(offset_of!(rdmamig_postcopy_progress, pages_total) == 8);

// SAFETY: `size`, `phase` (`u32`), then only `u64` counters (the generated
// block; the test `generated_postcopy_progress_counters` checks they are
// `PostcopyProgress::FIELDS`).
unsafe impl VersionedBySize for rdmamig_postcopy_progress {
    const NAME: &'static str = "rdmamig_postcopy_progress";
    const SIZE_V1: (u32, &'static str) = (RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1, "RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1");
}

/// Source: switches the migration to post-copy (rdmamig destinations only)
/// and returns once the destination holds every page.
///
/// Call it after the last iteration window (`rdmamig_conn_iteration_end`)
/// and the device state (`rdmamig_conn_put`), with the guest stopped:
/// `blocks` (`n_blocks` entries, each block at most once; blocks not listed
/// have no stale page) says which pages the destination does not have
/// right. The call sends the stream bytes put so far, registers the 2 MiB
/// windows that hold stale pages for remote read (within the pin budget, see
/// `rdmamig_config_set_pin_budget`), tells the destination, which pulls the
/// pages itself with RDMA READs while its guest runs, and waits for its
/// "done". Until the call returns the guest's memory must stay mapped and
/// unchanged; then `rdmamig_conn_close` as usual (iteration windows are
/// refused from the call on: the guest runs on the destination). The bitmaps are copied
/// before the call starts: they may be reused when it returns.
///
/// Runs on the caller's thread, which blocks until the destination has
/// every page (no time limit while the destination is alive: the liveness
/// check ends it if the destination goes away); the library's transfer
/// thread does the work, and the source's CPU serves no page.
/// `rdmamig_conn_abort` from another thread ends it.
///
/// `*out` (may be NULL) gets the destination's summary on `RDMAMIG_OK`.
/// Returns `RDMAMIG_ERR_NULL_PARAMETER` (`blocks` NULL with `n_blocks > 0`, a
/// NULL `bitmap` with `bitmap_words > 0`); `RDMAMIG_ERR_INVALID_ARGUMENT`
/// (an unknown block, a block listed twice, a bitmap too short or with bits
/// past the block's end, a non-zero `reserved`, a block whose length is not
/// a multiple of 4 KiB, more than 4096 blocks); `RDMAMIG_ERR_STATE` (a
/// destination, a QEMU destination (no extensions), inside an iteration
/// window, before the first window, post-copy called before);
/// `RDMAMIG_ERR_PIN_BUDGET`; or the
/// connection's error (then the destination's guest is lost: see
/// docs/postcopy.md).
///
/// Thread safety: needs exclusive use of `conn` (but `rdmamig_conn_abort`,
/// `rdmamig_conn_get_stats` and the other `const` calls may run meanwhile).
#[no_mangle]
pub extern "C" fn rdmamig_conn_postcopy(
    conn: *mut rdmamig_conn,
    blocks: *const rdmamig_stale_pages,
    n_blocks: usize,
    out: *mut rdmamig_postcopy_summary,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_postcopy";
        run(conn, F, |c| {
            let blocks = items(blocks, n_blocks, F, "blocks")?;
            let mut stale = Vec::with_capacity(blocks.len());
            for (i, b) in blocks.iter().enumerate() {
                if b.reserved != 0 {
                    return Err(Failure::invalid(format!("{F}: blocks[{i}].reserved is not 0")));
                }
                let bitmap = items(b.bitmap, b.bitmap_words, F, &format!("blocks[{i}].bitmap"))?;
                stale.push(StalePages { block: b.block, bitmap: bitmap.to_vec() });
            }
            let summary = c.as_source(F)?.postcopy(&stale)?;
            if let Some(o) = opt_out(out) {
                *o = rdmamig_postcopy_summary { pages: summary.pages, faults: summary.faults, bytes: summary.bytes };
            }
            Ok(())
        })
    }
}

/// Destination: waits (at most `timeout_ms` milliseconds;
/// `RDMAMIG_WAIT_FOREVER` (0) waits for ever, `RDMAMIG_NO_WAIT` not at all)
/// until post-copy has reached `phase` (an `rdmamig_postcopy_phase` value)
/// and fills `*out` (may be NULL; as `rdmamig_conn_postcopy_progress`) with
/// the progress then.
///
/// `RDMAMIG_POSTCOPY_RUNNING`: the source's request arrived, the library
/// registered the guest RAM blocks with stale pages with a userfaultfd of
/// its own (missing mode; or checked the hypervisor's covers them, see
/// `rdmamig_conn_postcopy_userfaultfd`) and dropped the stale pages; start
/// the vCPUs then, not before. From then on the library's thread of the
/// connection serves the vCPUs' faults (an RDMA READ of the page, installed
/// with `UFFDIO_COPY`, which wakes the faulting thread; with the
/// hypervisor's userfaultfd, the faults it forwards) and pulls the rest in
/// the background; a page a vCPU wrote is never overwritten.
/// `RDMAMIG_POSTCOPY_DONE`: every stale page is in place.
///
/// Blocks the calling thread (any thread) on the connection's state; the
/// phases do not make `rdmamig_conn_event_fd` readable (its failure does):
/// an event loop polls with `RDMAMIG_NO_WAIT` or waits in a thread of its own.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_TIMEOUT` when the wait ran out,
/// `RDMAMIG_ERR_WOULD_BLOCK` with `RDMAMIG_NO_WAIT` when the phase is not
/// reached yet; `RDMAMIG_ERR_INVALID_ARGUMENT` for an unknown `phase` or an
/// `out->size` below `RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1`; `RDMAMIG_ERR_STATE`
/// on a source, or when the connection ended without post-copy; or the
/// connection's error. A failure during post-copy (the source lost, the
/// liveness check) loses the guest: the library stops, never installs a page
/// it did not read, and right after the error is visible it makes the guest
/// RAM blocks with missing pages inaccessible (`PROT_NONE`), so a vCPU
/// blocked on a missing page, or one touching guest RAM later, gets SIGSEGV
/// at that address (under KVM, `KVM_RUN` fails with `EFAULT`) instead of
/// blocking for ever; pages already present keep their content. The release
/// is complete once `rdmamig_conn_close` returns. Stop the vCPUs. With
/// `rdmamig_config_set_postcopy_keep_blocked` nothing is released: threads
/// on a missing page stay blocked (see there).
///
/// Thread safety: may run concurrently with other `const` uses of `conn`,
/// from any thread.
#[no_mangle]
pub extern "C" fn rdmamig_conn_wait_postcopy(
    conn: *const rdmamig_conn,
    phase: u32,
    timeout_ms: u32,
    out: *mut rdmamig_postcopy_progress,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_wait_postcopy";
        run(conn, F, |c| {
            let size = out_size(out, F)?;
            let Some(phase) = rdmamig_postcopy_phase::engine(phase) else {
                return Err(Failure::invalid(format!("{F}: unknown phase {phase}")));
            };
            let progress = c.as_destination(F)?.wait_postcopy(phase, wait_of(timeout_ms))?;
            if let Some(size) = size {
                // SAFETY: `out_size` checked `out` is non-NULL with at least `size` bytes.
                unsafe { fill(out, size, &progress) };
            }
            Ok(())
        })
    }
}

/// Destination, while post-copy runs: reads the stale pages among the `len`
/// bytes at `offset` of block `block` (the index in the `rdmamig_ram`
/// this side accepted with) from the source now, as the library's own
/// fault handling would, and returns once none of them is missing. For
/// faults the library does not see: a second process that maps the same
/// shared guest memory (a vhost-user backend) and whose userfaultfd the
/// hypervisor reads; once this returns, wake the backend's thread there
/// (`UFFDIO_WAKE`). Pages that are not stale are left as they are (a
/// missing one is zero: place it yourself, `UFFDIO_ZEROPAGE`). With the
/// hypervisor's userfaultfd (`rdmamig_conn_postcopy_userfaultfd`), the
/// faults read from it: then every page of the range is placed through it,
/// stale or not, and the threads waiting on them are woken.
///
/// `timeout_ms` as in `rdmamig_conn_wait_postcopy`; with `RDMAMIG_NO_WAIT`
/// the call only asks (a prefetch): `RDMAMIG_ERR_WOULD_BLOCK`, and the pages
/// come all the same.
///
/// Returns `RDMAMIG_OK` (also at once when post-copy is done);
/// `RDMAMIG_ERR_TIMEOUT`; `RDMAMIG_ERR_WOULD_BLOCK`;
/// `RDMAMIG_ERR_INVALID_ARGUMENT` for an unknown block or a range past its
/// end; `RDMAMIG_ERR_STATE` on a source or before post-copy runs; or the
/// connection's error (see `rdmamig_conn_wait_postcopy` for what a failure
/// during post-copy means).
///
/// Thread safety: may run concurrently with other `const` uses of `conn`,
/// from any thread (several at once).
#[no_mangle]
pub extern "C" fn rdmamig_conn_postcopy_fetch(
    conn: *const rdmamig_conn,
    block: u32,
    offset: u64,
    len: u64,
    timeout_ms: u32,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_postcopy_fetch";
        run(conn, F, |c| Ok(c.as_destination(F)?.postcopy_fetch(block, offset, len, wait_of(timeout_ms))?))
    }
}

/// Destination, with `rdmamig_config_set_postcopy_hypervisor_userfaultfd`:
/// hands over the hypervisor's userfaultfd `uffd` for post-copy. The library
/// keeps a duplicate until post-copy ends (the hypervisor keeps `uffd` and
/// closes it when it likes), installs pages through it and never reads it.
/// Call it before post-copy runs (the library waits for it once the
/// source's request came), with every guest RAM block registered with
/// `uffd` in missing mode (`UFFDIO_REGISTER_MODE_MISSING`, its `UFFDIO_API`
/// handshake done): before it drops a stale page the library checks that
/// each block is, and post-copy fails (`RDMAMIG_ERR_INVALID_ARGUMENT`)
/// otherwise.
///
/// `addrs` (`n_addrs` entries, one per block of the `rdmamig_ram` this side
/// accepted with, by index): where each block lies in the address space of
/// the process that registered `uffd`, when that is not this one (a
/// migration process that received the VMM's guest memory and userfaultfd
/// over a UNIX socket: the faults it reads are at the VMM's addresses, and
/// the library installs there); NULL and 0: at the blocks' host addresses
/// here.
///
/// From `RDMAMIG_POSTCOPY_RUNNING` on, forward every fault read from `uffd`
/// with `rdmamig_conn_postcopy_fetch` (the block and offset of its address);
/// it then places every page of its range, stale or not (a missing page
/// that is not stale becomes a zero page), and wakes the threads waiting on
/// them. When post-copy fails, the library makes the blocks `PROT_NONE` in
/// this process and wakes the threads waiting on them; a VMM in another
/// process stops its vCPUs itself (the fetches fail with the connection's
/// error).
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER` (`addrs` NULL with
/// `n_addrs > 0`); `RDMAMIG_ERR_INVALID_ARGUMENT` (`uffd` no userfaultfd,
/// `n_addrs` not 0 nor the number of blocks, an address not 4 KiB-aligned);
/// `RDMAMIG_ERR_STATE` (a source, a destination without the setting, after
/// post-copy started or a second time).
///
/// Thread safety: may run concurrently with other `const` uses of `conn`,
/// from any thread.
#[no_mangle]
pub extern "C" fn rdmamig_conn_postcopy_userfaultfd(
    conn: *const rdmamig_conn,
    uffd: c_int,
    addrs: *const u64,
    n_addrs: usize,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_postcopy_userfaultfd";
        run(conn, F, |c| {
            let addrs = items(addrs, n_addrs, F, "addrs")?;
            if uffd < 0 {
                return Err(Failure::invalid(format!("{F}: uffd {uffd} is no descriptor")));
            }
            // SAFETY: the caller passes an open descriptor, which stays open
            // for the call (the library keeps a duplicate of its own).
            let uffd = unsafe { BorrowedFd::borrow_raw(uffd) };
            let at = (!addrs.is_empty()).then_some(addrs);
            Ok(c.as_destination(F)?.postcopy_userfaultfd(uffd, at)?)
        })
    }
}

/// Destination: fills `*out` with post-copy's progress now (see
/// `rdmamig_postcopy_progress`: zero it and set `out->size` first): phase,
/// stale pages left, faults served, bytes read from the source. Never
/// blocks; may be called from any thread at any time (a monitoring thread,
/// a progress display), also before post-copy (`RDMAMIG_POSTCOPY_IDLE`) and
/// after it failed (the counters as they stopped).
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER`;
/// `RDMAMIG_ERR_INVALID_ARGUMENT` for an `out->size` below
/// `RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1` (nothing written); `RDMAMIG_ERR_STATE`
/// on a source or after `rdmamig_conn_close`.
///
/// Thread safety: may run concurrently with other `const` uses of `conn`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_postcopy_progress(
    conn: *const rdmamig_conn,
    out: *mut rdmamig_postcopy_progress,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_postcopy_progress";
        run(conn, F, |c| {
            let size = out_size(out, F)?.ok_or_else(|| Failure::null(F, "out"))?;
            let progress = c.as_destination(F)?.postcopy_progress();
            // SAFETY: `out_size` checked `out` is non-NULL with at least `size` bytes.
            unsafe { fill(out, size, &progress) };
            Ok(())
        })
    }
}

/// `out->size` (`None` for a NULL `out`), checked to be at least version 1's.
fn out_size(out: *mut rdmamig_postcopy_progress, func: &str) -> Result<Option<u32>, Failure> {
    versioned::caller_size(out, func)
}

/// Writes the fields of `p` that end within `size` bytes of `out`, then
/// `out->size` = the bytes filled.
///
/// # Safety
/// `out` must point to at least `size` writable bytes, `size >= 8`.
unsafe fn fill(out: *mut rdmamig_postcopy_progress, size: u32, p: &PostcopyProgress) {
    let mut full = rdmamig_postcopy_progress {
        size: size_of::<rdmamig_postcopy_progress>() as u32,
        phase: phase_of(p.phase) as u32,
        ..Default::default()
    };
    versioned::set_counters(&mut full, &p.values());
    // SAFETY: as this function's contract.
    unsafe { versioned::fill(out, size, &full) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::rdmamig_conn_free;
    use crate::connection::Connection;
    use crate::generated::{check_or_rewrite, doc_comment};
    use crate::handle::to_boxed_mut_ptr;
    use rdmamig_status::*;
    use std::ptr::{null, null_mut};

    #[test]
    fn phases_are_dense_ordered_and_map_to_the_engine() {
        for (i, p) in rdmamig_postcopy_phase::ALL.iter().enumerate() {
            assert_eq!(*p as u32, i as u32, "{p:?}");
            let engine = rdmamig_postcopy_phase::engine(i as u32).unwrap();
            assert_eq!(phase_of(engine), *p);
        }
        assert!(rdmamig_postcopy_phase::engine(3).is_none());
        assert!(rdmamig_postcopy_phase::engine(u32::MAX).is_none());
    }

    /// The checked-in header has the same phases (it is generated: `make header`).
    #[test]
    fn phase_values_match_header() {
        let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/rdmamig.h")).unwrap();
        let in_header: Vec<(String, u32)> = header
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("RDMAMIG_POSTCOPY_") && !l.starts_with("RDMAMIG_POSTCOPY_LINK_"))
            .map(|l| {
                let (name, value) = l.trim_end_matches(',').split_once(" = ").expect("NAME = value");
                (name.to_string(), value.parse().expect("number"))
            })
            .collect();
        let in_rust: Vec<(String, u32)> =
            rdmamig_postcopy_phase::ALL.iter().map(|p| (format!("{p:?}"), *p as u32)).collect();
        assert_eq!(in_header, in_rust);
    }

    /// The counters between the markers are `PostcopyProgress::FIELDS`, each
    /// with its doc; `RDMAMIG_REGENERATE=1` rewrites them (`make generate`).
    #[test]
    fn generated_postcopy_progress_counters() {
        let fields: String = PostcopyProgress::FIELDS
            .iter()
            .map(|f| format!("{}    pub {}: u64,\n", doc_comment("    ", f.doc), f.name))
            .collect();
        check_or_rewrite("postcopy.rs", "rdmamig::PostcopyProgress::FIELDS", &fields);
    }

    #[test]
    fn argument_checks() {
        let conn = to_boxed_mut_ptr::<rdmamig_conn>(Connection::closed());
        let mut p = rdmamig_postcopy_progress { size: RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1, ..Default::default() };
        assert_eq!(rdmamig_conn_postcopy_progress(null(), &mut p), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_postcopy_progress(conn, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_postcopy_progress(conn, &mut p), RDMAMIG_ERR_STATE);
        p.size = 8;
        assert_eq!(rdmamig_conn_postcopy_progress(conn, &mut p), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_conn_wait_postcopy(conn, 1, 1, &mut p), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(p, rdmamig_postcopy_progress { size: 8, ..Default::default() }, "nothing written");
        assert_eq!(rdmamig_conn_wait_postcopy(conn, 3, 1, null_mut()), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_conn_wait_postcopy(conn, 1, 1, null_mut()), RDMAMIG_ERR_STATE);
        assert_eq!(rdmamig_conn_wait_postcopy(null(), 1, 1, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);

        assert_eq!(rdmamig_conn_postcopy(null_mut(), null(), 0, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_postcopy(conn, null(), 1, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        let mut b = rdmamig_stale_pages { block: 0, reserved: 0, bitmap: null(), bitmap_words: 1 };
        assert_eq!(rdmamig_conn_postcopy(conn, &b, 1, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        let word = 1u64;
        b.bitmap = &word;
        b.reserved = 1;
        assert_eq!(rdmamig_conn_postcopy(conn, &b, 1, null_mut()), RDMAMIG_ERR_INVALID_ARGUMENT);
        b.reserved = 0;
        assert_eq!(rdmamig_conn_postcopy(conn, &b, 1, null_mut()), RDMAMIG_ERR_STATE);
        assert_eq!(rdmamig_conn_postcopy(conn, null(), 0, null_mut()), RDMAMIG_ERR_STATE);
        rdmamig_conn_free(conn);
    }

    #[test]
    // The update: a counter added to the library's list must not stop this
    // crate compiling before `make generate` (capi/src/generated.rs).
    #[allow(clippy::needless_update)]
    fn fill_writes_what_fits() {
        let progress = PostcopyProgress {
            phase: PostcopyPhase::Running,
            pages_total: 10,
            pages_remaining: 4,
            faults_served: 3,
            pages_skipped: 1,
            bytes_pulled: 24576,
            recoveries: 2,
            ..Default::default()
        };
        const JUNK: u64 = 0x5555_5555_5555_5555;
        let mut buf = [JUNK; 8];
        let out = buf.as_mut_ptr().cast::<rdmamig_postcopy_progress>();
        // An older caller's smaller struct (as if V1 ended at pages_remaining): nothing past it is written.
        // SAFETY: `buf` holds 64 bytes.
        unsafe { fill(out, 24, &progress) };
        assert_eq!(buf[0] as u32, 24);
        assert_eq!(buf[0] >> 32, rdmamig_postcopy_phase::RDMAMIG_POSTCOPY_RUNNING as u64);
        assert_eq!((buf[1], buf[2]), (10, 4));
        assert_eq!(&buf[3..], &[JUNK; 5]);
        // A 0.9 caller's struct: no `recoveries`.
        buf = [JUNK; 8];
        // SAFETY: `buf` holds 64 bytes.
        unsafe { fill(out, RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1, &progress) };
        assert_eq!(buf[0] as u32, RDMAMIG_POSTCOPY_PROGRESS_SIZE_V1);
        assert_eq!(&buf[1..6], &[10, 4, 3, 1, 24576]);
        assert_eq!(buf[6..], [JUNK; 2]);
        // A newer caller's bigger struct: its tail is left alone.
        // SAFETY: `buf` holds 64 bytes.
        unsafe { fill(out, 64, &progress) };
        assert_eq!(buf[0] as u32, RDMAMIG_POSTCOPY_PROGRESS_SIZE_V2);
        assert_eq!(&buf[1..7], &[10, 4, 3, 1, 24576, 2]);
        assert_eq!(buf[7], JUNK);
    }
}
