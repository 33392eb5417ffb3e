#!/bin/sh
# train-table.sh: issue 10's table: gcoll-train with each gradient codec for a fixed number
# of epochs and seed; writes the table (final test accuracy, wire bytes relative to dense
# fp32) into docs/training.md between its train-table markers, and the per-epoch test
# accuracy plot to docs/img/train-accuracy.png (gnuplot, bench/train-accuracy.gp).
# usage: bench/train-table.sh [BUILDDIR]   (BUILDDIR holds tools/gcoll-train; default .)
# environment: EPOCHS (5), RANKS (2), SEED (1), BATCH (64 per rank), LR (0.05),
#   DATA (Fashion-MNIST directory), LIMIT (train on the first N examples: smoke runs), WORKDIR (keeps the per-method CSV files),
#   DOC (docs/training.md), MARK (train-table: the table goes between <!-- MARK:begin -->
#   and <!-- MARK:end -->), PNG (docs/img/train-accuracy.png), REUSE=1 (keep the
#   methods WORKDIR already has results for: rerun only new or failed ones)
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-.}" && pwd)
epochs=${EPOCHS:-5}
ranks=${RANKS:-2}
seed=${SEED:-1}
batch=${BATCH:-64}
lr=${LR:-0.05}
data=${DATA:-/usr/share/datasets/fashion-mnist}
work=${WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/train-table.XXXXXX")}
doc=${DOC:-$src/docs/training.md}
png=${PNG:-$src/docs/img/train-accuracy.png}
mark=${MARK:-train-table}
mkdir -p "$work"
[ -x "$build/tools/gcoll-train" ] || { echo "no $build/tools/gcoll-train: pass the build directory" >&2; exit 2; }
unset GCOLL_COMPRESSOR GCOLL_LAYER_POLICY GCOLL_BUCKET_BYTES

# DGC's warm-up spans the first epoch (the paper warms up over 4 of ~90 epochs; 5 epochs
# here leave no room for more).
warm=$((60000 / (batch * ranks)))

# name|spec|extra flags (one method per line)
methods="dense fp32|none|
top-k 0.1%, no EF|topk:density=0.001,ef=0|
top-k 0.1% + EF|topk:density=0.001|
DGC 0.1%|dgc:density=0.001,momentum=0.9,warmup_steps=$warm,schedule=exp|
random-k 1% + EF|randomk:density=0.01,seed=1|
random-k 1% + EF, no momentum|randomk:density=0.01,seed=1|--momentum 0
random-k 1%, unbiased, no EF|randomk:density=0.01,seed=1,unbiased=1,ef=0|
sign + EF (EF-SignSGD)|sign|
sign + EF, no momentum|sign|--momentum 0
qsgd 4-bit|qsgd:bits=4,ef=0|
top-k 1% + q8 + EF|topk:density=0.01+q8|"

slug() { printf '%s' "$1" | tr -c 'A-Za-z0-9' '-'; }
echo "$methods" | while IFS='|' read -r name spec extra; do
    f="$work/$(slug "$name")"
    printf '%s|%s|%s\n' "$name" "$spec" "$extra" >"$f.name"
    if [ "${REUSE:-0}" = 1 ] && grep -q '^final test accuracy' "$f.csv" 2>/dev/null; then
        echo "== $name: kept from $f.csv" >&2
        continue
    fi
    echo "== $name: $spec $extra" >&2
    # shellcheck disable=SC2086
    if ! timeout 1200 "$build/tools/gcoll-run" -q -n "$ranks" "$build/tools/gcoll-train" \
        --csv --epochs "$epochs" --seed "$seed" --batch "$batch" --lr "$lr" --data "$data" \
        --compressor "$spec" $extra ${LIMIT:+--limit "$LIMIT"} >"$f.csv" 2>"$f.err"; then
        echo "   failed: $(grep -m1 'gcoll-train:' "$f.err")" >&2
        continue
    fi
    grep -E '^[0-9]' "$f.csv" | tail -n 1 |
        awk -F, '{printf "   acc %s, wire %.1f MB, %.1f s/epoch\n", $4, $5 / 1e6, $7}' >&2
done

n=$(echo "$methods" | wc -l)
files=$(echo "$methods" | while IFS='|' read -r name spec extra; do echo "$work/$(slug "$name")"; done)
first=$(echo "$files" | head -n 1)
dense_wire=$(grep -E '^[0-9]' "$first.csv" | awk -F, '{s += $5} END {print s + 0}')
dense_acc=$(sed -n 's/^final test accuracy: //p' "$first.csv")

# the table (markdown) and the plot's data: epoch, then one accuracy column per method
{
    echo "| method | codec spec | final test accuracy | vs dense (points) | best epoch | wire bytes / dense | s per epoch |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
    for f in $files; do
        IFS='|' read -r name spec extra <"$f.name"
        acc=$(sed -n 's/^final test accuracy: //p' "$f.csv")
        if [ -z "$acc" ]; then
            why=$(sed -n 's/^gcoll-train: rank [0-9]*: \(.*\): try.*/\1/p; t; s/^gcoll-train: rank [0-9]*: \(.*\)$/\1/p' "$f.err" | head -n 1)
            echo "| $name | \`$spec\`${extra:+ $extra} | ${why:-failed} | | | | |"
        else
            grep -E '^[0-9]' "$f.csv" | awk -F, -v name="$name" -v spec="$spec" \
                -v extra="$extra" -v dw="$dense_wire" -v da="$dense_acc" -v acc="$acc" '
                { w += $5; t += $7; if ($4 > best) best = $4; e++ }
                END { printf "| %s | `%s`%s | %.4f | %+.2f | %.4f | %.4f | %.1f |\n", name, spec,
                      extra == "" ? "" : " " extra, acc, 100 * (acc - da), best, w / dw, t / e }'
        fi
    done
} >"$work/table.md"
{
    printf 'epoch'
    for f in $files; do
        printf '\t"%s"' "$(cut -d'|' -f1 "$f.name")"
    done
    printf '\n'
    e=1
    while [ "$e" -le "$epochs" ]; do
        printf '%d' "$e"
        for f in $files; do
            a=$(awk -F, -v e="$e" '$1 == e {print $4}' "$f.csv" 2>/dev/null)
            printf '\t%s' "${a:-NaN}"
        done
        printf '\n'
        e=$((e + 1))
    done
} >"$work/acc.dat"

cat "$work/table.md"
setup="$ranks ranks, $epochs epochs, seed $seed, batch $batch per rank, lr $lr, momentum 0.9 (0 on DGC's output), $(grep -m1 '^# gcoll-train' "$first.csv" | sed 's/^# gcoll-train: [0-9]* ranks* (\([a-z]*\)), /\1 transport, /')"
if [ -f "$doc" ] && grep -q "<!-- $mark:begin -->" "$doc"; then
    awk -v table="$work/table.md" -v setup="$setup" -v mark="$mark" '
        $0 == "<!-- " mark ":end -->" { skip = 0 }
        !skip { print }
        $0 == "<!-- " mark ":begin -->" {
            print ""; print "Setup: " setup "."; print ""
            while ((getline line < table) > 0) print line
            print ""; skip = 1 }' "$doc" >"$work/doc.md"
    cp "$work/doc.md" "$doc"
    echo "updated $doc" >&2
fi
if command -v gnuplot >/dev/null 2>&1; then
    mkdir -p "$(dirname "$png")"
    gnuplot -e "datafile='$work/acc.dat'; outfile='$png'; ncols=$((n + 1)); subtitle='$ranks ranks, $epochs epochs, seed $seed, batch $batch per rank, lr $lr (runs that diverged are not drawn)'" \
        "$src/bench/train-accuracy.gp" 2>&1 | grep -v "no valid points" >&2 || true
    echo "wrote $png" >&2
else
    echo "gnuplot not found (Debian: gnuplot-nox): no plot" >&2
fi
echo "CSV files in $work" >&2
