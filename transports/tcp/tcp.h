/* tcp.h: TCP transport entry points beyond the ops table (a test seam). */
#ifndef GCOLL_TCP_H
#define GCOLL_TCP_H

#include "transports/transport.h"

/* Adopts an already connected socket as connection idx to peer (tests use socketpairs). */
gcoll_status_t gcoll_tcp_adopt(gcoll_transport_t *t, int peer, int idx, int fd);

#endif /* GCOLL_TCP_H */
