#!/bin/sh
# dgc-trace.sh: what DGC's compression does to each layer of gcoll-train's MLP over the
# steps, from the bucketer's debug trace (GCOLL_DEBUG=debug, subsystem COMPRESS): the
# density in force, the fraction of each tensor the reduced gradient updates, and the norm
# of what stays behind (DGC's accumulation) against the step's gradient. Draws
# docs/img/dgc-trace.png (gnuplot, bench/dgc-trace.gp) and prints per-epoch means.
# usage: bench/dgc-trace.sh [BUILDDIR] [SPEC]   (default . and dgc:density=0.001)
# environment: RANKS (2), SEED (1), EPOCHS (5), DATA, PNG (docs/img/dgc-trace.png),
#   WORKDIR (keeps the trace), EXTRA (more gcoll-train flags)
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-.}" && pwd)
spec=${2:-dgc:density=0.001}
work=${WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/dgc-trace.XXXXXX")}
png=${PNG:-$src/docs/img/dgc-trace.png}
data=${DATA:-/usr/share/datasets/fashion-mnist}
mkdir -p "$work"
unset GCOLL_COMPRESSOR GCOLL_LAYER_POLICY GCOLL_BUCKET_BYTES
# shellcheck disable=SC2086
timeout 1800 "$build/tools/gcoll-run" -n "${RANKS:-2}" -x GCOLL_DEBUG=debug \
    -x GCOLL_DEBUG_SUBSYS=COMPRESS "$build/tools/gcoll-train" --csv --data "$data" \
    --epochs "${EPOCHS:-5}" --seed "${SEED:-1}" --compressor "$spec" --policy "*=$spec" \
    --lr-schedule constant ${EXTRA:-} \
    >"$work/run.out" 2>"$work/run.err" || { tail -n 5 "$work/run.err" >&2; exit 1; }
# rank 0's lines: step tensor n density updated grad residual velocity
grep '^\[0\].*trace step' "$work/run.err" |
    sed 's/.*trace step \([0-9]*\) tensor .\([^'"'"']*\). n \([0-9]*\) density \([^ ]*\) updated \([0-9]*\) grad \([^ ]*\) residual \([^ ]*\) velocity \([^ ]*\).*/\1 \2 \3 \4 \5 \6 \7 \8/' \
    >"$work/trace.txt"
steps_per_epoch=$(sed -n 's/.* \([0-9]*\) steps per epoch.*/\1/p' "$work/run.out" | head -n 1)
tensors="fc1.weight fc1.bias fc2.weight fc2.bias fc3.weight fc3.bias"
for t in $tensors; do
    # step, density in force, fraction updated, residual / gradient (means over 20 steps)
    awk -v t="$t" '$2 == t { k = int($1 / 20); s[k] += $1; d[k] += $4; u[k] += $5 / $3;
                             r[k] += ($6 > 0 ? $7 / $6 : 0); c[k]++; if (k > m) m = k }
                   END { for (i = 0; i <= m; i++) if (c[i])
                         printf "%g %g %g %g\n", s[i] / c[i], d[i] / c[i], u[i] / c[i], r[i] / c[i] }' \
        "$work/trace.txt" >"$work/$t.dat"
done
echo "per epoch (rank 0): tensor, density in force, fraction updated per step, |residual| / |gradient|"
for t in $tensors; do
    awk -v t="$t" -v spe="$steps_per_epoch" '$2 == t { e = int($1 / spe) + 1; d[e] += $4;
            u[e] += $5 / $3; r[e] += ($6 > 0 ? $7 / $6 : 0); c[e]++ }
        END { for (e = 1; e in c; e++) printf "%-10s epoch %d: density %.4f updated %.4f residual/grad %.2f\n",
              t, e, d[e] / c[e], u[e] / c[e], r[e] / c[e] }' "$work/trace.txt"
done
sed -n "s/^\(\[0\] \)\{0,1\}final test accuracy: /final test accuracy: /p" "$work/run.out"
if command -v gnuplot >/dev/null 2>&1; then
    mkdir -p "$(dirname "$png")"
    gnuplot -e "dir='$work'; outfile='$png'; spe=$steps_per_epoch; subtitle='$spec, ${RANKS:-2} ranks, seed ${SEED:-1}, rank 0, means over 20 steps'" \
        "$src/bench/dgc-trace.gp"
    echo "wrote $png" >&2
fi
echo "trace in $work" >&2
