/* ucx.h: UCX transport entry points beyond the ops table. */
#ifndef GCOLL_UCX_H
#define GCOLL_UCX_H

#include <stddef.h>

/* 1 when UCX (with the user's UCX_TLS / UCX_NET_DEVICES) offers an RDMA transport (rc, dc
 * or ud on an InfiniBand or RoCE device), 0 if not or UCX does not initialize. desc (if
 * not NULL) receives the transports found, e.g. "tcp/lo posix/memory cma/memory". This is
 * what GCOLL_TRANSPORT=auto uses to prefer ucx over tcp. Never blocks for long. */
int gcoll_ucx_rdma_capable(char *desc, size_t desclen);

/* 1 when UCX (with the user's UCX_TLS) moves data between ranks of one host through shared
 * memory (posix or sysv), 0 if not or UCX does not initialize. desc as above. This is what
 * GCOLL_TRANSPORT=auto uses when the launcher puts every rank on this host. */
int gcoll_ucx_local_capable(char *desc, size_t desclen);

#endif /* GCOLL_UCX_H */
