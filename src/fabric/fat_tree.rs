//! Fat-tree generators with deterministic d-mod-k up/down routing, and the
//! reproduction of Table I of Tasoulas et al. (IEEE Cluster 2015).

use super::error::invalid;
use super::plan::{plan, Migration, Mode};
use super::topology::{Topology, LFT_BLOCK, MAX_PORTS, MAX_UNICAST_LID, NO_ROUTE};
use crate::Result;

/// A fat tree of `ports`-port switches (k = `ports`, even).
///
/// - 2 levels: `width` leaves (at most k), k/2 spines. Leaf ports 1..=k/2
///   go down to hypervisors, k/2+1..=k up: port k/2+1+u to spine u, whose
///   port l+1 goes to leaf l.
/// - 3 levels: `width` pods (at most k), each of k/2 leaves and k/2 middle
///   switches, and (k/2)² cores. Leaf (p, l)'s up port k/2+1+i goes to
///   middle (p, i)'s down port l+1; middle (p, i)'s up port k/2+1+j goes to
///   core (i, j)'s port p+1.
///
/// Each leaf has `hosts_per_leaf` hypervisors on its down ports 1, 2, ...,
/// each with a PF and `vfs_per_hypervisor` VFs, all with LIDs
/// (prepopulated), all VFs free.
///
/// LIDs, in order from 1: the end nodes leaf by leaf (leaf index order),
/// hypervisor by hypervisor, the PF then its VFs; then the switches: the
/// leaves, then the spines (2 levels) or the middles (pod by pod) and the
/// cores (core (i, j) = i·k/2 + j).
///
/// Routing (d-mod-k): a packet for LID x at a leaf that is not the
/// destination's goes up port k/2+1+(x mod k/2); a middle switch outside
/// the destination's pod goes up towards core (i, l), l = the destination
/// leaf's index in its pod; going down is unique. Each destination leaf's
/// LIDs thus spread over all up-paths, one per residue of x mod k/2.
/// Switch LIDs are routed along similar loop-free paths (port 0 at the
/// switch itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FatTree {
    pub ports: u8,
    /// 2 or 3.
    pub levels: u8,
    /// Leaves (2 levels) or pods (3 levels), 1..=`ports`.
    pub width: u16,
    /// 1..=`ports`/2.
    pub hosts_per_leaf: u8,
    pub vfs_per_hypervisor: u8,
}

/// What a LID is, for routing.
#[derive(Clone, Copy)]
enum Dest {
    None,
    /// An end node on global leaf `leaf`, behind its port `port`.
    Node {
        leaf: usize,
        port: u8,
    },
    Switch(usize),
}

impl FatTree {
    /// A full tree: `ports` leaves or pods, `ports`/2 hypervisors per leaf,
    /// one VF each.
    pub fn new(ports: u8, levels: u8) -> Self {
        FatTree { ports, levels, width: u16::from(ports), hosts_per_leaf: ports / 2, vfs_per_hypervisor: 1 }
    }

    fn half(&self) -> usize {
        usize::from(self.ports / 2)
    }

    /// Switches: 2 levels `width + k/2`; 3 levels `width·k + (k/2)²`.
    pub fn switch_count(&self) -> usize {
        let (u, w) = (self.half(), usize::from(self.width));
        if self.levels == 2 {
            w + u
        } else {
            w * 2 * u + u * u
        }
    }

    fn leaves(&self) -> usize {
        let w = usize::from(self.width);
        if self.levels == 2 {
            w
        } else {
            w * self.half()
        }
    }

    /// End-node LIDs: leaves × hosts × (1 + VFs).
    pub fn node_count(&self) -> usize {
        self.leaves() * usize::from(self.hosts_per_leaf) * (1 + usize::from(self.vfs_per_hypervisor))
    }

