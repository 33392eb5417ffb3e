#!/bin/sh
# run-torch-suite.sh: PyTorch 2's own distributed tests (torch_suite.py's selection of the
# collective, rooted, point-to-point, object, subgroup and DDP tests), on 2 ranks, for
# gloo and for gcoll, one after the other; prints each backend's per-test lines, both
# counts, and the tests Gloo passes that gcoll does not (tests torch's suite runs only for
# nccl, gloo and ucc are listed apart).
#   make check-torch-suite                 the whole selection (about 135 tests per backend)
#   tests/torch/run-torch-suite.sh --short a handful (what test-torch-suite.sh runs in make check)
#   tests/torch/run-torch-suite.sh REGEX   the selection's tests whose names match REGEX
# Needs TORCH_PYTHON (torch >= 2.4, expecttest, hypothesis) and the built backend; exits 77
# (SKIP) with the reason otherwise. Exits 1 when gcoll fails a test Gloo passes.
top_builddir=${top_builddir:-$(pwd)}
SRC=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${GCOLL_TEST_PYTHON:-${TORCH_PYTHON:-python3}}
OUT=${TORCH_SUITE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/torch-suite.XXXXXX")}
LIMIT=${TORCH_SUITE_LIMIT:-3600}

skip() { echo "SKIP: torch-suite: $*"; exit 77; }
command -v "$PY" >/dev/null 2>&1 || skip "$PY not found (configure's TORCH_PYTHON)"
timeout 120 "$PY" -c 'import torch, expecttest, hypothesis, sys
v = torch.__version__.split("+")[0].split(".")
sys.exit(0 if (int(v[0]), int(v[1])) >= (2, 4) else 1)' >/dev/null 2>&1 ||
    skip "$PY lacks torch >= 2.4, expecttest or hypothesis (.venv/bin/pip install torch==2.13.0 expecttest hypothesis)"
ls "$top_builddir"/bindings/python/gcoll/_torch_backend*.so >/dev/null 2>&1 ||
    skip "the torch.distributed backend is not built (see 'torch backend' in configure's summary)"

export top_builddir PYTHONPATH="$SRC/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export WORLD_SIZE=2 GCOLL_DEBUG=none GCOLL_TIMEOUT_MS=60s OMP_NUM_THREADS=1
unset GCOLL_ROOT GCOLL_JOB_KEY
# TORCH_SUITE_BACKENDS=gloo (or gcoll) runs one backend's half; with TORCH_SUITE_OUT=DIR the
# other half's results come from an earlier run into DIR (the halves may then be run apart).
for b in ${TORCH_SUITE_BACKENDS:-gloo gcoll}; do
    mkdir -p "$OUT/$b"
    BACKEND=$b TEMP_DIR="$OUT/$b" timeout -k 10 "$LIMIT" "$PY" "$SRC/tests/torch/torch_suite.py" "$@" \
        >"$OUT/$b.txt" 2>"$OUT/$b.log"
    rc=$?
    grep -E '^(PASS|FAIL|SKIP) ' "$OUT/$b.txt" | sed "s/^/$b: /"
    [ "$rc" -le 1 ] || echo "$b: the suite's run ended with status $rc (log: $OUT/$b.log)"
done
echo
for b in gloo gcoll; do
    grep '^torch-suite ' "$OUT/$b.txt" || echo "torch-suite $b: no result (status above)"
done
for b in gloo gcoll; do
    [ -f "$OUT/$b.txt" ] || { echo "no comparison: $OUT/$b.txt is missing"; exit 2; }
done
sed -n 's/^PASS //p' "$OUT/gloo.txt" | sort >"$OUT/gloo.pass"
sed -n 's/^PASS //p' "$OUT/gcoll.txt" | sort >"$OUT/gcoll.pass"
# Tests torch itself gates on the backend's name ("Test requires backend gcoll to be one of
# {nccl, gloo, ucc}") never run for gcoll: listed, not counted against it.
sed -n 's/^SKIP \([^:]*\): Test requires backend gcoll to be one of.*/\1/p' "$OUT/gcoll.txt" |
    sort >"$OUT/gcoll.gated"
if [ -s "$OUT/gcoll.gated" ]; then
    echo "not run for gcoll (torch's own tests allow only nccl, gloo, ucc there):" \
        $(cat "$OUT/gcoll.gated")
fi
missing=$(sort -u "$OUT/gcoll.pass" "$OUT/gcoll.gated" | comm -23 "$OUT/gloo.pass" -)
if [ -n "$missing" ]; then
    echo "passed by gloo, not by gcoll:" $missing
    exit 1
fi
echo "gcoll passes every test gloo passes that torch runs for it" \
    "($(comm -23 "$OUT/gloo.pass" "$OUT/gcoll.gated" | wc -l) of gloo's $(wc -l <"$OUT/gloo.pass"))"
