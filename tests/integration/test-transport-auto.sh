#!/bin/sh
# test-transport-auto.sh: what GCOLL_TRANSPORT=auto picks. UCX's shared memory when the
# launcher says every rank is on this host (gcoll-run's GCOLL_LOCAL_SIZE, torchrun's
# LOCAL_WORLD_SIZE, each against its world size) and UCX offers shared memory here; TCP
# for ranks started by hand, for a launcher that puts ranks on several hosts, for one rank,
# under UCX_TLS=tcp and with GCOLL_TRANSPORT=tcp. Each case runs gcoll-demo (an allreduce
# every rank checks) and reads the transport from its line. Then two UCX communicators in
# one process, the case a torch job with process groups makes.
. "$(dirname "$0")/lib.sh"

if ! "$top_builddir/tools/gcoll-info" -t | grep -q '^ucx *usable'; then
    echo "SKIP: ucx is not usable here: auto is tcp everywhere"
    exit 77
fi

# want CASE TRANSPORT OUTFILE [RANKS]: each of RANKS (2) ranks printed a verified line over
# TRANSPORT, and none another line of the demo
want() {
    n=$(grep -c "allreduce of .* over $2: verified (0 wrong)" "$3")
    all=$(grep -c "allreduce of " "$3")
    if [ "$n" -eq "${4:-2}" ] && [ "$all" -eq "$n" ]; then
        pass "$1: $2 ($n rank(s))"
    else
        fail "$1: want ${4:-2} rank(s) over $2, got: $(grep -h 'allreduce\|gcoll' "$3" | head -n 4)"
    fi
}

# by_hand OUT ENV...: 2 ranks started by hand (GCOLL_RANK/SIZE/ROOT) with ENV
by_hand() {
    out=$1
    shift
    port=$(free_port)
    : >"$out"
    for r in 0 1; do
        env "$@" GCOLL_RANK=$r GCOLL_SIZE=2 GCOLL_ROOT=127.0.0.1:$port GCOLL_JOB_KEY=auto$$ \
            timeout 60 "$DEMO" 4096 >>"$out" 2>&1 &
        BG_PIDS="$BG_PIDS $!"
    done
    wait
}

"$gcoll_run" -q -n 2 --timeout 60 -- "$DEMO" 4096 >"$TMP/run" 2>&1
want "gcoll-run -n 2" ucx "$TMP/run"

GCOLL_DEBUG=info "$gcoll_run" -q -n 2 --timeout 60 -- "$DEMO" 4096 >"$TMP/info" 2>&1
if grep -q "GCOLL_TRANSPORT=auto: ucx, every rank on this host (GCOLL_LOCAL_SIZE=2 of GCOLL_SIZE=2)" "$TMP/info"; then
    pass "the choice is logged with its reason"
else
    fail "no log line saying why auto took ucx: $(grep 'auto' "$TMP/info" | head -n 2)"
fi

"$gcoll_run" -q -n 2 --timeout 60 -x GCOLL_TRANSPORT=tcp -- "$DEMO" 4096 >"$TMP/tcp" 2>&1
want "gcoll-run -x GCOLL_TRANSPORT=tcp" tcp "$TMP/tcp"

"$gcoll_run" -q -n 2 --timeout 60 -x UCX_TLS=tcp -- "$DEMO" 4096 >"$TMP/tls" 2>&1
want "gcoll-run -x UCX_TLS=tcp (no shared memory in UCX)" tcp "$TMP/tls"

"$gcoll_run" -q -n 1 --timeout 60 -- "$DEMO" 4096 >"$TMP/one" 2>&1
want "gcoll-run -n 1" tcp "$TMP/one" 1

by_hand "$TMP/hand"
want "ranks started by hand" tcp "$TMP/hand"

by_hand "$TMP/torchrun" LOCAL_WORLD_SIZE=2 WORLD_SIZE=2
want "torchrun's LOCAL_WORLD_SIZE = WORLD_SIZE" ucx "$TMP/torchrun"

by_hand "$TMP/nodes" LOCAL_WORLD_SIZE=1 WORLD_SIZE=2
want "torchrun's LOCAL_WORLD_SIZE < WORLD_SIZE (two nodes)" tcp "$TMP/nodes"

# Two communicators in one process (a torch job's process groups), 4 ranks as torchrun
# starts them (ring depth 0: every chunk of a step in flight), 10 iterations of 16 MiB
# allreduces on each in turn: hung in 7 of 7 runs over UCX before a rank's operation
# waited for the answers it owed its peers (single-copy FINs that UCX had queued).
TWO="$top_builddir/tests/integration/two_comms"
for run in 1 2 3; do
    port=$(free_port)
    : >"$TMP/two"
    for r in 0 1 2 3; do
        env LOCAL_WORLD_SIZE=4 WORLD_SIZE=4 GCOLL_RANK=$r GCOLL_SIZE=4 \
            GCOLL_ROOT=127.0.0.1:$port GCOLL_JOB_KEY=two$$ GCOLL_TIMEOUT_MS=20000 \
            timeout 90 "$TWO" 16777216 10 >>"$TMP/two" 2>&1 &
        BG_PIDS="$BG_PIDS $!"
    done
    wait
    n=$(grep -c "on 2 communicators over ucx: ok" "$TMP/two")
    if [ "$n" -eq 4 ]; then
        pass "two communicators in one process, run $run: 4 ranks ok over ucx"
    else
        fail "two communicators in one process, run $run: $n of 4 ranks ok: $(grep -v ': ok' "$TMP/two" | head -n 3)"
    fi
done

finish
