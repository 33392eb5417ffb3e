#!/bin/sh
# test-warmup.sh: the warm-up schedules on the wire (the bytes each step sends follow the
# density, or qsgd's bit width, 2 and 3 ranks), and the layer policy by layer: each tensor's spec through
# gcoll_bucketer_tensor_spec on gcoll-overlap-bench's ResNet-50 list and on gcoll-train's
# MLP, and the info-level line naming the rule that chose it.
. "$(dirname "$0")/lib.sh"
unset GCOLL_COMPRESSOR GCOLL_LAYER_POLICY GCOLL_BUCKET_BYTES GCOLL_LAYER_SELECT

for n in 2 3; do
    out="$TMP/warmup-$n.log"
    if timeout 120 "$gcoll_run" -n "$n" --timeout 100 -x GCOLL_SPARSE_ALGO=allgather \
        -- "$CHECK" warmup >"$out" 2>&1; then
        pass "warm-up on the wire, $n ranks: $(grep -c 'step [0-9]*: density' "$out") steps of exp, linear and step density schedules, $(grep -c 'warmup qsgd step' "$out") of qsgd bit widths"
    else
        fail "warm-up on the wire, $n ranks"
        tail -n 20 "$out"
    fi
done

# ResNet-50: first is conv1 (not shadowed by the size rule), last is the fc layer, weight
# and bias alike; the batch norms by name; the rest by the catch-all
policy='*bn*=none;size<16384=none;first=fp16;last=bf16;*=topk:density=0.001'
out="$TMP/resnet.txt"
if GCOLL_LAYER_POLICY="$policy" timeout 60 "$gcoll_run" -q -n 1 \
    "$top_builddir/tools/gcoll-overlap-bench" -L >"$out" 2>"$out.err"; then
    want="conv1.weight fp16
bn1.weight none
layer1.0.conv1.weight none
layer1.0.downsample.weight topk:density=0.001
layer1.0.downsample.bn.bias none
layer3.5.conv2.weight topk:density=0.001
layer4.2.bn3.bias none
fc.weight bf16
fc.bias bf16"
    bad=0
    echo "$want" | while read -r name spec; do
        got=$(awk -v n="$name" '$1 == n {print $3}' "$out")
        [ "$got" = "$spec" ] || { echo "$name: got '$got', want '$spec'"; exit 1; }
    done || bad=1
    lines=$(wc -l <"$out")
    if [ "$bad" = 0 ] && [ "$lines" -eq 161 ]; then
        pass "ResNet-50 policy by layer: conv1 first, fc.weight and fc.bias last, 161 tensors"
    else
        fail "ResNet-50 policy ($lines lines)"
        cat "$out"
    fi
else
    fail "gcoll-overlap-bench -L: $(tail -n 3 "$out.err")"
fi

# gcoll-train's MLP (registered fc3.bias, fc3.weight, ..., fc1.weight): both tensors of the
# first and last layers; the info line names the rule
data="${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
if [ -e "$data/train-images-idx3-ubyte.gz" ] || [ -e "$data/train-images-idx3-ubyte" ]; then
    out="$TMP/mlp.txt"
    if timeout 120 "$gcoll_run" -q -n 2 -x GCOLL_DEBUG=info -x GCOLL_DEBUG_SUBSYS=COLL \
        "$top_builddir/tools/gcoll-train" --data "$data" --limit 1280 --test-limit 500 \
        --epochs 1 --compressor topk:density=0.01 --policy 'first=fp16;last=bf16' \
        >"$out" 2>"$out.err"; then
        want='tensor specs (warm-up of sparsifiers: 1 steps): fc3.bias=bf16; fc3.weight=bf16; fc2.bias=topk:density=0.01; fc2.weight=topk:density=0.01; fc1.bias=fp16; fc1.weight=fp16'
        if grep -qF "$want" "$out" &&
           grep -q "tensor 1 'fc3.weight' (layer 'fc3', 2560 elements) -> bucket 1, bf16 (policy rule 2)" "$out.err" &&
           grep -q "tensor 5 'fc1.weight' (layer 'fc1', 401408 elements) -> bucket 5, fp16 (policy rule 1)" "$out.err"; then
            pass "gcoll-train MLP policy by layer, printed and logged at info"
        else
            fail "gcoll-train MLP policy"
            grep 'tensor' "$out" "$out.err" | head -n 12
        fi
    else
        fail "gcoll-train MLP policy run: $(tail -n 3 "$out.err")"
    fi
else
    note "Fashion-MNIST not found: gcoll-train's policy check skipped"
fi
finish
