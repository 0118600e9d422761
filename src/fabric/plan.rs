//! The planner: which SMPs move a VM's LID from one hypervisor to another,
//! applying them, and checking the result.

use std::collections::HashMap;

use super::error::invalid;
use super::topology::{Owner, Topology, WalkEnd, LFT_BLOCK};
use crate::Result;

/// How the fabric gives LIDs to VFs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Prepopulated LIDs: every VF has a LID from boot and routes. The VM's
    /// LID and the destination VF's LID exchange their LFT entries.
    Swap,
    /// Dynamic LID assignment: a VM's LID forwards like its hypervisor's
    /// PF LID. The destination PF's entries are copied into the VM's LID.
    Copy,
}

/// A migration to plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migration {
    /// The VM's LID: a VF LID of `from`.
    pub vm_lid: u16,
    /// Source hypervisor (index into [`Topology::hypervisors`]).
    pub from: usize,
    /// Destination hypervisor.
    pub to: usize,
    pub mode: Mode,
    /// The destination VF, by its current LID; `None`: the first VF of `to`
    /// that is not in use (and, for [`Mode::Swap`], has a LID).
    pub dest_vf_lid: Option<u16>,
}

/// One SubnSet(LinearForwardingTable) SMP: the whole new block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LftSmp {
    /// Index into [`Topology::switches`].
    pub switch: usize,
    pub switch_lid: u16,
    /// LFT block number: LIDs `64 * block .. 64 * block + 63`.
    pub block: u16,
    /// The block's 64 new entries.
    pub ports: [u8; LFT_BLOCK],
    /// The 64 entries the plan was made on: [`apply`] refuses the plan if
    /// the switch holds others (a plan made before another was applied).
    pub old: [u8; LFT_BLOCK],
}

/// An SMP to a hypervisor's vSwitch (counted apart from the LFT SMPs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HypervisorSmp {
    /// Sets the LID of VF `vf` of `hypervisor` from `old_lid` to `new_lid`
    /// (0: unset).
    VfLid { hypervisor: usize, vf: usize, old_lid: u16, new_lid: u16 },
    /// Moves the VM's vGUID from VF `from_vf` of `from` to VF `to_vf` of `to`.
    Vguid { from: usize, from_vf: usize, to: usize, to_vf: usize },
}

/// What a plan costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// LFT block SMPs.
    pub lft_smps: u64,
    /// Switches with at least one LFT SMP.
    pub switches_touched: u64,
    /// SMPs to the two hypervisors (VF LIDs, vGUID): 3.
    pub hypervisor_smps: u64,
    /// `lft_smps + hypervisor_smps`.
    pub total: u64,
    /// For comparison: a full reconfiguration's LFT SMPs, at least
    /// (switches × ceil((highest LID + 1) / 64)).
    pub full_reconfiguration: u64,
}

/// The SMPs that move the VM's LID, and their count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub migration: Migration,
    /// The VF of `from` holding the VM's LID.
    pub source_vf: usize,
    /// The VF of `to` receiving it.
    pub dest_vf: usize,
    /// Swap: the destination VF's LID, which the source VF takes. Copy: the
    /// LID the destination VF had (0: none), released.
    pub partner_lid: u16,
    /// Both hypervisors hang off the same switch (only it is rewritten).
    pub same_switch: bool,
    pub lft: Vec<LftSmp>,
    pub hypervisor: Vec<HypervisorSmp>,
    pub counts: Counts,
}

