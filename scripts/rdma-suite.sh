#!/usr/bin/env bash
# rdma-suite.sh -- the RDMA tests, as CI runs them: build on the host, then run
# everything in ONE scripts/rxe-vm.sh guest (Soft-RoCE rxe0 at 198.18.0.1):
#
#   1. ibv_devices             must list rxe0
#   2. rust:rdma               the Rust integration tests (test target `rdma`,
#                              tests/rdma/main.rs, feature rdma-tests), built
#                              with cargo test --release, run --test-threads=1
#   2a. rust:rdma-qemu-VERSION the QEMU interop tests of 2. (qemu::, replay::)
#                              again, against each QEMU peer that rxe-vm.sh
#                              --install-only unpacked (QEMU 10.0 from
#                              bookworm-backports: $RXE_VM_CACHE/qemu-10.0),
#                              named by RDMAMIG_QEMU; 2. had the host's
#                              (Debian 12: 7.2)
#   3. c:rdma_test_*           each executable target/c-tests/rdma_test_*
#                              (built by the Makefile beforehand; none: skipped)
#   3a. c:minimal              the minimal example pair (examples/c/minimal/,
#                              target/c-tests/minimal_*): the destination in
#                              the background, the source against it over
#                              rxe0's address; PASS when both exit 0 and
#                              print OK
#   4. bench:smoke             the migration benchmark (examples/bench.rs,
#                              built here with cargo build --release
#                              --features rdma-tests --example bench) with
#                              --quick: anchors, QEMU -> QEMU dynamic (32 MiB
#                              dense, 64 MiB sparse), rdmamig in every mode,
#                              all byte-identical;
#                              PASS when it exits 0 (no figure is checked)
#   4a. bench:postcopy-smoke   the post-copy benchmark (examples/postcopy_bench.rs)
#                              with --quick --no-anchors: fault and pull runs of
#                              64 MiB, each byte-identical; PASS when it exits 0
#   4b. bench:registration-smoke  the registration benchmark
#                              (examples/registration_bench.rs) with --quick:
#                              pin-all and a bare ibv_reg_mr loop over 64 MiB;
#                              PASS when it exits 0 (no figure is checked)
#   4c. soak:50                the soak (examples/soak.rs, built here like the
#                              benchmark) with --runs 50: 50 migrations through
#                              one listener, every tenth with a killed or
#                              aborted peer, each completed one byte-identical;
#                              fds, threads, VmRSS, VmPin, heap and RDMA objects
#                              flat from run 10 on (15-30 s in the guest;
#                              scripts/soak.sh runs 1,000)
#   4d. example:vm_memory      the Rust integration example examples/vm_memory.rs
#                              (built here like the benchmark; the C examples,
#                              examples/c/*.c, are c:rdma_test_example_* in 3.)
#   5. cli:doctor, cli:bench   the rdmamig CLI's tests (cli/tests/, feature
#                              rdma-tests): doctor against ibv_devinfo -v and
#                              ulimit -l, bench between two processes (--json)
#   6. c-valgrind:rdma_test_*  the same programs without sanitizers
#                              (target/c-tests-valgrind/, also `make c-tests`)
#                              under valgrind memcheck, small sizes (memcheck
#                              under TCG is slow); FAIL on any memcheck error
#                              or definite leak, in any process (the demo
#                              forks); suppressions: capi/c-tests/valgrind.supp;
#                              c-valgrind:minimal, the pair of 3a. so
#
# then, after that guest, one rxe-vm.sh --pair boot (two guests on a virtual
# wire) per two-guest test: the #[ignore]d `MODULE::pair_*` tests of the same
# binary (tests/rdma/liveness.rs: a guest takes its link down; tos.rs: the
# ToS byte of captured packets), run in both guests, each step PASS when both
# guests pass:
#
#   7. rust:MODULE-pair:NAME       NAME without "MODULE::pair_"; one boot each
#                                  because a connection that failed on a downed
#                                  link keeps the next one between the same two
#                                  guests from connecting (rxe, ~20 s per boot)
#
#   scripts/rdma-suite.sh [ARGS...]   ARGS go to the Rust test binary
#                                     (a test name filter, --nocapture, ...);
#                                     pair tests run when they match the filter
#
# Prints "rdma-suite: PASS <step>" or "rdma-suite: FAIL <step> (...)" for each
# step (in the guest followed by its time, "[N s]") and, last, "rdma-suite: N
# passed, M failed".  Exit status: 0 if all passed, 1 if something failed, 125
# if the guest itself failed (rxe-vm.sh: setup, RXE_VM_TIMEOUT); steps that
# did not run count as failed.
# Run as root.  Environment: RDMA_SUITE_STEP_TIMEOUT (seconds per step,
# default 1200: the Rust tests are one step); RXE_VM_* (see scripts/rxe-vm.sh); RXE_VM_MEM defaults to 4G
# for the main guest here (tests/rdma/pin_all.rs needs 2 GiB of test RAM).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 125
VM=$PWD/scripts/rxe-vm.sh
export RDMA_SUITE_STEP_TIMEOUT=${RDMA_SUITE_STEP_TIMEOUT:-1200}
# Private directory, shared read-write with the guest: its step list and
# results.
RDMA_SUITE_DIR=$(mktemp -d /tmp/rdma-suite.XXXXXX) || exit 125
export RDMA_SUITE_DIR
trap 'rm -rf "$RDMA_SUITE_DIR"' EXIT

