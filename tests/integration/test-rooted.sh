#!/bin/sh
# test-rooted.sh: gcoll_reduce, gcoll_gather and gcoll_scatter (rooted_check.c) on 1-5 ranks
# started by hand (GCOLL_RANK/SIZE/ROOT/JOB_KEY), over tcp and over ucx on shared memory and
# on its tcp: every root, dtype, op, odd counts and 0, in place, NULL buffers off the root,
# nonblocking, interleaved with allreduce and compressed allreduce; each algorithm forced
# with large counts cut into many ring chunks and slices, and with messages of 1 MiB and
# more, which wait for their receive (a late receiver with a small unexpected-message
# bound); a control showing the tree-order
# float check tells the algorithms apart; roots out of range (GCOLL_ERR_INVALID) and ranks
# naming different roots (GCOLL_ERR_MISMATCH, in bounded time). Ranks leave as soon as they
# are done, and none may see another's close with operations still pending (the rooted
# calls' probe receives are withdrawn at gcoll_comm_destroy).
. "$(dirname "$0")/lib.sh"
RCHECK="$top_builddir/tests/integration/rooted_check"

# launch NAME N [VAR=value ...] -- ARGS...: N ranks by hand, each bounded by timeout(1);
# succeeds when every rank exits 0. Rank r's output: $TMP/NAME.r
launch() {
    name=$1 n=$2
    shift 2
    envs=""
    while [ "$1" != "--" ]; do envs="$envs $1"; shift; done
    shift
    port=$(free_port)
    pids=""
    r=0
    while [ "$r" -lt "$n" ]; do
        # shellcheck disable=SC2086
        env GCOLL_RANK=$r GCOLL_SIZE="$n" GCOLL_ROOT="127.0.0.1:$port" GCOLL_JOB_KEY="rooted-$name" \
            GCOLL_TIMEOUT_MS=20s $envs timeout 120 "$RCHECK" "$@" >"$TMP/$name.$r" 2>&1 &
        pids="$pids $!"
        BG_PIDS="$BG_PIDS $!"
        r=$((r + 1))
    done
    ok=0
    for p in $pids; do wait "$p" || ok=1; done
    return $ok
}

show() { # the failures of run $1 on $2 ranks
    r=0
    while [ "$r" -lt "$2" ]; do grep -v ' WARN ' "$TMP/$1.$r" | tail -n 8; r=$((r + 1)); done
}

# transports: tcp, and ucx on shared memory and on its tcp when this build has it
variants="tcp"
"$top_builddir/tools/gcoll-info" -t | grep -q '^ucx *usable' && variants="tcp ucx-shm ucx-tcp"
[ -n "${GCOLL_TEST_TRANSPORTS:-}" ] && variants="$GCOLL_TEST_TRANSPORTS"
for v in $variants; do
    case "$v" in
    ucx-*) tenv="GCOLL_TRANSPORT=ucx $(ucx_variant_env "$v")" ;;
    *) tenv="GCOLL_TRANSPORT=$v" ;;
    esac
    for n in 1 2 3 4 5; do
        # shellcheck disable=SC2086
        if launch "all-$v-$n" "$n" $tenv -- all && ! cat "$TMP/all-$v-$n".* | grep -q 'pending'; then
            pass "$v: $n rank(s), cost model's choice: $(grep -h 'checks passed' "$TMP/all-$v-$n.0" | sed 's/.*: //')"
        else
            fail "$v: $n rank(s), cost model's choice"
            show "all-$v-$n" "$n"
        fi
    done
    [ "$v" = ucx-tcp ] && continue # the algorithms forced: tcp and ucx's shared memory
    for algo in tree direct chain linear; do
        for n in 3 4; do
            # shellcheck disable=SC2086
            if launch "$algo-$v-$n" "$n" $tenv GCOLL_ROOTED_ALGO=$algo ROOTED_CHECK_LARGE=30001 \
                GCOLL_RING_CHUNK=4kb GCOLL_RING_SLICE=64kb -- all; then
                pass "$v: $algo forced, $n ranks, 30001-element calls in 4 KiB chunks and 64 KiB slices"
            else
                fail "$v: $algo forced, $n ranks"
                show "$algo-$v-$n" "$n"
            fi
        done
    done
