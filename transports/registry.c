/* registry.c: the transports compiled into this library, looked up by name. */
#include <stdio.h>
#include <string.h>

#include "transports/transport.h"

static const gcoll_transport_ops_t *const builtin[] = {
    &gcoll_tcp_ops,
#ifdef GCOLL_HAVE_UCX
    &gcoll_ucx_ops,
#endif
#ifdef GCOLL_HAVE_VERBS
    &gcoll_verbs_ops,
#endif
};

#define NBUILTIN (sizeof(builtin) / sizeof(builtin[0]))

const gcoll_transport_ops_t *gcoll_transport_find(const char *name)
{
    for (size_t i = 0; i < NBUILTIN; i++)
        if (strcmp(builtin[i]->name, name) == 0)
            return builtin[i];
    return NULL;
}

const gcoll_transport_ops_t *gcoll_transport_auto(char *desc, size_t desclen, int one_host,
                                                  int *local_p)
{
    *local_p = 0;
    if (desclen)
        desc[0] = '\0';
    for (size_t i = 0; i < NBUILTIN; i++)
        if (builtin[i]->rdma_capable && builtin[i]->rdma_capable(desc, desclen))
            return builtin[i];
    for (size_t i = 0; one_host && i < NBUILTIN; i++)
        if (builtin[i]->local_capable && builtin[i]->local_capable(desc, desclen)) {
            *local_p = 1;
            return builtin[i];
        }
    if (desclen)
        desc[0] = '\0';
    return &gcoll_tcp_ops;
}

const char *gcoll_transports_built(void)
{
    static char list[64];
    if (!list[0]) {
        size_t o = 0;
        for (size_t i = 0; i < NBUILTIN; i++)
            o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s", i ? "," : "",
                                  builtin[i]->name);
    }
    return list;
}

gcoll_status_t gcoll_transport_probe(const char *name, char *why, size_t whylen)
{
    const gcoll_transport_ops_t *ops = name ? gcoll_transport_find(name) : NULL;
    if (!ops) {
        if (why && whylen)
            snprintf(why, whylen, "not built into this library (built: %s)",
                     gcoll_transports_built());
        return GCOLL_ERR_UNSUPPORTED;
    }
    char tmp[256] = "";
    gcoll_status_t st = ops->probe(tmp, sizeof(tmp));
    if (st != GCOLL_OK && why && whylen)
        snprintf(why, whylen, "%s", tmp);
    return st == GCOLL_OK ? GCOLL_OK : GCOLL_ERR_UNSUPPORTED;
}
