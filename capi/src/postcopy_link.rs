//! Post-copy's connection for the hypervisor's own states (paused,
//! recovering): `rdmamig_conn_wait_postcopy_link`, and the hypervisor's go
//! for a recovery, `rdmamig_conn_postcopy_recover`. The logic is the
//! engine's (`Source::wait_postcopy_link`, `Destination::postcopy_recover`).

use super::conn::{rdmamig_conn, run};
use super::last_error::Failure;
use super::status::rdmamig_status;
use super::wait::wait_of;
use rdmamig::{Error, ErrorKind, PostcopyLink};

/// Where post-copy's connection is (`rdmamig_conn_wait_postcopy_link`).
/// The values are part of the ABI and only ever added to.
//
// The one list of these states in the C API: the engine's `PostcopyLink`
// converts to it with an exhaustive match (`link_of`), and the C values come
// from it (cbindgen).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum rdmamig_postcopy_link {
    /// Connected: before post-copy, during it, and again after a recovery.
    RDMAMIG_POSTCOPY_LINK_UP = 0,
    /// Lost during post-copy, with recovery on
    /// (`rdmamig_config_set_postcopy_recovery_ms` on both sides): with
    /// `rdmamig_config_set_postcopy_recovery_by_hypervisor` it waits for
    /// `rdmamig_conn_postcopy_recover`, otherwise it goes on to
    /// `RDMAMIG_POSTCOPY_LINK_RECOVERING` at once. QEMU's "postcopy-paused".
    RDMAMIG_POSTCOPY_LINK_LOST = 1,
    /// The destination reconnects to the source, the source waits for it.
    /// QEMU's "postcopy-recover".
    RDMAMIG_POSTCOPY_LINK_RECOVERING = 2,
    /// The connection ended: post-copy done, or the connection failed (the
    /// other calls say how; without recovery a loss ends here at once, not
    /// in `RDMAMIG_POSTCOPY_LINK_LOST`). Final.
    RDMAMIG_POSTCOPY_LINK_ENDED = 3,
}

impl rdmamig_postcopy_link {
    /// Every value, in numeric order.
    const ALL: [rdmamig_postcopy_link; 4] = {
        use rdmamig_postcopy_link::*;
        [
            RDMAMIG_POSTCOPY_LINK_UP,
            RDMAMIG_POSTCOPY_LINK_LOST,
            RDMAMIG_POSTCOPY_LINK_RECOVERING,
            RDMAMIG_POSTCOPY_LINK_ENDED,
        ]
    };

    /// The engine's state for a C value (`None`: not a state). A value from
    /// C goes through this (an out-of-range enum value is UB in Rust).
    fn engine(v: u32) -> Option<PostcopyLink> {
        Self::ALL.iter().find(|l| **l as u32 == v).map(|l| match l {
            Self::RDMAMIG_POSTCOPY_LINK_UP => PostcopyLink::Up,
            Self::RDMAMIG_POSTCOPY_LINK_LOST => PostcopyLink::Lost,
            Self::RDMAMIG_POSTCOPY_LINK_RECOVERING => PostcopyLink::Recovering,
            Self::RDMAMIG_POSTCOPY_LINK_ENDED => PostcopyLink::Ended,
        })
    }
}

/// The C value of an engine state.
fn link_of(l: PostcopyLink) -> rdmamig_postcopy_link {
    match l {
        PostcopyLink::Up => rdmamig_postcopy_link::RDMAMIG_POSTCOPY_LINK_UP,
        PostcopyLink::Lost => rdmamig_postcopy_link::RDMAMIG_POSTCOPY_LINK_LOST,
        PostcopyLink::Recovering => rdmamig_postcopy_link::RDMAMIG_POSTCOPY_LINK_RECOVERING,
        PostcopyLink::Ended => rdmamig_postcopy_link::RDMAMIG_POSTCOPY_LINK_ENDED,
    }
}

