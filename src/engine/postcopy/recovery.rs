//! What post-copy needs to get a lost connection back, and which failures
//! it may get back from.

use std::time::Duration;

use super::LinkWatch;
use crate::engine::Config;
use crate::wire::PostcopyRecovery;
use crate::{Error, ErrorKind};

/// How a destination's post-copy gets a lost connection back: its own
/// config (`postcopy_recovery`, the window), where its source listens
/// (POSTCOPY_RECOVERY) and what the hypervisor follows and says of it.
pub(crate) struct Recovery<'a> {
    pub config: &'a Config,
    pub window: Duration,
    pub source: PostcopyRecovery,
    pub watch: &'a LinkWatch,
}

/// Whether a post-copy connection that failed with `e` may be got back:
/// the transport failed or the peer went silent; not the peer's ERROR, nor
/// the hypervisor's abort, nor a malformed message or a local fault.
pub(crate) fn recoverable(e: &Error) -> bool {
    matches!(e.kind, ErrorKind::Disconnected | ErrorKind::Verbs | ErrorKind::Timeout)
}
