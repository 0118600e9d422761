#!/usr/bin/env bash
# build.sh -- build QEMU's qemu-system-x86_64 and its tests/qtest/migration-test,
# stock and with the patches in patches/, and print the directory they are in.
#
#   integrations/qemu/build.sh      -> prints DIR (the only line on stdout)
#
# DIR/stock and DIR/patched (links to the two builds) each hold:
#   qemu-system-x86_64   a launcher that runs the build with Debian's firmware
#                        (-L: the +ds source has no ROMs) and, if
#                        RDMAMIG_LIBDIR is set, with the librdmamig.so.0 there
#   migration-test       QEMU's tests/qtest/migration-test; run it in this
#                        directory (it runs scripts/rdma-migration-helper.sh)
#                        with QTEST_QEMU_BINARY=$PWD/qemu-system-x86_64
# The patched QEMU links librdmamig: built against this checkout's library
# (run make first) unless RDMAMIG_PKG_CONFIG_PATH points at another.
#
# The source is Debian's qemu source package (QEMU_DEB_VERSION, the one
# version pin), fetched with `apt-get source` through a private apt source
# list (the host's apt sources stay as they are) and kept in CACHE/src, so a
# rebuild does not depend on the suite still carrying that version.  It is
# built for x86_64-softmmu only, with RDMA, without docs, GUI or any other
# optional feature.  meson >= 1.5 and the firmware (seabios 1.16.3, as
# scripts/rxe-vm.sh's QEMU 10.0 peer) come from bookworm-backports, unpacked
# into CACHE, not installed.  The build packages are installed with apt-get.
#
# Each build is cached: CACHE/qemu-VERSION-stock-KEY, KEY a hash of the
# configure options and targets, and CACHE/qemu-VERSION-patched-KEY, KEY
# also covering the patches and capi/include/rdmamig.h.  A second run only prints
# DIR.  Remove a directory to build it again.  Building needs root
# (apt-get); a variant took about 3 minutes with 2 idle cores, 10 with 2
# busy ones.
#
# Environment (all optional):
#   RXE_VM_CACHE    cache root, as scripts/rxe-vm.sh (default /var/cache/rxe-vm);
#                   the builds go to RXE_VM_CACHE/qemu-build (CACHE above)
#   QEMU_BUILD_JOBS ninja's -j (default: the number of cores)
#   RDMAMIG_PKG_CONFIG_PATH  where rdmamig.pc is, to build against an
#                   installed librdmamig instead of this checkout's
set -euo pipefail

QEMU_DEB_VERSION=1:10.2.2+ds-1
QEMU_SOURCE_SUITE=sid
TOOLS_SUITE=bookworm-backports
TOOLS_PKGS=(meson seabios)
BUILD_PKGS=(gcc pkg-config ninja-build python3-venv dpkg-dev libglib2.0-dev libpixman-1-dev
            libibverbs-dev librdmacm-dev)
CONFIGURE_OPTS=(--target-list=x86_64-softmmu --without-default-features --enable-rdma
                --enable-kvm --disable-docs --disable-download --disable-tools
                --disable-install-blobs)
TARGETS=(qemu-system-x86_64 tests/qtest/migration-test)
# The firmware directories of the launcher: seabios's bios-256k.bin,
# qemu-system-data's option ROMs, ipxe-qemu's NIC ROMs (q35's e1000e).
ROM_DIRS=(/usr/share/qemu /usr/lib/ipxe/qemu)

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
CACHE=${RXE_VM_CACHE:-/var/cache/rxe-vm}/qemu-build
JOBS=${QEMU_BUILD_JOBS:-$(nproc)}

log() { echo "[qemu-build] $*" >&2; }
die() { echo "[qemu-build] ERROR: $*" >&2; exit 1; }
T0=$SECONDS

