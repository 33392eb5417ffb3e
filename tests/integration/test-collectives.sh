#!/bin/sh
# test-collectives.sh: every collective, dtype, op and count on 1-5 ranks, on every
# transport built, checked against independently computed results. The all and allreduce
# modes include check_dtypes.c: the integer, bool and fp8 dtypes and the bitwise ops, so
# every forced allreduce algorithm below runs them too.
. "$(dirname "$0")/lib.sh"

for tr in $(transports); do
    for n in 1 2 3 4 5; do
        out="$TMP/coll-$tr-$n.log"
        if timeout 600 "$gcoll_run" -n "$n" --timeout 500 -x GCOLL_TRANSPORT="$tr" \
            -x GCOLL_TIMEOUT_MS=60s -- "$CHECK" all >"$out" 2>&1; then
            pass "$tr: $n rank(s): $(grep -c 'checks passed' "$out") rank(s) passed"
        else
            fail "$tr: $n rank(s)"
            tail -n 40 "$out"
        fi
    done
    # every allreduce algorithm forced in turn, on rank counts with and without a power of two
    for algo in ring rhd tree rd; do
        for n in 3 4; do
            out="$TMP/allreduce-$tr-$algo-$n.log"
            if timeout 600 "$gcoll_run" -n "$n" --timeout 500 -x GCOLL_TRANSPORT="$tr" \
                -x GCOLL_ALGO="$algo" -x GCOLL_TIMEOUT_MS=60s -- "$CHECK" allreduce >"$out" 2>&1; then
                pass "$tr: allreduce forced to $algo on $n ranks"
            else
                fail "$tr: allreduce forced to $algo on $n ranks"
                tail -n 40 "$out"
            fi
        done
    done
    # the ring with its pipelining depth limited (GCOLL_RING_DEPTH), in chunks small enough
    # that a step has many: sends held back and posted as earlier ones complete
    for depth in 1 3; do
        out="$TMP/allreduce-$tr-depth$depth.log"
        if timeout 600 "$gcoll_run" -n 3 --timeout 500 -x GCOLL_TRANSPORT="$tr" \
            -x GCOLL_ALGO=ring -x GCOLL_RING_DEPTH=$depth -x GCOLL_RING_CHUNK=4kb \
            -x GCOLL_TIMEOUT_MS=60s -- "$CHECK" allreduce >"$out" 2>&1; then
            pass "$tr: ring allreduce with depth $depth (4 KiB chunks), 3 ranks"
        else
            fail "$tr: ring allreduce with depth $depth (4 KiB chunks), 3 ranks"
            tail -n 40 "$out"
        fi
    done
    # sparse allreduce: each plan forced, then auto, which must use more than one plan
    for plan in allgather split dense auto; do
        for n in 3 4; do
            out="$TMP/sparse-$tr-$plan-$n.log"
            if timeout 300 "$gcoll_run" -n "$n" --timeout 250 -x GCOLL_TRANSPORT="$tr" \
                -x GCOLL_SPARSE_ALGO="$plan" -x GCOLL_DEBUG=info -x GCOLL_DEBUG_SUBSYS=COLL \
                -- "$CHECK" sparse >"$out" 2>&1; then
                pass "$tr: sparse allreduce, plan $plan, $n ranks"
            else
                fail "$tr: sparse allreduce, plan $plan, $n ranks"
                grep -v ' INFO ' "$out" | tail -n 30
            fi
        done
    done
    for n in 2 4; do
        out="$TMP/bucketer-$tr-$n.log"
        if timeout 300 "$gcoll_run" -n "$n" --timeout 250 -x GCOLL_TRANSPORT="$tr" \
            -- "$CHECK" bucketer >"$out" 2>&1; then
            pass "$tr: bucketer (any ready order, accumulation, one-bucket codecs), $n ranks"
        else
            fail "$tr: bucketer, $n ranks"
            tail -n 30 "$out"
        fi
    done
    # top-k and DGC in a fused bucket: per tensor (the default) and across the bucket
    for sel in 1 0; do
        out="$TMP/bucket-layers-$tr-$sel.log"
        if timeout 300 "$gcoll_run" -n 3 --timeout 250 -x GCOLL_TRANSPORT="$tr" \
            -x GCOLL_LAYER_SELECT=$sel -- "$CHECK" bucket_layers >"$out" 2>&1 &&
           grep -q "per-$([ $sel = 1 ] && echo tensor || echo bucket) selection in one bucket" "$out"; then
            pass "$tr: GCOLL_LAYER_SELECT=$sel: $(grep -m1 'selection in one bucket' "$out" | sed 's/^.*rank [0-9]*: //')"
        else
            fail "$tr: bucket_layers, GCOLL_LAYER_SELECT=$sel"
            tail -n 30 "$out"
        fi
    done
    # bandwidth starts from the init probe (GCOLL_PROBE=1; the check wants the same
    # positive figure on every rank), both from its first step (and no probe figure)
    for mode in bandwidth both snr+stage+budget+phase snr+bandwidth; do
        out="$TMP/adapt-$tr-$mode.log"
        probe=0
        [ "$mode" = bandwidth ] && probe=1
        if timeout 300 "$gcoll_run" -n 3 --timeout 250 -x GCOLL_TRANSPORT="$tr" \
            -x GCOLL_ADAPT="$mode" -x GCOLL_DENSITY_MIN=0.001 -x GCOLL_DENSITY_MAX=0.2 \
            -x GCOLL_PROBE=$probe -- "$CHECK" adapt >"$out" 2>&1 &&
            { [ $probe = 0 ] || [ "$(grep -c 'probe bandwidth .* the same on every rank' "$out")" = 3 ]; }; then
            pass "$tr: adaptation ($mode, probe $probe): same densities on every rank, within bounds"
        else
            fail "$tr: adaptation ($mode)"
            tail -n 30 "$out"
        fi
    done
    # the gcoll_adapt controller on compressed allreduce (2 and 3 ranks; the noise scale
    # against its closed form needs the smoothing to average the whole run), then the
    # streamed top-k under the bucketer's adaptation against an unadapted call
    for np in 2 3; do
        out="$TMP/adapt-ctl-$tr-$np.log"
        if timeout 300 "$gcoll_run" -n $np --timeout 250 -x GCOLL_TRANSPORT="$tr" \
            -x GCOLL_ADAPT_STAT_HALF_LIFE=100000 -- "$CHECK" adapt_ctl >"$out" 2>&1; then
            pass "$tr: gcoll_adapt controller on $np ranks: same decisions everywhere, noise scale within its bound, joined controllers split the budget"
        else
            fail "$tr: gcoll_adapt controller on $np ranks"
            tail -n 30 "$out"
        fi
    done
    out="$TMP/adapt-stream-$tr.log"
    if timeout 300 "$gcoll_run" -n 3 --timeout 250 -x GCOLL_TRANSPORT="$tr" \
        -x GCOLL_ADAPT=bandwidth -x GCOLL_DENSITY_MIN=0.01 -x GCOLL_DENSITY_MAX=0.01 \
        -x GCOLL_TOPK_STREAM=1024 -x GCOLL_DEBUG=debug -x GCOLL_DEBUG_SUBSYS=COMPRESS \
        -- "$CHECK" adapt_stream >"$out" 2>&1 &&
        [ "$(grep -c 'streamed top-k:' "$out")" -ge 48 ]; then
        pass "$tr: streamed top-k under adaptation: streamed, bit-identical to the unadapted call"
    else
        fail "$tr: streamed top-k under adaptation ($(grep -c 'streamed top-k:' "$out") streamed runs)"
        tail -n 30 "$out"
    fi
    # every codec under the default scheme choice, then over the pipelined ring that
    # re-quantizes at every hop, with segments small enough that every chunk is cut into
    # several (the simulation in the check follows the same cut; the log shows the ring ran),
    # then with top-k's selection pass streamed in segments of 1024 elements (the
    # 30011-element top-k tensors of the check go by the streamed scheme; the log shows it)
    for scheme in auto ring stream; do
        set -- -x GCOLL_COMPRESSED_ALGO="$scheme"
        want=""
        [ "$scheme" = ring ] && set -- "$@" -x GCOLL_RING_CHUNK=16384 -x GCOLL_DEBUG=info &&
            want="ring scheme (forced"
        [ "$scheme" = stream ] && set -- -x GCOLL_TOPK_STREAM=1024 -x GCOLL_DEBUG=info &&
            want="streamed sparse scheme (top-k"
        for n in 2 3 5; do
            out="$TMP/compressed-$scheme-$tr-$n.log"
            if timeout 300 "$gcoll_run" -n "$n" --timeout 250 -x GCOLL_TRANSPORT="$tr" "$@" \
                -- "$CHECK" compressed >"$out" 2>&1 &&
               { [ -z "$want" ] || grep -q "$want" "$out"; }; then
                pass "$tr: compressed allreduce and reduce-scatter, every codec, $scheme scheme, $n ranks"
            else
                fail "$tr: compressed allreduce, $scheme scheme, $n ranks"
                grep -v " INFO " "$out" | tail -n 30
            fi
        done
    done
    if grep -q "sparse allreduce: allgather plan" "$TMP/sparse-$tr-auto-4.log" &&
       grep -q "sparse allreduce: dense plan" "$TMP/sparse-$tr-auto-4.log"; then
        pass "$tr: sparse auto switches between allgather and dense by density"
    else
        fail "$tr: sparse auto did not use both the allgather and the dense plan"
    fi
done
finish
