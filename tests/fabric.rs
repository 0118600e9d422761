//! The vSwitch reconfiguration planner (src/fabric) on generated fat trees:
//! Table I of Tasoulas et al. (IEEE Cluster 2015) reproduced and its plans
//! applied and checked, the same-leaf and worst-case costs, random pairs in
//! both modes, refused inputs, and a broken plan caught by the check.

use std::time::Instant;

use rdmamig::fabric::{
    apply, apply_checked, check, plan, same_leaf_pair, table_row, worst_case_pair, FatTree, Migration, Mode, Topology,
    TABLE_I_TREES,
};
use rdmamig::ErrorKind;

/// Table I of the paper: nodes, switches, LIDs, min LFT blocks per switch,
/// min SMPs full reconfiguration, min and max SMPs swap-or-copy.
const TABLE_I: [[u64; 7]; 4] = [
    [324, 36, 360, 6, 216, 1, 72],
    [648, 54, 702, 11, 594, 1, 108],
    [5832, 972, 6804, 107, 104004, 1, 1944],
    [11664, 1620, 13284, 208, 336960, 1, 3240],
];

fn planned_applied_checked(t: &Topology, m: &Migration) -> rdmamig::fabric::Plan {
    let p = plan(t, m).unwrap_or_else(|e| panic!("{m:?}: {e}"));
    let mut after = t.clone();
    apply(&mut after, &p).unwrap();
    check(t, &after, &p).unwrap_or_else(|e| panic!("{m:?}: {e}"));
    p
}

#[test]
fn table_i_reproduced_and_its_plans_checked() {
    println!("nodes  switches  LIDs   blocks/switch  full-min  swap/copy-min  swap-max  (copy-max)  time");
    for (tree, want) in TABLE_I_TREES.iter().zip(TABLE_I) {
        let t0 = Instant::now();
        let row = table_row(tree).unwrap();
        let got = [row.nodes, row.switches, row.lids, row.blocks_per_switch, row.full_min, row.swap_min, row.swap_max];
        println!(
            "{:5}  {:8}  {:5}  {:13}  {:8}  {:6}/{:<6}  {:8}  ({:8})  {:?}",
            row.nodes,
            row.switches,
            row.lids,
            row.blocks_per_switch,
            row.full_min,
            row.swap_min,
            row.copy_min,
            row.swap_max,
            row.copy_max,
            t0.elapsed()
        );
        assert_eq!(got, want, "{tree:?}");
        assert_eq!(row.copy_min, 1);
        // The worst case is 2 SMPs on every switch, the bound.
        assert_eq!(row.swap_max, 2 * row.switches);
        assert!(row.copy_max <= row.switches);
        let t = tree.generate().unwrap();
        for pair in [row.min_pair, row.max_pair] {
            for mode in [Mode::Swap, Mode::Copy] {
                let p = planned_applied_checked(&t, &pair.migration(mode));
                assert_eq!(p.counts.hypervisor_smps, 3);
                assert_eq!(p.counts.total, p.counts.lft_smps + 3);
                assert_eq!(p.counts.full_reconfiguration, row.full_min);
            }
        }
        let max = plan(&t, &row.max_pair.migration(Mode::Swap)).unwrap();
        assert_eq!(max.counts.switches_touched, row.switches, "every switch");
    }
}

#[test]
fn same_leaf_move_is_one_lft_smp_and_the_worst_case_at_most_two_per_switch() {
    for tree in [FatTree::new(8, 2), FatTree::new(8, 3), FatTree { vfs_per_hypervisor: 3, ..FatTree::new(12, 3) }] {
        let t = tree.generate().unwrap();
        let s = t.switches().len() as u64;
        let pair = same_leaf_pair(&t).unwrap();
        for mode in [Mode::Swap, Mode::Copy] {
            let p = planned_applied_checked(&t, &pair.migration(mode));
            assert_eq!((p.counts.lft_smps, p.counts.switches_touched), (1, 1), "{tree:?} {mode:?}");
            assert_eq!(p.lft[0].switch, t.hypervisors()[pair.from].switch);
            assert_eq!(p.counts.total, 4);
        }
        // Every same-leaf pair of VFs: 1 SMP, 2 if the two LIDs are in different blocks.
        let h = t.hypervisors();
        for (from, to) in [(0, 1), (1, 0), (0, usize::from(tree.hosts_per_leaf) - 1)] {
            for (a, b) in h[from].vfs.iter().zip(&h[to].vfs) {
                let m = Migration { vm_lid: a.lid, from, to, mode: Mode::Swap, dest_vf_lid: Some(b.lid) };
                let p = planned_applied_checked(&t, &m);
                assert_eq!(p.counts.lft_smps, if a.lid / 64 == b.lid / 64 { 1 } else { 2 });
            }
        }
        let worst = worst_case_pair(&t).unwrap();
        let p = planned_applied_checked(&t, &worst.migration(Mode::Swap));
        assert_eq!(p.counts.lft_smps, 2 * s, "{tree:?}: the found pair costs the bound");
        let c = planned_applied_checked(&t, &worst.migration(Mode::Copy));
        assert!(c.counts.lft_smps <= s);
    }
}

