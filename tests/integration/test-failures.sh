#!/bin/sh
# test-failures.sh: a dead, silent or aborting rank, mismatched counts, strangers at the
# rendezvous, an unreachable root and bad settings all end in clear errors, never hangs.
. "$(dirname "$0")/lib.sh"

# run NAME EXPECTED_STATUS gcoll-run-args...: runs a job and checks its exit status.
run() {
    name=$1 want=$2
    shift 2
    out="$TMP/$name.log"
    timeout 120 "$gcoll_run" --timeout 90 "$@" >"$out" 2>&1
    got=$?
    if [ "$got" -ne "$want" ]; then
        fail "$name: exit status $got, expected $want"
        tail -n 30 "$out"
        return 1
    fi
    return 0
}

# expect_lines NAME PATTERN COUNT: the job's output has COUNT lines matching PATTERN.
expect_lines() {
    n=$(grep -c "$2" "$TMP/$1.log")
    if [ "$n" -ne "$3" ]; then
        fail "$1: $n line(s) match '$2', expected $3"
        tail -n 30 "$TMP/$1.log"
    else
        pass "$1"
    fi
}

# expect_some NAME PATTERN: at least one line of the job's output matches PATTERN.
expect_some() {
    if grep -q "$2" "$TMP/$1.log"; then
        pass "$1: $(grep -c "$2" "$TMP/$1.log") rank(s) with '$2'"
    else
        fail "$1: no line matches '$2'"
        tail -n 30 "$TMP/$1.log"
    fi
}

