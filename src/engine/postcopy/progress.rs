//! Where a destination's post-copy is, and its counters.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::engine::stats::Field;

/// Where a destination's post-copy is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum PostcopyPhase {
    /// No POSTCOPY message yet.
    #[default]
    Idle = 0,
    /// The stale pages are dropped and faults are served: vCPUs may run.
    Running = 1,
    /// Every stale page is installed; POSTCOPY_DONE was sent.
    Done = 2,
}

/// `define_progress!` below is the one list of post-copy's counters, each
/// with its doc: it makes [`PostcopyProgress`], [`Progress`] and
/// [`PostcopyProgress::FIELDS`], from which the C ABI (capi/) generates the
/// counters of its `rdmamig_postcopy_progress`. A new counter goes at the end
/// of the list, and nowhere else (the C struct is versioned by size).
macro_rules! define_progress {
    ($($(#[doc = $doc:literal])* $field:ident,)*) => {
        /// A destination's post-copy progress ([`Destination::postcopy_progress`](crate::engine::Destination::postcopy_progress)).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct PostcopyProgress {
            pub phase: PostcopyPhase,
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        /// The live counters behind [`PostcopyProgress`], updated by the post-copy thread.
        #[derive(Default)]
        pub(crate) struct Progress {
            phase: AtomicU8,
            $(pub $field: AtomicU64,)*
        }

        impl PostcopyProgress {
            /// Each counter's name and doc, in order (for interfaces that
            /// mirror [`PostcopyProgress`], such as the C ABI's
            /// `rdmamig_postcopy_progress`).
            pub const FIELDS: &'static [Field] = &[$(Field { name: stringify!($field), doc: concat!($($doc, "\n"),*) }),*];

            /// The counters' values, in the order of [`PostcopyProgress::FIELDS`].
            pub fn values(&self) -> [u64; Self::FIELDS.len()] {
                [$(self.$field),*]
            }
        }

        impl Progress {
            pub fn snapshot(&self) -> PostcopyProgress {
                let phase = match self.phase.load(Ordering::Acquire) {
                    0 => PostcopyPhase::Idle,
                    1 => PostcopyPhase::Running,
                    _ => PostcopyPhase::Done,
                };
                PostcopyProgress { phase, $($field: self.$field.load(Ordering::Relaxed),)* }
            }
        }
    };
}

define_progress! {
    /// Stale pages the source announced.
    pages_total,
    /// Stale pages not installed yet.
    pages_remaining,
    /// Faults served with an RDMA READ of their own.
    faults_served,
    /// Stale pages found present when they were to be installed (a vCPU's
    /// fault, or another install, got there first): skipped, never overwritten.
    pages_skipped,
    /// Bytes read from the source.
    bytes_pulled,
    /// Lost connections post-copy got back (`Config::postcopy_recovery`,
    /// in C `rdmamig_config_set_postcopy_recovery_ms`).
    recoveries,
}

impl Progress {
    pub(crate) fn set_phase(&self, p: PostcopyPhase) {
        self.phase.store(p as u8, Ordering::Release);
    }
}
