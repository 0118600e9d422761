#!/usr/bin/env bash
# Tests of scripts/rxe-vm.sh itself (5 guest boots, ~1.5 min): exit status,
# output, environment, file sharing, the timeout, a signal, and --pair's
# failure handling.  Run as root: scripts/rxe-vm/test.sh
set -uo pipefail
VM=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)/rxe-vm.sh
work=$(mktemp -d /tmp/rxe-vm-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
failed=0
check() {  # check DESCRIPTION CONDITION...
    local what=$1
    shift
    if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failed=1; fi
}

echo "== single guest: status, output, environment, files"
echo host > from-host
export RXE_VM_TEST_VAR="a b'c"
"$VM" 'set -e
echo "out: $(cat from-host)"; echo "err" >&2
echo "var: $RXE_VM_TEST_VAR"; echo "ip: $RXE_VM_IP $RXE_VM_DEV"
ibv_devices | grep -q rxe0 && echo "rxe0: yes"
echo "tmp: $(ls -A /tmp /dev/shm | tr "\n" " ") limit: $(ulimit -l)"
echo guest > from-guest
echo x > /etc/rxe-vm-test-file
exit 7' > out 2> err
rc=$?
check "exit status 7 propagated (got $rc)" [ $rc = 7 ]
check "reads the shared cwd" grep -qx "out: host" out
check "stderr goes to stdout" grep -qx "err" out
check "host environment passed" grep -qxF "var: a b'c" out
check "RXE_VM_IP/DEV set" grep -qx "ip: 198.18.0.1 rxe0" out
check "rxe0 listed" grep -qx "rxe0: yes" out
check "fresh /tmp and /dev/shm, memlock unlimited" \
    grep -qxF "tmp: /dev/shm:  /tmp: ${work##*/}  limit: unlimited" out
check "writes the shared cwd" grep -qx guest from-guest
check "root fs writes are thrown away" [ ! -e /etc/rxe-vm-test-file ]

echo "== timeout: exit 125 with the console log"
RXE_VM_TIMEOUT=30 "$VM" 'sleep 600' > out 2> err
rc=$?
check "exit status 125 (got $rc)" [ $rc = 125 ]
check "says it timed out" grep -q "timed out after 30s" err
check "prints the console log" grep -q "guest 1: init at" err

echo "== SIGTERM to rxe-vm.sh: the guest is stopped, exit 125"
"$VM" 'echo started; sleep 600' > out 2> err &
pid=$!
for _ in $(seq 600); do grep -q started out && break; sleep 0.2; done
kill -TERM $pid
wait $pid
rc=$?
check "exit status 125 (got $rc)" [ $rc = 125 ]
check "says it got a signal" grep -q "got a signal" err

echo "== --pair: barrier, prefixes, exit status 0"
"$VM" --pair 'rxe-vm-barrier x; echo "I am $RXE_VM_GUEST, peer $RXE_VM_PEER_IP"' \
             'rxe-vm-barrier x; echo "I am $RXE_VM_GUEST, peer $RXE_VM_PEER_IP"' > out 2> err
rc=$?
check "exit status 0 (got $rc)" [ $rc = 0 ]
check "guest 1 output" grep -qx "\[g1\] I am 1, peer 198.18.0.2" out
check "guest 2 output" grep -qx "\[g2\] I am 2, peer 198.18.0.1" out

echo "== --pair: guest 2 fails, guest 1 waits forever and is killed"
RXE_VM_PAIR_GRACE=3 "$VM" --pair 'rxe-vm-barrier never' 'exit 3' > out 2> err
rc=$?
check "exit status 3 (got $rc)" [ $rc = 3 ]
check "guest 1 killed" grep -q "guest 1 was killed 3s after the other guest failed" err

[ $failed = 0 ] && echo "rxe-vm tests: OK" || echo "rxe-vm tests: FAILED"
exit $failed
