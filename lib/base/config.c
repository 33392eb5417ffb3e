/* config.c: the declarative table of every GCOLL_* variable, its typed parsers, and
 * the public table queries used by gcoll-info (UCX- and libfabric-style parameters). */
#include "base/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/util.h"

extern char **environ;

const char *const gcoll_transport_names[] = {"auto", "tcp", "ucx", "verbs", NULL};

typedef enum { P_INT, P_SIZE, P_DURATION, P_STRING, P_ENUM, P_BOOL } param_type_t;

enum { F_MUST_MATCH = 1, F_SECRET = 2 };

typedef struct {
    const char *name;
    param_type_t type;
    const char *deflt; /* "" = unset */
    const char *help;
    size_t offset;
    unsigned flags;
    const char *choices; /* P_ENUM: "a|b|c"; P_INT: "min:max" */
} param_t;

#define OFF(f) offsetof(gcoll_config_t, f)

/* The GCOLL_* variables gcoll reads, one table per component (as UCX declares its
 * components' tables), in the order gcoll-info prints them under their headings;
 * docs/tuning.md documents every one. Offsets are into the one gcoll_config_t snapshot. */
/* clang-format off */
static const param_t core_params[] = {
    {"GCOLL_RANK", P_INT, "",
     "rank of this process (else OMPI_COMM_WORLD_RANK, SLURM_PROCID, PMI_RANK)",
     OFF(rank), 0, "0:1048575"},
    {"GCOLL_SIZE", P_INT, "", "number of ranks (else OMPI_COMM_WORLD_SIZE, SLURM_NTASKS, PMI_SIZE)",
     OFF(size), 0, "1:1048576"},
    {"GCOLL_ROOT", P_STRING, "", "rendezvous address host:port; rank 0 listens there",
     OFF(root), 0, NULL},
    {"GCOLL_JOB_KEY", P_STRING, "",
     "shared secret authenticating every connection (HMAC challenge-response); gcoll-run makes one",
     OFF(job_key), F_SECRET, NULL},
    {"GCOLL_LOCAL_RANK", P_INT, "", "rank among the ranks on this host (set by gcoll-run)",
     OFF(local_rank), 0, "0:1048575"},
    {"GCOLL_LOCAL_SIZE", P_INT, "", "ranks on this host (set by gcoll-run)", OFF(local_size), 0,
     "1:1048576"},
    {"GCOLL_SPIN_US", P_INT, "50",
     "a blocking wait polls the transport this long (us, yielding the CPU between polls "
     "once the awaited peer is not running elsewhere) before it sleeps; gcoll_wait polls "
     "this long for an operation another thread runs, and the progress thread, woken by a "
     "call, leaves its caller this long to run it in gcoll_wait; 0: sleep at once",
     OFF(spin_us), 0, "0:1000000"},
    {"GCOLL_TIMEOUT_MS", P_DURATION, "1800000ms",
     "the slow-peer bound: deadline of every blocking wait without progress (rendezvous, "
     "connect, collective), also while the peers' connections are alive (a dead peer fails "
     "at once, from the transport); '500ms', '30s', '30m'",
     OFF(timeout_ms), 0, NULL},
    {"GCOLL_DEBUG", P_ENUM, "warn", "log level of messages to stderr (or GCOLL_DEBUG_FILE)",
     OFF(log_level), 0, "none|warn|info|debug|trace"},
    {"GCOLL_DEBUG_SUBSYS", P_STRING, "ALL",
     "subsystems logged: comma list of INIT,NET,COLL,COMPRESS,ADAPT,ALL; '^X' means all but X",
     OFF(log_subsys), 0, NULL},
    {"GCOLL_DEBUG_FILE", P_STRING, "", "log to this file instead of stderr (%h host, %p pid)",
     OFF(log_file), 0, NULL},
    {"GCOLL_TRANSPORT", P_ENUM, "auto", "transport: tcp, ucx, verbs or auto (ucx with RDMA, or with every rank on this host as the "
     "launcher says; else tcp)",
     OFF(transport), F_MUST_MATCH, "auto|tcp|ucx|verbs"},
    {"GCOLL_UNEXPECTED_BYTES", P_SIZE, "256mb",
     "most payload bytes a communicator buffers for messages that arrive before their receive "
     "is posted, all peers together; a message beyond it fails the sending peer with "
     "GCOLL_ERR_NOMEM naming it (rendezvous transfers wait instead); 0: no bound",
     OFF(unexpected_bytes), 0, NULL},
    {"GCOLL_PROGRESS_CPU", P_STRING, "auto",
     "progress thread placement: a CPU number, none, or auto (with two cores per local rank, a "
     "free core near the NIC, apart from the compute cores)",
     OFF(progress_cpu), 0, NULL},
};

