//! Record and replay a migration: a debugging tool on the public API.
//!
//! [`Recording::record`] serves one source as a destination and keeps what
//! it sent: every stream byte, each iteration window's place in the stream
//! with the ranges registered or zeroed in it, the RAM-block list, and the
//! final RAM. [`Recording::replay`] is a source that sends it again: the
//! stream bytes in order, each window opened and closed at its recorded
//! stream position, so a destination that parses the stream (QEMU's) sees
//! what the recorded source sent. A QEMU source recorded by rdmamig and
//! replayed into a QEMU destination is how the QEMU-compatible source is
//! checked against QEMU itself.
//!
//! A destination cannot see RDMA WRITEs into memory it registered earlier,
//! so the replay cannot know what each window wrote. But a source writes
//! only into ranges it had registered (dynamic: REGISTER; pin-all: whole
//! blocks, at the RAM-blocks exchange), so the replay writes the final RAM
//! of every range registered or zeroed in a window during that window, and
//! the destination ends up with the recorded final RAM; what it holds
//! between windows differs from the original migration (no destination
//! checks that).
//!
//! The file format ([`Recording::write_to`]) is versioned; see `format`.
mod contents;
mod format;
mod record;
mod replay;

pub use contents::{RangeKind, RecordedBlock, RecordedRange, RecordedWindow, Recording};
pub use format::FORMAT_VERSION;
pub use record::BlockLayout;
