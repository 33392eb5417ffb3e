#!/bin/sh
# model-plot.sh: the projection plot of docs/scaling.md ("Cost model"): gcoll-model table for
# 25M and 340M floats at 10 and 100 Gbit/s, 2 to 4,096 ranks, drawn by model-scaling.gp.
#   bench/model-plot.sh BUILD_DIR PARAMS OUT.png    (needs gnuplot)
# Extra gcoll-model table options (e.g. --alpha-us 25) go in MODEL_ARGS.
set -eu
BUILD=${1:?usage: model-plot.sh BUILD_DIR PARAMS OUT.png}
PARAMS=${2:?usage: model-plot.sh BUILD_DIR PARAMS OUT.png}
OUT=${3:?usage: model-plot.sh BUILD_DIR PARAMS OUT.png}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-model-plot.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
for c in 25000000 340000000; do
    for g in 10 100; do
        # shellcheck disable=SC2086
        "$BUILD/tools/gcoll-model" table -p "$PARAMS" -c $c --link-gbit $g ${MODEL_ARGS:-} \
            >"$TMP/t-$c-$g.dat"
    done
done
gnuplot -e "dir='$TMP'; outfile='$OUT'" "$(dirname "$0")/model-scaling.gp"
echo "model-plot: wrote $OUT"
