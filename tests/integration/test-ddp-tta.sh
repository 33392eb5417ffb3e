#!/bin/sh
# test-ddp-tta.sh: bench/ddp-tta.sh end to end in a short form: the MLP (64 wide) on 2 ranks
# in network namespaces at 1 Gbit/s, 4 steps of every row (gloo, gloo-fp16, gcoll, fp16,
# topk, dgc, powersgd, fsdp, fsdp-topk). Checks that every row ends with its summary line
# in the issue's format, "tta mlp ROW: time to T S s, final ACC, MB/step M", that gloo's
# comm share line is there with a share in [0, 1], that every row's ranks end with the
# same weights, and that fsdp-topk sends fewer bytes a step than fsdp. Exits 77 (SKIP)
# where the bench skips (not root, no namespaces or tc, no Fashion-MNIST, no torch 2 with
# the gcoll backend). Takes a few minutes on a loaded 2-core machine (the imports).
. "$(dirname "$0")/lib.sh"
SRC=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
out="$TMP/tta"
log="$TMP/tta.log"
rows="gloo gloo-fp16 gcoll fp16 topk dgc powersgd fsdp fsdp-topk"
OUT="$out" MODELS=mlp ROWS="$rows" STEPS_mlp=4 EVAL_EVERY=2 WIDTH=64 N=2 RATE=1gbit \
    timeout -k 10 900 sh "$SRC/bench/ddp-tta.sh" "$top_builddir" >"$log" 2>&1
rc=$?
if grep -q "ddp-tta: SKIP" "$log"; then
    note "SKIP: test-ddp-tta: $(grep -m 1 'ddp-tta: SKIP' "$log")"
    exit 77
fi
[ "$rc" -eq 0 ] || fail "ddp-tta.sh exited with $rc"
for row in $rows; do
    line=$(grep "^tta mlp $row: " "$log")
    if printf '%s\n' "$line" | grep -Eq "^tta mlp $row: time to [0-9.]+ ([0-9]+\.[0-9]|inf) s, final [0-9]\.[0-9]{4}, MB/step [0-9]+\.[0-9]{3}$"; then
        pass "$row: $line"
    else
        fail "$row: no summary line in the issue's format (got '$line')"
        tail -n 5 "$out"/mlp.rank*.log
    fi
    tail -n 1 "$out/mlp-$row.dat" 2>/dev/null | grep -q 'identical=1' ||
        fail "$row: the ranks' weights differ at the end (or the row failed)"
done
share=$(sed -n 's/^tta mlp gloo: comm share \([0-9.]*\)$/\1/p' "$log")
if [ -n "$share" ] && awk -v s="$share" 'BEGIN {exit !(s >= 0 && s <= 1)}'; then
    pass "gloo: comm share $share"
else
    fail "no 'tta mlp gloo: comm share C' line with C in [0, 1]"
fi
mb() { sed -n "s/^tta mlp $1: .*MB\/step \([0-9.]*\)$/\1/p" "$log"; }
d=$(mb fsdp)
c=$(mb fsdp-topk)
if [ -n "$d" ] && [ -n "$c" ] && awk -v d="$d" -v c="$c" 'BEGIN {exit !(c < d)}'; then
    pass "fsdp-topk sends $c MB/step, dense fsdp $d"
else
    fail "fsdp-topk's MB/step ($c) is not below fsdp's ($d)"
fi
finish
