#!/usr/bin/env bash
# Installs rdmamig into a temporary prefix with `make install` and builds the
# meson example against it through pkg-config only (no path into the source
# tree), then runs it. Also checks the installed file set and the .pc file.
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
major=${version%%.*}

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

# A plain cc build through pkg-config, then the meson example. Copy the example
# out of the tree so nothing can find the source checkout.
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/cc-example" meson-example/main.c \
    $(pkg-config --cflags --libs rdmamig)
LD_LIBRARY_PATH=$prefix/lib "$tmp/cc-example"

cp -r meson-example "$tmp/example"
(
    cd "$tmp/example"
    meson setup build >"$tmp/meson-setup.log" 2>&1 || { cat "$tmp/meson-setup.log" >&2; exit 1; }
    grep 'Run-time dependency rdmamig found' "$tmp/meson-setup.log"
    meson compile -C build
    LD_LIBRARY_PATH=$prefix/lib ./build/rdmamig-example
    deps=$(LD_LIBRARY_PATH=$prefix/lib ldd ./build/rdmamig-example)
    grep -F "librdmamig.so.$major => $prefix/lib/librdmamig.so.$major" <<<"$deps" \
        || { echo "$deps"; echo "check-install: FAIL: example did not load the installed library" >&2; exit 1; }
    LD_LIBRARY_PATH=$prefix/lib meson test -C build --print-errorlogs
)
echo "check-install: OK: make install PREFIX=..., DESTDIR, pkg-config, cc and meson consumers"
