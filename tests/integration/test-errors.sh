#!/bin/sh
# test-errors.sh: errors a user can act on (issue 33, item 6), through the tools:
# gcoll-info validates values as init does, has --version, and suggests the known name
# for a misspelt GCOLL_ one; gcoll-run takes -np; gcoll-overlap-bench --help; a transport
# mismatch names the setting with the words the user wrote, says "ranks disagree" once,
# and the tool prints gcoll_last_error() where the library's warning is not on stderr
# (GCOLL_DEBUG=none), else only what it was doing: the reason is never said twice.
. "$(dirname "$0")/lib.sh"

INFO="$top_builddir/tools/gcoll-info"
OVB="$top_builddir/tools/gcoll-overlap-bench"

GCOLL_TIMEOUT_MS=abc timeout 30 "$INFO" -c >"$TMP/info" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "^GCOLL_TIMEOUT_MS=abc (invalid)$" "$TMP/info" &&
    grep -q "GCOLL_TIMEOUT_MS='abc' is invalid: expected" "$TMP/info"; then
    pass "gcoll-info reports GCOLL_TIMEOUT_MS=abc invalid (exit 1)"
else
    fail "gcoll-info with GCOLL_TIMEOUT_MS=abc: exit $rc, $(grep GCOLL_TIMEOUT_MS "$TMP/info" | head -3)"
fi

v=$(timeout 30 "$INFO" --version 2>&1)
case $v in
"gcoll "[0-9]*.[0-9]*.[0-9]*) pass "gcoll-info --version: $v" ;;
*) fail "gcoll-info --version printed '$v'" ;;
esac

GCOLL_TIMOUT_MS=5 timeout 30 "$INFO" -c >"$TMP/typo" 2>&1
if grep -q "unknown environment variable GCOLL_TIMOUT_MS: did you mean GCOLL_TIMEOUT_MS?" "$TMP/typo"; then
    pass "a misspelt GCOLL_ name gets a suggestion"
else
    fail "no suggestion for GCOLL_TIMOUT_MS: $(grep -i unknown "$TMP/typo")"
fi

if timeout 30 "$OVB" --help >"$TMP/ovb" 2>&1 && grep -q "^usage: gcoll-overlap-bench" "$TMP/ovb"; then
    pass "gcoll-overlap-bench --help"
else
    fail "gcoll-overlap-bench --help: $(head -2 "$TMP/ovb")"
fi

if timeout 60 "$gcoll_run" -np 2 -q --timeout 50 -- sh -c 'echo "r$GCOLL_RANK/$GCOLL_SIZE"' \
    >"$TMP/np" 2>&1 && grep -q "r1/2" "$TMP/np"; then
    pass "gcoll-run -np 2"
else
    fail "gcoll-run -np 2: $(head -3 "$TMP/np")"
fi

# A bad GCOLL_COMPRESSOR is blamed on the variable, not on --compressor (not given).
GCOLL_COMPRESSOR=bogus timeout 30 "$top_builddir/tools/gcoll-train" >"$TMP/tr" 2>&1
if grep -q "^gcoll-train: GCOLL_COMPRESSOR: " "$TMP/tr" && ! grep -q -- "--compressor" "$TMP/tr"; then
    pass "gcoll-train names GCOLL_COMPRESSOR for a bad spec in it"
else
    fail "gcoll-train with GCOLL_COMPRESSOR=bogus: $(head -2 "$TMP/tr")"
fi
if ! timeout 30 "$top_builddir/tools/gcoll-train" --compressor bogus >"$TMP/tr2" 2>&1 &&
    grep -q "^gcoll-train: --compressor: " "$TMP/tr2"; then
    pass "gcoll-train names --compressor for a bad spec given there"
else
    fail "gcoll-train --compressor bogus: $(head -2 "$TMP/tr2")"
fi

# Rank 1 alone, rank 0 never started: after 5 s it says whom it awaits and that the port
# refused, then fails at GCOLL_TIMEOUT_MS with the reason printed by the tool.
port=$(free_port)
GCOLL_RANK=1 GCOLL_SIZE=2 GCOLL_ROOT=127.0.0.1:$port GCOLL_TIMEOUT_MS=7s \
    timeout 30 "$DEMO" >"$TMP/alone" 2>&1
