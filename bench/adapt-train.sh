#!/bin/sh
# adapt-train.sh: docs/adaptation.md's training table: gcoll-train with fixed top-k 1% and
# with the statistical adaptation rules (GCOLL_ADAPT=snr, stage, budget, snr+bandwidth;
# top-k 1% as the spec, densities within GCOLL_DENSITY_MIN..MAX), one run each, on RANKS
# ranks: final test accuracy, total wire MB (all ranks' bytes over the run) and wall time.
# Prints a markdown table; with TRACE=FILE also writes the per-bucket density of every
# step of the TRACE_RULE run ("step bucket density" per line, rank 0's decisions, from
# GCOLL_DEBUG=debug GCOLL_DEBUG_SUBSYS=ADAPT) for bench/plot-adapt-layers.gp.
# usage: bench/adapt-train.sh [BUILDDIR]
# environment: RANKS (4), EPOCHS (5), SEED (1), RULES ("fixed snr stage budget
#   snr+bandwidth"), DMIN (0.002), DMAX (0.02), SPEC (topk:density=0.01), LIMIT, DATA,
#   WORKDIR, TRACE, TRACE_RULE (stage), WARMUP (gcoll-train's --warmup-frac, default 0.1)
set -eu
build=$(cd "${1:-.}" && pwd)
P=${RANKS:-4}
epochs=${EPOCHS:-5}
seed=${SEED:-1}
rules=${RULES:-fixed snr stage budget snr+bandwidth}
spec=${SPEC:-topk:density=0.01}
data=${DATA:-/usr/share/datasets/fashion-mnist}
work=${WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/adapt-train.XXXXXX")}
mkdir -p "$work"
unset GCOLL_COMPRESSOR GCOLL_LAYER_POLICY GCOLL_BUCKET_BYTES GCOLL_ADAPT
echo "| rule | final test accuracy | total wire MB | bytes vs fixed | wall s |"
echo "| --- | --- | --- | --- | --- |"
ref=""
for r in $rules; do
    f="$work/$(printf '%s' "$r" | tr -c 'A-Za-z0-9' '-')"
    a=off
    [ "$r" = fixed ] || a=$r
    dbg=warn
    [ -n "${TRACE:-}" ] && [ "$r" = "${TRACE_RULE:-stage}" ] && dbg=debug
    t0=$(date +%s.%N)
    if ! GCOLL_ADAPT=$a GCOLL_DENSITY_MIN=${DMIN:-0.002} GCOLL_DENSITY_MAX=${DMAX:-0.02} \
        GCOLL_DEBUG=$dbg GCOLL_DEBUG_SUBSYS=ADAPT \
        timeout 1800 "$build/tools/gcoll-run" -q -n "$P" "$build/tools/gcoll-train" \
        --epochs "$epochs" --seed "$seed" --data "$data" --compressor "$spec" \
        ${LIMIT:+--limit "$LIMIT"} ${WARMUP:+--warmup-frac "$WARMUP"} >"$f.out" 2>"$f.err"; then
        echo "| $r | failed: $(grep -m1 'gcoll-train:' "$f.err" || true) | | | |"
        continue
    fi
    t1=$(date +%s.%N)
    acc=$(sed -n 's/^final test accuracy: //p' "$f.out")
    # the per-epoch wire_MB column sums every rank's bytes
    mb=$(awk '$1 ~ /^[0-9]+$/ && NF == 9 { s += $5 } END { printf "%.2f", s }' "$f.out")
    [ -n "$ref" ] || ref=$mb
    rel=$(awk -v a="$mb" -v b="$ref" 'BEGIN { printf "%.2f", a / b }')
    echo "| $r | $acc | $mb | $rel | $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }') |"
    if [ "$dbg" = debug ]; then
        sed -n 's/.*\[0\] gcoll DEBUG ADAPT .*adapt: step \([0-9]*\) bucket \([0-9]*\) density \([0-9.e+-]*\) .*/\1 \2 \3/p' \
            "$f.err" >"$TRACE"
    fi
done
echo "(runs in $work; load: $(uptime | sed 's/.*load/load/'))"
