#!/bin/sh
# test-verbs.sh: the collectives suite and failure cases over the verbs transport, on a
# machine with an active RDMA port (a real HCA, or soft-RoCE: rdma link add rxe0 type rxe
# netdev eth0). Anywhere else it skips (exit 77) and says what is missing.
. "$(dirname "$0")/lib.sh"

line=$("$top_builddir/tools/gcoll-info" -t | grep '^verbs ')
case "$line" in
"")
    note "SKIP: this build has no verbs transport (configure found no infiniband/verbs.h;" \
        "Debian: libibverbs-dev)"
    exit 77 ;;
*" usable"*) ;;
*)
    note "SKIP: verbs transport unavailable here: ${line#verbs*unavailable: }"
    exit 77 ;;
esac
note "verbs: $(ibv_devinfo -l 2>/dev/null | tr '\n' ' ')"

# The whole suite with the defaults, then with settings that push every path: two QPs
# per peer, few small slots (credit stalls, wraparound), small rendezvous chunks.
i=0
for settings in "" \
    "-x GCOLL_IB_QPS_PER_PEER=2 -x GCOLL_IB_EAGER_SLOTS=4 -x GCOLL_IB_EAGER_SIZE=1kb -x GCOLL_IB_CHUNK=64kb -x GCOLL_IB_REG_CACHE=16"; do
    i=$((i + 1))
    for n in 1 2 3 4; do
        out="$TMP/verbs-$i-$n.log"
        # shellcheck disable=SC2086
        if timeout 600 "$GCOLL_RUN" -n "$n" --timeout 500 -x GCOLL_TRANSPORT=verbs \
            -x GCOLL_TIMEOUT_MS=60s $settings -- "$CHECK" all >"$out" 2>&1; then
            pass "verbs settings #$i: $n rank(s): $(grep -c 'checks passed' "$out") rank(s) passed"
        else
            fail "verbs settings #$i: $n rank(s)"
            tail -n 40 "$out"
        fi
    done
done

# Receives from any source (test-anysrc.sh's cases) on 3 ranks over verbs.
for mode in all errors mismatch; do
    if timeout 300 "$GCOLL_RUN" -n 3 --timeout 250 -x GCOLL_TRANSPORT=verbs \
        -x GCOLL_TIMEOUT_MS=30s -- "$top_builddir/tests/integration/anysrc_check" "$mode" \
        >"$TMP/anysrc-$mode.log" 2>&1; then
        pass "verbs: receive from any source ($mode)"
    else
        fail "verbs: receive from any source ($mode)"
        tail -n 20 "$TMP/anysrc-$mode.log"
    fi
done

# Failures end in errors on every rank, never hangs (as test-failures.sh does for tcp).
common="-x GCOLL_TRANSPORT=verbs -x GCOLL_TIMEOUT_MS=3000"
# shellcheck disable=SC2086
timeout 120 "$GCOLL_RUN" --timeout 90 -n 4 --keep-going $common -- "$CHECK" die 2 \
    >"$TMP/die.log" 2>&1
n=$(grep -c "failed as expected" "$TMP/die.log")
[ "$n" -eq 3 ] && pass "verbs: a rank dies mid-allreduce" ||
    { fail "verbs: die: $n rank(s) failed as expected, wanted 3"; tail -n 30 "$TMP/die.log"; }
# shellcheck disable=SC2086
timeout 120 "$GCOLL_RUN" --timeout 90 -n 4 $common -- "$CHECK" mismatch 3 >"$TMP/mm.log" 2>&1
n=$(grep -c "failed as expected.*GCOLL_ERR_MISMATCH" "$TMP/mm.log")
[ "$n" -eq 4 ] && pass "verbs: mismatched counts" ||
    { fail "verbs: mismatch: $n rank(s) reported it, wanted 4"; tail -n 30 "$TMP/mm.log"; }
# shellcheck disable=SC2086
timeout 120 "$GCOLL_RUN" --timeout 90 -n 3 $common -- "$CHECK" abort >"$TMP/abort.log" 2>&1
n=$(grep -c "failed as expected" "$TMP/abort.log")
[ "$n" -eq 3 ] && pass "verbs: abort from another thread" ||
    { fail "verbs: abort: $n rank(s) failed as expected, wanted 3"; tail -n 30 "$TMP/abort.log"; }
# gcoll-bench over verbs, checked (-c 1), for the log: compare its busbw with ib_write_bw
# between the same ports (docs/verbs.md).
out="$TMP/bench.log"
if timeout 300 "$GCOLL_RUN" -n 2 -q --timeout 250 -x GCOLL_TRANSPORT=verbs -- \
    "$top_builddir/tools/gcoll-bench" --coll allreduce -b 8 -e 64M -f 8 -n 5 -w 1 -c 1 >"$out" 2>&1; then
    pass "verbs: gcoll-bench allreduce 8 B .. 64 MiB"
    cat "$out"
else
    fail "verbs: gcoll-bench"
    tail -n 20 "$out"
fi
finish
