//! `rdmamig_fabric`, `rdmamig_fabric_plan`: the InfiniBand vSwitch
//! reconfiguration planner (`rdmamig::fabric`) for C toolstacks.

use super::args::{handle, handle_mut, items, opt_out, out_ref};
use super::handle::{free_box, to_boxed_mut_ptr, Castable};
use super::last_error::{record, record_or, Failure};
use super::status::rdmamig_status;
use rdmamig::fabric::{
    apply_checked, plan, FatTree, HypervisorSmp, Migration, Mode, Owner, Plan, Topology, LFT_BLOCK, NO_ROUTE,
};

/// An LFT entry that routes nowhere (the SM's 0xFF).
pub const RDMAMIG_FABRIC_NO_ROUTE: u8 = 0xFF;
/// LIDs per LFT block (one SMP writes one block).
pub const RDMAMIG_FABRIC_LFT_BLOCK: usize = 64;
// The C names of the planner's constants.
const _: () = assert!(RDMAMIG_FABRIC_LFT_BLOCK == LFT_BLOCK && RDMAMIG_FABRIC_NO_ROUTE == NO_ROUTE);

/// How the fabric gives LIDs to VFs (`rdmamig_fabric_plan_new`'s `mode`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rdmamig_fabric_mode {
    /// Prepopulated LIDs: the VM's LID and the destination VF's LID exchange
    /// their LFT entries on every switch where they differ (0, 1 or 2 SMPs
    /// per switch).
    RDMAMIG_FABRIC_SWAP = 0,
    /// Dynamic LID assignment: the VM's LID gets the destination PF's LFT
    /// entries wherever they differ (0 or 1 SMP per switch).
    RDMAMIG_FABRIC_COPY = 1,
}

/// What an `rdmamig_fabric_smp` is (its `kind`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum rdmamig_fabric_smp_kind {
    /// A switch's LFT block: `switch_lid`, `block`, `ports`.
    RDMAMIG_FABRIC_SMP_LFT = 0,
    /// A VF's LID: VF `vf` of `hypervisor` goes from `old_lid` to `new_lid` (0: none).
    RDMAMIG_FABRIC_SMP_VF_LID = 1,
    /// The VM's vGUID moves from VF `vf` of `hypervisor` to VF `peer_vf` of `peer_hypervisor`.
    RDMAMIG_FABRIC_SMP_VGUID = 2,
}

/// A fabric: switches (LID, ports, links, LFTs) and hypervisors (leaf switch
/// port, PF LID, VFs). Built from a generator (`rdmamig_fabric_new_fat_tree`)
/// or piece by piece from the subnet manager's tables
/// (`rdmamig_fabric_new`, `rdmamig_fabric_add_switch`,
/// `rdmamig_fabric_add_link`, `rdmamig_fabric_set_lft`,
/// `rdmamig_fabric_add_hypervisor`). Free with `rdmamig_fabric_free`.
///
/// Thread safety: not synchronised. Any number of threads may use one
/// fabric through `const` pointers at the same time; nothing may run
/// concurrently with a call taking a non-`const` pointer to it.
pub struct rdmamig_fabric {
    _private: [u8; 0],
}

impl Castable for rdmamig_fabric {
    type RustType = Topology;
}

/// The SMPs that move a VM's LID, made by `rdmamig_fabric_plan_new`: LFT
/// SMPs first (switch by switch), then the 3 hypervisor SMPs. Free with
/// `rdmamig_fabric_plan_free`. Thread safety: read-only once made; any
/// number of threads may use it at once.
pub struct rdmamig_fabric_plan {
    _private: [u8; 0],
}

impl Castable for rdmamig_fabric_plan {
    type RustType = Plan;
}

