#!/bin/sh
# test-layers.sh: calls go one way (docs/design.md). Reads the built objects of libgcoll
# with nm: every undefined symbol of an object must be defined in its own layer or in one
# below it. Fails naming the calling file, the symbol and the file that defines it.
. "$(dirname "$0")/lib.sh"
srcdir_top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top_builddir" || exit 99
command -v nm >/dev/null || { echo "SKIP: nm not found"; exit 77; }
# libtool's PIC objects (.libs/), else the static ones: one copy of each, and only those
# whose source is still there (a tree built before files moved keeps the old objects)
objs=$(find lib collectives transports -path '*/.libs/libgcoll_core_la-*.o' | sort)
[ -n "$objs" ] || objs=$(find lib collectives transports -name 'libgcoll_core_la-*.o' | sort)
objs=$(for o in $objs; do
    d=${o%/*}
    d=${d%/.libs}
    b=${o##*/libgcoll_core_la-}
    [ -f "$srcdir_top/$d/${b%.o}.c" ] && echo "$o"
done)
[ -n "$objs" ] || { echo "SKIP: no built objects of libgcoll_core"; exit 77; }

# layer FILE: the layer an object's folder belongs to
layer() {
    case ${1#./} in
    lib/base/*) echo base ;; lib/compress/*) echo compress ;;
    transports/*) echo transports ;; collectives/*) echo collectives ;;
    lib/core/* | lib/bucket/* | lib/adapt/*) echo core ;; lib/hier/*) echo hier ;;
    lib/api/*) echo api ;; lib/training/*) echo training ;; *) echo other ;;
    esac
}
# allowed CALLER: the layers a caller's objects may call into, its own included. lib/hier
# composes flat collectives on child communicators through lib/api: the one upward call.
allowed() {
    case $1 in
    base) echo "base" ;;
    compress) echo "base compress" ;;
    transports) echo "base compress transports" ;;
    collectives) echo "base compress transports collectives" ;;
    core) echo "base compress transports collectives core hier" ;;
    hier) echo "base compress transports collectives core hier api" ;;
    api) echo "base compress transports collectives core hier api" ;;
    training) echo "base compress transports collectives core hier api training" ;;
    *) echo "base compress transports collectives core hier api training other" ;;
    esac
}
defs=$TMP/defs
for o in $objs; do
    nm --defined-only "$o" | awk -v f="$o" '$2 ~ /^[TDBRGSV]$/ {print $3, f}'
done | sort -k1,1 >"$defs"
bad=$TMP/bad
: >"$bad"
for o in $objs; do
    from=$(layer "$o")
    ok=" $(allowed "$from") "
    nm -u "$o" | awk '{print $NF}' | sort -u | join - "$defs" | while read -r sym where; do
        to=$(layer "$where")
        case $ok in *" $to "*) ;; *) echo "$o ($from) calls $sym, defined in $where ($to)" ;; esac
    done >>"$bad"
done
n=$(wc -l <"$bad")
if [ "$n" -eq 0 ]; then
    pass "$(echo "$objs" | wc -l) objects: every call goes to its own layer or one below"
else
    sed 's/^/layer crossing: /' "$bad" >&2
    fail "$n calls go up a layer (listed above)"
fi
finish
