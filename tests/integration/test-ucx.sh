#!/bin/sh
# test-ucx.sh: the integration suite over the ucx transport, once per UCX transport set
# (lib.sh: ucx_variants): every script that loops over transports() is rerun with
# suite_transports=ucx and the variant's UCX_TLS, so no test is copied. Then checks of
# UCX's own: an idle wait sleeps instead of spinning a core. Skips (77) without ucx.
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
finish