# The reason is said once: by the library's warning, the tool pointing at it.
if grep -q "rank 1: still waiting for rank 0 at GCOLL_ROOT 127.0.0.1:$port: connection refused" \
    "$TMP/alone" && [ "$(grep -c "gcoll_comm_init failed: GCOLL_ERR_TIMEOUT: " "$TMP/alone")" = 1 ] &&
    grep -q "^gcoll-demo: gcoll_comm_init failed (gcoll's warning above says why)$" "$TMP/alone"; then
    pass "a rank whose root never comes says so every 5 s, with 'connection refused', and the reason once"
else
    fail "rank 1 alone: $(head -4 "$TMP/alone")"
fi

# Rank 0 of 3 with rank 1 only: at the default GCOLL_DEBUG, after 5 s, rank 0 names the
# rank it still awaits and where. GCOLL_TIMEOUT_MS=60s, so the note is not the timeout's
# message; both are killed once it shows (at most 15 s).
port=$(free_port)
for r in 0 1; do
    env -u GCOLL_DEBUG GCOLL_RANK=$r GCOLL_SIZE=3 GCOLL_ROOT=127.0.0.1:$port GCOLL_TIMEOUT_MS=60s \
        timeout 30 "$DEMO" >"$TMP/await$r" 2>&1 &
    BG_PIDS="$BG_PIDS $!"
    eval "await_pid$r=$!"
done
want="rendezvous: still waiting for rank 2 (2 of 3 joined) at GCOLL_ROOT 127.0.0.1:$port"
i=0
while [ $i -lt 150 ] && ! grep -q "$want" "$TMP/await0"; do
    sleep 0.1
    i=$((i + 1))
done
kill_ours $await_pid0 $await_pid1
if grep -q "$want" "$TMP/await0"; then
    pass "rank 0 names the rank it awaits after $((i / 10)) s: $want"
else
    fail "rank 0 awaiting rank 2: $(head -3 "$TMP/await0")"
fi

# Two ranks given different compressor specs in code (gcoll-bench --compressor): every rank names
# both specs as written, with GCOLL_DEBUG=none through the tool; and different
# GCOLL_COMPRESSOR values fail at init naming the variable.
BENCH="$top_builddir/tools/gcoll-bench"
timeout 60 "$gcoll_run" -n 2 --timeout 50 -x GCOLL_DEBUG=none -x S=topk:density=0.01 \
    --rank-env 1:S=topk:density=1e-2,ef=0 -- sh -c "exec '$BENCH' --compressor \$S -b 4K -e 4K -n 1 -w 0" \
    >"$TMP/spec" 2>&1
want="the compressor spec (gcoll_compressor_create, GCOLL_COMPRESSOR) differs: rank 0 has 'topk:density=0.01', rank 1 has 'topk:density=1e-2,ef=0'"
if [ "$(grep -c "gcoll-bench: rank [01]: .*GCOLL_ERR_MISMATCH: ranks disagree: $want" "$TMP/spec")" = 2 ]; then
    pass "a compressor spec mismatch names both specs as written, on both ranks"
else
    fail "compressor spec mismatch: $(grep -v '^\[0\] #' "$TMP/spec" | head -4)"
fi
timeout 60 "$gcoll_run" -n 2 -q --timeout 50 -x GCOLL_DEBUG=none -x GCOLL_COMPRESSOR=q8 \
    --rank-env 1:GCOLL_COMPRESSOR=topk:density=0.01+q8 -- "$DEMO" >"$TMP/cenv" 2>&1
if grep -q "rank 0 has GCOLL_COMPRESSOR=q8, rank 1 has GCOLL_COMPRESSOR=topk:density=0.01+q8" \
    "$TMP/cenv"; then
    pass "different GCOLL_COMPRESSOR values fail at init, naming it"
else
    fail "GCOLL_COMPRESSOR mismatch: $(head -3 "$TMP/cenv")"
fi
# One rank's spec is invalid: it says why (before init) and the job ends at once.
t0=$(date +%s)
timeout 60 "$gcoll_run" -n 2 --timeout 50 -x GCOLL_DEBUG=none -x S=q8 --rank-env 1:S=q4 \
    -- sh -c "exec '$BENCH' --compressor \$S -b 4K -e 4K -n 1 -w 0" >"$TMP/badspec" 2>&1
took=$(($(date +%s) - t0))
if [ $took -lt 10 ] && grep -q "gcoll-bench: compressor spec 'q4': unknown codec" "$TMP/badspec"; then
    pass "a bad spec on rank 1: it names it, the job ends after $took s"
