#!/bin/sh
# test-ucx.sh: the integration suite over the ucx transport, once per UCX transport set
# (lib.sh: ucx_variants): every script that loops over transports() is rerun with
# suite_transports=ucx and the variant's UCX_TLS, so no test is copied. Then checks of
# UCX's own: an idle wait sleeps instead of spinning a core, and a rank whose sends UCX
# holds (shared-memory fifo full) gives the CPU to the peer it waits for instead of
# polling through its time slice. Skips (77) without ucx.
. "$(dirname "$0")/lib.sh"

line=$("$top_builddir/tools/gcoll-info" -t | grep '^ucx ')
case "$line" in
*" usable"*) ;;
"") note "SKIP: this build has no ucx transport (configure found no UCX; Debian: libucx-dev)"
    exit 77 ;;
*)  note "SKIP: ucx transport unavailable here: ${line#ucx*unavailable: }"
    exit 77 ;;
esac

dir=$(dirname "$0")
scripts=$(grep -l '^for tr in \$(transports)' "$dir"/test-*.sh | grep -v '/test-ucx\.sh$')
for v in $(ucx_variants); do
    for s in $scripts; do
        name="$v: $(basename "$s")"
        out="$TMP/$v-$(basename "$s").log"
        # shellcheck disable=SC2046
        if env $(ucx_variant_env "$v") suite_transports=ucx sh "$s" >"$out" 2>&1; then
            pass "$name ($(grep -c '^ok:' "$out") checks)"
        else
            st=$?
            if [ "$st" -eq 77 ]; then
                note "skip: $name"
            else
                fail "$name"
                grep -v '^ok:' "$out" | tail -n 60
            fi
        fi
    done
done

# A rank waiting on a silent peer sits in progress for the whole timeout: with UCX's event
# fd it sleeps, so the job's CPU time stays far below the wall time of 3 waiting ranks.
if command -v bash >/dev/null 2>&1; then
    for v in $(ucx_variants); do
        start=$(date +%s)
        # shellcheck disable=SC2046
        cpu=$(env $(ucx_variant_env "$v") TIMEFORMAT='%U %S' bash -c \
            'time "$0" --timeout 60 -n 3 -x GCOLL_TRANSPORT=ucx -x GCOLL_TIMEOUT_MS=3000 \
             -- "$1" silent 1 >/dev/null 2>&1' "$gcoll_run" "$CHECK" 2>&1 |
            awk 'NF == 2 {printf "%.2f", $1 + $2}')
        took=$(( $(date +%s) - start ))
        if [ -n "$cpu" ] && awk -v c="$cpu" 'BEGIN {exit !(c < 2.0)}'; then
            pass "$v: idle waits sleep (${cpu} s CPU for 3 ranks over ${took} s)"
        else
            fail "$v: idle waits spin: '${cpu}' s CPU for 3 ranks over ${took} s"
        fi
    done