static const param_t tcp_params[] = {
    {"GCOLL_TCP_NSOCKS", P_INT, "2", "TCP sockets per peer; large messages are striped over them",
     OFF(tcp_nsocks), F_MUST_MATCH, "1:16"},
    {"GCOLL_TCP_IFNAME", P_STRING, "",
     "network interface for TCP data (default: the one that routes to GCOLL_ROOT)",
     OFF(tcp_ifname), 0, NULL},
    {"GCOLL_TCP_STRIPE_MIN", P_SIZE, "256kb",
     "messages at least this large are striped over the sockets",
     OFF(tcp_stripe_min), F_MUST_MATCH, NULL},
};

static const param_t coll_params[] = {
    {"GCOLL_RING_CHUNK", P_SIZE, "512kb", "pipelining chunk of ring algorithms",
     OFF(coll.ring_chunk), F_MUST_MATCH, NULL},
    {"GCOLL_RING_DEPTH", P_INT, "-1",
     "pipelining depth of ring algorithms: chunks in flight to the right neighbour at a time "
     "(0: every chunk of a step at once; -1: 1 when the host's ranks outnumber its CPUs, "
     "else 0)", OFF(coll.ring_depth), 0, "-1:1048576"},
    {"GCOLL_RING_SLICE", P_SIZE, "64mb",
     "largest piece a ring reduces in one pass (bounds its temporary memory)", OFF(coll.ring_slice),
     F_MUST_MATCH, NULL},
    {"GCOLL_ALGO", P_ENUM, "auto",
     "allreduce algorithm: ring, rhd (recursive halving-doubling), tree, rd (recursive "
     "doubling), or auto (cost model)",
     OFF(coll.algo), F_MUST_MATCH, "auto|ring|rhd|tree|rd"},
    {"GCOLL_TREE_CHUNK", P_SIZE, "0",
     "segment of the pipelined reduce tree; 0: a record of the ucx shared-memory mailbox "
     "(GCOLL_UCX_SHM_MAX) when every rank has one with every other, else GCOLL_RING_CHUNK",
     OFF(coll.tree_chunk), F_MUST_MATCH, NULL},
    {"GCOLL_ROOTED_ALGO", P_ENUM, "auto",
     "reduce, gather and scatter: tree (binomial), direct (reduce: reduce-scatter then the "
     "blocks to the root; gather, scatter: straight between the root and each rank), chain "
     "(reduce: a pipeline through the ranks in order; gather, scatter: the tree), linear "
     "(reduce: every rank's vector straight to the root; gather, scatter: direct), or auto "
     "(cost model)",
     OFF(coll.rooted_algo), F_MUST_MATCH, "auto|tree|direct|chain|linear"},
    {"GCOLL_SPARSE_ALGO", P_ENUM, "auto",
     "sparse allreduce plan: allgather (SSAR), split (split-and-reduce), dense, or auto (by bytes)",
     OFF(coll.sparse_algo), F_MUST_MATCH, "auto|allgather|split|dense"},
    {"GCOLL_TOPK_STREAM", P_SIZE, "1048576",
     "compressed allreduce of top-k: elements per segment of the selection pass whose "
     "candidates go on the wire while the pass goes on (tensors of 16 segments or more); "
     "0: encode first, then send",
     OFF(coll.topk_stream), F_MUST_MATCH, NULL},
    {"GCOLL_COMPRESSED_ALGO", P_ENUM, "auto",
     "compressed allreduce of quantizers: alltoall (1-bit Adam's scheme), ring (pipelined, "
     "re-quantizing the partial sum at every hop), or auto (cost model)",
     OFF(coll.compressed_algo), F_MUST_MATCH, "auto|alltoall|ring"},
    {"GCOLL_HOSTNAME", P_STRING, "",
     "the host this rank counts as for hierarchical collectives (default: gethostname())",
     OFF(coll.hostname), 0, NULL},
    {"GCOLL_HIER", P_ENUM, "auto",
     "allreduce across hosts: 1 hierarchical (reduce inside each host, allreduce across "
     "hosts, allgather or broadcast inside), 0 flat, auto (hierarchical when ranks share "
     "hosts and the cost estimate favours it)",
     OFF(coll.hier), F_MUST_MATCH, "auto|0|1"},
    {"GCOLL_GROUP_FUSE_BYTES", P_SIZE, "4mb",
     "a group's consecutive allreduces of one dtype and op run as one allreduce while their "
     "bytes together stay within this (PyTorch's coalesced all-reduce); 0: never fused",
     OFF(coll.group_fuse_bytes), F_MUST_MATCH, NULL},
};

