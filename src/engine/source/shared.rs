//! What the source's handle (hypervisor threads) and its transfer thread
//! share: the queue between them, the counters, the closing flag, the
//! bandwidth cap and the readiness event.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use super::front::Front;
use crate::engine::postcopy::LinkWatch;
use crate::engine::ram::RamBlocks;
use crate::engine::stats::Counters;
use crate::engine::Config;
use crate::host::readiness::Readiness;

pub(super) struct Shared {
    pub front: Front,
    pub counters: Arc<Counters>,
    pub closing: AtomicBool,
    /// The bandwidth cap in bytes per second (0: none); the transfer thread paces by it.
    pub max_bandwidth: AtomicU64,
    /// Readable once the connection has failed (`Source::event_fd`): set
    /// right after `front.error`, by the transfer thread or `abort`.
    pub event: Readiness,
    /// Where post-copy's connection is (`wait_postcopy_link`), and the
    /// hypervisor's go for a recovery (`postcopy_recover`).
    pub postcopy_link: LinkWatch,
}

impl Shared {
    pub fn new(ram: RamBlocks, counters: Arc<Counters>, event: Readiness, config: &Config) -> Arc<Shared> {
        Arc::new(Shared {
            front: Front::new(ram, config.max_queued_bytes),
            counters,
            closing: AtomicBool::new(false),
            max_bandwidth: AtomicU64::new(config.max_bandwidth.unwrap_or(0)),
            event,
            postcopy_link: LinkWatch::new(config.postcopy_recovery_by_hypervisor),
        })
    }
}
