#!/usr/bin/env bash
# THE test command (README.md, .ci/run): installs what is missing, then builds
# and checks everything, ending with the RDMA suite in an rxe guest.
#
#   bash scripts/test.sh
#
# TEST_SKIP_RDMA_SUITE=1 skips the guest steps (loudly), for quick local runs.
# Each step prints a banner and its elapsed seconds; the first failing step
# stops the run with a non-zero exit. Needs root (or sudo) only when system
# packages are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

CBINDGEN_VERSION=0.29.4
APT_PACKAGES=(libibverbs-dev librdmacm-dev ibverbs-utils pkg-config meson ninja-build gcc g++ make binutils valgrind doxygen)

[[ -d "$HOME/.cargo/bin" ]] && export PATH="$HOME/.cargo/bin:$PATH"
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

as_root() {
    if (( EUID == 0 )); then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "test.sh: need root to run: $*" >&2; return 1; fi
}

install_prerequisites() {
    local missing=() p
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if (( ${#missing[@]} )); then
        echo "installing: ${missing[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        echo "system packages: all present (${APT_PACKAGES[*]})"
    fi

    local have
    have=$(cbindgen --version 2>/dev/null | awk '{print $2}') || true
    if [[ "$have" != "$CBINDGEN_VERSION" ]]; then
        echo "installing cbindgen $CBINDGEN_VERSION (found: ${have:-none})"
        cargo install --locked --force --version "$CBINDGEN_VERSION" cbindgen
    else
        echo "cbindgen $have"
    fi

    if cargo fuzz --version >/dev/null 2>&1; then
        cargo fuzz --version
    else
        echo "installing cargo-fuzz"
        cargo install --locked --version 0.13.2 cargo-fuzz
    fi
    cargo --version
    rustc --version
}

step "prerequisites" install_prerequisites
step "cargo build --release" cargo build --release
step "cargo test --release" cargo test --release
step "cargo clippy" cargo clippy --release --all-targets --features rdma-tests,bench-internals -- -D warnings
step "header check" bash scripts/check-header.sh
step "make (versioned .so)" make --no-print-directory
step "ABI check" bash scripts/check-abi.sh
step "C tests (make check)" make --no-print-directory c-tests check
step "install + pkg-config + meson" bash scripts/check-install.sh
step "C API docs (Doxygen)" bash scripts/docs.sh
step "fuzz (10 s per target)" bash scripts/fuzz.sh ci
if [[ -n "${TEST_SKIP_RDMA_SUITE:-}" ]]; then
    skip "rxe-vm harness tests" "TEST_SKIP_RDMA_SUITE is set"
    skip "RDMA suite (rxe guest)" "TEST_SKIP_RDMA_SUITE is set: this run did NOT test RDMA"
else
    step "rxe-vm harness tests" bash scripts/rxe-vm/test.sh
    step "RDMA suite (rxe guest)" bash scripts/rdma-suite.sh
fi
finish 0
