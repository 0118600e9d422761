//! Tests that need a real RDMA device (rxe0 in the test guest, or a real NIC).
//! Build on the host, run in the guest:
//!
//! ```text
//! cargo test --release --features rdma-tests --test rdma --no-run
//! /work/shared/rxe-vm/run-in-rxe-vm.sh 'target/release/deps/rdma-* --test-threads=1'
//! ```
//!
//! Environment: `RXE_VM_IP` (address of the RDMA netdev, default 198.18.0.1),
//! `RXE_VM_DEV` (device name, default rxe0).

mod abort;
mod auth;
mod batch;
mod child;
mod event;
mod hints;
mod hostile;
mod hostile_source;
mod hypervisor_uffd;
mod killpoints;
mod liveness;
mod load;
mod memory;
mod migration;
mod pin_all;
mod pinning;
mod postcopy;
mod qemu;
mod relay;
mod replay;
mod setup;
mod smoke;
mod sparse;
mod tos;
mod window_order;
