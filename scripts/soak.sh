#!/usr/bin/env bash
# soak.sh -- the soak (examples/soak.rs): build it on the host, then run it
# in ONE scripts/rxe-vm.sh guest boot: N migrations of 16 MiB (default
# 1000) through one listener of one destination process, the modes in turn
# (extensions on/off x dynamic/pin-all), every tenth with its source killed
# (SIGKILL) or aborted, or aborted by the destination. Every completed one
# must arrive byte-identical (RAM and stream), and the open fds, threads,
# VmRSS, VmPin and heap bytes of the destination and of the long-lived
# source process, and the guest's RDMA objects, must stay flat from run 10
# on (VmRSS within 4 MiB, heap within 1 KiB, the rest equal).
#
#   scripts/soak.sh [--runs N]   CI runs 50 (step soak:50 of scripts/rdma-suite.sh)
#
# Prints a line per run, then the figures at runs 10, 20, 50, 100, 200, 500,
# 1000 (and the last). Exit status: the soak's (1 if a run failed or a
# figure was not flat), 125 if the guest failed. Run as root. Measured on
# the 2-core build machine (TCG): 50 runs 15-30 s, 1000 runs 5-10 min.
# Environment: RXE_VM_* (see scripts/rxe-vm.sh); RXE_VM_TIMEOUT defaults to
# 7200 s here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-7200}

echo "soak: building (cargo build --release --features rdma-tests --example soak)"
cargo build --release --features rdma-tests --example soak
# The soak runs its source processes from a private copy of itself, so a
# build during the run cannot change what they run.
cmd=$(printf '%q ' "${CARGO_TARGET_DIR:-target}/release/examples/soak" "$@")
echo "soak: $cmd"
exec bash scripts/rxe-vm.sh "$cmd"
