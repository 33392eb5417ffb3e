#!/bin/sh
# test-chaos.sh: the short form of the fault campaigns (tests/chaos/; `make check-chaos`
# runs the long one): every collective on 2, 3, 4 and 8 ranks started by hand, exiting
# right after their last call, once per transport variant; and three SIGKILL runs per
# variant, whose survivors must all fail with GCOLL_ERR_PEER within 2 s (GCOLL_TIMEOUT_MS
# 60 s), without a hang, a crash or a wrong result.
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
: "${top_builddir:=$(pwd)}"
export top_builddir
rc=0
CHAOS_RANKS="2 3 4 8" timeout 600 sh "$srcdir/tests/chaos/exit-campaign.sh" 1 || rc=1
timeout 300 sh "$srcdir/tests/chaos/kill-campaign.sh" 3 || rc=1
exit "$rc"
