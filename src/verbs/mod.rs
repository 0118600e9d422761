//! Thin RAII wrappers over libibverbs/librdmacm; the only place with raw verbs calls.
//!
//! Modelled on jonhoo/rust-ibverbs and rdma-core's naming, but ownership goes
//! through [`Arc`](std::sync::Arc) instead of lifetimes so the engine can keep
//! these objects in long-lived structs. Every child holds an `Arc` of each
//! parent it needs, so destruction order is right by construction:
//!
//! ```text
//! EventChannel <- CmId <- ProtectionDomain <- MemoryRegion
//!                      <- CompletionChannel <- CompletionQueue
//!                      <- QueuePair (also holds the PD and both CQs)
//! CmEvent holds the CmId it is about, so it is always acked before that id is destroyed.
//! ```
//!
//! The verbs context (`ibv_context`) used for PDs/CQs/QPs is the one librdmacm
//! opened for the device the `CmId` is bound to; holding the `CmId` keeps it alive.
//!
//! # Thread safety
//!
//! All types are `Send + Sync`. rdma-core's libibverbs and librdmacm are
//! thread-safe: providers serialise posting and polling on a QP/CQ with their
//! own locks (rxe: per-queue spinlocks), object creation/destruction goes
//! through the kernel's uverbs/ucma command interfaces (which lock per file
//! and per object), and librdmacm protects each id's event accounting with a
//! mutex. The wrappers add no unsynchronised interior state of their own (the
//! CQ's small completion stash is behind a mutex). What the libraries do *not*
//! make safe is destroying an object while it is in use; the `Arc` ownership
//! rules that out.
//!
//! # Errors
//!
//! Every failure is a [`VerbsError`]: the name of the C function that failed
//! and the errno it reported. Posting to a full send queue gives
//! `errno == ENOMEM` ([`VerbsError::is_queue_full`]); wait for completions and retry.

pub mod sys;

mod address;
mod cm;
mod cq;
mod device;
mod error;
mod fd;
mod mem;
mod qp;

pub use address::resolve;
pub use cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel};
pub use cq::{CompletionChannel, CompletionQueue, WorkCompletion};
pub use device::{device_names, Context, DeviceAttr, Gid, GidType, LinkLayer, PortAttr, PortState};
pub use error::{Result, VerbsError};
pub use mem::{fork_init, Access, ForkMode, MemoryRegion, ProtectionDomain};
pub use qp::{QpCaps, QueuePair, Sge, WriteList};
