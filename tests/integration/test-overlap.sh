#!/bin/sh
# test-overlap.sh: the bucketer's overlap machinery across processes (check_overlap.c):
# results bit-identical to per-tensor reduction for shuffled ready() orders and timings,
# automatic and GCOLL_BUCKET_BYTES layouts, priorities on and off; and the order the
# buckets ran in, logged by every rank, identical on all ranks; compressed buckets encoded
# ahead by the codec worker bit-identical to the same encoded in their turn, and a rank
# killed in a pipelined step failing the others' step in bounded time. Ranks by gcoll-run
# and by hand (GCOLL_RANK/SIZE/ROOT/JOB_KEY).
. "$(dirname "$0")/lib.sh"

# The "ran bucket" sequence of rank r in log $1, one line per bucket run.
order_of() { sed -n "s/^\[$2\] .*bucketer: step \([0-9]*\) ran bucket \([0-9]*\).*/\1 \2/p" "$1"; }

# Every rank of log $1 ($2 ranks) ran the same buckets in the same order (and some ran).
same_order() {
    order_of "$1" 0 >"$TMP/order0"
    [ -s "$TMP/order0" ] || return 1
    r=1
    while [ "$r" -lt "$2" ]; do
        order_of "$1" "$r" >"$TMP/order$r"
        cmp -s "$TMP/order0" "$TMP/order$r" || return 1
        r=$((r + 1))
    done
}

for tr in $(transports); do
    for n in 2 4; do
        for prio in 1 0; do
            out="$TMP/overlap-$tr-$n-$prio.log"
            if timeout 300 "$gcoll_run" -n "$n" --timeout 250 -x GCOLL_TRANSPORT="$tr" \
                -x GCOLL_BUCKET_PRIORITY="$prio" -x GCOLL_DEBUG=debug \
                -x GCOLL_DEBUG_SUBSYS=COLL -- "$CHECK" overlap >"$out" 2>&1; then
                pass "$tr: bucketer overlap (orders, layouts, wait_tensor), priority $prio, $n ranks"
            else
                fail "$tr: bucketer overlap, priority $prio, $n ranks"
                grep -v ' DEBUG \| INFO ' "$out" | tail -n 30
            fi
            if same_order "$out" "$n"; then
                pass "$tr: bucket run order identical on $n ranks, priority $prio ($(wc -l <"$TMP/order0") runs)"
            else
                fail "$tr: bucket run order differs between ranks, priority $prio, $n ranks"
            fi
        done
    done
    # priorities change the order: with them, some step runs a later bucket first
    order_of "$TMP/overlap-$tr-2-1.log" 0 >"$TMP/p1"
    if awk '$1 == s && $2 < b { found = 1 } { s = $1; b = $2 } END { exit !found }' "$TMP/p1"; then
        pass "$tr: priority 1 ran a later bucket before an earlier one"
    else
        fail "$tr: priority 1 never reordered the buckets"
    fi
    order_of "$TMP/overlap-$tr-2-0.log" 0 >"$TMP/p0"
    if awk '$1 == s && $2 < b { found = 1 } { s = $1; b = $2 } END { exit found }' "$TMP/p0"; then
        pass "$tr: priority 0 ran the buckets in launch order"
    else
        fail "$tr: priority 0 reordered the buckets"
    fi
done

