#!/bin/sh
# local-sgd-table.sh: the table of docs/results/local-sgd.md. Local SGD with H = 1, 2, 4, 8 and
# dense ('none') or top-k 1% deltas beside the bucketer's synchronous SGD, on P ranks of
# Fashion-MNIST; then the momentum choices at H = 4 with top-k 1%. Prints a Markdown table.
#   usage: bench/local-sgd-table.sh [EPOCHS [RANKS]]   (run from the build directory)
# Every run is bounded by timeout; wall time is the whole gcoll-run launch.
set -u
E=${1:-5}
P=${2:-4}
B=${top_builddir:-.}
RUN="timeout 1800 $B/tools/gcoll-run -q -n $P $B/tools/gcoll-train --epochs $E --lr-schedule constant"
# (scratch in the current directory: a shared /tmp may be swept while the table runs)
TMP=$(mktemp -d "$PWD/.lsgd-table.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM

row() { # row LABEL ARGS...
    label=$1
    shift
    t0=$(date +%s.%N)
    if ! $RUN "$@" >"$TMP/out" 2>"$TMP/err"; then
        echo "| $label | failed: $(tail -n 1 "$TMP/err") | | | |"
        return
    fi
    t1=$(date +%s.%N)
    acc=$(sed -n 's/^final test accuracy: //p' "$TMP/out")
    mb=$(sed -n 's/^total wire MB: //p' "$TMP/out")
    sps=$(sed -n 's/^steps per second: //p' "$TMP/out")
    awk -v l="$label" -v a="$acc" -v m="$mb" -v s="$sps" -v t0="$t0" -v t1="$t1" \
        -v base="${BASE_MB:-0}" 'BEGIN {
        r = (base > 0) ? sprintf("%.4f", m / base) : "1"
        printf "| %s | %s | %.1f | %s | %.1f | %.1f |\n", l, a, m, r, s, t1 - t0 }'
}

echo "$P ranks, $E epochs, batch 64 per rank, lr 0.05, momentum 0.9 (local unless stated)"
echo
echo "| run | test accuracy | rank 0 wire MB | bytes vs sync | steps/s | wall s |"
echo "| --- | --- | --- | --- | --- | --- |"
row "synchronous SGD (bucketer, none)" >"$TMP/base"
cat "$TMP/base"
BASE_MB=$(awk -F'|' '{gsub(/ /, "", $4); print $4}' "$TMP/base")
for c in none topk:density=0.01; do
    for H in 1 2 4 8; do
        row "local SGD H=$H, $c" --local-steps "$H" --compressor "$c"
    done
done
row "H=4, topk:density=0.01, momentum reset" --local-steps 4 --compressor topk:density=0.01 \
    --local-momentum reset
row "H=4, topk:density=0.01, momentum average" --local-steps 4 --compressor topk:density=0.01 \
    --local-momentum average
row "H=4, topk:density=0.01, 200 synchronous warm-up steps" --local-steps 4 \
    --compressor topk:density=0.01 --local-warmup 200
