//! The InfiniBand vSwitch reconfiguration planner: what the fabric must
//! change, and how many Subnet Management Packets (SMPs) it costs, when a VM
//! that owns an SR-IOV VF migrates (Tasoulas et al., "Towards the
//! InfiniBand SR-IOV vSwitch Architecture", IEEE Cluster 2015). Pure code:
//! no verbs, no engine.
//!
//! With the vSwitch architecture each VF is a vHCA with its own LID, so the
//! subnet manager can move a VM's LID without recomputing routes: it
//! rewrites a few Linear Forwarding Table (LFT) entries, 64 LIDs (one LFT
//! block) per SMP.
//!
//! The model ([`Topology`]): switches (LID, port count, links, LFT as one
//! output port per LID, [`NO_ROUTE`] for none); hypervisors (leaf switch
//! and port, PF LID, VFs with their LIDs and whether a VM uses them).
//!
//! The planner ([`plan`]) takes a [`Migration`] (VM LID, source and
//! destination hypervisor, [`Mode`]) and returns a [`Plan`]: the LFT SMPs
//! (switch, block number, the full new 64-entry block), the three
//! hypervisor SMPs (set the source VF's LID, set the destination VF's LID,
//! move the vGUID), and the [`Counts`], with a full reconfiguration's cost
//! (switches × ceil((highest LID + 1) / 64)) for comparison.
//!
//! - [`Mode::Swap`] (prepopulated LIDs): the destination VF is the one
//!   given, or the first of the destination's VFs that is free and has a
//!   LID. The VM's LID and that VF's LID exchange their LFT entries on every
//!   switch where they differ: the result is exactly the routing the SM
//!   would have computed with the two LIDs' roles exchanged, so the SM's
//!   original balancing is kept (the two LIDs' paths from all switches use
//!   each output port as often as before; [`check`] verifies it). A switch
//!   where the two entries are equal needs nothing. Cost per switch: 0, 1
//!   SMP if both LIDs are in the same 64-LID block, 2 otherwise.
//! - [`Mode::Copy`] (dynamic LID assignment): the VM's LID forwards like the
//!   destination PF's LID: every switch where entry(VM LID) differs from
//!   entry(destination PF LID) gets it, 1 SMP per such switch.
//! - One exception, in both modes: when both hypervisors hang off the same
//!   switch, only that switch is rewritten. Above it the two LIDs are
//!   interchangeable: every upward path of either one ends at that switch,
//!   so keeping each LID's old path changes no link's load and no route's
//!   correctness, and only the last hop differs. (With a balanced routing
//!   such as d-mod-k, the LIDs of one leaf take different up-ports on every
//!   other leaf, so "swap wherever they differ" would cost about one SMP per
//!   leaf there; the paper's minimum of 1 SMP is this rule.)
//!
//! [`apply`] writes a plan's blocks and VF LIDs; [`check`] verifies the
//! result against the topology before (from every switch the VM's LID
//! reaches the destination hypervisor's port, loop-free; nothing else
//! changed; swap: the partner LID reaches the source and the balancing is
//! kept; copy: the VM's LID forwards like the destination PF).
//!
//! [`FatTree`] generates 2- and 3-level fat trees with d-mod-k routing;
//! [`table_i`] reproduces Table I of the paper from them.

mod error;
mod fat_tree;
mod plan;
mod topology;

pub use fat_tree::{same_leaf_pair, table_i, table_row, worst_case_pair, FatTree, Pair, TableRow, TABLE_I_TREES};
pub use plan::{apply, apply_checked, check, plan, Counts, HypervisorSmp, LftSmp, Migration, Mode, Plan};
pub use topology::{
    check_lid, Hypervisor, Owner, Peer, Switch, Topology, Vf, WalkEnd, LFT_BLOCK, MAX_PORTS, MAX_UNICAST_LID, NO_ROUTE,
};