STEPS=()            # every step's name (no spaces), in order
declare -A RESULT   # step name -> "PASS" or "FAIL (why)"
add_step() {   # add_step NAME COMMAND...: a step for the guest
    STEPS+=("$1")
    printf '%q ' step "$@" >> "$RDMA_SUITE_DIR/steps"
    echo >> "$RDMA_SUITE_DIR/steps"
}
pair_step() {  # pair_step MODULE::pair_NAME: its step name, rust:MODULE-pair:NAME
    echo "rust:${1%%::*}-pair:${1#*::pair_}"
}
host_fail() {  # host_fail NAME WHY
    STEPS+=("$1")
    RESULT[$1]="FAIL ($2)"
    echo "rdma-suite: FAIL $1 ($2)"
}

# Host packages (rdma-core libraries and headers, qemu, jq, ...) and kernel.
"$VM" --install-only || exit 125

add_step ibv_devices bash -c 'ibv_devices | awk "{ print } \$1 == \"rxe0\" { found = 1 } END { exit !found }"'

json=$RDMA_SUITE_DIR/cargo.json
# built KIND NAME CARGO_ARGS...: runs `cargo CARGO_ARGS --message-format=json`
# and prints the executable it built for target NAME of KIND (test, example),
# or nothing; a failed build prints cargo's errors on stderr and fails.
built() {
    local kind=$1 name=$2; shift 2
    echo "rdma-suite: building $name (cargo $*)" >&2
    if ! cargo "$@" --message-format=json > "$json" 2> "$RDMA_SUITE_DIR/cargo.err"; then
        jq -r 'select(.reason == "compiler-message" and .message.level == "error") | .message.rendered' "$json" >&2
        cat "$RDMA_SUITE_DIR/cargo.err" >&2
        return 1
    fi
    jq -r --arg kind "$kind" --arg name "$name" \
        'select(.reason == "compiler-artifact" and .target.name == $name
                and (.target.kind | index($kind)) and .executable != null) | .executable' "$json" | tail -1
}

if bin=$(built test rdma test --release --features rdma-tests --test rdma --no-run); then
    if [ -n "$bin" ]; then
        add_step rust:rdma "$bin" --test-threads=1 "$@"
        # The two-guest tests ARGS select (libtest lists what a filter matches).
        pair_tests=$("$bin" --list --ignored --format terse "$@" 2>/dev/null |
                     sed -n 's/^\([a-z0-9_]*::pair_[A-Za-z0-9_]*\): test$/\1/p')
        for t in $pair_tests; do STEPS+=("$(pair_step "$t")"); done
        # The QEMU interop tests that ARGS select, by name (libtest ORs
        # filters: ARGS' own match nothing more with --exact).
        qemu_tests=$("$bin" --list --format terse "$@" 2>/dev/null |
                     sed -n 's/^\(\(qemu\|replay\)::[A-Za-z0-9_]*\): test$/\1/p')
        for qemu in "${RXE_VM_CACHE:-/var/cache/rxe-vm}"/qemu-*/bin/qemu-system-x86_64; do
            [ -x "$qemu" ] && [ -n "$qemu_tests" ] || continue
            peer=${qemu%/bin/*}
            add_step "rust:rdma-${peer##*/}" env RDMAMIG_QEMU="$qemu" "$bin" --test-threads=1 --exact $qemu_tests "$@"
        done
    else
        host_fail rust:rdma "cargo built no test executable for target rdma"
    fi