/// A plan's cost, filled by `rdmamig_fabric_plan_counts`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdmamig_fabric_counts {
    /// LFT block SMPs.
    pub lft_smps: u64,
    /// Switches with at least one LFT SMP.
    pub switches_touched: u64,
    /// SMPs to the two hypervisors (VF LIDs, vGUID): 3.
    pub hypervisor_smps: u64,
    /// `lft_smps + hypervisor_smps`.
    pub total: u64,
    /// For comparison: a full reconfiguration's LFT SMPs at least,
    /// switches × ceil((highest LID + 1) / 64).
    pub full_reconfiguration: u64,
}

/// One SMP of a plan, filled by `rdmamig_fabric_plan_smp`. Which fields
/// mean something depends on `kind` (an `rdmamig_fabric_smp_kind`); the
/// others are 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct rdmamig_fabric_smp {
    /// An `rdmamig_fabric_smp_kind` value.
    pub kind: u32,
    /// LFT: the switch's LID.
    pub switch_lid: u16,
    /// LFT: the block number (LIDs 64 * block to 64 * block + 63).
    pub block: u16,
    /// VF_LID: the hypervisor; VGUID: the source hypervisor.
    pub hypervisor: u32,
    /// VF_LID: the VF (index among the hypervisor's VFs); VGUID: the source VF.
    pub vf: u32,
    /// VGUID: the destination hypervisor.
    pub peer_hypervisor: u32,
    /// VGUID: the destination VF.
    pub peer_vf: u32,
    /// VF_LID: the VF's LID before (0: none).
    pub old_lid: u16,
    /// VF_LID: the VF's LID after (0: none).
    pub new_lid: u16,
    /// LFT: the block's 64 new entries (output ports; 255: no route).
    pub ports: [u8; RDMAMIG_FABRIC_LFT_BLOCK],
}

impl rdmamig_fabric_smp {
    fn empty() -> Self {
        rdmamig_fabric_smp {
            kind: 0,
            switch_lid: 0,
            block: 0,
            hypervisor: 0,
            vf: 0,
            peer_hypervisor: 0,
            peer_vf: 0,
            old_lid: 0,
            new_lid: 0,
            ports: [0; RDMAMIG_FABRIC_LFT_BLOCK],
        }
    }
}

/// A hypervisor of a fabric, filled by `rdmamig_fabric_get_hypervisor`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rdmamig_fabric_hypervisor {
    /// The LID of the (leaf) switch its HCA is connected to.
    pub switch_lid: u16,
    /// Its PF's LID.
    pub pf_lid: u16,
    /// The switch port its HCA is connected to.
    pub port: u32,
    /// Its number of VFs (`rdmamig_fabric_get_vf_lids` lists their LIDs).
    pub vf_count: u32,
}

fn switch_of(t: &Topology, lid: u16, f: &str) -> Result<usize, Failure> {
    t.switch_by_lid(lid).ok_or_else(|| Failure::invalid(format!("{f}: no switch has LID {lid}")))
}

fn port(p: u32, f: &str, arg: &str) -> Result<u8, Failure> {
    u8::try_from(p).map_err(|_| Failure::invalid(format!("{f}: {arg} {p} is not a port number")))
}

fn with_context(e: rdmamig::Error, f: &str) -> Failure {
    Failure::invalid(format!("{f}: {}", e.message))
}

/// A new, empty fabric (to fill from the subnet manager's tables).
///
/// Returns NULL only if rdmamig panicked. Free with `rdmamig_fabric_free`.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_new() -> *mut rdmamig_fabric {
    ffi_boundary! {
        to_boxed_mut_ptr::<rdmamig_fabric>(Topology::new())
    }
}