done

# messages of 1 MiB and more (they wait for their receive): each algorithm on 3 ranks, with
# 400001-element calls; then a receiving side 300 ms late with GCOLL_UNEXPECTED_BYTES
# below a block (2 MiB), which would fail a transfer held as unexpected
for v in $(echo "$variants" | grep -o 'tcp\|ucx-shm' | sort -u); do
    case "$v" in
    ucx-*) tenv="GCOLL_TRANSPORT=ucx $(ucx_variant_env "$v")" ;;
    *) tenv="GCOLL_TRANSPORT=$v" ;;
    esac
    for algo in tree direct chain linear; do
        if [ "$v" = tcp ]; then # the large calls themselves on tcp only
            # shellcheck disable=SC2086
            if launch "big-$algo-$v" 3 $tenv GCOLL_ROOTED_ALGO=$algo ROOTED_CHECK_LARGE=400001 -- all; then
                pass "$v: $algo forced, 3 ranks, 400001-element calls (1.6 MB reduces, 1 MB blocks)"
            else
                fail "$v: $algo forced, 3 ranks, 400001-element calls"
                show "big-$algo-$v" 3
            fi
        fi
        # shellcheck disable=SC2086
        if launch "late-$algo-$v" 3 $tenv GCOLL_ROOTED_ALGO=$algo GCOLL_UNEXPECTED_BYTES=1mb -- late; then
            pass "$v: $algo forced, 2 MiB per rank into a receiver 300 ms late, GCOLL_UNEXPECTED_BYTES=1mb"
        else
            fail "$v: $algo forced, 2 MiB per rank into a late receiver"
            show "late-$algo-$v" 3
        fi
    done
done

# The controls: claiming the tree's order while another form runs must fail the float
# checks (and only them), or the bit-exact checks prove nothing. control NAME ALGO WHAT
control() {
    if launch "$1" 4 GCOLL_TRANSPORT=tcp GCOLL_ROOTED_ALGO="$2" ROOTED_CHECK_TREE_ORDER=1 -- all; then
        fail "control: $3's results matched the tree's order bit for bit"
    elif grep -q 'FAIL: reduce float.*(tree order)' "$TMP/$1.0" &&
        ! grep -v '(tree order)' "$TMP/$1.0" | grep -q 'FAIL:'; then
        pass "control: $3's float results differ from the tree's order ($(grep -c 'FAIL:' "$TMP/$1.0") shown)"
    else
        fail "control: unexpected failures ($3)"
        show "$1" 4
    fi
}
control control direct reduce-scatter
# on 4 ranks the chain's x0 + (x1 + (x2 + x3)) against the tree's (x0 + x1) + (x2 + x3)
control control2 chain "the chain"
# and the linear reduce's ((x0 + x1) + x2) + x3
control control3 linear "the linear reduce"

for v in tcp $(echo "$variants" | grep -o ucx-shm); do
    case "$v" in
    ucx-*) tenv="GCOLL_TRANSPORT=ucx $(ucx_variant_env "$v")" ;;
    *) tenv="GCOLL_TRANSPORT=$v" ;;
    esac
    # shellcheck disable=SC2086
    if launch "invalid-$v" 3 $tenv -- invalid; then
        pass "$v: roots out of range, NULL sendbuf, band on float32: GCOLL_ERR_INVALID on the caller; a reduce after them works"
    else
        fail "$v: invalid arguments"
        show "invalid-$v" 3
    fi
    for kind in reduce gather scatter kind count; do
        case $kind in
        kind) what="gather against scatter" ;;
        count) what="gather of 16 against 8 elements" ;;
        *) what="$kind with different roots" ;;
        esac
        for n in 2 3; do
            start=$(date +%s)
            # shellcheck disable=SC2086
            if launch "mm-$kind-$v-$n" "$n" $tenv -- mismatch "$kind" &&
                [ $(($(date +%s) - start)) -lt 15 ]; then
                pass "$v: $what on $n ranks: GCOLL_ERR_MISMATCH on every rank within $(($(date +%s) - start)) s (timeout 20 s)"
            else
                fail "$v: $what on $n ranks"
                show "mm-$kind-$v-$n" "$n"
            fi
        done
    done
done
finish