elif grep -q "no test target named .rdma" "$RDMA_SUITE_DIR/cargo.err"; then
    host_fail rust:rdma "Cargo.toml has no test target rdma (tests/rdma/main.rs, required-features = [\"rdma-tests\"])"
else
    host_fail rust:rdma "cargo build failed, see above"
fi

# QEMU 10.2 built from Debian's source, stock and on librdmamig
# (integrations/qemu/: build.sh builds once per machine, then its cache
# answers): QEMU's own migration-test RDMA cases for each pair of source and
# destination (about a minute each), a running Linux guest migrated on
# through stock and patched QEMUs (guest-test.py), and the QEMU interop tests
# above with stock 10.2 as the peer.  Not when ARGS select tests.
if [ $# = 0 ]; then
    if qemu_dir=$(integrations/qemu/build.sh); then
        for pair in patched patched-to-stock stock-to-patched guest; do
            add_step "qemu-10.2:$pair" env RDMAMIG_LIBDIR="$PWD/target/lib" \
                "$PWD/integrations/qemu/test.sh" --in-guest "$qemu_dir" "$pair"
        done
        if [ -n "${bin:-}" ] && [ -n "${qemu_tests:-}" ]; then
            add_step rust:rdma-qemu-10.2 env RDMAMIG_QEMU="$qemu_dir/stock/qemu-system-x86_64" \
                "$bin" --test-threads=1 --exact $qemu_tests
        fi
    else
        host_fail qemu-10.2 "integrations/qemu/build.sh failed, see above"
    fi
fi

c_tests=0
for t in target/c-tests/rdma_test_*; do
    [ -f "$t" ] && [ -x "$t" ] || continue
    add_step "c:${t##*/}" "$PWD/$t"
    c_tests=$((c_tests + 1))
done
[ $c_tests != 0 ] || echo "rdma-suite: no C RDMA tests (target/c-tests/rdma_test_*): skipped"

# minimal_pair_step NAME DIR [WRAPPER...]: a step that runs the minimal
# example pair built in DIR (examples/c/minimal/, `make c-tests`), each
# program under WRAPPER: the destination in the background on rxe0's address,
# then the source, which retries until the destination listens; PASS when
# both exit 0 and print OK (a failed source stops the destination's accept).
minimal_pair_step() {
    local name=$1 dir=$2 role
    shift 2
    for role in destination source; do
        if ! [ -f "$dir/minimal_$role" ] || ! [ -x "$dir/minimal_$role" ]; then
            host_fail "$name" "$dir/minimal_$role is not built (make c-tests)"
            return
        fi
    done
    add_step "$name" bash -c '
        dir=$1 out=$(mktemp -d) port=4455
        shift
        "$@" "$dir/minimal_destination" "$RXE_VM_IP" $port > "$out/destination" & dst=$!
        "$@" "$dir/minimal_source" "$RXE_VM_IP" $port > "$out/source"
        src_rc=$?
        [ $src_rc = 0 ] || kill $dst
        wait $dst
        dst_rc=$?
        echo "minimal: destination exited $dst_rc printing \"$(cat "$out/destination")\"," \
             "source exited $src_rc printing \"$(cat "$out/source")\""
        [ $dst_rc = 0 ] && [ $src_rc = 0 ] && [ "$(cat "$out/destination")" = OK ] && [ "$(cat "$out/source")" = OK ]
    ' minimal "$PWD/$dir" "$@"
}
minimal_pair_step c:minimal target/c-tests

# The benchmark's smoke run: its measurements at tiny sizes (35-60 s in the
# guest); its table goes to the log, only its exit status counts.
if exe=$(built example bench build --release --features rdma-tests --example bench) && [ -n "$exe" ]; then
    add_step bench:smoke "$exe" --quick
else
    host_fail bench:smoke "no executable for example bench, see above"
fi

# The post-copy benchmark's smoke run: 64 MiB runs, no perftest anchors
# (~10 s in the guest); every run must come out byte-identical.
if exe=$(built example postcopy_bench build --release --features rdma-tests --example postcopy_bench) &&
        [ -n "$exe" ]; then
    add_step bench:postcopy-smoke "$exe" --quick --no-anchors
else
    host_fail bench:postcopy-smoke "no executable for example postcopy_bench, see above"
fi

# The registration benchmark's smoke run: pin-all and the bare ibv_reg_mr
# loop over 64 MiB (a few seconds in the guest); only its exit status counts.
if exe=$(built example registration_bench build --release --features rdma-tests --example registration_bench) &&
        [ -n "$exe" ]; then
    add_step bench:registration-smoke "$exe" --quick
else
    host_fail bench:registration-smoke "no executable for example registration_bench, see above"
fi

# The soak's short run: 50 migrations through one listener, every tenth with
# a killed or aborted peer (15-30 s in the guest); PASS when every completed one
# came out byte-identical and every figure stayed flat (scripts/soak.sh: 1,000).
if exe=$(built example soak build --release --features rdma-tests --example soak) && [ -n "$exe" ]; then
    add_step soak:50 "$exe" --runs 50
else
    host_fail soak:50 "no executable for example soak, see above"
fi

# The command-line tool (cli/): `rdmamig doctor` against ibv_devinfo and
# `ulimit -l` in the guest (rxe0 must be found, rdma_cm must work), and
# `rdmamig bench` between two processes in every mode, checked through --json
# (~1 min in the guest).
for t in doctor bench; do
    if exe=$(built test "$t" test --release -p rdmamig-cli --features rdma-tests --test "$t" --no-run) &&
            [ -n "$exe" ]; then
        add_step "cli:$t" env RDMAMIG_EXPECT_DEVICE=rxe0 "$exe" --test-threads=1 --nocapture
    else
        host_fail "cli:$t" "no test executable $t of rdmamig-cli, see above"
    fi
done

# The Rust integration examples (docs/integration/): built here, run in the
# guest; each exits non-zero unless its migration came out byte-identical.
for ex in vm_memory; do
    if exe=$(built example "$ex" build --release --features rdma-tests --example "$ex") && [ -n "$exe" ]; then
        add_step "example:$ex" "$exe"
    else
        host_fail "example:$ex" "no executable for example $ex, see above"
    fi
done

# The same programs under valgrind memcheck.  Definite leaks count as errors;
# possible ones (librdmacm keeps its device list for the process's life) do
# not.  Forked children (the demo's source and destination) are checked too:
# a child's exit status 99 fails its parent, and so the step.
VALGRIND=(valgrind --tool=memcheck --error-exitcode=99 --leak-check=full
          --errors-for-leak-kinds=definite --show-leak-kinds=definite
          --track-fds=no --num-callers=30 --suppressions="$PWD/capi/c-tests/valgrind.supp")
# The runs of each program under valgrind, one argument list per element.
# The demo at its smallest RAM (48 MiB), both modes: 75-115 s in the guest
# (rdma_test_cancel: ~17 s).
valgrind_runs() {
    case $1 in
        rdma_test_demo) runs=("--mib 48" "--mib 48 --pin-all") ;;
        rdma_test_example_*) runs=("--mib 8") ;;
        # memcheck under TCG is slow: the never-waits bound only has to hold natively.
        rdma_test_poll_loop) runs=("--mib 16 --bound-ms 20000") ;;
        # valgrind has no userfaultfd (ENOSYS): the C API's checks and a pre-copy window only.
        rdma_test_postcopy | rdma_test_hypervisor_uffd) runs=("--mib 8 --no-postcopy") ;;
        # The abort's bound is for native speed; memcheck checks the teardown.
        rdma_test_abort_close) runs=("--bound-s 30") ;;
        *) runs=("") ;;
    esac
}
for t in target/c-tests/rdma_test_*; do
    [ -f "$t" ] && [ -x "$t" ] || continue
    name=${t##*/}
    vg=target/c-tests-valgrind/$name
    if ! command -v valgrind > /dev/null; then
        host_fail "c-valgrind:$name" "valgrind is not installed (apt-get install valgrind)"
        continue
    fi
    if ! [ -f "$vg" ] || ! [ -x "$vg" ]; then
        host_fail "c-valgrind:$name" "$vg is not built (make c-tests)"
        continue
    fi
    valgrind_runs "$name"
    cmd=
    for args in "${runs[@]}"; do
        cmd+="${cmd:+ && }$(printf '%q ' "${VALGRIND[@]}" "$PWD/$vg")$args"
    done
    add_step "c-valgrind:$name" bash -c "$cmd"
done
if command -v valgrind > /dev/null; then
    minimal_pair_step c-valgrind:minimal target/c-tests-valgrind "${VALGRIND[@]}"
else
    host_fail c-valgrind:minimal "valgrind is not installed (apt-get install valgrind)"
fi

# In the guest: run each step (with a timeout), one result line each.  The
# guest gets 4G unless RXE_VM_MEM says otherwise: pin_all:: migrates 1 GiB per
# side in two processes (the --pair boots below keep rxe-vm.sh's default).
RXE_VM_MEM=${RXE_VM_MEM:-4G} RXE_VM_SHARE="${RXE_VM_SHARE:-} $RDMA_SUITE_DIR" "$VM" '
step() {
    local name=$1 rc result t0=$SECONDS
    shift
    echo "rdma-suite: --- $name: $*"
    timeout -k 10 "$RDMA_SUITE_STEP_TIMEOUT" "$@"
    rc=$?
    case $rc in
        0) result="PASS $name" ;;
        124) result="FAIL $name (timed out after ${RDMA_SUITE_STEP_TIMEOUT}s)" ;;
        *) result="FAIL $name (exit status $rc)" ;;
    esac
    echo "rdma-suite: $result [$((SECONDS - t0)) s]"
    echo "$result" >> "$RDMA_SUITE_DIR/results"
}
. "$RDMA_SUITE_DIR/steps"
! grep -q "^FAIL" "$RDMA_SUITE_DIR/results"'
vm_rc=$?