/// A generated fat tree of `ports`-port switches (even, 4 to 254) with
/// `levels` levels (2: leaves and spines; 3: pods of leaves and middle
/// switches, and cores), `width` leaves (2 levels) or pods (3 levels), at
/// most `ports`; `hosts_per_leaf` hypervisors on each leaf's down ports (at
/// most `ports` / 2), each with a PF and `vfs_per_hypervisor` VFs, every
/// LID assigned in order (end nodes leaf by leaf, then switches) and every
/// LFT filled with d-mod-k up/down routes. `width` or `hosts_per_leaf` 0
/// takes the full tree's (`ports`, `ports` / 2). docs/fabric.md describes
/// the shapes, the LID order and the routing.
///
/// On `RDMAMIG_OK`, `*out` is the new fabric; on failure it is left
/// unchanged. Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (a shape out of range, or more LIDs than
/// the 49151 unicast LIDs).
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_new_fat_tree(
    ports: u32,
    levels: u32,
    width: u32,
    hosts_per_leaf: u32,
    vfs_per_hypervisor: u32,
    out: *mut *mut rdmamig_fabric,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_new_fat_tree";
        record(|| {
            let out = out_ref(out, F, "out")?;
            let small = |v: u32, arg: &str| u8::try_from(v).map_err(|_| Failure::invalid(format!("{F}: {arg} {v} is too large")));
            let mut tree = FatTree::new(small(ports, "ports")?, small(levels, "levels")?);
            if width != 0 {
                tree.width = u16::try_from(width).map_err(|_| Failure::invalid(format!("{F}: width {width} is too large")))?;
            }
            if hosts_per_leaf != 0 {
                tree.hosts_per_leaf = small(hosts_per_leaf, "hosts_per_leaf")?;
            }
            tree.vfs_per_hypervisor = small(vfs_per_hypervisor, "vfs_per_hypervisor")?;
            let t = tree.generate().map_err(|e| with_context(e, F))?;
            *out = to_boxed_mut_ptr::<rdmamig_fabric>(t);
            Ok(())
        })
    }
}

/// Frees a fabric. NULL is a no-op. Must not be called twice on the same
/// fabric. Plans made from it stay valid (they hold their own copies).
#[no_mangle]
pub extern "C" fn rdmamig_fabric_free(fabric: *mut rdmamig_fabric) {
    ffi_boundary! {
        free_box(fabric)
    }
}

/// Adds a switch with LID `lid` (unicast, 0x0001 to 0xBFFF, unused so far)
/// and `ports` external ports (1 to 254; port 0 is the switch itself), with
/// an empty LFT and nothing connected.
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (LID not unicast or taken, port count out
/// of range); on failure the fabric is unchanged.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_add_switch(fabric: *mut rdmamig_fabric, lid: u16, ports: u32) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_add_switch";
        record(|| {
            let t = handle_mut(fabric, F, "fabric")?;
            t.add_switch(lid, port(ports, F, "ports")?).map_err(|e| with_context(e, F))?;
            Ok(())
        })
    }
}

/// Connects port `port_a` of the switch with LID `lid_a` to port `port_b`
/// of the switch with LID `lid_b` (both ports free so far).
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (no such switch or port, port already
/// connected); on failure the fabric is unchanged.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_add_link(
    fabric: *mut rdmamig_fabric,
    lid_a: u16,
    port_a: u32,
    lid_b: u16,
    port_b: u32,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_add_link";
        record(|| {
            let t = handle_mut(fabric, F, "fabric")?;
            let (a, b) = (switch_of(t, lid_a, F)?, switch_of(t, lid_b, F)?);
            t.connect(a, port(port_a, F, "port_a")?, b, port(port_b, F, "port_b")?).map_err(|e| with_context(e, F))?;
            Ok(())
        })
    }
}

