#!/bin/sh
# test-torchrun.sh: the torch.distributed backend "gcoll" launched as PyTorch users launch:
# torchrun --standalone, torchrun's multi-node flags (two agents on this host, one node
# each), a restart by the elastic agent (--max-restarts) that must build a fresh
# communicator, and gcoll-run -n 2 exporting torch's env:// variables. Each launch runs
# bindings/python/tests/torchrun_train.py (2 or 3 ranks) under a timeout. Exits 77 (SKIP)
# when TORCH_PYTHON has no torch >= 2.4 or the backend is not built. About 60 s.

. "$(dirname "$0")/lib.sh"

PY=${GCOLL_TEST_PYTHON:-${TORCH_PYTHON:-python3}}
SRC=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
SCRIPT="$SRC/bindings/python/tests/torchrun_train.py"
limit=${GCOLL_PYTHON_TEST_LIMIT:-90}

skip() { note "SKIP: test-torchrun: $*"; exit 77; }
command -v "$PY" >/dev/null 2>&1 || skip "$PY not found (configure's TORCH_PYTHON)"
timeout 60 "$PY" -c 'import torch, sys; v = torch.__version__.split("+")[0].split(".");
sys.exit(0 if (int(v[0]), int(v[1])) >= (2, 4) else 1)' >/dev/null 2>&1 ||
    skip "$PY has no torch >= 2.4 (python3 -m venv .venv && .venv/bin/pip install torch==2.13.0)"
ls "$top_builddir"/bindings/python/gcoll/_torch_backend*.so >/dev/null 2>&1 ||
    skip "the torch.distributed backend is not built (see 'torch backend' in configure's summary)"

export top_builddir PYTHONPATH="$SRC/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export GCOLL_DEBUG=none GCOLL_TIMEOUT_MS=30s OMP_NUM_THREADS=1
unset GCOLL_LIBRARY GCOLL_JOB_KEY GCOLL_ROOT RANK WORLD_SIZE MASTER_ADDR MASTER_PORT
cd "$TMP" || exit 1

# check NAME WANT: the launch's output in $TMP/NAME.out has WANT "torchrun-ok" lines
check() {
    got=$(grep -o 'torchrun-ok rank [0-9]*/[0-9]* attempt [0-9]*' "$TMP/$1.out" | wc -l)
    if [ "$rc" -eq 0 ] && [ "$got" -eq "$2" ]; then
        pass "$1: $got ranks ok"
    else
        fail "$1: exit status $rc, $got of $2 ranks ok:"
        tail -n 30 "$TMP/$1.out"
    fi
}

timeout -k 5 "$limit" "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
    "$SCRIPT" >"$TMP/standalone.out" 2>&1
rc=$?
check standalone 2

# two agents, one node each, rendezvous at 127.0.0.1:P (torchrun's c10d rendezvous)
port=$(free_port)
for node in 0 1; do
    timeout -k 5 "$limit" "$PY" -m torch.distributed.run --nnodes 2 --node-rank $node \
        --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$port" \
        "$SCRIPT" >"$TMP/multinode-$node.out" 2>&1 &
    eval "pid$node=\$!"
done
wait "$pid0"
rc0=$?
wait "$pid1"
rc=$((rc0 | $?))
cat "$TMP/multinode-0.out" "$TMP/multinode-1.out" >"$TMP/multinode.out"
check multinode 2

# rank 1 exits on the first attempt; the agent restarts all ranks, which join anew
TORCHRUN_TEST_FAIL_FIRST=1 timeout -k 5 "$limit" "$PY" -m torch.distributed.run --standalone \
    --nproc-per-node 3 --max-restarts 1 "$SCRIPT" >"$TMP/restart.out" 2>&1
rc=$?
check restart 3
if ! grep -q 'torchrun-ok rank 1/3 attempt 1' "$TMP/restart.out"; then
    fail "restart: the ranks that passed were not those of the second attempt"
fi

timeout -k 5 "$limit" "$gcoll_run" -n 2 --timeout "$limit" -- "$PY" "$SCRIPT" \
    >"$TMP/gcoll-run.out" 2>&1
rc=$?
check gcoll-run 2

finish