/// A deterministic generator (SplitMix64) for the sample of pairs.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn random_pairs_in_both_modes_planned_applied_checked() {
    let mut rng = Rng(14);
    for (tree, samples) in [(TABLE_I_TREES[1], 60), (TABLE_I_TREES[2], 30), (FatTree::new(6, 3), 60)] {
        let mut t = tree.generate().unwrap();
        let s = t.switches().len() as u64;
        let h = t.hypervisors().len();
        let mut moved = 0;
        for _ in 0..samples {
            let (from, to) = (rng.below(h), rng.below(h));
            if from == to {
                continue;
            }
            let vfs = &t.hypervisors()[from].vfs;
            let vm = vfs[rng.below(vfs.len())].lid;
            if vm == 0 {
                continue; // a VF a copy move left without a LID
            }
            let mode = if rng.below(2) == 0 { Mode::Swap } else { Mode::Copy };
            let m = Migration { vm_lid: vm, from, to, mode, dest_vf_lid: None };
            let p = match plan(&t, &m) {
                Ok(p) => p,
                Err(e) => {
                    // Only a destination whose VFs are all taken (by earlier moves) is refused.
                    assert!(e.message.contains("no free VF"), "{m:?}: {e}");
                    assert!(t.hypervisors()[to].vfs.iter().all(|v| v.in_use || (mode == Mode::Swap && v.lid == 0)));
                    continue;
                }
            };
            let per_switch = if mode == Mode::Swap { 2 } else { 1 };
            assert!(p.counts.lft_smps <= per_switch * s);
            // Chained: each move is applied to the fabric the previous ones left.
            apply_checked(&mut t, &p).unwrap_or_else(|e| panic!("{m:?}: {e}"));
            moved += 1;
        }
        assert!(moved > samples / 2, "{moved} of {samples} moved");
    }
}

#[test]
fn invalid_inputs_are_refused() {
    let t = FatTree::new(8, 2).generate().unwrap();
    let h = t.hypervisors();
    let (vf0, pf0) = (h[0].vfs[0].lid, h[0].pf_lid);
    let m = Migration { vm_lid: vf0, from: 0, to: 5, mode: Mode::Swap, dest_vf_lid: None };
    let refused = |m: Migration, words: &str| {
        let e = plan(&t, &m).expect_err(words);
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains(words), "{:?} lacks {words:?}", e.message);
    };
    refused(Migration { vm_lid: 4000, ..m }, "unknown LID 4000");
    refused(Migration { vm_lid: pf0, ..m }, "not on a VF of the source");
    refused(Migration { vm_lid: h[1].vfs[0].lid, ..m }, "not on a VF of the source");
    refused(Migration { to: 0, ..m }, "same hypervisor");
    refused(Migration { to: 999, ..m }, "no destination hypervisor 999");
    refused(Migration { dest_vf_lid: Some(h[6].vfs[0].lid), ..m }, "not a VF LID of the destination");
    refused(Migration { dest_vf_lid: Some(9999), ..m }, "unknown destination VF LID");
    let mut busy = t.clone();
    busy.set_vf_in_use(h[5].vfs[0].lid, true).unwrap();
    let e = plan(&busy, &m).unwrap_err();
    assert!(e.message.contains("has no free VF"), "{e}");
    let e = plan(&busy, &Migration { dest_vf_lid: Some(h[5].vfs[0].lid), ..m }).unwrap_err();
    assert!(e.message.contains("in use"), "{e}");

    // The topology's own checks.
    let mut t = Topology::new();
    assert!(t.add_switch(0, 8).is_err(), "LID 0");
    assert!(t.add_switch(0xC000, 8).is_err(), "multicast LID");
    let s = t.add_switch(1, 8).unwrap();
    assert!(t.add_switch(1, 8).unwrap_err().message.contains("already held"));
    assert!(t.add_switch(2, 255).is_err(), "too many ports");
    assert!(t.set_lft(s, 1, &[9]).unwrap_err().message.contains("port 9"));
    assert!(t.set_lft(s, 0xBFFF, &[1, 1]).is_err(), "past the unicast LIDs");
    assert!(t.add_hypervisor("h", s, 9, 10, &[11]).is_err(), "no port 9");
    assert!(t.add_hypervisor("h", s, 1, 10, &[10]).unwrap_err().message.contains("twice"));
    assert!(t.add_hypervisor("h", s, 1, 1, &[11]).unwrap_err().message.contains("already held"));
    assert_eq!(t.hypervisors().len(), 0, "a refusal changes nothing");
    t.add_hypervisor("h", s, 1, 10, &[11]).unwrap();
    assert!(t.add_hypervisor("g", s, 1, 12, &[]).unwrap_err().message.contains("already connected"));
    assert!(FatTree::new(7, 2).generate().is_err(), "odd port count");
    assert!(FatTree::new(8, 4).generate().is_err(), "4 levels");
    assert!(FatTree { hosts_per_leaf: 5, ..FatTree::new(8, 2) }.generate().is_err());
    assert!(FatTree { vfs_per_hypervisor: 255, ..FatTree::new(36, 3) }
        .generate()
        .unwrap_err()
        .message
        .contains("LIDs"));
}

