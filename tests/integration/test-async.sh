#!/bin/sh
# test-async.sh: gcoll-train --async (the SSP parameter server) on 2-3 ranks and a slice of
# Fashion-MNIST: the summary lines, S=0 never runs ahead and sees no staleness, S=2 with a
# persistent or rotating straggler stays within 2 clocks (from the counters rank 0 prints)
# and trains, compressed pushes, compressed pulls with DC-ASGD, bad flags, and a killed rank fails the others in bounded
# time. Pulls are prefetched (gcoll-train's default: the model travels while the worker
# computes), so every case checks the bound with the pipelined worker; one case waits. Skipped (77) without dataset-fashion-mnist. About 20 s on 2 cores.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/train-lib.sh"

train() {
    out=$1
    n=$2
    shift 2
    timeout 90 "$gcoll_run" -q -n "$n" "$TRAIN" --data "$data" --limit 3200 --test-limit 1000 \
        --batch 32 --seed 3 --epochs 2 --async "$@" >"$out" 2>"$out.err"
}
field() { sed -n "s/^$1: //p" "$2"; }

# check NAME OUT RC MAXGAP MINACC: exit status, the five summary lines, gap <= MAXGAP,
# accuracy > MINACC (with S > 0 the interleaving, so the accuracy after 66 steps, varies
# from run to run: 0.60-0.69 measured; chance is 0.1)
check() {
    name=$1
    out=$2
    rc=$3
    maxgap=$4
    minacc=$5
    if [ "$rc" -ne 0 ]; then
        fail "$name: exit status $rc: $(tail -n 3 "$out.err")"
        return 1
    fi
    grep -Eq '^final test accuracy: 0\.[0-9]{4}$' "$out" || fail "$name: no accuracy line"
    grep -Eq '^total wire MB: [0-9]+(\.[0-9]+)?$' "$out" || fail "$name: no wire MB line"
    grep -Eq '^steps per second: [0-9]+(\.[0-9]+)?$' "$out" || fail "$name: no steps/s line"
    grep -Eq '^max clock gap: [0-9]+$' "$out" || fail "$name: no 'max clock gap: N' line"
    grep -Eq '^mean staleness: [0-9]+(\.[0-9]+)?$' "$out" || fail "$name: no 'mean staleness' line"
    gap=$(field 'max clock gap' "$out")
    acc=$(field 'final test accuracy' "$out")
    [ "${gap:-99}" -le "$maxgap" ] || fail "$name: max clock gap $gap > S = $maxgap"
    awk -v a="${acc:-0}" -v m="$minacc" 'BEGIN {exit !(a > m)}' ||
        fail "$name: test accuracy $acc, expected more than $minacc"
    pass "$name: accuracy $acc, gap $gap, staleness $(field 'mean staleness' "$out"), $(grep '^steps per second' "$out")"
}

train "$TMP/s0.txt" 2 --staleness 0
check "S=0" "$TMP/s0.txt" $? 0 0.7
[ "$(field 'mean staleness' "$TMP/s0.txt")" = "0.0000" ] ||
    fail "S=0: mean staleness $(field 'mean staleness' "$TMP/s0.txt"), expected 0"
train "$TMP/slow.txt" 3 --staleness 2 --slow-rank 2 --slow-factor 3
check "S=2, rank 2 slow x3" "$TMP/slow.txt" $? 2 0.5
# a persistent straggler keeps the others S clocks ahead: the bound is reached, not passed
[ "$(field 'max clock gap' "$TMP/slow.txt")" = 2 ] ||
    fail "S=2 with a slow rank: the gap never reached 2 ($(field 'max clock gap' "$TMP/slow.txt"))"
awk -v s="$(field 'mean staleness' "$TMP/slow.txt")" 'BEGIN {exit !(s > 0)}' ||
    fail "S=2 with a slow rank: no staleness measured"