static const param_t compress_params[] = {
    {"GCOLL_EF_SPARE", P_BOOL, "1",
     "compressed allreduce of top-k (sparse scheme) and random-k: keep a second residual "
     "buffer per tensor so that the feedback pass checks the gradient for NaN/Inf as it "
     "goes (the residual untouched on a failure) instead of a separate scan first; 0 saves "
     "the memory",
     OFF(ef_spare), 0, NULL},
    {"GCOLL_EF_SPARE_MAX", P_SIZE, "64mb",
     "most bytes the second residual buffers of GCOLL_EF_SPARE may take in a process, all "
     "tensors together: a tensor whose buffer does not fit in what is left keeps one "
     "residual plus O(k) scratch and its gradient is scanned first",
     OFF(ef_spare_max), 0, NULL},
    {"GCOLL_CODEC_SIMD", P_ENUM, "auto",
     "compression kernels: auto (AVX2 where the CPU has it), generic (portable), avx2",
     OFF(codec_simd), 0, "auto|generic|avx2"},
    {"GCOLL_COMPRESSOR", P_STRING, "none",
     "default compressor spec of the bucketer and the tools (e.g. topk:density=0.01+q8)",
     OFF(compressor), F_MUST_MATCH, NULL},
};

static const param_t bucket_params[] = {
    {"GCOLL_BUCKET_BYTES", P_SIZE, "0",
     "bucketer: largest fused bucket of gradients (as PyTorch DDP's bucket_cap_mb); 0: sized "
     "from the model and the measured link (a 1 MiB first bucket, then about 1/8 of the "
     "model, 64 KiB to 25 MiB, large tensors split)",
     OFF(bucket_bytes), F_MUST_MATCH, NULL},
    {"GCOLL_BUCKET_PRIORITY", P_BOOL, "1",
     "bucketer: when several buckets are queued, reduce the first layers' first (the ranks "
     "agree on what is ready with a tiny allreduce per bucket); 0: in backward order",
     OFF(bucket_priority), F_MUST_MATCH, NULL},
    {"GCOLL_BUCKET_REBUILD", P_BOOL, "1",
     "bucketer, automatic sizes: after the second step cut the buckets again from the ready "
     "order and times and the link rate measured (agreed by all ranks), as DDP rebuilds",
     OFF(bucket_rebuild), F_MUST_MATCH, NULL},
    {"GCOLL_BUCKET_PIPELINE", P_BOOL, "1",
     "bucketer: a codec worker thread encodes each complete compressed bucket (top-k, DGC, "
     "random-k) while earlier buckets are on the wire; 0: each bucket is encoded in its turn "
     "on the progress thread (the same results either way)",
     OFF(bucket_pipeline), 0, NULL},
    {"GCOLL_BUCKET_OP", P_ENUM, "avg", "bucketer: average (as DDP) or sum the gradients",
     OFF(bucket_op), F_MUST_MATCH, "avg|sum"},
    {"GCOLL_LAYER_POLICY", P_STRING, "",
     "bucketer: compressor per tensor, first matching rule wins: "
     "'*bias*=none;size<16384=none;first=topk:density=0.05;*=topk:density=0.001'; first and "
     "last name the model's first and last layers (tensors sharing a name up to the last '.')",
     OFF(layer_policy), F_MUST_MATCH, NULL},
    {"GCOLL_LAYER_SELECT", P_BOOL, "1",
     "bucketer: top-k and DGC pick k = density x size in each tensor of a fused bucket "
     "(0: one k across the bucket, which starves tensors of small gradients)",
     OFF(layer_select), F_MUST_MATCH, NULL},
    {"GCOLL_ACCUMULATE_STEPS", P_INT, "1",
     "bucketer: sum gradients locally over N steps and communicate on the Nth",
     OFF(accumulate_steps), F_MUST_MATCH, "1:1000000"},
};

