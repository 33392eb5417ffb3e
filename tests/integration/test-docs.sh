#!/bin/sh
# test-docs.sh: every variable in the configuration table is documented in docs/tuning.md,
# and neither docs/tuning.md nor README.md names a GCOLL_* variable the table does not have.
. "$(dirname "$0")/lib.sh"
tuning="$top_srcdir/docs/tuning.md"
readme="$top_srcdir/README.md"
header="$top_srcdir/include/gcoll.h"
[ -f "$tuning" ] || fail "docs/tuning.md is missing"
known=$("$top_builddir/tools/gcoll-info" -c | sed -n 's/^\(GCOLL_[A-Z0-9_]*\)=.*/\1/p')
[ -n "$known" ] || fail "gcoll-info -c printed no variables"
# The public API's own GCOLL_* names (statuses, dtypes, ops, GCOLL_SPLIT_NOCOLOR, codec
# flags, version macros): the #defines and enum members of gcoll.h.
api=$(awk '
/^#define GCOLL_/ { print $2; next }
/enum[^;]*\{/ { inenum = 1 }
inenum { l = $0; sub(/\/\*.*/, "", l)
         while (match(l, /GCOLL_[A-Z0-9_]+/)) { print substr(l, RSTART, RLENGTH); l = substr(l, RSTART + RLENGTH) } }
inenum && /\}/ { inenum = 0 }' "$header")
[ -n "$api" ] || fail "found no public constants in include/gcoll.h"
for v in $known; do
    grep -q "\`$v\`" "$tuning" || fail "$v is not documented in docs/tuning.md"
done
for doc in "$tuning" "$readme"; do
    for v in $(grep -o 'GCOLL_[A-Z0-9_]*[A-Z0-9]' "$doc" | sort -u); do
        case " $(echo $known $api) " in
        *" $v "*) ;;
        *) fail "$(basename "$doc") mentions $v, which is neither in the configuration table nor in gcoll.h" ;;
        esac
    done
done
[ "$fails" -eq 0 ] && pass "docs/tuning.md documents the $(echo $known | wc -w) variables"
finish
