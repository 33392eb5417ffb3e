#!/bin/sh
# kill-campaign.sh [RUNS]: SIGKILL a random rank at a random moment of a mixed stream of
# collectives (dense allreduce of varied sizes, broadcast, allgather, reduce-scatter,
# alltoall, barrier, sparse, compressed top-k and q8), once every rank's init has
# returned, per transport variant. The survivors must fail with GCOLL_ERR_PEER (a dead
# peer, from the transport, not a timeout: GCOLL_TIMEOUT_MS is 60 s unless set): never
# hang, crash or return a wrong result.
#   RUNS            runs per variant (default 1)
#   CHAOS_RANKS     ranks per run (default 4), CHAOS_VARIANTS (default: every one built)
#   CHAOS_LIMIT_S   a survivor still running this long after the kill is a hang (30)
#   CHAOS_MAX_ERR_S the slowest survivor's error must come within this of the kill (2)
# Prints a table row per variant: runs, runs whose ranks did not all finish init (within
# CHAOS_LIMIT_S; nothing is killed in such a run), hangs, crashes, wrong results,
# survivors that did not fail, survivors that failed with another status than
# GCOLL_ERR_PEER, and the slowest survivor's error latency (median and maximum over runs).
# Exit status 1 on any run without init, hang, crash, wrong result, survivor without a
# failure or with another status, or a latency above CHAOS_MAX_ERR_S.
. "$(dirname "$0")/common.sh"
runs=${1:-1}
n=${CHAOS_RANKS:-4}
limit=${CHAOS_LIMIT_S:-30}
max_err=${CHAOS_MAX_ERR_S:-2}
seed=${CHAOS_SEED:-$$}
bad=0
export GCOLL_TIMEOUT_MS="${GCOLL_TIMEOUT_MS:-60s}"
rand() { # rand MOD: a number in [0, MOD) from the campaign's own generator
    seed=$(( (seed * 1103515245 + 12345) % 2147483648 ))
    echo $(( (seed / 65536) % $1 ))
}
printf '%-8s %5s %7s %6s %8s %6s %12s %9s %10s %10s\n' variant runs no-init hangs crashes wrong \
    not-failed not-peer median_s max_s
for var in $(variants); do
    noinit=0 hangs=0 crashes=0 wrong=0 unfailed=0 notpeer=0 i=0
    : >"$TMP/lat"
    while [ "$i" -lt "$runs" ]; do
        start_ranks "$n" "$var" $((limit + 30)) "$EXIT_CHECK" mixed 1000000 1001 "$(rand 100000)"
        victim=$(rand "$n")
        if ! wait_ready "$n" "$limit"; then
            noinit=$((noinit + 1))
            printf '  %s run %d: rank %d did not finish init (nothing killed): %s\n' "$var" "$i" \
                "$NOT_READY" "$(tail -n 2 "$TMP/err.$NOT_READY" | tr '\n' ' ')"
            r=0
            while [ "$r" -lt "$n" ]; do
                kill -9 "$(rank_pid "$r")" 2>/dev/null
                r=$((r + 1))
            done
            wait_ranks
            i=$((i + 1))
            continue
        fi
        # 0 to 2 s past every rank's init: in the middle of the stream
        sleep "$(awk -v r="$(rand 2000)" 'BEGIN { printf "%.3f", r / 1000 }')"
        vp=$(rank_pid "$victim")
        t_kill=$(date +%s.%N)
        [ -n "$vp" ] && kill -9 "$vp" 2>/dev/null
        # a survivor still running after the limit is a hang
        end=$(( $(date +%s) + limit ))
        while [ "$(date +%s)" -lt "$end" ]; do
            left=0
            r=0
            while [ "$r" -lt "$n" ]; do
                [ -f "$TMP/rc.$r" ] || left=$((left + 1))
                r=$((r + 1))
            done
            [ "$left" -eq 0 ] && break
            sleep 0.05
        done
        r=0 slowest=0
        while [ "$r" -lt "$n" ]; do
            if [ "$r" -eq "$victim" ]; then r=$((r + 1)); continue; fi
            if [ ! -f "$TMP/rc.$r" ]; then
                hangs=$((hangs + 1))
                printf '  %s run %d: rank %d still running %ds after the kill of rank %d\n' \
                    "$var" "$i" "$r" "$limit" "$victim"
                kill -9 "$(rank_pid "$r")" 2>/dev/null
                r=$((r + 1))
                continue
            fi
            rc=$(cat "$TMP/rc.$r")
            case "$rc" in
            2 | 3)
                # the error's time, printed by the rank (init failures print none)
                t=$(sed -n 's/.* failed at \([0-9.]*\):.*/\1/p' "$TMP/err.$r" | head -n 1)
                [ -n "$t" ] && slowest=$(awk -v a="$slowest" -v t="$t" -v k="$t_kill" \
                    'BEGIN { d = t - k; print (d > a ? d : a) }')
                s=$(sed -n 's/.* failed at [0-9.]*: \(GCOLL_[A-Z_]*\).*/\1/p' "$TMP/err.$r" | head -n 1)
                if [ "$s" != GCOLL_ERR_PEER ]; then
                    notpeer=$((notpeer + 1))
                    printf '  %s run %d: rank %d failed with %s, not GCOLL_ERR_PEER: %s\n' "$var" \
                        "$i" "$r" "${s:-no status}" "$(head -n 1 "$TMP/err.$r")"
                fi ;;
            1) wrong=$((wrong + 1))
               printf '  %s run %d: rank %d: %s\n' "$var" "$i" "$r" "$(grep WRONG "$TMP/err.$r")" ;;
            0) unfailed=$((unfailed + 1))
               printf '  %s run %d: rank %d exited 0 after the kill\n' "$var" "$i" "$r" ;;
            *) crashes=$((crashes + 1))
               printf '  %s run %d: rank %d exited %s: %s\n' "$var" "$i" "$r" "$rc" \
                   "$(tail -n 3 "$TMP/err.$r" | tr '\n' ' ')" ;;
            esac
            r=$((r + 1))
        done
        echo "$slowest" >>"$TMP/lat"
        wait_ranks
        i=$((i + 1))
    done
    stats=$(sort -g "$TMP/lat" | awk '{ v[NR] = $1 } END { printf "%.3f %.3f", v[int((NR + 1) / 2)], v[NR] }')
    med=${stats% *} max=${stats#* }
    printf '%-8s %5d %7d %6d %8d %6d %12d %9d %10s %10s\n' "$var" "$runs" "$noinit" "$hangs" \
        "$crashes" "$wrong" "$unfailed" "$notpeer" "$med" "$max"
    slow=$(awk -v m="$max" -v b="$max_err" 'BEGIN { print (m > b) }')
    [ $((noinit + hangs + crashes + wrong + unfailed + notpeer + slow)) -eq 0 ] || bad=1
done
exit "$bad"