# the waiting worker (--prefetch off): the same bound, reached
train "$TMP/wait.txt" 3 --staleness 2 --slow-rank 2 --slow-factor 3 --prefetch off
check "S=2, rank 2 slow x3, pulls waited" "$TMP/wait.txt" $? 2 0.5
[ "$(field 'max clock gap' "$TMP/wait.txt")" = 2 ] ||
    fail "S=2 with a slow rank, pulls waited: the gap never reached 2"
# prefetched S=1 on 2 ranks without a straggler: an answer is asked for before the
# worker's last push, so tau = 1 unless the bound held it back until that push was
# applied (clock 0's, and more the more the two ranks' steps interleave): 0.89-0.97
# measured, idle and under load. Waited pulls give 0.49-0.50 here (about half their
# answers hold the last clock whole), so the bound between the two, 0.75, tells them
# apart.
train "$TMP/pf1.txt" 2 --staleness 1
check "S=1, prefetched" "$TMP/pf1.txt" $? 1 0.5
awk -v s="$(field 'mean staleness' "$TMP/pf1.txt")" 'BEGIN {exit !(s > 0.75 && s <= 1)}' ||
    fail "S=1 prefetched: mean staleness $(field 'mean staleness' "$TMP/pf1.txt"), expected in (0.75, 1] (waited pulls: about 0.5)"
train "$TMP/rot.txt" 3 --staleness 2 --straggle 2 --compressor topk:density=0.1
check "S=2, rotating straggler x2, top-k 10% pushes" "$TMP/rot.txt" $? 2 0.5
mbd=$(field 'total wire MB' "$TMP/slow.txt")
mbc=$(field 'total wire MB' "$TMP/rot.txt")
awk -v a="${mbd:-0}" -v b="${mbc:-1e9}" 'BEGIN {exit !(b < a * 0.7)}' ||
    fail "top-k 10% pushes sent $mbc MB, dense $mbd MB (pulls stay dense: expect ~0.6)"
train "$TMP/cmp.txt" 3 --staleness 2 --straggle 2 --compressor topk:density=0.1 \
    --pull-compressor topk:density=0.1 --dc-lambda 0.1
check "S=2, rotating straggler, top-k 10% pushes and pulls, DC-ASGD" "$TMP/cmp.txt" $? 2 0.5
mbp=$(field 'total wire MB' "$TMP/cmp.txt")
awk -v a="${mbd:-0}" -v b="${mbp:-1e9}" 'BEGIN {exit !(b < a * 0.35)}' ||
    fail "top-k 10% pushes and pulls sent $mbp MB, dense $mbd MB (expect ~0.2)"

expect_error() {
    name=$1
    want=$2
    code=$3
    shift 3
    timeout 30 "$gcoll_run" -q -n 2 "$TRAIN" --data "$data" --limit 640 --epochs 1 "$@" \
        >"$TMP/err.out" 2>&1
    rc=$?
    if [ "$rc" -eq "$code" ] && grep -q -- "$want" "$TMP/err.out"; then
        pass "$name: $(grep -m1 -- "$want" "$TMP/err.out")"
    else
        fail "$name: exit status $rc (expected $code), output: $(head -c 400 "$TMP/err.out")"
    fi
}
expect_error "bad S" "--staleness expects" 2 --async --staleness -1
expect_error "S without --async" "--staleness applies to --async" 2 --staleness 2
expect_error "two modes" "different modes" 2 --async --local-steps 2
expect_error "DC without --async" "apply to --async" 2 --dc-lambda 0.1
expect_error "bad weight" "--staleness-weight expects" 2 --async --staleness-weight half
expect_error "bad lambda" "--dc-lambda expects" 2 --async --dc-lambda -1
expect_error "bad prefetch" "--prefetch expects on or off" 2 --async --prefetch maybe
expect_error "prefetch without --async" "apply to --async" 2 --prefetch off
expect_error "random-k pulls" "random-k and DGC need a state" 1 --async \
    --pull-compressor randomk:density=0.1

# A killed rank: the survivors' servers see the closed connection and fail, the workers
# waiting in a pull with them, well within GCOLL_TIMEOUT_MS.
kill_one_rank ps-kill-key '^epoch 1:' --async --staleness 2
finish
