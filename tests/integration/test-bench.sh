#!/bin/sh
# test-bench.sh: gcoll-bench with nccl-tests' flags. Ranks started by hand: every collective
# with every dtype and op (-d all -o all) and -c 1 reports no wrong element, out of place
# and in place, on odd sizes and count 0; nccl-tests' long options and -i, -a, -z parse and
# show in the output; bad values are refused with the valid ones (exit 2); --json has its
# fields; the table ends with the Avg bus bandwidth line, equal to the mean of its busbw
# columns. Then the compressed allreduce under gcoll-run (exact against what the codecs
# sent).
. "$(dirname "$0")/lib.sh"
BENCH="$top_builddir/tools/gcoll-bench"

# hand NP OUT ENV... -- BENCH_ARGS...: NP ranks by hand (GCOLL_RANK/SIZE/ROOT/JOB_KEY), each
# with the VAR=VALUE settings before --; rank 0's stdout goes to OUT, every rank's stderr to
# OUT.errR. Returns 0 when every rank exited 0.
hand() {
    np=$1 out=$2
    shift 2
    envs=""
    while [ "$1" != -- ]; do envs="$envs $1"; shift; done
    shift
    port=$(free_port)
    key=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
    pids=""
    r=0
    while [ "$r" -lt "$np" ]; do
        o=/dev/null
        [ "$r" -eq 0 ] && o=$out
        # shellcheck disable=SC2086
        env $envs GCOLL_RANK=$r GCOLL_SIZE="$np" GCOLL_ROOT="127.0.0.1:$port" GCOLL_JOB_KEY="$key" \
            GCOLL_TIMEOUT_MS=60s timeout 120 "$BENCH" "$@" >"$o" 2>"$out.err$r" &
        pids="$pids $!"
        BG_PIDS="$BG_PIDS $!"
        r=$((r + 1))
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    return $rc
}

# Rows of a --csv run whose #wrong columns are not all "0" where the placement ran (empty
# where it did not); prints them.
wrong_rows() {
    awk -F, 'NR > 1 && ($8 != "0" && $8 != "" || $12 != "0" && $12 != "")' "$1"
}

# every collective, dtype and op, checked: sizes 3, 69, 1587, 36501 bytes (count 0 for the
# wider dtypes at 3 B, odd counts per rank), root 2 of 3 for the rooted collectives
for tr in $(transports); do
    for coll in allreduce reduce_scatter allgather alltoall broadcast sendrecv reduce gather scatter; do
        out="$TMP/all-$tr-$coll.csv"
        case $coll in
        allreduce | reduce_scatter | reduce) want=372 ;; # (6 float x 5 ops, 7 int x 8, bool x 7) x 4 sizes
        *) want=56 ;;                           # 14 dtypes x 4 sizes
        esac
        # columns that must be filled (1) or empty (0): out of place, in place
        case $coll in
        alltoall | sendrecv) places="1 0" ;;
        broadcast) places="0 1" ;;
        *) places="1 1" ;;
        esac
        if hand 3 "$out" GCOLL_TRANSPORT="$tr" -- --coll "$coll" -d all -o all -r 2 \
            -b 3 -e 40K -f 23 -n 2 -w 1 -c 1 --csv; then
            rows=$(grep -c '^[0-9]' "$out")
            bad=$(wrong_rows "$out" | wc -l)
            # shellcheck disable=SC2086
            set -- $places
            shape=$(awk -F, -v o="$1" -v i="$2" 'NR > 1 && (($5 != "") != o || ($9 != "") != i)' "$out" | wc -l)
            if [ "$rows" -eq "$want" ] && [ "$bad" -eq 0 ] && [ "$shape" -eq 0 ]; then
                pass "$tr: --coll $coll -d all -o all -c 1: $rows rows, none wrong"
            else
                fail "$tr: --coll $coll: $rows rows (want $want), $bad with wrong elements, $shape with the wrong placements"
                wrong_rows "$out" | head -n 5
                cat "$out.err0"
            fi
        else
            fail "$tr: --coll $coll -d all -o all failed"
            tail -n 5 "$out" "$out.err0" "$out.err1"
        fi
    done
done

# the long options, the additive step and every -a and -z: a 4-rank broadcast of int8 from
# root 3; sizes 1000, 1512, 2024 (-i)
for z in 0 1 2; do
    for a in 0 1 2 3; do
        out="$TMP/long-$z-$a.txt"
        if hand 4 "$out" -- --coll broadcast --minbytes 1000 --maxbytes 2100 --stepbytes 512 \
            --iters 3 --warmup_iters 1 --check 1 --op max --datatype int8 --root 3 \
            --average "$a" --blocking "$z" &&
            grep -q "^# gcoll-bench .*: broadcast on 4 ranks over .*-c 1 -a $a -z $z\$" "$out" &&
            [ "$(awk '$1 ~ /^[0-9]+$/ && $3 == "int8" && $5 == 3 && $9 == "-" && $13 == 0 {print $1}' "$out" | tr '\n' ' ')" = "1000 1512 2024 " ]; then
            pass "long options, -i, -a $a -z $z"
        else
            fail "long options, -a $a -z $z"
            cat "$out" "$out.err0"
        fi
    done
