//! `rdmamig_stream_ops`: the device-state stream as QEMUFileOps-style callbacks.

use std::os::raw::{c_int, c_void};

use libc::{iovec, ssize_t};

use super::args::{bytes, bytes_mut, handle, items, out_ref};
use super::conn::{keep, rdmamig_conn, run};
use super::last_error::Failure;
use super::status::rdmamig_status;
use crate::connection::Connection;
use rdmamig::Read;

/// The device-state stream of a connection as callbacks shaped like QEMU's
/// `QEMUFileOps`, for a hypervisor whose migration code writes and reads
/// through such a table. Filled by `rdmamig_conn_stream_ops`; pass `opaque`
/// (the connection) as each callback's first argument.
///
/// A source gets `put_buffer`, `writev_buffer` and `close`; a destination
/// gets `get_buffer` and `close`. The callbacks that do not fit the role are
/// NULL (as QEMU's read-only and write-only files have no write or read
/// function).
///
/// The callbacks are the connection's `rdmamig_conn_put`,
/// `rdmamig_conn_get` and `rdmamig_conn_flush` with `ssize_t` results: on
/// failure they return `-EIO` (`-EINVAL` for a bad argument) and the message
/// is available from `rdmamig_conn_error_message` (and the thread's
/// `rdmamig_last_error_message`). `pos` is ignored: the stream is sequential.
/// Like every non-`const` connection call, a callback needs exclusive use of
/// the connection, and none may be called after `rdmamig_conn_close` or
/// `rdmamig_conn_free`.
#[repr(C)]
pub struct rdmamig_stream_ops {
    /// The connection: the first argument of every callback.
    pub opaque: *mut c_void,
    /// Destination: reads up to `size` bytes of the stream into `buf`,
    /// waiting until at least one byte is there, and returns how many it
    /// read; 0 at the end of the stream (every byte was read and the
    /// connection ended without failing: `rdmamig_conn_wait_end` then says
    /// whether completed or unverified); `-EIO` on failure, including a
    /// source that vanished or disconnected before completing the migration.
    pub get_buffer: Option<unsafe extern "C" fn(opaque: *mut c_void, buf: *mut u8, pos: i64, size: usize) -> ssize_t>,
    /// Source: appends `size` bytes at `buf` to the stream and returns `size`;
    /// `-EIO` on failure.
    pub put_buffer: Option<unsafe extern "C" fn(opaque: *mut c_void, buf: *const u8, pos: i64, size: usize) -> ssize_t>,
    /// Source: appends the `iovcnt` buffers of `iov`, in order, and returns
    /// their total length; `-EIO` on failure (some of the bytes may have been
    /// appended), `-EINVAL` for a negative `iovcnt`, a NULL `iov` with
    /// `iovcnt > 0`, or a total that does not fit in `ssize_t`.
    pub writev_buffer:
        Option<unsafe extern "C" fn(opaque: *mut c_void, iov: *const iovec, iovcnt: c_int, pos: i64) -> ssize_t>,
    /// Source: sends every stream byte appended so far and waits until it is
    /// out (`rdmamig_conn_flush`); destination: does nothing. Returns 0, or
    /// `-EIO` on failure. It does not close or free the connection.
    pub close: Option<unsafe extern "C" fn(opaque: *mut c_void) -> c_int>,
}

/// Fills `*out` with the stream callbacks of `conn` (`opaque` = `conn`):
/// `put_buffer`, `writev_buffer` and `close` for a source, `get_buffer` and
/// `close` for a destination, NULL for the others. The table stays valid
/// until `rdmamig_conn_close` or `rdmamig_conn_free`.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER`; `RDMAMIG_ERR_STATE`
/// after `rdmamig_conn_close`.
///
/// Thread safety: needs exclusive use of `conn`, as do the callbacks.
#[no_mangle]
pub extern "C" fn rdmamig_conn_stream_ops(conn: *mut rdmamig_conn, out: *mut rdmamig_stream_ops) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_stream_ops";
        let opaque = conn.cast::<c_void>();
        run(conn, F, |c| {
            let out = out_ref(out, F, "out")?;
            c.check_open(F)?;
            let source = c.is_source();
            *out = rdmamig_stream_ops {
                opaque,
                get_buffer: (!source).then_some(stream_get_buffer as _),
                put_buffer: source.then_some(stream_put_buffer as _),
                writev_buffer: source.then_some(stream_writev_buffer as _),
                close: Some(stream_close),
            };
            Ok(())
        })
    }
}

const EIO: ssize_t = libc::EIO as ssize_t;
const EINVAL: ssize_t = libc::EINVAL as ssize_t;

/// The callbacks' panic boundary: a panic gives `-EIO`.
fn guard<R>(failed: R, body: impl FnOnce() -> R + std::panic::UnwindSafe) -> R {
    std::panic::catch_unwind(body).unwrap_or(failed)
}

