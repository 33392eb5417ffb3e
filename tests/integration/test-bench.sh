#!/bin/sh
# test-bench.sh: gcoll-bench runs every collective with -c on a few sizes and reports no
# wrong element; its CSV and JSON outputs are well formed.
. "$(dirname "$0")/lib.sh"
BENCH="$top_builddir/tools/gcoll-bench"
for tr in $(transports); do
    for coll in allreduce allgather reduce_scatter alltoall broadcast; do
        out="$TMP/bench-$tr-$coll.csv"
        if timeout 120 "$gcoll_run" -n 3 -q --timeout 100 -x GCOLL_TRANSPORT="$tr" -- \
            "$BENCH" -o "$coll" -b 12 -e 3M -f 8 -n 2 -w 1 -c --csv >"$out" 2>&1; then
            rows=$(grep -c '^[0-9]' "$out")
            bad=$(awk -F, '/^[0-9]/ && $8 != "0"' "$out" | wc -l)
            if [ "$rows" -ge 4 ] && [ "$bad" -eq 0 ]; then
                pass "$tr: gcoll-bench -o $coll -c: $rows sizes, none wrong"
            else
                fail "$tr: gcoll-bench -o $coll: $rows rows, $bad with wrong elements"
                cat "$out"
            fi
        else
            fail "$tr: gcoll-bench -o $coll failed"
            tail -n 20 "$out"
        fi
    done
done
# the dtypes after the first six: integer sums checked (-c), bool and fp8 run (their
# results are checked by coll_check's dtypes part), a bitwise op on uint8
for dt in int8 uint8 int16 uint32 uint64 bool float8_e4m3 float8_e5m2; do
    out="$TMP/bench-dtype-$dt.csv"
    if timeout 120 "$gcoll_run" -n 3 -q --timeout 100 -- \
        "$BENCH" -d "$dt" -b 8 -e 64K -f 16 -n 2 -w 1 -c --csv >"$out" 2>&1 &&
       [ "$(grep -c "^[0-9].*,$dt," "$out")" -ge 3 ] &&
       ! awk -F, '/^[0-9]/ && $8 != "0" && $8 != "N/A"' "$out" | grep -q .; then
        case $dt in
        bool | float8*) pass "gcoll-bench -d $dt: $(grep -c '^[0-9]' "$out") sizes ran (not checked here)" ;;
        *) pass "gcoll-bench -d $dt -c: $(grep -c '^[0-9]' "$out") sizes, none wrong" ;;
        esac
    else
        fail "gcoll-bench -d $dt"
        cat "$out"
    fi
done
out="$TMP/bench-bxor.csv"
if timeout 120 "$gcoll_run" -n 3 -q --timeout 100 -- \
    "$BENCH" -d uint8 -r bxor -b 1K -e 1K -n 2 -w 1 --csv >"$out" 2>&1 &&
   grep -q "^1024,1024,uint8,bxor," "$out"; then
    pass "gcoll-bench -d uint8 -r bxor"
else
    fail "gcoll-bench -d uint8 -r bxor"
    cat "$out"
fi
# check_z NAME ROWS ROW_REGEX GCOLL_RUN_ARGS... -- BENCH_ARGS...: a compressed gcoll-bench -c
# run on 3 ranks passes when ROWS lines match ROW_REGEX and none has a wrong element
check_z() {
    name=$1 rows=$2 re=$3
    shift 3
    out="$TMP/bench-z.csv"
    if timeout 120 "$gcoll_run" -n 3 -q --timeout 100 "$@" -c --csv >"$out" 2>&1 &&
       [ "$(grep -c "$re" "$out")" -eq "$rows" ] && ! awk -F, '/^[0-9]/ && $10 != "0"' "$out" | grep -q .; then
        pass "$name"
    else
        fail "$name"
        cat "$out"
    fi
}
# compressed allreduce: the result is exactly what the codecs sent, summed
for spec in "topk:density=0.01+q8" sign "randomk:density=0.02"; do
    check_z "gcoll-bench -z $spec -c" 3 '^[0-9]' -- "$BENCH" -z "$spec" -b 4K -e 1M -f 16 -n 2 -w 1
done
# random-k's output built block by block and streamed (1M elements and more): 1048579
# elements, the last block partial
check_z "gcoll-bench -z randomk -c, streamed output" 1 '^[0-9]' -- "$BENCH" \
    -z "randomk:density=0.01" -b 4194316 -e 4194316 -n 1 -w 1
# the same over the compressed ring (-c simulates the ring's hops): 1 element (fewer than
# ranks) up to 3073 (chunk 0 holds two 1024-element segments, the others one)
for spec in q8 sign; do
    check_z "gcoll-bench -z $spec -c over the compressed ring" 4 '^[0-9].*,ring$' \
        -x GCOLL_COMPRESSED_ALGO=ring -x GCOLL_RING_CHUNK=4096 -- \
        "$BENCH" -z "$spec" -b 4 -e 12292 -f 0 -i 4096 -n 1 -w 0
done
# top-k with its selection pass streamed (segments of 1024 elements: 16 and 256 of them)
check_z "gcoll-bench -z topk -c, streamed" 2 '^[0-9].*,streamed sparse$' \
    -x GCOLL_TOPK_STREAM=1024 -- "$BENCH" -z "topk:density=0.01" -b 64K -e 1M -f 16 -n 2 -w 1
out="$TMP/bench.json"
timeout 60 "$gcoll_run" -n 2 -q -- "$BENCH" -b 1K -e 4K -n 1 -w 0 -d half -r max --json >"$out" 2>&1
if [ "$(grep -c '"busbw"' "$out")" -eq 3 ] && head -n 1 "$out" | grep -q '^\[' &&
   tail -n 1 "$out" | grep -q '^\]'; then
    pass "gcoll-bench --json"
else
    fail "gcoll-bench --json output"
    cat "$out"
fi
timeout 30 "$BENCH" -o nonsense >"$TMP/usage.log" 2>&1
[ $? -eq 2 ] && grep -q "bad value 'nonsense' for -o" "$TMP/usage.log" && pass "bad option" ||
    fail "gcoll-bench bad option: $(cat "$TMP/usage.log")"
finish