# compressed buckets encoded ahead by the codec worker (GCOLL_BUCKET_PIPELINE=1) against the
# same encoded in their turn, and against each bucket's compressed allreduce (one k across a
# bucket: GCOLL_LAYER_SELECT=0); the run order identical on every rank
for tr in $(transports); do
    for n in 2 3; do
        for prio in 1 0; do
            out="$TMP/pipe-$tr-$n-$prio.log"
            if timeout 300 "$gcoll_run" -n "$n" --timeout 250 -x GCOLL_TRANSPORT="$tr" \
                -x GCOLL_BUCKET_PRIORITY="$prio" -x GCOLL_LAYER_SELECT=0 -x CHECK_OVERLAP=pipeline \
                -x GCOLL_DEBUG=debug -x GCOLL_DEBUG_SUBSYS=COLL -- "$CHECK" overlap >"$out" 2>&1; then
                pass "$tr: compressed buckets pipelined = not pipelined = per-bucket compressed allreduce, priority $prio, $n ranks"
            else
                fail "$tr: compressed buckets pipelined, priority $prio, $n ranks"
                grep -v ' DEBUG \| INFO ' "$out" | tail -n 30
            fi
            if same_order "$out" "$n"; then
                pass "$tr: pipelined run order identical on $n ranks, priority $prio ($(wc -l <"$TMP/order0") runs)"
            else
                fail "$tr: pipelined run order differs between ranks, priority $prio, $n ranks"
            fi
            # the pipelined path ran, and some bucket was encoded before its turn came
            if grep 'encoded [0-9.]* ms before its turn' "$out" | grep -qv 'encoded 0.0 ms'; then
                pass "$tr: buckets encoded ahead of their turn, priority $prio, $n ranks"
            else
                fail "$tr: no bucket encoded ahead of its turn, priority $prio, $n ranks"
            fi
        done
    done
done

# a rank killed (stalled) inside a pipelined step: the others end it with an error, in
# bounded time (a stall: GCOLL_TIMEOUT_MS, 5 s, where the stalled rank sleeps 12 s)
for how in kill stall; do
    port=$(free_port)
    pids=""
    for r in 0 1 2; do
        GCOLL_RANK=$r GCOLL_SIZE=3 GCOLL_ROOT="127.0.0.1:$port" GCOLL_JOB_KEY=overlap-key \
            GCOLL_TIMEOUT_MS=5s CHECK_OVERLAP=$how timeout 60 "$CHECK" overlap >"$TMP/$how$r.log" 2>&1 &
        pids="$pids $!"
        BG_PIDS="$BG_PIDS $!"
    done
    rcs=""
    for p in $pids; do
        rc=0
        wait "$p" || rc=$?
        rcs="$rcs $rc"
    done
    want=" 0 0 3"
    [ "$how" = kill ] || want=" 0 0 0"
    t0=$(sed -n 's/.*failed after \([0-9.]*\) s.*/\1/p' "$TMP/${how}0.log")
    t1=$(sed -n 's/.*failed after \([0-9.]*\) s.*/\1/p' "$TMP/${how}1.log")
    # the error within the deadline (and well before the stalled rank would have come back)
    if [ "$rcs" = "$want" ] && [ -n "$t0" ] && [ -n "$t1" ] &&
        awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(a < 11 && b < 11) }'; then
        pass "$how: a rank's failure inside a pipelined step ends the others' with an error (${t0} s, ${t1} s)"
    else
        fail "$how inside a pipelined step (exit codes$rcs, expected$want; errors after '$t0' '$t1' s)"
        tail -n 5 "$TMP/${how}0.log" "$TMP/${how}1.log" "$TMP/${how}2.log"
    fi
done

# ranks started by hand
port=$(free_port)
pids=""
for r in 0 1 2; do
    GCOLL_RANK=$r GCOLL_SIZE=3 GCOLL_ROOT="127.0.0.1:$port" GCOLL_JOB_KEY=overlap-key \
        GCOLL_TIMEOUT_MS=60s GCOLL_DEBUG=debug GCOLL_DEBUG_SUBSYS=COLL \
        timeout 200 "$CHECK" overlap >"$TMP/hand$r.log" 2>&1 &
    pids="$pids $!"
    BG_PIDS="$BG_PIDS $!"
done
ok=1
for p in $pids; do wait "$p" || ok=0; done
# by hand, each rank logs to its own file: compare their sequences
for r in 0 1 2; do
    sed -n "s/.*bucketer: step \([0-9]*\) ran bucket \([0-9]*\).*/\1 \2/p" "$TMP/hand$r.log" \
        >"$TMP/h$r"
done
if [ "$ok" = 1 ] && [ -s "$TMP/h0" ] && cmp -s "$TMP/h0" "$TMP/h1" && cmp -s "$TMP/h0" "$TMP/h2"; then
    pass "bucketer overlap, 3 ranks by hand: results and run order agree"
else
    fail "bucketer overlap, 3 ranks by hand"
    tail -n 20 "$TMP/hand0.log" "$TMP/hand1.log" | grep -v ' DEBUG \| INFO '
fi
finish
