#!/usr/bin/env bash
# bench-unregister.sh -- the unregistration worker's benchmark
# (examples/unregister_bench.rs): build it on the host, run it in
# scripts/rxe-vm.sh guests, one boot after another, and print each boot's
# figures and, over the boots, their medians.
#
#   scripts/bench-unregister.sh [ARGS...]   ARGS go to unregister_bench
#                                           (default: --mib 1024)
#
# Each boot migrates the guest with the worker on and with it off (in that
# order unless ARGS has --modes); TCG timing varies from boot to boot, so
# compare the modes within a boot and look at the medians.  Prints
# "bench-unregister: median mode=... key=value ..." per mode at the end.
# Exit status: 0, or the first failing boot's (125: the guest failed).
# Run as root.  Environment: BENCH_BOOTS (boots, default 3); RXE_VM_MEM
# (default 4G here: the guest holds both sides' RAM); other RXE_VM_*
# settings apply (see scripts/rxe-vm.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BOOTS=${BENCH_BOOTS:-3}
export RXE_VM_MEM=${RXE_VM_MEM:-4G}
[ $# -gt 0 ] || set -- --mib 1024

echo "bench-unregister: building (cargo build --release --features rdma-tests --example unregister_bench)"
cargo build --release --features rdma-tests --example unregister_bench
bin=${CARGO_TARGET_DIR:-target}/release/examples/unregister_bench
[ -x "$bin" ] || { echo "bench-unregister: no $bin" >&2; exit 1; }

out=$(mktemp /tmp/bench-unregister.XXXXXX)
trap 'rm -f "$out"' EXIT
cmd=$(printf '%q ' "$bin" "$@")
for boot in $(seq 1 "$BOOTS"); do
    echo "bench-unregister: boot $boot/$BOOTS: $cmd (RXE_VM_MEM=$RXE_VM_MEM)"
    rc=0
    bash scripts/rxe-vm.sh "$cmd" | tee -a "$out" || rc=$?
    [ "$rc" = 0 ] || { echo "bench-unregister: boot $boot failed (exit status $rc)" >&2; exit "$rc"; }
done

# Medians of every numeric key=value per mode, over the boots' lines.
awk '
$1 == "unregister_bench:" && $2 ~ /^mode=/ {
    mode = substr($2, 6)
    if (!(mode in seen)) { seen[mode] = 1; modes[++nmodes] = mode }
    for (i = 3; i <= NF; i++) {
        split($i, kv, "=")
        if (!(kv[1] in haskey)) { haskey[kv[1]] = 1; keys[++nkeys] = kv[1] }
        n = ++count[mode, kv[1]]
        value[mode, kv[1], n] = kv[2]
    }
}
function median(mode, key,    n, i, j, t, v) {
    n = count[mode, key]
    for (i = 1; i <= n; i++) v[i] = value[mode, key, i]
    if (v[1] !~ /^[0-9.]+$/) return v[1]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
END {
    for (m = 1; m <= nmodes; m++) {
        line = "bench-unregister: median of " count[modes[m], keys[1]] " mode=" modes[m]
        for (k = 1; k <= nkeys; k++) if ((modes[m], keys[k]) in count) line = line " " keys[k] "=" median(modes[m], keys[k])
        print line
    }
}' "$out"