static const param_t adapt_params[] = {
    {"GCOLL_ADAPT", P_STRING, "off",
     "adaptation rules joined by '+': bandwidth (the link), phase (ACCORDION's gradient-norm "
     "signal), snr (gradient noise scale), stage (convergence), budget (per-bucket split of "
     "the total k); e.g. snr+bandwidth; both = bandwidth+phase; off",
     OFF(adapt_s), F_MUST_MATCH, NULL},
    {"GCOLL_DENSITY_MIN", P_STRING, "0.0001", "adaptation: lowest density it may choose",
     OFF(density_min_s), F_MUST_MATCH, NULL},
    {"GCOLL_DENSITY_MAX", P_STRING, "0.1", "adaptation: highest density it may choose",
     OFF(density_max_s), F_MUST_MATCH, NULL},
    {"GCOLL_ADAPT_HALF_LIFE", P_INT, "4",
     "adaptation: half-life in steps of the bandwidth estimate (EWMA)", OFF(adapt_half_life),
     F_MUST_MATCH, "1:1000"},
    {"GCOLL_ADAPT_STAT_HALF_LIFE", P_INT, "20",
     "adaptation: half-life in steps of the smoothed noise-scale, stage and budget statistics",
     OFF(adapt_stat_half_life), F_MUST_MATCH, "1:100000"},
    {"GCOLL_PROBE", P_BOOL, "0",
     "at init, time a short exchange with every rank (two 1 MiB-per-rank allgathers, the "
     "first warming the connections) and start adaptation's bandwidth estimate from it",
     OFF(probe), F_MUST_MATCH, NULL},
};

static const param_t python_params[] = {
    {"GCOLL_LIBRARY", P_STRING, "",
     "Python binding: path of the libgcoll.so to load (default: the build tree, then the system)",
     OFF(library), 0, NULL},
};

static const param_t ucx_params[] = {
    {"GCOLL_UCX_CMA_MIN", P_SIZE, "128kb",
     "ucx: messages at least this large to a rank on the same host move in one copy between "
     "the callers' buffers (the receiver reads, process_vm_readv; a gather's root has the "
     "sender write, process_vm_writev); 0: off",
     OFF(ucx_cma_min), 0, NULL},
    {"GCOLL_UCX_SHM_MAX", P_SIZE, "16kb",
     "ucx: messages up to this large to a rank on the same host go through gcoll's own "
     "shared-memory mailbox instead of UCX (capped at 16kb); 0: off",
     OFF(ucx_shm_max), 0, NULL},
};

