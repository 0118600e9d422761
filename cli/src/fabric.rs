//! `rdmamig fabric-plan`: the InfiniBand vSwitch reconfiguration planner
//! (`rdmamig::fabric`) on a generated fat tree or a topology file.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use rdmamig::fabric::{
    apply_checked, plan, same_leaf_pair, table_i, worst_case_pair, FatTree, HypervisorSmp, LftSmp, Migration, Mode,
    Plan, Topology, LFT_BLOCK, NO_ROUTE,
};
use serde_json::{json, Value};

use crate::EXIT_FAIL;

/// Plan the fabric side of migrating a VM that owns an InfiniBand SR-IOV VF.
///
/// With the vSwitch architecture each VF has its own LID, and moving a VM's
/// LID means rewriting a few Linear Forwarding Table (LFT) entries instead
/// of recomputing every route. This prints the Subnet Management Packets
/// (SMPs) the subnet manager must send: each LFT block (switch LID, block
/// number, its 64 new entries), the 3 hypervisor SMPs (the source VF's LID,
/// the destination VF's LID, the vGUID), their counts, and what a full
/// reconfiguration would cost instead (switches × ceil((highest LID + 1) /
/// 64) LFT SMPs). The plan is applied to a copy of the fabric and checked:
/// from every switch the VM's LID reaches the destination hypervisor, no
/// other LID's route changed.
///
/// Swap (prepopulated LIDs): the VM's LID and the destination VF's LID
/// exchange their entries on every switch where they differ (0, 1 or 2
/// SMPs per switch: 1 when both are in one 64-LID block). Copy (dynamic LID
/// assignment): the VM's LID takes the destination PF's entries where they
/// differ (0 or 1 SMP per switch). When both hypervisors are on the same
/// leaf, only that leaf is rewritten.
///
/// The fabric is a fat tree (--fat-tree K --levels 2|3, d-mod-k routing,
/// LIDs in order: end nodes leaf by leaf, each hypervisor's PF then its VFs,
/// then the switches) or a JSON file (--topology FILE):
///
///   {"switches": [{"lid": 1, "ports": 36, "lft": [255, 3, ...]}, ...],
///    "links": [[1, 19, 37, 1], ...],
///    "hypervisors": [{"name": "h0", "switch": 1, "port": 1, "pf_lid": 10,
///                     "vf_lids": [11, 12], "vfs_in_use": [12]}, ...]}
///
/// "lft" lists the output port for LIDs 0, 1, 2, ... (255: no route; 0:
/// the switch itself); "lft_first_lid" may say it starts at another LID.
/// A link is [switch LID, port, switch LID, port]; "switch" is the
/// hypervisor's leaf switch LID; a VF LID of 0 is a VF without a LID.
/// Hypervisors are named by --from/--to with their name or index.
#[derive(Args, Debug)]
#[command(after_help = "Exit status: 0 the plan was made and its check passed, 1 the migration cannot be planned \
                        (unknown LID, VM LID not on the source, no free VF, bad topology file) or the check \
                        failed, 2 usage error.\n\n\
                        Examples:\n  rdmamig fabric-plan --table-i\n  \
                        rdmamig fabric-plan --fat-tree 36 --levels 3 --pair worst-case --json\n  \
                        rdmamig fabric-plan --topology fabric.json --vm-lid 11 --from h0 --to h3 --mode copy")]
