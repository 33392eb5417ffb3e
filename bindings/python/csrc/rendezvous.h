// rendezvous.h: how a gcoll backend joins gcoll through torch's Store (included once, by
// backend.cpp). Rank 0 of the group picks the address it listens on and a job key and
// publishes both in the group's Store; the others read them. gcoll's data connections are
// then authenticated with that key, so only the job's ranks can join.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "gcoll.h"

namespace gcoll_torch
{

// The local address this host uses to reach host:port (a UDP connect sends nothing), so
// that the group's rank 0 publishes an address its peers can route to, whichever host it is.
static std::string local_ip_toward(const char *host, const char *port)
{
    std::string ip;
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    if (!host || !*host || getaddrinfo(host, port && *port ? port : "9", &hints, &res) != 0)
        return ip;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in me = {};
    socklen_t len = sizeof(me);
    char buf[INET_ADDRSTRLEN];
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&me, &len) == 0 &&
        inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf)))
        ip = buf;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return ip;
}

// Where rank 0 listens: routed toward MASTER_ADDR (env://, torchrun), else toward
// GCOLL_ROOT's host, else this host's name, else loopback (one-host jobs with file://).
static std::string root_host()
{
    std::string ip = local_ip_toward(getenv("MASTER_ADDR"), getenv("MASTER_PORT"));
    if (ip.empty() && getenv("GCOLL_ROOT")) {
        std::string r = getenv("GCOLL_ROOT");
        size_t colon = r.rfind(':');
        if (colon != std::string::npos)
            ip = local_ip_toward(r.substr(0, colon).c_str(), r.substr(colon + 1).c_str());
    }
    if (ip.empty()) {
        char name[256];
        if (gethostname(name, sizeof(name)) == 0) {
            name[sizeof(name) - 1] = 0;
            ip = local_ip_toward(name, nullptr);
        }
    }
    return ip.empty() ? "127.0.0.1" : ip;
}

// A port free on ip now; gcoll binds it right after (SO_REUSEADDR), a short race window.
static int free_port(const std::string &ip)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TORCH_CHECK(fd >= 0, "gcoll backend: socket(): ", strerror(errno));
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    int port = -1;
    if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1 &&
        bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    int err = errno;
    close(fd);
    TORCH_CHECK(port > 0, "gcoll backend: no free port on ", ip, ": ", strerror(err));
    return port;
}

static std::string random_key()
{
    unsigned char b[16];
    FILE *f = fopen("/dev/urandom", "rb");
    bool ok = f && fread(b, 1, sizeof(b), f) == sizeof(b);
    if (f)
        fclose(f);
    TORCH_CHECK(ok, "gcoll backend: cannot read /dev/urandom for the job key");
    char hex[2 * sizeof(b) + 1];
    for (size_t i = 0; i < sizeof(b); i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
    return hex;
}

static void store_set(c10d::Store &s, const std::string &k, const std::string &v)
{
    s.set(k, std::vector<uint8_t>(v.begin(), v.end()));
}

static std::string store_get(c10d::Store &s, const std::string &k)
{
    std::vector<uint8_t> v = s.get(k); // blocks until rank 0 has set it (the Store's timeout)
    return std::string(v.begin(), v.end());
}

// gcoll reads GCOLL_JOB_KEY and GCOLL_TIMEOUT_MS at init only: the key from the Store and
// the group's timeout are put there for the call and the old values restored (serialized:
// the environment is the process's).
static std::mutex env_mutex;

struct EnvOverride {
    const char *name;
    bool had;
    std::string old;
    EnvOverride(const char *n, const std::string *v) : name(n), had(false)
    {
        const char *o = getenv(n);
        had = o != nullptr;
        old = o ? o : "";
        if (v)
            setenv(n, v->c_str(), 1);
    }
    ~EnvOverride()
    {
        if (had)
            setenv(name, old.c_str(), 1);
        else
            unsetenv(name);
    }
};

// A GCOLL_TIMEOUT_MS value in ms ("500ms", "30s", "5m", "1h"; a bare number is ms, as
// gcoll's config table reads it), or -1 when it does not parse (gcoll then reports it).
static int64_t env_duration_ms(const char *s)
{
    char *end = nullptr;
    double v = strtod(s, &end);
    if (end == s || v < 0)
        return -1;
    std::string u = end;
    double scale = u == "" || u == "ms"     ? 1
                   : u == "us"              ? 0.001
                   : u == "s"               ? 1000
                   : u == "m" || u == "min" ? 60000
                   : u == "h"               ? 3600000
                                            : -1;
    return scale < 0 ? -1 : (int64_t)(v * scale + 0.5);
}

// Joins a gcoll communicator of size ranks through store. timeout bounds the rendezvous
// and becomes the communicator's GCOLL_TIMEOUT_MS, which bounds every wait of its
// collectives (gcoll's timeout counts time without progress).
static gcoll_comm_t *join_through_store(c10d::Store &store, int rank, int size,
                                        std::chrono::milliseconds timeout)
{
    // One generation per init over the same Store: a group re-created after
    // destroy_process_group (or by an elastic restart over the same store) must not read the
    // address of the communicator before it. Every rank adds 1; ranks of one generation
    // all add before any rank of the next can (the join needs all of them).
    int64_t n = store.add("gcoll/joins", 1);
    std::string gen = std::to_string((n - 1) / size);
    std::string root, key;
    bool env_key = getenv("GCOLL_JOB_KEY") && *getenv("GCOLL_JOB_KEY");
    if (rank == 0) {
        // A key set in the environment (GCOLL_JOB_KEY, on every rank) is kept, never
        // published.
        std::string ip = root_host();
        root = ip + ":" + std::to_string(free_port(ip));
        key = env_key ? "" : random_key();
        store_set(store, "gcoll/key/" + gen, env_key ? "env" : "store:" + key);
        store_set(store, "gcoll/root/" + gen, root);
    } else {
        std::string k = store_get(store, "gcoll/key/" + gen);
        if (k == "env") {
            TORCH_CHECK(env_key, "gcoll backend: rank 0 uses GCOLL_JOB_KEY from its "
                                 "environment but this rank has none: set it on every rank");
        } else {
            TORCH_CHECK(k.compare(0, 6, "store:") == 0, "gcoll backend: bad key record");
            key = k.substr(6);
        }
        root = store_get(store, "gcoll/root/" + gen);
    }
    std::lock_guard<std::mutex> g(env_mutex);
    // The tighter of the group's timeout and a GCOLL_TIMEOUT_MS set in the environment
    // (torch's default is 30 minutes, which a job that bounds its waits should not get).
    int64_t limit = std::max<int64_t>(1, timeout.count());
    if (const char *env_t = getenv("GCOLL_TIMEOUT_MS")) {
        int64_t own = env_duration_ms(env_t);
        if (own > 0)
            limit = std::min(limit, own);
    }
    std::string ms = std::to_string(limit) + "ms";
    EnvOverride k("GCOLL_JOB_KEY", key.empty() ? nullptr : &key);
    EnvOverride t("GCOLL_TIMEOUT_MS", &ms);
    gcoll_comm_t *comm = nullptr;
    gcoll_status_t st = gcoll_comm_init_rank(size, rank, root.c_str(), &comm);
    TORCH_CHECK(st == GCOLL_OK, "gcoll backend: gcoll_comm_init_rank(size ", size, ", rank ", rank,
                ", root ", root, ") failed: ", gcoll_status_string(st),
                " (details in gcoll's log on stderr)");
    return comm;
}

} // namespace gcoll_torch
