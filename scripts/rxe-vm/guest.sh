#!/bin/bash
# Runs inside an rxe-vm guest as root, chrooted into the overlay of the host's
# root filesystem, started by the initramfs's /init (see scripts/rxe-vm.sh).
# Sets up rxe0, then runs the command and leaves its exit status in
# /run/rxe-vm/rc.  Control files from the host, in /run/rxe-vm:
#   vm.env  RXE_VM_KVER RXE_VM_CWD RXE_VM_GUEST RXE_VM_IP RXE_VM_PEER_IP
#           (RXE_VM_PEER_IP is empty in single-guest mode)
#   shares  host directories to mount read-write at the same path, one a line
#           (9p mount tags share0, share1, ...)
#   env     the host's environment (export -p)
#   cmd     the command (a bash script)
#   out     written here: the command's stdout+stderr, streamed by the host
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ctl=/run/rxe-vm
NINEP=trans=virtio,version=9p2000.L,msize=524288
t_start=$(cut -d' ' -f1 /proc/uptime)
# Output goes to a file on the 9p control share, which the host streams with
# tail -f: far faster than the emulated UART (~230 KB/s under TCG).  Kernel
# messages stay on ttyS0 (the host's console.log).
exec </dev/null >>$ctl/out 2>&1
. $ctl/vm.env

fail() {
    echo "[rxe-vm] guest $RXE_VM_GUEST: $*"
    echo 125 > $ctl/rc
    exit 125
}
note() { echo "[rxe-vm] guest $RXE_VM_GUEST: $*" > /dev/ttyS0; }

hostname "rxe-vm$RXE_VM_GUEST"
ip link set lo up

# Modules come from the downloaded kernel package, not from the host.
mkdir -p "/lib/modules/$RXE_VM_KVER"
mount -t 9p -o "$NINEP,ro,cache=loose" kmods "/lib/modules/$RXE_VM_KVER" || fail "mount kmods"
i=0
while IFS= read -r dir; do
    mkdir -p "$dir"
    mount -t 9p -o "$NINEP,cache=mmap" "share$i" "$dir" || fail "mount share $dir"
    i=$((i + 1))
done < $ctl/shares

# rdma_rxe needs crc32 ("failed to init crc32 algorithm" otherwise).
modprobe -a crc32_generic rdma_rxe ib_uverbs rdma_ucm || fail "modprobe failed"
if [ -z "$RXE_VM_PEER_IP" ]; then
    # Single guest: rxe0 on a dummy interface (rxe loops packets back itself).
    ip link add rxenet0 type dummy || fail "cannot create the dummy interface"
    IF=rxenet0
else
    # --pair: rxe0 on the (only) virtio NIC, wired to the other guest.
    IF=$(basename "$(dirname /sys/class/net/*/device)")
    [ -e "/sys/class/net/$IF/device" ] || fail "no network card"
fi
ip addr add "$RXE_VM_IP/24" dev "$IF"
# IPv6 (documentation prefix, never routed) and a host name, for the tests
# that connect by IPv6 address or by name.
RXE_VM_IP6=2001:db8::${RXE_VM_IP##*.}
ip -6 addr add "$RXE_VM_IP6/64" dev "$IF" nodad
echo "$RXE_VM_IP rxe-vm" >> /etc/hosts
ip link set "$IF" mtu 9000
ip link set "$IF" up
rdma link add rxe0 type rxe netdev "$IF" || fail "rdma link add failed"
i=0
while [ ! -e /dev/infiniband/uverbs0 ] || [ ! -e /dev/infiniband/rdma_cm ]; do
    i=$((i + 1))
    [ $i -le 100 ] || fail "/dev/infiniband/{uverbs0,rdma_cm} did not appear"
    sleep 0.1
done
note "init at ${t_start}s, rxe0 on $IF ($RXE_VM_IP) ready at $(cut -d' ' -f1 /proc/uptime)s (guest uptime)"

if [ -n "$RXE_VM_PEER_IP" ]; then
    mkdir -p /run/rxe-vm-pair
    mount -t 9p -o "$NINEP,cache=none" pair /run/rxe-vm-pair || fail "mount pair"
    export RXE_VM_GUEST
    /run/rxe-vm-pair/bin/rxe-vm-barrier rxe-vm-ready 600 || fail "the other guest never got ready"
    i=0
    until busybox ping -c 1 -W 1 "$RXE_VM_PEER_IP" >/dev/null 2>&1; do
        i=$((i + 1))
        [ $i -lt 10 ] || fail "peer $RXE_VM_PEER_IP does not answer ping on $IF"
    done
    note "peer $RXE_VM_PEER_IP reachable at $(cut -d' ' -f1 /proc/uptime)s"
fi

# The command's environment: the host's, plus ours.
guest=$RXE_VM_GUEST ip=$RXE_VM_IP ip6=$RXE_VM_IP6 peer=$RXE_VM_PEER_IP cwd=$RXE_VM_CWD iface=$IF
. $ctl/env
export RXE_VM_IP=$ip RXE_VM_IP6=$ip6 RXE_VM_HOST=rxe-vm RXE_VM_DEV=rxe0 RXE_VM_IF=$iface HOME=/root TERM=dumb
if [ -n "$peer" ]; then
    export RXE_VM_PEER_IP=$peer RXE_VM_GUEST=$guest PATH="$PATH:/run/rxe-vm-pair/bin"
else
    unset RXE_VM_PEER_IP RXE_VM_GUEST
fi
ulimit -l unlimited
cd "$cwd" || fail "cd $cwd"
bash $ctl/cmd
rc=$?
echo $rc > $ctl/rc
sync
exit $rc
