#!/bin/sh
# ef-table.sh: issue 27's error-feedback tables for docs/compressors.md: (1) the relative
# l2 error of the mean of STEPS compressed allreduces (AVG) of one fixed gradient per
# rank (COUNT floats, N(0,1), every 100th x10) against the exact mean, per codec and rank
# count (coll_check efmean); (2) each codec's peak RSS on one and two ranks for a
# gradient of BIG floats (coll_check rss). Writes them between the ef-mean and ef-memory
# markers of DOC.
# usage: bench/ef-table.sh [BUILDDIR]   (BUILDDIR holds tests/integration/coll_check)
# environment: STEPS (1000), COUNT (20000), RANKS ("1 2 4"), BIG (25000000), DOC
#   (docs/compressors.md), SKIP_MEM=1 (only the first table)
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-.}" && pwd)
steps=${STEPS:-1000}
count=${COUNT:-20000}
ranks=${RANKS:-1 2 4}
big=${BIG:-25000000}
doc=${DOC:-$src/docs/compressors.md}
run="$build/tools/gcoll-run"
check="$build/tests/integration/coll_check"
[ -x "$check" ] || { echo "no $check: make check TESTS= builds it" >&2; exit 2; }
unset GCOLL_COMPRESSOR GCOLL_EF_SPARE GCOLL_EF_SPARE_MAX GCOLL_COMPRESSED_ALGO
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ef-table.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

mean_specs="none fp16 bf16 q8 qsgd:bits=8 qsgd:bits=4 qsgd:bits=2 sign sign:chunk=8
sign:scale=l2 topk:density=0.01 topk:density=0.1 topk:density=0.01+q8
topk:density=0.01+qsgd topk:density=0.01+sign randomk:density=0.01
randomk:density=0.01,ef=0 threshold:tau=2 dgc:density=0.01,momentum=0
qsgd:bits=4,ef=0 topk:density=0.01,ef=0"
{
    printf '| codec |'
    for n in $ranks; do printf ' %s rank(s) |' "$n"; done
    printf '\n| --- |'
    for n in $ranks; do printf ' ---: |'; done
    printf '\n'
    for spec in $mean_specs; do
        printf '| `%s` |' "$spec"
        for n in $ranks; do
            v=$(timeout 600 "$run" -n "$n" --timeout 580 -q -- "$check" efmean "$spec" "$steps" \
                "$count" 2>&1 | sed -n 's/.*relative l2 error of the mean \([^,]*\),.*/\1/p' | head -1)
            printf ' %s |' "${v:-failed}"
        done
        printf '\n'
    done
} >"$tmp/mean"

mem_specs="dense none fp16 q8 qsgd:bits=4 qsgd:bits=4,ef=0 sign topk:density=0.01
topk:density=0.01+q8 topk:density=0.01,ef=0 randomk:density=0.01 threshold:tau=2
dgc:density=0.01 fp16:clip_value=1"
if [ "${SKIP_MEM:-0}" != 1 ]; then
    {
        printf '| codec | 1 rank | 2 ranks |\n| --- | ---: | ---: |\n'
        rss() {
            timeout 600 "$run" -n "$1" --timeout 580 -q $3 -- "$check" rss "$2" "$big" 3 2>&1 |
                sed -n 's/.*peak RSS \([0-9]*\) MiB.*/\1/p' | sort -n | tail -1
        }
        for spec in $mem_specs; do
            printf '| `%s` | %s | %s |\n' "$spec" "$(rss 1 "$spec" "")" "$(rss 2 "$spec" "")"
        done
        for spec in topk:density=0.01 randomk:density=0.01; do
            printf '| `%s`, `GCOLL_EF_SPARE_MAX=128mb` | %s | %s |\n' "$spec" \
                "$(rss 1 "$spec" "-x GCOLL_EF_SPARE_MAX=128mb")" \
                "$(rss 2 "$spec" "-x GCOLL_EF_SPARE_MAX=128mb")"
        done
    } >"$tmp/mem"
fi

# replace the lines between <!-- NAME:begin --> and <!-- NAME:end --> with FILE
put() {
    awk -v name="$1" -v file="$2" '
        $0 == "<!-- " name ":begin -->" { print; while ((getline l < file) > 0) print l; skip = 1; next }
        $0 == "<!-- " name ":end -->" { skip = 0 }
        !skip { print }' "$doc" >"$tmp/doc" && cat "$tmp/doc" >"$doc"
}
put ef-mean "$tmp/mean"
[ -f "$tmp/mem" ] && put ef-memory "$tmp/mem"
echo "wrote $doc"
