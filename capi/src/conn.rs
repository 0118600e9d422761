//! `rdmamig_conn`: one migration connection, either role; `rdmamig_connect`.
//! The role logic (which call fits which role, closing, the last failed
//! call's message) is the engine's `Connection`; here are only the argument
//! checks, the panic boundary and the mapping to `rdmamig_status`.

use std::os::raw::{c_char, c_void};

use super::args::{bytes, bytes_mut, handle, items, opt_out, out_ref, string};
use super::buffer::copy_to_c_buf;
use super::config::rdmamig_config;
use super::handle::{to_boxed_mut_ptr, try_box_from_ptr, Castable};
use super::last_error::{record, record_or, Failure};
use super::ram::rdmamig_ram;
use super::status::rdmamig_status;
use super::wait::wait_of;
use crate::connection::Connection;
use rdmamig::{Ending, Hint, Read, SaveRange, Source, Unregistration};

/// One end of a migration connection: a source (made by `rdmamig_connect`)
/// or a destination (made by `rdmamig_listener_accept`). A call that does
/// not fit the connection's role returns `RDMAMIG_ERR_STATE`.
///
/// Errors: every failing call keeps its message in the connection
/// (`rdmamig_conn_error_message`) and in the thread's last error
/// (`rdmamig_last_error_message`). Once the connection failed (peer error,
/// disconnect, timeout, `rdmamig_conn_abort`), every later call returns that
/// same error.
///
/// Ownership: free with `rdmamig_conn_free`, which also closes the
/// connection. The RAM registered for it must stay mapped until then.
///
/// Thread safety: the functions that take a `const rdmamig_conn *` may run
/// at the same time, from any threads:
// BEGIN generated from the functions' signatures (make generate)
/// `rdmamig_conn_abort`, `rdmamig_conn_error_message`, `rdmamig_conn_event_fd`,
/// `rdmamig_conn_get_stats`, `rdmamig_conn_get`, `rdmamig_conn_hint`,
/// `rdmamig_conn_negotiated_authenticated`,
/// `rdmamig_conn_negotiated_postcopy_recovery`, `rdmamig_conn_negotiated`,
/// `rdmamig_conn_postcopy_fetch`, `rdmamig_conn_postcopy_progress`,
/// `rdmamig_conn_postcopy_recover`, `rdmamig_conn_postcopy_userfaultfd`,
/// `rdmamig_conn_put_return`, `rdmamig_conn_save_bitmap`,
/// `rdmamig_conn_save_ranges`, `rdmamig_conn_save`,
/// `rdmamig_conn_set_max_bandwidth`, `rdmamig_conn_wait_end`,
/// `rdmamig_conn_wait_iteration`, `rdmamig_conn_wait_postcopy_link`,
/// `rdmamig_conn_wait_postcopy`.
// END generated
/// Every other function, and the callbacks of
/// `rdmamig_conn_stream_ops`, runs one at a time (each says whether
/// `rdmamig_conn_save` may run alongside it), while the `const` calls,
/// `rdmamig_conn_abort` among them, may run meanwhile (during
/// `rdmamig_conn_close` too); `rdmamig_conn_free` needs the handle to itself.
/// The library's own thread
/// (one per connection) makes progress without the hypervisor and calls
/// nothing back (but the log callback, `rdmamig_set_log_callback`).
pub struct rdmamig_conn {
    _private: [u8; 0],
}

impl Castable for rdmamig_conn {
    type RustType = Connection;
}

/// Runs `body` on the connection behind `conn` and returns its status; a
/// failure's message is kept in the connection and as the thread's last
/// error, a NULL `conn` only as the latter.
pub(crate) fn run<S: Into<rdmamig_status>>(
    conn: *const rdmamig_conn,
    func: &str,
    body: impl FnOnce(&Connection) -> Result<S, Failure>,
) -> rdmamig_status {
    match handle(conn, func, "conn") {
        Ok(c) => keep(c, body(c)),
        Err(f) => f.record(),
    }
}

/// The status of `r`, a call on `conn`; a failure's message is kept in the
/// connection and as the thread's last error (`RDMAMIG_ERR_WOULD_BLOCK` is
/// none: the last failure's message stays).
pub(crate) fn keep<S: Into<rdmamig_status>>(conn: &Connection, r: Result<S, Failure>) -> rdmamig_status {
    match r {
        Ok(s) => s.into(),
        Err(f) => {
            if f.is_failure() {
                conn.set_last_error(&f.message);
            }
            f.record()
        }
    }
}

