//! Liveness: a zero-length RDMA WRITE when nothing was heard from the peer
//! for a third of the liveness time, and a failure when one stays
//! unacknowledged for two thirds of it. The peer's NIC answers it without
//! its software seeing anything, so this works against a QEMU peer too.

use std::time::{Duration, Instant};

use super::work::Work;
use crate::verbs::QueuePair;
use crate::{Error, ErrorKind, Result};

pub(super) struct Liveness {
    /// The liveness time; `None`: no probes.
    within: Option<Duration>,
    /// When the outstanding probe was posted.
    probe_posted: Option<Instant>,
    /// Last completion of any kind: the peer's NIC was there.
    last_heard: Instant,
}

impl Liveness {
    pub(super) fn new(within: Option<Duration>) -> Liveness {
        Liveness { within, probe_posted: None, last_heard: Instant::now() }
    }

    /// Whether probes are on (a failure says it was theirs).
    pub(super) fn is_on(&self) -> bool {
        self.within.is_some()
    }

    /// A work request completed: the peer's NIC answered.
    pub(super) fn heard(&mut self, work: Work) {
        self.last_heard = Instant::now();
        if work == Work::Probe {
            self.probe_posted = None;
        }
    }

    /// Posts a probe on `qp` when one is due; fails when the last one went
    /// unanswered too long.
    pub(super) fn check(&mut self, qp: &QueuePair) -> Result<()> {
        let Some(within) = self.within else {
            return Ok(());
        };
        let now = Instant::now();
        match self.probe_posted {
            Some(at) if now.duration_since(at) > within * 2 / 3 => Err(Error::new(
                ErrorKind::Disconnected,
                format!(
                    "the peer has not answered for {:?} (liveness probe unacknowledged)",
                    now.duration_since(self.last_heard)
                ),
            )),
            None if now.duration_since(self.last_heard) >= within / 3 => {
                qp.post_zero_write(Work::Probe.id(), true)?;
                self.probe_posted = Some(now);
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