static const param_t verbs_params[] = {
    {"GCOLL_IB_HCA", P_STRING, "",
     "verbs: devices and ports to use, NCCL-style 'mlx5_0:1,mlx5_1' (first usable wins; "
     "default: the first active port)", OFF(ib_hca), 0, NULL},
    {"GCOLL_IB_GID_INDEX", P_INT, "-1",
     "verbs: GID table index for RoCE (-1: an IPv4-mapped GID, RoCE v2 first, else 0)",
     OFF(ib_gid_index), 0, "-1:255"},
    {"GCOLL_IB_QPS_PER_PEER", P_INT, "1",
     "verbs: reliable-connected queue pairs per peer; messages are spread over them",
     OFF(ib_qps_per_peer), F_MUST_MATCH, "1:16"},
    {"GCOLL_IB_MTU", P_ENUM, "auto",
     "verbs: path MTU in bytes (auto: the smaller active MTU of the two ports)", OFF(ib_mtu), 0,
     "auto|256|512|1024|2048|4096"},
    {"GCOLL_IB_TIMEOUT", P_INT, "18",
     "verbs: ACK timeout exponent, 4.096 us * 2^n per retry (18: about 1 s)", OFF(ib_timeout),
     0, "1:31"},
    {"GCOLL_IB_RETRY_CNT", P_INT, "7", "verbs: transport retries before a send fails",
     OFF(ib_retry_cnt), 0, "0:7"},
    {"GCOLL_IB_EAGER_SLOTS", P_INT, "16",
     "verbs: pre-registered receive slots per peer (the credits a sender holds)",
     OFF(ib_eager_slots), 0, "2:4096"},
    {"GCOLL_IB_EAGER_SIZE", P_SIZE, "8kb",
     "verbs: bytes per slot; messages up to this minus a 48-byte header go eagerly, larger "
     "ones by rendezvous (RDMA write into the posted receive)", OFF(ib_eager_size), 0, NULL},
    {"GCOLL_IB_CHUNK", P_SIZE, "0",
     "verbs: largest single RDMA write of a rendezvous (0: the port's max_msg_sz)",
     OFF(ib_chunk), 0, NULL},
    {"GCOLL_IB_REG_CACHE", P_INT, "0",
     "verbs: user-buffer registrations kept for reuse (0: register per message; enable only "
     "if buffers are not freed and reallocated while the communicator lives)",
     OFF(ib_reg_cache), 0, "0:65536"},
};

typedef struct {
    const char *name; /* heading gcoll-info prints: "tcp: TCP transport" */
    const param_t *params;
    size_t count;
} param_table_t;

#define TABLE(name, t) {name, t, sizeof(t) / sizeof(t[0])}
static const param_table_t tables[] = {
    TABLE("core: identity, rendezvous, waits, logging, transport, progress thread", core_params),
    TABLE("tcp: TCP transport", tcp_params),
    TABLE("collectives: collective algorithms", coll_params),
    TABLE("compression: codecs and error feedback", compress_params),
    TABLE("bucketer: fused buckets overlapping the backward pass", bucket_params),
    TABLE("adaptation: density chosen from bandwidth and training phase", adapt_params),
    TABLE("python: Python binding", python_params),
    TABLE("ucx: UCX transport", ucx_params),
    TABLE("verbs: InfiniBand verbs transport (GCOLL_IB_*)", verbs_params),
};
/* clang-format on */

