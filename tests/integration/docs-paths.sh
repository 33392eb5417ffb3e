#!/bin/sh
# docs-paths.sh SRCDIR BUILDDIR: prints "where: what" for every repository path named in
# README.md, docs/ or a comment (of *.c, *.h, *.cc, *.cpp, *.sh, *.py, Makefile.am, *.include)
# that does not exist, and for every relative Markdown link (and its #anchor) in README.md
# and docs/ that leads nowhere. Prints nothing when all hold. Used by test-docs.sh.
#
# A repository path is a word that starts with a top-level folder (lib/, include/, tests/,
# ...) and is not itself inside a longer path ("$top_srcdir/docs/x" is not one). It exists
# when it (a glob is expanded) is in the source or the build tree, when it is a program
# built from the same-named .c or .cc, or when a build rule names it (a non-comment line of
# Makefile.am or a Makefile.include): optional programs (the UCX unit tests, the torch
# extension) are then named correctly though this build did not make them. "path:N" also
# needs the file to have N lines. #include lines are the compiler's to check.
set -u
src=$1
bld=$2
cd "$src" || exit 2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gcoll-docs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

docs=$(ls README.md docs/*.md docs/*/*.md 2>/dev/null)
code=$(find lib include collectives transports tools bindings bench tests config/m4 .ci \
    \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cpp' -o -name '*.sh' -o -name '*.py' \
    -o -name Makefile.include \) -type f 2>/dev/null | grep -v '/corpus' | sort)

# "file:line<TAB>text": the Markdown pages whole, the comments of the code.
{
    for f in $docs; do awk -v f="$f" '{ printf "%s:%d\t%s\n", f, NR, $0 }' "$f"; done
    for f in $code Makefile.am; do
        case "$f" in
        *.c | *.h | *.cc | *.cpp)
            # C comments: /* ... */ across lines and //, outside string and char literals.
            awk -v f="$f" '
            { out = ""; n = length($0); i = 1
              if (!inc && $0 ~ /^[ \t]*#[ \t]*include/) next
              while (i <= n) {
                c = substr($0, i, 1); d = substr($0, i, 2)
                if (inc) { if (d == "*/") { inc = 0; i += 2; out = out " "; continue }
                           out = out c; i++; continue }
                if (d == "/*") { inc = 1; i += 2; continue }
                if (d == "//") { out = out substr($0, i + 2); break }
                if (c == "\"" || c == "\047") { q = c; i++
                    while (i <= n && substr($0, i, 1) != q) { if (substr($0, i, 1) == "\\") i++; i++ }
                    i++; continue }
                i++ }
              if (out != "") printf "%s:%d\t%s\n", f, NR, out }' "$f" ;;
        *)
            # Shell, Python, make: from a "#" that starts a word to the end of the line.
            awk -v f="$f" 'NR == 1 && /^#!/ { next }
            { if (match($0, /(^|[ \t])#/)) printf "%s:%d\t%s\n", f, NR, substr($0, RSTART) }' "$f" ;;
        esac
    done
} >"$tmp/text"

# Every path-like word, as "where<TAB>path".
awk -F '\t' '{
    s = $2
    while (match(s, /(^|[^A-Za-z0-9_.\/~$@{-])(lib|include|transports|collectives|tests|tools|bench|bindings|config|docs|\.ci)\/[A-Za-z0-9_.\/*+-]*[A-Za-z0-9_*](:[0-9]+)?/)) {
        p = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
        sub(/^[^a-z.]/, "", p)
        # "docs/" alone, or an expression such as lib/x.c$(EXEEXT), is no name of a file.
        if (substr(s, 1, 1) ~ /[<{$]/) continue
        printf "%s\t%s\n", $1, p
    } }' "$tmp/text" >"$tmp/paths"

# Names the build rules give (program and library names, sources, scripts).
cat Makefile.am $(find . -name Makefile.include -not -path './.git/*') 2>/dev/null |
    sed 's/#.*//' | tr ' \t=\\' '\n\n\n\n' | grep / | sort -u >"$tmp/built"

cut -f2 "$tmp/paths" | sort -u | while read -r p; do
    f=${p%%:*}
    line=
    [ "$f" != "$p" ] && line=${p#*:}
    ok=
    for root in "$src" "$bld"; do
        # shellcheck disable=SC2086 # a glob in the text is expanded on purpose
        for g in $root/$f; do [ -e "$g" ] && ok=$g && break 2; done
    done
    [ -z "$ok" ] && for x in .c .cc; do [ -e "$src/$f$x" ] && ok=$src/$f$x && break; done
    [ -z "$ok" ] && grep -qxF "$f" "$tmp/built" && ok=built
    if [ -z "$ok" ]; then
        grep -F "	$p" "$tmp/paths" | awk -F '\t' -v p="$p" '$2 == p { print $1 ": " p " does not exist" }'
    elif [ -n "$line" ] && [ -f "$ok" ] && [ "$(wc -l <"$ok")" -lt "$line" ]; then
        grep -F "	$p" "$tmp/paths" | awk -F '\t' -v p="$p" '$2 == p { print $1 ": " p " is past the end of the file" }'
    fi
done

# Relative Markdown links and their anchors (GitHub's slugs: lower case, spaces to "-",
# punctuation other than "-" and "_" dropped).
slugs() {
    awk '/^```/ { fence = !fence } !fence && /^#+ / { s = $0; sub(/^#+ +/, "", s); s = tolower(s)
         gsub(/[^a-z0-9 _-]/, "", s); gsub(/ /, "-", s); print s }' "$1"
}
for f in $docs; do
    dir=$(dirname "$f")
    grep -n -o '\](\([^)]*\))' "$f" | sed 's/^\([0-9]*\):\](\(.*\))$/\1 \2/' |
        while read -r ln target; do
            case "$target" in http:* | https:* | mailto:*) continue ;; esac
            file=${target%%#*}
            anchor=
            case "$target" in *'#'*) anchor=${target#*#} ;; esac
            if [ -z "$file" ]; then path=$f; else path=$dir/$file; fi
            if [ ! -e "$path" ]; then
                echo "$f:$ln: link to $target: $path does not exist"
            elif [ -n "$anchor" ] && ! slugs "$path" | grep -qxF "$anchor"; then
                echo "$f:$ln: link to $target: $path has no heading #$anchor"
            fi
        done
done
