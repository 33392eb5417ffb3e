/* root_test_util.h: a free loopback rendezvous address for unit tests that start ranks as
 * threads or processes of their own. */
#ifndef GCOLL_ROOT_TEST_UTIL_H
#define GCOLL_ROOT_TEST_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

/* "127.0.0.1:PORT" of a port the kernel just gave out (released for rank 0 to listen on). */
static inline void test_pick_root(char *buf, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    snprintf(buf, len, "127.0.0.1:%d", ntohs(sa.sin_port));
}

#endif /* GCOLL_ROOT_TEST_UTIL_H */
