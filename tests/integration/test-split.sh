#!/bin/sh
# test-split.sh: gcoll_comm_split and gcoll_comm_dup on 8 ranks started by hand (halves,
# pairs, all but rank 0, a duplicate; collectives on all of them interleaved with the
# parent's), and a failure inside one half reported there only; on 4 ranks through
# gcoll-run; over every transport variant.
. "$(dirname "$0")/../chaos/common.sh"
SPLIT="$top_builddir/tests/integration/split_check"
fails=0
for var in $(variants); do
    for mode in ok fail; do
        start_ranks 8 "$var" 120 "$SPLIT" "$mode"
        wait_ranks
        bad=0 r=0
        while [ "$r" -lt 8 ]; do
            rc=$(cat "$TMP/rc.$r" 2>/dev/null || echo lost)
            if [ "$rc" != 0 ]; then
                bad=$((bad + 1))
                tail -n 5 "$TMP/err.$r"
            fi
            r=$((r + 1))
        done
        expected=0
        [ "$mode" = fail ] && expected=3 # the first half's members that did not abort
        got=$(grep -l 'failed as expected on the aborted half' "$TMP"/err.* 2>/dev/null | wc -l)
        if [ "$bad" -ne 0 ] || [ "$got" -ne "$expected" ]; then
            echo "FAIL: split $mode over $var: $bad rank(s) failed, $got of $expected saw the abort"
            fails=$((fails + 1))
        else
            echo "ok: split $mode over $var (8 ranks)"
        fi
    done
done
if timeout 120 "$top_builddir/tools/gcoll-run" -n 4 "$SPLIT" >"$TMP/run.log" 2>&1; then
    echo "ok: split under gcoll-run (4 ranks)"
else
    echo "FAIL: split under gcoll-run"; tail -n 20 "$TMP/run.log"; fails=$((fails + 1))
fi
[ "$fails" -eq 0 ]