/// How `rdmamig_conn_close` reports a migration that ended without failing.
fn close_status(ending: Ending) -> rdmamig_status {
    match ending {
        Ending::Completed => rdmamig_status::RDMAMIG_OK,
        Ending::Unverified => rdmamig_status::RDMAMIG_END_UNVERIFIED,
    }
}

/// Connects, as the source, to a destination listening on `host:port` (a
/// host name, an IPv4 or an IPv6 address of its RDMA device), negotiates the
/// capabilities `config` offers and starts the connection's transfer thread.
///
/// `ram` lists the guest RAM to migrate; it is copied, so it may be changed
/// or freed afterwards, but its memory must stay mapped until
/// `rdmamig_conn_free`. `config` is copied too. Waits at most the config's
/// timeout.
///
/// On `RDMAMIG_OK`, `*out` is the new connection (free it with
/// `rdmamig_conn_free`); on failure `*out` is left unchanged and the message
/// is available from `rdmamig_last_error_message`.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER`;
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (empty registry, host not UTF-8);
/// `RDMAMIG_ERR_CONNECT` (resolution, route, rejection);
/// `RDMAMIG_ERR_VERSION`; `RDMAMIG_ERR_AUTH` (authentication: the
/// destination requires a key and `config` has none, or it does not
/// authenticate while `config` has a key, or it could not prove the key);
/// `RDMAMIG_ERR_DISCONNECTED` (the destination went away or stopped
/// answering during the authentication exchange); `RDMAMIG_ERR_TIMEOUT`;
/// `RDMAMIG_ERR_VERBS`; `RDMAMIG_ERR_NO_DEVICE`.
///
/// Thread-safe (each call makes its own connection).
#[no_mangle]
pub extern "C" fn rdmamig_connect(
    host: *const c_char,
    port: u16,
    config: *const rdmamig_config,
    ram: *const rdmamig_ram,
    out: *mut *mut rdmamig_conn,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_connect";
        record(|| {
            let host = string(host, F, "host")?;
            let config = handle(config, F, "config")?;
            let ram = handle(ram, F, "ram")?;
            let out = out_ref(out, F, "out")?;
            let source = Source::connect(host, port, config, ram)?;
            *out = to_boxed_mut_ptr::<rdmamig_conn>(Connection::source(source));
            Ok(())
        })
    }
}

/// Frees a connection, closing it first if `rdmamig_conn_close` was not
/// called (which is the way to learn the outcome): a source flushes the
/// stream, runs the completion handshake and disconnects (waiting for the
/// queued work, at most the config's timeout per wait), a destination stops
/// serving (an unfinished source gets an ERROR). If that close fails, its
/// message becomes the thread's `rdmamig_last_error_message`.
///
/// NULL is a no-op. Must not be called twice, nor while any other call is
/// running on the connection. Afterwards the connection's RAM may be unmapped.
#[no_mangle]
pub extern "C" fn rdmamig_conn_free(conn: *mut rdmamig_conn) {
    ffi_boundary! {
        if let Some(conn) = try_box_from_ptr(conn) {
            if !conn.is_closed() {
                let r = conn.close("rdmamig_conn_free");
                keep(&conn, r.map(close_status).map_err(Failure::from));
            }
        }
    }
}

/// Closes the connection and returns the outcome of the migration:
/// `RDMAMIG_OK` only when it completed, which both sides then agree on.
///
/// A source ends an open iteration window, flushes the stream, waits until
/// everything queued is out, and, toward an rdmamig destination, sends its
/// end marker and waits for the destination's acknowledgement; then it
/// disconnects. It returns `RDMAMIG_OK` once acknowledged;
/// `RDMAMIG_END_UNVERIFIED` toward a QEMU destination (everything was sent and
/// written, but QEMU has no acknowledgement: its own return path must
/// confirm); otherwise the error (the migration did not complete).
///
/// A destination stops serving (a source still migrating gets an ERROR,
/// see `rdmamig_conn_abort`) and returns how the connection had ended:
/// `RDMAMIG_OK` if the migration completed, `RDMAMIG_END_UNVERIFIED` if a
/// QEMU source closed without proof, or the failure (`RDMAMIG_ERR_ABORTED`
/// if it was still running). Call `rdmamig_conn_wait_end` first to let a
/// migration finish.
///
/// Afterwards only `rdmamig_conn_error_message` and `rdmamig_conn_free` are
/// valid; every other call returns `RDMAMIG_ERR_STATE`, as does a second close
/// (also one made while the first is running). The connection's threads and
/// queue pairs are gone once close returns, and its registrations are
/// deregistered or queued for the unregistration worker (which the library
/// waits for here when rdma-core's fork support is on, since deregistering
/// then `madvise`s the range; `rdmamig_unregister_flush` waits for it
/// otherwise); its event fd and buffers (a destination's unread stream
/// bytes) stay until `rdmamig_conn_free`.
///
/// Thread safety: the `const` calls may run meanwhile from other threads
/// (`rdmamig_conn_abort`, to stop a close that waits for the peer;
/// `rdmamig_conn_get_stats`; `rdmamig_conn_error_message`; ...), and so may
/// another `rdmamig_conn_close`, which returns `RDMAMIG_ERR_STATE`; no other
/// call. Close returning does not mean that such a call has returned: let it
/// return before `rdmamig_conn_free`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_close(conn: *mut rdmamig_conn) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_close";
        run(conn, F, |c| Ok(close_status(c.close(F)?)))
    }
}

