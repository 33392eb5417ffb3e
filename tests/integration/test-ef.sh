#!/bin/sh
# test-ef.sh: error feedback keeps its promise for every codec: the mean of 200 compressed
# allreduces of a fixed gradient per rank is within the bound each codec's contraction
# factor delta gives (coll_check efmean), on 1-5 ranks by the default schemes and on 3 by
# the ring that re-quantizes at every hop; fp8/MX's one-step error on 2 and 4 ranks;
# clipping of the whole tensor inside the collective, and all-zero and huge-value gradients through every scheme (coll_check clip).
. "$(dirname "$0")/lib.sh"

tr=tcp # the codecs and schemes under test do not depend on the transport
for n in 1 2 3 4 5; do
    out="$TMP/efmean-$n.log"
    if timeout 600 "$gcoll_run" -n "$n" --timeout 580 -x GCOLL_TRANSPORT=$tr \
        -x GCOLL_TIMEOUT_MS=60s -- "$CHECK" efmean >"$out" 2>&1; then
        pass "error feedback: every codec's mean within its delta bound, $n rank(s)"
    else
        fail "error feedback: $n rank(s)"
        grep -v ' INFO ' "$out" | tail -n 30
    fi
done
out="$TMP/efmean-ring.log"
if timeout 600 "$gcoll_run" -n 3 --timeout 580 -x GCOLL_TRANSPORT=$tr -x GCOLL_TIMEOUT_MS=60s \
    -x GCOLL_COMPRESSED_ALGO=ring -x GCOLL_RING_CHUNK=4kb -- "$CHECK" efmean >"$out" 2>&1 &&
    grep -q "(ring)" "$out"; then
    pass "error feedback: every codec's mean within its delta bound, ring scheme, 3 ranks"
else
    fail "error feedback: ring scheme, 3 ranks"
    grep -v ' INFO ' "$out" | tail -n 30
fi
# fp8 and MX are reduced in fp32 (decoded, summed, quantized once more by the chunk's owner):
# auto picks the all-to-all scheme even where q8 takes the ring (GCOLL_RING_CHUNK=4kb, 10000
# floats per rank), and one step's error on 4 ranks is about the one on 2 (measured: mxfp8
# 0.0498 against 0.0522, mxfp4 0.224 against 0.230; mxfp8 by the forced ring on 4 ranks: 0.0557)
for spec in mxfp8:format=e4m3 mxfp4 fp8:format=e5m2,round=stochastic; do
    for n in 2 4; do
        timeout 120 "$gcoll_run" -n "$n" --timeout 100 -x GCOLL_TRANSPORT=$tr \
            -x GCOLL_TIMEOUT_MS=60s -x GCOLL_RING_CHUNK=4kb -- "$CHECK" onestep "$spec" 40000 \
            >"$TMP/onestep-$n.log" 2>&1
    done
    e2=$(sed -n 's/.*onestep .*: 2 rank(s), alltoall, relative error //p' "$TMP/onestep-2.log")
    e4=$(sed -n 's/.*onestep .*: 4 rank(s), alltoall, relative error //p' "$TMP/onestep-4.log")
    if [ -n "$e2" ] && [ -n "$e4" ] && awk -v a="$e2" -v b="$e4" 'BEGIN { exit !(b <= 1.25 * a) }'; then
        pass "$spec: one step's error on 4 ranks $e4, on 2 ranks $e2 (fp32 reduction, all-to-all)"
    else
        fail "$spec: one step's error on 4 ranks '$e4' against 2 ranks '$e2'"
        grep -v ' INFO ' "$TMP/onestep-2.log" "$TMP/onestep-4.log" | tail -n 20
    fi
done
# EF21 random-k (feedback=ef21): the output is the estimate G = mean of the values last sent,
# so for a fixed gradient an element is exact from its first selection on; the mean of T
# steps misses it by the steps before that, geometric with p = 0.25: RMS sqrt((2 - p) / p^2)
# = 5.3 steps of 200, a relative error of about 0.026 (measured 0.0212 on 2 ranks, 0.0243
# on 3); bound 0.05
for n in 2 3; do
    out="$TMP/ef21-$n.log"
    timeout 120 "$gcoll_run" -n "$n" --timeout 100 -x GCOLL_TRANSPORT=$tr -x GCOLL_TIMEOUT_MS=60s \
        -- "$CHECK" efmean randomk:density=0.25,seed=5,feedback=ef21 200 4000 >"$out" 2>&1
    rel=$(sed -n 's/^\[0\] efmean .*relative l2 error of the mean \([^,]*\),.*/\1/p' "$out")
    if [ -n "$rel" ] && awk -v r="$rel" 'BEGIN { exit !(r <= 0.05) }'; then
        pass "EF21 random-k: the mean of 200 allreduces within $rel of the exact mean, $n ranks"
    else
        fail "EF21 random-k: error of the mean '$rel', $n ranks"
        grep -v ' INFO ' "$out" | tail -n 20
    fi
done
for n in 1 3 4; do
    out="$TMP/clip-$n.log"
    if timeout 300 "$gcoll_run" -n "$n" --timeout 280 -x GCOLL_TRANSPORT=$tr \
        -x GCOLL_TIMEOUT_MS=60s -- "$CHECK" clip >"$out" 2>&1; then
        pass "clip=C over the whole tensor and clip_value=V inside the collective, $n rank(s)"
    else
        fail "clipping inside the collective, $n rank(s)"
        grep -v ' INFO ' "$out" | tail -n 30
    fi
done
finish
