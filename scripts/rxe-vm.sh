#!/usr/bin/env bash
# rxe-vm.sh -- run a command as root in a throw-away QEMU guest that has a
# Soft-RoCE (rdma_rxe) device rxe0, and exit with the command's status.
#
#   scripts/rxe-vm.sh 'COMMAND'         run COMMAND (bash) in the guest, in $PWD
#   scripts/rxe-vm.sh --pair 'CMD1' 'CMD2'
#                                       two guests on a virtual Ethernet link:
#                                       198.18.0.1 runs CMD1, 198.18.0.2 CMD2
#   scripts/rxe-vm.sh --selftest        rping + ib_write_bw on rxe0
#   scripts/rxe-vm.sh --pair-selftest   the same from guest 2 to guest 1
#   scripts/rxe-vm.sh --install-only    install packages + kernel + the QEMU
#                                       peers, no guest
#
# Needs root (apt-get, qemu).  The guest boots Debian's stock kernel (fetched
# with `apt-get download` into a cache, not installed) under TCG, with the
# host's root filesystem as its root (9p, read-only, under a tmpfs overlay:
# writes are thrown away; /tmp, /run and /dev/shm start empty) and the
# current directory shared read-write at the same path.  So host-built
# binaries run in the guest unchanged.
#
# The QEMU peers: QEMU versions besides the host's (Debian 12's 7.2) for the
# interop tests (tests/rdma/qemu.rs, replay.rs; scripts/rdma-suite.sh runs
# them against each): QEMU 10.0 from bookworm-backports, its packages fetched
# through a private apt source list (the host's apt sources and packages stay
# as they are) and unpacked into $RXE_VM_CACHE/qemu-10.0, where
# bin/qemu-system-x86_64 runs it with its own firmware and modules.  Fetched
# once, by --install-only: remove the directory to fetch it again.
#
# Single guest: rxe0 on a dummy interface at 198.18.0.1/24 (rxe loops the
# traffic back internally: no packet ever reaches a wire).  --pair: each guest
# has rxe0 on a virtio NIC (198.18.0.1 and .2/24, MTU 9000) and the two NICs
# are joined back to back over two unix datagram sockets in a private
# directory: no IP socket on the host, so nothing can leave it.
#
# In the guest: the host's environment plus RXE_VM_IP, RXE_VM_DEV=rxe0,
# RXE_VM_IF; with --pair also RXE_VM_PEER_IP, RXE_VM_GUEST (1 or 2) and
# `rxe-vm-barrier NAME [TIMEOUT_S]` on PATH (returns once both guests called
# it with NAME).  `ulimit -l unlimited` is set.  The command's stdout+stderr
# goes to our stdout ("[g1] "/"[g2] " prefixes with --pair), [rxe-vm] lines
# to stderr.
#
# Exit status: the command's (--pair: 0 if both exit 0, else the status of
# the first guest that failed; the other is killed RXE_VM_PAIR_GRACE seconds
# later).  125: rxe-vm itself failed (setup, qemu, RXE_VM_TIMEOUT, a signal);
# the guest's console log is printed to stderr.
#
# Guest side: scripts/rxe-vm/ (init: the initramfs's /init; guest.sh: rxe0
# setup, then the command; barrier; selftest.sh).  Tests of this harness:
# scripts/rxe-vm/test.sh.
#
# Environment (all optional):
#   RXE_VM_MEM      guest RAM (default 2G)
#   RXE_VM_PREALLOC=1  the host allocates the guest's RAM at boot
#                   (-mem-prealloc): under TCG a guest page's first touch
#                   otherwise costs a host page fault, which lands on
#                   whichever run first gets that page (benchmarks set it)
#   RXE_VM_SMP      vCPUs per guest (default: host cores; 1 with --pair)
#   RXE_VM_TIMEOUT  seconds until a guest is killed (default 3000)
#   RXE_VM_PAIR_GRACE  seconds a guest may go on after the other failed (30)
#   RXE_VM_SHARE    more host directories to share read-write (space-separated)
#   RXE_VM_CPU      QEMU CPU model (default Nehalem: no AVX, ~2x faster
#                   under TCG than -cpu max)
#   RXE_VM_APPEND   extra guest kernel command-line arguments
#   RXE_VM_CACHE    kernel, initramfs and QEMU peer cache (default /var/cache/rxe-vm)
#   RXE_VM_NO_INSTALL=1  never call apt-get: fail if something is missing
#   RXE_VM_QUIET=1  no [rxe-vm] progress lines
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/rxe-vm
CACHE=${RXE_VM_CACHE:-/var/cache/rxe-vm}
MEM=${RXE_VM_MEM:-2G}
SMP=${RXE_VM_SMP:-}
TIMEOUT=${RXE_VM_TIMEOUT:-3000}
GRACE=${RXE_VM_PAIR_GRACE:-30}
NO_INSTALL=${RXE_VM_NO_INSTALL:-0}
QUIET=${RXE_VM_QUIET:-0}
PREALLOC=()
if [ "${RXE_VM_PREALLOC:-0}" = 1 ]; then PREALLOC=(-mem-prealloc); fi