/// Runs `body` on the connection behind `opaque`, recording a failure there;
/// `Err(-errno)` on failure.
fn with_conn(
    opaque: *mut c_void,
    func: &str,
    body: impl FnOnce(&Connection) -> Result<(), Failure>,
) -> Result<(), ssize_t> {
    let conn = match handle(opaque.cast::<rdmamig_conn>().cast_const(), func, "opaque") {
        Ok(c) => c,
        Err(f) => {
            f.record();
            return Err(-EINVAL);
        }
    };
    let r = body(conn);
    match keep(conn, r) {
        rdmamig_status::RDMAMIG_OK => Ok(()),
        rdmamig_status::RDMAMIG_ERR_NULL_PARAMETER | rdmamig_status::RDMAMIG_ERR_INVALID_ARGUMENT => Err(-EINVAL),
        _ => Err(-EIO),
    }
}

unsafe extern "C" fn stream_get_buffer(opaque: *mut c_void, buf: *mut u8, _pos: i64, size: usize) -> ssize_t {
    guard(-EIO, || {
        const F: &str = "rdmamig_stream_ops.get_buffer";
        let mut read = 0usize;
        let r = with_conn(opaque, F, |c| {
            let buf = bytes_mut(buf, size, F, "buf")?;
            // Both endings that are not failures end the stream; a failure is -EIO.
            read = match c.as_destination(F)?.get(buf, None)? {
                Read::Bytes(n) => n,
                Read::End(_) => 0,
            };
            Ok(())
        });
        r.map_or_else(|e| e, |()| read as ssize_t)
    })
}

unsafe extern "C" fn stream_put_buffer(opaque: *mut c_void, buf: *const u8, _pos: i64, size: usize) -> ssize_t {
    guard(-EIO, || {
        const F: &str = "rdmamig_stream_ops.put_buffer";
        let r = with_conn(opaque, F, |c| {
            if ssize_t::try_from(size).is_err() {
                return Err(Failure::invalid(format!("{F}: size {size} does not fit in ssize_t")));
            }
            let data = bytes(buf, size, F, "buf")?;
            Ok(c.as_source(F)?.put(data)?)
        });
        r.map_or_else(|e| e, |()| size as ssize_t)
    })
}

unsafe extern "C" fn stream_writev_buffer(opaque: *mut c_void, iov: *const iovec, iovcnt: c_int, _pos: i64) -> ssize_t {
    guard(-EIO, || {
        const F: &str = "rdmamig_stream_ops.writev_buffer";
        let mut total: ssize_t = 0;
        let r = with_conn(opaque, F, |c| {
            let count =
                usize::try_from(iovcnt).map_err(|_| Failure::invalid(format!("{F}: iovcnt is negative ({iovcnt})")))?;
            // SAFETY (of the slice): the caller passes `iovcnt` valid iovecs.
            let iov = items(iov, count, F, "iov")?;
            let pieces: Vec<&[u8]> = iov
                .iter()
                .map(|v| bytes(v.iov_base.cast::<u8>(), v.iov_len, F, "iov[].iov_base"))
                .collect::<Result<_, _>>()?;
            total = pieces
                .iter()
                .try_fold(0 as ssize_t, |t, p| t.checked_add(ssize_t::try_from(p.len()).ok()?))
                .ok_or_else(|| Failure::invalid(format!("{F}: the total length does not fit in ssize_t")))?;
            let source = c.as_source(F)?;
            for piece in pieces {
                source.put(piece)?;
            }
            Ok(())
        });
        r.map_or_else(|e| e, |()| total)
    })
}

unsafe extern "C" fn stream_close(opaque: *mut c_void) -> c_int {
    guard(-libc::EIO, || {
        const F: &str = "rdmamig_stream_ops.close";
        let r = with_conn(opaque, F, |c| {
            if c.is_source() {
                c.as_source(F)?.flush()?;
            } else {
                c.as_destination(F)?;
            }
            Ok(())
        });
        r.map_or_else(|e| e as c_int, |()| 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::rdmamig_conn_free;
    use crate::handle::to_boxed_mut_ptr;
    use rdmamig_status::*;

    #[test]
    fn argument_checks() {
        let mut ops = std::mem::MaybeUninit::<rdmamig_stream_ops>::uninit();
        assert_eq!(rdmamig_conn_stream_ops(std::ptr::null_mut(), ops.as_mut_ptr()), RDMAMIG_ERR_NULL_PARAMETER);
        let conn = to_boxed_mut_ptr::<rdmamig_conn>(Connection::closed());
        assert_eq!(rdmamig_conn_stream_ops(conn, std::ptr::null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_stream_ops(conn, ops.as_mut_ptr()), RDMAMIG_ERR_STATE);
        // The callbacks on a closed connection fail with -EIO, on NULL with -EINVAL.
        let opaque = conn.cast::<c_void>();
        let mut b = [0u8; 4];
        // SAFETY: the stream functions check their arguments; `b` outlives the calls.
        unsafe {
            assert_eq!(stream_get_buffer(opaque, b.as_mut_ptr(), 0, 4), -EIO);
            assert_eq!(stream_put_buffer(opaque, b.as_ptr(), 0, 4), -EIO);
            assert_eq!(stream_writev_buffer(opaque, std::ptr::null(), -1, 0), -EINVAL);
            assert_eq!(stream_writev_buffer(opaque, std::ptr::null(), 1, 0), -EINVAL);
            assert_eq!(stream_close(opaque), -libc::EIO);
            assert_eq!(stream_close(std::ptr::null_mut()), -libc::EINVAL);
        }
        rdmamig_conn_free(conn);
    }
}
