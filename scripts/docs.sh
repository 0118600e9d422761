#!/usr/bin/env bash
# docs.sh -- the C API reference: Doxygen over capi/include/rdmamig.h (the doc
# comments cbindgen copies from capi/src/*.rs) with docs/Doxyfile, warnings as
# errors (WARN_AS_ERROR): an undocumented item or a comment Doxygen cannot
# read fails. Output: target/doc-c/html/index.html (CARGO_TARGET_DIR is not
# followed: the Doxyfile names target/). `make docs` runs it; so does CI
# (scripts/test.sh). Needs doxygen (apt-get install doxygen).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v doxygen > /dev/null || { echo "docs.sh: doxygen is not installed (apt-get install doxygen)" >&2; exit 1; }
RDMAMIG_VERSION=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
export RDMAMIG_VERSION
rm -rf target/doc-c
mkdir -p target/doc-c
doxygen docs/Doxyfile
test -s target/doc-c/html/rdmamig_8h.html
echo "docs.sh: doxygen $(doxygen --version), no warnings: target/doc-c/html/index.html"