pub struct FabricPlanArgs {
    /// Generate a fat tree of K-port switches (K even).
    #[arg(long, value_name = "K", required_unless_present_any = ["topology", "table_i"], conflicts_with = "topology")]
    fat_tree: Option<u8>,
    /// Fat tree: 2 (leaves, spines) or 3 (pods of leaves and middles, cores) levels.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(2..=3))]
    levels: u8,
    /// Fat tree: leaves (2 levels) or pods (3 levels); default K.
    #[arg(long, value_name = "N")]
    width: Option<u16>,
    /// Fat tree: hypervisors per leaf, on its first down ports; default K/2.
    #[arg(long, value_name = "N")]
    hosts: Option<u8>,
    /// Fat tree: VFs per hypervisor, each with a LID.
    #[arg(long, value_name = "N", default_value_t = 1)]
    vfs: u8,
    /// Read the fabric from a JSON file (schema above).
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// The VM's LID (a VF LID of the source hypervisor).
    #[arg(long, value_name = "LID", required_unless_present_any = ["pair", "table_i"], requires_all = ["from", "to"])]
    vm_lid: Option<u16>,
    /// The source hypervisor: its name or index.
    #[arg(long, value_name = "HYP")]
    from: Option<String>,
    /// The destination hypervisor: its name or index.
    #[arg(long, value_name = "HYP")]
    to: Option<String>,
    /// Pick the migration: the first same-leaf pair of VFs in one LFT block,
    /// or a worst-case pair (entries differ on every switch, LIDs in two blocks).
    #[arg(long, value_enum, conflicts_with_all = ["vm_lid", "from", "to", "dest_vf"])]
    pair: Option<PairArg>,
    /// swap (prepopulated LIDs) or copy (dynamic LID assignment).
    #[arg(long, value_enum, default_value = "swap")]
    mode: ModeArg,
    /// The destination VF, by its LID (default: the first free VF; swap: with a LID).
    #[arg(long, value_name = "LID")]
    dest_vf: Option<u16>,
    /// Print one JSON object on stdout (counts, SMPs, check) instead of the report.
    #[arg(long)]
    json: bool,
    /// Print Table I of Tasoulas et al. (IEEE Cluster 2015) as the generators
    /// and the planner reproduce it (36-port fat trees).
    #[arg(long, conflicts_with_all = ["fat_tree", "topology", "vm_lid", "pair"])]
    table_i: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Swap,
    Copy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PairArg {
    SameLeaf,
    WorstCase,
}

fn fail(message: String) -> ExitCode {
    eprintln!("rdmamig fabric-plan: {message}");
    ExitCode::from(EXIT_FAIL)
}

pub fn run(args: FabricPlanArgs) -> ExitCode {
    if args.table_i {
        return print_table_i(args.json);
    }
    let (topology, description) = match load(&args) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let migration = match migration(&args, &topology) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let p = match plan(&topology, &migration) {
        Ok(p) => p,
        Err(e) => return fail(e.message),
    };
    let mut after = topology.clone();
    let check = apply_checked(&mut after, &p).map_err(|e| e.message);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&topology, &p, &check)).expect("JSON"));
    } else {
        print_report(&topology, &description, &p, &check);
    }
    match check {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn load(args: &FabricPlanArgs) -> Result<(Topology, String), String> {
    if let Some(path) = &args.topology {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let t = parse_topology(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok((t, format!("{}", path.display())));
    }
    let k = args.fat_tree.expect("clap requires --fat-tree or --topology");
    let mut tree = FatTree::new(k, args.levels);
    tree.width = args.width.unwrap_or(tree.width);
    tree.hosts_per_leaf = args.hosts.unwrap_or(tree.hosts_per_leaf);
    tree.vfs_per_hypervisor = args.vfs;
    let t = tree.generate().map_err(|e| e.message)?;
    let what = if tree.levels == 2 { "leaves" } else { "pods" };
    Ok((
        t,
        format!(
            "{}-level fat tree of {k}-port switches, {} {what}, {} hypervisors per leaf with {} VF(s) each",
            tree.levels, tree.width, tree.hosts_per_leaf, tree.vfs_per_hypervisor
        ),
    ))
}

fn hypervisor(t: &Topology, name: &str) -> Result<usize, String> {
    t.hypervisor_by_name(name)
        .or_else(|| name.parse::<usize>().ok().filter(|&i| i < t.hypervisors().len()))
        .ok_or_else(|| format!("no hypervisor {name:?} (a name or an index below {})", t.hypervisors().len()))
}

fn migration(args: &FabricPlanArgs, t: &Topology) -> Result<Migration, String> {
    let mode = match args.mode {
        ModeArg::Swap => Mode::Swap,
        ModeArg::Copy => Mode::Copy,
    };
    if let Some(pair) = args.pair {
        let found = match pair {
            PairArg::SameLeaf => same_leaf_pair(t),
            PairArg::WorstCase => worst_case_pair(t),
        };
        return found.map(|p| p.migration(mode)).ok_or_else(|| format!("this fabric has no {pair:?} pair"));
    }
    let need = |v: &Option<String>, what: &str| v.clone().ok_or_else(|| format!("--{what} is required"));
    Ok(Migration {
        vm_lid: args.vm_lid.expect("clap requires --vm-lid or --pair"),
        from: hypervisor(t, &need(&args.from, "from")?)?,
        to: hypervisor(t, &need(&args.to, "to")?)?,
        mode,
        dest_vf_lid: args.dest_vf,
    })
}

/// The entries an LFT SMP changes: (LID, old port, new port).
fn changes(smp: &LftSmp) -> Vec<(u16, u8, u8)> {
    let first = smp.block * LFT_BLOCK as u16;
    (0..LFT_BLOCK)
        .filter(|&i| smp.old[i] != smp.ports[i])
        .map(|i| (first + i as u16, smp.old[i], smp.ports[i]))
        .collect()
}

fn to_json(t: &Topology, p: &Plan, check: &Result<(), String>) -> Value {
    let m = &p.migration;
    let h = t.hypervisors();
    let hyp = |i: usize| json!({"index": i, "name": h[i].name});
    let c = &p.counts;
    json!({
        "mode": if m.mode == Mode::Swap { "swap" } else { "copy" },
        "vm_lid": m.vm_lid,
        "from": hyp(m.from),
        "to": hyp(m.to),
        "source_vf": p.source_vf,
        "dest_vf": p.dest_vf,
        "partner_lid": p.partner_lid,
        "same_switch": p.same_switch,
        "switches": t.switches().len(),
        "highest_lid": t.highest_lid(),
        "counts": {
            "lft_smps": c.lft_smps,
            "switches_touched": c.switches_touched,
            "hypervisor_smps": c.hypervisor_smps,
            "total": c.total,
            "full_reconfiguration": c.full_reconfiguration,
        },
        "check": match check { Ok(()) => json!("ok"), Err(e) => json!(e) },
        "lft_smps": p.lft.iter().map(|s| json!({
            "switch_lid": s.switch_lid,
            "block": s.block,
            "ports": s.ports.to_vec(),
            "changes": changes(s).iter()
                .map(|(lid, old, new)| json!({"lid": lid, "old_port": old, "new_port": new}))
                .collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "hypervisor_smps": p.hypervisor.iter().map(|s| match *s {
            HypervisorSmp::VfLid { hypervisor, vf, old_lid, new_lid } => json!({
                "kind": "vf_lid", "hypervisor": hyp(hypervisor), "vf": vf, "old_lid": old_lid, "new_lid": new_lid,
            }),
            HypervisorSmp::Vguid { from, from_vf, to, to_vf } => json!({
                "kind": "vguid", "from": hyp(from), "from_vf": from_vf, "to": hyp(to), "to_vf": to_vf,
            }),
        }).collect::<Vec<_>>(),
    })
}

fn port(p: u8) -> String {
    if p == NO_ROUTE {
        "none".into()
    } else {
        p.to_string()
    }
}

fn print_report(t: &Topology, description: &str, p: &Plan, check: &Result<(), String>) {
    let m = &p.migration;
    let h = t.hypervisors();
    let c = &p.counts;
    println!(
        "fabric: {description}: {} switches, {} end-node LIDs, highest LID {}",
        t.switches().len(),
        t.endpoint_lids(),
        t.highest_lid()
    );
    let how = match m.mode {
        Mode::Swap => format!("swap with the destination VF's LID {}", p.partner_lid),
        Mode::Copy => format!("copy of the destination PF's routes (PF LID {})", h[m.to].pf_lid),
    };
    println!(
        "migration: VM LID {} from {} (VF {}) to {} (VF {}), {how}{}",
        m.vm_lid,
        h[m.from].name,
        p.source_vf,
        h[m.to].name,
        p.dest_vf,
        if p.same_switch { "; same leaf switch" } else { "" }
    );
    println!();
    println!("  LFT SMPs               {:>8}   ({} switches touched)", c.lft_smps, c.switches_touched);
    println!("  hypervisor SMPs        {:>8}", c.hypervisor_smps);
    println!("  total SMPs             {:>8}", c.total);
    println!(
        "  full reconfiguration   {:>8}   ({} switches x {} LFT blocks, plus the route computation)",
        c.full_reconfiguration,
        t.switches().len(),
        t.lft_blocks()
    );
    match check {
        Ok(()) => println!("  check                        ok   (applied to a copy of the fabric)"),
        Err(e) => println!("  check                    FAILED   {e}"),
    }
    println!();
    println!("LFT SMPs (switch LID, block: the entries that change):");
    for s in &p.lft {
        let ch: Vec<String> = changes(s)
            .iter()
            .map(|(lid, old, new)| format!("LID {lid}: port {} -> {}", port(*old), port(*new)))
            .collect();
        println!("  switch {:>5}  block {:>3}  {}", s.switch_lid, s.block, ch.join(", "));
    }
    println!("hypervisor SMPs:");
    for s in &p.hypervisor {
        match *s {
            HypervisorSmp::VfLid { hypervisor, vf, old_lid, new_lid } => {
                println!("  {} VF {vf}: LID {old_lid} -> {new_lid}", h[hypervisor].name)
            }
            HypervisorSmp::Vguid { from, from_vf, to, to_vf } => {
                println!("  vGUID: {} VF {from_vf} -> {} VF {to_vf}", h[from].name, h[to].name)
            }
        }
    }
}

fn print_table_i(as_json: bool) -> ExitCode {
    let rows = match table_i() {
        Ok(r) => r,
        Err(e) => return fail(e.message),
    };
    if as_json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "ports": r.tree.ports, "levels": r.tree.levels, "width": r.tree.width,
                    "hosts_per_leaf": r.tree.hosts_per_leaf, "vfs_per_hypervisor": r.tree.vfs_per_hypervisor,
                    "nodes": r.nodes, "switches": r.switches, "lids": r.lids,
                    "lft_blocks_per_switch": r.blocks_per_switch, "full_min": r.full_min,
                    "swap_min": r.swap_min, "copy_min": r.copy_min, "swap_max": r.swap_max, "copy_max": r.copy_max,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows).expect("JSON"));
        return ExitCode::SUCCESS;
    }
    println!("Table I (Tasoulas et al., IEEE Cluster 2015), from the fat-tree generators (36-port switches;");
    println!("nodes = end-node LIDs: 9 hypervisors per leaf, a PF and a VF each):");
    println!();
    println!(
        "{:>6} {:>8} {:>6} {:>13} {:>10} {:>12} {:>12} {:>9}",
        "nodes", "switches", "LIDs", "blocks/switch", "full min", "swap/copy", "swap max", "copy max"
    );
    println!(
        "{:>6} {:>8} {:>6} {:>13} {:>10} {:>12} {:>12} {:>9}",
        "", "", "", "(min)", "SMPs", "min SMPs", "SMPs", "SMPs"
    );
    for r in &rows {
        println!(
            "{:>6} {:>8} {:>6} {:>13} {:>10} {:>12} {:>12} {:>9}",
            r.nodes,
            r.switches,
            r.lids,
            r.blocks_per_switch,
            r.full_min,
            format!("{}/{}", r.swap_min, r.copy_min),
            r.swap_max,
            r.copy_max
        );
    }
    ExitCode::SUCCESS
}

/// Reads the JSON topology (schema in the command's help).
fn parse_topology(text: &str) -> Result<Topology, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let list = |key: &str| v.get(key).and_then(Value::as_array).ok_or_else(|| format!("no {key:?} array"));
    let num = |x: &Value, what: &str| -> Result<u64, String> {
        x.as_u64().ok_or_else(|| format!("{what}: {x} is not a non-negative integer"))
    };
    let small = |x: &Value, what: &str, max: u64| -> Result<u64, String> {
        let n = num(x, what)?;
        if n > max {
            return Err(format!("{what}: {n} is more than {max}"));
        }
        Ok(n)
    };
    let field = |o: &Value, key: &str, what: &str| -> Result<Value, String> {
        o.get(key).cloned().ok_or_else(|| format!("{what}: no {key:?}"))
    };
    let mut t = Topology::new();
    for (i, s) in list("switches")?.iter().enumerate() {
        let what = format!("switches[{i}]");
        let lid = small(&field(s, "lid", &what)?, &format!("{what}.lid"), 0xFFFF)? as u16;
        let ports = small(&field(s, "ports", &what)?, &format!("{what}.ports"), 255)? as u8;
        let index = t.add_switch(lid, ports).map_err(|e| format!("{what}: {}", e.message))?;
        if let Some(lft) = s.get("lft") {
            let lft = lft.as_array().ok_or_else(|| format!("{what}.lft is not an array"))?;
            let ports: Vec<u8> = lft
                .iter()
                .enumerate()
                .map(|(j, p)| small(p, &format!("{what}.lft[{j}]"), 255).map(|p| p as u8))
                .collect::<Result<_, _>>()?;
            let first = match s.get("lft_first_lid") {
                Some(f) => small(f, &format!("{what}.lft_first_lid"), 0xBFFF)? as u16,
                None => 0,
            };
            t.set_lft(index, first, &ports).map_err(|e| format!("{what}: {}", e.message))?;
        }
    }
    let switch = |t: &Topology, x: &Value, what: &str| -> Result<usize, String> {
        let lid = small(x, what, 0xFFFF)? as u16;
        t.switch_by_lid(lid).ok_or_else(|| format!("{what}: no switch has LID {lid}"))
    };
    for (i, l) in v.get("links").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
        let what = format!("links[{i}]");
        let l = l.as_array().filter(|l| l.len() == 4).ok_or_else(|| format!("{what}: not [lid, port, lid, port]"))?;
        let (a, b) = (switch(&t, &l[0], &what)?, switch(&t, &l[2], &what)?);
        let (pa, pb) = (small(&l[1], &what, 255)? as u8, small(&l[3], &what, 255)? as u8);
        t.connect(a, pa, b, pb).map_err(|e| format!("{what}: {}", e.message))?;
    }
    for (i, h) in list("hypervisors")?.iter().enumerate() {
        let what = format!("hypervisors[{i}]");
        let name = match h.get("name") {
            Some(n) => n.as_str().ok_or_else(|| format!("{what}.name is not a string"))?.to_owned(),
            None => format!("h{i}"),
        };
        let sw = switch(&t, &field(h, "switch", &what)?, &format!("{what}.switch"))?;
        let port = small(&field(h, "port", &what)?, &format!("{what}.port"), 255)? as u8;
        let pf = small(&field(h, "pf_lid", &what)?, &format!("{what}.pf_lid"), 0xFFFF)? as u16;
        let lids = |key: &str| -> Result<Vec<u16>, String> {
            match h.get(key) {
                None => Ok(Vec::new()),
                Some(a) => a
                    .as_array()
                    .ok_or_else(|| format!("{what}.{key} is not an array"))?
                    .iter()
                    .map(|x| small(x, &format!("{what}.{key}"), 0xFFFF).map(|n| n as u16))
                    .collect(),
            }
        };
        t.add_hypervisor(&name, sw, port, pf, &lids("vf_lids")?).map_err(|e| format!("{what}: {}", e.message))?;
        for lid in lids("vfs_in_use")? {
            t.set_vf_in_use(lid, true).map_err(|e| format!("{what}.vfs_in_use: {}", e.message))?;
        }
    }
    Ok(t)
}
