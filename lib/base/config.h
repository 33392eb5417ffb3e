/* config.h: the one table of GCOLL_* environment variables and their parsed values. */
#ifndef GCOLL_CONFIG_H
#define GCOLL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "gcoll.h"

/* The collectives' settings (config.c's collectives table): the part of the snapshot the
 * algorithms read, through their context (collectives/coll.h). */
typedef struct gcoll_coll_cfg {
    size_t ring_chunk;
    long ring_depth; /* chunks a ring step keeps in flight to its right neighbour; 0: all;
                      * -1 (auto) is resolved at init (comm.c) */
    size_t ring_slice;
    size_t tree_chunk;       /* GCOLL_TREE_CHUNK: the reduce tree's segment; 0: by transport */
    int algo;                /* gcoll_algo_t */
    int rooted_algo;         /* gcoll_rooted_algo_t: reduce, gather, scatter */
    int sparse_algo;         /* 0 auto, else gcoll_sparse_plan_t + 1 */
    int compressed_algo;     /* 0 auto, 1 alltoall, 2 ring */
    size_t topk_stream;      /* elements per streamed segment of top-k (0: off) */
    char *hostname;          /* GCOLL_HOSTNAME: the host for hierarchical collectives, or NULL */
    int hier;                /* GCOLL_HIER: 0 auto, 1 flat ("0"), 2 hierarchical ("1") */
    size_t group_fuse_bytes; /* GCOLL_GROUP_FUSE_BYTES */
} gcoll_coll_cfg_t;

/* Parsed configuration, one snapshot per communicator (read at init), in the sections of
 * config.c's per-component tables. */
typedef struct gcoll_config {
    /* core: identity, rendezvous, waits, logging, transport, progress thread */
    long rank;       /* -1 when unset */
    long size;       /* -1 when unset */
    char *root;      /* "host:port" or NULL */
    char *job_key;   /* NULL when unset */
    long local_rank; /* informational (set by gcoll-run) */
    long local_size;
    long spin_us;
    int64_t timeout_ms;
    int log_level;
    char *log_subsys;
    char *log_file;
    int transport;           /* index into gcoll_transport_names */
    char *progress_cpu;      /* "auto", "none" or a CPU number */
    size_t unexpected_bytes; /* bound of the unexpected-message store; 0: none */
    /* tcp transport */
    long tcp_nsocks;
    char *tcp_ifname;
    size_t tcp_stripe_min;
    gcoll_coll_cfg_t coll; /* collectives */
    /* compression */
    int ef_spare;        /* top-k, random-k: fold the NaN/Inf scan into the feedback pass */
    size_t ef_spare_max; /* bytes all the spare residuals of the process may take */
    int codec_simd;      /* read by lib/compress/kernels.c at first use */
    char *compressor;    /* default compressor spec of tools and the bucketer */
    /* bucketer */
    size_t bucket_bytes; /* 0: automatic */
    int bucket_priority; /* bucketer: first layers' buckets first */
    int bucket_rebuild;  /* bucketer: layout again from measured ready times */
    int bucket_pipeline; /* bucketer: compressed buckets encoded ahead of their turn */
    int bucket_op;       /* 0 avg, 1 sum */
    char *layer_policy;
    int layer_select; /* bucketer: top-k/DGC select per tensor in a fused bucket */
    long accumulate_steps;
    /* adaptation */
    int adapt; /* GCOLL_ADAPT parsed: GCOLL_AR_* bits (1 bandwidth, 2 phase) */
    char *adapt_s;
    long adapt_stat_half_life;
    double density_min, density_max;
    char *density_min_s, *density_max_s;
    long adapt_half_life;
    int probe; /* GCOLL_PROBE: time an exchange at init */
    /* python */
    char *library; /* read by the Python binding only */
    /* ucx transport */
    size_t ucx_cma_min; /* ucx: single-copy (CMA) from this many bytes; 0: off */
    size_t ucx_shm_max; /* ucx: shared-memory mailbox up to this many bytes; 0: off */
    /* verbs transport (GCOLL_IB_*) */
    char *ib_hca;      /* "mlx5_0:1,mlx5_1" or NULL */
    long ib_gid_index; /* -1: automatic */
    long ib_qps_per_peer;
    int ib_mtu;      /* 0 auto, else enum ibv_mtu (1 = 256 ... 5 = 4096) */
    long ib_timeout; /* local ACK timeout exponent: 4.096 us * 2^n */
    long ib_retry_cnt;
    long ib_eager_slots;
    size_t ib_eager_size;
    size_t ib_chunk;   /* 0: the port's max_msg_sz */
    long ib_reg_cache; /* cached registrations; 0: off */
} gcoll_config_t;

enum { GCOLL_TRANSPORT_AUTO, GCOLL_TRANSPORT_TCP, GCOLL_TRANSPORT_UCX, GCOLL_TRANSPORT_VERBS };
extern const char *const gcoll_transport_names[];

/* Loads every parameter from the environment (defaults where unset). On a value that
 * does not parse, returns GCOLL_ERR_INVALID with a message naming the variable in err.
 * Warns (once per process) about GCOLL_* names that are not in the table. */
gcoll_status_t gcoll_config_load(gcoll_config_t *cfg, char *err, size_t errlen);
void gcoll_config_free(gcoll_config_t *cfg);

/* Hash of the settings every rank must agree on (flagged must-match in the table). */
uint64_t gcoll_config_match_hash(const gcoll_config_t *cfg);
/* Names of the must-match settings whose values differ between two hashes cannot be
 * recovered from hashes; this writes "NAME=value ..." of the must-match settings. */
void gcoll_config_match_string(const gcoll_config_t *cfg, char *buf, size_t len);

/* Typed parsers, exposed for unit tests. All return 0 on success, -1 on error. */
int gcoll_parse_long(const char *s, long min, long max, long *out);
int gcoll_parse_size(const char *s, size_t *out);         /* "8kb", "2MiB", "123" */
int gcoll_parse_duration_ms(const char *s, int64_t *out); /* "500ms", "2s", "1m", "300" (ms) */
int gcoll_parse_bool(const char *s, int *out);
/* "host:port" or "[v6]:port" into host and a port in 1..65535; 0, or -1 if malformed. */
int gcoll_split_hostport(const char *s, char *host, size_t hlen, char *port, size_t plen);
int gcoll_parse_enum(const char *s, const char *choices, int *out); /* "a|b|c" */
/* A set of choices joined by '+' or ',' as a bit mask (bit i: the i-th plain name of
 * "a|b|c|alias=a+b"); "off" or "0" is the empty set. 0, or -1 if a word is unknown. */
int gcoll_parse_flags(const char *s, const char *choices, unsigned *out);
/* GCOLL_ADAPT's rules, in the order of their GCOLL_AR_* bits (lib/adapt/adapt_stat.h);
 * "both" is the name from before combinations. The table declares them so that loading the
 * configuration needs no adaptation code. */
#define GCOLL_ADAPT_RULE_CHOICES "bandwidth|phase|snr|stage|budget|both=bandwidth+phase"

/* Logging helpers live in log.c but parse table values. */
int gcoll_log_parse_level(const char *s);
int gcoll_log_parse_subsys(const char *s, unsigned *mask_p);

/* 64-bit FNV-1a, used for setting and signature hashes. */
uint64_t gcoll_hash64(const void *data, size_t len, uint64_t seed);

#endif /* GCOLL_CONFIG_H */