# Two-guest tests: one --pair boot each, both guests run the same test (the
# test picks its role from RXE_VM_GUEST).  Results come from rxe-vm.sh's exit
# status (0 when both guests passed), not from files.
pair_rc=0
for t in ${pair_tests:-}; do
    name=$(pair_step "$t")
    cmd=$(printf '%q ' timeout -k 10 "$RDMA_SUITE_STEP_TIMEOUT" "$bin" --ignored --exact --nocapture "$t")
    echo "rdma-suite: --- $name: rxe-vm.sh --pair '$cmd' (both guests)"
    "$VM" --pair "$cmd" "$cmd"
    rc=$?
    case $rc in
        0) RESULT[$name]=PASS ;;
        124) RESULT[$name]="FAIL (timed out after ${RDMA_SUITE_STEP_TIMEOUT}s)" ;;
        125) RESULT[$name]="FAIL (the guests failed, rxe-vm.sh exited 125)"; pair_rc=125 ;;
        *) RESULT[$name]="FAIL (exit status $rc)" ;;
    esac
    if [ "${RESULT[$name]}" = PASS ]; then
        echo "rdma-suite: PASS $name"
    else
        echo "rdma-suite: FAIL $name ${RESULT[$name]#FAIL }"
    fi
done

# Summary.  The guest's results file has "PASS name" or "FAIL name (why)"
# lines; a step without one did not run.
if [ -f "$RDMA_SUITE_DIR/results" ]; then
    while read -r status name why; do
        RESULT[$name]=${RESULT[$name]:-$status${why:+ $why}}
    done < "$RDMA_SUITE_DIR/results"
fi
passed=0 failed=()
for name in "${STEPS[@]}"; do
    if [ -z "${RESULT[$name]:-}" ]; then
        RESULT[$name]="FAIL (no result: the guest failed, rxe-vm.sh exited $vm_rc)"
        echo "rdma-suite: FAIL $name ${RESULT[$name]#FAIL }"
    fi
    if [ "${RESULT[$name]}" = PASS ]; then
        passed=$((passed + 1))
    else
        failed+=("$name ${RESULT[$name]#FAIL }")
    fi
done
[ ${#failed[@]} = 0 ] || printf 'rdma-suite: failed: %s\n' "${failed[@]}"
echo "rdma-suite: $passed passed, ${#failed[@]} failed"
if [ ${#failed[@]} = 0 ] && [ $vm_rc = 0 ]; then exit 0; fi
[ $vm_rc = 125 ] || [ $pair_rc = 125 ] && exit 125
exit 1