/// What the two sides agreed on when connecting: whether whole RAM blocks are
/// registered up front (`*pin_all`, QEMU's x-rdma-pin-all) and whether both
/// speak rdmamig's protocol extensions (`*extensions`; false when the peer is
/// QEMU). Either output may be NULL.
///
/// Thread safety: may run concurrently with other `const` uses of `conn`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_negotiated(
    conn: *const rdmamig_conn,
    pin_all: *mut bool,
    extensions: *mut bool,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_negotiated";
        run(conn, F, |c| {
            let n = c.negotiated(F)?;
            if let Some(p) = opt_out(pin_all) {
                *p = n.pin_all;
            }
            if let Some(e) = opt_out(extensions) {
                *e = n.extensions;
            }
            Ok(())
        })
    }
}

/// Whether post-copy recovery was negotiated when connecting: both sides
/// set `rdmamig_config_set_postcopy_recovery_ms` (an rdmamig peer of 0.11
/// or later; false with QEMU). Only then is a lost post-copy connection
/// replaced; otherwise it fails post-copy at once. Since 0.11.
///
/// Thread safety: may run concurrently with other `const` uses of `conn`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_negotiated_postcopy_recovery(
    conn: *const rdmamig_conn,
    recovery_out: *mut bool,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_negotiated_postcopy_recovery";
        run(conn, F, |c| {
            let out = out_ref(recovery_out, F, "recovery_out")?;
            *out = c.negotiated(F)?.postcopy_recovery;
            Ok(())
        })
    }
}

/// Whether the peer was authenticated when connecting: both sides set the
/// same key (`rdmamig_config_set_auth_key`) and each proved it to the other
/// for this connection, so every control message after the handshake
/// carries a tag the peer checks. False with QEMU and without a key. Since
/// 0.12.
///
/// Thread safety: may run concurrently with other `const` uses of `conn`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_negotiated_authenticated(
    conn: *const rdmamig_conn,
    authenticated_out: *mut bool,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_negotiated_authenticated";
        run(conn, F, |c| {
            let out = out_ref(authenticated_out, F, "authenticated_out")?;
            *out = c.negotiated(F)?.authenticated;
            Ok(())
        })
    }
}

/// Source: opens an iteration window (one precopy round): `rdmamig_conn_save`
/// is valid until `rdmamig_conn_iteration_end`. The first window also
/// exchanges the RAM block lists. `RDMAMIG_ERR_STATE` if a window is open
/// or post-copy was called.
///
/// Thread safety: needs exclusive use of `conn` (no `rdmamig_conn_save` may
/// be running), but for the other `const` calls (`rdmamig_conn_abort` among
/// them), which may run meanwhile.
#[no_mangle]
pub extern "C" fn rdmamig_conn_iteration_begin(conn: *mut rdmamig_conn) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_iteration_begin";
        run(conn, F, |c| Ok(c.as_source(F)?.iteration_begin()?))
    }
}

/// Source: queues `length` bytes at `offset` (relative to the block start) of
/// RAM block `block` (its index in the registry) for transfer, and returns at
/// once: the transfer thread reads the memory later, so the bytes sent are
/// what the memory holds then (at latest when `rdmamig_conn_iteration_end`
/// returns). All-zero ranges are sent as such and not written. Valid only
/// inside an iteration window (`RDMAMIG_ERR_STATE` otherwise);
/// `RDMAMIG_ERR_INVALID_ARGUMENT` for an unknown block or a range outside it.
/// With `rdmamig_config_set_max_queued_bytes` (0.16) it returns once the
/// queue is within that bound again (this and the other save calls).
///
/// Thread safety: may be called from several threads at once (e.g. one per
/// dirty-bitmap slice), and concurrently with the other functions taking a
/// `const rdmamig_conn *`; not concurrently with any other function.
#[no_mangle]
pub extern "C" fn rdmamig_conn_save(conn: *const rdmamig_conn, block: u32, offset: u64, length: u64) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_save";
        run(conn, F, |c| Ok(c.as_source(F)?.save(block, offset, length)?))
    }
}

