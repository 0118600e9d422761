//! How the link ended, as its connection events tell: a disconnect or a
//! device removal marks it lost. Waits report the loss only once the
//! completions that arrived before it are taken (the link's `check_events`).

use std::time::{Duration, Instant};

use crate::verbs::{CmEventKind, CmId};
use crate::{Error, ErrorKind, Result};

#[derive(Default)]
pub(super) struct Loss {
    /// The error every wait reports from now on.
    lost: Option<Error>,
    /// It was the peer's disconnect (not a device removal).
    closed_by_peer: bool,
}

impl Loss {
    pub(super) fn error(&self) -> Option<&Error> {
        self.lost.as_ref()
    }

    pub(super) fn is_lost(&self) -> bool {
        self.lost.is_some()
    }

    pub(super) fn closed_by_peer(&self) -> bool {
        self.closed_by_peer
    }

    /// Marks the link lost by this side's doing, unless it was already.
    pub(super) fn give_up(&mut self, why: &str) {
        self.lost.get_or_insert_with(|| Error::new(ErrorKind::Disconnected, why));
    }

    /// Takes the next event on `id`'s channel, waiting up to `wait` for one;
    /// returns whether there was one.
    pub(super) fn take_event(&mut self, id: &CmId, wait: Duration) -> Result<bool> {
        let Some(event) = id.channel().get_event(Some(wait))? else { return Ok(false) };
        let kind = event.kind();
        if matches!(kind, CmEventKind::Disconnected | CmEventKind::DeviceRemoval | CmEventKind::TimewaitExit) {
            self.closed_by_peer = kind != CmEventKind::DeviceRemoval;
            let why = match kind {
                CmEventKind::Disconnected => "the peer closed the connection, or its process ended",
                CmEventKind::DeviceRemoval => "the RDMA device was removed",
                _ => "the connection was torn down",
            };
            self.lost = Some(Error::new(ErrorKind::Disconnected, format!("connection lost: {why} ({kind:?} event)")));
        }
        Ok(true)
    }

    /// Takes the events waiting on `id` until one says the link is lost.
    pub(super) fn take_events(&mut self, id: &CmId) -> Result<()> {
        while self.lost.is_none() && self.take_event(id, Duration::ZERO)? {}
        Ok(())
    }

    /// Waits up to `grace` for the link to be lost; its error, if it was.
    pub(super) fn within(&mut self, id: &CmId, grace: Duration) -> Result<Option<Error>> {
        let deadline = Instant::now() + grace;
        while self.lost.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.take_event(id, left)?;
        }
        Ok(self.lost.clone())
    }
}