# Host packages.  Not rdma-core: it pulls in udev and systemd and isn't needed
# (`rdma` comes from iproute2, the rxe provider from ibverbs-providers).
# jq is for scripts/rdma-suite.sh, tcpdump for looking at --pair traffic.
PKGS=(qemu-system-x86 busybox-static kmod cpio iproute2 procps xz-utils
      libibverbs1 librdmacm1 ibverbs-providers ibverbs-utils rdmacm-utils perftest
      libibverbs-dev librdmacm-dev tcpdump jq)
# The QEMU peer: a version series, the suite it comes from, and its packages
# (seabios too: 10.0 needs 1.16.3, Debian 12 has 1.16.2).  Its libraries are
# Debian 12's, which the host's QEMU (PKGS) installs.
QEMU_PEER_SERIES=10.0
QEMU_PEER_SUITE=bookworm-backports
QEMU_PEER_PKGS=(qemu-system-x86 qemu-system-common qemu-system-data seabios)
# Modules the initramfs needs to mount its root; the rest are modprobe'd in
# the guest from the kernel package's module tree.
BOOT_MODS=(virtio_pci 9pnet_virtio 9p overlay virtio_net)

log() { [ "$QUIET" = 1 ] || echo "[rxe-vm] $*" >&2; }
die() { echo "[rxe-vm] ERROR: $*" >&2; exit 125; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
T0=$(now)

APT_UPDATED=0
apt_update_once() {
    [ "$APT_UPDATED" = 1 ] && return
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 || die "apt-get update failed"
    APT_UPDATED=1
}

install_pkgs() {
    local installed missing=() p
    # (dpkg-query exits 1 when it has never heard of a package: not an error)
    installed=$({ dpkg-query -W -f='${Package} ${Status}\n' "${PKGS[@]}" 2>/dev/null || true; } |
                awk '/ install ok installed$/ { print $1 }')
    for p in "${PKGS[@]}"; do
        grep -qx "$p" <<<"$installed" || missing+=("$p")
    done
    [ ${#missing[@]} = 0 ] && return
    [ "$NO_INSTALL" = 1 ] && die "missing packages: ${missing[*]}"
    log "installing: ${missing[*]}"
    apt_update_once
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "${missing[@]}" >&2 || die "apt-get install failed"
}

# The kernel -> KDIR, KVER, KERNEL (the uncompressed vmlinux when possible):
# Debian's linux-image-<abi>-amd64 that linux-image-amd64 points to, unpacked
# into $CACHE/kernel/<pkg>.  Guest runs use the newest kernel already there
# (asking apt costs ~0.7 s); --install-only ($1 = 1) looks for a newer one.
fetch_kernel() {
    local pkg dir tmp off
    resolve() {
        apt-cache depends --no-recommends linux-image-amd64 2>/dev/null |
            awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
    }
    pkg=$(cd "$CACHE/kernel" 2>/dev/null && ls -d -- */.done | sort -V | tail -1) || true
    pkg=${pkg%/.done}
    if [ -z "$pkg" ] || [ "$1" = 1 ]; then
        pkg=$(resolve)
        if [ -z "$pkg" ] && [ "$NO_INSTALL" != 1 ]; then apt_update_once; pkg=$(resolve); fi
        [ -n "$pkg" ] || die "cannot determine the kernel package (linux-image-amd64)"
    fi
    dir=$CACHE/kernel/$pkg
    if [ ! -f "$dir/.done" ]; then
        [ "$NO_INSTALL" = 1 ] && die "kernel $pkg is not in $dir"
        log "downloading + unpacking $pkg into $dir"
        apt_update_once
        tmp=$(mktemp -d)
        # (as root: apt's _apt user could not write to $tmp)
        (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >&2) ||
            { rm -rf "$tmp"; die "apt-get download $pkg failed"; }
        rm -rf "$dir"
        mkdir -p "$dir"
        dpkg-deb -x "$tmp"/*.deb "$dir"
        rm -rf "$tmp"
        depmod -b "$dir" "$(ls "$dir/lib/modules" | head -1)"
        touch "$dir/.done"
    fi
    KDIR=$dir
    KVER=$(ls "$KDIR/lib/modules" | head -1)
    KERNEL=$KDIR/boot/vmlinuz-$KVER
    [ -f "$KERNEL" ] || die "no kernel image at $KERNEL"
    # Decompressing the bzImage costs ~4.5 s per boot under TCG.  Debian's
    # kernel has CONFIG_PVH=y, so QEMU can boot the ELF vmlinux in it
    # directly: unpack that once.
    grep -q '^CONFIG_PVH=y' "$KDIR/boot/config-$KVER" || return 0
    if [ ! -s "$KDIR/vmlinux" ]; then
        off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$KERNEL" | head -1 | cut -d: -f1)
        [ -n "$off" ] || return 0
        tail -c +$((off + 1)) "$KERNEL" | xz -dc > "$KDIR/vmlinux.tmp" 2>/dev/null || true
        if [ "$(head -c 4 "$KDIR/vmlinux.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
            mv "$KDIR/vmlinux.tmp" "$KDIR/vmlinux"
        else
            rm -f "$KDIR/vmlinux.tmp"
            return 0
        fi
    fi
    KERNEL=$KDIR/vmlinux
}

# The QEMU peer -> $CACHE/qemu-$QEMU_PEER_SERIES, with bin/qemu-system-x86_64
# in it (see the header); nothing to do once it is there.
fetch_qemu_peer() {
    local dir=$CACHE/qemu-$QEMU_PEER_SERIES apt=$CACHE/apt-$QEMU_PEER_SUITE tmp version missing deb
    [ -f "$dir/.done" ] && return
    [ "$NO_INSTALL" = 1 ] && die "QEMU $QEMU_PEER_SERIES is not in $dir"
    log "downloading + unpacking QEMU $QEMU_PEER_SERIES ($QEMU_PEER_SUITE) into $dir"
    # Its own lists and package cache: apt's own (pkgcache.bin) must not
    # change with them.  As root: apt's _apt user could not write to $tmp.
    local opts=(-o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o APT::Sandbox::User=root)
    mkdir -p "$apt/lists/partial" "$apt/cache"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian" \
         "$QEMU_PEER_SUITE main" > "$apt/sources.list"
    apt-get "${opts[@]}" update -qq >&2 || die "apt-get update ($QEMU_PEER_SUITE) failed"
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get "${opts[@]}" download -qq "${QEMU_PEER_PKGS[@]/%//$QEMU_PEER_SUITE}" >&2) ||
        { rm -rf "$tmp"; die "apt-get download ${QEMU_PEER_PKGS[*]} ($QEMU_PEER_SUITE) failed"; }
    version=$(dpkg-deb -f "$tmp"/qemu-system-x86_*.deb Version)
    [[ $version == *:$QEMU_PEER_SERIES.* ]] ||
        { rm -rf "$tmp"; die "$QEMU_PEER_SUITE has QEMU $version, not $QEMU_PEER_SERIES"; }
    rm -rf "$dir"
    mkdir -p "$dir/bin"
    for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$dir"; done
    rm -rf "$tmp"
    missing=$(ldd "$dir/usr/bin/qemu-system-x86_64" | awk '/not found/ { print $1 }')
    [ -z "$missing" ] || die "QEMU $version needs libraries the host lacks: $missing"
    # QEMU 10.0 finds its firmware at the path it was built for (7.2 looks
    # beside its binary) and its modules likewise: point it at its own.
    {
        echo '#!/bin/sh'
        echo "# QEMU $version ($QEMU_PEER_SUITE), unpacked by scripts/rxe-vm.sh."
        printf 'd=%q\n' "$dir"
        echo 'QEMU_MODULE_DIR=$d/usr/lib/x86_64-linux-gnu/qemu exec "$d/usr/bin/qemu-system-x86_64" \'
        echo '    -L "$d/usr/share/qemu" -L "$d/usr/share/seabios" "$@"'
    } > "$dir/bin/qemu-system-x86_64"
    chmod +x "$dir/bin/qemu-system-x86_64"
    echo "$version" > "$dir/.done"
}

# -> INITRD: busybox, the BOOT_MODS and rxe-vm/init; rebuilt when any changes.
build_initramfs() {
    local key work
    key=$(cat "$HERE/init" /bin/busybox <(echo "$KVER ${BOOT_MODS[*]}") | md5sum | cut -c1-12)
    INITRD=$CACHE/initramfs-$KVER-$key.cpio
    [ -f "$INITRD" ] && return
    log "building $INITRD"
    work=$(mktemp -d)
    mkdir -p "$work"/{bin,sbin,proc,sys,dev,mods,lower,upper,newroot}
    cp /bin/busybox "$work/bin/"
    cp "$HERE/init" "$work/init"
    for m in "${BOOT_MODS[@]}"; do
        modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
    done | awk '!seen[$0]++' | while read -r f; do
        cp "$f" "$work/mods/"
        basename "$f"
    done > "$work/modlist"
    # The kernel's module auto-loading runs /sbin/modprobe in PID 1's root,
    # i.e. the initramfs: forward it into the guest's real root.
    printf '#!/bin/busybox sh\nexec /bin/busybox chroot /newroot /sbin/modprobe "$@"\n' > "$work/sbin/modprobe"
    chmod +x "$work/init" "$work/sbin/modprobe"
    (cd "$work" && find . | cpio -o -H newc --quiet) > "$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$work"
}

# prepare_host INSTALL_ONLY(0|1)
prepare_host() {
    [ "$(id -u)" = 0 ] || die "must run as root"
    mkdir -p "$CACHE"
    # One preparation at a time (apt, kernel download, initramfs).
    exec 9> "$CACHE/.lock"
    flock 9
    install_pkgs
    fetch_kernel "$1"
    [ "$1" = 0 ] || fetch_qemu_peer
    build_initramfs
    exec 9>&-
    log "host ready in $(since "$T0") (kernel $KVER)"
}

# virtfs DIR TAG [,MORE_OPTIONS]: a -virtfs option sharing host directory DIR
# as 9p mount tag TAG.
virtfs() {
    echo "local,path=${1//,/,,},mount_tag=$2,security_model=none,multidevs=remap${3:-}"
}

# start_guest N COMMAND IP PEER_IP [QEMU_ARGS...]: write guest N's control
# files into $RUN/gN (read by rxe-vm/guest.sh in the guest), start its QEMU
# (pid in QPID[N]) and stream the command's output to stdout.
start_guest() {
    local n=$1 cmd=$2 ip=$3 peer=$4 g=$RUN/g$1 d i=0 qemu
    shift 4
    mkdir "$g"
    cp "$HERE/guest.sh" "$HERE/selftest.sh" "$g/"
    printf '%s\n' "$cmd" > "$g/cmd"
    : > "$g/out"
    printf 'RXE_VM_%s=%q\n' KVER "$KVER" CWD "$CWD" GUEST "$n" IP "$ip" PEER_IP "$peer" > "$g/vm.env"
    # The host's environment (same filesystem, so PATH etc. stay valid).
    (set -o posix; export -p) | grep -vE '^export (PWD|OLDPWD|SHLVL|_|TERM|HOSTNAME|TMPDIR)=' > "$g/env" || true
    qemu=(qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot
        -accel tcg,thread=multi -cpu "${RXE_VM_CPU:-Nehalem}" -smp "$SMP" -m "$MEM" -M pc
        "${PREALLOC[@]}"
        -kernel "$KERNEL" -initrd "$INITRD"
        -append "console=ttyS0 quiet loglevel=1 panic=-1 rdinit=/init tsc=reliable mitigations=off ${RXE_VM_APPEND:-}"
        -serial "file:$g/console.log"
        -virtfs "$(virtfs / hostroot ,readonly=on)"
        -virtfs "$(virtfs "$KDIR/lib/modules/$KVER" kmods ,readonly=on)"
        -virtfs "$(virtfs "$g" ctl)")
    : > "$g/shares"
    for d in "$CWD" ${RXE_VM_SHARE:-}; do
        d=$(cd "$d" && pwd -P) || die "cannot share $d"
        echo "$d" >> "$g/shares"
        qemu+=(-virtfs "$(virtfs "$d" "share$i")")
        i=$((i + 1))
    done
    timeout -k 10 "$TIMEOUT" "${qemu[@]}" "$@" < /dev/null &
    QPID[n]=$!
    if [ -z "$peer" ]; then
        tail -s 0.2 -c +1 -f --pid="${QPID[n]}" "$g/out" &
    else
        tail -s 0.2 -c +1 -f --pid="${QPID[n]}" "$g/out" | sed -u "s/^/[g$n] /" &
    fi
    TPID[n]=$!
}

# status N: guest N's exit status; 125 when it did not report one, with the
# reason and its console log on stderr.
status() {
    local n=$1 why=
    if [ -e "$RUN/g$n/killed" ]; then
        why="was killed ${GRACE}s after the other guest failed (RXE_VM_PAIR_GRACE)"
    elif [ "${STOPPED:-0}" = 1 ]; then
        why="was stopped: rxe-vm.sh got a signal"
    else
        case ${QRC[n]} in
            0) [ -s "$RUN/g$n/rc" ] || why="did not report an exit status" ;;
            124|137) why="timed out after ${TIMEOUT}s (RXE_VM_TIMEOUT)" ;;
            *) why="qemu exited with status ${QRC[n]}" ;;
        esac
    fi
    if [ -z "$why" ]; then
        cat "$RUN/g$n/rc"
        [ "$QUIET" = 1 ] || grep -a '^\[rxe-vm\]' "$RUN/g$n/console.log" >&2 || true
    else
        echo "[rxe-vm] ERROR: guest $n $why; its console log:" >&2
        cat "$RUN/g$n/console.log" >&2 || true
        echo 125
    fi
}

# run_guests CMD [CMD2]: one guest, or two (--pair).  Exits with the status
# of the first guest that failed, or 0.
run_guests() {
    local n pid st first=0 tboot deadline
    local -a QPID=() TPID=() QRC=() RC=()
    CWD=$(pwd -P)
    RUN=$(mktemp -d /tmp/rxe-vm.XXXXXX)
    trap 'rm -rf "$RUN"' EXIT
    trap 'STOPPED=1; kill -TERM ${QPID[*]} 2>/dev/null' INT TERM HUP
    log "booting $# guest(s): smp=$SMP mem=$MEM each"
    tboot=$(now)
    if [ $# = 1 ]; then
        start_guest 1 "$1" 198.18.0.1 ""
    else
        mkdir -p "$RUN/pair/bin" "$RUN/pair/b"
        cp "$HERE/barrier" "$RUN/pair/bin/rxe-vm-barrier"
        for n in 1 2; do
            start_guest $n "${!n}" 198.18.0.$n 198.18.0.$((3 - n)) \
                -virtfs "$(virtfs "$RUN/pair" pair)" \
                -netdev "dgram,id=n0,local.type=unix,local.path=$RUN/g$n.sock,remote.type=unix,remote.path=$RUN/g$((3 - n)).sock" \
                -device "virtio-net-pci,netdev=n0,mac=52:54:00:c6:12:0$n"
        done
    fi
    while [ ${#QPID[@]} -gt 0 ]; do
        if [ "$first" != 0 ]; then
            # A guest failed: the other one is probably waiting for it.
            deadline=$((SECONDS + GRACE))
            while kill -0 "${QPID[@]}" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
            for n in "${!QPID[@]}"; do
                if kill -0 "${QPID[n]}" 2>/dev/null; then
                    touch "$RUN/g$n/killed"
                    kill -TERM "${QPID[n]}"
                fi
            done
        fi
        pid=
        set +e
        wait -n -p pid "${QPID[@]}"
        st=$?
        set -e
        [ -n "${pid:-}" ] || continue   # interrupted by a signal
        for n in "${!QPID[@]}"; do [ "${QPID[n]}" = "$pid" ] && break; done
        unset "QPID[n]"
        QRC[n]=$st
        RC[n]=$(status "$n")
        [ "${RC[n]}" = 0 ] || [ "$first" != 0 ] || first=$n
    done
    wait "${TPID[@]}" || true
    st=0
    [ "$first" = 0 ] || st=${RC[first]}
    log "guest(s) finished in $(since "$tboot") (total $(since "$T0")), status ${RC[*]}, exit status $st"
    exit "$st"
}

main() {
    local cmds=()
    case ${1:-} in
        --install-only) prepare_host 1; exit 0 ;;
        --selftest) cmds=("bash /run/rxe-vm/selftest.sh") ;;
        --pair-selftest) cmds=("bash /run/rxe-vm/selftest.sh" "bash /run/rxe-vm/selftest.sh") ;;
        --pair) [ $# = 3 ] || { echo "usage: $0 --pair 'COMMAND_FOR_GUEST_1' 'COMMAND_FOR_GUEST_2'" >&2; exit 2; }
                cmds=("$2" "$3") ;;
        -*|'') sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
        *) cmds=("$*") ;;
    esac
    if [ -z "$SMP" ]; then
        if [ ${#cmds[@]} = 2 ]; then SMP=1; else SMP=$(nproc); fi
    fi
    prepare_host 0
    run_guests "${cmds[@]}"
}

main "$@"
