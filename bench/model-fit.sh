#!/bin/sh
# model-fit.sh: the fits and checks of docs/scaling.md ("Cost model") from the committed
# measurements: the 1 Gbit/s link in two bands (alpha from 4 KiB and less, then beta, gamma
# and kappa from 1 MiB and more with alpha fixed), fitted on 2 and 4 ranks and checked on
# 2-8; the two hosts of bench/hier-shaped.sh; loopback in the same two bands.
#   bench/model-fit.sh BUILD_DIR [OUT_DIR]   (writes OUT_DIR/*.params, default a temp dir)
set -eu
BUILD=${1:?usage: model-fit.sh BUILD_DIR [OUT_DIR]}
B=$(dirname "$0")
M="$BUILD/tools/gcoll-model"
OUT=${2:-$(mktemp -d "${TMPDIR:-/tmp}/gcoll-model-fit.XXXXXX")}
mkdir -p "$OUT"
CB="--codec-bench $B/model-codec.txt"
$M fit --fastest --cores 2 $CB -R 2,4 -S 0:4K -o "$OUT/model-1gbit-lat.params" "$B/model-1gbit.csv"
A=$(awk '$1 == "alpha" { print $2 * 1e6 }' "$OUT/model-1gbit-lat.params")
$M fit --fastest --cores 2 --alpha-us "$A" $CB -R 2,4 -S 1M -o "$OUT/model-1gbit.params" \
    "$B/model-1gbit.csv"
echo "## 1 Gbit/s, 16 MiB and more"
$M check --fastest -p "$OUT/model-1gbit.params" -S 16M --md "$B/model-1gbit.csv"
for r in 2 3 4 6 8; do
    printf '%s ranks, 1 MiB and more: ' $r
    $M check --fastest -p "$OUT/model-1gbit.params" -R $r -S 1M "$B/model-1gbit.csv" | tail -1
    printf '%s ranks, 4 KiB and less: ' $r
    $M check --fastest -p "$OUT/model-1gbit-lat.params" -R $r -S 0:4K "$B/model-1gbit.csv" | tail -1
done
echo "## two hosts of 2 ranks (hier-shaped.sh): flat on 2 cores, hierarchical 1 core per host"
grep -v ',2,1$' "$B/model-hier.csv" >"$OUT/model-flat.tmp"
grep -e '^link' -e ',2,1$' "$B/model-hier.csv" >"$OUT/model-hier.tmp"
$M check --fastest -p "$OUT/model-1gbit.params" "$OUT/model-flat.tmp"
$M check --fastest -p "$OUT/model-1gbit.params" --cores 1 "$OUT/model-hier.tmp"
echo "## loopback"
$M fit --fastest --cores 2 $CB -R 2,4 -S 0:256K -o "$OUT/model-loopback-lat.params" \
    "$B/model-loopback.csv"
$M fit --fastest --cores 2 $CB -R 2,4 -S 1M -o "$OUT/model-loopback.params" "$B/model-loopback.csv"
for r in 2 3 4 6 8; do
    printf '%s ranks, 256 KiB and less: ' $r
    $M check --fastest -p "$OUT/model-loopback-lat.params" -R $r -S 0:256K "$B/model-loopback.csv" |
        tail -1
    printf '%s ranks, 1 MiB and more: ' $r
    $M check --fastest -p "$OUT/model-loopback.params" -R $r -S 1M "$B/model-loopback.csv" | tail -1
done
rm -f "$OUT/model-flat.tmp" "$OUT/model-hier.tmp"
echo "model-fit: parameters in $OUT"