    fn validate(&self) -> Result<()> {
        let k = self.ports;
        if k < 4 || k % 2 != 0 || k > MAX_PORTS {
            return Err(invalid(format!("fat tree: {k} ports (an even number from 4 to {MAX_PORTS})")));
        }
        if self.levels != 2 && self.levels != 3 {
            return Err(invalid(format!("fat tree: {} levels (2 or 3)", self.levels)));
        }
        if self.width == 0 || self.width > u16::from(k) {
            return Err(invalid(format!("fat tree: width {} (leaves or pods, 1 to {k})", self.width)));
        }
        if self.hosts_per_leaf == 0 || self.hosts_per_leaf > k / 2 {
            return Err(invalid(format!("fat tree: {} hosts per leaf (1 to {})", self.hosts_per_leaf, k / 2)));
        }
        let lids = self.node_count() + self.switch_count();
        if lids > usize::from(MAX_UNICAST_LID) {
            return Err(invalid(format!("fat tree: {lids} LIDs, more than the {MAX_UNICAST_LID} unicast LIDs")));
        }
        Ok(())
    }

    /// Builds the tree, its hypervisors and every switch's LFT.
    pub fn generate(&self) -> Result<Topology> {
        self.validate()?;
        let u = self.half();
        let leaves = self.leaves();
        let nodes = self.node_count();
        let switches = self.switch_count();
        let highest = nodes + switches;
        let mut t = Topology::new();
        let switch_lid = |s: usize| (nodes + 1 + s) as u16;
        for s in 0..switches {
            t.add_switch(switch_lid(s), self.ports)?;
        }
        let up = |i: usize| (u + 1 + i) as u8;
        if self.levels == 2 {
            for l in 0..leaves {
                for s in 0..u {
                    t.connect(l, up(s), leaves + s, (l + 1) as u8)?;
                }
            }
        } else {
            let pods = usize::from(self.width);
            let middle = |p: usize, i: usize| leaves + p * u + i;
            let core = |i: usize, j: usize| leaves + pods * u + i * u + j;
            for p in 0..pods {
                for l in 0..u {
                    for i in 0..u {
                        t.connect(p * u + l, up(i), middle(p, i), (l + 1) as u8)?;
                    }
                }
                for i in 0..u {
                    for j in 0..u {
                        t.connect(middle(p, i), up(j), core(i, j), (p + 1) as u8)?;
                    }
                }
            }
        }
        let mut dest = vec![Dest::None; highest + 1];
        let mut lid = 1usize;
        let per_hyp = 1 + usize::from(self.vfs_per_hypervisor);
        for leaf in 0..leaves {
            for h in 0..usize::from(self.hosts_per_leaf) {
                let port = (h + 1) as u8;
                let lids: Vec<u16> = (lid..lid + per_hyp).map(|l| l as u16).collect();
                t.add_hypervisor(&format!("leaf{leaf}/port{port}"), leaf, port, lids[0], &lids[1..])?;
                for &l in &lids {
                    dest[usize::from(l)] = Dest::Node { leaf, port };
                }
                lid += per_hyp;
            }
        }
        for (s, d) in dest.iter_mut().skip(nodes + 1).enumerate() {
            *d = Dest::Switch(s);
        }
        let mut lft = vec![NO_ROUTE; highest + 1];
        for s in 0..switches {
            for (x, d) in dest.iter().enumerate() {
                lft[x] = self.route(s, x, *d);
            }
            t.set_lft(s, 0, &lft)?;
        }
        Ok(t)
    }

