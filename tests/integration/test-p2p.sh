#!/bin/sh
# test-p2p.sh: point-to-point and group calls (p2p_check) on 1-5 ranks started by hand,
# over every transport variant (tcp, UCX over tcp, UCX over shared memory): every dtype
# between every pair, ordering, sends to oneself, ring shifts in groups, fused allreduces,
# p2p between collectives; argument errors; a count mismatch (reported on the receiver,
# nothing written past its buffer) and a peer that dies before it sends (GCOLL_ERR_PEER
# well within the timeout, not a hang); under mpirun without GCOLL_ROOT.
. "$(dirname "$0")/../chaos/common.sh"
P2P="$top_builddir/tests/integration/p2p_check"

# run N VARIANT MODE [grep-pattern-on-rank-1-stdout]
run() {
    n=$1 var=$2 mode=$3
    start_ranks "$n" "$var" 120 env GCOLL_TIMEOUT_MS=30s "$P2P" "$mode"
    wait_ranks
    bad=0 r=0
    while [ "$r" -lt "$n" ]; do
        rc=$(cat "$TMP/rc.$r" 2>/dev/null || echo lost)
        if [ "$rc" != 0 ]; then
            bad=$((bad + 1))
            tail -n 5 "$TMP/err.$r"
        fi
        r=$((r + 1))
    done
    if [ "$bad" -ne 0 ]; then
        fail "p2p $mode on $n ranks over $var: $bad rank(s) failed"
    else
        pass "p2p $mode on $n ranks over $var"
    fi
}

for var in $(variants); do
    for n in 1 2 3 4 5; do
        case "$var:$n" in tcp:*|*:2|*:4) run "$n" "$var" all ;; esac
    done
    run 3 "$var" errors
    run 2 "$var" mismatch
    run 2 "$var" dead
done
# Open MPI's mpirun on one host, as an MPI user types it: no GCOLL_ROOT (loopback at a
# port derived from the job id), no job key
if command -v mpirun >/dev/null 2>&1; then
    if timeout 120 mpirun --allow-run-as-root --oversubscribe -np 3 "$P2P" all \
        >"$TMP/mpirun.log" 2>&1; then
        pass "p2p all under mpirun -np 3 without GCOLL_ROOT"
    else
        fail "p2p all under mpirun -np 3 without GCOLL_ROOT"
        grep -E 'p2p_check|FAIL|gcoll' "$TMP/mpirun.log" | head -n 20
        tail -n 10 "$TMP/mpirun.log"
    fi
else
    note "mpirun not installed: its case skipped"
fi
finish
