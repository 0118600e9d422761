#!/usr/bin/env bash
# Regenerates the C header into a temporary file with the pinned cbindgen and
# fails, showing the diff, if it differs from the checked-in capi/include/rdmamig.h.
# Fix with `make header` (and commit capi/include/rdmamig.h).
# The header's RDMAMIG_VERSION_* macros are compared with Cargo.toml both here
# and by the unit test ffi::header_tests (cargo test).
set -euo pipefail
cd "$(dirname "$0")/.."

want=0.29.4
cbindgen=${CBINDGEN:-cbindgen}
have=$("$cbindgen" --version 2>/dev/null | awk '{print $2}') || true
if [[ "$have" != "$want" ]]; then
    echo "check-header: FAIL: need cbindgen $want, found '${have:-none}'" >&2
    echo "              cargo install cbindgen --locked --version $want" >&2
    exit 1
fi

tmp=$(mktemp)
log=$(mktemp)
trap 'rm -f "$tmp" "$log"' EXIT
if ! "$cbindgen" --config capi/cbindgen.toml --output "$tmp" capi/src/lib.rs 2>"$log"; then
    cat "$log" >&2
    echo "check-header: FAIL: cbindgen failed" >&2
    exit 1
fi
if ! diff -u --label capi/include/rdmamig.h --label "regenerated (cbindgen $want)" capi/include/rdmamig.h "$tmp"; then
    echo "check-header: FAIL: capi/include/rdmamig.h is stale; run 'make header' and commit it" >&2
    exit 1
fi

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
IFS=. read -r major minor patch <<<"${version%%[-+]*}"
for part in MAJOR:$major MINOR:$minor PATCH:$patch; do
    name=${part%%:*} value=${part#*:}
    got=$(sed -n "s/^#define RDMAMIG_VERSION_$name \([0-9]*\)\$/\1/p" capi/include/rdmamig.h)
    if [[ "$got" != "$value" ]]; then
        echo "check-header: FAIL: RDMAMIG_VERSION_$name is '$got' in the header, Cargo.toml says $value" >&2
        echo "              (edit after_includes in capi/cbindgen.toml, then 'make header')" >&2
        exit 1
    fi
done
echo "check-header: OK: capi/include/rdmamig.h matches cbindgen $want output; version macros = $version"
