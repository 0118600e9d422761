//! What the destination's handle (hypervisor threads) and its service thread
//! share: the state the service reports (stream bytes, windows, the end),
//! the counters, the readiness event, post-copy's progress and fetches.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::engine::postcopy::{Fetches, LinkWatch, Progress};
use crate::engine::stats::Counters;
use crate::engine::Ending;
use crate::host::readiness::Readiness;
use crate::host::uffd::Userfault;
use crate::Result;

/// What the service thread tells the handle.
#[derive(Default)]
pub(super) struct State {
    pub stream: VecDeque<u8>,
    pub iterations: u64,
    /// The most windows a `wait_iteration` call has returned: windows past
    /// it keep the event fd readable.
    pub reported: u64,
    /// How the connection ended, once the service thread stopped.
    pub end: Option<Result<Ending>>,
    /// The hypervisor's userfaultfd, handed over for post-copy and not yet taken.
    pub userfaultfd: Option<SuppliedUserfault>,
    /// One was handed over (taken or not): a second is refused.
    pub userfaultfd_handed: bool,
}

/// The hypervisor's userfaultfd for post-copy (`Config::hypervisor_userfaultfd`),
/// as `Destination::postcopy_userfaultfd` hands it over: the descriptor, and
/// where each block of the registry lies in the address space of its process
/// (`None`: this one).
pub(super) struct SuppliedUserfault {
    pub uffd: Userfault,
    pub at: Option<Vec<u64>>,
}

impl State {
    /// Whether the event fd is readable: see `Destination::event_fd`.
    pub fn ready(&self) -> bool {
        !self.stream.is_empty() || self.iterations > self.reported || self.end.is_some()
    }
}

pub(super) struct Shared {
    pub state: Mutex<State>,
    pub changed: Condvar,
    pub counters: Arc<Counters>,
    pub event: Readiness,
    /// Post-copy's progress; phase changes are announced through `changed`.
    pub postcopy: Progress,
    /// The hypervisor's page requests during post-copy (`postcopy_fetch`).
    pub fetches: Fetches,
    /// Where post-copy's connection is (`wait_postcopy_link`), and the
    /// hypervisor's go for a recovery (`postcopy_recover`).
    pub postcopy_link: LinkWatch,
}

impl Shared {
    /// After `state` changed (its lock still held, so the fd and the state
    /// agree whenever it is free): wakes the waiters and updates the event fd.
    pub fn update(&self, state: &State) {
        self.event.set(state.ready());
        self.changed.notify_all();
    }
}