uint64_t gcoll_hash64(const void *data, size_t len, uint64_t seed)
{
    const uint8_t *p = data;
    uint64_t h = 1469598103934665603ull ^ seed;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int parse_one(const param_t *p, const char *val, gcoll_config_t *cfg)
{
    void *field = (char *)cfg + p->offset;
    switch (p->type) {
    case P_INT: {
        long lo = 0, hi = 0, v;
        if (sscanf(p->choices, "%ld:%ld", &lo, &hi) != 2 || gcoll_parse_long(val, lo, hi, &v))
            return -1;
        *(long *)field = v;
        return 0;
    }
    case P_SIZE:
        return gcoll_parse_size(val, (size_t *)field);
    case P_DURATION:
        return gcoll_parse_duration_ms(val, (int64_t *)field);
    case P_BOOL:
        return gcoll_parse_bool(val, (int *)field);
    case P_ENUM:
        return gcoll_parse_enum(val, p->choices, (int *)field);
    case P_STRING: {
        char *dup = strdup(val);
        if (!dup)
            return -1;
        free(*(char **)field);
        *(char **)field = dup;
        return 0;
    }
    }
    return -1;
}

static const char *type_name(param_type_t t)
{
    static const char *const names[] = {"int", "size", "duration", "string", "enum", "bool"};
    return names[t];
}

static void expectation(const param_t *p, char *buf, size_t len)
{
    /* clang-format off */
    switch (p->type) {
    case P_INT: snprintf(buf, len, "an integer in %s", p->choices); break;
    case P_SIZE: snprintf(buf, len, "a size such as 65536, 8kb, 2mb, 1gb"); break;
    case P_DURATION: snprintf(buf, len, "a duration such as 500ms, 30s, 5m"); break;
    case P_ENUM: snprintf(buf, len, "one of %s", p->choices); break;
    case P_BOOL: snprintf(buf, len, "0/1, yes/no, true/false or on/off"); break;
    case P_STRING: snprintf(buf, len, "a string"); break;
    }
    /* clang-format on */
}

#define NTABLES (sizeof(tables) / sizeof(tables[0]))

static size_t nparams(void)
{
    size_t n = 0;
    for (size_t t = 0; t < NTABLES; t++)
        n += tables[t].count;
    return n;
}
#define NPARAMS nparams()

/* Entry i of the tables taken in order (NULL past the end), and its table's heading. */
static const param_t *param_at(size_t i, const char **table_p)
{
    for (size_t t = 0; t < NTABLES; i -= tables[t++].count) {
        if (i < tables[t].count) {
            if (table_p)
                *table_p = tables[t].name;
            return &tables[t].params[i];
        }
    }
    return NULL;
}

static int is_known(const char *name, size_t len)
{
    for (size_t i = 0, np = NPARAMS; i < np; i++) {
        const param_t *p = param_at(i, NULL);
        if (strlen(p->name) == len && strncmp(p->name, name, len) == 0)
            return 1;
    }
    return 0;
}

/* Levenshtein distance of a (n bytes) and b, capped at 3 (enough for a suggestion). */
static size_t edit_distance(const char *a, size_t n, const char *b)
{
    size_t m = strlen(b), row[64];
    if (n >= 63 || m >= 63)
        return 3;
    for (size_t j = 0; j <= m; j++)
        row[j] = j;
    for (size_t i = 1; i <= n; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            best = GCOLL_MIN(best, up + 1);
            best = GCOLL_MIN(best, row[j - 1] + 1);
            row[j] = best;
            diag = up;
        }
    }
    return GCOLL_MIN(row[m], (size_t)3);
}

/* The known name closest to a misspelt one (at most 2 edits), or NULL. */
static const char *nearest_name(const char *name, size_t len)
{
    const char *best = NULL;
    size_t bd = 3;
    for (size_t i = 0, np = NPARAMS; i < np; i++) {
        const param_t *p = param_at(i, NULL);
        size_t d = edit_distance(name, len, p->name);
        if (d < bd) {
            bd = d;
            best = p->name;
        }
    }
    return best;
}

static pthread_once_t unknown_once = PTHREAD_ONCE_INIT;

/* A misspelt variable silently ignored is the worst kind of bug report: warn (as UCX does). */
static void warn_unknown(void)
{
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "GCOLL_", 6) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        if (is_known(*e, len))
            continue;
        const char *near = nearest_name(*e, len);
        if (near)
            GCOLL_WARN("unknown environment variable %.*s: did you mean %s?", (int)len, *e, near);
        else
            GCOLL_WARN("unknown environment variable %.*s (gcoll-info lists the known ones)",
                       (int)len, *e);
    }
}

