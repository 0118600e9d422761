//! `rdmamig_listener`: a destination's listening endpoint; accepting a source.

use std::os::raw::c_char;

use super::args::{handle, out_ref, string};
use super::config::rdmamig_config;
use super::conn::rdmamig_conn;
use super::handle::{free_box, to_boxed_mut_ptr, Castable};
use super::last_error::{record, record_or};
use super::ram::rdmamig_ram;
use super::status::rdmamig_status;
use super::wait::wait_of;
use crate::connection::Connection;
use rdmamig::{Destination, Listener};

/// A destination's listening rdma_cm endpoint, bound to the address of an
/// RDMA device.
///
/// Create with `rdmamig_listener_new`, take connections with
/// `rdmamig_listener_accept`, free with `rdmamig_listener_free`. Accepted
/// connections are independent of it: the listener may be freed while they
/// run.
///
/// Thread safety: `rdmamig_listener_port`, `rdmamig_listener_accept` and
/// `rdmamig_listener_cancel` take a `const` pointer and may run concurrently
/// (each accept takes a different connection request); nothing may run
/// concurrently with `rdmamig_listener_free`.
pub struct rdmamig_listener {
    _private: [u8; 0],
}

impl Castable for rdmamig_listener {
    type RustType = Listener;
}

/// Listens for sources on `host:port`. `host` is a host name, an IPv4 or an
/// IPv6 address of an RDMA device ("0.0.0.0" for every IPv4 device); `port`
/// 0 picks a free port (`rdmamig_listener_port` tells which). `config` is
/// copied: what the destination allows (pin_all, extensions), the protocol
/// version and the timeout apply to every accepted connection.
///
/// On `RDMAMIG_OK`, `*out` is the new listener; on failure it is left
/// unchanged and the message is available from `rdmamig_last_error_message`.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER`;
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (host not UTF-8); `RDMAMIG_ERR_CONNECT`
/// (host not resolvable); `RDMAMIG_ERR_TIMEOUT` (the resolver gave no answer
/// within the config's timeout); `RDMAMIG_ERR_VERBS` / `RDMAMIG_ERR_CONNECT`
/// (cannot bind or listen, e.g. no RDMA device has that address, or the port
/// is taken).
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rdmamig_listener_new(
    host: *const c_char,
    port: u16,
    config: *const rdmamig_config,
    out: *mut *mut rdmamig_listener,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_listener_new";
        record(|| {
            let host = string(host, F, "host")?;
            let config = handle(config, F, "config")?;
            let out = out_ref(out, F, "out")?;
            *out = to_boxed_mut_ptr::<rdmamig_listener>(Listener::bind(host, port, config)?);
            Ok(())
        })
    }
}

/// The port the listener is bound to (the one picked when it was created
/// with port 0). 0 when `listener` is NULL (which also sets
/// `rdmamig_last_error_message`).
///
/// Thread safety: may run concurrently with other `const` uses of `listener`.
#[no_mangle]
pub extern "C" fn rdmamig_listener_port(listener: *const rdmamig_listener) -> u16 {
    ffi_boundary! {
        record_or(0, || Ok(handle(listener, "rdmamig_listener_port", "listener")?.port()))
    }
}

/// Frees a listener: no more sources can connect to it. Connections already
/// accepted are not affected. NULL is a no-op. Must not be called twice, nor
/// while an `rdmamig_listener_accept` on it is running.
#[no_mangle]
pub extern "C" fn rdmamig_listener_free(listener: *mut rdmamig_listener) {
    ffi_boundary! {
        free_box(listener)
    }
}

