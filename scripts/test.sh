#!/usr/bin/env bash
# THE test command (README.md, .ci/run): installs what is missing, then builds
# and checks everything, ending with the RDMA suite in an rxe guest.
#
#   bash scripts/test.sh
#
# TEST_SKIP_RDMA_SUITE=1 skips the guest steps (loudly), for quick local runs.
# Each step prints a banner and its elapsed seconds; the first failing step
# stops the run with a non-zero exit. Needs root (or sudo) when system
# packages are missing, and for the Debian packages step (dpkg -i, then purge).
set -euo pipefail
cd "$(dirname "$0")/.."

# ~/.cargo/bin even if missing yet: the prerequisites may install rustup there.
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

t_start=$SECONDS
passed=0
skipped=0
summary=()

banner() {
    printf '\n==================== %s ====================\n' "$*"
}

# step NAME COMMAND...: runs COMMAND with a banner; stops the run if it fails.
step() {
    local name=$1; shift
    banner "$name"
    local t0=$SECONDS rc=0
    # A subshell outside any ||/&& list, so that set -e still applies inside
    # shell functions run as steps.
    set +e
    (set -e; "$@")
    rc=$?
    set -e
    local dt=$((SECONDS - t0))
    if (( rc != 0 )); then
        printf '\n!!!!!!!!!!!!!!!!!!!! FAILED: %s (exit %d, %ds) !!!!!!!!!!!!!!!!!!!!\n' "$name" "$rc" "$dt"
        summary+=("$(printf '%-28s FAILED %5ds' "$name" "$dt")")
        finish 1
    fi
    printf -- '---- %s: ok (%ds)\n' "$name" "$dt"
    summary+=("$(printf '%-28s ok     %5ds' "$name" "$dt")")
    passed=$((passed + 1))
}

skip() {
    local name=$1 why=$2
    banner "$name"
    printf '\n!!!!!!!!!!!!!!!!!!!! SKIPPED: %s !!!!!!!!!!!!!!!!!!!!\n!!!! %s\n' "$name" "$why"
    summary+=("$(printf '%-28s SKIPPED       (%s)' "$name" "$why")")
    skipped=$((skipped + 1))
}

finish() {
    local failed=$1
    banner "summary ($((SECONDS - t_start))s)"
    printf '%s\n' "${summary[@]}"
    echo "steps: $passed passed, $failed failed, $skipped skipped"
    exit "$failed"
}

# What is missing (apt packages, cbindgen, cargo-fuzz): scripts/prerequisites.sh,
# shared with `make demo` (rdma-suite.sh installs the guest's: rxe-vm.sh --install-only).
step "prerequisites" bash scripts/prerequisites.sh test deb
step "cargo build --release" cargo build --release
step "cargo test --release" cargo test --release
step "cargo clippy" cargo clippy --release --all-targets --features rdma-tests,bench-internals -- -D warnings
step "cargo clippy (library as users build it)" cargo clippy --release -p rdmamig -- -D warnings
# The engine's roles work with safe types only: unsafe lives in verbs/ and host/ (docs/design.md).
step "no unsafe in engine/{source,destination,link,postcopy}" \
    bash -c '! grep -rn unsafe src/engine/source src/engine/destination src/engine/link src/engine/postcopy'
# Every import points down the layers, and none goes round a circle inside engine/, capi/ or cli/ (docs/design.md).
step "module graph (no cycle, no upward arrow)" python3 scripts/module-graph.py --check
step "header check" bash scripts/check-header.sh
step "make (versioned .so)" make --no-print-directory
step "ABI check" bash scripts/check-abi.sh
step "C tests (make check)" make --no-print-directory c-tests check
step "README C example" bash scripts/check-readme-c.sh
step "install + pkg-config + meson" bash scripts/check-install.sh
step "C API docs (Doxygen)" bash scripts/docs.sh
step "debian packages" bash scripts/deb.sh --check
step "fuzz (10 s per target)" bash scripts/fuzz.sh ci
# That the native benchmark runs (small sizes, no timing checked; host only).
step "native benchmark (quick)" python3 scripts/bench-native.py --quick
if [[ -n "${TEST_SKIP_RDMA_SUITE:-}" ]]; then
    skip "rxe-vm harness tests" "TEST_SKIP_RDMA_SUITE is set"
    skip "RDMA suite (rxe guest)" "TEST_SKIP_RDMA_SUITE is set: this run did NOT test RDMA"
else
    step "rxe-vm harness tests" bash scripts/rxe-vm/test.sh
    step "RDMA suite (rxe guest)" bash scripts/rdma-suite.sh
fi
finish 0