for tr in $(transports); do
    common="-x GCOLL_TRANSPORT=$tr -x GCOLL_TIMEOUT_MS=3000"
    # A rank exits in the middle of an allreduce: the others fail fast, the launcher
    # reports the dead rank's status.
    run "die-$tr" 3 -n 4 --keep-going $common -- "$CHECK" die 2 &&
        expect_lines "die-$tr" "failed as expected" 3
    # The same while top-k's selection pass is streaming: no rank waits for the trailer.
    run "die-stream-$tr" 3 -n 4 --keep-going $common -x GCOLL_TOPK_STREAM=65536 \
        -- "$CHECK" die_stream 2 &&
        expect_lines "die-stream-$tr" "failed as expected" 3
    # A rank exits while its block of a 64 MiB-per-rank gather is on its way to the root
    # (over ucx-shm: being written into the root's buffer): the root fails fast.
    run "die-gather-$tr" 3 -n 4 --keep-going $common -- \
        "$top_builddir/tests/integration/rooted_check" die 2 &&
        expect_lines "die-gather-$tr" "rank 0: gather from a dead peer failed as expected" 1
    # A rank stays silent: the others time out instead of hanging.
    run "silent-$tr" 0 -n 3 $common -- "$CHECK" silent 1 &&
        expect_lines "silent-$tr" "failed as expected" 2
    # Mismatched counts: GCOLL_ERR_MISMATCH on every rank.
    for coll in allreduce op allgather reduce_scatter alltoall broadcast tensor; do
        run "mismatch-$coll-$tr" 0 -n 4 $common -- "$CHECK" mismatch 3 "$coll" &&
            expect_lines "mismatch-$coll-$tr" "failed as expected.*GCOLL_ERR_MISMATCH" 4
    done
    # Large messages (400 KB per rank: the UCX transport's single copy from 128 KiB): the
    # receiver that sees the mismatch decides, not a sender's failed send. (An alltoall of
    # that size over TCP still ends with GCOLL_ERR_PEER on one rank in about one run in six:
    # a rank's abort lost to its exit's reset; docs/testing.md.)
    for coll in allreduce allgather; do
        run "mismatch-large-$coll-$tr" 0 -n 4 $common -- "$CHECK" mismatch 3 "$coll" 100000 &&
            expect_lines "mismatch-large-$coll-$tr" "failed as expected.*GCOLL_ERR_MISMATCH" 4
    done
    # Ranks whose states have different specs: the first call's spec check fails every
    # rank with GCOLL_ERR_MISMATCH before any scheme runs, and the ranks that see the
    # records name both specs as written (a rank that hears another's abort first gets its
    # reason, which ucx cuts to 56 bytes: at least one rank names them).
    for coll in codec sparsecodec topkdensity topkdense; do
        run "mismatch-spec-$coll-$tr" 0 -n 4 $common -x GCOLL_TOPK_STREAM=512 -- "$CHECK" \
            mismatch 3 "$coll" &&
            expect_lines "mismatch-spec-$coll-$tr" "failed as expected.*GCOLL_ERR_MISMATCH" 4 &&
            expect_some "mismatch-spec-$coll-$tr" \
                "failed as expected.*GCOLL_ERR_MISMATCH.*spec.*differs: rank 0 has '[^']*', rank 3 has '"
    done
    # The same spec, another size over the compressed ring (each rank hears only its left
    # neighbour; the abort carries the mismatch to the others), and with top-k's selection
    # pass streamed (GCOLL_TOPK_STREAM): the schemes' own checks (a rank still in the spec
    # check when another's abort comes never reaches the scheme: at least one does).
    run "mismatch-ring-tensor-$tr" 0 -n 4 $common -x GCOLL_COMPRESSED_ALGO=ring \
        -x GCOLL_RING_CHUNK=4096 -x GCOLL_DEBUG=info -x GCOLL_DEBUG_SUBSYS=COMPRESS \
        -- "$CHECK" mismatch 3 tensor &&
        expect_lines "mismatch-ring-tensor-$tr" "failed as expected.*GCOLL_ERR_MISMATCH" 4 &&
        expect_some "mismatch-ring-tensor-$tr" "ring scheme (forced"
    run "mismatch-stream-topktensor-$tr" 0 -n 4 $common -x GCOLL_TOPK_STREAM=512 \
        -x GCOLL_DEBUG=info -x GCOLL_DEBUG_SUBSYS=COMPRESS -- "$CHECK" mismatch 3 topktensor &&
        expect_lines "mismatch-stream-topktensor-$tr" "failed as expected.*GCOLL_ERR_MISMATCH" 4 &&
        expect_some "mismatch-stream-topktensor-$tr" "streamed sparse scheme"
    # A peer whose sparse pieces carry indices beyond the dense size: an error everywhere.
    run "sparse-bad-$tr" 0 -n 4 $common -- "$top_builddir/tests/integration/sparse_bad" 2 &&
        expect_lines "sparse-bad-$tr" "misbehaving rank 2: GCOLL_ERR" 4
    # A rank that never marks a tensor ready: it names the tensor, the others the bucket.
    # A NaN in one rank's gradient: that rank names the tensor and element, all fail fast.
    run "bucket-nan-$tr" 0 -n 3 $common -- "$CHECK" bucket_nan 1 &&
        expect_lines "bucket-nan-$tr" "NaN gradient failed as expected" 3
    # The same with local accumulation: the encoder finds it in the accumulated sum.
    run "bucket-nan-acc-$tr" 0 -n 3 $common -- "$CHECK" bucket_nan_acc 1 &&
        expect_lines "bucket-nan-acc-$tr" "NaN gradient failed as expected" 3
    run "bucket-missing-$tr" 0 -n 3 $common -- "$CHECK" bucket_missing 1 &&
        expect_lines "bucket-missing-$tr" "missing ready() failed as expected" 3
    # gcoll_comm_abort from another thread interrupts rank 0 and fails the others.
    run "abort-$tr" 0 -n 3 $common -- "$CHECK" abort &&
        expect_lines "abort-$tr" "failed as expected" 3
done

