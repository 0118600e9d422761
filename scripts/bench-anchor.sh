#!/usr/bin/env bash
# bench-anchor.sh -- run a benchmark and an ib_write_bw "anchor" in the same
# scripts/rxe-vm.sh guest boot, so that their ratio is not skewed by how busy
# the host was (TCG throughput varies a lot from boot to boot).
#
#   scripts/bench-anchor.sh 'BENCH_COMMAND'
#
# In the guest: perftest's ib_write_bw -R -F -d rxe0 -s 1048576 -t 16 -D 5
# --report_gbits (server in the background, client to $RXE_VM_IP), printed as
# "anchor ib_write_bw: X Gb/s" (X = its average), then BENCH_COMMAND (bash,
# run in the current directory) with its output.  Exit status: BENCH_COMMAND's;
# 1 if it passed but the anchor failed; 125 if the guest failed.  Run as root;
# RXE_VM_* settings apply (see scripts/rxe-vm.sh).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,/^set -e/p' "$0" | sed '$d' >&2; exit 2; }
export BENCH_ANCHOR_COMMAND="$*"
exec "$(dirname "${BASH_SOURCE[0]}")/rxe-vm.sh" '
bw="ib_write_bw -R -F -d rxe0 -s 1048576 -t 16 -D 5 --report_gbits"
timeout 60 $bw > /tmp/anchor-server.log 2>&1 &
server=$!
sleep 1
timeout 60 $bw "$RXE_VM_IP" > /tmp/anchor-client.log 2>&1
client_rc=$?
wait $server
server_rc=$?
# The line after the "#bytes #iterations BW peak BW average MsgRate" header.
gbps=$(awk "/#bytes/ { getline; print \$4 }" /tmp/anchor-client.log)
if [ $client_rc = 0 ] && [ $server_rc = 0 ] && [ -n "$gbps" ]; then
    echo "anchor ib_write_bw: $gbps Gb/s"
    anchor=0
else
    echo "--- ib_write_bw server (exit status $server_rc):"; cat /tmp/anchor-server.log
    echo "--- ib_write_bw client (exit status $client_rc):"; cat /tmp/anchor-client.log
    echo "anchor ib_write_bw: FAILED"
    anchor=1
fi
bash -c "$BENCH_ANCHOR_COMMAND"
rc=$?
[ $rc != 0 ] || rc=$anchor
exit $rc'