    /// The LFT entry of switch `s` for LID `x`, which is `d`.
    fn route(&self, s: usize, x: usize, d: Dest) -> u8 {
        let u = self.half();
        let leaves = self.leaves();
        let up = |i: usize| (u + 1 + i) as u8;
        let down = |i: usize| (i + 1) as u8;
        if self.levels == 2 {
            let spine = |s: usize| s - leaves;
            return match d {
                Dest::None => NO_ROUTE,
                Dest::Switch(t) if t == s => 0,
                // To an end node or a leaf switch: up by x mod k/2, down to the leaf.
                Dest::Node { leaf, port } if s == leaf => port,
                Dest::Node { leaf, .. } | Dest::Switch(leaf) if leaf < leaves => {
                    if s < leaves {
                        up(x % u)
                    } else {
                        down(leaf)
                    }
                }
                // To a spine: straight up from a leaf; from another spine
                // down to leaf x mod leaves, then up.
                Dest::Switch(t) if s < leaves => up(spine(t)),
                Dest::Switch(_) => down(x % leaves),
                Dest::Node { .. } => unreachable!("end nodes are on leaves"),
            };
        }
        let pods = usize::from(self.width);
        let (first_middle, first_core) = (leaves, leaves + pods * u);
        // (kind, pod or core row i, index): leaf (p, l), middle (p, i), core (i, j).
        let place = |s: usize| {
            if s < first_middle {
                (0, s / u, s % u)
            } else if s < first_core {
                (1, (s - first_middle) / u, (s - first_middle) % u)
            } else {
                (2, (s - first_core) / u, (s - first_core) % u)
            }
        };
        let (kind, a, b) = place(s);
        match d {
            Dest::None => NO_ROUTE,
            Dest::Switch(t) if t == s => 0,
            Dest::Node { leaf, port } if s == leaf => port,
            Dest::Node { leaf, .. } | Dest::Switch(leaf) if leaf < first_middle => {
                let (pod, l) = (leaf / u, leaf % u);
                match kind {
                    0 => up(x % u),
                    1 if a == pod => down(l),
                    1 => up(l),
                    _ => down(pod),
                }
            }
            Dest::Switch(t) => {
                let (tk, ta, tb) = place(t);
                if tk == 1 {
                    // Middle (P, i).
                    let (pod, i) = (ta, tb);
                    match kind {
                        0 => up(i),
                        1 if b == i => up(x % u),
                        1 => down(x % u),
                        _ if a == i => down(pod),
                        _ => down(x % pods),
                    }
                } else {
                    // Core (i, j).
                    let (i, j) = (ta, tb);
                    match kind {
                        0 => up(i),
                        1 if b == i => up(j),
                        1 => down(x % u),
                        _ => down(x % pods),
                    }
                }
            }
            Dest::Node { .. } => unreachable!("end nodes are on leaves"),
        }
    }
}

/// A migration between two hypervisors, found in a topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    pub vm_lid: u16,
    pub from: usize,
    pub to: usize,
    pub dest_vf_lid: u16,
}

impl Pair {
    pub fn migration(&self, mode: Mode) -> Migration {
        Migration { vm_lid: self.vm_lid, from: self.from, to: self.to, mode, dest_vf_lid: Some(self.dest_vf_lid) }
    }
}

/// The cheapest kind of move: two hypervisors on the same leaf, a VF LID of
/// each in the same LFT block (the first such pair in hypervisor order).
pub fn same_leaf_pair(t: &Topology) -> Option<Pair> {
    let h = t.hypervisors();
    for (from, x) in h.iter().enumerate() {
        for (to, y) in h.iter().enumerate().filter(|(j, y)| *j != from && y.switch == x.switch) {
            for a in x.vfs.iter().filter(|v| v.lid != 0) {
                if let Some(b) = y
                    .vfs
                    .iter()
                    .find(|v| v.lid != 0 && !v.in_use && v.lid / LFT_BLOCK as u16 == a.lid / LFT_BLOCK as u16)
                {
                    return Some(Pair { vm_lid: a.lid, from, to, dest_vf_lid: b.lid });
                }
            }
        }
    }
    None
}

