#!/bin/sh
# exit-campaign.sh [RUNS]: ranks that exit right after their last collective. For every
# collective (and a seeded mix), on 2, 3, 4, 5 and 8 ranks started by hand, over every
# transport variant: a short series checked against values computed independently, then
# gcoll_comm_destroy() and exit. Every rank of every run must exit 0.
#   RUNS          runs per (collective, rank count, variant), default 1
#   CHAOS_RANKS   rank counts (default "2 3 4 5 8"), CHAOS_MODES, CHAOS_VARIANTS
# Prints one line per cell and a total; exit status 1 if any rank failed.
. "$(dirname "$0")/common.sh"
runs=${1:-1}
modes=${CHAOS_MODES:-"bcast allreduce allgather reduce_scatter alltoall barrier sparse topk q8 mixed"}
total=0 bad=0
for var in $(variants); do
    for n in ${CHAOS_RANKS:-2 3 4 5 8}; do
        for mode in $modes; do
            cell_bad=0 i=0
            while [ "$i" -lt "$runs" ]; do
                start_ranks "$n" "$var" 60 "$EXIT_CHECK" "$mode" 8 1001 "$i"
                wait_ranks
                r=0
                while [ "$r" -lt "$n" ]; do
                    rc=$(cat "$TMP/rc.$r" 2>/dev/null || echo lost)
                    if [ "$rc" != 0 ]; then
                        cell_bad=$((cell_bad + 1))
                        printf '  %s %s ranks %s run %d: rank %d exited %s: %s\n' "$var" "$n" \
                            "$mode" "$i" "$r" "$rc" "$(tail -n 2 "$TMP/err.$r" | tr '\n' ' ')"
                    fi
                    r=$((r + 1))
                done
                i=$((i + 1))
            done
            total=$((total + runs))
            bad=$((bad + cell_bad))
            printf '%-8s %d ranks %-15s %d runs, %d failed rank(s)\n' "$var" "$n" "$mode" "$runs" \
                "$cell_bad"
        done
    done
done
printf 'exit campaign: %d runs, %d failed rank(s)\n' "$total" "$bad"
[ "$bad" -eq 0 ]
