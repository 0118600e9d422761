#!/usr/bin/env bash
# Builds the Debian packages librdmamig0, librdmamig-dev and rdmamig (debian/)
# with `dpkg-buildpackage -b -us -uc`, moves what it wrote into .. (the .debs,
# the -dbgsym .debs, .buildinfo, .changes) to target/deb/, and cleans debian/.
# Reuses target/: after `cargo build --release` only the packaging is left.
#
#   bash scripts/deb.sh [--check] [--lintian]
#
#   --check    then install the packages (dpkg -i; root or sudo), check what
#              they installed, build a cc consumer and meson-example/ against
#              the installed librdmamig-dev through pkg-config
#              (scripts/check-install.sh --installed), check that the symbols
#              file gives such a consumer its dependency, and purge them again
#              (packages that were installed before are left installed)
#   --lintian  then run lintian on them (installed if missing: 142 packages on
#              Debian 12; not in CI)
#
# Installs what it needs if missing (scripts/prerequisites.sh deb: debhelper,
# dpkg-dev, build-essential).
set -euo pipefail
cd "$(dirname "$0")/.."

check=0 lint=0
for a in "$@"; do
    case $a in
        --check) check=1 ;;
        --lintian) lint=1 ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
    esac
done

as_root() {
    if (( EUID == 0 )); then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else echo "deb: need root (or sudo) to run: $*" >&2; return 1; fi
}

bash scripts/prerequisites.sh deb
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
deb_version=$(dpkg-parsechangelog -S Version)
if [[ "$deb_version" != "$version" ]]; then
    echo "deb: debian/changelog says $deb_version, Cargo.toml $version: add a changelog entry," \
         "e.g. dch -v $version 'New upstream release.' (native package: no Debian revision)" >&2
    exit 1
fi
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
out=${CARGO_TARGET_DIR:-target}/deb
packages=(librdmamig0 librdmamig-dev rdmamig)

rm -rf "$out"
mkdir -p "$out"
dpkg-buildpackage -b -us -uc
changes=../rdmamig_${version}_${arch}.changes
# The .changes names every file the build wrote into .. (Files: section).
mapfile -t files < <(awk '/^Files:/ { f = 1; next } /^[^ ]/ { f = 0 } f && NF == 5 { print $5 }' "$changes")
for f in "${files[@]}"; do mv -f "../$f" "$out/"; done
mv -f "$changes" "$out/"
debian/rules clean >/dev/null
echo "deb: in $out:"
ls -l "$out"

if (( lint )); then
    bash scripts/prerequisites.sh lintian
    # --fail-on: warnings too (the info-level tags are listed, not fatal).
    lintian --fail-on error,warning --info "$out/rdmamig_${version}_${arch}.changes"
    echo "deb: lintian: no errors, no warnings"
fi

if (( check )); then
    tmp=$(mktemp -d)
    purge=0
    cleanup() {
        rm -rf "$tmp"
        if (( purge )); then as_root dpkg -P "${packages[@]}" >/dev/null && echo "deb: purged ${packages[*]}"; fi
    }
    trap cleanup EXIT
    preinstalled=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' && preinstalled+=("$p")
    done
    if (( ${#preinstalled[@]} == 0 )); then
        purge=1
    else
        echo "deb: ${preinstalled[*]} installed before this check: they stay installed (this version)"
    fi
    as_root dpkg -i "$out/librdmamig0_${version}_${arch}.deb" "$out/librdmamig-dev_${version}_${arch}.deb" \
        "$out/rdmamig_${version}_${arch}.deb"

    fail=0
    lib=/usr/lib/$multiarch
    for f in "$lib/librdmamig.so.$version" "$lib/librdmamig.so.${version%%.*}" "$lib/librdmamig.so" \
             "$lib/librdmamig.a" "$lib/pkgconfig/rdmamig.pc" /usr/include/rdmamig.h /usr/bin/rdmamig \
             /usr/share/man/man1/rdmamig.1.gz /usr/share/man/man1/rdmamig-doctor.1.gz \
             /usr/share/man/man1/rdmamig-bench.1.gz /usr/share/man/man1/rdmamig-fabric-plan.1.gz \
             /usr/share/man/man3/rdmamig.h.3.gz /usr/share/man/man3/rdmamig_connect.3.gz; do
        [[ -e "$f" ]] || { echo "deb: FAIL: $f is not installed" >&2; fail=1; }
    done
    # The ldconfig trigger ran: the loader finds the SONAME without help.
    /sbin/ldconfig -p | grep -F "librdmamig.so.${version%%.*} " ||
        { echo "deb: FAIL: librdmamig.so.${version%%.*} is not in the ld.so cache" >&2; fail=1; }
    (( fail )) && exit 1
    echo "rdmamig --version: $(rdmamig --version)"
    # man finds a function's page (a .so link to rdmamig.h(3)) without help.
    man rdmamig_connect 2>/dev/null | grep -q 'rdmamig_status rdmamig_connect' ||
        { echo "deb: FAIL: man rdmamig_connect does not show rdmamig.h(3)" >&2; exit 1; }

    bash scripts/check-install.sh --installed "$lib"

    # The installed symbols file: a consumer of a 0.6 function depends on librdmamig0 (>= 0.6.0).
    mkdir -p "$tmp/debian"
    printf 'Source: x\n\nPackage: x\nArchitecture: any\n' > "$tmp/debian/control"
    printf '#include <rdmamig.h>\nint main(void) { return rdmamig_ram_set_backing(0, 0, -1, 0) == RDMAMIG_OK; }\n' \
        > "$tmp/c.c"
    cc -std=c11 -o "$tmp/consumer" "$tmp/c.c" $(pkg-config --cflags --libs rdmamig)
    dep=$(cd "$tmp" && dpkg-shlibdeps -O consumer 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
    echo "deb: dpkg-shlibdeps for a consumer of rdmamig_ram_set_backing: $dep"
    grep -qF 'librdmamig0 (>= 0.6.0)' <<<"$dep" ||
        { echo "deb: FAIL: expected librdmamig0 (>= 0.6.0) from the symbols file" >&2; exit 1; }
    echo "deb: OK: built, installed, consumed through pkg-config and meson"
fi