/// Sets `count` LFT entries of the switch with LID `switch_lid`, for LIDs
/// `first_lid` to `first_lid + count - 1`, from `ports` (each an output
/// port of the switch, 0 for the switch itself, or
/// `RDMAMIG_FABRIC_NO_ROUTE`): what the subnet manager's
/// SubnGet(LinearForwardingTable) returns, block by block or all at once.
/// Entries never set route nowhere. `ports` may be NULL when `count` is 0.
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (no such switch, an entry naming a port
/// the switch does not have, or LIDs past 0xBFFF); on failure the table is
/// unchanged.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_set_lft(
    fabric: *mut rdmamig_fabric,
    switch_lid: u16,
    first_lid: u16,
    ports: *const u8,
    count: usize,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_set_lft";
        record(|| {
            let t = handle_mut(fabric, F, "fabric")?;
            let ports = items(ports, count, F, "ports")?;
            let s = switch_of(t, switch_lid, F)?;
            t.set_lft(s, first_lid, ports).map_err(|e| with_context(e, F))?;
            Ok(())
        })
    }
}

/// Copies `count` LFT entries of the switch with LID `switch_lid`, for LIDs
/// `first_lid` on, into `ports` (`RDMAMIG_FABRIC_NO_ROUTE` for LIDs the
/// table does not route). `ports` may be NULL when `count` is 0.
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (no such switch, or the range passes
/// LID 0xFFFF).
///
/// Thread safety: may run concurrently with other `const` uses of `fabric`.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_get_lft(
    fabric: *const rdmamig_fabric,
    switch_lid: u16,
    first_lid: u16,
    ports: *mut u8,
    count: usize,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_get_lft";
        record(|| {
            let t = handle(fabric, F, "fabric")?;
            let out = super::args::bytes_mut(ports, count, F, "ports")?;
            let s = &t.switches()[switch_of(t, switch_lid, F)?];
            if usize::from(first_lid) + count > 0x10000 {
                return Err(Failure::invalid(format!("{F}: LIDs {first_lid}+{count} pass 0xFFFF")));
            }
            for (i, p) in out.iter_mut().enumerate() {
                *p = s.port_for((usize::from(first_lid) + i) as u16);
            }
            Ok(())
        })
    }
}

/// Adds a hypervisor whose HCA is on port `port` of the switch with LID
/// `switch_lid`, with PF LID `pf_lid` and `vf_count` VFs whose LIDs are
/// `vf_lids` (0: a VF without a LID, under dynamic LID assignment). Every
/// LID must be unicast and not used yet; the VFs start free
/// (`rdmamig_fabric_set_vf_in_use`). Its index (counting from 0 in the
/// order of addition, the `from` / `to` of `rdmamig_fabric_plan_new`) is
/// stored in `*index_out` unless it is NULL. `vf_lids` may be NULL when
/// `vf_count` is 0.
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (no such switch or port, port already
/// connected, a LID out of range or taken); on failure the fabric is
/// unchanged.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_add_hypervisor(
    fabric: *mut rdmamig_fabric,
    switch_lid: u16,
    port_number: u32,
    pf_lid: u16,
    vf_lids: *const u16,
    vf_count: usize,
    index_out: *mut u32,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_add_hypervisor";
        record(|| {
            let t = handle_mut(fabric, F, "fabric")?;
            let vfs = items(vf_lids, vf_count, F, "vf_lids")?;
            let s = switch_of(t, switch_lid, F)?;
            let name = format!("hypervisor{}", t.hypervisors().len());
            let i = t.add_hypervisor(&name, s, port(port_number, F, "port")?, pf_lid, vfs).map_err(|e| with_context(e, F))?;
            if let Some(out) = opt_out(index_out) {
                *out = i as u32;
            }
            Ok(())
        })
    }
}

/// Marks the VF with LID `vf_lid` as used by a VM (`in_use` true) or free.
/// A plan without an explicit destination VF takes the destination's first
/// free VF.
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (no VF has that LID).
#[no_mangle]
pub extern "C" fn rdmamig_fabric_set_vf_in_use(
    fabric: *mut rdmamig_fabric,
    vf_lid: u16,
    in_use: bool,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_set_vf_in_use";
        record(|| {
            handle_mut(fabric, F, "fabric")?.set_vf_in_use(vf_lid, in_use).map_err(|e| with_context(e, F))?;
            Ok(())
        })
    }
}

