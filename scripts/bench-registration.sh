#!/usr/bin/env bash
# bench-registration.sh -- registration at the kernel's rate
# (examples/registration_bench.rs): build it on the host, run it in
# scripts/rxe-vm.sh guests, one boot after another, and print each boot's
# figures and, over the boots, their medians.
#
#   scripts/bench-registration.sh [ARGS...]   ARGS go to registration_bench
#                                             (default: --mib 1024)
#
# Each boot measures pin-all against a bare ibv_reg_mr loop over the same
# memory (populated and fresh, one thread and every CPU), each figure a
# ratio to the bare loop of the same boot; TCG timing varies from boot to
# boot, so compare within a boot and look at the medians.  Prints
# "bench-registration: median of N memory=... threads=N key=value ..." per
# case at the end.  Exit status: 0, or the first failing boot's (125: the
# guest failed).  Run as root.  Environment: BENCH_BOOTS (boots, default
# 3); RXE_VM_MEM (default 4G); other RXE_VM_* settings apply (see
# scripts/rxe-vm.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BOOTS=${BENCH_BOOTS:-3}
export RXE_VM_MEM=${RXE_VM_MEM:-4G}
[ $# -gt 0 ] || set -- --mib 1024

echo "bench-registration: building (cargo build --release --features rdma-tests --example registration_bench)"
cargo build --release --features rdma-tests --example registration_bench
bin=${CARGO_TARGET_DIR:-target}/release/examples/registration_bench
[ -x "$bin" ] || { echo "bench-registration: no $bin" >&2; exit 1; }

out=$(mktemp /tmp/bench-registration.XXXXXX)
trap 'rm -f "$out"' EXIT
cmd=$(printf '%q ' "$bin" "$@")
for boot in $(seq 1 "$BOOTS"); do
    echo "bench-registration: boot $boot/$BOOTS: $cmd (RXE_VM_MEM=$RXE_VM_MEM)"
    rc=0
    bash scripts/rxe-vm.sh "$cmd" | tee -a "$out" || rc=$?
    [ "$rc" = 0 ] || { echo "bench-registration: boot $boot failed (exit status $rc)" >&2; exit "$rc"; }
done

# Medians of every numeric key=value per case (memory and threads), over
# the boots' lines; each boot's values beside them.
awk '
$1 == "registration_bench:" && $2 ~ /^memory=/ && $3 ~ /^threads=/ && $0 !~ / rep=/ {
    c = $2 " " $3
    if (!(c in seen)) { seen[c] = 1; cases[++ncases] = c }
    for (i = 4; i <= NF; i++) {
        split($i, kv, "=")
        if (!(kv[1] in haskey)) { haskey[kv[1]] = 1; keys[++nkeys] = kv[1] }
        n = ++count[c, kv[1]]
        value[c, kv[1], n] = kv[2]
    }
}
function median(c, key,    n, i, j, t, v) {
    n = count[c, key]
    for (i = 1; i <= n; i++) v[i] = value[c, key, i]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
function each(c, key,    n, i, s) {
    n = count[c, key]
    for (i = 1; i <= n; i++) s = s (i > 1 ? "," : "") value[c, key, i]
    return s
}
END {
    for (k = 1; k <= ncases; k++) {
        line = "bench-registration: median of " count[cases[k], keys[1]] " " cases[k]
        for (j = 1; j <= nkeys; j++) if ((cases[k], keys[j]) in count)
            line = line " " keys[j] "=" median(cases[k], keys[j]) (keys[j] == "mib" ? "" : " [" each(cases[k], keys[j]) "]")
        print line
    }
}' "$out"
