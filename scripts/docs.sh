#!/usr/bin/env bash
# docs.sh -- the C API reference: Doxygen over capi/include/rdmamig.h (the doc
# comments cbindgen copies from capi/src/*.rs), warnings as errors
# (WARN_AS_ERROR): an undocumented item or a comment Doxygen cannot read
# fails. Two outputs (CARGO_TARGET_DIR is not followed: the Doxyfiles name
# target/):
#
#   scripts/docs.sh         HTML (docs/Doxyfile): target/doc-c/html/index.html,
#                           and the man pages as below
#   scripts/docs.sh --man   only the man(3) pages (docs/Doxyfile.man):
#                           target/doc-c/man/man3/ (what `make install` installs)
#
# The pages' date is the last commit's (SOURCE_DATE_EPOCH, when not set), so
# that a rebuild of the same commit gives the same pages. `make docs` and
# `make man` run it; so does CI (scripts/test.sh). Needs doxygen (apt-get
# install doxygen).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v doxygen > /dev/null || { echo "docs.sh: doxygen is not installed (apt-get install doxygen)" >&2; exit 1; }
html=1
case "${1:-}" in
    "") ;;
    --man) html=0 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
esac
RDMAMIG_VERSION=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
export RDMAMIG_VERSION
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2> /dev/null || stat -c %Y Cargo.toml)}
export SOURCE_DATE_EPOCH

if (( html )); then
    rm -rf target/doc-c/html
    mkdir -p target/doc-c
    doxygen docs/Doxyfile
    test -s target/doc-c/html/rdmamig_8h.html
    echo "docs.sh: doxygen $(doxygen --version), no warnings: target/doc-c/html/index.html"
fi

man3=target/doc-c/man/man3
rm -rf target/doc-c/man
mkdir -p target/doc-c
doxygen docs/Doxyfile.man
find "$man3" -name '*.3' ! -name 'rdmamig*' ! -name 'RDMAMIG*' -delete
# Every function of the header has its page.
missing=0
for f in $(grep -oE '^[A-Za-z].*\brdmamig_[a-z0-9_]+\(' capi/include/rdmamig.h | grep -oE 'rdmamig_[a-z0-9_]+\($' | tr -d '('); do
    [ -s "$man3/$f.3" ] || { echo "docs.sh: no man page $man3/$f.3" >&2; missing=1; }
done
(( ! missing ))
echo "docs.sh: doxygen $(doxygen --version), no warnings: $(ls "$man3" | wc -l) man pages in $man3/ (man -l $man3/rdmamig.h.3)"
