//! `rdmamig_config`: connection settings (the smallest complete handle; copy
//! its shape when adding a handle).

use super::args::{bytes, handle_mut, string};
use super::handle::{free_box, to_boxed_mut_ptr, Castable};
use super::last_error::{record, Failure};
use super::status::rdmamig_status;
use rdmamig::{AuthKey, Config, SourcePrefix};
use std::os::raw::c_char;
use std::time::Duration;

/// Settings for one side of a migration connection.
///
/// Create with `rdmamig_config_new`, change with the `rdmamig_config_set_*`
/// functions, free with `rdmamig_config_free`. Functions that take a
/// `const rdmamig_config *` copy what they need, so the config may be changed or
/// freed afterwards.
///
/// Thread safety: not synchronised. Any number of threads may use one config
/// through `const` pointers at the same time, but nothing may run concurrently
/// with a setter or `rdmamig_config_free` on the same config.
pub struct rdmamig_config {
    _private: [u8; 0],
}

impl Castable for rdmamig_config {
    type RustType = Config;
}

/// Runs a setter's `change` on the config behind `config` and returns its
/// status; a failure's message becomes the thread's last error.
fn set(
    config: *mut rdmamig_config,
    func: &str,
    change: impl FnOnce(&mut Config) -> Result<(), Failure>,
) -> rdmamig_status {
    record(|| change(handle_mut(config, func, "config")?))
}

/// A new config with the defaults: pin_all off, extensions on, protocol
/// version 1, timeout 30000 ms, liveness 10000 ms, pin budget from
/// RLIMIT_MEMLOCK, unregistration worker on, ToS 0 (the kernel's default).
///
/// Returns NULL only if rdmamig panicked. Free with `rdmamig_config_free`.
#[no_mangle]
pub extern "C" fn rdmamig_config_new() -> *mut rdmamig_config {
    ffi_boundary! {
        to_boxed_mut_ptr::<rdmamig_config>(Config::default())
    }
}

/// Frees a config. NULL is a no-op. Must not be called twice on the same config.
#[no_mangle]
pub extern "C" fn rdmamig_config_free(config: *mut rdmamig_config) {
    ffi_boundary! {
        free_box(config)
    }
}

/// Source: ask the destination to register whole RAM blocks up front (QEMU's
/// `x-rdma-pin-all`). Destination: allow the source to ask for it. Default off.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_pin_all(config: *mut rdmamig_config, pin_all: bool) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_pin_all", |c| {
            c.pin_all = pin_all;
            Ok(())
        })
    }
}

/// Offer (source) or accept (destination) rdmamig's own protocol extensions.
/// Off means behaving exactly as QEMU does on the wire. Default on.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_extensions(config: *mut rdmamig_config, extensions: bool) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_extensions", |c| {
            c.extensions = extensions;
            Ok(())
        })
    }
}

/// The protocol version sent in the connection private data. Default 1 (the
/// only version QEMU speaks); only tests change it.
///
/// Test-only: left out of the public header (c-tests/rdmamig_testing.h
/// declares it) but still exported, in its original version node, so that
/// programs built against 0.6 and earlier headers keep loading.
///
/// cbindgen:ignore
#[no_mangle]
pub extern "C" fn rdmamig_config_set_protocol_version(
    config: *mut rdmamig_config,
    protocol_version: u32,
) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_protocol_version", |c| {
            c.protocol_version = protocol_version;
            Ok(())
        })
    }
}

/// Upper bound, in milliseconds, for every blocking wait: name resolution,
/// address and route resolution, connect, the accept handshake, completions,
/// and a response from the peer. Not for a destination's wait for the
/// source's next message (a source may pause between rounds as long as it
/// likes): liveness bounds that. Default 30000. 0 gives
/// `RDMAMIG_ERR_INVALID_ARGUMENT` and leaves the config unchanged.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_timeout_ms(config: *mut rdmamig_config, timeout_ms: u32) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_config_set_timeout_ms";
        set(config, F, |c| {
            if timeout_ms == 0 {
                return Err(Failure::invalid(format!("{F}: timeout_ms is 0")));
            }
            c.timeout = Duration::from_millis(u64::from(timeout_ms));
            Ok(())
        })
    }
}

