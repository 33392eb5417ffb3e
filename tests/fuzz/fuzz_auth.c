/* fuzz_auth.c: libFuzzer target for the job-key handshake (lib/base/auth.c), both sides, over a
 * socketpair. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/util.h"

/*
 * Input: a mode byte (bit 0: play the client against gcoll's server, or the server
 * against gcoll's client; bits 1-7: the size of the pieces the bytes reach the server
 * in), then the bytes. Neither side may ever accept (the peer's nonce is random, so no input can
 * carry a valid MAC), and each must give up as soon as the bytes end, never at a
 * deadline.
 */
static const gcoll_key_t key = {(const uint8_t *)"fuzz-job-key", 12};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    const uint8_t *in = data + 1;
    size_t len = size - 1, piece = (size_t)(data[0] >> 1) + 1;
    uint64_t t0 = gcoll_time_ms();
    char err[256];
    if (data[0] & 1) {
        gcoll_auth_server_t s;
        gcoll_auth_server_start(&s, sv[0], t0 + 60000);
        int r = 0;
        for (size_t off = 0; off < len && r == 0; off += piece) {
            size_t n = len - off < piece ? len - off : piece;
            if (send(sv[1], in + off, n, MSG_NOSIGNAL) != (ssize_t)n)
                break; /* the server closed its end: it refused */
            r = gcoll_auth_server_step(&s, &key, err, sizeof(err));
        }
        shutdown(sv[1], SHUT_WR);
        while (r == 0)
            r = gcoll_auth_server_step(&s, &key, err, sizeof(err));
        if (r != -1 || s.fd != -1)
            abort(); /* accepted a forged response, or kept a refused socket */
    } else {
        /* at once: nobody reads yet, and a socketpair holds few small pieces (each costs a
         * buffer's overhead), so piecewise sends would block; the client reads it all */
        if (len && send(sv[1], in, len, MSG_NOSIGNAL) != (ssize_t)len)
            abort();
        shutdown(sv[1], SHUT_WR);
        uint8_t id[8] = {1, 0, 0, 0, 2, 0, 0, 0};
        if (gcoll_auth_client(sv[0], &key, id, sizeof(id), t0 + 60000, err, sizeof(err)) ==
            GCOLL_OK)
            abort();
        close(sv[0]);
    }
    close(sv[1]);
    if (gcoll_time_ms() - t0 > 5000)
        abort(); /* waited for a deadline instead of seeing the end of the bytes */
    return 0;
}
