#!/usr/bin/env bash
# test.sh -- QEMU's own RDMA migration tests (migration-test's
# /x86_64/migration/precopy/rdma/plain and .../plain/ipv6) with the build of
# build.sh, stock and patched (once when patched = stock), in one
# scripts/rxe-vm.sh guest.
#
#   integrations/qemu/test.sh
#
# Fails unless each case in RDMA_CASES passed: a case migration-test skips
# (no rdma link; not root and `ulimit -l` too small) is a failure here.
# Needs root (as scripts/rxe-vm.sh); builds first when the build is not
# cached.  In the guest it runs itself as `test.sh --in-guest BUILD_DIR`.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# migration-test's -p selects a case and the cases below it: .../plain runs
# both (-p .../rdma runs plain alone).
TEST_PATH=/x86_64/migration/precopy/rdma/plain
RDMA_CASES=("$TEST_PATH" "$TEST_PATH/ipv6")

# in_guest BUILD_DIR: run the suite with each variant; 1 if a case did not pass.
in_guest() {
    local dir=$1 v case log rc failed=0
    log=$(mktemp)
    for v in stock patched; do
        if [ -L "$dir/$v" ]; then
            echo "== $v: a link to $(readlink "$dir/$v"), not run again"
            continue
        fi
        echo "== $v: migration-test -p $TEST_PATH"
        # migration-test runs scripts/rdma-migration-helper.sh from its cwd.
        rc=0
        (cd "$dir/$v" && QTEST_QEMU_BINARY=$PWD/qemu-system-x86_64 ./migration-test --tap -p "$TEST_PATH") 2>&1 |
            tee "$log" || rc=$?
        if [ "$rc" != 0 ]; then
            echo "== $v: FAILED: migration-test exited with status $rc"
            failed=1
        fi
        for case in "${RDMA_CASES[@]}"; do
            # A skipped case reads "ok N CASE # SKIP reason".
            if grep -qxE "ok [0-9]+ $case" "$log"; then
                echo "== $v: $case passed"
            else
                echo "== $v: FAILED: $case did not pass (failed, skipped or not run)"
                failed=1
            fi
        done
    done
    rm -f "$log"
    return "$failed"
}

if [ "${1:-}" = --in-guest ]; then
    in_guest "$2"
    exit
fi
dir=$("$HERE/build.sh")
exec "$HERE/../../scripts/rxe-vm.sh" "$(printf '%q --in-guest %q' "$HERE/test.sh" "$dir")"
