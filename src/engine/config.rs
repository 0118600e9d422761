//! Connection settings chosen by the hypervisor.

use std::time::Duration;

/// Settings for one side of a migration connection. Plain data: copy freely.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Source: ask the destination to register whole RAM blocks up front
    /// (QEMU's `x-rdma-pin-all`). Destination: allow the source to ask for it.
    pub pin_all: bool,
    /// Offer (source) or accept (destination) rdmamig's own protocol extensions.
    /// Off means behaving exactly as QEMU does on the wire.
    pub extensions: bool,
    /// Protocol version sent in the connection private data. Only tests change it.
    pub protocol_version: u32,
    /// Upper bound for every blocking wait (connect, accept, completion, peer message).
    pub timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config { pin_all: false, extensions: true, protocol_version: 1, timeout: Duration::from_secs(30) }
    }
}
