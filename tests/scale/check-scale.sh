#!/bin/sh
# check-scale.sh: every collective on 16, 32 and 64 ranks of this machine, started by hand
# and oversubscribed, with small tensors, checked against values computed independently;
# then split on 16 ranks. Prints the rendezvous time (init, as rank 0 logs it) and the
# wall time of each run. `make check-scale` runs it.
#   SCALE_RANKS (default "16 32 64"), SCALE_MODES, CHAOS_VARIANTS (default tcp)
. "$(dirname "$0")/../chaos/common.sh"
modes=${SCALE_MODES:-"bcast allreduce allgather reduce_scatter alltoall barrier sparse topk q8 mixed"}
variants_here=${CHAOS_VARIANTS:-tcp}
bad=0
printf '%-8s %5s %-15s %8s %8s %s\n' variant ranks collective init_ms wall_s failed
for var in $variants_here; do
    for n in ${SCALE_RANKS:-16 32 64}; do
        for mode in $modes; do
            t0=$(date +%s.%N)
            GCOLL_DEBUG=info start_ranks "$n" "$var" 240 "$EXIT_CHECK" "$mode" 3 257 1
            wait_ranks
            t1=$(date +%s.%N)
            failed=0 r=0
            while [ "$r" -lt "$n" ]; do
                rc=$(cat "$TMP/rc.$r" 2>/dev/null || echo lost)
                if [ "$rc" != 0 ]; then
                    failed=$((failed + 1))
                    [ "$failed" -le 3 ] && printf '  rank %d exited %s: %s\n' "$r" "$rc" \
                        "$(grep -v ' INFO ' "$TMP/err.$r" | tail -n 2 | tr '\n' ' ' | cut -c1-400)"
                fi
                r=$((r + 1))
            done
            init=$(sed -n 's/.*communicator ready: rank 0 of .* in \([0-9]*\) ms.*/\1/p' "$TMP/err.0")
            printf '%-8s %5d %-15s %8s %8.1f %d\n' "$var" "$n" "$mode" "${init:-?}" \
                "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$failed"
            bad=$((bad + failed))
        done
    done
done
SPLIT="$top_builddir/tests/integration/split_check"
for var in $variants_here; do
    start_ranks 16 "$var" 240 "$SPLIT"
    wait_ranks
    r=0 failed=0
    while [ "$r" -lt 16 ]; do
        [ "$(cat "$TMP/rc.$r" 2>/dev/null)" = 0 ] || failed=$((failed + 1))
        r=$((r + 1))
    done
    printf '%-8s %5d %-15s %8s %8s %d\n' "$var" 16 split - - "$failed"
    bad=$((bad + failed))
done
printf 'check-scale: %d failed rank(s)\n' "$bad"
[ "$bad" -eq 0 ]
