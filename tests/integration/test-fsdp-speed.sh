#!/bin/sh
# test-fsdp-speed.sh: bench/fsdp-speed.sh end to end in a short form: the MLP 64 wide on 2
# ranks in network namespaces at 1 Gbit/s, 6 steps of its three rows (dense FSDP2,
# fsdp_compress with and without the all-gather reuse). Checks each row's line
# "fsdp-speed ROW: S steps/s, loss after 6 steps L, MB/step M", that the compressed rows
# send fewer bytes than dense and the reuse fewer than without it, that both compressed
# rows end at the same loss (the reuse changes where the bytes come from, not what they
# are: bit-equal training, so the printed losses are the same string), and that only the
# reuse row reused gathers. Exits 77 (SKIP) where the bench skips (not root, no
# namespaces or tc, no torch 2 with the gcoll backend).
. "$(dirname "$0")/lib.sh"
SRC=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
log="$TMP/fsdp-speed.log"
PY=${PY:-${TORCH_PYTHON:-}} WIDTH=64 STEPS=6 N=2 RATE=1gbit \
    ROWS=dense,compressed-noreuse,compressed TMPDIR="$TMP" \
    timeout -k 10 900 sh "$SRC/bench/fsdp-speed.sh" "$top_builddir" >"$log" 2>&1
rc=$?
if grep -q "fsdp-speed: SKIP" "$log"; then
    note "SKIP: test-fsdp-speed: $(grep -m 1 'fsdp-speed: SKIP' "$log")"
    exit 77
fi
[ "$rc" -eq 0 ] || { tail -n 20 "$log"; fail "fsdp-speed.sh exited with $rc"; }
for row in dense compressed-noreuse compressed; do
    line=$(grep "^fsdp-speed $row: " "$log")
    if printf '%s\n' "$line" | grep -Eq "^fsdp-speed $row: [0-9]+\.[0-9]{2} steps/s, loss after 6 steps [0-9]+\.[0-9]{4}, MB/step [0-9]+\.[0-9]{3}$"; then
        pass "$line"
    else
        fail "$row: no line in the bench's format (got '$line')"
    fi
done
mb() { sed -n "s/^fsdp-speed $1: .*MB\/step \([0-9.]*\)$/\1/p" "$log"; }
loss() { sed -n "s/^fsdp-speed $1: .*loss after 6 steps \([0-9.]*\),.*$/\1/p" "$log"; }
d=$(mb dense) n=$(mb compressed-noreuse) c=$(mb compressed)
if [ -n "$d" ] && [ -n "$n" ] && [ -n "$c" ] &&
    awk -v d="$d" -v n="$n" -v c="$c" 'BEGIN {exit !(c < n && n < d)}'; then
    pass "MB/step: dense $d, compressed without reuse $n, with reuse $c"
else
    fail "MB/step not ordered compressed < compressed-noreuse < dense ($c, $n, $d)"
fi
if [ -n "$(loss compressed)" ] && [ "$(loss compressed)" = "$(loss compressed-noreuse)" ]; then
    pass "both compressed rows end at loss $(loss compressed)"
else
    fail "the reuse changed the training: loss $(loss compressed) against $(loss compressed-noreuse)"
fi
grep -q "^counters compressed-noreuse: .*all-gathers reused 0$" "$log" &&
    grep -Eq "^counters compressed: .*all-gathers reused [1-9][0-9]*$" "$log" &&
    pass "only the reuse row reused all-gathers" ||
    fail "all-gather reuse counts: $(grep '^counters' "$log" | sed 's/.*, all/all/' | tr '\n' ' ')"
finish