done

# a bitwise op and the nccl-tests aliases of the dtypes
out="$TMP/bxor.csv"
if hand 2 "$out" -- -d uint8 -o bxor -b 1K -e 1K -n 2 -w 1 --csv &&
   grep -q "^1024,1024,uint8,bxor,[0-9.]*,[0-9.]*,[0-9.]*,0,[0-9.]*,[0-9.]*,[0-9.]*,0,-1,allreduce,2$" "$out"; then
    pass "-d uint8 -o bxor"
else
    fail "-d uint8 -o bxor"
    cat "$out" "$out.err0"
fi
out="$TMP/alias.csv"
if hand 2 "$out" -- -d half -o min -b 64 -e 64 -n 1 -w 0 --csv && grep -q "^64,32,float16,min," "$out"; then
    pass "-d half is float16"
else
    fail "-d half"
    cat "$out" "$out.err0"
fi

# the table's closing lines: the wrong total and the mean busbw of every placement that ran
out="$TMP/table.txt"
if hand 2 "$out" -- --coll reduce_scatter -b 4K -e 64K -f 4 -n 5 -w 1; then
    res=$(awk '$1 ~ /^[0-9]+$/ { s += $8 + $12; n += 2 }
               /^# Avg bus bandwidth    : / { avg = $NF }
               END { d = avg - s / n; if (d < 0) d = -d
                     print (n == 6 && d <= 0.006) ? "ok" : "bad", avg, s / n }' "$out")
    if [ "${res%% *}" = ok ] && grep -q '^# Out of bounds values : 0 OK$' "$out"; then
        pass "# Avg bus bandwidth is the mean busbw (${res#ok })"
    else
        fail "# Avg bus bandwidth: $res"
        cat "$out"
    fi
else
    fail "table run"
    cat "$out" "$out.err0"
fi

# --json: a list of records with the collective, the rank count and both placements
out="$TMP/bench.json"
if hand 3 "$out" -- --coll allgather -b 1K -e 4K -n 1 -w 0 -d float16 --json &&
   python3 - "$out" <<'EOF'; then
import json, sys
recs = json.load(open(sys.argv[1]))
assert len(recs) == 3, recs
for r in recs:
    assert r["collective"] == "allgather" and r["ranks"] == 3 and r["type"] == "float16", r
    assert r["redop"] == "none" and r["root"] == -1 and r["count"] * 2 * 3 == r["size"], r
    for k in ("out_of_place", "in_place"):
        assert set(r[k]) == {"time_us", "algbw", "busbw", "wrong"} and r[k]["wrong"] == 0, r
        assert abs(r[k]["busbw"] - r[k]["algbw"] * 2 / 3) <= 1e-3 + 1e-3 * r[k]["algbw"], r
EOF
    pass "--json records"
else
    fail "--json output"
    cat "$out" "$out.err0"
fi

# bad values and unknown arguments: exit 2 with the valid values, before any rank starts
bad() {
    want=$1
    shift
    timeout 10 "$BENCH" "$@" >"$TMP/bad.log" 2>&1
    rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "$want" "$TMP/bad.log"; then
        pass "refused: $*"
    else
        fail "gcoll-bench $*: exit $rc, wanted 2 and '$want': $(head -n 2 "$TMP/bad.log")"
    fi
}
bad "bad value 'nonsense' for -o/--op; valid: sum avg min max prod band bor bxor all" -o nonsense
bad "valid: float32 float16 bfloat16 float64 int32 int64 bool int8 uint8 int16 uint32 uint64 float8_e4m3 float8_e5m2 all" --datatype float128
bad "bad value 'gossip' for --coll; valid: allreduce allgather reduce_scatter alltoall broadcast barrier compressed sendrecv reduce gather scatter" --coll gossip
bad "valid: 0 (rank 0), 1 (mean), 2 (min), 3 (max)" -a 4
bad "valid: 0 (nonblocking), 1 (blocking + barrier), 2 (blocking)" -z 3
bad "bad value 'x' for -c/--check" -c x
bad "bad value '1Q' for -b/--minbytes" -b 1Q
bad "bad value '0.5' for -f/--stepfactor" -f 0.5
bad "bad value '0' for -n/--iters" --iters 0
bad "valid: auto ring rhd tree rd" --algo fast
bad "-o band with -d float32: bitwise ops take the integer types and bool only" -o band
bad "unknown option '--bogus'" --bogus
bad "unknown option '-x'" -x
bad "unexpected argument 'extra'" extra
bad "--coll compressed needs --compressor" --coll compressed
bad "-b 4096 is larger than -e 1024" -b 4K -e 1K
bad "--compressor failed" --compressor bogus
out="$TMP/root.txt"
hand 2 "$out" -- --coll broadcast -r 2 -b 8 -e 8
[ $? -ne 0 ] && grep -q "bad value '2' for -r/--root; valid: 0 to 1" "$out.err0" &&
    pass "refused: -r 2 on 2 ranks" || fail "-r 2 on 2 ranks: $(cat "$out.err0")"

# check_z NAME ROWS ROW_REGEX GCOLL_RUN_ARGS... -- BENCH_ARGS...: a compressed gcoll-bench
# -c 1 run on 3 ranks passes when ROWS lines match ROW_REGEX and none has a wrong element
check_z() {
    name=$1 rows=$2 re=$3
    shift 3
    out="$TMP/bench-z.csv"
    if timeout 120 "$gcoll_run" -n 3 -q --timeout 100 "$@" -c 1 --csv >"$out" 2>&1 &&
       [ "$(grep -c "$re" "$out")" -eq "$rows" ] && ! awk -F, '/^[0-9]/ && $10 != "0"' "$out" | grep -q .; then
        pass "$name"
    else
        fail "$name"
        cat "$out"
    fi
}
# compressed allreduce: the result is exactly what the codecs sent, summed
for spec in "topk:density=0.01+q8" sign "randomk:density=0.02"; do
    check_z "--compressor $spec -c 1" 3 '^[0-9]' -- "$BENCH" --compressor "$spec" -b 4K -e 1M -f 16 -n 2 -w 1
done
# random-k's output built block by block and streamed (1M elements and more): 1048579
# elements, the last block partial
check_z "--compressor randomk -c 1, streamed output" 1 '^[0-9]' -- "$BENCH" \
    --compressor "randomk:density=0.01" -b 4194316 -e 4194316 -n 1 -w 1
# the same over the compressed ring (-c simulates the ring's hops): 1 element (fewer than
# ranks) up to 3073 (chunk 0 holds two 1024-element segments, the others one)
for spec in q8 sign; do
    check_z "--compressor $spec -c 1 over the compressed ring" 4 '^[0-9].*,ring$' \
        -x GCOLL_COMPRESSED_ALGO=ring -x GCOLL_RING_CHUNK=4096 -- \
        "$BENCH" --coll compressed --compressor "$spec" -b 4 -e 12292 -f 0 -i 4096 -n 1 -w 0
done
# top-k with its selection pass streamed (segments of 1024 elements: 16 and 256 of them)
check_z "--compressor topk -c 1, streamed" 2 '^[0-9].*,streamed sparse$' \
    -x GCOLL_TOPK_STREAM=1024 -- "$BENCH" --compressor "topk:density=0.01" -b 64K -e 1M -f 16 -n 2 -w 1
# its phases at GCOLL_DEBUG=trace (what bench/stream-trace.sh reads): a line per call in each
# rank's own GCOLL_DEBUG_FILE, the same number on the 3 ranks, at least 3 each (1 warm-up,
# 2 timed; -c 1 adds its checked calls)
rm -f "$TMP"/trace.*
check_z "--compressor topk, streamed, traced" 1 '^[0-9].*,streamed sparse$' \
    -x GCOLL_TOPK_STREAM=1024 -x GCOLL_DEBUG=trace -x GCOLL_DEBUG_SUBSYS=COMPRESS \
    -x "GCOLL_DEBUG_FILE=$TMP/trace.%p" -- "$BENCH" --compressor "topk:density=0.01" -b 1M -e 1M -n 2 -w 1
re='topk-stream phases: rank [0-2] count 262144 pass_ms [0-9.]* net_ms [0-9.]* tail_ms [0-9.]* wait_ms [0-9.]* sum_ms [0-9.]*$'
counts=$(cat "$TMP"/trace.* 2>/dev/null | grep "$re" | sed 's/.*phases: rank \([0-9]\).*/\1/' | sort | uniq -c |
    awk '{print $1}' | tr '\n' ' ')
set -- $counts
[ $# -eq 3 ] && [ "$1" -ge 3 ] && [ "$1" = "$2" ] && [ "$1" = "$3" ] &&
    pass "streamed top-k traces its phases ($1 lines per rank)" ||
    fail "streamed top-k's phase trace: lines per rank '$counts': $(cat "$TMP"/trace.* 2>/dev/null | grep -v "$re" | head -3)"
finish