/// Plans `m` on `topology` (see the module documentation for the rules).
/// Refuses (`ErrorKind::InvalidArgument`) an unknown hypervisor or LID, a
/// VM LID that is not a VF LID of the source, the same hypervisor twice, a
/// destination VF that is not the destination's or is in use, or no free VF.
pub fn plan(topology: &Topology, m: &Migration) -> Result<Plan> {
    let hyps = topology.hypervisors();
    let hyp = |h: usize, what: &str| {
        hyps.get(h).ok_or_else(|| invalid(format!("no {what} hypervisor {h} ({} hypervisors)", hyps.len())))
    };
    let (from, to) = (hyp(m.from, "source")?, hyp(m.to, "destination")?);
    if m.from == m.to {
        return Err(invalid(format!("source and destination are the same hypervisor ({})", from.name)));
    }
    let source_vf = match topology.owner(m.vm_lid) {
        None => return Err(invalid(format!("unknown LID {}: no VF holds it", m.vm_lid))),
        Some(Owner::Vf { hypervisor, vf }) if hypervisor == m.from => vf,
        Some(_) => {
            return Err(invalid(format!("VM LID {} is not on a VF of the source hypervisor {}", m.vm_lid, from.name)))
        }
    };
    let dest_vf = match m.dest_vf_lid {
        Some(lid) => match topology.owner(lid) {
            Some(Owner::Vf { hypervisor, vf }) if hypervisor == m.to => {
                if to.vfs[vf].in_use {
                    return Err(invalid(format!("destination VF LID {lid} of {} is in use", to.name)));
                }
                vf
            }
            None => return Err(invalid(format!("unknown destination VF LID {lid}"))),
            Some(_) => {
                return Err(invalid(format!("LID {lid} is not a VF LID of the destination hypervisor {}", to.name)))
            }
        },
        None => to.vfs.iter().position(|v| !v.in_use && (m.mode == Mode::Copy || v.lid != 0)).ok_or_else(|| {
            invalid(format!(
                "the destination hypervisor {} has no free VF{}",
                to.name,
                match m.mode {
                    Mode::Swap => " with a LID",
                    Mode::Copy => "",
                }
            ))
        })?,
    };
    let partner_lid = to.vfs[dest_vf].lid;
    if m.mode == Mode::Swap && partner_lid == 0 {
        return Err(invalid(format!("swap: the destination VF {dest_vf} of {} has no LID", to.name)));
    }
    let same_switch = from.switch == to.switch;
    let (a, b) = (m.vm_lid, partner_lid);
    let mut lft = Vec::new();
    for (i, s) in topology.switches().iter().enumerate() {
        if same_switch && i != from.switch {
            continue;
        }
        let (ea, eb) = (s.port_for(a), s.port_for(b));
        let (block_a, block_b) = (a / LFT_BLOCK as u16, b / LFT_BLOCK as u16);
        let off = |lid: u16| usize::from(lid) % LFT_BLOCK;
        match m.mode {
            Mode::Swap if ea != eb => {
                if block_a == block_b {
                    let old = s.block(block_a);
                    let mut ports = old;
                    ports[off(a)] = eb;
                    ports[off(b)] = ea;
                    lft.push(LftSmp { switch: i, switch_lid: s.lid, block: block_a, ports, old });
                } else {
                    for (lid, block, new) in [(a, block_a, eb), (b, block_b, ea)] {
                        let old = s.block(block);
                        let mut ports = old;
                        ports[off(lid)] = new;
                        lft.push(LftSmp { switch: i, switch_lid: s.lid, block, ports, old });
                    }
                }
            }
            Mode::Copy => {
                // Same switch: the VM's LID keeps its upward paths (they all
                // end at this switch) and only the last hop changes.
                let want = if same_switch { to.port } else { s.port_for(to.pf_lid) };
                if ea != want {
                    let old = s.block(block_a);
                    let mut ports = old;
                    ports[off(a)] = want;
                    lft.push(LftSmp { switch: i, switch_lid: s.lid, block: block_a, ports, old });
                }
            }
            Mode::Swap => {}
        }
    }
    let (src_new, dst_old) = match m.mode {
        Mode::Swap => (partner_lid, partner_lid),
        Mode::Copy => (0, partner_lid),
    };
    let hypervisor = vec![
        HypervisorSmp::VfLid { hypervisor: m.from, vf: source_vf, old_lid: a, new_lid: src_new },
        HypervisorSmp::VfLid { hypervisor: m.to, vf: dest_vf, old_lid: dst_old, new_lid: a },
        HypervisorSmp::Vguid { from: m.from, from_vf: source_vf, to: m.to, to_vf: dest_vf },
    ];
    let mut touched: Vec<usize> = lft.iter().map(|s| s.switch).collect();
    touched.dedup();
    let counts = Counts {
        lft_smps: lft.len() as u64,
        switches_touched: touched.len() as u64,
        hypervisor_smps: hypervisor.len() as u64,
        total: (lft.len() + hypervisor.len()) as u64,
        full_reconfiguration: topology.full_reconfiguration_smps(),
    };
    Ok(Plan { migration: *m, source_vf, dest_vf, partner_lid, same_switch, lft, hypervisor, counts })
}

