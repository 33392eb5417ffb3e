#!/bin/sh
# test-adapt-train.sh: gcoll-train under the statistical GCOLL_ADAPT rules, 3 ranks started
# by hand (GCOLL_RANK/SIZE/ROOT/JOB_KEY) on a slice of Fashion-MNIST: budget and
# stage+budget train as well as fixed top-k 1% (snr+bandwidth trains), each
# prints its per-epoch line in the documented format with every density within
# GCOLL_DENSITY_MIN..MAX, every rank logs the same decisions, budget's split keeps the
# spec's total k (computed here from the tensor sizes), the stage falls, and ranks that
# disagree on GCOLL_ADAPT fail at once.
# Skipped (77) when dataset-fashion-mnist is not installed.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/train-lib.sh"
unset GCOLL_ADAPT GCOLL_DENSITY_MIN GCOLL_DENSITY_MAX GCOLL_DEBUG GCOLL_DEBUG_SUBSYS

DMIN=0.002
DMAX=0.1
# gcoll-train's tensors in bucket order (one bucket per tensor) and their sizes
SIZES="10 2560 256 131072 512 401408"

# run3 TAG ADAPT ARGS...: 3 ranks by hand, each rank's output in $TMP/TAG.R.{out,err};
# returns 0 when every rank exited 0
run3() {
    tag=$1
    adapt=$2
    shift 2
    port=$(free_port)
    key=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
    pids=""
    for r in 0 1 2; do
        GCOLL_RANK=$r GCOLL_SIZE=3 GCOLL_ROOT="127.0.0.1:$port" GCOLL_JOB_KEY=$key \
            GCOLL_ADAPT=$adapt GCOLL_DENSITY_MIN=$DMIN GCOLL_DENSITY_MAX=$DMAX \
            GCOLL_DEBUG=debug GCOLL_DEBUG_SUBSYS=ADAPT GCOLL_TIMEOUT_MS=20s \
            timeout 90 "$TRAIN" --data "$data" --limit 6144 --test-limit 2000 --batch 32 \
            --epochs 3 --seed 5 --compressor topk:density=0.01 "$@" \
            >"$TMP/$tag.$r.out" 2>"$TMP/$tag.$r.err" &
        pids="$pids $!"
        BG_PIDS="$BG_PIDS $!"
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    return $rc
}
acc() { sed -n 's/^final test accuracy: //p' "$TMP/$1.0.out"; }
mb() { sed -n 's/^total wire MB: //p' "$TMP/$1.0.out"; }
loss_falls() {
    awk '$1 ~ /^[0-9]+$/ && NF == 9 { l[$1] = $2 } END { exit !(3 in l && l[3] < l[1]) }' "$TMP/$1.0.out"
}

if ! run3 fixed off; then
    fail "fixed top-k 1%: $(tail -n 2 "$TMP/fixed.0.err")"
    exit 1
fi
loss_falls fixed || fail "fixed top-k 1%: the train loss did not fall"
facc=$(acc fixed)
fmb=$(mb fixed)
note "fixed top-k 1%: accuracy $facc, $fmb MB"

for rule in budget stage+budget snr+bandwidth; do
    tag=$(printf '%s' "$rule" | tr -c 'a-z' '-')
    if ! run3 "$tag" "$rule"; then
        fail "$rule: a rank failed: $(tail -n 2 "$TMP/$tag.0.err")"
        continue
    fi
    o="$TMP/$tag.0.out"
    loss_falls "$tag" || fail "$rule: the train loss did not fall"
    a=$(acc "$tag")
    if [ "$rule" = snr+bandwidth ]; then
        # the bandwidth rule reads the link's (here loopback's and the CPUs') speed, so its
        # bytes depend on the machine: it must train, and decide alike on every rank
        awk -v a="${a:-0}" 'BEGIN { exit !(a > 0.7) }' || fail "$rule: accuracy $a"
    else
        # as accurate as fixed top-k: on this run budget's and stage+budget's lead over it,
        # paired by seed over seeds 1-6, is 1.3 and 1.4 points (sd 0.7 and 0.9); the bound,
        # a point under fixed top-k, is 3.2 and 2.7 sd under those leads
        awk -v a="${a:-0}" -v f="$facc" 'BEGIN { exit !(a > f - 0.01) }' ||
            fail "$rule: accuracy $a against fixed top-k's $facc"
    fi
    # adapt: epoch N noise_scale X noise_share X stage X boost X bandwidth_MBps X density X buckets d,...
    n=$(grep -Ec '^adapt: epoch [1-3] noise_scale [0-9.e+-]+ noise_share [0-9.]+ stage [0-9.]+ boost [0-9.]+ bandwidth_MBps [0-9.e+-]+ density [0-9.e-]+ buckets [0-9.e,-]+$' "$o")
    [ "$n" -eq 3 ] || fail "$rule: $n per-epoch adapt lines in the documented format, expected 3"
    bad=$(sed -n 's/^adapt: epoch .* buckets //p' "$o" | tr ',' '\n' |
        awk -v lo=$DMIN -v hi=$DMAX 'NF && !($1 >= lo * 0.9999 && $1 <= hi * 1.0001) { print }' | head -n 3)
    [ -z "$bad" ] || fail "$rule: densities outside $DMIN..$DMAX: $bad"
    nb=$(sed -n 's/^adapt: epoch 3 .* buckets //p' "$o" | tr ',' '\n' | grep -c .)
    [ "$nb" -eq 6 ] || fail "$rule: $nb bucket densities, expected 6"
    # every rank logged the same decisions at the same steps
    for r in 0 1 2; do
        sed -n 's/.*adapt: step \([0-9]*\) bucket \([0-9]*\) density \([0-9.e+-]*\) .*/\1 \2 \3/p' \
            "$TMP/$tag.$r.err" >"$TMP/$tag.$r.dec"
    done
    nd=$(wc -l <"$TMP/$tag.0.dec")
    if [ "$nd" -lt 100 ]; then
        fail "$rule: only $nd decisions logged"
    elif cmp -s "$TMP/$tag.0.dec" "$TMP/$tag.1.dec" && cmp -s "$TMP/$tag.0.dec" "$TMP/$tag.2.dec"; then
        pass "$rule: accuracy $a (fixed $facc), $(mb "$tag") MB; $nd decisions identical on 3 ranks"
    else
        fail "$rule: the ranks' decisions differ"
    fi