# The patches, in the order they apply.
shopt -s nullglob
PATCHES=("$HERE"/patches/*.patch)
shopt -u nullglob
[ ${#PATCHES[@]} -gt 0 ] || die "no patches in $HERE/patches"
REPO=$(cd "$HERE/../.." && pwd -P)
VERSION=${QEMU_DEB_VERSION#*:}
# The stock build is keyed by what configures and builds it; the patched one
# also by the patches and the library's header they compile against (the
# library itself is linked at run time: its ABI is kept).
STOCK_KEY=$({ printf '%s\n' "${CONFIGURE_OPTS[@]}" "${TARGETS[@]}"; } | sha256sum | cut -c1-12)
PATCHED_KEY=$({ echo "$STOCK_KEY"; for p in "${PATCHES[@]}"; do basename "$p"; cat "$p"; done
                cat "$REPO/capi/include/rdmamig.h"; } | sha256sum | cut -c1-12)
STOCK=$CACHE/qemu-$VERSION-stock-$STOCK_KEY
PATCHED=$CACHE/qemu-$VERSION-patched-$PATCHED_KEY
OUT=$CACHE/qemu-$VERSION-$PATCHED_KEY
TOOLS=$CACHE/tools-$TOOLS_SUITE

# launcher VARIANT_DIR: (re)write VARIANT_DIR/qemu-system-x86_64, which runs
# the build (in libexec/) with the firmware, and with librdmamig from
# $RDMAMIG_LIBDIR when that is set (otherwise from the system's library
# path).  Written on every run: cheap, and firmware changes need no rebuild.
launcher() {
    local d=$1 rom
    {
        echo '#!/bin/sh'
        echo "# QEMU $QEMU_DEB_VERSION built by integrations/qemu/build.sh, with Debian's firmware."
        echo 'export LD_LIBRARY_PATH="${RDMAMIG_LIBDIR:+$RDMAMIG_LIBDIR${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}"'
        printf 'exec %q' "$d/libexec/qemu-system-x86_64"
        for rom in "$TOOLS/usr/share/seabios" "${ROM_DIRS[@]}"; do printf ' -L %q' "$rom"; done
        echo ' "$@"'
    } > "$d/qemu-system-x86_64.tmp"
    chmod +x "$d/qemu-system-x86_64.tmp"
    mv "$d/qemu-system-x86_64.tmp" "$d/qemu-system-x86_64"
}

built() { [ -f "$STOCK/.done" ] && [ -f "$PATCHED/.done" ] && [ -d "$TOOLS/usr/share/seabios" ]; }

finish() {
    local v
    for v in "$STOCK" "$PATCHED"; do launcher "$v"; done
    mkdir -p "$OUT"
    ln -sfn "$STOCK" "$OUT/stock"
    ln -sfn "$PATCHED" "$OUT/patched"
    log "QEMU $QEMU_DEB_VERSION in $OUT ($((SECONDS - T0))s)"
    echo "$OUT"
    exit 0
}
built && finish

[ "$(id -u)" = 0 ] || die "must run as root (apt-get) to build $OUT"
mkdir -p "$CACHE"
exec 9> "$CACHE/.lock"
flock 9
built && finish

install_build_pkgs() {
    local missing
    missing=$({ dpkg-query -W -f='${Package} ${Status}\n' "${BUILD_PKGS[@]}" 2>/dev/null || true; } |
              awk '/ install ok installed$/ { print $1 }' | sort | comm -13 - <(printf '%s\n' "${BUILD_PKGS[@]}" | sort))
    [ -z "$missing" ] && return
    log "installing: $missing"
    # shellcheck disable=SC2086 # one package a word
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends $missing >&2 || die "apt-get install failed"
}

# A private apt configuration: deb lines for TOOLS_SUITE, a deb-src line for
# QEMU_SOURCE_SUITE; its own lists and package cache, so apt's own stay as
# they are.  As root: apt's _apt user could not write to our directories.
APT=$CACHE/apt
APT_OPTS=(-o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$APT/lists" -o Dir::Cache="$APT/cache" -o APT::Sandbox::User=root)
APT_UPDATED=0
apt_private() {
    if [ "$APT_UPDATED" = 0 ]; then
        mkdir -p "$APT/lists/partial" "$APT/cache"
        local line="[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian"
        printf '%s\n' "deb $line $TOOLS_SUITE main" "deb-src $line $QEMU_SOURCE_SUITE main" > "$APT/sources.list"
        apt-get "${APT_OPTS[@]}" update -qq >&2 || die "apt-get update ($TOOLS_SUITE, $QEMU_SOURCE_SUITE) failed"
        APT_UPDATED=1
    fi
    apt-get "${APT_OPTS[@]}" "$@"
}

# meson and seabios -> $TOOLS
fetch_tools() {
    local tmp deb
    [ -f "$TOOLS/.done" ] && return
    log "downloading + unpacking ${TOOLS_PKGS[*]} ($TOOLS_SUITE) into $TOOLS"
    tmp=$(mktemp -d)
    (cd "$tmp" && apt_private download -qq "${TOOLS_PKGS[@]/%//$TOOLS_SUITE}" >&2) ||
        { rm -rf "$tmp"; die "apt-get download ${TOOLS_PKGS[*]} ($TOOLS_SUITE) failed"; }
    rm -rf "$TOOLS"
    mkdir -p "$TOOLS"
    for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$TOOLS"; done
    rm -rf "$tmp"
    touch "$TOOLS/.done"
}

# The source package's files -> $CACHE/src
fetch_source() {
    local dsc=$CACHE/src/qemu_$VERSION.dsc
    [ -f "$dsc" ] && return
    log "downloading the source of qemu $QEMU_DEB_VERSION ($QEMU_SOURCE_SUITE)"
    mkdir -p "$CACHE/src"
    (cd "$CACHE/src" && apt_private source --download-only -qq "qemu=$QEMU_DEB_VERSION" >&2) ||
        die "apt-get source qemu=$QEMU_DEB_VERSION ($QEMU_SOURCE_SUITE) failed"
}

# librdmamig for the patched build, found with pkg-config as QEMU's meson
# looks for it: $RDMAMIG_PKG_CONFIG_PATH when set (e.g. the directory of an
# installed rdmamig.pc), otherwise this checkout's library (`make` first),
# staged in $1 with its header and a rdmamig.pc.
stage_library() {
    local stage=$1
    if [ -n "${RDMAMIG_PKG_CONFIG_PATH:-}" ]; then
        echo "$RDMAMIG_PKG_CONFIG_PATH"
        return
    fi
    [ -e "$REPO/target/lib/librdmamig.so" ] ||
        die "no $REPO/target/lib/librdmamig.so: run make in $REPO first (or set RDMAMIG_PKG_CONFIG_PATH)"
    mkdir -p "$stage/lib/pkgconfig" "$stage/include"
    cp -P "$REPO"/target/lib/librdmamig.so* "$stage/lib/"
    cp "$REPO/capi/include/rdmamig.h" "$stage/include/"
    # The Makefile's own rdmamig.pc rule, with the stage as prefix and as
    # the directory it writes to (nothing is written into the checkout).
    make -s -C "$REPO" CARGO_TARGET_DIR="$stage/lib/pkgconfig" PREFIX="$stage" \
        "$stage/lib/pkgconfig/rdmamig.pc" >&2
    echo "$stage/lib/pkgconfig"
}

# build VARIANT DEST PATCH...: unpack the source (Debian's patches applied,
# among them the skipping of the edk2 blobs the +ds source lacks), apply the
# PATCHes, configure, build TARGETS and keep them in DEST.
build() {
    local variant=$1 dest=$2 src=$WORK/$1 p t0=$SECONDS pc_path=
    shift 2
    [ -f "$dest/.done" ] && return
    log "$variant: unpacking and patching"
    dpkg-source -x "$CACHE/src/qemu_$VERSION.dsc" "$src" > /dev/null ||
        die "dpkg-source -x failed"
    for p in "$@"; do
        patch -d "$src" -p1 --batch --quiet < "$p" || die "$(basename "$p") does not apply to QEMU $QEMU_DEB_VERSION"
    done
    [ $# -gt 0 ] && pc_path=$(stage_library "$WORK/rdmamig")
    mkdir "$src/build"
    log "$variant: configuring and building ${TARGETS[*]} (-j$JOBS; log: $src/build/build.log)"
    # Debian's python, which the unpacked meson is for (not a pyenv's);
    # ninja runs meson too.
    if ! (cd "$src/build" && export PYTHONPATH="$TOOLS/usr/lib/python3/dist-packages" &&
          export PKG_CONFIG_PATH="$pc_path${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" &&
          ../configure --python=/usr/bin/python3 "${CONFIGURE_OPTS[@]}" &&
          ninja -j "$JOBS" "${TARGETS[@]}") > "$src/build/build.log" 2>&1; then
        tail -30 "$src/build/build.log" >&2
        die "$variant: the build failed (log above)"
    fi
    rm -rf "$dest.tmp"
    mkdir -p "$dest.tmp/libexec" "$dest.tmp/scripts"
    cp "$src/build/qemu-system-x86_64" "$dest.tmp/libexec/"
    cp "$src/build/tests/qtest/migration-test" "$dest.tmp/"
    cp "$src/scripts/rdma-migration-helper.sh" "$dest.tmp/scripts/"
    rm -rf "$src" "$dest"
    touch "$dest.tmp/.done"
    mv "$dest.tmp" "$dest"
    log "$variant: built in $((SECONDS - t0))s"
}

install_build_pkgs
fetch_tools
fetch_source
WORK=$(mktemp -d "$CACHE/work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
build stock "$STOCK"
build patched "$PATCHED" "${PATCHES[@]}"
finish
