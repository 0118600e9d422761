#!/bin/bash
# rxe-vm.sh --selftest / --pair-selftest (runs in the guest): verbs and
# rdma_cm work end to end on rxe0: rping, then ib_write_bw with 64 KiB and
# 1 MiB messages.  Single guest: server and client both here.  --pair: the
# servers run in guest 1, the clients in guest 2 (across the virtual link).
set -euo pipefail
ibv_devinfo -d rxe0 | grep -E "hca_id|state|active_mtu|link_layer"
rdma link show

server=1 client=1 server_ip=$RXE_VM_IP
if [ -n "${RXE_VM_PEER_IP:-}" ]; then
    if [ "$RXE_VM_GUEST" = 1 ]; then client=0; else server=0 server_ip=$RXE_VM_PEER_IP; fi
fi

# run_pair NAME SERVER_CMD CLIENT_CMD: the server starts first (in the
# background), the client connects after it had a second to listen.
run_pair() {
    local pid
    if [ $server = 1 ]; then
        timeout 60 bash -c "$2" > "/tmp/$1-server.log" 2>&1 &
        pid=$!
        sleep 1
    fi
    if [ $server = 0 ] || [ $client = 0 ]; then rxe-vm-barrier "$1"; fi
    if [ $client = 1 ]; then
        timeout 60 bash -c "$3" > "/tmp/$1-client.log" 2>&1 ||
            { cat "/tmp/$1-client.log"; echo "$1 client FAILED"; return 1; }
    fi
    if [ $server = 1 ]; then
        wait $pid || { cat "/tmp/$1-server.log"; echo "$1 server FAILED"; return 1; }
    fi
}

echo "== rping (rdma_cm, RC send + RDMA read/write) to $server_ip"
run_pair rping "rping -s -a $RXE_VM_IP -C 5 -S 1024" "rping -c -a $server_ip -C 5 -S 1024 -v"
echo "rping: OK"
for size in 65536 1048576; do
    bw="ib_write_bw -R -F -d rxe0 -s $size -D 3 -t 16 --report_gbits"
    run_pair "bw$size" "$bw" "$bw $server_ip"
    if [ $client = 1 ]; then
        echo "ib_write_bw -R size=$size: $(awk '/#bytes/ {getline; print $4 " Gb/s avg, " $2 " iterations"}' "/tmp/bw$size-client.log")"
    fi
done
echo "selftest: OK"
