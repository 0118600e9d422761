//! Whether registered memory survives the process's `fork()`, settled once
//! per process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::Unregistration;
use crate::logging;
use crate::verbs::{self, ForkMode};

/// The process's fork safety, settled once before its first verbs object:
/// `ibv_fork_init()` where the kernel does not copy pinned pages at fork.
pub fn fork_mode() -> ForkMode {
    static MODE: OnceLock<ForkMode> = OnceLock::new();
    static WARNED: AtomicBool = AtomicBool::new(false);
    let mode = *MODE.get_or_init(verbs::fork_init);
    // Logged outside the initialisation: a log hook may call back into the
    // library (and so here) without finding the OnceLock still being set.
    if mode == ForkMode::Disabled && !WARNED.swap(true, Ordering::Relaxed) {
        logging::warn(format_args!(
            "fork safety is off: the kernel does not copy pinned pages at fork and ibv_fork_init came too late \
             (set RDMAV_FORK_SAFE=1 before the first verbs use)"
        ));
    }
    mode
}

/// At a connection's close: waits for the deregistrations it queued on
/// `worker` when rdma-core's fork support is on. Deregistering a range then
/// also `madvise`s it (MADV_DOFORK, in `ibv_dereg_mr`), which must not reach
/// memory the hypervisor unmaps or maps anew once close has returned.
/// Otherwise they go on in the background.
pub fn settle_at_close(worker: Option<&Unregistration>) {
    if let (Some(w), ForkMode::Enabled) = (worker, fork_mode()) {
        w.flush();
    }
}