fi
# Sends held by UCX. A shared-memory rendezvous larger than the receiver's fifo (64
# elements of 8 KiB) leaves fragments queued at the sender; UCX cannot sleep on them
# (ucp_worker_arm stays BUSY) and nothing signals when the peer drains the fifo, so the
# transport polls. With both ranks on one CPU the peer can only drain it once the poller
# gives the CPU away: the transport yields, where hot polling ran each stall to the end of
# its time slice (4 MiB allreduce in 128 KiB chunks: ~45,000 fruitless polls and 60 ms per
# operation, against ~20 polls and 1.4 ms). The check counts the transport's fruitless
# ("held") polls from its debug summary at destroy, not time; and no wait on the event fd
# may run into its timeout with operations in flight (a lost wake-up; a silent peer is not
# expected here). With UCX's default transports (it picks sysv shared memory) and the
# variants; over UCX's tcp nothing is held. Single copy is off here: it holds nothing.
cpu=$(awk '/^Cpus_allowed_list:/ {split($2, a, "[-,]"); print a[1]}' /proc/self/status)
if command -v taskset >/dev/null 2>&1 && [ -n "$cpu" ]; then
    ops=106 # -n 50 -w 2 -c 1, out of place and in place
    for v in ucx-default $(ucx_variants); do
        log="$TMP/held-$v.log"
        venv=$(ucx_variant_env "$v")
        [ "$v" = ucx-default ] && venv="UCX_TLS=all"
        # shellcheck disable=SC2086
        if ! env $venv taskset -c "$cpu" "$gcoll_run" --timeout 120 -n 2 -x GCOLL_TRANSPORT=ucx \
            -x GCOLL_DEBUG=debug -x GCOLL_DEBUG_SUBSYS=NET -x GCOLL_RING_CHUNK=128kb \
            -x GCOLL_UCX_CMA_MIN=0 \
            -- "$top_builddir/tools/gcoll-bench" -c 1 -z 2 -b 4M -e 4M -n 50 -w 2 >"$log" 2>&1; then
            fail "$v: 4 MiB allreduce on one CPU did not run"
            tail -n 20 "$log"
            continue
        fi
        # "ucx: progress: sleeps=N sleep_timeouts=N held_polls=N held_naps=N", one per rank
        res=$(grep 'ucx: progress:' "$log" | awk -v ops=$ops '
            {for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) sum[kv[1]] += kv[2]; n++}
            END {printf "%d %d %d %s", n, sum["sleep_timeouts"], sum["held_polls"],
                 (n == 2 && sum["sleep_timeouts"] <= 2 && sum["held_polls"] <= 400 * ops * n) ? "ok" : "bad"}')
        # shellcheck disable=SC2086
        set -- $res
        wrong=$(awk '$2 == 4194304 {print $NF}' "$log" | head -n 1)
        if [ "$4" = ok ] && [ "$wrong" = 0 ]; then
            pass "$v: held sends yield the CPU ($3 held polls, $2 timed-out waits; 2 ranks, $ops ops)"
        else
            fail "$v: held sends: $1 summaries, $3 held polls (at most $((400 * ops * 2))), $2 timed-out waits (at most 2), #wrong '$wrong'"
            grep -v '^ok' "$log" | tail -n 20
        fi
    done
else
    note "skip: no taskset or no CPU affinity: the held-send check did not run"
fi
# counted_path WHAT COUNTER OFFVAR OFFNAME NSIZES BENCH_ARGS...: 3 ranks run gcoll-bench
# -c with UCX's default transports, each variant, and OFFNAME (ucx-shm with OFFVAR=0); the
# path WHAT must be used (COUNTER_sends = COUNTER_recvs > 0 in every rank's summary) where
# UCX may use shared memory and nowhere else, and every result must be exact.
counted_path() {
    what=$1 c=$2 offvar=$3 offname=$4 nsizes=$5
    shift 5
    bench_args="$*" # (set -- below reuses the positional parameters)
    for v in ucx-default $(ucx_variants) "$offname"; do
        log="$TMP/$c-$v.log"
        venv=$(ucx_variant_env "$v")
        extra=""
        case "$v" in
        ucx-default) venv="UCX_TLS=all"; want=yes ;;
        ucx-shm) want=yes ;;
        "$offname") venv=$(ucx_variant_env ucx-shm); extra="-x $offvar=0"; want=no ;;
        *) want=no ;;
        esac
        # shellcheck disable=SC2086
        if ! env $venv "$gcoll_run" --timeout 120 -n 3 -x GCOLL_TRANSPORT=ucx $extra \
            -x GCOLL_DEBUG=debug -x GCOLL_DEBUG_SUBSYS=NET \
            -- "$top_builddir/tools/gcoll-bench" -c 1 -z 2 $bench_args >"$log" 2>&1; then
            fail "$v: $what run did not run"
            tail -n 20 "$log"
            continue
        fi
        res=$(grep 'ucx: progress:' "$log" | awk -v c="$c" '
            {for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) {s[kv[1]] += kv[2]}
             n++; if ($0 ~ (c "_sends=0 ")) zero++}
            END {printf "%d %d %d %d", n, s[c "_sends"], s[c "_recvs"], zero}')
        # shellcheck disable=SC2086
        set -- $res
        # the #wrong columns, out of place and in place
        wrong=$(awk '$1 ~ /^\[0\]$/ && $2 ~ /^[0-9]+$/ {w += $(NF - 4) + $NF} END {print w + 0}' "$log")
        sizes=$(awk '$1 ~ /^\[0\]$/ && $2 ~ /^[0-9]+$/ && $(NF - 4) == 0 && $NF == 0' "$log" | wc -l)
        if [ "$1" = 3 ] && [ "$sizes" = "$nsizes" ] && [ "$wrong" = 0 ] &&
            { { [ "$want" = yes ] && [ "$2" -gt 0 ] && [ "$2" = "$3" ] && [ "$4" = 0 ]; } ||
              { [ "$want" = no ] && [ "$2" = 0 ] && [ "$3" = 0 ]; }; }; then
            pass "$v: $what $want ($2 sends, $3 receives on 3 ranks; $nsizes sizes exact)"
        else
            fail "$v: $what should be $want: $1 summaries, $2 sends, $3 receives, $4 ranks without, $sizes sizes exact, #wrong sum $wrong"
            grep -v '^ok' "$log" | tail -n 20
        fi
    done
}
# Single copy (GCOLL_UCX_CMA_MIN): messages from 128 KiB go by process_vm_readv. The suite
# above ran the ucx-shm variant with it.
counted_path "single copy" cma GCOLL_UCX_CMA_MIN ucx-nocma 4 -b 32K -e 4M -f 4 -n 5 -w 1
# Shared-memory mailbox (GCOLL_UCX_SHM_MAX): messages of up to 16 KiB go through gcoll's own
# rings.
counted_path mailbox shm GCOLL_UCX_SHM_MAX ucx-noshm 5 -b 8 -e 32K -f 8 -n 20 -w 2