# Strangers at the rendezvous port: a silent client, garbage bytes and a wrong job key are
# refused and logged while the job completes, without waiting for the silent one.
port=$(free_port)
export GCOLL_ROOT="127.0.0.1:$port" GCOLL_SIZE=3 GCOLL_JOB_KEY=test-key-1234 GCOLL_TIMEOUT_MS=30s
GCOLL_RANK=0 timeout 60 "$DEMO" 1000 >"$TMP/r0.log" 2>&1 &
p0=$!
BG_PIDS="$BG_PIDS $p0"
timeout 60 "$INTRUDER" silent "$GCOLL_ROOT" 40 >/dev/null 2>&1 &
BG_PIDS="$BG_PIDS $!"
timeout 60 "$INTRUDER" garbage "$GCOLL_ROOT" 1 >/dev/null 2>&1
timeout 60 "$INTRUDER" wrongkey "$GCOLL_ROOT" >"$TMP/wrongkey.log" 2>&1 ||
    fail "intruder with a wrong key was not refused: $(cat "$TMP/wrongkey.log")"
start=$(date +%s)
GCOLL_RANK=1 timeout 60 "$DEMO" 1000 >"$TMP/r1.log" 2>&1 &
p1=$!
BG_PIDS="$BG_PIDS $p1"
GCOLL_RANK=2 timeout 60 "$DEMO" 1000 >"$TMP/r2.log" 2>&1
s2=$?
wait "$p0"; s0=$?
wait "$p1"; s1=$?
took=$(( $(date +%s) - start ))
if [ "$s0$s1$s2" = "000" ] && [ "$took" -lt 20 ]; then
    pass "job completes with strangers at the rendezvous (${took} s)"
else
    fail "job with strangers: exit statuses $s0 $s1 $s2 after ${took} s"
    cat "$TMP/r0.log" "$TMP/r1.log" "$TMP/r2.log"
fi
if grep -q "refused connection.*wrong GCOLL_JOB_KEY" "$TMP/r0.log" &&
   grep -q "refused connection.*bad handshake magic" "$TMP/r0.log"; then
    pass "strangers are refused and logged"
else
    fail "rank 0 did not log the refused strangers"
    cat "$TMP/r0.log"
fi
unset GCOLL_ROOT GCOLL_SIZE GCOLL_JOB_KEY GCOLL_TIMEOUT_MS

# A rank whose root never comes up gives up at the timeout with a clear message.
port=$(free_port)
start=$(date +%s)
GCOLL_ROOT="127.0.0.1:$port" GCOLL_SIZE=2 GCOLL_RANK=1 GCOLL_TIMEOUT_MS=1500 \
    timeout 30 "$DEMO" 10 >"$TMP/noroot.log" 2>&1
st=$?
took=$(( $(date +%s) - start ))
if [ "$st" -eq 1 ] && [ "$took" -lt 10 ] && grep -q "cannot reach the rendezvous" "$TMP/noroot.log"; then
    pass "unreachable rendezvous"
else
    fail "unreachable rendezvous: status $st after $took s"
    cat "$TMP/noroot.log"
fi

# A bad setting names the variable.
GCOLL_TIMEOUT_MS=soon GCOLL_SIZE=1 GCOLL_RANK=0 timeout 30 "$DEMO" 10 >"$TMP/badvar.log" 2>&1
if [ $? -eq 1 ] && grep -q "GCOLL_TIMEOUT_MS='soon' is invalid" "$TMP/badvar.log"; then
    pass "bad setting is named"
else
    fail "bad setting"
    cat "$TMP/badvar.log"
fi

# Ranks started with different must-match settings refuse to run together.
run "settings-mismatch" 1 -n 2 --rank-env 1:GCOLL_TCP_NSOCKS=3 -- "$DEMO" 10 &&
    { grep -q "disagree on settings" "$TMP/settings-mismatch.log" && pass "settings mismatch" ||
      { fail "settings mismatch message"; cat "$TMP/settings-mismatch.log"; }; }
finish
