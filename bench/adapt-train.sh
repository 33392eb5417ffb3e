#!/bin/sh
# adapt-train.sh: docs/adaptation.md's training table: gcoll-train with fixed top-k 1% and
# with the statistical adaptation rules (GCOLL_ADAPT=snr, stage, budget, snr+bandwidth;
# top-k 1% as the spec, densities within GCOLL_DENSITY_MIN..MAX), on RANKS ranks, one run
# per rule and seed: final test accuracy (mean and the seeds' min..max), total wire MB
# (every rank's bytes over the run, mean over the seeds), its ratio to fixed top-k's, and
# wall time. Prints a markdown table. With TRACE=FILE it also writes the density of every
# bucket at every step of the TRACE_RULE run of the first seed ("step bucket density" per
# line: rank 0's decisions, from GCOLL_DEBUG=debug GCOLL_DEBUG_SUBSYS=ADAPT) for
# bench/plot-adapt-layers.gp.
# usage: bench/adapt-train.sh [BUILDDIR]
# environment: RANKS (4), EPOCHS (5), SEEDS (1), RULES ("fixed snr stage budget
#   snr+bandwidth"), DMIN (0.002), DMAX (0.02), SPEC (topk:density=0.01), LIMIT, DATA,
#   WORKDIR, TRACE, TRACE_RULE (stage), WARMUP (gcoll-train's --warmup-frac; its default 0.1)
set -eu
build=$(cd "${1:-.}" && pwd)
P=${RANKS:-4}
epochs=${EPOCHS:-5}
seeds=${SEEDS:-1}
rules=${RULES:-fixed snr stage budget snr+bandwidth}
spec=${SPEC:-topk:density=0.01}
data=${DATA:-/usr/share/datasets/fashion-mnist}
work=${WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/adapt-train.XXXXXX")}
mkdir -p "$work"
unset GCOLL_COMPRESSOR GCOLL_LAYER_POLICY GCOLL_BUCKET_BYTES GCOLL_ADAPT
first_seed=${seeds%% *}
for r in $rules; do
    for s in $seeds; do
        f="$work/$(printf '%s' "$r" | tr -c 'A-Za-z0-9' '-')-s$s"
        a=off
        [ "$r" = fixed ] || a=$r
        dbg=warn
        if [ -n "${TRACE:-}" ] && [ "$r" = "${TRACE_RULE:-stage}" ] && [ "$s" = "$first_seed" ]; then
            dbg=debug
        fi
        t0=$(date +%s.%N)
        if GCOLL_ADAPT=$a GCOLL_DENSITY_MIN=${DMIN:-0.002} GCOLL_DENSITY_MAX=${DMAX:-0.02} \
            GCOLL_DEBUG=$dbg GCOLL_DEBUG_SUBSYS=ADAPT \
            timeout 1800 "$build/tools/gcoll-run" -q -n "$P" "$build/tools/gcoll-train" \
            --epochs "$epochs" --seed "$s" --data "$data" --compressor "$spec" \
            ${LIMIT:+--limit "$LIMIT"} ${WARMUP:+--warmup-frac "$WARMUP"} >"$f.out" 2>"$f.err"; then
            t1=$(date +%s.%N)
            # the per-epoch wire_MB column sums every rank's bytes
            printf '%s %s %s %s\n' "$(sed -n 's/^final test accuracy: //p' "$f.out")" \
                "$(awk '$1 ~ /^[0-9]+$/ && NF == 9 { s += $5 } END { printf "%.2f", s }' "$f.out")" \
                "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')" "$r" >>"$work/results"
            echo "== $r seed $s: $(tail -n 1 "$work/results")" >&2
        else
            echo "== $r seed $s: failed: $(grep -m1 'gcoll-train:' "$f.err" || true)" >&2
        fi
        if [ "$dbg" = debug ]; then
            sed -n 's/.*\[0\] gcoll DEBUG ADAPT .*adapt: step \([0-9]*\) bucket \([0-9]*\) density \([0-9.e+-]*\) .*/\1 \2 \3/p' \
                "$f.err" >"$TRACE"
        fi
    done
done
echo "| rule | final test accuracy (mean, min..max over seeds $seeds) | total wire MB | bytes vs fixed | wall s |"
echo "| --- | --- | --- | --- | --- |"
for r in $rules; do
    awk -v r="$r" '
    FNR == NR && $4 == "fixed" { fb += $2; fn++ }
    FNR != NR && $4 == r { n++; a += $1; b += $2; t += $3
        if (n == 1 || $1 < lo) lo = $1; if (n == 1 || $1 > hi) hi = $1 }
    END { if (n) printf "| %s | %.4f (%.4f..%.4f) | %.1f | %.2f | %.0f |\n", r, a / n, lo, hi,
                 b / n, fn ? (b / n) / (fb / fn) : 0, t / n }' "$work/results" "$work/results"
done
echo "(${P} ranks, ${epochs} epochs, density ${DMIN:-0.002}..${DMAX:-0.02}; runs in $work; $(uptime | sed 's/.*load/load/'))"