/// A range of guest RAM for `rdmamig_conn_save_ranges`: `length` bytes at
/// `offset` of RAM block `block`. Zero it first: `reserved` must be 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdmamig_range {
    /// The RAM block's index in the registry.
    pub block: u32,
    /// Must be 0.
    pub reserved: u32,
    /// The range's first byte, relative to the block's start.
    pub offset: u64,
    /// The range's length in bytes.
    pub length: u64,
}

/// Source: queues `count` ranges at `ranges` for transfer, as `count` calls
/// of `rdmamig_conn_save` would, but up to 1024 per queue entry, waking the
/// library's transfer thread at the first entry and at the end. All are
/// checked first: one bad range (`RDMAMIG_ERR_INVALID_ARGUMENT`,
/// also for a non-zero `reserved`) refuses the call and nothing is queued.
/// `ranges` may be NULL when `count` is 0.
///
/// Thread safety: as `rdmamig_conn_save`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_save_ranges(
    conn: *const rdmamig_conn,
    ranges: *const rdmamig_range,
    count: usize,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_save_ranges";
        run(conn, F, |c| {
            let ranges = items(ranges, count, F, "ranges")?;
            if let Some(i) = ranges.iter().position(|r| r.reserved != 0) {
                return Err(Failure::invalid(format!("{F}: ranges[{i}].reserved is not 0")));
            }
            let ranges = ranges.iter().map(|r| SaveRange { block: r.block, offset: r.offset, len: r.length });
            Ok(c.as_source(F)?.save_ranges(ranges)?)
        })
    }
}

/// Source: queues the dirty pages of RAM block `block` that `bitmap` names:
/// bit `i % 64` of `bitmap[i / 64]` stands for page `first_page + i`, of
/// `page_size` bytes, for `i` below `page_count` (the bitmap holds
/// `(page_count + 63) / 64` words; later bits are ignored). The call copies
/// the bitmap, 65536 pages per queue entry (skipping entries with no bit
/// set), waking the transfer thread at the first entry and at the end; the
/// transfer thread sends each run of set bits as one range (runs crossing
/// entries are merged again). `bitmap` may be reused when the call returns.
/// The pages must lie inside the block (`RDMAMIG_ERR_INVALID_ARGUMENT`
/// otherwise, or for a page size of 0). Valid only inside an iteration
/// window. `bitmap` may be NULL when `page_count` is 0.
///
/// Thread safety: as `rdmamig_conn_save` (e.g. one caller per slice of a
/// large bitmap, each with its own `first_page`).
#[no_mangle]
pub extern "C" fn rdmamig_conn_save_bitmap(
    conn: *const rdmamig_conn,
    block: u32,
    bitmap: *const u64,
    first_page: u64,
    page_count: u64,
    page_size: u64,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_save_bitmap";
        run(conn, F, |c| {
            let words = usize::try_from(page_count.div_ceil(64))
                .map_err(|_| Failure::invalid(format!("{F}: page_count {page_count} is too large")))?;
            let bitmap = items(bitmap, words, F, "bitmap")?;
            Ok(c.as_source(F)?.save_bitmap(block, bitmap, first_page, page_count, page_size)?)
        })
    }
}

/// Source: caps the rate at which RAM and stream bytes go out, in bytes per
/// second (0: no cap), from the next write on (see
/// `rdmamig_config_set_max_bandwidth`).
///
/// Thread safety: may run concurrently with other `const` uses of `conn`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_set_max_bandwidth(conn: *const rdmamig_conn, bytes_per_second: u64) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_set_max_bandwidth";
        run(conn, F, |c| {
            c.as_source(F)?.set_max_bandwidth((bytes_per_second != 0).then_some(bytes_per_second));
            Ok(())
        })
    }
}

/// What `rdmamig_conn_hint` says about a range of guest RAM.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum rdmamig_hint {
    /// No hint (the default): least recently used chunks are unpinned first.
    RDMAMIG_HINT_NORMAL = 0,
    /// Not sent again soon (balloon-inflated, read-only or discarded
    /// ranges): unpinned before any other chunk.
    RDMAMIG_HINT_COLD = 1,
    /// Sent again soon: kept pinned while any other chunk can be unpinned.
    RDMAMIG_HINT_HOT = 2,
}