/// Waits for a source to connect (at most `timeout_ms` milliseconds;
/// `RDMAMIG_WAIT_FOREVER` (0) for ever; `RDMAMIG_NO_WAIT` not at all: see
/// `rdmamig_listener_event_fd`), accepts it as the destination, and starts the connection's
/// service thread, which serves the source from then on (registrations,
/// zero ranges, iteration ends, buffering the stream) without the
/// hypervisor's help.
///
/// `ram` lists this side's guest RAM, into which the source writes; it is
/// copied, so it may be changed or freed afterwards, but its memory must
/// stay mapped until `rdmamig_conn_free`. For a QEMU source the blocks must
/// be in the source's order.
///
/// On `RDMAMIG_OK`, `*out` is the new connection (free it with
/// `rdmamig_conn_free`); on failure `*out` is left unchanged and the message
/// is available from `rdmamig_last_error_message`.
///
/// A connection request that fails a check is rejected, logged, and the
/// wait goes on: from an address not allowed (`rdmamig_config_allow_source`),
/// with another protocol version, malformed, failing to authenticate
/// (`rdmamig_config_set_auth_key`), or whose handshake does not finish within
/// the handshake timeout (`rdmamig_config_set_handshake_timeout_ms`: a peer
/// that connects and stays silent). Handshakes run side by side, so no such
/// peer holds up the real source. If no source is admitted before the
/// timeout, the call fails with the status of the last refusal, its message
/// saying how many were refused. (Since 0.12: before, only refusals by the
/// allow-list and authentication kept the wait going.) Several threads may
/// accept on one listener: a connection admitted after the accept that
/// began it returned is kept for the next accept, and a QEMU source's
/// return-path connection (`rdmamig_config_set_return_path`) reaches the
/// accept that took that source.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER`;
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (empty registry); `RDMAMIG_ERR_TIMEOUT`
/// (no source came); `RDMAMIG_ERR_WOULD_BLOCK` (`RDMAMIG_NO_WAIT` and no
/// request was waiting; with one waiting, the setup with that source still
/// takes its round trips, within the handshake timeout); `RDMAMIG_ERR_AUTH`
/// (sources came, the last refused for its address or its authentication);
/// `RDMAMIG_ERR_CANCELLED` (`rdmamig_listener_cancel`);
/// `RDMAMIG_ERR_VERSION` (the last source refused speaks another protocol
/// version); `RDMAMIG_ERR_PROTOCOL`; `RDMAMIG_ERR_CONNECT`;
/// `RDMAMIG_ERR_VERBS`.
///
/// Thread safety: may run concurrently with other `const` uses of `listener`
/// and of `ram`.
#[no_mangle]
pub extern "C" fn rdmamig_listener_accept(
    listener: *const rdmamig_listener,
    ram: *const rdmamig_ram,
    timeout_ms: u32,
    out: *mut *mut rdmamig_conn,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_listener_accept";
        record(|| {
            let listener = handle(listener, F, "listener")?;
            let ram = handle(ram, F, "ram")?;
            let out = out_ref(out, F, "out")?;
            let destination = Destination::accept(listener, ram, wait_of(timeout_ms))?;
            *out = to_boxed_mut_ptr::<rdmamig_conn>(Connection::destination(destination));
            Ok(())
        })
    }
}

/// Cancels the listener: every `rdmamig_listener_accept` running on it
/// returns `RDMAMIG_ERR_CANCELLED` within about 100 ms, and so does every
/// later one at once. Connections already accepted are not affected. Meant
/// for another thread than the one blocked in accept, e.g. to shut a
/// destination down before `rdmamig_listener_free`.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER`.
///
/// Thread safety: may run concurrently with other `const` uses of `listener`.
#[no_mangle]
pub extern "C" fn rdmamig_listener_cancel(listener: *const rdmamig_listener) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_listener_cancel";
        record(|| {
            handle(listener, F, "listener")?.cancel();
            Ok(())
        })
    }
}

/// Listeners are shared by concurrent accepts.
const _: () = {
    const fn is_sync<T: Sync>() {}
    is_sync::<Listener>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use rdmamig_status::*;
    use std::ptr::{null, null_mut};

    #[test]
    fn argument_checks() {
        let config = crate::config::rdmamig_config_new();
        let ram = crate::ram::rdmamig_ram_new();
        let mut l = null_mut();
        assert_eq!(rdmamig_listener_new(null(), 0, config, &mut l), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_listener_new(c"0.0.0.0".as_ptr(), 0, null(), &mut l), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_listener_new(c"0.0.0.0".as_ptr(), 0, config, null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_listener_new(c"\xff".as_ptr(), 0, config, &mut l), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert!(l.is_null());
        assert_eq!(rdmamig_listener_port(null()), 0);
        let mut c = null_mut();
        assert_eq!(rdmamig_listener_accept(null(), ram, 1, &mut c), RDMAMIG_ERR_NULL_PARAMETER);
        assert!(c.is_null());
        rdmamig_listener_free(null_mut());
        crate::ram::rdmamig_ram_free(ram);
        crate::config::rdmamig_config_free(config);
    }
}
