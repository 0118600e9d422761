#!/usr/bin/env bash
# The README's C example compiles and links. Every ```c block that follows the
# line `<!-- compiled by scripts/check-readme-c.sh -->` (blank lines between
# allowed, nothing else) is extracted and built with -Wall -Wextra -Werror
# -Wpedantic against capi/include/rdmamig.h and the library `make` builds
# (target/lib/librdmamig.so). Compile and link only: nothing runs, no RDMA is
# needed. Errors name the README's lines (#line). At least one block must be
# marked. scripts/test.sh runs it after `make`.
#
#   scripts/check-readme-c.sh [FILE]    FILE: README.md unless given
set -euo pipefail
cd "$(dirname "$0")/.."

readme=${1:-README.md}
target=${CARGO_TARGET_DIR:-target}
libdir=$target/lib
out=$target/readme-c
marker='<!-- compiled by scripts/check-readme-c.sh -->'

if [[ ! -e $libdir/librdmamig.so ]]; then
    echo "check-readme-c: FAIL: $libdir/librdmamig.so is missing: run make first" >&2
    exit 1
fi
rm -rf "$out"
mkdir -p "$out"

# Writes each marked block to $out/example_N.c, led by a #line directive.
awk -v marker="$marker" -v out="$out" -v readme="$readme" '
    function fail(why) { printf "check-readme-c: FAIL: %s:%d: %s\n", readme, NR, why > "/dev/stderr"; bad = 1; exit 1 }
    $0 == marker { if (armed || file) fail("a marker inside a marked block or before another marker"); armed = 1; next }
    armed && $0 == "```c" { armed = 0; file = sprintf("%s/example_%d.c", out, ++n); printf "#line %d \"%s\"\n", NR + 1, readme > file; next }
    armed && $0 !~ /^[ \t]*$/ { fail("the marker is not followed by a ```c block") }
    file && $0 ~ /^```/ { close(file); file = ""; next }
    file { print > file }
    END { if (bad) exit 1; if (armed || file) fail("a marked block is not closed"); if (n == 0) fail("no block is marked \"" marker "\"") }
' "$readme"

cc=${CC:-cc}
for src in "$out"/example_*.c; do
    "$cc" -std=gnu11 -Wall -Wextra -Werror -Wpedantic -Icapi/include -o "${src%.c}" "$src" -L"$libdir" -lrdmamig
    echo "check-readme-c: OK: ${src#"$out"/} of $readme compiles and links"
done