/// Source: hints how `length` bytes at `offset` of block `block` will be
/// sent (`hint`, an `rdmamig_hint` value), for choosing which 1 MiB chunks
/// to unpin when the pin budget is full (see
/// `rdmamig_config_set_pin_budget`). A hint covers every chunk the range
/// touches, lasts until another hint for the chunk, also applies to chunks
/// pinned later, and takes effect in order with `rdmamig_conn_save` calls.
/// An unknown `hint` or a range outside the block gives
/// `RDMAMIG_ERR_INVALID_ARGUMENT`; a destination gives `RDMAMIG_ERR_STATE`
/// (only a source chooses what to unpin).
///
/// Thread safety: as `rdmamig_conn_save`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_hint(
    conn: *const rdmamig_conn,
    block: u32,
    offset: u64,
    length: u64,
    hint: u32,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_hint";
        run(conn, F, |c| {
            let source = c.as_source(F)?;
            let hint = match hint {
                h if h == rdmamig_hint::RDMAMIG_HINT_NORMAL as u32 => Hint::Normal,
                h if h == rdmamig_hint::RDMAMIG_HINT_COLD as u32 => Hint::Cold,
                h if h == rdmamig_hint::RDMAMIG_HINT_HOT as u32 => Hint::Hot,
                other => return Err(Failure::invalid(format!("{F}: unknown hint {other}"))),
            };
            Ok(source.hint(block, offset, length, hint)?)
        })
    }
}

/// Waits until every registration queued for the unregistration worker (by
/// any connection of the process) is deregistered: after it, the memory
/// closed connections had pinned is unpinned. Returns at once when no worker
/// runs.
///
/// Thread safety: may be called from any thread at any time.
#[no_mangle]
pub extern "C" fn rdmamig_unregister_flush() -> rdmamig_status {
    ffi_boundary! {
        if let Some(worker) = Unregistration::running() {
            worker.flush();
        }
        rdmamig_status::RDMAMIG_OK
    }
}

/// Source: closes the iteration window: waits until every write queued in it
/// has completed, then tells the destination (REGISTER_FINISHED), whose
/// `rdmamig_conn_wait_iteration` then counts it.
///
/// Thread safety: needs exclusive use of `conn`, except that
/// `rdmamig_conn_save` calls of the window may still be running in other
/// threads (and any of the `const` calls): each such save is either queued
/// before the window ends, and so written before REGISTER_FINISHED, or
/// returns `RDMAMIG_ERR_STATE`. The handle is only read here, although the
/// pointer is not `const` (for ABI stability).
#[no_mangle]
pub extern "C" fn rdmamig_conn_iteration_end(conn: *mut rdmamig_conn) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_iteration_end";
        run(conn, F, |c| Ok(c.as_source(F)?.iteration_end()?))
    }
}

/// Source: appends `len` bytes at `data` to the device-state stream. The
/// bytes are copied; they go out in pieces as they accumulate, the rest with
/// `rdmamig_conn_flush`. `data` may be NULL when `len` is 0.
///
/// Thread safety: needs exclusive use of `conn`, but for the `const` calls
/// (`rdmamig_conn_abort` among them), which may run meanwhile.
#[no_mangle]
pub extern "C" fn rdmamig_conn_put(conn: *mut rdmamig_conn, data: *const c_void, len: usize) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_put";
        run(conn, F, |c| {
            let data = bytes(data.cast::<u8>(), len, F, "data")?;
            Ok(c.as_source(F)?.put(data)?)
        })
    }
}

/// Source: sends every stream byte put so far and waits until it is out.
///
/// Thread safety: needs exclusive use of `conn`, but for the `const` calls
/// (`rdmamig_conn_abort` among them), which may run meanwhile.
#[no_mangle]
pub extern "C" fn rdmamig_conn_flush(conn: *mut rdmamig_conn) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_flush";
        run(conn, F, |c| Ok(c.as_source(F)?.flush()?))
    }
}

