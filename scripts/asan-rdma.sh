#!/usr/bin/env bash
# asan-rdma.sh -- the Rust RDMA tests (test target `rdma`, tests/rdma/, feature
# rdma-tests) built with AddressSanitizer and run in ONE scripts/rxe-vm.sh
# guest, with LeakSanitizer.  Not part of CI (scripts/test.sh): run it by hand
# after changes to unsafe code, the verbs layer or the engine's buffers.
#
#   scripts/asan-rdma.sh [ARGS...]    ARGS go to the test binary (a test name
#                                     filter, --nocapture, ...)
#
# Build: cargo test --release --features rdma-tests --test rdma --no-run with
# RUSTFLAGS=-Zsanitizer=address on the active (stable) toolchain with
# RUSTC_BOOTSTRAP=1, as scripts/fuzz.sh does (-Z flags are nightly-only);
# --target x86_64-unknown-linux-gnu so that build scripts and proc macros are
# not instrumented; into target/asan.  std is not rebuilt (no -Zbuild-std), so
# its own code is not instrumented, but every allocation, Rust's included,
# goes through ASan's malloc.  src/verbs/shim.c (build.rs, cc) is not
# instrumented either: it only forwards to rdma-core's inline functions.
#
# Run: --test-threads=1 in a 4G guest (RXE_VM_MEM), with the tests listed in
# SKIP below skipped.  The two-guest tests (#[ignore]d liveness::pair_*) are
# not run.  The tests re-execute this binary as child processes (tests/rdma/
# child.rs): they inherit ASAN_OPTIONS, and every process writes its ASan and
# LSan reports to target/asan/reports/asan.PID, printed at the end.
#
# Exit status: 0 if the tests passed and no process reported anything, 1
# otherwise, 125 if the guest itself failed (rxe-vm.sh).  Run as root.
# Environment: RXE_VM_* (see scripts/rxe-vm.sh); ASAN_RDMA_OPTIONS, more
# ASAN_OPTIONS (':'-separated) after ours.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VM=$PWD/scripts/rxe-vm.sh
TARGET=x86_64-unknown-linux-gnu
TARGET_DIR=target/asan
REPORTS=$PWD/$TARGET_DIR/reports

# Tests that cannot pass under ASan, by full name (libtest --skip: a
# substring of the name), each with the reason.
SKIP=(
    # Bounds the source child's VmRSS growth by the touched 256 MiB + 24 MiB,
    # and ASan's own memory (the heap's shadow, redzones, its allocator)
    # counts in VmRSS: by before_close it grew 283.9 MiB under ASan (282.2
    # MiB with quarantine_size_mb=0), 269.8 MiB without.  What it is about,
    # the untouched pages still the shared zero page, held under ASan too.
    memory::untouched_source_pages_stay_unallocated
)

# Host packages (rdma-core, qemu, jq, ...) and kernel.
"$VM" --install-only

echo "asan-rdma: building the Rust RDMA tests with -Zsanitizer=address into $TARGET_DIR"
json=$(mktemp /tmp/asan-rdma.XXXXXX)
trap 'rm -f "$json"' EXIT
RUSTC_BOOTSTRAP=1 RUSTFLAGS="${RUSTFLAGS:-} -Zsanitizer=address -Cforce-frame-pointers=yes" \
    cargo test --release --features rdma-tests --test rdma --no-run \
    --target "$TARGET" --target-dir "$TARGET_DIR" --message-format=json-render-diagnostics > "$json"
bin=$(jq -r 'select(.reason == "compiler-artifact" and .target.name == "rdma"
                    and (.target.kind | index("test")) and .executable != null)
             | .executable' "$json" | tail -1)
[ -n "$bin" ] || { echo "asan-rdma: cargo built no test executable for target rdma" >&2; exit 1; }
nm "$bin" | grep -w __asan_init > /dev/null || { echo "asan-rdma: $bin is not linked with ASan" >&2; exit 1; }

skip_args=()
for t in ${SKIP[@]+"${SKIP[@]}"}; do skip_args+=(--skip "$t"); done
rm -rf "$REPORTS"
mkdir -p "$REPORTS"
# detect_leaks: LSan at each process's exit (it stops the threads with
# ptrace: root in the guest may).  Reports go to the guest's /tmp first,
# which the children that drop root can write to, then here.
opts="detect_leaks=1:log_path=/tmp/asan-rdma/asan:print_summary=1${ASAN_RDMA_OPTIONS:+:$ASAN_RDMA_OPTIONS}"
cmd=$(printf '%q ' "$bin" --test-threads=1 ${skip_args[@]+"${skip_args[@]}"} "$@")
echo "asan-rdma: --- in the guest: ASAN_OPTIONS=$opts $cmd"
rc=0
RXE_VM_MEM=${RXE_VM_MEM:-4G} "$VM" "mkdir -m 1777 /tmp/asan-rdma
ASAN_OPTIONS=$(printf '%q' "$opts") $cmd
rc=\$?
cp /tmp/asan-rdma/asan.* $(printf '%q' "$REPORTS")/ 2> /dev/null
exit \$rc" || rc=$?

# Every process's reports (log_path files are named asan.PID).
reports=("$REPORTS"/asan.*)
[ -e "${reports[0]}" ] || reports=()
for r in ${reports[@]+"${reports[@]}"}; do
    echo "asan-rdma: ==== report ${r##*/}"
    cat "$r"
done
[ ${#SKIP[@]} = 0 ] || printf 'asan-rdma: skipped: %s\n' "${SKIP[@]}"
echo "asan-rdma: test binary exit status $rc, ${#reports[@]} ASan/LSan report file(s) in $REPORTS"
[ "$rc" = 125 ] && exit 125
[ "$rc" = 0 ] && [ ${#reports[@]} = 0 ] || exit 1
