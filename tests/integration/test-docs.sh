#!/bin/sh
# test-docs.sh: every variable in the configuration table is documented in docs/tuning.md,
# and neither docs/tuning.md nor README.md names a GCOLL_* variable the table does not have;
# every repository path named in README.md, docs/ and code comments exists, and so does
# every relative link's target and anchor (docs-paths.sh); every example the docs mark as
# runnable runs (below).
. "$(dirname "$0")/lib.sh"
tuning="$top_srcdir/docs/tuning.md"
readme="$top_srcdir/README.md"
header="$top_srcdir/include/gcoll.h"
[ -f "$tuning" ] || fail "docs/tuning.md is missing"
known=$("$top_builddir/tools/gcoll-info" -c | sed -n 's/^\(GCOLL_[A-Z0-9_]*\)=.*/\1/p')
[ -n "$known" ] || fail "gcoll-info -c printed no variables"
# The public API's own GCOLL_* names (statuses, dtypes, ops, GCOLL_SPLIT_NOCOLOR, codec
# flags, version macros): the #defines and enum members of gcoll.h and gcoll_training.h.
api=$(awk '
/^#define GCOLL_/ { print $2; next }
/enum[^;]*\{/ { inenum = 1 }
inenum { l = $0; sub(/\/\*.*/, "", l)
         while (match(l, /GCOLL_[A-Z0-9_]+/)) { print substr(l, RSTART, RLENGTH); l = substr(l, RSTART + RLENGTH) } }
inenum && /\}/ { inenum = 0 }' "$header" "$top_srcdir/include/gcoll_training.h")
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

# Paths and links.
sh "$(dirname "$0")/docs-paths.sh" "$top_srcdir" "$top_builddir" >"$TMP/paths"
if [ -s "$TMP/paths" ]; then
    while read -r l; do fail "$l"; done <"$TMP/paths"
else
    pass "every path named in README.md, docs/ and comments exists, and every link leads somewhere"
fi

# Runnable examples. In README.md and docs/, a line "<!-- runnable -->" right before a
# ```sh block marks the block as runnable: it runs as written, from the top of the build
# tree, within 30 s. "<!-- runnable: CMD -->" runs CMD instead, a short form of the block
# (fewer sizes, steps or ranks) when the block as written takes minutes or installs
# packages; CMD's program (its first word that is not VAR=value) must appear in the block.
# "<!-- runnable needs F G: CMD -->" skips the example, saying so, where F or G (relative to
# the build tree, or absolute) is missing: an optional program or a data set.
n=0
skipped=0
for doc in "$readme" "$top_srcdir"/docs/*.md "$top_srcdir"/docs/*/*.md; do
    [ -f "$doc" ] || continue
    awk -v out="$TMP/ex" '
    /^<!-- runnable( needs [^:]*)?(:.*)? -->$/ {
        m = $0; sub(/^<!-- runnable */, "", m); sub(/ *-->$/, "", m); needs = ""
        if (m ~ /^needs /) { needs = m; sub(/^needs /, "", needs); sub(/:.*/, "", needs); sub(/^needs [^:]*/, "", m) }
        sub(/^: */, "", m); short = m; want = NR + 1; next }
    NR == want && /^```sh$/ { inb = 1; body = ""; line = NR; next }
    NR == want { printf "%d\tmarker not followed by a ```sh block\n", NR - 1 > (out ".bad"); want = 0 }
    inb && /^```$/ { inb = 0; n++; f = out "." n; printf "%d\n", line > (f ".line")
                     printf "%s", body > (f ".block"); printf "%s\n", short > (f ".short")
                     printf "%s\n", needs > (f ".needs")
                     close(f ".line"); close(f ".block"); close(f ".short"); close(f ".needs"); next }
    inb { body = body $0 "\n" }' "$doc"
    name=${doc#"$top_srcdir"/}
    if [ -f "$TMP/ex.bad" ]; then
        while IFS='	' read -r l msg; do fail "$name:$l: $msg"; done <"$TMP/ex.bad"
        rm -f "$TMP/ex.bad"
    fi
    for f in "$TMP"/ex.*.block; do
        [ -f "$f" ] || continue
        b=${f%.block}
        line=$(cat "$b.line")
        cmd=$(cat "$b.short")
        missing=
        for x in $(cat "$b.needs"); do
            case "$x" in /*) [ -e "$x" ] || missing="$missing $x" ;;
            *) [ -e "$top_builddir/$x" ] || missing="$missing $x" ;; esac
        done
        if [ -n "$cmd" ]; then
            prog=$(printf '%s\n' "$cmd" | tr ' ' '\n' | grep -v '^[A-Za-z_][A-Za-z0-9_]*=' | head -1)
            grep -qwF -- "$prog" "$f" || fail "$name:$line: the short form runs $prog, which the block does not"
        else
            cmd=$(cat "$f")
        fi
        rm -f "$b".*
        if [ -n "$missing" ]; then
            note "$name:$line: example skipped, missing:$missing"
            skipped=$((skipped + 1))
            continue
        fi
        n=$((n + 1))
        if (cd "$top_builddir" && timeout 30 sh -ec "$cmd") >"$TMP/run.log" 2>&1; then
            :
        else
            fail "$name:$line: the runnable example failed (exit $?): $(tail -5 "$TMP/run.log")"
        fi
    done
done
[ "$n" -gt 0 ] || fail "no example in README.md or docs/ is marked runnable"
note "ran $n runnable examples ($skipped skipped)"
finish
