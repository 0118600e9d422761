#!/usr/bin/env bash
# THE demo command (README.md; `make demo` runs it too): installs what is
# missing on Debian/Ubuntu (scripts/prerequisites.sh build guest: rdma-core's
# -dev packages, gcc, make, QEMU, the guest's kernel), builds the library and
# the C demo hypervisor (capi/c-tests/rdma_test_demo.c), and migrates 256 MiB
# between two processes over Soft-RoCE in a throw-away QEMU guest.
#
#   bash scripts/demo.sh [DEMO_ARGS...]     (default: --mib 256)
#
# Needs root or sudo (apt-get, QEMU); installs what is missing, Rust
# included (scripts/prerequisites.sh). Runs without make installed.
set -euo pipefail
cd "$(dirname "$0")/.."

# ~/.cargo/bin even if missing yet: the prerequisites may install rustup there.
export PATH="$HOME/.cargo/bin:$PATH"

bash scripts/prerequisites.sh build guest
target=${CARGO_TARGET_DIR:-target}
make --no-print-directory all "$target/c-tests/rdma_test_demo"
(( $# )) || set -- --mib 256
cmd=$(printf ' %q' "$target/c-tests/rdma_test_demo" "$@")
if (( EUID == 0 )); then
    bash scripts/rxe-vm.sh "${cmd# }"
else
    sudo bash scripts/rxe-vm.sh "${cmd# }"
fi
