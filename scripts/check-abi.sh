#!/usr/bin/env bash
# ABI checks on the shared library built by `make`:
#   1. its defined dynamic symbols are exactly capi/abi/symbols.txt (all rdmamig_*);
#   2. capi/abi/symbols.txt is exactly the functions declared in capi/include/rdmamig.h
#      and, for the test-only ones, capi/c-tests/rdmamig_testing.h;
#   3. SONAME is librdmamig.so.<MAJOR>;
#   4. every exported symbol carries a version node of capi/abi/rdmamig.map
#      (today: RDMAMIG_0.1 to RDMAMIG_0.16), none is unversioned;
#   5. the header's values (enum values, constants, struct sizes) are exactly
#      capi/abi/values.txt: a value that changed, vanished or came without
#      being recorded fails (a change of meaning must be deliberate, and
#      listed in docs/abi-changes.md).
#
# Usage: scripts/check-abi.sh [LIB]         (default: target/lib/librdmamig.so.<version>)
#        scripts/check-abi.sh --list [LIB]  print the exported symbols (make symbols)
#        scripts/check-abi.sh --values      print the header's values (make symbols)
set -euo pipefail
cd "$(dirname "$0")/.."

# NAME = VALUE for every enum value and constant of the header (the
# version macros change with every release and are left out).
header_values() {
    {
        grep -E '^[[:space:]]+RDMAMIG_[A-Z0-9_]+ = [0-9]+,?$' capi/include/rdmamig.h | sed -E 's/^[[:space:]]+//; s/,$//'
        grep -E '^#define RDMAMIG_[A-Z0-9_]+ ' capi/include/rdmamig.h | grep -v '^#define RDMAMIG_VERSION_' \
            | sed -E 's/^#define ([A-Z0-9_]+) (.*)$/\1 = \2/'
    } | LC_ALL=C sort
}

if [[ "${1:-}" == "--values" ]]; then
    header_values
    exit 0
fi
list=0
if [[ "${1:-}" == "--list" ]]; then list=1; shift; fi
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
major=${version%%.*}
lib=${1:-${CARGO_TARGET_DIR:-target}/lib/librdmamig.so.$version}
[[ -f "$lib" ]] || { echo "check-abi: $lib not found (run make)" >&2; exit 1; }

# Defined dynamic symbols, without @@VERSION, minus the version nodes themselves
# (absolute symbols named like RDMAMIG_0.1).
exported() {
    nm -D --defined-only "$lib" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' | LC_ALL=C sort -u
}

if (( list )); then
    exported
    exit 0
fi

fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. exported == golden
exported > "$tmp/exported"
LC_ALL=C sort -u capi/abi/symbols.txt > "$tmp/golden"
if ! diff -u --label capi/abi/symbols.txt --label "$lib" "$tmp/golden" "$tmp/exported"; then
    echo "check-abi: FAIL: exported symbols differ from capi/abi/symbols.txt" >&2
    echo "           (a deliberate ABI change? run 'make symbols' and commit capi/abi/symbols.txt)" >&2
    fail=1
fi
if grep -v '^rdmamig_' "$tmp/golden"; then
    echo "check-abi: FAIL: capi/abi/symbols.txt lists symbols outside the rdmamig_ prefix (above)" >&2
    fail=1
fi

# 2. golden == functions declared in the headers (declarations start in column 0).
cat capi/include/rdmamig.h capi/c-tests/rdmamig_testing.h | grep -E '^[A-Za-z].*\brdmamig_[a-z0-9_]+\(' \
    | grep -oE '\brdmamig_[a-z0-9_]+\(' | tr -d '(' | LC_ALL=C sort -u > "$tmp/header"
if ! diff -u --label capi/abi/symbols.txt --label "capi/include/rdmamig.h + capi/c-tests/rdmamig_testing.h" "$tmp/golden" "$tmp/header"; then
    echo "check-abi: FAIL: capi/abi/symbols.txt and the functions of capi/include/rdmamig.h (+ capi/c-tests/rdmamig_testing.h) differ" >&2
    fail=1
fi

# 2b. the test-only functions stay out of the public header.
grep -oE '\brdmamig_[a-z0-9_]+\(' capi/c-tests/rdmamig_testing.h | tr -d '(' | LC_ALL=C sort -u > "$tmp/testing"
if grep -oE '\brdmamig_[a-z0-9_]+\(' capi/include/rdmamig.h | tr -d '(' | LC_ALL=C sort -u | comm -12 - "$tmp/testing" | grep .; then
    echo "check-abi: FAIL: the test-only functions above are in capi/include/rdmamig.h" >&2
    fail=1
fi

# 3. SONAME
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [[ "$soname" != "librdmamig.so.$major" ]]; then
    echo "check-abi: FAIL: SONAME is '$soname', expected librdmamig.so.$major" >&2
    fail=1
fi

# 4. symbol versions: objdump -T prints "<addr> <flags> <section> <size> <version> <name>".
nodes=$(grep -oE '^[[:space:]]*RDMAMIG_[0-9.]+' capi/abi/rdmamig.map | sed 's/[[:space:]]//g' | sort -u | tr '\n' ' ')
objdump -T "$lib" | awk '$4 !~ /\*UND\*/ && $NF ~ /^rdmamig_/ { print $(NF-1), $NF }' > "$tmp/versions"
bad=0
while read -r ver name; do
    case " $nodes " in
        *" $ver "*) ;;
        *) echo "check-abi: FAIL: $name has version '$ver', not one of: $nodes" >&2; bad=1 ;;
    esac
done < "$tmp/versions"
if [[ $(wc -l < "$tmp/versions") -ne $(wc -l < "$tmp/exported") ]]; then
    echo "check-abi: FAIL: objdump -T and nm -D disagree on the exported symbols" >&2
    bad=1
fi
(( bad )) && fail=1

# 5. values
header_values > "$tmp/values"
if ! diff -u --label capi/abi/values.txt --label capi/include/rdmamig.h capi/abi/values.txt "$tmp/values"; then
    echo "check-abi: FAIL: the header's values differ from capi/abi/values.txt" >&2
    echo "           (a new value: run 'make symbols' and commit capi/abi/values.txt; a changed or" >&2
    echo "           removed one changes the meaning of the ABI: list it in docs/abi-changes.md)" >&2
    fail=1
fi

n=$(wc -l < "$tmp/exported")
if (( fail )); then
    echo "check-abi: FAIL ($lib)" >&2
    exit 1
fi
echo "check-abi: OK: $n symbols = capi/abi/symbols.txt = capi/include/rdmamig.h + capi/c-tests/rdmamig_testing.h, SONAME $soname, versions: $nodes, $(wc -l < "$tmp/values") values = capi/abi/values.txt"