/// Destination: reads device-state stream bytes into `buf` (of `len` bytes):
/// waits until at least one byte is there (at most `timeout_ms`
/// milliseconds; `RDMAMIG_WAIT_FOREVER` (0) waits for ever,
/// `RDMAMIG_NO_WAIT` not at all), copies up to `len` bytes and stores
/// their number in `*read_out`. `len == 0` returns at once with 0 (`buf` may
/// then be NULL).
///
/// Once the connection has ended and every byte was read, returns how it
/// ended, with `*read_out` 0: `RDMAMIG_END_COMPLETED` (the migration
/// completed), `RDMAMIG_END_UNVERIFIED` (a QEMU source closed the connection
/// outside an iteration window: only the stream can prove it is whole), or
/// the failure (`RDMAMIG_ERR_DISCONNECTED`, `RDMAMIG_ERR_PEER`, ...: the
/// migration did not complete, whatever the stream looks like).
/// `RDMAMIG_ERR_TIMEOUT` when the wait ran out (nothing is lost: call
/// again); `RDMAMIG_ERR_WOULD_BLOCK` with `RDMAMIG_NO_WAIT` when there is
/// nothing to return yet (`rdmamig_conn_event_fd` says when there is).
///
/// Thread safety: takes a `const` handle, so another thread may call
/// `rdmamig_conn_abort` (or read stats) meanwhile.
#[no_mangle]
pub extern "C" fn rdmamig_conn_get(
    conn: *const rdmamig_conn,
    buf: *mut c_void,
    len: usize,
    timeout_ms: u32,
    read_out: *mut usize,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_get";
        run(conn, F, |c| {
            let buf = bytes_mut(buf.cast::<u8>(), len, F, "buf")?;
            let read_out = out_ref(read_out, F, "read_out")?;
            Ok(match c.as_destination(F)?.get(buf, wait_of(timeout_ms))? {
                Read::Bytes(n) => {
                    *read_out = n;
                    rdmamig_status::RDMAMIG_OK
                }
                Read::End(ending) => {
                    *read_out = 0;
                    ending.into()
                }
            })
        })
    }
}

/// Destination: sends `len` bytes at `data` to a QEMU source over its return
/// path (see `rdmamig_config_set_return_path`), in QEMU_FILE messages of at
/// most 32 KiB, each after QEMU's READY. The bytes are QEMU's return-path
/// messages (MIG_RP_MSG_*: big-endian u16 type, u16 length, payload), which
/// the hypervisor builds from what it reads in the stream: PONG (2) answers
/// a PING, SHUT (1) with value 0 once the stream has ended (QEMU_VM_EOF);
/// QEMU completes only after SHUT and waits for it as long as the connection
/// lasts. Returns once every byte is sent, waiting at most the config's
/// timeout for each READY. `data` may be NULL when `len` is 0.
///
/// Returns `RDMAMIG_ERR_STATE` when the connection has no return path. Any
/// other failure aborts the migration and closes both connections; later
/// calls return it again. `rdmamig_conn_abort` and `rdmamig_conn_close`
/// close the return path too.
///
/// Thread safety: takes a `const` handle (calls on one connection run one
/// at a time), so another thread may call `rdmamig_conn_get` or
/// `rdmamig_conn_abort` meanwhile.
#[no_mangle]
pub extern "C" fn rdmamig_conn_put_return(
    conn: *const rdmamig_conn,
    data: *const c_void,
    len: usize,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_put_return";
        run(conn, F, |c| {
            let data = bytes(data.cast::<u8>(), len, F, "data")?;
            Ok(c.as_destination(F)?.put_return(data)?)
        })
    }
}

/// Destination: waits (at most `timeout_ms` milliseconds;
/// `RDMAMIG_WAIT_FOREVER` (0) waits for ever, `RDMAMIG_NO_WAIT` not at all)
/// until at least `n` iteration windows have completed, i.e. all RAM the
/// source saved in them is in place, and stores the number completed in
/// `*done_out` (which may be NULL). `n == 0` returns at once. Returning a
/// count clears the completed windows' part of the readiness of
/// `rdmamig_conn_event_fd`.
///
/// Returns `RDMAMIG_ERR_TIMEOUT` when the wait ran out,
/// `RDMAMIG_ERR_WOULD_BLOCK` with `RDMAMIG_NO_WAIT` when fewer than `n`
/// completed,
/// `RDMAMIG_ERR_DISCONNECTED` when the source ended the migration before
/// `n` windows completed, or the connection's error.
///
/// Thread safety: takes a `const` handle, so another thread may call
/// `rdmamig_conn_abort` (or read stats) meanwhile.
#[no_mangle]
pub extern "C" fn rdmamig_conn_wait_iteration(
    conn: *const rdmamig_conn,
    n: u64,
    timeout_ms: u32,
    done_out: *mut u64,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_wait_iteration";
        run(conn, F, |c| {
            let done = c.as_destination(F)?.wait_iteration(n, wait_of(timeout_ms))?;
            if let Some(d) = opt_out(done_out) {
                *d = done;
            }
            Ok(())
        })
    }
}

