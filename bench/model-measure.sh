#!/bin/sh
# model-measure.sh: the measurements that tools/gcoll-model fits and checks. Runs
# tools/gcoll-bench on each rank count for each dense algorithm and each codec, over
# loopback (gcoll-run) or over links shaped with tc tbf between network namespaces (one
# rank per namespace, as bench/netns-shaped.sh), and writes one CSV row per size:
#   link,ranks,algo,codec,bytes,time_us,comp_us,wire_bytes,load
#
#   bench/model-measure.sh BUILD_DIR OUT.csv              (loopback)
#   sudo LINK=1gbit bench/model-measure.sh BUILD_DIR OUT.csv   (shaped; needs root)
# Environment: RANKS ("2 3 4 6 8"), ALGOS ("ring rhd rd tree"), SPECS
# ("topk:density=0.01 q8"), DENSE ("-b 8 -e 16M -f 8 -n 10 -w 3"), COMP ("-b 4M -e 64M -f 4
# -n 3 -w 1"): gcoll-bench size and iteration flags for the dense and the compressed rows.
# Every launch adds -a 3 -z 2 -c 0: the slowest rank's time of blocking calls, unchecked
# (what the model predicts). REPEAT (1) runs everything that many times, interleaved; gcoll-model takes the median of
# a case's rows. Rows are appended to OUT.csv (the header is written when the file is new). Everything it
# creates (namespaces gcoll-mns*, gcoll-mbr, temp files) is removed on exit.
set -u
BUILD=${1:?usage: model-measure.sh BUILD_DIR OUT.csv}
OUT=${2:?usage: model-measure.sh BUILD_DIR OUT.csv}
BENCH="$BUILD/tools/gcoll-bench"
RUN="$BUILD/tools/gcoll-run"
LINK=${LINK:-loopback}
RANKS=${RANKS:-"2 3 4 6 8"}
ALGOS=${ALGOS:-"ring rhd rd tree"}
SPECS=${SPECS:-"topk:density=0.01 q8"}
if [ "$LINK" = loopback ]; then
    DENSE=${DENSE:-"-b 8 -e 16M -f 8 -n 10 -w 3"}
    COMP=${COMP:-"-b 4M -e 64M -f 4 -n 3 -w 1"}
else
    DENSE=${DENSE:-"-b 8 -e 64M -f 8 -n 3 -w 1"}
    COMP=${COMP:-"-b 16M -e 64M -f 4 -n 3 -w 1"}
fi
[ -x "$BENCH" ] || { echo "model-measure: $BENCH not built" >&2; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-model.XXXXXX")
NMAX=0
for p in $RANKS; do [ "$p" -gt "$NMAX" ] && NMAX=$p; done
PORT=29811

cleanup() {
    if [ "$LINK" != loopback ]; then
        for i in $(seq 0 $((NMAX - 1))); do ip netns del "gcoll-mns$i" 2>/dev/null; done
        ip netns del gcoll-mbr 2>/dev/null
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

if [ "$LINK" != loopback ]; then
    [ "$(id -u)" -eq 0 ] || { echo "model-measure: SKIP: shaped links need root"; exit 0; }
    cleanup
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-model.XXXXXX")
    ip netns add gcoll-mbr || { echo "model-measure: SKIP: no network namespaces"; exit 0; }
    ip -n gcoll-mbr link add br0 type bridge && ip -n gcoll-mbr link set br0 up
    for i in $(seq 0 $((NMAX - 1))); do
        ns=gcoll-mns$i
        ip netns add $ns
        ip link add "gm$i" netns $ns type veth peer name "gmb$i" netns gcoll-mbr
        ip -n $ns addr add "10.78.0.$((i + 1))/24" dev "gm$i"
        ip -n $ns link set "gm$i" up
        ip -n $ns link set lo up
        ip -n gcoll-mbr link set "gmb$i" master br0
        ip -n gcoll-mbr link set "gmb$i" up
        # both ends shaped, so that each direction of each rank's link carries LINK
        tc -n $ns qdisc replace dev "gm$i" root tbf rate "$LINK" burst 512kb latency 100ms
        tc -n gcoll-mbr qdisc replace dev "gmb$i" root tbf rate "$LINK" burst 512kb latency 100ms
    done
fi

# bench P ALGO CODEC ARGS...: one gcoll-bench launch; rank 0's CSV to $TMP/out.csv
bench() {
    p=$1 algo=$2 codec=$3
    shift 3
    if [ "$LINK" = loopback ]; then
        timeout 600 "$RUN" -n "$p" -q --timeout 590 -x GCOLL_TIMEOUT_MS=120s \
            "$BENCH" -a 3 -z 2 -c 0 "$@" --csv >"$TMP/all.csv" 2>"$TMP/err" || return 1
        grep -v '^\[' "$TMP/all.csv" >"$TMP/out.csv"
    else
        key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
        pids=""
        for i in $(seq 0 $((p - 1))); do
            ip netns exec "gcoll-mns$i" env GCOLL_RANK="$i" GCOLL_SIZE="$p" \
                GCOLL_ROOT="10.78.0.1:$PORT" GCOLL_JOB_KEY="$key" GCOLL_TIMEOUT_MS=120s \
                timeout 600 "$BENCH" -a 3 -z 2 -c 0 "$@" --csv >"$TMP/rank$i.csv" 2>"$TMP/rank$i.err" &
            pids="$pids $!"
        done
        ok=0
        for pid in $pids; do wait "$pid" || ok=1; done
        PORT=$((PORT + 1))
        cp "$TMP/rank0.csv" "$TMP/out.csv"
        [ $ok -eq 0 ] || return 1
    fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    # dense rows: size,count,type,redop,time_us,...; compressed: size,count,time_us,...
    awk -F, -v link="$LINK" -v p="$p" -v algo="$algo" -v codec="$codec" -v load="$load" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        /^[0-9]/ { comp = ("comp_us" in col) ? $col["comp_us"] : 0
                   wire = ("wire_bytes" in col) ? $col["wire_bytes"] : 0
                   printf "%s,%d,%s,%s,%s,%s,%s,%s,%s\n", link, p, algo, codec, $1,
                          $col["time_us"], comp, wire, load }' "$TMP/out.csv" >>"$OUT"
}

[ -s "$OUT" ] || echo "link,ranks,algo,codec,bytes,time_us,comp_us,wire_bytes,load" >"$OUT"
for rep in $(seq "${REPEAT:-1}"); do
for p in $RANKS; do
    for a in $ALGOS; do
        # shellcheck disable=SC2086
        bench "$p" "$a" none $DENSE --algo "$a" || echo "model-measure: $p ranks $a failed" >&2
    done
    for s in $SPECS; do
        # shellcheck disable=SC2086
        bench "$p" compressed "$s" $COMP --compressor "$s" || echo "model-measure: $p ranks $s failed" >&2
    done
    echo "model-measure: $LINK, run $rep, $p ranks done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done
done
