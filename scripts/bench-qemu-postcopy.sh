#!/usr/bin/env bash
# bench-qemu-postcopy.sh -- post-copy in QEMU 10.2: patched (librdmamig)
# over rdma against stock over TCP, postcopy-preempt off and on, with a
# running Linux guest that keeps rewriting 96 MiB of its 256 MiB and times
# its first touch of each page: the guest-visible fault latency, QEMU's
# blocktime and fault latency, the post-copy phase's time, and
# ib_read_lat (4 KiB) in the same boot.  Runs integrations/qemu/test.sh's
# "bench-postcopy" in BENCH_QEMU_BOOTS rxe guest boots (default 3), prints
# the host's load before each boot and the median of each figure.  The rxe
# guest's RAM is allocated at boot (RXE_VM_PREALLOC=1): otherwise the first
# runs of the chain pay the host's first touch of the pages they get.
#
#   make bench-qemu-postcopy    (root; builds QEMU first if not cached)
set -euo pipefail
cd "$(dirname "$0")/.."
boots=${BENCH_QEMU_BOOTS:-3}
logs=()
for i in $(seq "$boots"); do
    log=$(mktemp --suffix=.bench-qemu-postcopy)
    logs+=("$log")
    echo "bench-qemu-postcopy: boot $i of $boots, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    RXE_VM_QUIET=1 RXE_VM_MEM=${RXE_VM_MEM:-4G} RXE_VM_PREALLOC=${RXE_VM_PREALLOC:-1} \
        integrations/qemu/test.sh bench-postcopy | tee "$log" | grep '^guest-postcopy:' >&2
done
echo "bench-qemu-postcopy: median of $boots boots, load average now $(cut -d' ' -f1-3 /proc/loadavg)"
python3 integrations/qemu/guest-test.py --median-postcopy "${logs[@]}"
rm -f "${logs[@]}"
