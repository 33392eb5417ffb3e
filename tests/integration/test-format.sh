#!/bin/sh
# test-format.sh: every C/C++ source is laid out as clang-format 14 lays it out with the
# repo's .clang-format (clang-format --dry-run -Werror), and the files that are not are named.
#
# The sources: `git ls-files` in a git checkout; elsewhere (a release tarball, a distcheck
# tree) every .c/.h/.cc/.cpp under the source folders. Other clang-format versions lay some
# constructs out differently, so the check runs only with major version 14 (Debian 12's):
# CLANG_FORMAT names the binary, else clang-format-14 or clang-format on PATH. Exits 77
# (SKIP) with the reason when there is none, or it is another version.
# Fix what it reports with: clang-format -i FILE...
. "$(dirname "$0")/lib.sh"
SRC=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
want=14

skip() { note "SKIP: test-format: $*"; exit 77; }

cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
    for c in clang-format-$want clang-format; do
        if command -v "$c" >/dev/null 2>&1; then cf=$c; break; fi
    done
fi
[ -n "$cf" ] && command -v "$cf" >/dev/null 2>&1 ||
    skip "${cf:-clang-format} not found (Debian 12: apt-get install clang-format, version $want)"
ver=$("$cf" --version 2>/dev/null | sed -n 's/.*clang-format version \([0-9][0-9]*\)\..*/\1/p')
[ "$ver" = "$want" ] ||
    skip "$cf is version ${ver:-unknown}; the tree is formatted as clang-format $want lays it" \
        "out (set CLANG_FORMAT to a clang-format $want)"
[ -f "$SRC/.clang-format" ] || fail "$SRC/.clang-format is missing"

cd "$SRC" || exit 1
list="$TMP/files"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
    git ls-files --error-unmatch .clang-format >/dev/null 2>&1; then
    how="tracked by git"
    git ls-files -- '*.c' '*.h' '*.cc' '*.cpp' >"$list"
else
    how="found under the source folders"
    for d in include lib collectives transports tools tests bench bindings; do
        [ -d "$d" ] && find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cc' \
            -o -name '*.cpp' \) -print
    done | sort >"$list"
fi
n=$(wc -l <"$list" | tr -d ' ')
[ "$n" -gt 0 ] || fail "no C/C++ sources $how in $SRC"

if [ "$n" -gt 0 ]; then
    # One run over all files; clang-format reports each violation as FILE:LINE:COL: error:.
    tr '\n' '\0' <"$list" | xargs -0 "$cf" --dry-run -Werror >"$TMP/out" 2>&1
    rc=$?
    bad=$(sed -n 's/^\(.*\):[0-9][0-9]*:[0-9][0-9]*: error: .*/\1/p' "$TMP/out" | sort -u)
    if [ -n "$bad" ]; then
        for f in $bad; do
            fail "$f is not clang-formatted ($(grep -c "^$f:[0-9]*:[0-9]*: error:" "$TMP/out")" \
                "places; clang-format -i $f)"
        done
    elif [ "$rc" -ne 0 ]; then
        fail "$cf exited with $rc: $(tail -n 3 "$TMP/out")"
    else
        pass "the $n C/C++ sources $how are formatted as $cf ($ver) lays them out"
    fi
fi
finish