/// Writes the plan's LFT blocks and VF LIDs into `topology` (what sending
/// its SMPs does). Everything is checked first: a plan that does not fit
/// the topology (switch or VF gone, LIDs moved meanwhile, an LFT block no
/// longer what the plan was made on, e.g. by another plan applied since)
/// changes nothing.
pub fn apply(topology: &mut Topology, plan: &Plan) -> Result<()> {
    for smp in &plan.lft {
        if usize::from(smp.block) * LFT_BLOCK > usize::from(super::MAX_UNICAST_LID) {
            return Err(invalid(format!("plan: LFT block {} is past the unicast LIDs", smp.block)));
        }
        match topology.switches().get(smp.switch) {
            Some(s) if s.lid == smp.switch_lid && s.block(smp.block) == smp.old => {}
            Some(s) if s.lid == smp.switch_lid => {
                return Err(invalid(format!(
                    "plan: LFT block {} of switch LID {} changed since the plan was made (plan again)",
                    smp.block, smp.switch_lid
                )))
            }
            _ => return Err(invalid(format!("plan: no switch {} with LID {}", smp.switch, smp.switch_lid))),
        }
    }
    for smp in &plan.hypervisor {
        if let HypervisorSmp::VfLid { hypervisor, vf, old_lid, .. } = *smp {
            let now = topology.hypervisors().get(hypervisor).and_then(|h| h.vfs.get(vf)).map(|v| v.lid);
            if now != Some(old_lid) {
                return Err(invalid(format!("plan: VF {vf} of hypervisor {hypervisor} no longer has LID {old_lid}")));
            }
        }
    }
    for smp in &plan.lft {
        topology.switch_mut(smp.switch).write_block(smp.block, &smp.ports);
    }
    let m = &plan.migration;
    // Clear both VFs first so that the swap's two LIDs never have two owners.
    topology.assign_vf(m.from, plan.source_vf, 0, false);
    topology.assign_vf(m.to, plan.dest_vf, 0, false);
    let src_new = if m.mode == Mode::Swap { plan.partner_lid } else { 0 };
    topology.assign_vf(m.from, plan.source_vf, src_new, false);
    topology.assign_vf(m.to, plan.dest_vf, m.vm_lid, true);
    Ok(())
}

