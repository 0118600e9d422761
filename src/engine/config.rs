//! Connection settings chosen by the hypervisor.

use std::time::Duration;

use super::auth::{AuthKey, SourcePrefix};

/// The default of [`Config::liveness`].
pub const DEFAULT_LIVENESS: Duration = Duration::from_secs(10);
/// The default `Config::handshake_timeout`: QEMU's own source gives its
/// return-path connection 5 s.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings for one side of a migration connection. Plain data: copy freely
/// (a key is wiped when its last copy drops, and `Debug` never shows it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Source: ask the destination to register whole RAM blocks up front
    /// (QEMU's `x-rdma-pin-all`). Destination: allow the source to ask for it.
    pub pin_all: bool,
    /// Offer (source) or accept (destination) rdmamig's own protocol extensions.
    /// Off means behaving exactly as QEMU does on the wire.
    pub extensions: bool,
    /// Protocol version sent in the connection private data. Only tests
    /// change it (to check that a mismatch is refused): not part of the
    /// documented API, as its C setter is not in the public header.
    #[doc(hidden)]
    pub protocol_version: u32,
    /// Upper bound for every blocking wait (name resolution, connect, accept
    /// handshake, completion, peer message); a destination's wait for the
    /// source's next message has none (the source may pause between rounds):
    /// `liveness` covers it.
    pub timeout: Duration,
    /// Destination: how long one connection request may take from the
    /// request to an admitted source (the connection established and, with a
    /// key, the source's proof in), at most `timeout`. A peer that connects
    /// and stays silent is dropped then; meanwhile the listener goes on
    /// taking other requests, so it cannot hold up the real source.
    pub handshake_timeout: Duration,
    /// A peer that stops answering is declared gone within this time, even
    /// with no connection event and no call waiting (`None`: never, as QEMU).
    /// While the connection is idle, each side sends a zero-length RDMA WRITE
    /// every third of it, which the peer's NIC answers without its software
    /// seeing anything; the QP's ACK timeout is derived from it too.
    pub liveness: Option<Duration>,
    /// Bytes of guest memory this side may keep registered (pinned) at once.
    /// `None`: RLIMIT_MEMLOCK decides (unlimited when it is infinite or the
    /// process has CAP_IPC_LOCK); a value is kept within it too. A source
    /// unpins least-recently-used chunks to stay under it (and under the
    /// budget an rdmamig destination announces); a destination refuses a
    /// source that asks for more. Pin-all is dropped at connect when the
    /// budget cannot hold all guest RAM.
    pub pin_budget: Option<u64>,
    /// Deregister memory on the process's unregistration worker thread
    /// rather than on the connection's own thread.
    pub unregister_worker: bool,
    /// Pre-shared key (rdmamig extension; needs `extensions`): the source
    /// proves it to the destination and the destination to the source over
    /// fresh nonces before any guest memory is registered. A side with a key
    /// refuses a peer without one (so it never talks to QEMU); a side without
    /// a key behaves as before.
    pub auth_key: Option<AuthKey>,
    /// Destination: the source addresses a listener admits (empty: any). A
    /// request from elsewhere is rejected before anything is set up for it.
    pub allowed_sources: Vec<SourcePrefix>,
    /// The IP ToS byte of the connection's RoCEv2 packets (`DSCP << 2 |
    /// ECN`), set with `RDMA_OPTION_ID_TOS` on the connecting id and on the
    /// listener. The source's value marks both directions: the passive side
    /// takes the traffic class of the connection request, so a listener's
    /// value changes nothing on RoCE (rdma_cm passes it on to iWARP listens).
    /// 0: not set, so the kernel's default applies (the port's
    /// `default_roce_tos` in rdma_cm's configfs, itself 0 unless changed).
    /// Which DSCP reaches a lossless class is site policy: the library does
    /// not guess.
    pub tos: u8,
    /// Destination serving a QEMU source: right after accepting it, also
    /// accept its return-path connection (the second connection request
    /// QEMU makes to the same address, within `timeout`) and keep it for
    /// [`Destination::put_return`](crate::Destination::put_return). QEMU
    /// 7.2 opens it only with its `postcopy-ram` or `dirty-bitmaps`
    /// capability on (from 8.0 also with `return-path` alone); one that
    /// opens it gives up after 5 s without this. Not used with an rdmamig
    /// source, which opens none; a source refuses this setting.
    pub return_path: bool,
    /// Source: the most bytes per second of RAM and stream to send (QEMU's
    /// `max-bandwidth`, which counts the same), averaged over each busy
    /// stretch: idle time earns no burst. `None`: as fast as the link goes.
    /// `Source::set_max_bandwidth` changes it during a migration.
    pub max_bandwidth: Option<u64>,
    /// Source: the most bytes of RAM queued by the save calls and not yet
    /// taken by the transfer thread; past it, a save queues its range and
    /// then waits until the queue is back within the bound. `None` (the
    /// default): a save returns at once, however much is queued. A
    /// hypervisor that ends an iteration after a time (QEMU: 50 ms) sets
    /// it, so that the window's end waits for at most this much: otherwise
    /// a link slower than the hypervisor's loop leaves the window's end to
    /// wait for all it queued.
    pub max_queued_bytes: Option<u64>,
    /// Post-copy (rdmamig extension), on either side: how long to wait for a
    /// lost connection to come back once the guest runs on the destination
    /// (`None`: not at all, post-copy fails at once). A source with it
    /// listens for the destination's recovery connection from the moment it
    /// calls `postcopy`; a destination with it, whose source has it too,
    /// reconnects after a transport error or a liveness failure (not after
    /// the source's ERROR, nor when the source's listener is gone, which is
    /// what a killed source leaves) and its vCPUs wait meanwhile. Each side
    /// counts from the moment it noticed the loss. Negotiated: recovery
    /// needs it on both sides.
    pub postcopy_recovery: Option<Duration>,
    /// Post-copy recovery, on either side: begins only when the hypervisor
    /// says so (`postcopy_recover` on each side: the destination then
    /// reconnects, the source then admits it), as QEMU's `migrate-recover`
    /// and `migrate resume=true` do; the window (`postcopy_recovery`) still
    /// bounds the whole wait from the loss. Off: each side recovers by
    /// itself. Either way `wait_postcopy_link` follows the connection.
    pub postcopy_recovery_by_hypervisor: bool,
    /// Destination: post-copy goes through the hypervisor's userfaultfd
    /// instead of one of the library's own. The hypervisor registers guest
    /// RAM with it (missing mode) and reads its faults itself, and hands it
    /// over with [`Destination::postcopy_userfaultfd`](crate::Destination::postcopy_userfaultfd)
    /// before post-copy runs (the library waits for it up to `timeout` once
    /// the source's request came); the library drops the stale pages,
    /// installs pages through it and never reads it. Each fault the
    /// hypervisor reads, it forwards with `Destination::postcopy_fetch`.
    pub hypervisor_userfaultfd: bool,
    /// Destination: when post-copy fails, leave the threads blocked on
    /// missing pages blocked (and later touches of them block too) instead
    /// of releasing them (the default: the blocks become `PROT_NONE` and the
    /// waiters are woken, so they fault with SIGSEGV). Either way no thread
    /// runs on a page the source never sent; this is the choice of a
    /// hypervisor that reports the failure and keeps the process alive until
    /// it is stopped (QEMU's post-copy failure). Its userfaultfd must then
    /// stay registered: unregistered, the missing pages would read as zero.
    pub postcopy_keep_blocked: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pin_all: false,
            extensions: true,
            protocol_version: 1,
            timeout: Duration::from_secs(30),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            liveness: Some(DEFAULT_LIVENESS),
            pin_budget: None,
            unregister_worker: true,
            auth_key: None,
            allowed_sources: Vec::new(),
            tos: 0,
            return_path: false,
            max_bandwidth: None,
            max_queued_bytes: None,
            postcopy_recovery: None,
            postcopy_recovery_by_hypervisor: false,
            hypervisor_userfaultfd: false,
            postcopy_keep_blocked: false,
        }
    }
}
