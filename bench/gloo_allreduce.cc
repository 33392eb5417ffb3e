// gloo_allreduce.cc: Gloo allreduce (ring-chunked or halving-doubling) over Gloo's TCP
// transport, timed like gcoll-bench, for compare-dense.sh.
//
// Written against Debian 12's libgloo-dev (0.0~git20220518): the rendezvous is
// gloo::rendezvous::FileStore + Context::connectFullMesh (the rendezvous page of that
// package); this version has no TCP store. Gloo's allreduce works in place on the vectors
// it is given, so -c refills the input before its checking run.
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <unistd.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <climits>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "peer_common.h"

namespace
{

int env_int(const char *const names[], int fallback)
{
    for (int i = 0; names[i]; i++)
        if (const char *v = getenv(names[i]))
            return atoi(v);
    return fallback;
}

// The algorithm under test, built once per size (construction sets up Gloo's buffers and
// is not timed).
std::unique_ptr<gloo::Algorithm>
make_algo(const std::string &name, const std::shared_ptr<gloo::Context> &ctx, float *buf, int count)
{
    std::vector<float *> ptrs{buf};
    if (name == "ring_chunked")
        return std::make_unique<gloo::AllreduceRingChunked<float>>(ctx, ptrs, count);
    if (name == "halving_doubling")
        return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, ptrs, count);
    return nullptr;
}

// The slowest rank's time, as gcoll-bench and nccl-tests report.
double max_over_ranks(const std::shared_ptr<gloo::Context> &ctx, double t)
{
    std::vector<double *> p{&t};
    gloo::AllreduceRing<double> ar(ctx, p, 1, gloo::ReductionFunction<double>::max);
    ar.run();
    return t;
}

long sum_over_ranks(const std::shared_ptr<gloo::Context> &ctx, long v)
{
    double d = (double)v;
    std::vector<double *> p{&d};
    gloo::AllreduceRing<double> ar(ctx, p, 1, gloo::ReductionFunction<double>::sum);
    ar.run();
    return (long)d;
}

int run(int argc, char **argv)
{
    peer_opts_t o;
    int rc = peer_parse(argc, argv, &o);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    static const char *const rank_vars[] = {"GCOLL_RANK", "OMPI_COMM_WORLD_RANK", "RANK", nullptr};
    static const char *const size_vars[] = {"GCOLL_SIZE", "OMPI_COMM_WORLD_SIZE", "SIZE", nullptr};
    const int rank = env_int(rank_vars, -1), n = env_int(size_vars, -1);
    const std::string algo = o.algo ? o.algo : "ring_chunked";
    if (rank < 0 || n < 1 || rank >= n || !o.store) {
        fprintf(stderr, "gloo_allreduce: need -s DIR and a rank and size in the environment "
                        "(GCOLL_RANK/GCOLL_SIZE as gcoll-run sets, or OMPI_COMM_WORLD_*)\n");
        return 2;
    }
    if (algo != "ring_chunked" && algo != "halving_doubling") {
        fprintf(stderr, "gloo_allreduce: unknown algorithm '%s'\n", algo.c_str());
        return 2;
    }
    if (o.max_bytes / 4 > INT_MAX) {
        fprintf(stderr, "gloo_allreduce: -e too large for an int count\n");
        return 2;
    }

    gloo::transport::tcp::attr attr;
    // loopback, like gcoll and Open MPI in compare-dense.sh; netns-shaped.sh passes the
    // namespace's own address
    const char *host = getenv("GLOO_HOSTNAME");
    attr.hostname = host && *host ? host : "127.0.0.1";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(o.store);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
    ctx->connectFullMesh(store, dev);

    std::vector<float> buf(o.max_bytes / 4 + 1);
    if (rank == 0) {
        std::string what = "gloo " + algo + " (tcp)";
        peer_header(&o, what.c_str(), n);
    }
    for (size_t bytes = o.min_bytes; bytes; bytes = peer_next(&o, bytes)) {
        const int count = (int)(bytes / 4);
        // In place: the values grow run after run; float adds cost the same whatever the
        // value (no denormals arise from sums of ones).
        std::fill(buf.begin(), buf.begin() + count, 1.0f);
        auto ar = make_algo(algo, ctx, buf.data(), count);
        for (int w = 0; w < o.warmup; w++)
            ar->run();
        gloo::BarrierAllToAll(ctx).run();
        double t0 = peer_now_us();
        for (int it = 0; it < o.iters; it++)
            ar->run();
        double t = max_over_ranks(ctx, (peer_now_us() - t0) / o.iters);
        long wrong = -1;
        if (o.check) {
            for (int i = 0; i < count; i++)
                buf[i] = peer_val(rank, (size_t)i);
            ar->run();
            long mine = 0;
            for (int i = 0; i < count; i++) {
                float want = 0;
                for (int k = 0; k < n; k++)
                    want += peer_val(k, (size_t)i);
                mine += buf[i] != want;
            }
            wrong = sum_over_ranks(ctx, mine);
        }
        if (rank == 0)
            peer_row(&o, (size_t)count * 4, n, t, wrong);
    }
    // Nobody leaves while a peer may still be in the last collective: a rank that closed
    // its pairs first made a neighbour still in it throw "Connection closed by peer" (4
    // ranks, 2000 8-byte allreduces: 2 launches in 6). Gloo may still see a close during
    // the barrier's own end, hence the pause before the pairs close (3 in 8 with the
    // barrier alone).
    gloo::BarrierAllToAll(ctx).run();
    usleep(200000);
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo_allreduce: %s\n", e.what());
        return 1;
    }
}