/// Destination: how long one connection request may take, in
/// milliseconds, from the request to an admitted source (the connection
/// established and, with a key, the source's proof checked); at most the
/// timeout (`rdmamig_config_set_timeout_ms`). A peer that connects and stays
/// silent is dropped then. Meanwhile `rdmamig_listener_accept` goes on
/// taking other requests (several handshakes may run at once), so such a
/// peer cannot hold up the real source. Default 5000. 0 gives
/// `RDMAMIG_ERR_INVALID_ARGUMENT` and leaves the config unchanged. Since 0.12.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_handshake_timeout_ms(
    config: *mut rdmamig_config,
    timeout_ms: u32,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_config_set_handshake_timeout_ms";
        set(config, F, |c| {
            if timeout_ms == 0 {
                return Err(Failure::invalid(format!("{F}: timeout_ms is 0")));
            }
            c.handshake_timeout = Duration::from_millis(u64::from(timeout_ms));
            Ok(())
        })
    }
}

/// Liveness, in milliseconds: a peer that stops answering (host down, link
/// down, process frozen with its NIC gone) is declared gone within this time
/// on both sides, even with no connection event and no call waiting; every
/// blocked call then fails with `RDMAMIG_ERR_DISCONNECTED`. While a
/// connection is idle each side sends a zero-length RDMA WRITE every third
/// of it; the peer's NIC answers it and its software, QEMU included, sees
/// nothing. The QP's ACK timeout is set so that its own 6 tries fit in half
/// of it (between 0.27 s and 4.3 s per try). Default 10000; 0 turns it off
/// (QEMU's behaviour: only connection events end a silent connection).
#[no_mangle]
pub extern "C" fn rdmamig_config_set_liveness_ms(config: *mut rdmamig_config, liveness_ms: u32) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_liveness_ms", |c| {
            c.liveness = (liveness_ms != 0).then(|| Duration::from_millis(u64::from(liveness_ms)));
            Ok(())
        })
    }
}

/// Post-copy recovery, in milliseconds (rdmamig extension, both sides): how
/// long to wait for a lost connection to come back once the guest runs on
/// the destination. A source with it listens for the destination's recovery
/// connection from `rdmamig_conn_postcopy` on (on the address the
/// destination reached it at, a port the system picks, a token only the
/// destination learned); a destination with it, whose source has it too,
/// reconnects after a transport error or a liveness failure, while its
/// vCPUs stay blocked on their missing pages; the new connection is
/// authenticated as the first was, and the pull goes on where it stopped.
/// Not after the source's ERROR, nor when the source's listener is gone (a
/// killed source), nor on the source when the destination disconnected (a
/// killed destination): then post-copy fails at once, as without it. Each
/// side counts from the moment it noticed the loss. Negotiated when
/// connecting: only with it on both sides. Default 0: off.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_postcopy_recovery_ms(
    config: *mut rdmamig_config,
    recovery_ms: u32,
) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_postcopy_recovery_ms", |c| {
            c.postcopy_recovery = (recovery_ms != 0).then(|| Duration::from_millis(u64::from(recovery_ms)));
            Ok(())
        })
    }
}

/// Destination: post-copy goes through the hypervisor's userfaultfd instead
/// of one of the library's own. The hypervisor registers guest RAM with it
/// (missing mode), reads its faults itself and hands it over with
/// `rdmamig_conn_postcopy_userfaultfd` before post-copy runs: once the
/// source's request came, the library waits for it up to the config's
/// timeout (then post-copy fails with `RDMAMIG_ERR_TIMEOUT`). The library
/// drops the stale pages, installs pages through it (`UFFDIO_COPY`,
/// `UFFDIO_ZEROPAGE`, which wake the faulting threads) and never reads it;
/// the hypervisor forwards each fault it reads with
/// `rdmamig_conn_postcopy_fetch`. For a hypervisor that keeps its own fault
/// thread (QEMU, whose userfaultfd also serves vhost-user backends), or a
/// migration process apart from the VMM that received its guest memory and
/// userfaultfd over a UNIX socket. Ignored on a source. Default off: the
/// library registers a userfaultfd of its own and serves it.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_postcopy_hypervisor_userfaultfd(
    config: *mut rdmamig_config,
    hypervisor: bool,
) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_postcopy_hypervisor_userfaultfd", |c| {
            c.hypervisor_userfaultfd = hypervisor;
            Ok(())
        })
    }
}