/// The number of hypervisors of `fabric`. 0 when `fabric` is NULL (which
/// also sets `rdmamig_last_error_message`).
///
/// Thread safety: may run concurrently with other `const` uses of `fabric`.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_hypervisor_count(fabric: *const rdmamig_fabric) -> u32 {
    ffi_boundary! {
        record_or(0, || Ok(handle(fabric, "rdmamig_fabric_hypervisor_count", "fabric")?.hypervisors().len() as u32))
    }
}

/// Describes hypervisor `index` of `fabric` in `*out`.
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (no such hypervisor).
///
/// Thread safety: may run concurrently with other `const` uses of `fabric`.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_get_hypervisor(
    fabric: *const rdmamig_fabric,
    index: u32,
    out: *mut rdmamig_fabric_hypervisor,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_get_hypervisor";
        record(|| {
            let t = handle(fabric, F, "fabric")?;
            let out = out_ref(out, F, "out")?;
            let h = t.hypervisors().get(index as usize).ok_or_else(|| Failure::invalid(format!("{F}: no hypervisor {index}")))?;
            *out = rdmamig_fabric_hypervisor {
                switch_lid: t.switches()[h.switch].lid,
                pf_lid: h.pf_lid,
                port: u32::from(h.port),
                vf_count: h.vfs.len() as u32,
            };
            Ok(())
        })
    }
}