/// Checks that `after` (= `before` with `plan` applied) is what the plan
/// promises:
///
/// - from every switch, the VM's LID is forwarded, without a loop, out of
///   the destination hypervisor's port (and, in swap mode, the partner LID
///   out of the source hypervisor's);
/// - no other LID's entry changed on any switch, and every changed LFT
///   block is one of the plan's SMPs;
/// - swap: the two LIDs' paths from all switches use every output port
///   exactly as often as before (the SM's balancing is kept);
/// - copy (between switches): the VM's LID forwards like the destination
///   PF's LID on every switch;
/// - the destination VF holds the VM's LID, the source VF the partner LID
///   (swap) or none (copy).
pub fn check(before: &Topology, after: &Topology, plan: &Plan) -> Result<()> {
    let m = &plan.migration;
    let fail = |what: String| Err(invalid(format!("check: {what}")));
    if before.switches().len() != after.switches().len() {
        return fail("the switch count changed".into());
    }
    let (a, b) = (m.vm_lid, plan.partner_lid);
    let moved = |lid: usize| lid == usize::from(a) || (m.mode == Mode::Swap && lid == usize::from(b));
    let planned: std::collections::HashSet<(usize, u16)> = plan.lft.iter().map(|s| (s.switch, s.block)).collect();
    for (i, (x, y)) in before.switches().iter().zip(after.switches()).enumerate() {
        let n = x.lft().len().max(y.lft().len());
        for block in 0..n.div_ceil(LFT_BLOCK) as u16 {
            let (bx, by) = (x.block(block), y.block(block));
            if bx == by {
                continue;
            }
            if !planned.contains(&(i, block)) {
                return fail(format!("switch LID {}: block {block} changed but is not in the plan", x.lid));
            }
            for (j, (px, py)) in bx.iter().zip(&by).enumerate() {
                let lid = usize::from(block) * LFT_BLOCK + j;
                if px != py && !moved(lid) {
                    return fail(format!("switch LID {}: the entry of LID {lid} changed ({px} -> {py})", x.lid));
                }
            }
        }
    }
    let reaches = |t: &Topology, lid: u16, h: usize| -> Result<HashMap<(usize, u8), i64>> {
        let mut hops = HashMap::new();
        for s in 0..t.switches().len() {
            match t.walk(s, lid, |sw, port| *hops.entry((sw, port)).or_insert(0) += 1)? {
                WalkEnd::Hypervisor(got) if got == h => {}
                end => {
                    return Err(invalid(format!(
                        "check: from switch LID {}, LID {lid} ends at {end:?}, not at hypervisor {h}",
                        t.switches()[s].lid
                    )))
                }
            }
        }
        Ok(hops)
    };
    let after_a = reaches(after, a, m.to)?;
    match m.mode {
        Mode::Swap => {
            let after_b = reaches(after, b, m.from)?;
            let before_a = reaches(before, a, m.from)?;
            let before_b = reaches(before, b, m.to)?;
            // (uses before, uses after) of each output port by the two LIDs' paths.
            let mut load: HashMap<(usize, u8), (i64, i64)> = HashMap::new();
            for (map, after) in [(&before_a, false), (&before_b, false), (&after_a, true), (&after_b, true)] {
                for (k, v) in map {
                    let e = load.entry(*k).or_insert((0, 0));
                    if after {
                        e.1 += v;
                    } else {
                        e.0 += v;
                    }
                }
            }
            if let Some(((s, port), (x, y))) = load.into_iter().find(|(_, (x, y))| x != y) {
                return fail(format!(
                    "switch LID {} port {port}: the two LIDs' paths use it {y} times, {x} before (balancing changed)",
                    after.switches()[s].lid
                ));
            }
        }
        Mode::Copy if !plan.same_switch => {
            let pf = after.hypervisors()[m.to].pf_lid;
            if let Some(s) = after.switches().iter().find(|s| s.port_for(a) != s.port_for(pf)) {
                return fail(format!("switch LID {}: LID {a} does not forward like the destination PF {pf}", s.lid));
            }
        }
        Mode::Copy => {}
    }
    let vf = |h: usize, vf: usize| after.hypervisors().get(h).and_then(|x| x.vfs.get(vf)).map(|v| v.lid);
    let src_want = if m.mode == Mode::Swap { b } else { 0 };
    if vf(m.to, plan.dest_vf) != Some(a) || vf(m.from, plan.source_vf) != Some(src_want) {
        return fail("the VFs' LIDs are not the plan's".into());
    }
    Ok(())
}

/// Applies `plan` to `topology` and checks the result; on a failed check
/// the topology is restored and the check's error returned.
pub fn apply_checked(topology: &mut Topology, plan: &Plan) -> Result<()> {
    let before = topology.clone();
    apply(topology, plan)?;
    check(&before, topology, plan).inspect_err(|_| *topology = before)
}
