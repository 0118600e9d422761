#!/usr/bin/env bash
# test.sh -- QEMU's own RDMA migration tests (migration-test's
# /x86_64/migration/precopy/rdma/plain and .../plain/ipv6) with the builds of
# build.sh, in one scripts/rxe-vm.sh guest, for each pair of source and
# destination:
#   patched            patched -> patched (librdmamig on both sides)
#   patched-to-stock   patched source, stock QEMU 10.2 destination
#   stock-to-patched   stock QEMU 10.2 source, patched destination
# and a running Linux guest migrated on through stock and patched QEMUs
# (guest-test.py):
#   guest
# and, only when asked for, the benchmarks of scripts/bench-qemu.sh and
# scripts/bench-qemu-postcopy.sh (one run each):
#   bench
#   bench-postcopy
#
#   integrations/qemu/test.sh [PAIR...]      (default: all four)
#
# Fails unless each case passed for each pair: a case migration-test skips
# (no rdma link; not root and `ulimit -l` too small) is a failure here.
# Needs root (as scripts/rxe-vm.sh) and this checkout's library built
# (`make`): the patched QEMU runs with it (RDMAMIG_LIBDIR).  Builds QEMU
# first when the build is not cached.  In the guest it runs itself as
# `test.sh --in-guest BUILD_DIR PAIR...`; scripts/rdma-suite.sh runs it so,
# one step per pair.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# migration-test's -p selects a case and the cases below it: .../plain runs
# both (-p .../rdma runs plain alone).
TEST_PATH=/x86_64/migration/precopy/rdma/plain
RDMA_CASES=("$TEST_PATH" "$TEST_PATH/ipv6")
PAIRS=(patched patched-to-stock stock-to-patched guest)
export RDMAMIG_LIBDIR=${RDMAMIG_LIBDIR:-$(cd "$HERE/../.." && pwd -P)/target/lib}

# run_pair DIR PAIR: migration-test with PAIR's binaries; 1 unless every case passed.
# migration-test takes QTEST_QEMU_BINARY for both sides, or with one of
# QTEST_QEMU_BINARY_SRC / _DST for that side.
run_pair() {
    local dir=$1 pair=$2 log case rc=0 failed=0
    local -a env
    case $pair in
        patched) env=(QTEST_QEMU_BINARY="$dir/patched/qemu-system-x86_64") ;;
        patched-to-stock) env=(QTEST_QEMU_BINARY="$dir/stock/qemu-system-x86_64"
                               QTEST_QEMU_BINARY_SRC="$dir/patched/qemu-system-x86_64") ;;
        stock-to-patched) env=(QTEST_QEMU_BINARY="$dir/stock/qemu-system-x86_64"
                               QTEST_QEMU_BINARY_DST="$dir/patched/qemu-system-x86_64") ;;
        guest) /usr/bin/python3 "$HERE/guest-test.py" "$dir"; return ;;
        bench) /usr/bin/python3 "$HERE/guest-test.py" --bench "$dir"; return ;;
        bench-postcopy) /usr/bin/python3 "$HERE/guest-test.py" --bench-postcopy "$dir"; return ;;
        *) echo "test.sh: unknown pair '$pair' (one of: ${PAIRS[*]})" >&2; return 2 ;;
    esac
    log=$(mktemp)
    echo "== $pair: migration-test -p $TEST_PATH"
    # migration-test runs scripts/rdma-migration-helper.sh from its cwd.
    (cd "$dir/patched" && env "${env[@]}" ./migration-test --tap -p "$TEST_PATH") 2>&1 | tee "$log" || rc=$?
    if [ "$rc" != 0 ]; then
        echo "== $pair: FAILED: migration-test exited with status $rc"
        failed=1
    fi
    for case in "${RDMA_CASES[@]}"; do
        # A skipped case reads "ok N CASE # SKIP reason".
        if grep -qxE "ok [0-9]+ $case" "$log"; then
            echo "== $pair: $case passed"
        else
            echo "== $pair: FAILED: $case did not pass (failed, skipped or not run)"
            failed=1
        fi
    done
    rm -f "$log"
    return "$failed"
}

if [ "${1:-}" = --in-guest ]; then
    dir=$2
    shift 2
    failed=0
    for pair in "$@"; do run_pair "$dir" "$pair" || failed=1; done
    exit "$failed"
fi
[ $# -gt 0 ] || set -- "${PAIRS[@]}"
[ -e "$RDMAMIG_LIBDIR/librdmamig.so.0" ] || { echo "test.sh: no $RDMAMIG_LIBDIR/librdmamig.so.0: run make first" >&2; exit 1; }
dir=$("$HERE/build.sh")
exec "$HERE/../../scripts/rxe-vm.sh" "$(printf '%q ' env RDMAMIG_LIBDIR="$RDMAMIG_LIBDIR" "$HERE/test.sh" --in-guest "$dir" "$@")"