/// Two plans made on one state of the fabric: once the first is applied,
/// the second (which shares an LFT block with it) is refused and changes
/// nothing, rather than undo the first's entries.
#[test]
fn a_plan_made_before_another_was_applied_is_refused() {
    let t = FatTree::new(8, 2).generate().unwrap();
    let pair = same_leaf_pair(&t).unwrap();
    let first = plan(&t, &pair.migration(Mode::Copy)).unwrap();
    // Another VM, on a third hypervisor of that leaf, to the last hypervisor (another leaf).
    let (from, to) = (2, t.hypervisors().len() - 1);
    assert!(![pair.from, pair.to].contains(&from) && ![pair.from, pair.to].contains(&to));
    let vm = t.hypervisors()[from].vfs[0].lid;
    let other = Migration { vm_lid: vm, from, to, mode: Mode::Copy, dest_vf_lid: None };
    let second = plan(&t, &other).unwrap();
    assert!(
        second.lft.iter().any(|s| first.lft.iter().any(|f| (f.switch, f.block) == (s.switch, s.block))),
        "the two plans share no LFT block"
    );
    let mut after = t.clone();
    apply_checked(&mut after, &first).unwrap();
    let before_second = after.clone();
    let e = apply(&mut after, &second).unwrap_err();
    assert!(e.message.contains("changed since the plan was made"), "{e}");
    assert_eq!(after, before_second, "a refused plan changes nothing");
    // Planned again on the new state, it applies and checks.
    let again = plan(&after, &other).unwrap();
    apply_checked(&mut after, &again).unwrap();
}

/// The check catches a plan that breaks the rules: one LFT SMP dropped
/// (the VM's LID no longer reaches the destination from that switch), a
/// wrong port written for another LID, and a swap that moves only one LID.
#[test]
fn a_broken_plan_fails_the_check() {
    let t = FatTree::new(8, 3).generate().unwrap();
    let worst = worst_case_pair(&t).unwrap();
    let good = plan(&t, &worst.migration(Mode::Swap)).unwrap();
    let fails = |p: &rdmamig::fabric::Plan, words: &str| {
        let mut after = t.clone();
        let e = apply_checked(&mut after, p).expect_err(words);
        assert!(e.message.contains(words), "{:?} lacks {words:?}", e.message);
        assert_eq!(after, t, "a failed check restores the topology");
    };
    let mut dropped = good.clone();
    dropped.lft.remove(0);
    fails(&dropped, "not at hypervisor");
    let mut other = good.clone();
    let lid = usize::from(t.switches()[0].lid);
    let smp = other.lft.iter_mut().find(|s| usize::from(s.block) == lid / 64).expect("a block with a switch LID");
    smp.ports[lid % 64] ^= 1;
    fails(&other, "changed");
    // A swap that gives the VM's LID the destination's path but leaves the
    // partner's entries alone.
    let mut half = good.clone();
    half.lft.retain(|s| s.block == worst.vm_lid / 64);
    fails(&half, &format!("LID {} ends at Hypervisor({})", good.partner_lid, worst.to));
    let mut after = t.clone();
    apply_checked(&mut after, &good).unwrap();

    // On a leaf that is neither's, send the VM's LID up another port: it
    // still arrives (every spine now forwards it to the destination), but
    // the SM's balancing is not kept, and only that check sees it.
    let t = FatTree::new(8, 2).generate().unwrap();
    let worst = worst_case_pair(&t).unwrap();
    let mut skewed = plan(&t, &worst.migration(Mode::Swap)).unwrap();
    let (hf, ht) = (t.hypervisors()[worst.from].switch, t.hypervisors()[worst.to].switch);
    let vm = usize::from(worst.vm_lid);
    let smp = skewed
        .lft
        .iter_mut()
        .find(|s| s.switch != hf && s.switch != ht && s.switch < 8 && usize::from(s.block) == vm / 64)
        .unwrap();
    let (old, partner) = (t.switches()[smp.switch].port_for(worst.vm_lid), smp.ports[vm % 64]);
    smp.ports[vm % 64] = (5..=8).find(|p| *p != old && *p != partner).unwrap();
    let mut after = t.clone();
    let e = apply_checked(&mut after, &skewed).unwrap_err();
    assert!(e.message.contains("balancing changed"), "{e}");
}
