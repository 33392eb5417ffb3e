#!/bin/sh
# test-anysrc.sh: receives from any source (anysrc_check) on 3 ranks started by hand, over
# every transport variant (tcp, UCX over tcp, UCX over shared memory): every rank taking
# messages from all others exactly once with their senders and in each sender's order,
# small and past the eager sizes; mixed with receives that name the sender; a message to
# oneself; refused inside a group and with bad arguments; a count mismatch (named sender,
# nothing written past the buffer); a peer that dies (GCOLL_ERR_PEER well within the
# timeout); no message at all (GCOLL_ERR_TIMEOUT after GCOLL_TIMEOUT_MS=2s). Also 2 ranks
# (the all case without the mixed rounds, which need 3).
. "$(dirname "$0")/../chaos/common.sh"
ANY="$top_builddir/tests/integration/anysrc_check"

# run N VARIANT MODE TIMEOUT
run() {
    n=$1 var=$2 mode=$3 tmo=$4
    start_ranks "$n" "$var" 120 env GCOLL_TIMEOUT_MS="$tmo" "$ANY" "$mode"
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
        fail "anysrc $mode on $n ranks over $var: $bad rank(s) failed"
    else
        pass "anysrc $mode on $n ranks over $var"
    fi
}

for var in $(variants); do
    run 3 "$var" all 30s
    run 3 "$var" errors 30s
    run 3 "$var" mismatch 30s
    run 3 "$var" dead 30s
    run 3 "$var" timeout 2s
done
run 2 tcp all 30s
finish