static gcoll_status_t load(gcoll_config_t *cfg, char *err, size_t errlen, int defaults_only)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->rank = cfg->size = cfg->local_rank = cfg->local_size = -1;
    for (size_t i = 0, np = NPARAMS; i < np; i++) {
        const param_t *p = param_at(i, NULL);
        if (*p->deflt && parse_one(p, p->deflt, cfg) != 0) {
            snprintf(err, errlen, "internal: default of %s does not parse", p->name);
            gcoll_config_free(cfg);
            return GCOLL_ERR_INTERNAL;
        }
        const char *val = defaults_only ? NULL : getenv(p->name);
        if (val == NULL || *val == '\0')
            continue;
        if (parse_one(p, val, cfg) != 0) {
            char want[128];
            expectation(p, want, sizeof(want));
            snprintf(err, errlen, "%s='%s' is invalid: expected %s", p->name,
                     (p->flags & F_SECRET) ? "***" : val, want);
            gcoll_config_free(cfg);
            return GCOLL_ERR_INVALID;
        }
    }
    static const struct {
        const char *name;
        size_t soff, doff;
    } dens[] = {{"GCOLL_DENSITY_MIN", OFF(density_min_s), OFF(density_min)},
                {"GCOLL_DENSITY_MAX", OFF(density_max_s), OFF(density_max)}};
    for (size_t i = 0; i < 2; i++) {
        const char *v = *(char **)((char *)cfg + dens[i].soff);
        char *end = NULL;
        double d = v ? strtod(v, &end) : 0;
        if (!v || end == v || *end || !(d > 0 && d <= 1)) {
            snprintf(err, errlen, "%s='%s' is invalid: expected a density in (0, 1]", dens[i].name,
                     v ? v : "");
            gcoll_config_free(cfg);
            return GCOLL_ERR_INVALID;
        }
        *(double *)((char *)cfg + dens[i].doff) = d;
    }
    if (cfg->density_min > cfg->density_max) {
        snprintf(err, errlen, "GCOLL_DENSITY_MIN (%g) is above GCOLL_DENSITY_MAX (%g)",
                 cfg->density_min, cfg->density_max);
        gcoll_config_free(cfg);
        return GCOLL_ERR_INVALID;
    }
    unsigned rules = 0;
    if (gcoll_parse_flags(cfg->adapt_s, GCOLL_ADAPT_RULE_CHOICES, &rules) != 0) {
        snprintf(err, errlen,
                 "GCOLL_ADAPT='%s' is invalid: expected off, both, or rules "
                 "joined by '+' from bandwidth, phase, snr, stage, budget",
                 cfg->adapt_s ? cfg->adapt_s : "");
        gcoll_config_free(cfg);
        return GCOLL_ERR_INVALID;
    }
    cfg->adapt = (int)rules;
    if (cfg->log_subsys) {
        unsigned mask;
        if (gcoll_log_parse_subsys(cfg->log_subsys, &mask) != 0) {
            snprintf(err, errlen,
                     "GCOLL_DEBUG_SUBSYS='%s' is invalid: expected a comma list of "
                     "INIT,NET,COLL,COMPRESS,ADAPT,ALL",
                     cfg->log_subsys);
            gcoll_config_free(cfg);
            return GCOLL_ERR_INVALID;
        }
    }
    return GCOLL_OK;
}

gcoll_status_t gcoll_config_load(gcoll_config_t *cfg, char *err, size_t errlen)
{
    gcoll_log_init();
    pthread_once(&unknown_once, warn_unknown);
    return load(cfg, err, errlen, 0);
}

void gcoll_config_free(gcoll_config_t *cfg)
{
    for (size_t i = 0, np = NPARAMS; i < np; i++) {
        const param_t *p = param_at(i, NULL);
        if (p->type == P_STRING) {
            char **f = (char **)((char *)cfg + p->offset);
            free(*f);
            *f = NULL;
        }
    }
}

