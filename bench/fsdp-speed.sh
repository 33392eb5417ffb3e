#!/bin/sh
# fsdp-speed.sh: issue 37 item 4. Steps per second of FSDP2 on the gcoll backend, dense
# against gcoll.torch.fsdp_compress (top-k gradients, a quantized parameter all-gather),
# on N ranks, one per network namespace, over veth links shaped to RATE per direction
# (tc tbf on both ends, as netns-shaped.sh and ddp-tta.sh), with the loss after STEPS steps
# of each and a breakdown of the step (bench/fsdp_speed.py). The two models train in the
# same processes, alternating steps, so that their ratio holds on a loaded machine.
#
#   sudo bench/fsdp-speed.sh [BUILD_DIR]        (BUILD_DIR: the build tree, default .)
# Environment: N (ranks, 2), RATE (1gbit), WIDTH (2048), STEPS (30), BATCH (32 per rank),
# SPEC (topk:density=0.01; a dgc spec trains its row without the optimizer's momentum),
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
cleanup() {
    [ -n "$pids" ] && kill $pids 2>/dev/null
    for i in $(seq 0 $((N - 1))); do ip netns del "$NS$i" 2>/dev/null; done
    ip netns del "${NS}br" 2>/dev/null
}
trap 'cleanup' EXIT
trap 'cleanup; exit 1' INT TERM
cleanup
ip netns add "${NS}br" || skip "cannot create network namespaces here"
ip -n "${NS}br" link add br0 type bridge && ip -n "${NS}br" link set br0 up || skip "cannot create a bridge"
for i in $(seq 0 $((N - 1))); do
    ip netns add "$NS$i" || skip "cannot create namespace $NS$i"
    ip link add "gf$i" netns "$NS$i" type veth peer name "gfb$i" netns "${NS}br" || skip "cannot create veth"
    ip -n "$NS$i" addr add "10.78.0.$((i + 1))/24" dev "gf$i"
    ip -n "$NS$i" link set "gf$i" up
    ip -n "$NS$i" link set lo up
    ip -n "${NS}br" link set "gfb$i" master br0
    ip -n "${NS}br" link set "gfb$i" up
    for where in "$NS$i gf$i" "${NS}br gfb$i"; do
        set -- $where
        tc -n "$1" qdisc replace dev "$2" root tbf rate "$RATE" burst 512kb latency 100ms ||
            skip "tc tbf is not available"
    done
done

LOG=${TMPDIR:-/tmp}/fsdp-speed.$$
echo "# fsdp-speed: $N ranks, links $RATE per direction; load: $(uptime | sed 's/.*load/load/')"
for i in $(seq 0 $((N - 1))); do
    ip netns exec "$NS$i" env RANK="$i" WORLD_SIZE=$N MASTER_ADDR=10.78.0.1 \
        MASTER_PORT=$PORT GCOLL_TIMEOUT_MS=120s \
        PYTHONPATH="$HERE/../bindings/python" GCOLL_LIBRARY="$BUILD/.libs/libgcoll.so" \
        OMP_NUM_THREADS=1 timeout 1200 $PY "$HERE/fsdp_speed.py" --width "${WIDTH:-2048}" \
        --steps "${STEPS:-30}" --batch "${BATCH:-32}" --spec "${SPEC:-topk:density=0.01}" \
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
