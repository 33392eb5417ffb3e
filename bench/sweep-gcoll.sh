#!/bin/bash
# sweep-gcoll.sh: gcoll-bench allreduce busbw under several GCOLL_* settings, interleaved and
# repeated (median), to pick defaults on a noisy machine. Used for docs/results/dense-allreduce.md.
#
# usage: bench/sweep-gcoll.sh -B BUILD [-n NP] [-r REPS] [-t] [-a "gcoll-bench args"] SETTING...
# Each SETTING is a space-separated list of VAR=VALUE (quote it), or "default" for none, e.g.
#   bench/sweep-gcoll.sh -B /tmp/build -n 4 default "GCOLL_RING_CHUNK=1mb" \
#       "GCOLL_TCP_NSOCKS=1"
# gcoll-bench runs with -a 3 -z 2 -c 0 (the slowest rank's time of blocking calls) before
# the -a ARGS. Prints one markdown table: size by setting, median busbw (GB/s), or with -t the time per
# operation (us), ± half the min-max range.
set -euo pipefail
build=${GCOLL_BUILD:-$PWD}
np=4
reps=3
args="-b 64K -e 64M -f 4 -n 10 -w 2"
col=7 # busbw_GBps; -t: time_us
while getopts "B:n:r:a:th" opt; do
    case $opt in
    B) build=$OPTARG ;;
    n) np=$OPTARG ;;
    r) reps=$OPTARG ;;
    a) args=$OPTARG ;;
    t) col=5 ;;
    *) sed -n '2,9p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || set -- default
raw=$(mktemp /tmp/gcoll-sweep.XXXXXX)
for rep in $(seq 1 "$reps"); do
    for i in $(seq 1 $#); do
        setting=${!i}
        xs=()
        [ "$setting" = default ] || for kv in $setting; do xs+=(-x "$kv"); done
        # shellcheck disable=SC2086 # $args is a list of flags
        timeout 300 "$build/tools/gcoll-run" -q -n "$np" -x GCOLL_TRANSPORT=tcp "${xs[@]}" \
            "$build/tools/gcoll-bench" -a 3 -z 2 -c 0 --csv $args 2>/dev/null |
            awk -F, -v i="$i" -v c="$col" 'NF == 15 && $1 ~ /^[0-9]+$/ { print i "," $1 "," $c }' >>"$raw" ||
            echo "sweep: '$setting' failed in repetition $rep" >&2
    done
done
{
    printf "| size |"
    for s in "$@"; do printf " %s |" "$s"; done
    echo
    printf "| ---: |"
    for s in "$@"; do printf " ---: |"; done
    echo
    awk -F, -v n=$# '
        { k = $1 SUBSEP $2; c[k]++; v[k, c[k]] = $3; sizes[$2] = 1 }
        function human(s) { return s >= 1048576 ? s / 1048576 " MiB" : s >= 1024 ? s / 1024 " KiB" : s " B" }
        END {
            ns = 0; for (s in sizes) ss[++ns] = s + 0
            for (i = 2; i <= ns; i++) { x = ss[i]; for (j = i - 1; j >= 1 && ss[j] > x; j--) ss[j + 1] = ss[j]; ss[j + 1] = x }
            for (a = 1; a <= ns; a++) {
                line = "| " human(ss[a]) " |"
                for (i = 1; i <= n; i++) {
                    k = i SUBSEP ss[a]; m = c[k]
                    if (!m) { line = line " - |"; continue }
                    for (x = 1; x <= m; x++) w[x] = v[k, x]
                    for (x = 2; x <= m; x++) { y = w[x]; for (j = x - 1; j >= 1 && w[j] > y; j--) w[j + 1] = w[j]; w[j + 1] = y }
                    med = m % 2 ? w[(m + 1) / 2] : (w[m / 2] + w[m / 2 + 1]) / 2
                    line = line sprintf(med >= 100 ? " %.0f ±%d%% |" : " %.3f ±%d%% |", med, med > 0 ? 50 * (w[m] - w[1]) / med + 0.5 : 0)
                }
                print line
            }
        }' "$raw"
}
rm -f "$raw"
