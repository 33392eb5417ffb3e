# train-lib.sh: what the gcoll-train scripts share (sourced after lib.sh): the binary, the
# dataset, no inherited codec settings, and a skip (77) when the dataset cannot be read.
TRAIN="$top_builddir/tools/gcoll-train"
data="${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
unset GCOLL_COMPRESSOR GCOLL_LAYER_POLICY GCOLL_BUCKET_BYTES

if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
    echo "SKIP: Fashion-MNIST not found in $data (Debian: apt-get install dataset-fashion-mnist)"
    exit 77
fi
if [ ! -e "$data/train-images-idx3-ubyte" ] && "$TRAIN" --help | grep -q 'gzip no'; then
    echo "SKIP: gcoll-train was built without zlib and $data holds only gzipped files"
    exit 77
fi

# kill_one_rank KEY LINE ARGS...: 3 ranks of gcoll-train ARGS started by hand (job key KEY);
# once rank 0 printed a line matching LINE (or an error), rank 2 is killed, and ranks 0 and 1
# must fail with a GCOLL_ERR status well within the timeout, not hang.
kill_one_rank() {
    key=$1
    line=$2
    shift 2
    port=$(free_port)
    export GCOLL_ROOT="127.0.0.1:$port" GCOLL_SIZE=3 GCOLL_JOB_KEY=$key GCOLL_TIMEOUT_MS=10s
    pids=""
    for r in 0 1 2; do
        GCOLL_RANK=$r timeout 60 "$TRAIN" --data "$data" --limit 19200 --test-limit 500 \
            --batch 32 --epochs 50 "$@" >"$TMP/k$r.log" 2>&1 &
        pids="$pids $!"
        BG_PIDS="$BG_PIDS $!"
    done
    i=0
    while [ $i -lt 300 ] && ! grep -q "$line" "$TMP/k0.log" && ! grep -q 'ERR' "$TMP/k0.log"; do
        sleep 0.1
        i=$((i + 1))
    done
    set -- $pids
    pkill -9 -P "$3" # the pids are timeout(1)'s: kill its child, the rank itself
    start=$(date +%s)
    wait "$1"; s0=$?
    wait "$2"; s1=$?
    took=$(( $(date +%s) - start ))
    if [ $i -ge 300 ]; then
        fail "killed rank: the job never printed an epoch line: $(tail -n 2 "$TMP/k0.log")"
    elif [ "$s0" -ne 0 ] && [ "$s0" -ne 124 ] && [ "$s1" -ne 0 ] && [ "$s1" -ne 124 ] &&
        [ "$took" -le 10 ] && grep -q 'GCOLL_ERR' "$TMP/k0.log" &&
        grep -q 'GCOLL_ERR' "$TMP/k1.log"; then
        pass "rank 2 killed: ranks 0 and 1 failed after ${took} s: $(grep -m1 GCOLL_ERR "$TMP/k0.log")"
    else
        fail "rank 2 killed: exit statuses $s0 $s1 after ${took} s: $(tail -n 1 "$TMP/k0.log")" \
            "/ $(tail -n 1 "$TMP/k1.log")"
    fi
    unset GCOLL_ROOT GCOLL_SIZE GCOLL_JOB_KEY GCOLL_TIMEOUT_MS
}
