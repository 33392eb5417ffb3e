#!/bin/sh
# test-policy-seed.sh: bench/policy-seed.sh in a tiny form (3 steps a row, 1 seed, a
# 400-token vocabulary, 200 test samples; 30-60 s, mostly importing torch and reading
# Fashion-MNIST). Checks that every model's rows (dense, seed, uniform, matched; default
# for the embedding model; a --policy row) end with a summary line in policy_seed.py's
# format, that every row's ranks end with the same weights, that the seed policy sends
# fewer bytes a step than dense, that the matched row's top-k density gives bytes within
# 10% of seed's (top-k's k is fixed, so its bytes are a line in the density, which the
# probes fit), and that the --policy row (top-k 0.1% everywhere) sends fewer than uniform
# top-k 1%. Exits 77 (SKIP) where the bench skips (no torch 2 with the gcoll backend);
# without Fashion-MNIST only the embedding model runs.
. "$(dirname "$0")/lib.sh"
SRC=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
log="$TMP/policy-seed.log"
rows="dense seed uniform matched default"
PY=${TORCH_PYTHON:-} SEEDS=1 STEPS=3 LIMIT=300 ROWS=$(echo $rows | tr ' ' ,) \
    timeout -k 10 360 sh "$SRC/bench/policy-seed.sh" "$top_builddir" -- \
    --test-samples 200 --vocab 400 --policy 'lean=*=topk:density=0.001' >"$log" 2>&1
rc=$?
if grep -q "policy-seed: SKIP" "$log"; then
    note "SKIP: test-policy-seed: $(grep -m 1 'policy-seed: SKIP' "$log")"
    exit 77
fi
[ "$rc" -eq 0 ] || { fail "policy-seed.sh exited with $rc"; tail -n 20 "$log"; finish; }
models="cnn emb"
grep -q "emb only" "$log" && models=emb
num='[0-9]+\.[0-9]{4}'
for m in $models; do
    for row in $rows lean; do
        [ "$m/$row" = cnn/default ] && continue # not run: no embedding
        line=$(grep "^seedpol $m $row: " "$log")
        if printf '%s\n' "$line" | grep -Eq "^seedpol $m $row: accuracy $num \+- $num, bytes/step [0-9]+, vs dense $num, identical=1, policy .+$"; then
            pass "$line"
        else
            fail "$m $row: no summary line in the format, or the ranks' weights differ (got '$line')"
        fi
    done
    bytes() { sed -n "s/^seedpol $m $1: .*bytes\/step \([0-9]*\),.*/\1/p" "$log"; }
    d=$(bytes dense)
    s=$(bytes seed)
    t=$(bytes matched)
    u=$(bytes uniform)
    l=$(bytes lean)
    if [ -n "$d" ] && [ -n "$s" ] && [ "$s" -lt "$d" ]; then
        pass "$m: seed sends $s bytes/step, dense $d"
    else
        fail "$m: seed's bytes/step ($s) are not below dense's ($d)"
    fi
    if [ -n "$s" ] && [ -n "$t" ] && awk -v s="$s" -v t="$t" 'BEGIN {exit !(t > 0.9 * s && t < 1.1 * s)}'; then
        pass "$m: matched top-k sends $t bytes/step, seed $s"
    else
        fail "$m: matched's bytes/step ($t) are not within 10% of seed's ($s)"
    fi
    if [ -n "$u" ] && [ -n "$l" ] && [ "$l" -lt "$u" ]; then
        pass "$m: --policy lean (top-k 0.1%) sends $l bytes/step, uniform top-k 1% $u"
    else
        fail "$m: the --policy row's bytes/step ($l) are not below uniform's ($u)"
    fi
done
finish
