//! QEMU RDMA migration protocol v1 codec: pure functions over byte slices.
