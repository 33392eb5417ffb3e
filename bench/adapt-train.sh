#!/bin/sh
# adapt-train.sh: docs/results/adaptation.md's training table: gcoll-train with fixed top-k 1% and
# with the statistical adaptation rules (GCOLL_ADAPT=snr, stage, budget, snr+bandwidth;
# top-k 1% as the spec, densities within GCOLL_DENSITY_MIN..MAX), on RANKS ranks, one run
# per rule and seed (a rule `uniform=D` is the unadapted top-k at density D, for a comparison
# at the same bytes): final test accuracy (mean and the seeds' min..max), total wire MB
# (every rank's bytes over the run, mean over the seeds), its ratio to fixed top-k's, and
# wall time. Prints a markdown table. With TRACE=FILE it also writes the density of every
# bucket at every step of the TRACE_RULE run of the first seed ("step bucket density" per
# line: rank 0's decisions, from GCOLL_DEBUG=debug GCOLL_DEBUG_SUBSYS=ADAPT) for
# bench/plot-adapt-layers.gp.
# usage: bench/adapt-train.sh [BUILDDIR]
# environment: RANKS (4), EPOCHS (5), SEEDS (1), RULES ("fixed snr stage budget
#   stage+budget snr+bandwidth"), DMIN (0.002), DMAX (0.1, the library's default), SPEC
#   (topk:density=0.01), LIMIT, DATA, WORKDIR, TRACE, TRACE_RULE (stage), WARMUP
#   (gcoll-train's --warmup-frac; its default 0.1),
#   RATE (unset: loopback through gcoll-run; e.g. 1gbit: one rank per network namespace, the
#   namespaces joined through a bridge by veth links shaped with tc tbf to RATE per
#   direction, ranks started by hand; needs root, removes its namespaces on exit)
set -eu
build=$(cd "${1:-.}" && pwd)
P=${RANKS:-4}
epochs=${EPOCHS:-5}
seeds=${SEEDS:-1}
rules=${RULES:-fixed snr stage budget stage+budget snr+bandwidth}
spec=${SPEC:-topk:density=0.01}
data=${DATA:-/usr/share/datasets/fashion-mnist}
work=${WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/adapt-train.XXXXXX")}
mkdir -p "$work"
unset GCOLL_COMPRESSOR GCOLL_LAYER_POLICY GCOLL_BUCKET_BYTES GCOLL_ADAPT
first_seed=${seeds%% *}
NS=gadt
teardown() {
    for i in $(seq 0 $((P - 1))); do ip netns del "$NS$i" 2>/dev/null || true; done
    ip netns del "${NS}br" 2>/dev/null || true
}
if [ -n "${RATE:-}" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "adapt-train: RATE needs root (network namespaces)" >&2; exit 1; }
    trap teardown EXIT
    trap 'teardown; exit 1' INT TERM
    teardown
    ip netns add "${NS}br"
    ip -n "${NS}br" link add br0 type bridge
    ip -n "${NS}br" link set br0 up
    for i in $(seq 0 $((P - 1))); do
        ip netns add "$NS$i"
        ip link add "ga$i" netns "$NS$i" type veth peer name "gab$i" netns "${NS}br"
        ip -n "$NS$i" addr add "10.81.0.$((i + 1))/24" dev "ga$i"
        ip -n "$NS$i" link set "ga$i" up
        ip -n "$NS$i" link set lo up
        ip -n "${NS}br" link set "gab$i" master br0
        ip -n "${NS}br" link set "gab$i" up
        tc -n "$NS$i" qdisc replace dev "ga$i" root tbf rate "$RATE" burst 512kb latency 100ms
        tc -n "${NS}br" qdisc replace dev "gab$i" root tbf rate "$RATE" burst 512kb latency 100ms
    done
fi
port=29900
# launch OUT ERR ARGS...: the job, rank 0's output to OUT and ERR
launch() {
    out=$1 err=$2
    shift 2
    if [ -z "${RATE:-}" ]; then
        timeout 1800 "$build/tools/gcoll-run" -q -n "$P" "$build/tools/gcoll-train" "$@" >"$out" 2>"$err"
        return
    fi
    port=$((port + 1))
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    pids=""
    for i in $(seq 0 $((P - 1))); do
        o=/dev/null e=/dev/null
        [ "$i" -eq 0 ] && o=$out e=$err
        ip netns exec "$NS$i" env GCOLL_RANK="$i" GCOLL_SIZE="$P" GCOLL_ROOT="10.81.0.1:$port" \
            GCOLL_JOB_KEY="$key" timeout 1800 "$build/tools/gcoll-train" "$@" >"$o" 2>"$e" &
        pids="$pids $!"
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    return $rc
}
for r in $rules; do
    for s in $seeds; do
        f="$work/$(printf '%s' "$r" | tr -c 'A-Za-z0-9' '-')-s$s"
        a=off rspec=$spec
        case $r in
        fixed) ;;
        uniform=*) rspec=topk:density=${r#uniform=} ;;
        *) a=$r ;;
        esac
        dbg=warn
        if [ -n "${TRACE:-}" ] && [ "$r" = "${TRACE_RULE:-stage}" ] && [ "$s" = "$first_seed" ]; then
            dbg=debug
        fi
        t0=$(date +%s.%N)
        if GCOLL_ADAPT=$a GCOLL_DENSITY_MIN=${DMIN:-0.002} GCOLL_DENSITY_MAX=${DMAX:-0.1} \
            GCOLL_DEBUG=$dbg GCOLL_DEBUG_SUBSYS=ADAPT \
            launch "$f.out" "$f.err" \
            --epochs "$epochs" --seed "$s" --data "$data" --compressor "$rspec" \
            ${LIMIT:+--limit "$LIMIT"} ${WARMUP:+--warmup-frac "$WARMUP"}; then
            t1=$(date +%s.%N)
            # the per-epoch r0_wire_MB column: rank 0's bytes, summed over the epochs
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
echo "(${P} ranks, ${epochs} epochs, density ${DMIN:-0.002}..${DMAX:-0.1}, links ${RATE:-loopback}; runs in $work; $(uptime | sed 's/.*load/load/'))"
