#!/bin/sh
# ddp-tta.sh: PyTorch DDP time-to-accuracy on N ranks, one per network namespace, over
# veth links shaped to 1 Gbit/s per direction (tc tbf on both ends, as netns-shaped.sh),
# for each model and each way of reducing the gradients (bench/ddp_tta.py's rows). Prints
# a table (time to the target test accuracy, final accuracy, bytes per step per rank)
# and, with gnuplot, plots accuracy against training time.
#
#   sudo bench/ddp-tta.sh [BUILD_DIR]        (BUILD_DIR: the build tree, default .)
# Environment: N (ranks, 2), MODELS ("cnn mlp"),
# ROWS ("gloo gloo-fp16 gcoll fp16 topk dgc powersgd fsdp fsdp-topk"), RATE (1gbit),
# STEPS_cnn (300), STEPS_mlp (200), TARGET_cnn (0.80), TARGET_mlp (0.78), WIDTH (2048),
# BATCH (32 per rank; BATCH_cnn, BATCH_mlp for one model), EVAL_EVERY (5 steps: a time to
# the target is that of the first evaluation at or above it, so coarser evaluations round
# it up by as much), DGC_DENSITY (0.01) and DGC_WARMUP (0 steps) for the dgc row, OUT
# (directory for the data and the plot, default bench-ddp-tta). All rows of a model run in one job, one after the other.
# Needs root, iproute2, tc, a Python with torch >= 2.6 (PY, else TORCH_PYTHON, else
# .venv/bin/python, else python3), dataset-fashion-mnist;
# skips with a message where it cannot run. Removes its namespaces on exit.
set -u
BUILD=$(cd "${1:-.}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
N=${N:-2}
MODELS=${MODELS:-"cnn mlp"}
ROWS=${ROWS:-"gloo gloo-fp16 gcoll fp16 topk dgc powersgd fsdp fsdp-topk"}
RATE=${RATE:-1gbit}
OUT=${OUT:-bench-ddp-tta}
PY=${PY:-${TORCH_PYTHON:-$HERE/../.venv/bin/python}}
[ -x "$PY" ] || PY=python3
PORT=29840
NS=gtta

skip() { echo "ddp-tta: SKIP: $*"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || skip "ip and tc (iproute2) not found"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    skip "Fashion-MNIST not found (apt-get install dataset-fashion-mnist)"
[ -f "$BUILD/.libs/libgcoll.so" ] || { echo "ddp-tta: $BUILD/.libs/libgcoll.so not built" >&2; exit 1; }
PYTHONPATH="$HERE/../bindings/python" GCOLL_LIBRARY="$BUILD/.libs/libgcoll.so" $PY -c \
    'import torch, gcoll.torch as gt; assert gt.backend_available()' 2>/dev/null ||
    skip "$PY cannot import torch and gcoll.torch with the gcoll backend"

pids=""
VETH=gt SUBNET=10.79.0
. "$HERE/netns-star.sh"
cleanup() {
    [ -n "$pids" ] && kill $pids 2>/dev/null
    star_cleanup
}
trap 'cleanup' EXIT
trap 'cleanup; exit 1' INT TERM
star_make

mkdir -p "$OUT"
echo "# ddp-tta: $N ranks, links $RATE per direction; load: $(uptime | sed 's/.*load/load/')"
for model in $MODELS; do
    eval steps=\${STEPS_$model:-$([ "$model" = cnn ] && echo 300 || echo 200)}
    eval batch=\${BATCH_$model:-${BATCH:-32}}
    eval target=\${TARGET_$model:-$([ "$model" = cnn ] && echo 0.80 || echo 0.78)}
    pids=""
    for i in $(seq 0 $((N - 1))); do
        ip netns exec "$NS$i" env RANK="$i" WORLD_SIZE=$N MASTER_ADDR=10.79.0.1 \
            MASTER_PORT=$PORT GLOO_SOCKET_IFNAME="gt$i" GCOLL_TIMEOUT_MS=120s \
            PYTHONPATH="$HERE/../bindings/python" GCOLL_LIBRARY="$BUILD/.libs/libgcoll.so" \
            OMP_NUM_THREADS=1 timeout 3000 $PY "$HERE/ddp_tta.py" --rows "$(echo $ROWS | tr ' ' ,)" \
            --model "$model" --width "${WIDTH:-2048}" --batch "$batch" --steps "$steps" \
            --eval-every "${EVAL_EVERY:-5}" --dgc-density "${DGC_DENSITY:-0.01}" \
            --dgc-warmup "${DGC_WARMUP:-0}" --out "$OUT" >"$OUT/$model.rank$i.log" 2>&1 &
        pids="$pids $!"
    done
    ok=0
    for p in $pids; do wait "$p" || ok=1; done
    PORT=$((PORT + 10))
    [ "$ok" -eq 0 ] || { echo "ddp-tta: $model failed:"; tail -n 5 "$OUT/$model".rank*.log; }
    printf '\n## %s, %d steps of %d x %d samples, target test accuracy %s\n' "$model" "$steps" \
        $N "$batch" "$target"
    printf '| row | time to %s (s) | vs DDP+Gloo | final accuracy | train time (s) | KB sent/step/rank | ranks identical |\n' "$target"
    printf '| --- | --- | --- | --- | --- | --- | --- |\n'
    base=$(awk -v t="$target" '$1 ~ /^[0-9]/ && $3 >= t {print $2; exit}' "$OUT/$model-gloo.dat" 2>/dev/null)
    for row in $ROWS; do
        f="$OUT/$model-$row.dat"
        [ -s "$f" ] || { echo "| $row | failed | | | | | |"; continue; }
        awk -v t="$target" -v base="${base:-}" -v row="$row" '
            $1 ~ /^[0-9]/ && $3 >= t && tt == "" {tt = $2}
            $1 == "final" {acc = $4; secs = $3; kb = $5 / 1000; same = $6; div = $7 == "diverged"; at = $2}
            END {
                if (div) {
                    printf "| %s | diverged at step %d | | | %.1f | %.1f | |\n", row, at, secs, kb
                    exit
                }
                sub("identical=", "", same)
                speed = (tt != "" && base != "") ? sprintf("%.2fx", base / tt) : "-"
                printf "| %s | %s | %s | %.4f | %.1f | %.1f | %s |\n", row,
                    tt == "" ? "not reached" : sprintf("%.1f", tt), speed, acc, secs, kb,
                    same == 1 ? "yes" : "NO"
            }' "$f"
    done
    # the summary lines (issue 37's format): S is "inf" where the target was not reached
    for row in $ROWS; do
        f="$OUT/$model-$row.dat"
        [ -s "$f" ] || continue
        awk -v t="$target" -v model="$model" -v row="$row" '
            $1 ~ /^[0-9]/ && $3 >= t && tt == "" {tt = $2}
            $1 == "final" {acc = $4; mb = $5 / 1e6}
            $1 == "commshare" {share = $2}
            END {
                printf "tta %s %s: time to %s %s s, final %s, MB/step %.3f\n", model, row, t,
                    tt == "" ? "inf" : sprintf("%.1f", tt), acc, mb
                if (share != "")
                    printf "tta %s %s: comm share %s\n", model, row, share
            }' "$f"
    done
done

if command -v gnuplot >/dev/null 2>&1; then
    for model in $MODELS; do
        plots=""
        for row in $ROWS; do
            [ -s "$OUT/$model-$row.dat" ] &&
                plots="$plots${plots:+, }'$OUT/$model-$row.dat' using (valid(1) ? column(2) : NaN):3 with linespoints title '$row'"
        done
        [ -n "$plots" ] && gnuplot -e "set terminal pngcairo size 800,500 noenhanced; \
            set output '$OUT/$model.png'; set xlabel 'training time (s)'; \
            set ylabel 'test accuracy'; set key bottom right; set grid; \
            set title 'DDP on $N ranks over $RATE: $model'; plot $plots" 2>/dev/null ||
            gnuplot -e "set terminal dumb 100 30; set output '$OUT/$model.txt'; \
                set xlabel 'training time (s)'; set ylabel 'test accuracy'; plot $plots"
    done
    echo "# plots in $OUT/"
fi