# A gather's root copies its own block meanwhile, so it asks its peers to write their blocks
# (GCOLL_TREQ_RECEIVER_BUSY): on 3 ranks from 128 KiB per block, every single-copy receive
# of the root is written by its sender, and the blocks land exactly (-c 1, #wrong 0).
log="$TMP/gather-put.log"
# shellcheck disable=SC2046
if env $(ucx_variant_env ucx-shm) "$gcoll_run" --timeout 120 -n 3 -x GCOLL_TRANSPORT=ucx \
    -x GCOLL_DEBUG=debug -x GCOLL_DEBUG_SUBSYS=NET -- "$top_builddir/tools/gcoll-bench" \
    --coll gather -c 1 -z 2 -b 128K -e 4M -f 4 -n 5 -w 1 >"$log" 2>&1; then
    res=$(grep 'ucx: progress:' "$log" | awk '
        {for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) {s[kv[1]] += kv[2]}}
        END {printf "%d %d", s["cma_recvs"], s["cma_puts"]}')
    wrong=$(awk '$1 ~ /^\[0\]$/ && $2 ~ /^[0-9]+$/ {w += $(NF - 4) + $NF} END {print w + 0}' "$log")
    sizes=$(awk '$1 ~ /^\[0\]$/ && $2 ~ /^[0-9]+$/ && $(NF - 4) == 0 && $NF == 0' "$log" | wc -l)
    # shellcheck disable=SC2086
    set -- $res
    if [ "$1" -gt 0 ] && [ "$1" = "$2" ] && [ "$wrong" = 0 ] && [ "$sizes" = 3 ]; then
        pass "gather: the root's $2 single-copy receives all written by their senders; 3 sizes exact"
    else
        fail "gather: $1 single-copy receives, $2 written by the sender, #wrong $wrong, $sizes sizes exact"
        grep -v '^ok' "$log" | tail -n 20
    fi
else
    fail "gather: the run did not run"
    tail -n 20 "$log"
fi

# Endpoint ids are learnt while connecting: UCX 1.13 otherwise asks for them at the first
# rendezvous, mid-run, and a reply stuck behind a full shared-memory FIFO to a peer that
# then dies aborts the process inside UCX (seen in die-stream over ucx-shm). UCX's debug
# log and gcoll's share stderr, so each rank's lines keep their order: every "send wireup
# request" must come before that rank's "ucx: connected". Skipped if this UCX does not log
# the line at debug level.
log="$TMP/wireup.log"
# shellcheck disable=SC2046
if env $(ucx_variant_env ucx-shm) UCX_LOG_LEVEL=debug UCX_LOG_FILE=stderr \
    "$gcoll_run" --timeout 120 -n 3 -x GCOLL_TRANSPORT=ucx -x GCOLL_DEBUG=info -- \
    "$CHECK" >"$log" 2>&1; then
    res=$(awk '/send wireup request/ {n[$1]++; all++; if (done[$1]) late++}
               /gcoll INFO ucx: connected to/ {done[$1] = 1}
               END {printf "%d %d", all, late}' "$log")
    # shellcheck disable=SC2086
    set -- $res
    if [ "$1" = 0 ]; then
        pass "wireup: this UCX logs no wireup requests at debug level (not checked)"
    elif [ "$2" = 0 ]; then
        pass "wireup: all $1 endpoint-id requests sent while connecting"
    else
        fail "wireup: $2 of $1 endpoint-id requests sent after connecting"
    fi
else
    fail "wireup: the run failed"
    grep -v 'UCX  DEBUG' "$log" | tail -n 20
fi
finish
