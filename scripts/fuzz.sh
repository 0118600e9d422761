#!/usr/bin/env bash
# Fuzzing of the wire codec (src/wire) and of the destination's message
# dispatcher (src/engine/destination/dispatch.rs) with cargo-fuzz / libFuzzer.
#
#   scripts/fuzz.sh build            build every target in fuzz/
#   scripts/fuzz.sh run [seconds]    run each target for N seconds (default 60), then
#                                    merge what it found into its kept corpus
#   scripts/fuzz.sh ci [seconds]     run each target for N seconds (default 10), the
#                                    kept corpus untouched (used by scripts/test.sh)
#   scripts/fuzz.sh list             list the targets
#
# Both run modes print each target's execution count and fail if a target
# crashed (the input lands in fuzz/artifacts/<target>).
#
# cargo-fuzz needs nightly-only rustc flags (-Zsanitizer=address, sancov). By
# default this uses the active toolchain with RUSTC_BOOTSTRAP=1, which works on
# stable (checked with 1.95). Set FUZZ_TOOLCHAIN=nightly to use `cargo +nightly`
# instead. Needs `cargo install cargo-fuzz --locked`.
#
# Each target starts from its hand-made seeds (fuzz/seeds/<target>) and its
# kept corpus (fuzz/corpus/<target>, committed); new inputs go to a scratch
# directory. `run` then rebuilds the kept corpus with libFuzzer's merge: the
# fewest inputs (each at most MAX_LEN bytes) that reach what the kept corpus
# and the new inputs reach beyond the seeds, so it stays small.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# Longest input tried and kept: the codec's messages and short message sequences fit.
MAX_LEN=4096

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

# keep TARGET FOUND: rebuilds fuzz/corpus/TARGET from itself and the inputs in FOUND.
keep() {
    local t=$1 found=$2 kept="fuzz/corpus/$1" merged seed
    merged="$(mktemp -d)"
    # The seeds go in first, so that only what reaches beyond them is kept.
    [[ -d "fuzz/seeds/$t" ]] && cp "fuzz/seeds/$t"/* "$merged/"
    "${CARGO[@]}" fuzz run "$t" "$merged" "$kept" "$found" -- -merge=1 -max_len="$MAX_LEN" \
        >"$found.merge.log" 2>&1 || { tail -n 20 "$found.merge.log" >&2; return 1; }
    for seed in "fuzz/seeds/$t"/*; do
        [[ -e "$seed" ]] && rm -f "$merged/$(basename "$seed")"
    done
    rm -rf "$kept"
    mkdir -p "$kept"
    cp "$merged"/* "$kept/" 2>/dev/null || true
    rm -rf "$merged"
}

# fuzz SECONDS KEEP: runs every target; KEEP=1 merges what each found into its kept corpus.
fuzz() {
    local secs=$1 keep_found=$2 t rc=0 dirs
    if ! [[ "$secs" =~ ^[0-9]+$ ]] || [[ "$secs" -eq 0 ]]; then
        echo "fuzz.sh: seconds must be a positive integer, got '$secs'" >&2
        exit 2
    fi
    "${CARGO[@]}" fuzz build
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    declare -A execs status
    mapfile -t all < <(targets)
    for t in "${all[@]}"; do
        mkdir -p "fuzz/corpus/$t" "$scratch/$t"
        # New inputs go to the first directory.
        dirs=("$scratch/$t" "fuzz/corpus/$t")
        [[ -d "fuzz/seeds/$t" ]] && dirs+=("fuzz/seeds/$t")
        echo "== $t: ${secs}s" >&2
        if "${CARGO[@]}" fuzz run "$t" "${dirs[@]}" -- \
            -max_total_time="$secs" -max_len="$MAX_LEN" -print_final_stats=1 >"$scratch/$t.log" 2>&1; then
            status[$t]=ok
        else
            status[$t]="FAILED (see fuzz/artifacts/$t)"
            tail -n 40 "$scratch/$t.log" >&2
        fi
        execs[$t]="$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$t.log" | tail -n 1)"
        if [[ "$keep_found" == 1 ]] && ! keep "$t" "$scratch/$t"; then
            status[$t]="${status[$t]}; merging the corpus FAILED"
        fi
    done
    echo
    printf '%-20s %15s %12s  %s\n' target executions "kept inputs" status
    for t in "${all[@]}"; do
        printf '%-20s %15s %12s  %s\n' "$t" "${execs[$t]:-?}" "$(find "fuzz/corpus/$t" -type f | wc -l)" "${status[$t]}"
        [[ "${status[$t]}" == ok ]] || rc=1
    done
    return "$rc"
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
    fuzz "${2:-60}" 1
    ;;
ci)
    fuzz "${2:-10}" 0
    ;;
*)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
