#!/bin/sh
# async-ratio.sh: steps/s of async SGD against synchronous SGD under the rotating straggler,
# measured as ratios of short runs taken back to back (A B C D A B C D ...), so that a
# machine whose load drifts during the measurement affects both sides of each ratio alike.
# Per configuration: the median steps/s, the median of the per-round ratios to the
# synchronous run of the same round, and the CPU seconds per step summed over the ranks
# (user + system, from the job's rusage; start-up and the final evaluation included, the
# same in every run), which on an oversubscribed machine bounds the
# steps/s: at most CORES / (CPU s per step). "compute alone" is local SGD that never
# synchronises (no communication, no waiting): the bound on any mode's steps/s here.
# S1 and S4 prefetch their pulls (gcoll-train's default); S4w is S4 with --prefetch off.
#   usage: bench/async-ratio.sh [ROUNDS [RANKS [STRAGGLE [EXAMPLES]]]]   (from the build dir)
# BATCH (64): examples per rank per step; larger batches make a step compute-bound.
set -u
R=${1:-5}
P=${2:-4}
F=${3:-2}
N=${4:-25600}
BATCH=${BATCH:-64}
B=${top_builddir:-.}
TMP=$(mktemp -d "$PWD/.async-ratio.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
cfgs="sync S1 S4 S4w alone"
args() {
    case $1 in
    sync) echo "--local-steps 1" ;;
    S1) echo "--async --staleness 1" ;;
    S4) echo "--async --staleness 4" ;;
    S4w) echo "--async --staleness 4 --prefetch off" ;;
    alone) echo "--local-steps 1000000" ;;
    esac
}
echo "$P ranks on $(nproc) cores, --straggle $F, batch $BATCH, $N examples (1 epoch) per run, $R rounds;" \
    "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$R"); do
    for c in $cfgs; do
        /usr/bin/time -f "%U %S" -o "$TMP/time" timeout 600 "$B/tools/gcoll-run" -q -n "$P" \
            "$B/tools/gcoll-train" --epochs 1 --limit "$N" --test-limit 1000 --straggle "$F" -b "$BATCH" \
            --lr-schedule constant \
            $(args $c) >"$TMP/out" 2>"$TMP/err" || {
            echo "$c round $r failed: $(tail -n 1 "$TMP/err")"
            continue
        }
        sps=$(sed -n 's/^steps per second: //p' "$TMP/out")
        cpu=$(awk '{print $1 + $2}' "$TMP/time")
        echo "$r $c $sps $cpu" >>"$TMP/all"
    done
done
steps=$((N / (BATCH * P)))
echo
echo "| run | steps/s (median) | x sync (median of rounds) | CPU s per step, all ranks |"
echo "| --- | --- | --- | --- |"
for c in $cfgs; do
    awk -v c="$c" -v steps="$steps" '
        { sps[$1, $2] = $3; cpu[$1, $2] = $4; if ($1 > R) R = $1 }
        function median(a, n,   i, j, t) {
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
                if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        END {
            n = 0; m = 0; k = 0
            for (r = 1; r <= R; r++) {
                if ((r, c) in sps) { s[++n] = sps[r, c]; u[++k] = cpu[r, c] / steps }
                if ((r, c) in sps && (r, "sync") in sps && sps[r, "sync"] > 0)
                    q[++m] = sps[r, c] / sps[r, "sync"]
            }
            if (n == 0) { printf "| %s | failed | | |\n", c; exit }
            printf "| %s | %.2f | %.2f | %.4f |\n", c, median(s, n), m ? median(q, m) : 0,
                median(u, k)
        }' "$TMP/all"
done
echo
echo "per round (round, run, steps/s, CPU s):"
cat "$TMP/all"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
