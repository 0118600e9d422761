//! The source side: a hypervisor thread hands RAM ranges and stream bytes to
//! the transfer thread through a lock-free queue (`front`: the checks, the
//! window and the queue; `handle`: the calls); the transfer thread
//! (`transfer`) owns the connection, has chunks registered within the pin
//! budgets (`chunk_table`, `registration`), posts RDMA WRITEs
//! (`write_window`) and sends control messages.

mod chunk_table;
mod command;
#[cfg(feature = "bench-internals")]
pub(crate) mod cpu_path;
pub(crate) mod front;
mod handle;
mod pacing;
mod piece;
pub(crate) mod postcopy;
mod registration;
mod save_range;
mod shared;
mod sparse;
mod staging;
mod transfer;
mod write_window;
mod zeros;

pub use handle::Source;
pub(crate) use registration::REGISTER_BATCH;
pub use save_range::SaveRange;
