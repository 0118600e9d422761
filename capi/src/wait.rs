//! The timeouts of the calls that wait (`rdmamig_listener_accept`,
//! `rdmamig_conn_get`, `rdmamig_conn_wait_*`, `rdmamig_conn_postcopy_fetch`):
//! `RDMAMIG_WAIT_FOREVER`, `RDMAMIG_NO_WAIT` or milliseconds.

use std::time::Duration;

/// `timeout_ms` of `rdmamig_listener_accept`, `rdmamig_conn_get`,
/// `rdmamig_conn_wait_iteration`, `rdmamig_conn_wait_end` and
/// `rdmamig_conn_wait_postcopy`: wait for ever
/// (the meaning 0 always had).
pub const RDMAMIG_WAIT_FOREVER: u32 = 0;

/// `timeout_ms` of `rdmamig_listener_accept`, `rdmamig_conn_get`,
/// `rdmamig_conn_wait_iteration`, `rdmamig_conn_wait_end` and
/// `rdmamig_conn_wait_postcopy`: do not wait.
/// The call returns what is ready, or `RDMAMIG_ERR_WOULD_BLOCK` at once; for
/// an event loop, with `rdmamig_listener_event_fd` and
/// `rdmamig_conn_event_fd`. (UINT32_MAX: 0 already meant "for ever", and
/// a real wait of 49.7 days is not one anybody asks for.)
pub const RDMAMIG_NO_WAIT: u32 = u32::MAX;

/// The C convention of the connection's waits: `RDMAMIG_WAIT_FOREVER` (0)
/// for ever, `RDMAMIG_NO_WAIT` not at all (the engine's `Duration::ZERO`),
/// else milliseconds.
pub(crate) fn wait_of(ms: u32) -> Option<Duration> {
    match ms {
        RDMAMIG_WAIT_FOREVER => None,
        RDMAMIG_NO_WAIT => Some(Duration::ZERO),
        ms => Some(Duration::from_millis(u64::from(ms))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits() {
        assert_eq!(wait_of(RDMAMIG_WAIT_FOREVER), None);
        assert_eq!(wait_of(RDMAMIG_NO_WAIT), Some(Duration::ZERO));
        assert_eq!(wait_of(1500), Some(Duration::from_millis(1500)));
        assert_eq!(wait_of(u32::MAX - 1), Some(Duration::from_millis(u64::from(u32::MAX - 1))));
    }
}
