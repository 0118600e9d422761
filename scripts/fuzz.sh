#!/usr/bin/env bash
# Fuzzing of the wire codec (src/wire) with cargo-fuzz / libFuzzer.
#
#   scripts/fuzz.sh build            build every target in fuzz/ (used by CI)
#   scripts/fuzz.sh run [seconds]    run each target for N seconds (default 60),
#                                    then print each target's execution count
#   scripts/fuzz.sh list             list the targets
#
# cargo-fuzz needs nightly-only rustc flags (-Zsanitizer=address, sancov). By
# default this uses the active toolchain with RUSTC_BOOTSTRAP=1, which works on
# stable (checked with 1.95). Set FUZZ_TOOLCHAIN=nightly to use `cargo +nightly`
# instead. Needs `cargo install cargo-fuzz --locked`.
#
# Corpora grow in fuzz/corpus/<target> (git-ignored), seeded from fuzz/seeds/<target>;
# crashes land in fuzz/artifacts/<target>.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz is not installed; run: cargo install cargo-fuzz --locked" >&2
    exit 2
fi

if [[ -n "${FUZZ_TOOLCHAIN:-}" ]]; then
    CARGO=(cargo "+${FUZZ_TOOLCHAIN}")
else
    export RUSTC_BOOTSTRAP=1
    CARGO=(cargo)
fi

targets() {
    "${CARGO[@]}" fuzz list
}

cmd="${1:-}"
case "$cmd" in
build)
    "${CARGO[@]}" fuzz build
    ;;
list)
    targets
    ;;
run)
    secs="${2:-60}"
    if ! [[ "$secs" =~ ^[0-9]+$ ]] || [[ "$secs" -eq 0 ]]; then
        echo "fuzz.sh: run: seconds must be a positive integer, got '$secs'" >&2
        exit 2
    fi
    "${CARGO[@]}" fuzz build
    logdir="$(mktemp -d)"
    trap 'rm -rf "$logdir"' EXIT
    declare -A execs status
    mapfile -t all < <(targets)
    for t in "${all[@]}"; do
        corpus="fuzz/corpus/$t"
        mkdir -p "$corpus"
        dirs=("$corpus")
        [[ -d "fuzz/seeds/$t" ]] && dirs+=("fuzz/seeds/$t")
        echo "== $t: ${secs}s" >&2
        if "${CARGO[@]}" fuzz run "$t" "${dirs[@]}" -- \
            -max_total_time="$secs" -print_final_stats=1 >"$logdir/$t.log" 2>&1; then
            status[$t]=ok
        else
            status[$t]="FAILED (see fuzz/artifacts/$t)"
            tail -n 40 "$logdir/$t.log" >&2
        fi
        execs[$t]="$(sed -n 's/^stat::number_of_executed_units: *//p' "$logdir/$t.log" | tail -n 1)"
    done
    echo
    printf '%-20s %15s  %s\n' target executions status
    rc=0
    for t in "${all[@]}"; do
        printf '%-20s %15s  %s\n' "$t" "${execs[$t]:-?}" "${status[$t]}"
        [[ "${status[$t]}" == ok ]] || rc=1
    done
    exit "$rc"
    ;;
*)
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