/// Post-copy recovery (`rdmamig_config_set_postcopy_recovery_ms`), on
/// either side: after a loss, wait for the hypervisor's go,
/// `rdmamig_conn_postcopy_recover`, before reconnecting (destination) or
/// admitting the destination's connection (source), as QEMU's
/// `migrate-recover` and `migrate` with `resume` drive it. The window still
/// bounds the whole wait from the loss. Default off: each side recovers by
/// itself. Either way `rdmamig_conn_wait_postcopy_link` follows the
/// connection.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_postcopy_recovery_by_hypervisor(
    config: *mut rdmamig_config,
    by_hypervisor: bool,
) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_postcopy_recovery_by_hypervisor", |c| {
            c.postcopy_recovery_by_hypervisor = by_hypervisor;
            Ok(())
        })
    }
}

/// Destination, post-copy: when it fails, leave the threads blocked on
/// missing guest pages blocked (`keep` true) instead of releasing them
/// (false, the default: the post-copy blocks become `PROT_NONE` in this
/// process and the waiters are woken, so they and later touches fault with
/// SIGSEGV). Either way no thread runs on a page the source never sent.
/// For a hypervisor that reports the failure and keeps running until it is
/// stopped (QEMU: query-migrate answers, the vCPUs wait): it must then never
/// unregister the guest RAM from its userfaultfd nor wait for its vCPUs to
/// stop (a vCPU blocked on a missing page may never stop); the library
/// keeps its userfaultfd (or its duplicate of the hypervisor's) open, so the
/// blocks stay registered. Ignored on a source.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_postcopy_keep_blocked(config: *mut rdmamig_config, keep: bool) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_postcopy_keep_blocked", |c| {
            c.postcopy_keep_blocked = keep;
            Ok(())
        })
    }
}

/// Pin budget, in bytes: the most guest memory this side keeps registered
/// (pinned) at once. A source unpins least-recently-used chunks (see
/// `rdmamig_conn_hint`) to stay under it and under the budget an rdmamig
/// destination announces at connect; a destination refuses a source that asks
/// for more (`RDMAMIG_ERR_PIN_BUDGET`; a QEMU source cannot unpin). Pin-all
/// is dropped at connect, on either side, when the budget cannot hold all the
/// RAM registered for the connection: both sides then register dynamically.
/// 0 (the default) takes RLIMIT_MEMLOCK (`ulimit -l`) less what the control
/// channel pins, unlimited when that limit is infinite or the process has
/// CAP_IPC_LOCK; any other value is kept within that too. `UINT64_MAX`:
/// no budget of its own. The budget in effect is in `rdmamig_stats.pin_budget`.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_pin_budget(config: *mut rdmamig_config, bytes: u64) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_pin_budget", |c| {
            c.pin_budget = (bytes != 0).then_some(bytes);
            Ok(())
        })
    }
}

/// Whether deregistration runs on the process's unregistration worker
/// thread (default true): then no write, no `rdmamig_conn_iteration_end` and
/// no `rdmamig_conn_close` waits for `ibv_dereg_mr` (about 400 ms per 64 GiB).
/// The worker starts with the first connection that uses it and is joined,
/// after deregistering everything queued, when the last such connection is
/// freed; `rdmamig_unregister_flush` waits for its queue. false: each
/// connection deregisters on its own thread, and `rdmamig_conn_close` waits.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_unregister_worker(config: *mut rdmamig_config, worker: bool) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_unregister_worker", |c| {
            c.unregister_worker = worker;
            Ok(())
        })
    }
}

/// Destination serving a QEMU source: also accept the source's return-path
/// connection (QEMU's second connection request to the same address, which
/// `rdmamig_listener_accept` then waits for, at most the config's timeout)
/// and keep it for `rdmamig_conn_put_return`. QEMU 7.2 opens it only with its
/// `postcopy-ram` (or `dirty-bitmaps`) capability on (with `return-path`
/// alone it opens none and fails right after setup, whatever the
/// destination). A QEMU source that opens one needs this: otherwise it gives
/// up after 5 s. Ignored with an rdmamig source (which opens none);
/// `rdmamig_connect` refuses a config with it (`RDMAMIG_ERR_INVALID_ARGUMENT`).
/// Default off.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_return_path(config: *mut rdmamig_config, return_path: bool) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_return_path", |c| {
            c.return_path = return_path;
            Ok(())
        })
    }
}

