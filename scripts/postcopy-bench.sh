#!/usr/bin/env bash
# postcopy-bench.sh -- the post-copy benchmark (examples/postcopy_bench.rs,
# `make bench-postcopy`): build it on the host, then run it in ONE
# scripts/rxe-vm.sh guest boot: ib_read_lat / ib_read_bw anchors, fault
# service latency (1 and 4 vCPU threads) and the background pull (dense and
# sparse stale sets) over rxe0, one table.
#
#   scripts/postcopy-bench.sh [ARGS...]   ARGS go to the benchmark:
#                                         --fault-mib MiB (512) --pull-mib MiB (256)
#                                         --faults N (2000) --think-us N (0)
#                                         --dump-faults DIR --quick --no-anchors
#
# Exit status: the benchmark's (1 if a run failed or a destination's RAM came
# out different; never because of a ratio), 125 if the guest failed.  Run as
# root.  Environment: RXE_VM_MEM (default 3G here: a run holds both sides'
# RAM, 2 x --fault-mib); other RXE_VM_* settings apply (scripts/rxe-vm.sh).
# TCG timing varies from boot to boot: compare the ratios of one boot.  The
# guest's vCPUs are host threads: other work on the host preempts them (in
# scheduler ticks, milliseconds, visible in fault latencies), so the host's
# load average is printed before and after the boot.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export RXE_VM_MEM=${RXE_VM_MEM:-3G}
# The host backs all guest RAM at boot, as bench.sh does: a page the host backs at
# its first touch slowed whichever run came first in a boot.
export RXE_VM_PREALLOC=${RXE_VM_PREALLOC:-1}

echo "postcopy-bench: building (cargo build --release --features rdma-tests --example postcopy_bench)"
cargo build --release --features rdma-tests --example postcopy_bench
target=${CARGO_TARGET_DIR:-target}
# A private copy, so that a build during the run cannot rewrite the binary.
mkdir -p "$target/bench"
cp "$target/release/examples/postcopy_bench" "$target/bench/postcopy_bench"
cmd=$(printf '%q ' "$target/bench/postcopy_bench" "$@")
echo "postcopy-bench: $cmd (RXE_VM_MEM=$RXE_VM_MEM)"
echo "postcopy-bench: host load before: $(cat /proc/loadavg)"
status=0
bash scripts/rxe-vm.sh "$cmd" || status=$?
echo "postcopy-bench: host load after: $(cat /proc/loadavg)"
exit $status
