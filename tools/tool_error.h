/* tool_error.h: a tool's line for a failed gcoll call, without saying the reason twice. */
#ifndef GCOLL_TOOL_ERROR_H
#define GCOLL_TOOL_ERROR_H

#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "gcoll.h"

/* gcoll_last_error() holds what the library last warned about; at the default level
 * (GCOLL_DEBUG=warn or more, no GCOLL_DEBUG_FILE) that warning is already on stderr, so
 * the tool only says what it was doing; otherwise it prints the reason itself. */
static inline void tool_error(const char *prog, const char *doing, const char *hint)
{
    const char *lvl = getenv("GCOLL_DEBUG"), *file = getenv("GCOLL_DEBUG_FILE");
    int on_stderr = !(file && *file) && !(lvl && strcasecmp(lvl, "none") == 0);
    if (on_stderr)
        fprintf(stderr, "%s: %s failed (gcoll's warning above says why)%s\n", prog, doing, hint);
    else
        fprintf(stderr, "%s: %s\n", prog, gcoll_last_error());
}

#endif /* GCOLL_TOOL_ERROR_H */