/// Pre-shared key for peer authentication (rdmamig extension; needs the
/// extensions on): `len` bytes at `key`, 16 to 1024, best drawn from a random
/// source (nothing stretches a password). The source proves the key to the
/// destination and the destination to the source, each over a fresh nonce of
/// the other, before the destination registers any guest memory: a source
/// without the key, with another key, or replaying a recorded handshake is
/// refused (`RDMAMIG_ERR_AUTH`; a destination's accept keeps waiting for the
/// next source). A side with a key refuses a peer without one, so it never
/// migrates with QEMU. The library keeps a copy, wiped when the last config
/// or connection holding it is freed, and never prints it. `(NULL, 0)`
/// removes the key. Other lengths give `RDMAMIG_ERR_INVALID_ARGUMENT`.
///
/// Only the start of the connection is authenticated: guest memory travels
/// in RDMA WRITEs that are neither encrypted nor integrity-protected (see
/// docs/security.md).
#[no_mangle]
pub extern "C" fn rdmamig_config_set_auth_key(
    config: *mut rdmamig_config,
    key: *const u8,
    len: usize,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_config_set_auth_key";
        set(config, F, |c| {
            let key = bytes(key, len, F, "key")?;
            c.auth_key = if key.is_empty() { None } else { Some(AuthKey::new(key)?) };
            Ok(())
        })
    }
}

/// Destination: admit connections only from `prefix` (and the other
/// prefixes added): an IPv4 or IPv6 address, alone or with a prefix length
/// (`"198.18.0.2"`, `"198.18.0.0/24"`, `"fd00::/8"`). A request from any other
/// address is rejected before anything is set up for it, and the accept
/// keeps waiting. With no prefix added (the default) any address may
/// connect. This is no authentication (addresses can be forged on a shared
/// network): use it with `rdmamig_config_set_auth_key`.
#[no_mangle]
pub extern "C" fn rdmamig_config_allow_source(config: *mut rdmamig_config, prefix: *const c_char) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_config_allow_source";
        set(config, F, |c| {
            let prefix: SourcePrefix = string(prefix, F, "prefix")?.parse()?;
            c.allowed_sources.push(prefix);
            Ok(())
        })
    }
}

/// Source: the most bytes per second of RAM and stream to send (QEMU's
/// `max-bandwidth`), averaged over each busy stretch (idle time earns no
/// burst); 0 (the default): no cap. `rdmamig_conn_set_max_bandwidth` changes
/// it during a migration.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_max_bandwidth(
    config: *mut rdmamig_config,
    bytes_per_second: u64,
) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_max_bandwidth", |c| {
            c.max_bandwidth = (bytes_per_second != 0).then_some(bytes_per_second);
            Ok(())
        })
    }
}

/// Source: the most bytes of RAM that `rdmamig_conn_save`,
/// `rdmamig_conn_save_ranges` and `rdmamig_conn_save_bitmap` keep queued
/// ahead of the library's transfer thread. Past it, a call queues its pages
/// and then waits until the queue is back within the bound (or the
/// connection failed), instead of returning at once. 0 (the default): no
/// bound, every save returns at once. A hypervisor that ends an iteration
/// after a time (QEMU: 50 ms) sets a few MiB: on a link slower than its
/// loop, `rdmamig_conn_iteration_end` then waits for at most that much
/// instead of all the loop queued. Since 0.16.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_max_queued_bytes(config: *mut rdmamig_config, bytes: u64) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_max_queued_bytes", |c| {
            c.max_queued_bytes = (bytes != 0).then_some(bytes);
            Ok(())
        })
    }
}

