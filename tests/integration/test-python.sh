#!/bin/sh
# test-python.sh: the Python binding, the torch.distributed backend and the PyTorch DDP
# hook, on the interpreter configure found (TORCH_PYTHON: the venv with torch 2.13).
#
# Runs bindings/python/tests: the codec round trips in one process, then the collectives
# (test_comm.py) and the DDP hook (test_hook.py, test_hook_features.py) on 2 ranks through
# gcoll-run; with the
# torch.distributed backend built, its collectives on 2 and 3 ranks (test_backend.py),
# its rooted, point-to-point and batched calls (test_backend_p2p.py), its timeouts, abort and shutdown (test_backend_lifecycle.py),
# DDP on it alone (test_ddp_backend.py), and the hook's checkpoint round trip over two
# jobs and its non-finite modes (test_hook_state.py). Exits 77
# (SKIP) when the interpreter cannot import numpy and torch (python3 -m venv .venv &&
# .venv/bin/pip install torch==2.13.0 numpy, then configure again) or when the library
# cannot be loaded into Python (no shared library, or a sanitizer build). Takes about 60 s
# on a 2-core machine.

. "$(dirname "$0")/lib.sh"

PY=${GCOLL_TEST_PYTHON:-${TORCH_PYTHON:-python3}}
LIB="$top_builddir/.libs/libgcoll.so"
SRC=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
TESTS_DIR="$SRC/bindings/python/tests"
# Bound on one launch; the slowest (backend-3-ranks) needs about 15 s on an idle 2-core
# machine, and importing torch 2.13 alone takes seconds when the machine is busy.
limit=${GCOLL_PYTHON_TEST_LIMIT:-150}

skip() { note "SKIP: test-python: $*"; exit 77; }

command -v "$PY" >/dev/null 2>&1 || skip "$PY not found (configure's TORCH_PYTHON runs the binding's tests)"
if ! missing=$(timeout 60 "$PY" -c 'import numpy, torch' 2>&1); then
    skip "$PY cannot import numpy and torch ($(printf '%s' "$missing" | tail -n 1));" \
        "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 numpy, and configure again"
fi
[ -e "$LIB" ] || skip "$LIB not built (configure --disable-shared?)"
if ldd "$LIB" 2>/dev/null | grep -q 'libasan\|libubsan'; then
    skip "libgcoll.so is a sanitizer build, which Python cannot load without LD_PRELOAD"
fi

# The binding finds the library in $top_builddir/.libs; PYTHONPATH points at the package.
export top_builddir
export PYTHONPATH="$SRC/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export GCOLL_DEBUG=none
unset GCOLL_LIBRARY
cd "$TMP" || exit 1

# run NAME COMMAND...: one bounded launch; output kept in $TMP/NAME.out.
run() {
    name=$1
    shift
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$TMP/$name.out" 2>&1
    rc=$?
    t=$(($(date +%s) - t0))
    if [ "$rc" -eq 0 ]; then
        pass "$name (${t} s)"
    else
        fail "$name: exit status $rc after ${t} s:"
        tail -n 40 "$TMP/$name.out"
    fi
}

# The torch.distributed backend: built by configure when it found libtorch.
BACKEND_SO=$(ls "$top_builddir"/bindings/python/gcoll/_torch_backend*.so 2>/dev/null | head -n 1)

run codec "$PY" "$TESTS_DIR/test_codec.py"
run comm "$gcoll_run" -n 2 --timeout "$limit" -x GCOLL_TIMEOUT_MS=20s -- \
    "$PY" "$TESTS_DIR/test_comm.py"
run ddp-hook "$gcoll_run" -n 2 --timeout "$limit" -x GCOLL_TIMEOUT_MS=20s \
    -x GCOLL_TEST_STORE="$TMP/gloo-store" -- "$PY" "$TESTS_DIR/test_hook.py"
# policy, default spec, warm-up, accumulation, half-precision buckets, bucket rebuild: on
# the gcoll backend when built (MASTER_PORT), else on Gloo (bfloat16 then skipped)
[ -n "$BACKEND_SO" ] && hookf_port="-x MASTER_PORT=$(free_port)" || hookf_port=""
run ddp-hook-features "$gcoll_run" -n 2 --timeout "$limit" -x GCOLL_TIMEOUT_MS=20s \
    -x GCOLL_TEST_STORE="$TMP/gloo-store-f" $hookf_port -- "$PY" "$TESTS_DIR/test_hook_features.py"

if [ -z "$BACKEND_SO" ]; then
    note "SKIP: test-python: the torch.distributed backend is not built (it needs torch" \
        ">= 2.4 in TORCH_PYTHON; see 'torch backend' in configure's summary)"
else
    # torch's rendezvous (MASTER_PORT) beside gcoll-run's GCOLL_ROOT; one port per launch
    for n in 2 3; do
        run "backend-$n-ranks" "$gcoll_run" -n "$n" --timeout "$limit" -x GCOLL_TIMEOUT_MS=20s \
            -x MASTER_PORT="$(free_port)" -- "$PY" "$TESTS_DIR/test_backend.py"
        # reduce, gather, scatter, send/recv, batch_isend_irecv, coalescing
        run "backend-p2p-$n-ranks" "$gcoll_run" -n "$n" --timeout "$limit" \
            -x GCOLL_TIMEOUT_MS=20s -x MASTER_PORT="$(free_port)" -- \
            "$PY" "$TESTS_DIR/test_backend_p2p.py"
    done
    # timeouts of init_process_group/new_group, abort, destroy and a fresh group
    run backend-lifecycle "$gcoll_run" -n 2 --timeout "$limit" \
        -x MASTER_PORT="$(free_port)" -- "$PY" "$TESTS_DIR/test_backend_lifecycle.py"
    run ddp-backend "$gcoll_run" -n 2 --timeout "$limit" -x GCOLL_TIMEOUT_MS=20s \
        -x MASTER_PORT="$(free_port)" -- "$PY" "$TESTS_DIR/test_ddp_backend.py"
    mkdir -p "$TMP/ckpt"
    for phase in save resume; do
        run "hook-state-$phase" "$gcoll_run" -n 2 --timeout "$limit" -x GCOLL_TIMEOUT_MS=20s \
            -x MASTER_PORT="$(free_port)" -x GCOLL_TEST_PHASE=$phase \
            -x GCOLL_TEST_DIR="$TMP/ckpt" -- "$PY" "$TESTS_DIR/test_hook_state.py"
    done
fi

# FSDP2 (torch >= 2.6): fully_shard against DDP, gcoll.torch.fsdp_compress's reduce-scatter
# against a replay, its checkpoint, its errors. On the "gcoll" backend when it loads into
# this torch, else on Gloo (the test says which); fsdp_compress runs on a gcoll.Comm either
# way. Needs $PY (TORCH_PYTHON, or GCOLL_TEST_PYTHON) to be torch >= 2.6.
if timeout 120 "$PY" -c 'from torch.distributed.fsdp import fully_shard' >/dev/null 2>&1; then
    # imports alone take up to a minute on a loaded 2-core machine: a longer bound
    limit=$((limit * 5))
    run fsdp "$gcoll_run" -n 2 --timeout "$limit" -x GCOLL_TIMEOUT_MS=120s \
        -x MASTER_PORT="$(free_port)" -- "$PY" "$TESTS_DIR/test_fsdp.py"
    grep -m 1 'process group backend' "$TMP/fsdp.out"
else
    note "SKIP: test-python: FSDP2 tests: $PY has no torch.distributed.fsdp.fully_shard" \
        "(torch >= 2.6; set GCOLL_TEST_PYTHON)"
fi

finish
