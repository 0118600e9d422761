#!/usr/bin/env bash
# Installs rdmamig into a temporary prefix with `make install` and builds the
# meson example against it through pkg-config only (no path into the source
# tree), then runs it. Also checks the installed file set and the .pc file.
#
#   scripts/check-install.sh                     make install into a temporary prefix
#   scripts/check-install.sh --installed LIBDIR  only pkg-config and the consumers, against
#       the copy installed in the system (the librdmamig-dev package: scripts/deb.sh --check),
#       through pkg-config's and the dynamic loader's default paths
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
major=${version%%.*}

# consumers LIBDIR: a plain cc build through pkg-config, then the meson example;
# each runs and must load librdmamig.so.MAJOR from LIBDIR. The example is copied
# out of the tree so nothing can find the source checkout.
consumers() {
    local libdir=$1
    cc -std=c11 -Wall -Wextra -Werror -o "$tmp/cc-example" meson-example/main.c \
        $(pkg-config --cflags --libs rdmamig)
    "$tmp/cc-example"

    cp -r meson-example "$tmp/example"
    (
        cd "$tmp/example"
        meson setup build >"$tmp/meson-setup.log" 2>&1 || { cat "$tmp/meson-setup.log" >&2; exit 1; }
        grep 'Run-time dependency rdmamig found' "$tmp/meson-setup.log"
        meson compile -C build
        ./build/rdmamig-example
        deps=$(ldd ./build/rdmamig-example)
        # (by real path: with a merged /usr the loader says /lib/... for /usr/lib/...)
        loaded=$(awk -v so="librdmamig.so.$major" '$1 == so && $2 == "=>" { print $3 }' <<<"$deps")
        grep -F "librdmamig.so.$major => $loaded" <<<"$deps"
        [[ -n "$loaded" && "$(realpath "$loaded")" == "$(realpath "$libdir/librdmamig.so.$major")" ]] \
            || { echo "$deps"; echo "check-install: FAIL: example did not load the library in $libdir" >&2; exit 1; }
        meson test -C build --print-errorlogs
    )
}

if [[ "${1:-}" == "--installed" ]]; then
    libdir=${2:?usage: check-install.sh --installed LIBDIR}
    unset PKG_CONFIG_PATH LD_LIBRARY_PATH
    echo "pkg-config --modversion rdmamig: $(pkg-config --modversion rdmamig)"
    [[ "$(pkg-config --modversion rdmamig)" == "$version" ]] || { echo "check-install: FAIL: .pc version" >&2; exit 1; }
    [[ "$(pkg-config --variable=libdir rdmamig)" == "$libdir" ]] || { echo "check-install: FAIL: .pc libdir" >&2; exit 1; }
    echo "pkg-config --cflags --libs rdmamig: $(pkg-config --cflags --libs rdmamig)"
    [[ " $(pkg-config --libs rdmamig) " == *" -lrdmamig "* ]] || { echo "check-install: FAIL: libs" >&2; exit 1; }
    consumers "$libdir"
    echo "check-install: OK: the copy in $libdir: pkg-config, cc and meson consumers"
    exit 0
fi

prefix=$tmp/prefix
make --no-print-directory install PREFIX="$prefix"

fail=0
for f in lib/librdmamig.so.$version lib/librdmamig.so.$major lib/librdmamig.so lib/librdmamig.a \
         include/rdmamig.h lib/pkgconfig/rdmamig.pc; do
    [[ -e "$prefix/$f" ]] || { echo "check-install: FAIL: $f not installed" >&2; fail=1; }
done
[[ "$(readlink "$prefix/lib/librdmamig.so.$major")" == "librdmamig.so.$version" ]] \
    || { echo "check-install: FAIL: librdmamig.so.$major does not point to librdmamig.so.$version" >&2; fail=1; }
[[ "$(readlink "$prefix/lib/librdmamig.so")" == "librdmamig.so.$major" ]] \
    || { echo "check-install: FAIL: librdmamig.so does not point to librdmamig.so.$major" >&2; fail=1; }
# The man(3) pages (installed when doxygen is there, as in CI): a function's
# name finds the header's page.
if command -v doxygen > /dev/null; then
    MANPATH=$prefix/share/man man rdmamig_connect 2>/dev/null | grep -q 'rdmamig_status rdmamig_connect' \
        || { echo "check-install: FAIL: man rdmamig_connect does not show $prefix/share/man/man3/rdmamig.h.3" >&2; fail=1; }
fi
(( fail )) && exit 1

# DESTDIR staging: files land under DESTDIR, the .pc still names PREFIX.
make --no-print-directory install PREFIX=/opt/rdmamig DESTDIR="$tmp/stage" >/dev/null
[[ -f "$tmp/stage/opt/rdmamig/lib/librdmamig.so.$version" ]] \
    || { echo "check-install: FAIL: DESTDIR not honoured" >&2; exit 1; }
grep -qx 'prefix=/opt/rdmamig' "$tmp/stage/opt/rdmamig/lib/pkgconfig/rdmamig.pc" \
    || { echo "check-install: FAIL: staged rdmamig.pc does not say prefix=/opt/rdmamig" >&2; exit 1; }

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
echo "pkg-config --modversion rdmamig: $(pkg-config --modversion rdmamig)"
[[ "$(pkg-config --modversion rdmamig)" == "$version" ]] || { echo "check-install: FAIL: .pc version" >&2; exit 1; }
echo "pkg-config --cflags --libs rdmamig: $(pkg-config --cflags --libs rdmamig)"
[[ " $(pkg-config --cflags rdmamig) " == *" -I$prefix/include "* ]] || { echo "check-install: FAIL: cflags" >&2; exit 1; }
[[ " $(pkg-config --libs rdmamig) " == *" -L$prefix/lib -lrdmamig "* ]] || { echo "check-install: FAIL: libs" >&2; exit 1; }

export LD_LIBRARY_PATH=$prefix/lib
consumers "$prefix/lib"
echo "check-install: OK: make install PREFIX=..., DESTDIR, pkg-config, cc and meson consumers"