/// The costliest kind of swap: a VF LID of a hypervisor on the first leaf
/// and a free VF LID elsewhere, in different LFT blocks, whose entries
/// differ on every switch (so the swap costs 2 SMPs on each). Searches the
/// first leaf's VFs against every other hypervisor's, from the last one back.
pub fn worst_case_pair(t: &Topology) -> Option<Pair> {
    let h = t.hypervisors();
    let first_leaf = h.first()?.switch;
    for (from, x) in h.iter().enumerate().take_while(|(_, x)| x.switch == first_leaf) {
        for a in x.vfs.iter().filter(|v| v.lid != 0) {
            for (to, y) in h.iter().enumerate().rev().filter(|(_, y)| y.switch != first_leaf) {
                for b in y
                    .vfs
                    .iter()
                    .filter(|v| v.lid != 0 && !v.in_use && v.lid / LFT_BLOCK as u16 != a.lid / LFT_BLOCK as u16)
                {
                    if t.switches().iter().all(|s| s.port_for(a.lid) != s.port_for(b.lid)) {
                        return Some(Pair { vm_lid: a.lid, from, to, dest_vf_lid: b.lid });
                    }
                }
            }
        }
    }
    None
}

/// One row of Table I, computed from a generated tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableRow {
    pub tree: FatTree,
    /// End-node LIDs (PF and VF LIDs).
    pub nodes: u64,
    pub switches: u64,
    /// All LIDs (nodes + switches; also the highest LID).
    pub lids: u64,
    /// LFT blocks per switch: ceil((highest LID + 1) / 64).
    pub blocks_per_switch: u64,
    /// A full reconfiguration's LFT SMPs, at least (switches × blocks).
    pub full_min: u64,
    /// LFT SMPs of the planned same-leaf move, swap and copy.
    pub swap_min: u64,
    pub copy_min: u64,
    /// LFT SMPs of the planned worst-case pair, swap and copy.
    pub swap_max: u64,
    pub copy_max: u64,
    pub min_pair: Pair,
    pub max_pair: Pair,
}

/// The four trees of Table I (36-port switches). The paper's "nodes" are
/// end-node LIDs: each leaf has 18 of them, here 9 hypervisors with a PF
/// and one VF each (swap and copy need a VF at both ends).
pub const TABLE_I_TREES: [FatTree; 4] = [
    FatTree { ports: 36, levels: 2, width: 18, hosts_per_leaf: 9, vfs_per_hypervisor: 1 },
    FatTree { ports: 36, levels: 2, width: 36, hosts_per_leaf: 9, vfs_per_hypervisor: 1 },
    FatTree { ports: 36, levels: 3, width: 18, hosts_per_leaf: 9, vfs_per_hypervisor: 1 },
    FatTree { ports: 36, levels: 3, width: 36, hosts_per_leaf: 9, vfs_per_hypervisor: 1 },
];

/// Computes a row of Table I: generates `tree`, plans the same-leaf and the
/// worst-case moves in both modes (the plans are not applied here).
pub fn table_row(tree: &FatTree) -> Result<TableRow> {
    let t = tree.generate()?;
    let none = |what: &str| invalid(format!("{tree:?}: no {what} pair"));
    let min_pair = same_leaf_pair(&t).ok_or_else(|| none("same-leaf"))?;
    let max_pair = worst_case_pair(&t).ok_or_else(|| none("worst-case"))?;
    let cost = |p: &Pair, mode| plan(&t, &p.migration(mode)).map(|p| p.counts.lft_smps);
    Ok(TableRow {
        tree: *tree,
        nodes: t.endpoint_lids() as u64,
        switches: t.switches().len() as u64,
        lids: u64::from(t.highest_lid()),
        blocks_per_switch: t.lft_blocks(),
        full_min: t.full_reconfiguration_smps(),
        swap_min: cost(&min_pair, Mode::Swap)?,
        copy_min: cost(&min_pair, Mode::Copy)?,
        swap_max: cost(&max_pair, Mode::Swap)?,
        copy_max: cost(&max_pair, Mode::Copy)?,
        min_pair,
        max_pair,
    })
}

/// Table I of the paper, from the generators: one row per tree of
/// [`TABLE_I_TREES`].
pub fn table_i() -> Result<Vec<TableRow>> {
    TABLE_I_TREES.iter().map(table_row).collect()
}
