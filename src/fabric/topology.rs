//! The fabric as the subnet manager sees it: switches with their LIDs, port
//! counts, links and Linear Forwarding Tables, and hypervisors (a leaf
//! switch port, a PF LID, VFs with their LIDs).

use std::collections::HashMap;

use super::error::invalid;
use crate::Result;

/// An LFT entry that routes nowhere (the SM's "no route": 0xFF).
pub const NO_ROUTE: u8 = 0xFF;
/// LIDs per LFT block: one SMP (SubnSet(LinearForwardingTable)) writes one block.
pub const LFT_BLOCK: usize = 64;
/// The highest unicast LID (0x0001–0xBFFF are unicast; 0xC000 and up multicast).
pub const MAX_UNICAST_LID: u16 = 0xBFFF;
/// The most ports a switch may have here (255 is reserved, 0xFF is [`NO_ROUTE`]).
pub const MAX_PORTS: u8 = 254;

/// A switch: its LID, its number of external ports (1..=`ports`; port 0 is
/// the switch itself) and its LFT (`lft[lid]` = output port; missing
/// entries are [`NO_ROUTE`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    pub lid: u16,
    pub ports: u8,
    lft: Vec<u8>,
    /// What each port (index 0..=ports) leads to.
    peers: Vec<Peer>,
}

impl Switch {
    /// The output port for `lid` ([`NO_ROUTE`] if the table has none).
    pub fn port_for(&self, lid: u16) -> u8 {
        self.lft.get(usize::from(lid)).copied().unwrap_or(NO_ROUTE)
    }

    /// The LFT, indexed by LID (entries past its end are [`NO_ROUTE`]).
    pub fn lft(&self) -> &[u8] {
        &self.lft
    }

    /// The 64 entries of LFT block `block` (LIDs `64 * block ..`).
    pub fn block(&self, block: u16) -> [u8; LFT_BLOCK] {
        let mut out = [NO_ROUTE; LFT_BLOCK];
        let first = usize::from(block) * LFT_BLOCK;
        if first < self.lft.len() {
            let end = (first + LFT_BLOCK).min(self.lft.len());
            out[..end - first].copy_from_slice(&self.lft[first..end]);
        }
        out
    }

    /// What port `port` leads to.
    pub fn peer(&self, port: u8) -> Peer {
        self.peers.get(usize::from(port)).copied().unwrap_or(Peer::None)
    }

    pub(crate) fn write_block(&mut self, block: u16, ports: &[u8; LFT_BLOCK]) {
        let first = usize::from(block) * LFT_BLOCK;
        if self.lft.len() < first + LFT_BLOCK {
            self.lft.resize(first + LFT_BLOCK, NO_ROUTE);
        }
        self.lft[first..first + LFT_BLOCK].copy_from_slice(ports);
    }
}

/// The far end of a switch port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Nothing is connected.
    None,
    /// Port `port` of switch `switch` (an index into [`Topology::switches`]).
    Switch { switch: usize, port: u8 },
    /// Hypervisor `0` (an index into [`Topology::hypervisors`]): its HCA port,
    /// behind which its vSwitch holds the PF and the VFs.
    Hypervisor(usize),
}

/// A VF of a hypervisor's HCA (a vHCA behind its vSwitch, with its own LID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vf {
    /// Its LID; 0 when it has none (dynamic LID assignment, VF unused).
    pub lid: u16,
    /// Whether a VM uses it; a free VF can receive a migrating VM.
    pub in_use: bool,
}

/// A hypervisor: one HCA port on a leaf switch, a PF LID and its VFs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hypervisor {
    pub name: String,
    /// The leaf switch (an index into [`Topology::switches`]).
    pub switch: usize,
    /// The leaf switch's port the HCA is connected to.
    pub port: u8,
    pub pf_lid: u16,
    pub vfs: Vec<Vf>,
}

/// Who holds a LID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    Switch(usize),
    Pf(usize),
    /// VF `vf` of hypervisor `hypervisor`.
    Vf {
        hypervisor: usize,
        vf: usize,
    },
}

/// Where a walk along the LFTs ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkEnd {
    /// Left the fabric through a hypervisor's port.
    Hypervisor(usize),
    /// Delivered to a switch itself (port 0).
    Switch(usize),
}

/// Switches, links, LFTs and hypervisors. Built piece by piece (from the
/// SM's real tables) or by a generator ([`crate::fabric::FatTree`]).
/// Every setter checks its arguments: LIDs are unicast (0x0001–0xBFFF) and
/// unique, ports exist and are connected once, LFT entries name an existing
/// port or [`NO_ROUTE`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    switches: Vec<Switch>,
    hypervisors: Vec<Hypervisor>,
    owners: HashMap<u16, Owner>,
}

impl Topology {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn switches(&self) -> &[Switch] {
        &self.switches
    }

    pub fn hypervisors(&self) -> &[Hypervisor] {
        &self.hypervisors
    }

    /// Who holds `lid`, if anyone.
    pub fn owner(&self, lid: u16) -> Option<Owner> {
        self.owners.get(&lid).copied()
    }

