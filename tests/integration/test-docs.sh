#!/bin/sh
# test-docs.sh: every variable in the configuration table is documented in README.md, and
# README.md documents no GCOLL_* variable the table does not have.
. "$(dirname "$0")/lib.sh"
readme="$top_srcdir/README.md"
known=$("$top_builddir/tools/gcoll-info" -c | sed -n 's/^\(GCOLL_[A-Z0-9_]*\)=.*/\1/p')
[ -n "$known" ] || fail "gcoll-info -c printed no variables"
for v in $known; do
    grep -q "\`$v\`" "$readme" || fail "$v is not documented in README.md"
done
for v in $(grep -o 'GCOLL_[A-Z0-9_]*[A-Z0-9]' "$readme" | sort -u); do
    case " $(echo $known) " in
    *" $v "*) ;;
    *) case "$v" in
       GCOLL_OK|GCOLL_ERR_*|GCOLL_FLOAT*|GCOLL_INT*|GCOLL_BFLOAT16|GCOLL_SUM|GCOLL_AVG|GCOLL_MIN|GCOLL_MAX|GCOLL_PROD) ;;
       *) fail "README.md mentions $v, which is not in the configuration table" ;;
       esac ;;
    esac
done
[ "$fails" -eq 0 ] && pass "README.md documents the $(echo $known | wc -w) variables"
finish
