#!/bin/sh
# train-table.sh: docs/results/training.md's measured table: gcoll-train with each gradient codec,
# gcoll-train's defaults (5 epochs, cosine lr, momentum 0.9, or 0 on DGC's tensors; warm-up
# of the sparsifiers over 10% of the steps), seeds 1-3, on 2 and 4 ranks. Writes one table per
# rank count between docs/results/training.md's <!-- train-table-P:begin/end --> markers (final
# test accuracy mean and spread over the seeds, difference from dense, wire bytes over
# dense) and draws docs/img/train-accuracy.png (test accuracy per epoch, mean over the
# seeds; gnuplot, bench/train-accuracy.gp).
# usage: bench/train-table.sh [BUILDDIR]   (BUILDDIR holds tools/gcoll-train; default .)
# environment: RANKS ("2 4"), SEEDS ("1 2 3"), EPOCHS (5), ROWS (extended regex on the
#   method names: which rows run, default all; ROWS4 the same for 4 ranks), DATA
#   (Fashion-MNIST directory), LIMIT (train on the first N examples: smoke runs),
#   WORKDIR (keeps the per-run CSV files), REUSE=1 (keep runs WORKDIR already has),
#   DOC (docs/results/training.md), PNG (docs/img/train-accuracy.png)
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-.}" && pwd)
epochs=${EPOCHS:-5}
seeds=${SEEDS:-1 2 3}
ranks_list=${RANKS:-2 4}
data=${DATA:-/usr/share/datasets/fashion-mnist}
work=${WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/train-table.XXXXXX")}
doc=${DOC:-$src/docs/results/training.md}
png=${PNG:-$src/docs/img/train-accuracy.png}
mkdir -p "$work"
[ -x "$build/tools/gcoll-train" ] || { echo "no $build/tools/gcoll-train: pass the build directory" >&2; exit 2; }
unset GCOLL_COMPRESSOR GCOLL_LAYER_POLICY GCOLL_BUCKET_BYTES

# name|spec[|policy] (one method per line; the first is the dense reference)
methods="dense fp32|none
top-k 0.1% + EF|topk:density=0.001
top-k 0.1%, no EF|topk:density=0.001,ef=0
DGC 0.1%|dgc:density=0.001
DGC 0.1%, every tensor|dgc:density=0.001|*=dgc:density=0.001
DGC 1%|dgc:density=0.01
top-k 1% + q8 + EF|topk:density=0.01+q8
random-k 1% + EF|randomk:density=0.01
sign + EF|sign
sign + EF, one scale per tensor|sign:chunk=0
QSGD 4-bit + EF|qsgd:bits=4
QSGD 2-bit + EF|qsgd:bits=2
fp16|fp16"

slug() { printf '%s' "$1" | tr -c 'A-Za-z0-9' '-'; }

# run P NAME SPEC SEED [POLICY]: one training run, its CSV in $work
run() {
    f="$work/$1-$(slug "$2")-s$4"
    if [ "${REUSE:-0}" = 1 ] && grep -q '^final test accuracy' "$f.csv" 2>/dev/null; then
        return 0
    fi
    t0=$(date +%s)
    if timeout 1800 "$build/tools/gcoll-run" -q -n "$1" "$build/tools/gcoll-train" --csv \
        --epochs "$epochs" --seed "$4" --data "$data" --compressor "$3" \
        ${5:+--policy "$5"} ${LIMIT:+--limit "$LIMIT"} >"$f.csv" 2>"$f.err"; then
        echo "== $1 ranks, $2, seed $4: $(sed -n 's/^final test accuracy: //p' "$f.csv") ($(($(date +%s) - t0)) s)" >&2
    else
        echo "== $1 ranks, $2, seed $4: failed: $(grep -m1 'gcoll-train:' "$f.err")" >&2
    fi
}

for P in $ranks_list; do
    sel=${ROWS:-.}
    [ "$P" = 4 ] && sel=${ROWS4:-$sel}
    echo "$methods" | while IFS='|' read -r name spec policy; do
        # the dense reference always runs: the other rows are measured against it
        [ "$spec" = none ] || printf '%s\n' "$name" | grep -Eq -- "$sel" || continue
        for s in $seeds; do run "$P" "$name" "$spec" "$s" "$policy"; done
    done
done

# stats P NAME: "seeds ok mean spread wire" over the seeds' runs (wire: total bytes); a
# run that failed, or ended at chance accuracy (10 classes: below 0.2), has diverged
stats() {
    for s in $seeds; do
        f="$work/$1-$(slug "$2")-s$s.csv"
        acc=$(sed -n 's/^final test accuracy: //p' "$f" 2>/dev/null)
        wire=$(grep -E '^[0-9]+,' "$f" 2>/dev/null | awk -F, '{w += $5} END {print w + 0}')
        [ -e "$f" ] && echo "${acc:-x} $wire"
    done | awk '{ n++; if ($1 == "x" || $1 < 0.2) next; ok++; a[ok] = $1; s += $1; w += $2
                  if (ok == 1 || $1 < lo) lo = $1; if (ok == 1 || $1 > hi) hi = $1 }
                END { if (ok) printf "%d %d %.6f %.6f %.0f\n", n, ok, s / ok, (hi - lo) / 2, w / ok
                      else printf "%d 0 0 0 0\n", n }'
}

