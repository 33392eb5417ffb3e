#!/bin/sh
# fsdp-speed.sh: issue 37 item 4. Steps per second of FSDP2 on the gcoll backend, dense
# against gcoll.torch.fsdp_compress (sparsified gradients, a quantized parameter all-gather),
# on N ranks, one per network namespace, over veth links shaped to RATE per direction
# (tc tbf on both ends, as netns-shaped.sh and ddp-tta.sh), with the loss after STEPS steps
# of each and a breakdown of the step (bench/fsdp_speed.py). The two models train in the
# same processes, alternating steps, so that their ratio holds on a loaded machine.
#
#   sudo bench/fsdp-speed.sh [BUILD_DIR]        (BUILD_DIR: the build tree, default .)
# Environment: N (ranks, 2), RATE (1gbit), WIDTH (2048), STEPS (30), BATCH (32 per rank),
# SPEC (dgc:density=0.01,momentum=0.9: DGC's top-k 1% of the momentum-corrected gradient, Lin
# et al. 2018, its row trained without the optimizer's momentum; topk:density=0.01: plain top-k
# with error feedback and SGD momentum 0.9),
# ALLGATHER (mxfp8:format=e4m3; empty: dense all-gather),
# ROWS (dense,compressed; compressed-noreuse: fsdp_compress with allgather_reuse=False),
# WARMUP (fsdp_compress's warm-up of the sparsifier in steps, 0),
# RESHARD (1: FSDP2's reshard_after_forward, 0: keep the parameters after forward),
# PY (a Python with torch >= 2.6, else TORCH_PYTHON, else .venv/bin/python, else python3).
# Needs root, iproute2, tc; skips with a message where it cannot run.
set -u
BUILD=$(cd "${1:-.}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
N=${N:-2}
RATE=${RATE:-1gbit}
PY=${PY:-${TORCH_PYTHON:-$HERE/../.venv/bin/python}}
[ -x "$PY" ] || PY=python3
PORT=29870
NS=gfsp

skip() { echo "fsdp-speed: SKIP: $*"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || skip "ip and tc (iproute2) not found"
[ -f "$BUILD/.libs/libgcoll.so" ] || { echo "fsdp-speed: $BUILD/.libs/libgcoll.so not built" >&2; exit 1; }
PYTHONPATH="$HERE/../bindings/python" GCOLL_LIBRARY="$BUILD/.libs/libgcoll.so" $PY -c \
    'import torch, gcoll.torch as gt; assert gt.backend_available()' 2>/dev/null ||
    skip "$PY cannot import torch and gcoll.torch with the gcoll backend"

pids=""
VETH=gf SUBNET=10.78.0
. "$HERE/netns-star.sh"
cleanup() {
    [ -n "$pids" ] && kill $pids 2>/dev/null
    star_cleanup
}
trap 'cleanup' EXIT
trap 'cleanup; exit 1' INT TERM
star_make

LOG=${TMPDIR:-/tmp}/fsdp-speed.$$
echo "# fsdp-speed: $N ranks, links $RATE per direction; load: $(uptime | sed 's/.*load/load/')"
for i in $(seq 0 $((N - 1))); do
    ip netns exec "$NS$i" env RANK="$i" WORLD_SIZE=$N MASTER_ADDR=10.78.0.1 \
        MASTER_PORT=$PORT GCOLL_TIMEOUT_MS=120s \
        PYTHONPATH="$HERE/../bindings/python" GCOLL_LIBRARY="$BUILD/.libs/libgcoll.so" \
        OMP_NUM_THREADS=1 timeout 1200 $PY "$HERE/fsdp_speed.py" --width "${WIDTH:-2048}" \
        --steps "${STEPS:-30}" --batch "${BATCH:-32}" --spec "${SPEC:-dgc:density=0.01,momentum=0.9}" \
        --allgather "${ALLGATHER-mxfp8:format=e4m3}" --reshard "${RESHARD:-1}" \
        --warmup "${WARMUP:-0}" \
        --rows "${ROWS:-dense,compressed}" --rate "$RATE" \
        >"$LOG.rank$i" 2>&1 &
    pids="$pids $!"
done
ok=0
for p in $pids; do wait "$p" || ok=1; done
pids=""
cat "$LOG.rank0"
[ "$ok" -eq 0 ] || { echo "fsdp-speed: failed:"; tail -n 5 "$LOG".rank*; }
echo "# load after: $(uptime | sed 's/.*load/load/')"
rm -f "$LOG".rank*
exit $ok
