#!/usr/bin/env bash
# bench-qemu.sh -- QEMU 10.2 on librdmamig against stock QEMU 10.2, with a
# running Linux guest that keeps rewriting 96 MiB of its 256 MiB: stock over
# TCP, stock over rdma and patched over rdma, dynamic and pin-all (QEMU's
# total time and downtime, throughput ÷ ib_write_bw in the same boot).  Runs
# integrations/qemu/test.sh's "bench" in BENCH_QEMU_BOOTS rxe guest boots
# (default 3) and prints the median of each figure.
#
#   make bench-qemu       (root; builds QEMU first if not cached)
set -euo pipefail
cd "$(dirname "$0")/.."
boots=${BENCH_QEMU_BOOTS:-3}
logs=()
for i in $(seq "$boots"); do
    log=$(mktemp --suffix=.bench-qemu)
    logs+=("$log")
    echo "bench-qemu: boot $i of $boots" >&2
    RXE_VM_QUIET=1 RXE_VM_MEM=${RXE_VM_MEM:-4G} integrations/qemu/test.sh bench | tee "$log" | grep '^guest-bench:' >&2
done
echo "bench-qemu: median of $boots boots"
python3 integrations/qemu/guest-test.py --median "${logs[@]}"
rm -f "${logs[@]}"