/// The IP ToS byte of the connection's RoCEv2 packets: `DSCP << 2 | ECN`
/// (ECN 01 or 10 makes them ECN-capable). The source's value marks both
/// directions, data and ACKs: the destination's side of a connection takes
/// the traffic class of the connection request, so a destination's own value
/// changes nothing on RoCE (rdma_cm passes it on to iWARP listens). Which DSCP
/// a fabric maps to its lossless priority is site policy. 0 (the default)
/// leaves it to the kernel: the port's `default_roce_tos` in rdma_cm's
/// configfs, 0 unless changed, as for QEMU.
#[no_mangle]
pub extern "C" fn rdmamig_config_set_tos(config: *mut rdmamig_config, tos: u8) -> rdmamig_status {
    ffi_boundary! {
        set(config, "rdmamig_config_set_tos", |c| {
            c.tos = tos;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::try_from_ptr;
    use rdmamig_status::*;

    #[test]
    fn new_set_free() {
        let c = rdmamig_config_new();
        assert!(!c.is_null());
        assert_eq!(try_from_ptr(c as *const rdmamig_config), Some(&Config::default()));
        assert_eq!(rdmamig_config_set_pin_all(c, true), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_extensions(c, false), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_protocol_version(c, 7), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_timeout_ms(c, 1500), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_timeout_ms(c, 0), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_config_set_handshake_timeout_ms(c, 2000), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_handshake_timeout_ms(c, 0), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_config_set_liveness_ms(c, 2500), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_pin_budget(c, 64 << 20), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_unregister_worker(c, false), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_tos(c, 0x6a), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_return_path(c, true), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_max_bandwidth(c, 100 << 20), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_max_queued_bytes(c, 4 << 20), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_postcopy_recovery_ms(c, 20_000), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_postcopy_hypervisor_userfaultfd(c, true), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_postcopy_keep_blocked(c, true), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_postcopy_recovery_by_hypervisor(c, true), RDMAMIG_OK);
        let got = try_from_ptr(c as *const rdmamig_config).unwrap();
        assert_eq!(
            *got,
            Config {
                pin_all: true,
                extensions: false,
                protocol_version: 7,
                timeout: Duration::from_millis(1500),
                handshake_timeout: Duration::from_secs(2),
                liveness: Some(Duration::from_millis(2500)),
                pin_budget: Some(64 << 20),
                unregister_worker: false,
                auth_key: None,
                allowed_sources: Vec::new(),
                tos: 0x6a,
                return_path: true,
                max_bandwidth: Some(100 << 20),
                max_queued_bytes: Some(4 << 20),
                postcopy_recovery: Some(Duration::from_secs(20)),
                postcopy_recovery_by_hypervisor: true,
                hypervisor_userfaultfd: true,
                postcopy_keep_blocked: true,
            }
        );
        assert_eq!(rdmamig_config_set_liveness_ms(c, 0), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_pin_budget(c, 0), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_max_bandwidth(c, 0), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_max_queued_bytes(c, 0), RDMAMIG_OK);
        assert_eq!(rdmamig_config_set_postcopy_recovery_ms(c, 0), RDMAMIG_OK);
        let got = try_from_ptr(c as *const rdmamig_config).unwrap();
        assert_eq!((got.liveness, got.pin_budget, got.max_bandwidth, got.postcopy_recovery), (None, None, None, None));
        assert_eq!(got.max_queued_bytes, None);
        rdmamig_config_free(c);
    }

    #[test]
    fn auth_key_and_allowed_sources() {
        let c = rdmamig_config_new();
        let key = [7u8; 32];
        assert_eq!(rdmamig_config_set_auth_key(c, key.as_ptr(), 15), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_config_set_auth_key(c, std::ptr::null(), 16), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_auth_key(c, key.as_ptr(), 32), RDMAMIG_OK);
        assert_eq!(try_from_ptr(c as *const rdmamig_config).unwrap().auth_key, Some(AuthKey::new(&key).unwrap()));
        assert_eq!(rdmamig_config_set_auth_key(c, std::ptr::null(), 0), RDMAMIG_OK);
        assert_eq!(try_from_ptr(c as *const rdmamig_config).unwrap().auth_key, None);
        assert_eq!(rdmamig_config_allow_source(c, c"198.18.0.0/24".as_ptr()), RDMAMIG_OK);
        assert_eq!(rdmamig_config_allow_source(c, c"fd00::/8".as_ptr()), RDMAMIG_OK);
        assert_eq!(rdmamig_config_allow_source(c, c"198.18.0.0/40".as_ptr()), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_config_allow_source(c, std::ptr::null()), RDMAMIG_ERR_NULL_PARAMETER);
        let got = try_from_ptr(c as *const rdmamig_config).unwrap();
        assert_eq!(got.allowed_sources, ["198.18.0.0/24".parse().unwrap(), "fd00::/8".parse().unwrap()]);
        rdmamig_config_free(c);
    }

    #[test]
    fn null_config() {
        let n = std::ptr::null_mut();
        assert_eq!(rdmamig_config_set_pin_all(n, true), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_extensions(n, true), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_protocol_version(n, 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_timeout_ms(n, 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_liveness_ms(n, 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_postcopy_recovery_ms(n, 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_pin_budget(n, 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_unregister_worker(n, true), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_auth_key(n, std::ptr::null(), 0), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_allow_source(n, c"::1".as_ptr()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_tos(n, 0xb8), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_return_path(n, true), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_max_bandwidth(n, 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_max_queued_bytes(n, 1), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_postcopy_keep_blocked(n, true), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_config_set_postcopy_recovery_by_hypervisor(n, true), RDMAMIG_ERR_NULL_PARAMETER);
        rdmamig_config_free(n);
    }
}
