#!/bin/sh
# test-randomk-train.sh: random-k 1% with error feedback trains in gcoll-train (issue 38,
# item 7): 2 ranks, 2 epochs of the full Fashion-MNIST, gcoll-train's defaults (lr 0.05
# cosine, momentum 0.9, which gcoll-train hands to random-k's codec as momentum=0.9). No
# NaN, and the final test accuracy within 2.5 points of dense on the same settings:
# measured 1.0 and 1.2 points below dense on seeds 1 and 2 (0.8583 against 0.8685, 0.8582
# against 0.8700, AMD EPYC); the optimizer's momentum on top of random-k (the form before
# the fix, --momentum 0.9) ends at chance, 0.1000. About 25 s on 2 cores.
# Skipped (77) when dataset-fashion-mnist is not installed.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/train-lib.sh"

# train OUT ARGS...
train() {
    out=$1
    shift
    timeout 600 "$gcoll_run" -q -n 2 "$TRAIN" --data "$data" --epochs 2 --seed 1 "$@" \
        >"$out" 2>"$out.err"
}

train "$TMP/dense.txt" --compressor none
rc=$?
train "$TMP/rk.txt" --compressor randomk:density=0.01
rc2=$?
dense=$(sed -n 's/^final test accuracy: //p' "$TMP/dense.txt")
rk=$(sed -n 's/^final test accuracy: //p' "$TMP/rk.txt")
if [ "$rc" -ne 0 ] || [ -z "$dense" ]; then
    fail "dense run: exit status $rc: $(tail -n 3 "$TMP/dense.txt.err")"
elif [ "$rc2" -ne 0 ] || [ -z "$rk" ]; then
    fail "randomk:density=0.01: exit status $rc2: $(tail -n 3 "$TMP/rk.txt.err")"
else
    grep -q 'momentum 0.9 (0 on random-k.s tensors' "$TMP/rk.txt" ||
        fail "randomk:density=0.01: the header does not say the codec takes the momentum"
    grep -q 'fc1.weight=randomk:density=0.01,momentum=0.9' "$TMP/rk.txt" ||
        fail "randomk:density=0.01: fc1.weight's spec is not randomk:density=0.01,momentum=0.9"
    if grep -Eiq 'nan|inf' "$TMP/rk.txt"; then
        fail "randomk:density=0.01: NaN/Inf in the output"
    elif awk -v r="$rk" -v d="$dense" 'BEGIN {exit !(r >= d - 0.025)}'; then
        pass "randomk:density=0.01: test accuracy $rk, dense $dense (bound: dense - 0.025)"
    else
        fail "randomk:density=0.01: test accuracy $rk, more than 2.5 points below dense $dense"
    fi
fi
finish
