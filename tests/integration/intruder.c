/* intruder: strangers at a rendezvous or data port, for the failure tests: they stay
 * silent, send garbage, stall mid-handshake, close early or try a wrong job key. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/config.h"
#include "core/bootstrap.h"
#include "base/util.h"

static const char usage[] =
    "usage: intruder freeport\n"
    "       intruder MODE host:port [seconds] [count]\n"
    "MODE (count connections each, held for seconds):\n"
    "  silent    connect and send nothing\n"
    "  garbage   send 512 bytes of junk at once\n"
    "  spray     ten 4 KiB writes of random bytes 0.2 s apart, reconnecting when dropped\n"
    "  stall     send the first bytes of a well-formed handshake response, then nothing\n"
    "  early     read the challenge (or not) and close at once, count times over\n"
    "  wrongkey  a full handshake with a wrong job key (exit 1 if it is accepted)\n"
    "With INTRUDER_STOP set to a path, every mode ends early once that file exists (the\n"
    "tests end their strangers this way rather than by a signal to a stale process id).\n";

/* 1 once the test asked the strangers to end. */
static int stopped(void)
{
    const char *f = getenv("INTRUDER_STOP");
    return f && *f && access(f, F_OK) == 0;
}

/* Sleeps ms milliseconds, or less if asked to stop; 1 if asked. */
static int nap(int ms)
{
    for (; ms > 0; ms -= 50) {
        if (stopped())
            return 1;
        usleep((useconds_t)(ms < 50 ? ms : 50) * 1000);
    }
    return stopped();
}

/* Connects, retrying for up to 10 s while nothing listens (the rank may not be up yet). */
static int dial(const char *addr)
{
    char host[256], port[16];
    if (gcoll_split_hostport(addr, host, sizeof(host), port, sizeof(port)) != 0)
        return -1;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    uint64_t deadline = gcoll_time_ms() + 10000;
    int fd = -1, e = 0;
    while (gcoll_time_ms() < deadline && !stopped()) {
        fd = socket(res->ai_family, SOCK_STREAM, 0);
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0)
            break;
        e = errno;
        close(fd);
        fd = -1;
        usleep(20000);
    }
    freeaddrinfo(res);
    if (fd < 0 && e)
        fprintf(stderr, "intruder: connect to %s: %s\n", addr, strerror(e));
    return fd;
}

static int free_port(void)
{
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

/* Ten 4 KiB writes of random bytes 0.2 s apart (the case of issue 25); a refused
 * connection is dialled again, so the rank sees a fresh stranger every time. */
static int spray(const char *addr)
{
    uint8_t junk[4096];
    uint64_t x = gcoll_time_ns() ^ (uint64_t)getpid() << 32;
    int fd = dial(addr), drops = 0;
    for (int w = 0; w < 10 && fd >= 0; w++) {
        for (size_t i = 0; i < sizeof(junk); i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
            junk[i] = (uint8_t)x;
        }
        if (send(fd, junk, sizeof(junk), MSG_NOSIGNAL) < 0) {
            close(fd);
            drops++;
            fd = dial(addr);
        }
        if (nap(200))
            break;
    }
    if (fd >= 0)
        close(fd);
    printf("intruder: spray done, dropped %d time(s)\n", drops);
    return 0;
}

static int wrongkey(const char *addr)
{
    int fd = dial(addr);
    if (fd < 0)
        return stopped() ? 0 : 1;
    gcoll_key_t key = {(const uint8_t *)"not-the-job-key", 15};
    uint8_t id[8] = {1, 0, 0, 0, 2, 0, 0, 0};
    char err[256];
    /* a listener no longer read (its ranks are in) never answers: 3 s is plenty */
    gcoll_status_t st =
        gcoll_auth_client(fd, &key, id, sizeof(id), gcoll_time_ms() + 3000, err, sizeof(err));
    close(fd);
    if (st == GCOLL_OK) {
        fprintf(stderr, "intruder: a wrong job key was ACCEPTED\n");
        return 1;
    }
    printf("intruder: wrong key refused: %s\n", err);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "freeport") == 0)
        return free_port();
    if (argc < 3) {
        fputs(usage, stderr);
        return 2;
    }
    const char *mode = argv[1], *addr = argv[2];
    int hold = argc > 3 ? atoi(argv[3]) : 2;
    int count = argc > 4 ? atoi(argv[4]) : 1;
    if (count < 1 || count > 1000 || hold < 0) {
        fputs(usage, stderr);
        return 2;
    }
    if (strcmp(mode, "wrongkey") == 0)
        return wrongkey(addr);
    if (strcmp(mode, "spray") == 0)
        return spray(addr);
    if (strcmp(mode, "early") == 0) {
        for (int k = 0; k < count && !stopped(); k++) {
            int fd = dial(addr);
            if (fd < 0)
                return stopped() ? 0 : 1;
            if (k % 2) { /* every other one waits for the challenge first */
                char chal[20];
                if (recv(fd, chal, sizeof(chal), MSG_WAITALL) < 0)
                    perror("intruder: recv");
            }
            close(fd);
        }
        return 0;
    }
    int *fds = calloc((size_t)count, sizeof(int));
    if (!fds)
        return 1;
    int n = 0;
    for (int k = 0; k < count; k++, n++) {
        if ((fds[k] = dial(addr)) < 0) {
            if (stopped())
                break;
            fprintf(stderr, "intruder: cannot connect to %s\n", addr);
            return 1;
        }
        if (strcmp(mode, "garbage") == 0) {
            char junk[512];
            for (size_t i = 0; i < sizeof(junk); i++)
                junk[i] = (char)(i * 37 + 11);
            if (send(fds[k], junk, sizeof(junk), MSG_NOSIGNAL) < 0)
                perror("intruder: send");
        } else if (strcmp(mode, "stall") == 0) {
            /* magic and part of a nonce: the server waits for the rest */
            static const char part[8] = {'G', 'C', 'A', '2', 1, 2, 3, 4};
            if (send(fds[k], part, sizeof(part), MSG_NOSIGNAL) < 0)
                perror("intruder: send");
        } else if (strcmp(mode, "silent") != 0) {
            fprintf(stderr, "intruder: unknown mode %s\n%s", mode, usage);
            return 2;
        }
    }
    /* the tests wait for this line to know the strangers are in */
    printf("intruder: %s: %d connection(s) open\n", mode, n);
    fflush(stdout);
    nap(hold * 1000);
    for (int k = 0; k < n; k++)
        close(fds[k]);
    free(fds);
    return 0;
}
