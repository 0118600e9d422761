//! How much a connection side may pin: its configured budget within what
//! RLIMIT_MEMLOCK leaves, and the error when the kernel refuses a pin.

use crate::engine::Config;
use crate::host::limits;
use crate::logging;
use crate::verbs::VerbsError;
use crate::wire::CONTROL_BUFFER_SIZE;
use crate::{Error, ErrorKind};

/// What a connection's control channel pins besides guest memory (three
/// buffers, each possibly straddling one more page than its size), kept out
/// of a budget derived from RLIMIT_MEMLOCK.
pub(crate) const CONTROL_PINNED: u64 = 3 * (CONTROL_BUFFER_SIZE as u64 + 2 * 4096);

/// The budget a connection side keeps: the configured one (`u64::MAX`:
/// none of its own), within what RLIMIT_MEMLOCK leaves after the control
/// channel; `None` is unlimited.
pub(super) fn effective_budget(configured: Option<u64>, memlock: Option<u64>) -> Option<u64> {
    let configured = configured.filter(|&c| c != u64::MAX);
    let kernel = memlock.map(|m| m.saturating_sub(CONTROL_PINNED));
    match (configured, kernel) {
        (Some(c), Some(k)) => Some(c.min(k)),
        (c, k) => c.or(k),
    }
}

/// The budget of a connection side with `config` in this process.
pub fn budget_for(config: &Config) -> Option<u64> {
    effective_budget(config.pin_budget, limits::memlock_limit())
}

/// The error for a failed registration of `len` bytes: `PinBudget` when the
/// kernel refused to pin (ENOMEM, EPERM: RLIMIT_MEMLOCK), else the verbs error.
pub(super) fn refusal(e: VerbsError, len: u64, pinned: u64) -> Error {
    if !limits::is_pin_refusal(&e) {
        return e.into();
    }
    logging::warn(format_args!(
        "the kernel refused to pin {len} more bytes ({e}) with {pinned} pinned (RLIMIT_MEMLOCK)"
    ));
    Error::new(
        ErrorKind::PinBudget,
        format!(
            "the kernel refused to pin {len} more bytes ({e}) with {pinned} pinned: {}; or lower the pin budget",
            limits::memlock_advice()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_the_smaller_of_config_and_memlock() {
        assert_eq!(effective_budget(None, None), None);
        assert_eq!(effective_budget(Some(64 << 20), None), Some(64 << 20));
        assert_eq!(effective_budget(None, Some(64 << 20)), Some((64 << 20) - CONTROL_PINNED));
        assert_eq!(effective_budget(Some(1 << 20), Some(64 << 20)), Some(1 << 20));
        assert_eq!(effective_budget(None, Some(4096)), Some(0));
        assert_eq!(effective_budget(Some(u64::MAX), None), None, "UINT64_MAX: no budget of its own");
        assert_eq!(effective_budget(Some(u64::MAX), Some(64 << 20)), Some((64 << 20) - CONTROL_PINNED));
    }
}
