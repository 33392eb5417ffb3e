#!/bin/sh
# test-torch-suite.sh: the short form of the PyTorch-suite comparison in make check: a
# handful of torch 2's own distributed tests on gloo and gcoll (2 ranks), gcoll passing
# every one gloo passes. SKIP (77) with the reason when torch >= 2.4 or the backend is
# missing. The whole selection: make check-torch-suite. About a minute when idle.
. "$(dirname "$0")/lib.sh"
SRC=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
TORCH_SUITE_OUT="$TMP" TORCH_SUITE_LIMIT=900 sh "$SRC/tests/torch/run-torch-suite.sh" --short
rc=$?
exit $rc