/* Text of one parsed value, for match strings. */
static void format_value(const param_t *p, const gcoll_config_t *cfg, char *buf, size_t len)
{
    const void *field = (const char *)cfg + p->offset;
    switch (p->type) {
    case P_INT:
        snprintf(buf, len, "%ld", *(const long *)field);
        break;
    case P_SIZE:
        snprintf(buf, len, "%zu", *(const size_t *)field);
        break;
    case P_DURATION:
        snprintf(buf, len, "%" PRId64 "ms", *(const int64_t *)field);
        break;
    case P_BOOL:
        snprintf(buf, len, "%d", *(const int *)field);
        break;
    case P_ENUM: { /* the word the user wrote ("ucx"), not its index */
        int v = *(const int *)field;
        const char *c = p->choices;
        for (int k = 0; k < v && c && (c = strchr(c, '|')); k++)
            c++;
        size_t n = c ? strcspn(c, "|") : 0;
        snprintf(buf, len, "%.*s", (int)n, c ? c : "");
        break;
    }
    case P_STRING: {
        const char *s = *(char *const *)field;
        snprintf(buf, len, "%s", s ? s : "");
        break;
    }
    }
}

void gcoll_config_match_string(const gcoll_config_t *cfg, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0, np = NPARAMS; i < np && o < len; i++) {
        const param_t *p = param_at(i, NULL);
        if (!(p->flags & F_MUST_MATCH))
            continue;
        char v[256];
        format_value(p, cfg, v, sizeof(v));
        int n = snprintf(buf + o, len - o, "%s%s=%s", o ? " " : "", p->name, v);
        if (n < 0)
            break;
        o += (size_t)n;
    }
}

uint64_t gcoll_config_match_hash(const gcoll_config_t *cfg)
{
    char buf[4096];
    gcoll_config_match_string(cfg, buf, sizeof(buf));
    return gcoll_hash64(buf, strlen(buf), 0);
}

size_t gcoll_param_count(void)
{
    return NPARAMS;
}

gcoll_status_t gcoll_param_get(size_t i, gcoll_param_info_t *info_p)
{
    if (i >= NPARAMS || info_p == NULL)
        return GCOLL_ERR_INVALID;
    const param_t *p = param_at(i, NULL);
    const char *val = getenv(p->name);
    info_p->name = p->name;
    info_p->type = type_name(p->type);
    info_p->deflt = p->deflt;
    info_p->help = p->help;
    info_p->value = (val && (p->flags & F_SECRET)) ? "(set, hidden)" : val;
    return GCOLL_OK;
}

const char *gcoll_param_component(size_t i)
{
    const char *name = NULL;
    return param_at(i, &name) ? name : NULL;
}

gcoll_status_t gcoll_param_check(char *errbuf, size_t errlen)
{
    gcoll_config_t cfg;
    char err[512];
    gcoll_status_t st = gcoll_config_load(&cfg, err, sizeof(err));
    if (st != GCOLL_OK) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "%s", err);
        return st;
    }
    gcoll_config_free(&cfg);
    return GCOLL_OK;
}

gcoll_status_t gcoll_param_validate(size_t i, char *errbuf, size_t errlen)
{
    if (i >= NPARAMS)
        return GCOLL_ERR_INVALID;
    const param_t *p = param_at(i, NULL);
    const char *val = getenv(p->name);
    if (errbuf && errlen)
        errbuf[0] = '\0';
    if (!val || !*val)
        return GCOLL_OK;
    gcoll_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    int bad = parse_one(p, val, &cfg) != 0;
    gcoll_config_free(&cfg);
    if (!bad)
        return GCOLL_OK;
    char want[128];
    expectation(p, want, sizeof(want));
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "%s='%s' is invalid: expected %s", p->name,
                 (p->flags & F_SECRET) ? "***" : val, want);
    return GCOLL_ERR_INVALID;
}
