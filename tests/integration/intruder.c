/* intruder: a stranger at the rendezvous port, for the failure tests: connects and stays
 * silent, sends garbage, or tries a wrong job key (and must be refused). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netdb.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include "auth.h"
#include "bootstrap.h"
#include "util.h"

static int dial(const char *addr)
{
    char host[256], port[16];
    if (gcoll_split_hostport(addr, host, sizeof(host), port, sizeof(port)) != 0)
        return -1;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    uint64_t deadline = gcoll_time_ms() + 10000;
    int fd = -1;
    while (gcoll_time_ms() < deadline) {
        fd = socket(res->ai_family, SOCK_STREAM, 0);
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0)
            break;
        close(fd);
        fd = -1;
        usleep(20000);
    }
    freeaddrinfo(res);
    return fd;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "freeport") == 0) {
        /* The kernel picks a free port; it is released for the test to use at once. */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof(sa);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sl) != 0 ||
            getsockname(fd, (struct sockaddr *)&sa, &sl) != 0)
            return 1;
        printf("%d\n", ntohs(sa.sin_port));
        close(fd);
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: intruder silent|garbage|wrongkey host:port [seconds]\n");
        return 2;
    }
    int fd = dial(argv[2]);
    if (fd < 0) {
        fprintf(stderr, "intruder: cannot connect to %s\n", argv[2]);
        return 1;
    }
    int hold = argc > 3 ? atoi(argv[3]) : 2;
    if (strcmp(argv[1], "silent") == 0) {
        sleep((unsigned)hold);
        close(fd);
        return 0;
    }
    if (strcmp(argv[1], "garbage") == 0) {
        char junk[512];
        for (size_t i = 0; i < sizeof(junk); i++)
            junk[i] = (char)(i * 37 + 11);
        if (write(fd, junk, sizeof(junk)) < 0)
            perror("intruder: write");
        sleep((unsigned)hold);
        close(fd);
        return 0;
    }
    if (strcmp(argv[1], "wrongkey") == 0) {
        gcoll_key_t key = {(const uint8_t *)"not-the-job-key", 15};
        uint8_t id[8] = {1, 0, 0, 0, 2, 0, 0, 0};
        char err[256];
        gcoll_status_t st = gcoll_auth_client(fd, &key, id, sizeof(id),
                                              gcoll_time_ms() + 10000, err, sizeof(err));
        close(fd);
        if (st == GCOLL_OK) {
            fprintf(stderr, "intruder: a wrong job key was ACCEPTED\n");
            return 1;
        }
        printf("intruder: wrong key refused: %s\n", err);
        return 0;
    }
    fprintf(stderr, "intruder: unknown mode %s\n", argv[1]);
    return 2;
}
