#!/bin/sh
# test-ef.sh: error feedback keeps its promise for every codec: the mean of 200 compressed
# allreduces of a fixed gradient per rank is within the bound each codec's contraction
# factor delta gives (coll_check efmean), on 1-5 ranks by the default schemes and on 3 by
# the ring that re-quantizes at every hop; clipping of the whole tensor inside the
# collective, and all-zero and huge-value gradients through every scheme (coll_check clip).
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
