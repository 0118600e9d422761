#!/usr/bin/env bash
# Installs what the project's commands need on Debian or Ubuntu: only what is
# missing, so a second run changes nothing. `make demo` and scripts/test.sh
# both call it; it can be run by hand too.
#
#   bash scripts/prerequisites.sh [--dry-run] GROUP...
#
#   build   the library and the C demo: rdma-core's -dev packages, pkg-config,
#           gcc (with ASan) and libc6-dev (which gcc only recommends), make
#   test    build + what scripts/test.sh needs: meson, ninja, g++, valgrind,
#           cbindgen 0.29.4 and cargo-fuzz (cargo install)
#   deb     the Debian packages (debian/, scripts/deb.sh): debhelper, dpkg-dev,
#           build-essential (an implicit build dependency of every package)
#   lintian lintian (142 packages on Debian 12: not in CI; scripts/deb.sh --lintian)
#   guest   the Soft-RoCE QEMU guest: `scripts/rxe-vm.sh --install-only`
#           (QEMU, rdma-core's tools, Debian's kernel; its own list; and
#           QEMU 10.0 from bookworm-backports, unpacked beside the host's)
#
# apt-get runs as root, or through sudo. --dry-run installs nothing: it names
# the missing packages and shows what apt-get would install (apt-get -s).
#
# Rust itself (cargo, rustc 1.85 or newer) is taken from PATH or ~/.cargo/bin.
# If there is none, the distribution's cargo is installed when it is new
# enough (Debian 13, Ubuntu 25.04), otherwise rustup's stable toolchain into
# ~/.cargo (Debian 12's rustc is 1.63). An older Rust stops this with a message.
set -euo pipefail
cd "$(dirname "$0")/.."

CBINDGEN_VERSION=0.29.4
CARGO_FUZZ_VERSION=0.13.2
RUST_MIN_MINOR=85   # Cargo.toml's rust-version 1.85 (the CLI's clap and indicatif need it)

APT_BUILD=(libibverbs-dev librdmacm-dev pkg-config gcc libc6-dev make binutils)
APT_TEST=(meson ninja-build g++ valgrind ibverbs-utils doxygen man-db)
APT_DEB=(debhelper dpkg-dev build-essential doxygen)
APT_LINT=(lintian)

dry=0
if [[ "${1:-}" == "--dry-run" ]]; then dry=1; shift; fi
(( $# )) || { sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2; }

[[ -d "$HOME/.cargo/bin" ]] && export PATH="$HOME/.cargo/bin:$PATH"

say() { echo "prerequisites: $*"; }

as_root() {
    if (( EUID == 0 )); then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else echo "prerequisites: need root (or sudo) to run: $*" >&2; return 1; fi
}

apt_updated=0
apt_update_once() {
    (( apt_updated )) && return
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -q
    apt_updated=1
}

# apt_install PKG...: installs those of PKG that dpkg does not list as installed.
apt_install() {
    local missing=() p installed
    command -v dpkg-query >/dev/null || { echo "prerequisites: not a Debian/Ubuntu system (no dpkg-query);" \
        "install by hand: $*" >&2; return 1; }
    # (dpkg-query exits 1 for a package it has never heard of: not an error)
    installed=$({ dpkg-query -W -f='${Package} ${Status}\n' "$@" 2>/dev/null || true; } |
                awk '/ install ok installed$/ { print $1 }')
    for p in "$@"; do
        grep -qx "$p" <<<"$installed" || missing+=("$p")
    done
    if (( ${#missing[@]} == 0 )); then
        say "present: $*"
        return 0
    fi
    say "missing: ${missing[*]}"
    if (( dry )); then
        # Simulation needs no root; the package lists may be empty on a fresh machine.
        apt-get -s -q install --no-install-recommends "${missing[@]}" | grep '^Inst ' ||
            say "(apt-get -s found nothing to install: run apt-get update first?)"
        return 0
    fi
    apt_update_once
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
        --no-install-recommends "${missing[@]}"
}

rust_minor() { rustc --version 2>/dev/null | awk '{ split($2, v, "."); print v[2] }'; }

rust() {
    if command -v cargo >/dev/null && command -v rustc >/dev/null; then
        say "$(cargo --version), $(rustc --version)"
        local m; m=$(rust_minor)
        [[ -n "$m" ]] && (( m >= RUST_MIN_MINOR )) && return 0
        echo "prerequisites: rustc 1.$RUST_MIN_MINOR or newer is needed ($(rustc --version));" \
             "update it (rustup update stable)" >&2
        return 1
    fi
    # No Rust: the distribution's, if new enough.
    local cand
    (( dry )) || apt_update_once
    cand=$(apt-cache policy rustc 2>/dev/null | awk '/Candidate:/ { print $2 }')
    cand=${cand#*:}                      # epoch
    if [[ "$cand" =~ ^1\.([0-9]+) ]] && (( BASH_REMATCH[1] >= RUST_MIN_MINOR )); then
        say "no Rust found: installing the distribution's cargo (rustc $cand)"
        apt_install cargo rustc
        return 0
    fi
    # Otherwise rustup's stable toolchain (with clippy and rustfmt), in ~/.cargo as rustup puts it.
    say "no Rust found and the distribution's rustc (${cand:-none}) is older than 1.$RUST_MIN_MINOR:" \
        "installing rustup's stable toolchain into ~/.cargo (https://sh.rustup.rs)"
    (( dry )) && return 0
    apt_install curl ca-certificates
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
        sh -s -- -y --no-modify-path --profile default --default-toolchain stable
    export PATH="$HOME/.cargo/bin:$PATH"
    say "$(cargo --version), $(rustc --version)"
}

# cargo_tool NAME VERSION ANY CHECK_COMMAND...: cargo install NAME@VERSION unless CHECK
# prints VERSION (or, with ANY=any, any version).
cargo_tool() {
    local name=$1 version=$2 any=$3 have; shift 3
    have=$("$@" 2>/dev/null | awk '{ print $NF }') || true
    if [[ "$have" == "$version" || ( "$any" == any && -n "$have" ) ]]; then
        say "$name $have"
    elif (( dry )); then
        say "would cargo install $name $version (found: ${have:-none})"
    else
        say "installing $name $version (found: ${have:-none})"
        cargo install --locked --force --version "$version" "$name"
    fi
}

for group in "$@"; do
    case $group in
        build) apt_install "${APT_BUILD[@]}"; rust ;;
        test)  apt_install "${APT_BUILD[@]}" "${APT_TEST[@]}"; rust
               cargo_tool cbindgen "$CBINDGEN_VERSION" exact cbindgen --version
               cargo_tool cargo-fuzz "$CARGO_FUZZ_VERSION" any cargo fuzz --version ;;
        deb)   apt_install "${APT_DEB[@]}" ;;
        lintian) apt_install "${APT_LINT[@]}" ;;
        guest) if (( dry )); then
                   # rxe-vm.sh has no dry run: with RXE_VM_NO_INSTALL it stops at the first thing missing.
                   if (( EUID == 0 )); then
                       RXE_VM_NO_INSTALL=1 bash scripts/rxe-vm.sh --install-only || say "(guest: the above is missing)"
                   else
                       say "guest: scripts/rxe-vm.sh --install-only (needs root)"
                   fi
               else
                   as_root bash scripts/rxe-vm.sh --install-only
               fi ;;
        *) echo "prerequisites: unknown group '$group' (build, test, deb, lintian, guest)" >&2; exit 2 ;;
    esac
done