/// Destination: waits (at most `timeout_ms` milliseconds;
/// `RDMAMIG_WAIT_FOREVER` (0) waits for ever, `RDMAMIG_NO_WAIT` not at all:
/// `RDMAMIG_ERR_WOULD_BLOCK` while it lasts) until the connection has ended
/// and returns how: `RDMAMIG_END_COMPLETED`
/// (the source's end marker arrived after its last window and last stream
/// byte, matched what this side received, and was acknowledged),
/// `RDMAMIG_END_UNVERIFIED` (a QEMU source, which has no end marker, closed
/// the connection outside an iteration window: the stream must prove the
/// migration whole, e.g. by ending in QEMU_VM_EOF), or the failure (the
/// migration did not complete: do not run the guest). `RDMAMIG_ERR_TIMEOUT`
/// if it has not ended yet.
///
/// A hypervisor calls it after its stream loader finished, before it runs
/// the guest: a loader that saw a whole stream does not prove that all RAM
/// arrived. Stream bytes not read yet stay readable with `rdmamig_conn_get`
/// (the source may be held back while more than 256 MiB are unread).
///
/// Thread safety: takes a `const` handle, so another thread may call
/// `rdmamig_conn_abort` (or read stats) meanwhile.
#[no_mangle]
pub extern "C" fn rdmamig_conn_wait_end(conn: *const rdmamig_conn, timeout_ms: u32) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_wait_end";
        run(conn, F, |c| Ok(c.as_destination(F)?.wait_end(wait_of(timeout_ms))?))
    }
}

/// Aborts the migration: the library's thread sends the peer an ERROR
/// (`RDMAMIG_ERR_PEER` there) and tears the connection down. The protocol
/// (no receiver-not-ready retries) allows the ERROR only into a receive the
/// peer has posted, so it waits up to 1 s for the proof of one: a source for
/// the destination's next credit (READY), which the destination grants
/// after posting; a destination that granted a READY the source has not
/// used yet for the source's next message, which the source posts before
/// sending. Without it within 1 s (a peer that is busy or idle for that
/// long) no ERROR is sent and the peer learns of the abort from the
/// disconnect (`RDMAMIG_ERR_DISCONNECTED`). A source waiting for
/// `rdmamig_conn_postcopy`'s end (or for pin-all's registration) does not
/// wait: the destination grants no credit before it answers, and it would
/// go on reading meanwhile. Either way the migration fails on both sides. Calls blocked on the connection in other threads (`rdmamig_conn_iteration_end`,
/// `rdmamig_conn_flush`, `rdmamig_conn_get`, `rdmamig_conn_wait_iteration`,
/// `rdmamig_conn_postcopy`, `rdmamig_conn_wait_postcopy`) then return. Later calls fail with `RDMAMIG_ERR_ABORTED` or the error that
/// ended the connection (a destination's `rdmamig_conn_get` first returns the
/// stream bytes already received); free it with `rdmamig_conn_free`. Returns
/// `RDMAMIG_OK`, or `RDMAMIG_ERR_STATE` after `rdmamig_conn_close`.
///
/// Thread safety: may be called from any thread, while other calls on `conn`
/// are running (that is what it is for), `rdmamig_conn_close` among them (a
/// close waiting for the destination's acknowledgement then returns
/// `RDMAMIG_ERR_ABORTED`); not during or after `rdmamig_conn_free`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_abort(conn: *const rdmamig_conn) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_abort";
        run(conn, F, |c| Ok(c.abort(F)?))
    }
}

