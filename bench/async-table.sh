#!/bin/sh
# async-table.sh: the async table of docs/results/local-sgd.md. Synchronous SGD (local SGD with
# H=1 and 'none', which the tests show equal to it) beside the SSP parameter server with
# S = 0, 1, 4, under a rotating straggler (--straggle 2) and a persistent one (--slow-rank
# P-1 --slow-factor 2), on P ranks of Fashion-MNIST; then the same with top-k 1% pushes
# and pulls and DC-ASGD; and, per straggler, the compute alone (local SGD with one sync at
# the end: no communication, no waiting), which bounds the steps/s any mode can reach on
# this machine. "x sync" is a row's steps/s over its straggler's synchronous row, both
# measured in this run. Prints a Markdown table and the load average before each row.
#   usage: bench/async-table.sh [EPOCHS [RANKS [ASYNC_FLAGS]]]   (from the build directory)
# ASYNC_FLAGS go to every --async row: "--prefetch off" gives the waited pulls of the table
# in docs/results/local-sgd.md (gcoll-train prefetches by default).
set -u
E=${1:-5}
P=${2:-4}
AF=${3:-}
B=${top_builddir:-.}
RUN="timeout 3600 $B/tools/gcoll-run -q -n $P $B/tools/gcoll-train --epochs $E --lr-schedule constant"
# (scratch in the current directory: a shared /tmp may be swept while the table runs)
TMP=$(mktemp -d "$PWD/.async-table.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
SYNC=0

row() { # row LABEL ARGS...
    label=$1
    shift
    load=$(cut -d' ' -f1 /proc/loadavg)
    if ! $RUN "$@" >"$TMP/out" 2>"$TMP/err"; then
        echo "| $label | failed: $(tail -n 1 "$TMP/err") | | | | | | | $load |"
        return
    fi
    acc=$(sed -n 's/^final test accuracy: //p' "$TMP/out")
    mb=$(sed -n 's/^total wire MB: //p' "$TMP/out")
    sps=$(sed -n 's/^steps per second: //p' "$TMP/out")
    gap=$(sed -n 's/^max clock gap: //p' "$TMP/out")
    st=$(sed -n 's/^mean staleness: //p' "$TMP/out")
    hist=$(sed -n 's/.*staleness histogram (tau: updates): //p' "$TMP/out")
    case $label in synchronous*) SYNC=$sps ;; esac
    ratio=$(awk -v a="$sps" -v b="$SYNC" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}')
    echo "| $label | $acc | $sps | $ratio | ${gap:--} | ${st:--} | ${hist:--} | $mb | $load |"
}

echo "$P ranks, $E epochs, batch 64 per rank, lr 0.05 (constant), momentum 0.9 (async with S > 0: 0.7, gcoll-train's default, unless ASYNC_FLAGS set it); async flags: ${AF:-none}; $(nproc) cores"
echo
echo "| run | test accuracy | steps/s (rank 0) | x sync | max clock gap | mean staleness | tau histogram | rank 0 wire MB | load before |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
TOPK="--compressor topk:density=0.01 --pull-compressor topk:density=0.01"
for strag in "--straggle 2" "--slow-rank $((P - 1)) --slow-factor 2"; do
    row "synchronous, $strag" --local-steps 1 $strag
    for S in 0 1 4; do
        row "async S=$S, $strag" --async --staleness $S $strag $AF
    done
    row "async S=1, top-k 1% push+pull, DC 0.04, $strag" --async --staleness 1 $AF $TOPK \
        --dc-lambda 0.04 $strag
    row "compute alone (no communication), $strag" --local-steps 1000000 $strag
done
