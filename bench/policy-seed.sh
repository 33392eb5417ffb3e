#!/bin/sh
# policy-seed.sh: the DDP hook's built-in layer policy "seed" against dense and uniform
# top-k (issue 38 item 6): a CNN with batch norm on Fashion-MNIST and a bag-of-tokens
# model with an nn.Embedding on synthetic topics, 2 ranks over loopback (gcoll-run), DDP
# on the gcoll backend with gcoll's hook. Prints bench/policy_seed.py's lines and its
# Markdown table (final test accuracy, the hook's wire bytes per step and rank).
#
#   bench/policy-seed.sh [BUILD_DIR] [-- policy_seed.py options]   (BUILD_DIR: default .)
# Environment: SEEDS (1,2,3), STEPS (500), MODELS (cnn,emb), ROWS
# (dense,seed,uniform,matched,default), LIMIT (seconds for the whole job, 1800),
# PY (a Python with torch >= 2.6, else TORCH_PYTHON, else .venv/bin/python, else python3).
# Without Fashion-MNIST (dataset-fashion-mnist) the cnn model is left out. Skips with a
# message ("policy-seed: SKIP: ...") where it cannot run.
set -u
BUILD=$(cd "${1:-.}" && pwd)
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-${TORCH_PYTHON:-$HERE/../.venv/bin/python}}
[ -x "$PY" ] || PY=python3
MODELS=${MODELS:-cnn,emb}

skip() { echo "policy-seed: SKIP: $*"; exit 0; }
[ -f "$BUILD/.libs/libgcoll.so" ] || { echo "policy-seed: $BUILD/.libs/libgcoll.so not built" >&2; exit 1; }
[ -x "$BUILD/tools/gcoll-run" ] || { echo "policy-seed: $BUILD/tools/gcoll-run not built" >&2; exit 1; }
PYTHONPATH="$HERE/../bindings/python" GCOLL_LIBRARY="$BUILD/.libs/libgcoll.so" $PY -c \
    'import torch, gcoll.torch as gt; assert gt.backend_available()' 2>/dev/null ||
    skip "$PY cannot import torch and gcoll.torch with the gcoll backend"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "policy-seed: Fashion-MNIST not found (apt-get install dataset-fashion-mnist): emb only"
    MODELS=$(echo "$MODELS" | tr , '\n' | grep -v '^cnn$' | paste -sd, -)
    [ -n "$MODELS" ] || skip "no model left to run"
fi

echo "# policy-seed: 2 ranks on loopback; $(date -u '+%Y-%m-%d %H:%M UTC');" \
    "$(lscpu | sed -n 's/^Model name: *//p'); load: $(uptime | sed 's/.*load/load/')"
"$BUILD/tools/gcoll-run" -n 2 -q --timeout "${LIMIT:-1800}" -x GCOLL_TIMEOUT_MS=120s \
    -x PYTHONPATH="$HERE/../bindings/python" -x GCOLL_LIBRARY="$BUILD/.libs/libgcoll.so" \
    -x OMP_NUM_THREADS=1 -- "$PY" "$HERE/policy_seed.py" --models "$MODELS" \
    --rows "${ROWS:-dense,seed,uniform,matched,default}" --seeds "${SEEDS:-1,2,3}" \
    --steps "${STEPS:-500}" "$@"