else
    fail "bad spec on rank 1 ($took s): $(grep -v '^\[0\] #' "$TMP/badspec" | head -4)"
fi

# gcoll-train: the epochs' wire bytes and 'total wire MB' are the same quantity (rank 0's):
# the epochs add up to the total, which adds only the epoch statistics (3 doubles per
# epoch and their frame headers, well under 1 kB) and its own rounding to 1 kB. Summed
# over 2 ranks, the epochs would be about twice the total.
timeout 120 "$gcoll_run" -q -n 2 --timeout 100 -- "$top_builddir/tools/gcoll-train" --epochs 2 \
    --limit 1280 --csv -c topk:density=0.01+q8 >"$TMP/train" 2>&1
sum=$(awk -F, '$1 ~ /^[0-9]+$/ && NF == 8 { s += $5 } END { print s + 0 }' "$TMP/train")
tot=$(sed -n 's/^total wire MB: //p' "$TMP/train")
if [ -n "$tot" ] && awk -v s="$sum" -v t="$tot" 'BEGIN { d = t * 1e6 - s; exit !(s > 0 && d > -600 && d < 2000) }'; then
    pass "gcoll-train: the epochs' wire bytes ($sum) add up to 'total wire MB: $tot' (rank 0's)"
else
    fail "gcoll-train wire bytes: epochs $sum, total '$tot' MB: $(tail -n 4 "$TMP/train")"
fi

# A peer whose host vanishes without closing (here: loopback taken down in a private
# network namespace, as a cut link): rank 0, waiting in an allreduce on idle connections,
# fails with GCOLL_ERR_PEER from TCP keepalive (about 20 s), not at GCOLL_TIMEOUT_MS
# (60 s here; 30 minutes by default). Needs unshare -n (root or user namespaces).
if unshare -n true 2>/dev/null && command -v ip >/dev/null; then
    cat >"$TMP/vanish.sh" <<'EOS'
ip link set lo up
for r in 0 1; do
    GCOLL_TRANSPORT=tcp GCOLL_RANK=$r GCOLL_SIZE=2 GCOLL_ROOT=127.0.0.1:29500 \
        GCOLL_TIMEOUT_MS=60000 timeout -s KILL 60 "$1" silent 1 >"$2.$r" 2>&1 &
    eval p$r=\$!
done
sleep 2
ip link set lo down
i=0
while [ $i -lt 450 ] && ! grep -q "failed as expected" "$2.0"; do sleep 0.1; i=$((i + 1)); done
kill -9 $p0 $p1 2>/dev/null
EOS
    timeout 70 unshare -n sh "$TMP/vanish.sh" "$CHECK" "$TMP/vanish"
    t=$(sed -n 's/.*silent peer failed as expected after \([0-9.]*\) s: GCOLL_ERR_PEER.*/\1/p' "$TMP/vanish.0")
    if [ -n "$t" ] && awk -v t="$t" 'BEGIN { exit !(t < 40) }' &&
        grep -q "its host is unreachable" "$TMP/vanish.0"; then
        pass "a vanished peer host: GCOLL_ERR_PEER after $t s (keepalive), not the 60 s timeout"
    else
        fail "vanished peer host: $(tail -n 2 "$TMP/vanish.0")"
    fi
else
    note "skip: the vanished-host check needs unshare -n"
fi

# Rank 1 asks for another transport than rank 0: both are told which setting and values.
if "$INFO" -t | grep -q "^ucx *usable"; then
    timeout 120 "$gcoll_run" -n 2 -q --timeout 100 -x GCOLL_TRANSPORT=tcp \
        --rank-env 1:GCOLL_TRANSPORT=ucx -x GCOLL_DEBUG=none -- "$DEMO" >"$TMP/mm" 2>&1
    if grep -q "rank 0 has GCOLL_TRANSPORT=tcp, rank 1 has GCOLL_TRANSPORT=ucx" "$TMP/mm" &&
        ! grep -q "ranks disagree: ranks disagree" "$TMP/mm" &&
        grep -q "gcoll-demo: gcoll_comm_init failed: GCOLL_ERR_MISMATCH" "$TMP/mm"; then
        pass "a transport mismatch names GCOLL_TRANSPORT=tcp and =ucx (GCOLL_DEBUG=none)"
    else
        fail "transport mismatch: $(cat "$TMP/mm" | head -5)"
    fi
else
    note "skip: the transport mismatch needs ucx"
fi

finish