/// Copies the connection's last error message into `buf` (of `len` bytes),
/// `snprintf`-style: always NUL-terminated (when `len > 0`), truncated if
/// needed; returns the full length of the message, not counting the NUL.
/// `(NULL, 0)` asks for the length.
///
/// The message is that of the last call on this connection that failed
/// (whatever failed after it), or, if none failed yet, of the failure that
/// ended the connection in the library's thread; an empty message (0) if
/// there is neither. Returns 0
/// when `conn` is NULL.
///
/// Thread safety: may run concurrently with other `const` uses of `conn`.
#[no_mangle]
pub extern "C" fn rdmamig_conn_error_message(conn: *const rdmamig_conn, buf: *mut c_char, len: usize) -> usize {
    ffi_boundary! {
        let message = record_or(None, || Ok(handle(conn, "rdmamig_conn_error_message", "conn")?.error_message()));
        copy_to_c_buf(message.as_deref().unwrap_or(""), buf, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list of the functions that may run concurrently, in the doc of
    /// `rdmamig_conn`, is what their signatures say (`const rdmamig_conn *`);
    /// `RDMAMIG_REGENERATE=1` rewrites it (`make generate`).
    #[test]
    fn generated_thread_safety_list() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut names: Vec<String> = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            for decl in text.split("pub extern \"C\" fn ").skip(1) {
                let (name, rest) = decl.split_once('(').unwrap();
                let params = rest.split_once(')').unwrap().0;
                let first = params.split(',').next().unwrap();
                if first.split_once(':').is_some_and(|(_, ty)| ty.trim() == "*const rdmamig_conn") {
                    names.push(format!("`{name}`"));
                }
            }
        }
        names.sort();
        let mut lines = vec![String::from("///")];
        for (i, name) in names.iter().enumerate() {
            let item = if i + 1 == names.len() { format!("{name}.") } else { format!("{name},") };
            if lines.last().unwrap().len() + 1 + item.len() > 80 {
                lines.push(String::from("///"));
            }
            let line = lines.last_mut().unwrap();
            line.push(' ');
            line.push_str(&item);
        }
        let generated: String = lines.iter().map(|l| format!("{l}\n")).collect();
        crate::generated::check_or_rewrite("conn.rs", "the functions' signatures", &generated);
    }
    use rdmamig_status::*;
    use std::ptr::{null, null_mut};

    fn message(conn: *const rdmamig_conn) -> String {
        let mut buf = [0 as c_char; 256];
        let n = rdmamig_conn_error_message(conn, buf.as_mut_ptr(), buf.len());
        assert!(n < buf.len());
        buf[..n].iter().map(|&c| c as u8 as char).collect()
    }

    #[test]
    fn null_conn() {
        let n = null_mut();
        assert_eq!(rdmamig_conn_close(n), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_negotiated(n, null_mut(), null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        let mut on = true;
        assert_eq!(rdmamig_conn_negotiated_postcopy_recovery(n, &mut on), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_negotiated_authenticated(n, &mut on), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_iteration_begin(n), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_save(n, 0, 0, 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_iteration_end(n), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_put(n, null(), 0), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_flush(n), RDMAMIG_ERR_NULL_PARAMETER);
        let mut read = 0;
        assert_eq!(rdmamig_conn_get(n, null_mut(), 0, 0, &mut read), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_wait_iteration(n, 1, 1, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_wait_end(n, 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_abort(n), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_error_message(n, null_mut(), 0), 0);
        rdmamig_conn_free(n);
        let mut out = null_mut();
        assert_eq!(rdmamig_connect(null(), 1, null(), null(), &mut out), RDMAMIG_ERR_NULL_PARAMETER);
        assert!(out.is_null());
    }

    #[test]
    fn connect_argument_checks() {
        let config = crate::config::rdmamig_config_new();
        let ram = crate::ram::rdmamig_ram_new();
        let mut out = null_mut();
        assert_eq!(rdmamig_connect(c"127.0.0.1".as_ptr(), 1, config, ram, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_connect(c"127.0.0.1".as_ptr(), 1, null(), ram, &mut out), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_connect(c"\xff".as_ptr(), 1, config, ram, &mut out), RDMAMIG_ERR_INVALID_ARGUMENT);
        // An empty registry is refused before any device is touched.
        assert_eq!(rdmamig_connect(c"127.0.0.1".as_ptr(), 1, config, ram, &mut out), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert!(out.is_null());
        crate::ram::rdmamig_ram_free(ram);
        crate::config::rdmamig_config_free(config);
    }

    #[test]
    fn closed_conn_gives_state_and_keeps_the_message() {
        let conn = to_boxed_mut_ptr::<rdmamig_conn>(Connection::closed());
        assert_eq!(message(conn), "");
        assert_eq!(rdmamig_conn_iteration_begin(conn), RDMAMIG_ERR_STATE);
        assert!(message(conn).contains("closed"), "{}", message(conn));
        assert_eq!(rdmamig_conn_save(conn, 0, 0, 1), RDMAMIG_ERR_STATE);
        let mut read = 0;
        let mut buf = [0u8; 4];
        assert_eq!(rdmamig_conn_get(conn, buf.as_mut_ptr().cast(), 4, 1, &mut read), RDMAMIG_ERR_STATE);
        assert_eq!(rdmamig_conn_get(conn, null_mut(), 4, 1, &mut read), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(message(conn), "rdmamig_conn_get: buf is NULL");
        assert_eq!(rdmamig_conn_close(conn), RDMAMIG_ERR_STATE);
        assert_eq!(rdmamig_conn_abort(conn), RDMAMIG_ERR_STATE);
        assert_eq!(rdmamig_conn_negotiated(conn, null_mut(), null_mut()), RDMAMIG_ERR_STATE);
        let mut on = true;
        assert_eq!(rdmamig_conn_negotiated_postcopy_recovery(conn, &mut on), RDMAMIG_ERR_STATE);
        assert_eq!(rdmamig_conn_negotiated_postcopy_recovery(conn, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_negotiated_authenticated(conn, &mut on), RDMAMIG_ERR_STATE);
        assert_eq!(rdmamig_conn_negotiated_authenticated(conn, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_wait_end(conn, 1), RDMAMIG_ERR_STATE);
        rdmamig_conn_free(conn);
    }
}