    /// The switch with LID `lid`.
    pub fn switch_by_lid(&self, lid: u16) -> Option<usize> {
        match self.owner(lid) {
            Some(Owner::Switch(s)) => Some(s),
            _ => None,
        }
    }

    /// The hypervisor named `name`.
    pub fn hypervisor_by_name(&self, name: &str) -> Option<usize> {
        self.hypervisors.iter().position(|h| h.name == name)
    }

    /// The highest LID held by a switch, a PF or a VF (0 if none).
    pub fn highest_lid(&self) -> u16 {
        self.owners.keys().copied().max().unwrap_or(0)
    }

    /// LIDs held by PFs and VFs (the end nodes).
    pub fn endpoint_lids(&self) -> usize {
        self.owners.values().filter(|o| !matches!(o, Owner::Switch(_))).count()
    }

    /// LFT blocks per switch that a full reconfiguration writes at least:
    /// every block up to the highest LID, ceil((highest LID + 1) / 64).
    pub fn lft_blocks(&self) -> u64 {
        (u64::from(self.highest_lid()) + 1).div_ceil(LFT_BLOCK as u64)
    }

    /// The SMPs of a full (traditional) reconfiguration, at least: every
    /// switch rewrites every used block (plus, not counted, the route
    /// computation itself).
    pub fn full_reconfiguration_smps(&self) -> u64 {
        self.switches.len() as u64 * self.lft_blocks()
    }

    fn claim(&mut self, lid: u16, owner: Owner) -> Result<()> {
        check_lid(lid)?;
        if let Some(o) = self.owners.get(&lid) {
            return Err(invalid(format!("LID {lid} is already held by {}", self.describe(*o))));
        }
        self.owners.insert(lid, owner);
        Ok(())
    }

    fn describe(&self, o: Owner) -> String {
        match o {
            Owner::Switch(s) => format!("switch {s}"),
            Owner::Pf(h) => format!("the PF of hypervisor {h}"),
            Owner::Vf { hypervisor, vf } => format!("VF {vf} of hypervisor {hypervisor}"),
        }
    }

    /// Adds a switch with LID `lid` and `ports` external ports (1..=254),
    /// an empty LFT, nothing connected. Returns its index.
    pub fn add_switch(&mut self, lid: u16, ports: u8) -> Result<usize> {
        if ports == 0 || ports > MAX_PORTS {
            return Err(invalid(format!("switch LID {lid}: {ports} ports (1 to {MAX_PORTS})")));
        }
        let index = self.switches.len();
        self.claim(lid, Owner::Switch(index))?;
        self.switches.push(Switch { lid, ports, lft: Vec::new(), peers: vec![Peer::None; usize::from(ports) + 1] });
        Ok(index)
    }

    fn switch_index(&self, switch: usize) -> Result<&Switch> {
        self.switches
            .get(switch)
            .ok_or_else(|| invalid(format!("no switch {switch} ({} switches)", self.switches.len())))
    }

    fn free_port(&self, switch: usize, port: u8) -> Result<()> {
        let s = self.switch_index(switch)?;
        if port == 0 || port > s.ports {
            return Err(invalid(format!("switch LID {}: no port {port} (1 to {})", s.lid, s.ports)));
        }
        if s.peers[usize::from(port)] != Peer::None {
            return Err(invalid(format!("switch LID {} port {port} is already connected", s.lid)));
        }
        Ok(())
    }

    /// Connects port `port_a` of switch `a` to port `port_b` of switch `b`.
    pub fn connect(&mut self, a: usize, port_a: u8, b: usize, port_b: u8) -> Result<()> {
        self.free_port(a, port_a)?;
        self.free_port(b, port_b)?;
        if a == b && port_a == port_b {
            return Err(invalid(format!("switch {a}: port {port_a} connected to itself")));
        }
        self.switches[a].peers[usize::from(port_a)] = Peer::Switch { switch: b, port: port_b };
        self.switches[b].peers[usize::from(port_b)] = Peer::Switch { switch: a, port: port_a };
        Ok(())
    }

    /// Sets `ports.len()` LFT entries of switch `switch` from LID
    /// `first_lid` on (the table grows as needed; entries never set are
    /// [`NO_ROUTE`]). Each entry is a port of the switch (0: the switch
    /// itself) or [`NO_ROUTE`]; the range must end at or below 0xBFFF.
    pub fn set_lft(&mut self, switch: usize, first_lid: u16, ports: &[u8]) -> Result<()> {
        let s = self.switch_index(switch)?;
        let end = usize::from(first_lid) + ports.len();
        if end > usize::from(MAX_UNICAST_LID) + 1 {
            return Err(invalid(format!(
                "switch LID {}: LFT range {first_lid}+{} ends past LID {MAX_UNICAST_LID:#x}",
                s.lid,
                ports.len()
            )));
        }
        if let Some(i) = ports.iter().position(|&p| p != NO_ROUTE && p > s.ports) {
            return Err(invalid(format!(
                "switch LID {}: LFT entry for LID {} is port {} (the switch has {})",
                s.lid,
                usize::from(first_lid) + i,
                ports[i],
                s.ports
            )));
        }
        let lft = &mut self.switches[switch].lft;
        if lft.len() < end {
            lft.resize(end, NO_ROUTE);
        }
        lft[usize::from(first_lid)..end].copy_from_slice(ports);
        Ok(())
    }