/// Copies the VF LIDs of hypervisor `index` (0 for a VF without a LID) into
/// `lids`, which has room for `count`; `*written` is set to the number of
/// VFs. Fewer than that room gives `RDMAMIG_ERR_BUFFER_TOO_SMALL` (with
/// `*written` set, so `(NULL, 0)` asks for the number).
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER`,
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (no such hypervisor) or
/// `RDMAMIG_ERR_BUFFER_TOO_SMALL`.
///
/// Thread safety: may run concurrently with other `const` uses of `fabric`.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_get_vf_lids(
    fabric: *const rdmamig_fabric,
    index: u32,
    lids: *mut u16,
    count: usize,
    written: *mut usize,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_get_vf_lids";
        record(|| {
            let t = handle(fabric, F, "fabric")?;
            let written = out_ref(written, F, "written")?;
            let out = super::handle::try_slice_mut(lids, count).ok_or_else(|| Failure::null(F, "lids"))?;
            let h = t.hypervisors().get(index as usize).ok_or_else(|| Failure::invalid(format!("{F}: no hypervisor {index}")))?;
            *written = h.vfs.len();
            if out.len() < h.vfs.len() {
                return Err(Failure::new(
                    rdmamig_status::RDMAMIG_ERR_BUFFER_TOO_SMALL,
                    format!("{F}: {} VFs, room for {count}", h.vfs.len()),
                ));
            }
            for (o, v) in out.iter_mut().zip(&h.vfs) {
                *o = v.lid;
            }
            Ok(())
        })
    }
}

/// The hypervisor holding `lid` (as its PF's or a VF's LID), in `*index`.
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (no hypervisor holds it).
///
/// Thread safety: may run concurrently with other `const` uses of `fabric`.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_hypervisor_of_lid(
    fabric: *const rdmamig_fabric,
    lid: u16,
    index: *mut u32,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_hypervisor_of_lid";
        record(|| {
            let t = handle(fabric, F, "fabric")?;
            let index = out_ref(index, F, "index")?;
            *index = match t.owner(lid) {
                Some(Owner::Pf(h)) | Some(Owner::Vf { hypervisor: h, .. }) => h as u32,
                _ => return Err(Failure::invalid(format!("{F}: no hypervisor holds LID {lid}"))),
            };
            Ok(())
        })
    }
}

/// Plans the migration of the VM with LID `vm_lid` (a VF LID of hypervisor
/// `from`) to hypervisor `to`, in `mode` (an `rdmamig_fabric_mode` value),
/// onto the VF holding `dest_vf_lid`, or when it is 0 onto `to`'s first free
/// VF (swap: with a LID). The plan lists every SMP (`rdmamig_fabric_plan_smp`)
/// and their count (`rdmamig_fabric_plan_counts`); `fabric` is not changed
/// (`rdmamig_fabric_apply` does that). When `from` and `to` share a leaf
/// switch only that switch is rewritten: 1 LFT SMP when both LIDs are in one
/// 64-LID block.
///
/// On `RDMAMIG_OK`, `*out` is the new plan; on failure it is left unchanged.
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (unknown mode, hypervisor or LID; `vm_lid`
/// not a VF LID of `from`; `from` equal to `to`; `dest_vf_lid` not a free VF
/// of `to`; no free VF).
///
/// Thread safety: may run concurrently with other `const` uses of `fabric`.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_plan_new(
    fabric: *const rdmamig_fabric,
    vm_lid: u16,
    from: u32,
    to: u32,
    mode: u32,
    dest_vf_lid: u16,
    out: *mut *mut rdmamig_fabric_plan,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_plan_new";
        record(|| {
            let t = handle(fabric, F, "fabric")?;
            let out = out_ref(out, F, "out")?;
            let mode = match mode {
                m if m == rdmamig_fabric_mode::RDMAMIG_FABRIC_SWAP as u32 => Mode::Swap,
                m if m == rdmamig_fabric_mode::RDMAMIG_FABRIC_COPY as u32 => Mode::Copy,
                other => return Err(Failure::invalid(format!("{F}: unknown mode {other}"))),
            };
            let m = Migration {
                vm_lid,
                from: from as usize,
                to: to as usize,
                mode,
                dest_vf_lid: (dest_vf_lid != 0).then_some(dest_vf_lid),
            };
            let p = plan(t, &m).map_err(|e| with_context(e, F))?;
            *out = to_boxed_mut_ptr::<rdmamig_fabric_plan>(p);
            Ok(())
        })
    }
}

/// Frees a plan. NULL is a no-op. Must not be called twice on the same plan.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_plan_free(plan: *mut rdmamig_fabric_plan) {
    ffi_boundary! {
        free_box(plan)
    }
}

/// The plan's cost in `*out`.
///
/// Returns `RDMAMIG_OK` or `RDMAMIG_ERR_NULL_PARAMETER`.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_plan_counts(
    plan: *const rdmamig_fabric_plan,
    out: *mut rdmamig_fabric_counts,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_plan_counts";
        record(|| {
            let c = handle(plan, F, "plan")?.counts;
            *out_ref(out, F, "out")? = rdmamig_fabric_counts {
                lft_smps: c.lft_smps,
                switches_touched: c.switches_touched,
                hypervisor_smps: c.hypervisor_smps,
                total: c.total,
                full_reconfiguration: c.full_reconfiguration,
            };
            Ok(())
        })
    }
}

/// SMP `index` of the plan in `*out`: indexes 0 to `lft_smps - 1` are the
/// LFT SMPs, the next `hypervisor_smps` (3) the hypervisor SMPs: the
/// source VF's LID, the destination VF's LID, the vGUID
/// (`rdmamig_fabric_plan_counts`; `total` in all).
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (`index` not below `total`).
#[no_mangle]
pub extern "C" fn rdmamig_fabric_plan_smp(
    plan: *const rdmamig_fabric_plan,
    index: usize,
    out: *mut rdmamig_fabric_smp,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_plan_smp";
        record(|| {
            let p = handle(plan, F, "plan")?;
            let out = out_ref(out, F, "out")?;
            let mut smp = rdmamig_fabric_smp::empty();
            if let Some(l) = p.lft.get(index) {
                smp.kind = rdmamig_fabric_smp_kind::RDMAMIG_FABRIC_SMP_LFT as u32;
                smp.switch_lid = l.switch_lid;
                smp.block = l.block;
                smp.ports = l.ports;
            } else {
                match p.hypervisor.get(index - p.lft.len()) {
                    Some(HypervisorSmp::VfLid { hypervisor, vf, old_lid, new_lid }) => {
                        smp.kind = rdmamig_fabric_smp_kind::RDMAMIG_FABRIC_SMP_VF_LID as u32;
                        (smp.hypervisor, smp.vf, smp.old_lid, smp.new_lid) = (*hypervisor as u32, *vf as u32, *old_lid, *new_lid);
                    }
                    Some(HypervisorSmp::Vguid { from, from_vf, to, to_vf }) => {
                        smp.kind = rdmamig_fabric_smp_kind::RDMAMIG_FABRIC_SMP_VGUID as u32;
                        (smp.hypervisor, smp.vf) = (*from as u32, *from_vf as u32);
                        (smp.peer_hypervisor, smp.peer_vf) = (*to as u32, *to_vf as u32);
                    }
                    None => {
                        let total = p.lft.len() + p.hypervisor.len();
                        return Err(Failure::invalid(format!("{F}: no SMP {index} (the plan has {total})")));
                    }
                }
            }
            *out = smp;
            Ok(())
        })
    }
}

/// Applies `plan` to `fabric` (its LFT blocks and VF LIDs, what sending the
/// SMPs does; the destination VF is then in use, the source VF free) and
/// checks the result: from every switch the VM's LID reaches the
/// destination hypervisor's port without a loop, no other LID's entry
/// changed (swap: the partner LID now reaches the source, and the two LIDs'
/// paths use each port as often as before; copy: the VM's LID forwards like
/// the destination PF). If the check fails, `fabric` is restored.
///
/// Returns `RDMAMIG_OK`, `RDMAMIG_ERR_NULL_PARAMETER` or
/// `RDMAMIG_ERR_INVALID_ARGUMENT` (the plan is not for this fabric as it
/// is now, e.g. one of its LFT blocks changed since the plan was made,
/// because another plan was applied: plan again; or the check failed: the
/// message says where). Two plans made on one state of a fabric are not
/// both valid: their SMPs, sent one after the other, could undo each other.
#[no_mangle]
pub extern "C" fn rdmamig_fabric_apply(
    fabric: *mut rdmamig_fabric,
    plan: *const rdmamig_fabric_plan,
) -> rdmamig_status {
    ffi_boundary! {
        const F: &str = "rdmamig_fabric_apply";
        record(|| {
            let t = handle_mut(fabric, F, "fabric")?;
            let p = handle(plan, F, "plan")?;
            apply_checked(t, p).map_err(|e| with_context(e, F))?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmamig_status::*;
    use std::ptr::{null, null_mut};

    #[test]
    fn a_fabric_built_piece_by_piece_plans_like_the_rust_api() {
        // Two leaves (LIDs 1, 2) under one spine (3); two hypervisors per leaf.
        let f = rdmamig_fabric_new();
        for (lid, ports) in [(1, 4), (2, 4), (3, 4)] {
            assert_eq!(rdmamig_fabric_add_switch(f, lid, ports), RDMAMIG_OK);
        }
        assert_eq!(rdmamig_fabric_add_switch(f, 1, 4), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_fabric_add_link(f, 1, 4, 3, 1), RDMAMIG_OK);
        assert_eq!(rdmamig_fabric_add_link(f, 2, 4, 3, 2), RDMAMIG_OK);
        assert_eq!(rdmamig_fabric_add_link(f, 2, 4, 3, 3), RDMAMIG_ERR_INVALID_ARGUMENT, "port taken");
        // Hypervisors: leaf 1 ports 1, 2: PF 10 VF 11, PF 12 VF 13; leaf 2: PF 20 VF 21, PF 22 VF 23.
        let mut idx = 99;
        for (sw, port, pf) in [(1u16, 1u32, 10u16), (1, 2, 12), (2, 1, 20), (2, 2, 22)] {
            assert_eq!(rdmamig_fabric_add_hypervisor(f, sw, port, pf, [pf + 1].as_ptr(), 1, &mut idx), RDMAMIG_OK);
        }
        assert_eq!(idx, 3);
        assert_eq!(rdmamig_fabric_hypervisor_count(f), 4);
        let route = |leaf: u16| -> Vec<u8> {
            (0..24u16)
                .map(|lid| match lid {
                    10..=13 if leaf == 1 => [1, 1, 2, 2][usize::from(lid - 10)],
                    20..=23 if leaf == 2 => [1, 1, 2, 2][usize::from(lid - 20)],
                    10..=13 | 20..=23 => 4,
                    _ => RDMAMIG_FABRIC_NO_ROUTE,
                })
                .collect()
        };
        assert_eq!(rdmamig_fabric_set_lft(f, 1, 0, route(1).as_ptr(), 24), RDMAMIG_OK);
        assert_eq!(rdmamig_fabric_set_lft(f, 2, 0, route(2).as_ptr(), 24), RDMAMIG_OK);
        let spine: Vec<u8> = (10..24).map(|lid| if lid < 20 { 1 } else { 2 }).collect();
        assert_eq!(rdmamig_fabric_set_lft(f, 3, 10, spine.as_ptr(), spine.len()), RDMAMIG_OK);
        assert_eq!(rdmamig_fabric_set_lft(f, 3, 10, [7].as_ptr(), 1), RDMAMIG_ERR_INVALID_ARGUMENT);

        let mut p = null_mut();
        assert_eq!(rdmamig_fabric_plan_new(f, 11, 0, 2, 0, 0, &mut p), RDMAMIG_OK);
        let mut c = rdmamig_fabric_counts::default();
        assert_eq!(rdmamig_fabric_plan_counts(p, &mut c), RDMAMIG_OK);
        assert_eq!((c.lft_smps, c.switches_touched, c.total), (3, 3, 6));
        let mut smp = rdmamig_fabric_smp::empty();
        assert_eq!(rdmamig_fabric_plan_smp(p, 2, &mut smp), RDMAMIG_OK);
        assert_eq!((smp.kind, smp.switch_lid, smp.block, smp.ports[11], smp.ports[21]), (0, 3, 0, 2, 1));
        assert_eq!(rdmamig_fabric_plan_smp(p, 5, &mut smp), RDMAMIG_OK);
        assert_eq!((smp.kind, smp.hypervisor, smp.peer_hypervisor), (2, 0, 2));
        assert_eq!(rdmamig_fabric_plan_smp(p, 6, &mut smp), RDMAMIG_ERR_INVALID_ARGUMENT);
        assert_eq!(rdmamig_fabric_apply(f, p), RDMAMIG_OK);
        let mut got = [0u8; 2];
        assert_eq!(rdmamig_fabric_get_lft(f, 3, 11, got.as_mut_ptr(), 1), RDMAMIG_OK);
        assert_eq!(got[0], 2, "the spine now sends LID 11 to leaf 2");
        assert_eq!(rdmamig_fabric_apply(f, p), RDMAMIG_ERR_INVALID_ARGUMENT, "applied twice");
        let mut h = 9;
        assert_eq!(rdmamig_fabric_hypervisor_of_lid(f, 11, &mut h), RDMAMIG_OK);
        assert_eq!(h, 2);
        rdmamig_fabric_plan_free(p);
        assert_eq!(rdmamig_fabric_plan_new(f, 11, 2, 3, 7, 0, &mut p), RDMAMIG_ERR_INVALID_ARGUMENT, "mode 7");
        assert_eq!(rdmamig_fabric_plan_new(null(), 11, 2, 3, 0, 0, &mut p), RDMAMIG_ERR_NULL_PARAMETER);
        rdmamig_fabric_free(f);
        rdmamig_fabric_free(null_mut());
        rdmamig_fabric_plan_free(null_mut());
    }
}
