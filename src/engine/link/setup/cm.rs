//! What both sides' setup shares: the config's check, name resolution,
//! the QP's transport settings, and waiting for a connection event.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::engine::link::connection::EVENT_POLL_INTERVAL;
use crate::engine::Config;
use crate::verbs::{self, CmEventKind, CmId, EventChannel};
use crate::{Error, ErrorKind, Result};

/// Transport retries of an unacknowledged packet before the QP fails (QEMU's 5).
pub(super) const RETRY_COUNT: u8 = 5;

/// An RNR retry count of 7: a SEND that finds no receive posted is retried until one is.
pub(super) const RNR_RETRY_FOREVER: u8 = 7;

/// librdmacm's RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH: the device's maximum.
pub(super) const MAX_RD_ATOMIC: u8 = 0xff;

/// A key needs the extensions: authentication is one of them.
pub(super) fn check_auth_config(config: &Config) -> Result<()> {
    if config.auth_key.is_some() && !config.extensions {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "peer authentication is an rdmamig extension: it needs the extensions on",
        ));
    }
    Ok(())
}

pub(super) fn version_error(ours: u32, theirs: u32) -> Error {
    Error::new(ErrorKind::Version, format!("the peer speaks RDMA migration protocol version {theirs}, we speak {ours}"))
}

/// `host:port` as addresses, waiting at most `timeout` for the resolver.
pub(super) fn resolve(host: &str, port: u16, timeout: Duration) -> Result<Vec<SocketAddr>> {
    verbs::resolve(host, port, timeout)
        .map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::TimedOut { ErrorKind::Timeout } else { ErrorKind::Connect };
            Error::new(kind, format!("cannot resolve '{host}': {e}"))
        })
        .and_then(|a| {
            if a.is_empty() {
                Err(Error::new(ErrorKind::Connect, format!("'{host}' has no address")))
            } else {
                Ok(a)
            }
        })
}

/// Sets the QP's ACK timeout from the liveness time (see [`ack_timeout_exponent`]);
/// without liveness, rdma_cm's default stays.
pub(super) fn set_ack_timeout(id: &CmId, config: &Config) -> Result<()> {
    match config.liveness {
        Some(liveness) => Ok(id.set_ack_timeout(ack_timeout_exponent(liveness))?),
        None => Ok(()),
    }
}

/// Marks the connection's packets with `Config::tos`: read by the kernel at
/// route resolution (connecting side; the passive side follows the traffic
/// class of the request) and passed on to iWARP listens. 0 leaves the id
/// unset, since setting 0 would override the port's configured default.
pub(super) fn set_tos(id: &CmId, config: &Config) -> Result<()> {
    if config.tos != 0 {
        id.set_tos(config.tos)?;
    }
    Ok(())
}

/// The QP's ACK timeout, as the exponent e of 4.096 µs × 2^e: the QP gives up
/// on an unacknowledged packet after `RETRY_COUNT + 1` timeouts, which should
/// take at most half the liveness time; but one timeout never drops below
/// 0.27 s (2^16), so a slow software link is not declared dead, nor rises
/// above 4.3 s (2^20).
fn ack_timeout_exponent(liveness: Duration) -> u8 {
    let per_try_ns = liveness.as_nanos() / 2 / (u128::from(RETRY_COUNT) + 1);
    let mut exponent = 16u8;
    while exponent < 20 && 4096u128 << (exponent + 1) <= per_try_ns {
        exponent += 1;
    }
    exponent
}

/// The next connection event on `channel`, within `deadline` (`what` names
/// the step for a timeout), unless `stop` is set (looked at every
/// [`EVENT_POLL_INTERVAL`]).
pub(super) fn wait_event(
    channel: &EventChannel,
    deadline: Instant,
    what: &str,
    stop: Option<&AtomicBool>,
) -> Result<verbs::CmEvent> {
    loop {
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Err(Error::new(ErrorKind::Aborted, format!("aborted while waiting for {what}")));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(ErrorKind::Timeout, format!("timed out waiting for {what}")));
        }
        let slice = if stop.is_some() { left.min(EVENT_POLL_INTERVAL) } else { left };
        if let Some(event) = channel.get_event(Some(slice))? {
            return Ok(event);
        }
    }
}

pub(super) fn expect_event(
    channel: &EventChannel,
    kind: CmEventKind,
    deadline: Instant,
    stop: Option<&AtomicBool>,
) -> Result<()> {
    let event = wait_event(channel, deadline, &format!("a connection event ({kind:?})"), stop)?;
    if event.kind() != kind {
        return Err(Error::new(
            ErrorKind::Connect,
            format!("expected {kind:?}, got {:?} (status {})", event.kind(), event.status()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_fits_half_the_liveness_within_bounds() {
        let e = |ms| ack_timeout_exponent(Duration::from_millis(ms));
        // 6 tries of 4.096 µs × 2^e fit in half the liveness: the steps lie at 12 × 4.096 µs × 2^e.
        assert_eq!(e(10_000), 17, "the default: 6 × 0.54 s = 3.2 s ≤ 5 s");
        assert_eq!((e(6_442), e(6_443)), (16, 17));
        assert_eq!((e(12_884), e(12_885)), (17, 18));
        assert_eq!((e(51_539), e(51_540)), (19, 20));
        // Clamped: never below 0.27 s per try, never above 4.3 s.
        assert_eq!((e(1), e(3_000)), (16, 16));
        assert_eq!(e(3_600_000), 20);
    }
}