# why P NAME: how the first seed's failed run ended
why() {
    f="$work/$1-$(slug "$2")-s$(echo $seeds | cut -d' ' -f1)"
    e=$(grep -cE '^[0-9]' "$f.csv" 2>/dev/null) || true
    e=$((${e:-0} + 1))
    if grep -q 'the loss diverged' "$f.err"; then
        sed -n 's/^gcoll-train: rank [0-9]*: the loss diverged (\([^)]*\)) at \(epoch [0-9]* step [0-9]*\).*/loss \1 at \2/p' "$f.err" | head -n 1
    elif acc=$(sed -n 's/^final test accuracy: //p' "$f.csv") && [ -n "$acc" ]; then
        echo "accuracy at chance ($acc) after the last epoch"
    elif grep -q 'non-finite value' "$f.err"; then
        echo "the residual overflowed (a non-finite value in the codec) in epoch $e"
    else
        echo "failed in epoch $e: $(grep -m1 'gcoll-train:' "$f.err" | cut -c1-80)"
    fi
}

tables=""
for P in $ranks_list; do
    dense=$(stats "$P" "dense fp32")
    set -- $dense
    dacc=$3
    dwire=$5
    if [ "$2" = 0 ]; then
        echo "no dense run on $P ranks: no table" >&2
        continue
    fi
    tab="$work/table-$P.md"
    {
        echo "| method | codec spec | final test accuracy (mean ± spread) | vs dense (points) | wire bytes / dense |"
        echo "| --- | --- | --- | --- | --- |"
        echo "$methods" | while IFS='|' read -r name spec policy; do
            [ -n "$policy" ] && spec="$spec\` with \`--policy '$policy'"
            set -- $(stats "$P" "$name")
            [ "$1" -gt 0 ] || continue
            if [ "$2" = 0 ]; then
                echo "| $name | \`$spec\` | diverged on all $1 seeds (seed $(echo $seeds | cut -d' ' -f1): $(why "$P" "$name")) | | |"
                continue
            fi
            note=""
            [ "$2" -lt "$1" ] && note=" over $2 seeds; $(($1 - $2)) of $1 diverged"
            awk -v n="$name" -v sp="$spec" -v m="$3" -v sd="$4" -v w="$5" -v da="$dacc" \
                -v dw="$dwire" -v ok="$2" -v note="$note" 'BEGIN {
                printf "| %s | `%s` | %.4f ± %.4f%s | %+.2f | %.4f |\n", n, sp, m, sd, note,
                       100 * (m - da), w / dw }'
        done
    } >"$tab"
    # plot data: epoch, then the mean test accuracy over the seeds per method
    {
        printf 'epoch'
        echo "$methods" | while IFS='|' read -r name spec; do printf '\t"%s"' "$name"; done
        printf '\n'
        e=1
        while [ "$e" -le "$epochs" ]; do
            printf '%d' "$e"
            echo "$methods" | while IFS='|' read -r name spec; do
                for s in $seeds; do # the seeds that did not diverge
                    f="$work/$P-$(slug "$name")-s$s.csv"
                    fin=$(sed -n 's/^final test accuracy: //p' "$f" 2>/dev/null)
                    awk -v a="${fin:-0}" 'BEGIN {exit !(a >= 0.2)}' || continue
                    awk -F, -v e="$e" '$1 == e && NF >= 8 {print $4}' "$f"
                done | awk '{s += $1; n++} END {if (n) printf "\t%.4f", s / n; else printf "\tNaN"}'
            done
            printf '\n'
            e=$((e + 1))
        done
    } >"$work/acc-$P.dat"
    cat "$tab"
    setup="$P ranks, $epochs epochs, seeds $(echo $seeds | tr ' ' ','), gcoll-train's defaults (batch 64 per rank, lr 0.05 with the cosine schedule, momentum 0.9 before compression for codecs with error feedback and on the reduced gradient for the others, DGC's own on its tensors, DGC's layer rule (output layer and tensors of at most 2/density elements dense) unless a policy is given, sparsifiers warmed up from dense over 10% of the steps, one bucket per tensor), $(grep -m1 '^# gcoll-train' "$work/$P-$(slug "dense fp32")-s$(echo $seeds | cut -d' ' -f1).csv" | sed 's/^# gcoll-train: [0-9]* ranks* (\([a-z]*\)), /\1 transport, /')"
    mark="train-table-$P"
    if [ -f "$doc" ] && grep -q "<!-- $mark:begin -->" "$doc"; then
        awk -v table="$tab" -v setup="$setup" -v mark="$mark" '
            $0 == "<!-- " mark ":end -->" { skip = 0 }
            !skip { print }
            $0 == "<!-- " mark ":begin -->" {
                print ""; print "Setup: " setup "."; print ""
                while ((getline line < table) > 0) print line
                print ""; skip = 1 }' "$doc" >"$work/doc.md"
        cp "$work/doc.md" "$doc"
        echo "updated $doc ($mark)" >&2
    fi
    tables="$tables $P"
done

if command -v gnuplot >/dev/null 2>&1 && [ -n "$tables" ]; then
    mkdir -p "$(dirname "$png")"
    files=""
    for P in $tables; do files="$files $work/acc-$P.dat"; done
    n=$(echo "$methods" | wc -l)
    gnuplot -e "files='$files'; ranks='$tables'; outfile='$png'; ncols=$((n + 1)); subtitle='$epochs epochs, mean over seeds $(echo $seeds | tr ' ' ','); gcoll-train defaults (runs that diverged are not drawn)'" \
        "$src/bench/train-accuracy.gp" 2>&1 | grep -v "no valid points" >&2 || true
    echo "wrote $png" >&2
else
    echo "gnuplot not found (Debian: gnuplot-nox) or no table: no plot" >&2
fi
echo "CSV files in $work" >&2