/// Either side: waits (at most `timeout_ms` milliseconds;
/// `RDMAMIG_WAIT_FOREVER` (0) waits for ever, `RDMAMIG_NO_WAIT` not at all)
/// until post-copy's connection is in another state than `known` (an
/// `rdmamig_postcopy_link` value), and stores the state then in `*link_out`.
/// For a hypervisor that shows its own migration states (QEMU: active,
/// paused, recover), from a thread of its own: on a source the thread in
/// `rdmamig_conn_postcopy` is blocked meanwhile, on a destination the
/// library's. Call it with the state it returned last, from
/// `RDMAMIG_POSTCOPY_LINK_UP` on, until `RDMAMIG_POSTCOPY_LINK_ENDED`
/// (which comes when the connection ends, with or without post-copy; a
/// short recovery may go from `RDMAMIG_POSTCOPY_LINK_LOST` back to
/// `RDMAMIG_POSTCOPY_LINK_UP` between two calls). Join that thread before
/// `rdmamig_conn_free`.
///
/// Returns `RDMAMIG_OK` with `*link_out` set; `RDMAMIG_ERR_TIMEOUT` when the
/// wait ran out, `RDMAMIG_ERR_WOULD_BLOCK` with `RDMAMIG_NO_WAIT`, with the
/// state still `known` (`*link_out` is then `known`);
/// `RDMAMIG_ERR_NULL_PARAMETER`; `RDMAMIG_ERR_INVALID_ARGUMENT` for an
/// unknown `known`; `RDMAMIG_ERR_STATE` after `rdmamig_conn_close`.
///
/// Thread safety: may run concurrently with other `const` uses of `conn`,
/// from any thread.
#[no_mangle]
pub extern "C" fn rdmamig_conn_wait_postcopy_link(
    conn: *const rdmamig_conn,
    known: u32,
    timeout_ms: u32,
    link_out: *mut rdmamig_postcopy_link,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_wait_postcopy_link";
        run(conn, F, |c| {
            if link_out.is_null() {
                return Err(Failure::null(F, "link_out"));
            }
            let Some(known) = rdmamig_postcopy_link::engine(known) else {
                return Err(Failure::invalid(format!("{F}: unknown state {known}")));
            };
            let timeout = wait_of(timeout_ms);
            let link = c.wait_postcopy_link(F, known, timeout)?;
            // SAFETY: checked non-NULL above; the caller provides a writable `rdmamig_postcopy_link`.
            unsafe { link_out.write(link_of(link)) };
            if link == known {
                let kind = if timeout.is_some_and(|t| t.is_zero()) { ErrorKind::WouldBlock } else { ErrorKind::Timeout };
                return Err(Error::new(kind, format!("{F}: post-copy's connection is still {known:?}")).into());
            }
            Ok(())
        })
    }
}

/// Either side, with `rdmamig_config_set_postcopy_recovery_by_hypervisor`,
/// once post-copy's connection was lost (`RDMAMIG_POSTCOPY_LINK_LOST`): lets
/// its recovery begin (the state becomes `RDMAMIG_POSTCOPY_LINK_RECOVERING`).
/// A destination then reconnects to the source (every half second, within
/// what is left of the window), a source then admits the destination's
/// recovery connection; the recovery completes once both sides called it
/// (QEMU: `migrate-recover` on the destination, `migrate` with `resume` on
/// the source). The window (`rdmamig_config_set_postcopy_recovery_ms`)
/// counts from the loss, the wait for this call included.
///
/// Returns `RDMAMIG_OK`; `RDMAMIG_ERR_NULL_PARAMETER`; `RDMAMIG_ERR_STATE`
/// without the setting, when the connection is not lost (up, recovering
/// already, or ended), or after `rdmamig_conn_close`.
///
/// Thread safety: may run concurrently with other `const` uses of `conn`,
/// from any thread.
#[no_mangle]
pub extern "C" fn rdmamig_conn_postcopy_recover(conn: *const rdmamig_conn) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_conn_postcopy_recover";
        run(conn, F, |c| Ok(c.postcopy_recover(F)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::Connection;
    use crate::handle::to_boxed_mut_ptr;
    use crate::status::rdmamig_status::*;

    #[test]
    fn every_state_converts_both_ways() {
        for l in rdmamig_postcopy_link::ALL {
            assert_eq!(link_of(rdmamig_postcopy_link::engine(l as u32).unwrap()), l);
        }
        assert_eq!(rdmamig_postcopy_link::engine(4), None);
    }

    /// The checked-in header has the same states (it is generated: `make header`).
    #[test]
    fn link_values_match_header() {
        let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/rdmamig.h")).unwrap();
        let in_header: Vec<String> = header
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("RDMAMIG_POSTCOPY_LINK_"))
            .map(String::from)
            .collect();
        let in_rust: Vec<String> =
            rdmamig_postcopy_link::ALL.iter().map(|l| format!("{l:?} = {},", *l as u32)).collect();
        assert_eq!(in_header, in_rust);
    }

    #[test]
    fn arguments_are_checked() {
        let mut link = rdmamig_postcopy_link::RDMAMIG_POSTCOPY_LINK_UP;
        let null = std::ptr::null();
        assert_eq!(rdmamig_conn_wait_postcopy_link(null, 0, 0, &mut link), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_postcopy_recover(null), RDMAMIG_ERR_NULL_PARAMETER);
        let conn = to_boxed_mut_ptr::<rdmamig_conn>(Connection::closed());
        assert_eq!(rdmamig_conn_wait_postcopy_link(conn, 0, 0, std::ptr::null_mut()), RDMAMIG_ERR_NULL_PARAMETER);
        assert_eq!(rdmamig_conn_wait_postcopy_link(conn, 9, 0, &mut link), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_conn_wait_postcopy_link(conn, 0, 0, &mut link), RDMAMIG_ERR_STATE);
        assert_eq!(rdmamig_conn_postcopy_recover(conn), RDMAMIG_ERR_STATE);
        crate::conn::rdmamig_conn_free(conn);
    }
}
