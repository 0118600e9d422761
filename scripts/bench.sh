#!/usr/bin/env bash
# bench.sh -- the migration benchmark (examples/bench.rs, `make bench`):
# build it on the host, then run it in ONE scripts/rxe-vm.sh guest boot:
# ib_write_bw anchors (1 MiB and 4 KiB), QEMU -> QEMU and rdmamig <-> rdmamig
# over rxe0 (dense guest in four modes, sparse guest, final round), one table.
#
#   scripts/bench.sh [ARGS...]   ARGS go to the benchmark:
#                                --size MiB (256) --sparse-size MiB (1024)
#                                --pages N (8192) --skip-qemu --quick
#
# Exit status: the benchmark's (1 if a run failed or a destination's RAM came
# out different; never because of a ratio), 125 if the guest failed.  Run as
# root.  Environment: RXE_VM_MEM (default 6G here: the guest holds both
# sides' RAM, the sparse runs two --sparse-size files on tmpfs, QEMU's
# dense runs two --size files); other RXE_VM_* settings apply (see
# scripts/rxe-vm.sh).  TCG timing varies from boot to boot: compare figures
# of one boot (the ratios), not across boots.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export RXE_VM_MEM=${RXE_VM_MEM:-6G}
# The host backs all guest RAM at boot: no run pays the host's first touch
# of a guest page (it made the first rdmamig run after the QEMU runs zero
# fresh memory up to 2.7 times slower).
export RXE_VM_PREALLOC=${RXE_VM_PREALLOC:-1}

echo "bench: building (cargo build --release --features rdma-tests --example bench)"
cargo build --release --features rdma-tests --example bench
target=${CARGO_TARGET_DIR:-target}
# A private copy, so that a build during the run cannot rewrite the binary
# the guest (and the destination processes it re-executes) runs.
mkdir -p "$target/bench"
cp "$target/release/examples/bench" "$target/bench/bench"
cmd=$(printf '%q ' "$target/bench/bench" "$@")
echo "bench: $cmd (RXE_VM_MEM=$RXE_VM_MEM)"
exec bash scripts/rxe-vm.sh "$cmd"
