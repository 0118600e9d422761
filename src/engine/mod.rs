//! Source and destination state machines, control channel, RAM chunks.
//!
//! Threads: each connection has one library thread that owns its verbs
//! objects: the source's transfer thread (fed by a lock-free queue) and the
//! destination's service thread. Hypervisor threads only queue work and wait.
//! Two more do pinning work off those threads (`pin`): the process-wide
//! unregistration worker, and a connection's pin-all registration thread.

pub mod auth;
pub mod config;
pub(crate) mod destination;
pub mod device;
mod ending;
pub(crate) mod link;
pub(crate) mod pin;
pub(crate) mod postcopy;
pub mod ram;
pub(crate) mod source;
pub mod stats;
mod sync;
mod validate;

pub use auth::{AuthKey, SourcePrefix};
pub use config::Config;
pub use destination::{Destination, Event, Observer, Read};
pub use ending::Ending;
pub use link::{Listener, Negotiated};
pub use pin::{Hint, Unregistration};
pub use postcopy::{PostcopyLink, PostcopyPhase, PostcopyProgress, PostcopySummary, StalePages};
pub use ram::{RamBlock, RamBlocks, Run};
pub use source::{SaveRange, Source};
pub use stats::Stats;