    /// Adds a hypervisor whose HCA is on port `port` of switch `switch`, with
    /// PF LID `pf_lid` and one VF per entry of `vf_lids` (0: a VF without a
    /// LID yet). Its VFs start free. Returns its index.
    pub fn add_hypervisor(
        &mut self,
        name: &str,
        switch: usize,
        port: u8,
        pf_lid: u16,
        vf_lids: &[u16],
    ) -> Result<usize> {
        self.free_port(switch, port)?;
        if self.hypervisor_by_name(name).is_some() {
            return Err(invalid(format!("a hypervisor is already named {name:?}")));
        }
        let index = self.hypervisors.len();
        // Check every LID before claiming any, so a refusal changes nothing.
        let mut seen: Vec<u16> = vec![pf_lid];
        for &lid in vf_lids.iter().filter(|&&l| l != 0) {
            if seen.contains(&lid) {
                return Err(invalid(format!("hypervisor {name:?}: LID {lid} given twice")));
            }
            seen.push(lid);
        }
        for &lid in &seen {
            check_lid(lid)?;
            if let Some(o) = self.owner(lid) {
                return Err(invalid(format!("LID {lid} is already held by {}", self.describe(o))));
            }
        }
        self.claim(pf_lid, Owner::Pf(index))?;
        for (vf, &lid) in vf_lids.iter().enumerate() {
            if lid != 0 {
                self.claim(lid, Owner::Vf { hypervisor: index, vf })?;
            }
        }
        self.switches[switch].peers[usize::from(port)] = Peer::Hypervisor(index);
        self.hypervisors.push(Hypervisor {
            name: name.to_owned(),
            switch,
            port,
            pf_lid,
            vfs: vf_lids.iter().map(|&lid| Vf { lid, in_use: false }).collect(),
        });
        Ok(index)
    }

    /// Marks the VF holding `vf_lid` as used by a VM (or free).
    pub fn set_vf_in_use(&mut self, vf_lid: u16, in_use: bool) -> Result<()> {
        match self.owner(vf_lid) {
            Some(Owner::Vf { hypervisor, vf }) => {
                self.hypervisors[hypervisor].vfs[vf].in_use = in_use;
                Ok(())
            }
            Some(o) => Err(invalid(format!("LID {vf_lid} is not a VF's: it is {}'s", self.describe(o)))),
            None => Err(invalid(format!("unknown LID {vf_lid}"))),
        }
    }

    /// Gives VF `vf` of `hypervisor` the LID `lid` (0: none) and the use flag.
    pub(crate) fn assign_vf(&mut self, hypervisor: usize, vf: usize, lid: u16, in_use: bool) {
        let old = self.hypervisors[hypervisor].vfs[vf].lid;
        if old != 0 && self.owners.get(&old) == Some(&Owner::Vf { hypervisor, vf }) {
            self.owners.remove(&old);
        }
        if lid != 0 {
            self.owners.insert(lid, Owner::Vf { hypervisor, vf });
        }
        self.hypervisors[hypervisor].vfs[vf] = Vf { lid, in_use };
    }

    pub(crate) fn switch_mut(&mut self, switch: usize) -> &mut Switch {
        &mut self.switches[switch]
    }

    /// Follows the LFTs for `lid` from switch `from` until the packet leaves
    /// the fabric (through a hypervisor's port) or is delivered to a switch
    /// (port 0). Calls `hop(switch, port)` for each output port taken. An
    /// entry with no route, a port leading nowhere or a loop is an error.
    pub fn walk(&self, from: usize, lid: u16, mut hop: impl FnMut(usize, u8)) -> Result<WalkEnd> {
        let mut at = from;
        // A loop-free path visits each switch at most once.
        for _ in 0..=self.switches.len() {
            let s = &self.switches[at];
            let port = s.port_for(lid);
            if port == 0 {
                return Ok(WalkEnd::Switch(at));
            }
            hop(at, port);
            match s.peer(port) {
                Peer::Switch { switch, .. } => at = switch,
                Peer::Hypervisor(h) => return Ok(WalkEnd::Hypervisor(h)),
                Peer::None if port == NO_ROUTE => {
                    return Err(invalid(format!("LID {lid}: switch LID {} has no route for it", s.lid)))
                }
                Peer::None => {
                    return Err(invalid(format!(
                        "LID {lid}: switch LID {} sends it to port {port}, which leads nowhere",
                        s.lid
                    )))
                }
            }
        }
        Err(invalid(format!("LID {lid}: the LFTs loop (from switch LID {})", self.switches[from].lid)))
    }
}

/// A unicast LID: 0x0001–0xBFFF.
pub fn check_lid(lid: u16) -> Result<()> {
    if lid == 0 || lid > MAX_UNICAST_LID {
        return Err(invalid(format!("LID {lid:#x} is not a unicast LID (0x0001 to {MAX_UNICAST_LID:#x})")));
    }
    Ok(())
}