done

# budget alone splits the spec's total k (sum of ceil(0.01 n_j)) over the buckets
o="$TMP/budget.0.out"
if [ -s "$o" ]; then
    dens=$(sed -n 's/^adapt: epoch 3 .* buckets //p' "$o")
    got=$(printf '%s\n' "$dens" | awk -v sizes="$SIZES" '{
        n = split(sizes, s, " "); m = split($0, d, ",")
        if (n != m) { print "count"; exit }
        for (j = 1; j <= n; j++) { k += int(d[j] * s[j] + 0.5); want += int(s[j] * 0.01 + 0.999999) }
        print k, want }')
    set -- $got
    if [ "$#" -eq 2 ] && [ "$1" -eq "$2" ]; then
        pass "budget: k summed over the buckets $1, the spec's total $2 (densities $dens)"
    else
        fail "budget: k summed over the buckets against the spec's total: $got (densities $dens)"
    fi
    # the split is uneven: the small last layer gets more than the spec, the rest less or more
    printf '%s\n' "$dens" | awk -F, '{ exit !($1 > 0.02 && $6 < 0.02) }' ||
        fail "budget: fc3.bias did not get more density than fc1.weight ($dens)"
    ratio=$(awk -v a="$(mb budget)" -v b="$fmb" 'BEGIN { printf "%.3f", a / b }')
    awk -v r="$ratio" 'BEGIN { exit !(r > 0.97 && r < 1.10) }' ||
        fail "budget: $ratio of fixed top-k's bytes, expected about 1"
fi
# the stage starts at 1 and only falls as the reduced gradient's norm falls
o="$TMP/stage-budget.0.out"
if [ -s "$o" ]; then
    st=$(sed -n 's/^adapt: epoch [0-9]* .* stage \([0-9.]*\) .*/\1/p' "$o" | tr '\n' ' ')
    if printf '%s\n' "$st" | awk '{ exit !(NF == 3 && $1 <= 1 && $2 <= $1 && $3 <= $2 && $3 < 1) }'; then
        pass "stage+budget: the stage falls over the epochs: $st"
    else
        fail "stage+budget: the stage over the epochs: $st"
    fi
fi

# ranks that disagree on GCOLL_ADAPT: a clear error on every rank, at once
port=$(free_port)
pids=""
for r in 0 1; do
    a=budget
    [ "$r" -eq 1 ] && a=off
    GCOLL_RANK=$r GCOLL_SIZE=2 GCOLL_ROOT="127.0.0.1:$port" GCOLL_JOB_KEY=mismatch GCOLL_ADAPT=$a \
        GCOLL_TIMEOUT_MS=10s timeout 30 "$TRAIN" --data "$data" --limit 640 --epochs 1 \
        --compressor topk:density=0.01 >"$TMP/mm.$r" 2>&1 &
    pids="$pids $!"
    BG_PIDS="$BG_PIDS $!"
done
set -- $pids
wait "$1"; s0=$?
wait "$2"; s1=$?
if [ "$s0" -eq 1 ] && [ "$s1" -eq 1 ] && grep -q 'rank 0 has GCOLL_ADAPT=budget, rank 1 has GCOLL_ADAPT=off' "$TMP/mm.0" &&
    grep -q 'GCOLL_ERR_MISMATCH' "$TMP/mm.1"; then
    pass "GCOLL_ADAPT differs across ranks: $(grep -m1 -o 'ranks disagree on settings.*' "$TMP/mm.0")"
else
    fail "GCOLL_ADAPT differs across ranks: exit statuses $s0 $s1: $(tail -n 1 "$TMP/mm.0")"
fi

finish
