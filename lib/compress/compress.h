/* compress.h: internal codec-layer API shared by gcoll.h's compressor calls and the collectives. */
#ifndef GCOLL_COMPRESS_H
#define GCOLL_COMPRESS_H

/*
 * The codec layer never touches the network. A compressor is an immutable, parsed spec
 * (safe to share between threads); a tensor state is per tensor and used by one thread at
 * a time. Every message is self-describing (see wire.h), so any rank can decode it with a
 * compressor created from the same spec.
 *
 * A codec is "sparsifier + value format":
 *   sparsifier   none | topk | randomk | threshold | dgc | rowsparse
 *   value format f32 | f16 | bf16 | q8 | qsgd | sign | fp8 | mxfp8 | mxfp4
 * e.g. "fp16" is (none, f16), "topk:density=0.01+q8" is (topk, q8), "sign" is (none, sign).
 */

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "gcoll.h"
#include "base/util.h"

typedef enum {
    GCOLL_SPARSIFY_NONE = 0,
    GCOLL_SPARSIFY_TOPK,
    GCOLL_SPARSIFY_RANDOMK,
    GCOLL_SPARSIFY_THRESHOLD,
    GCOLL_SPARSIFY_DGC,
    GCOLL_SPARSIFY_ROWS /* rowsparse: whole rows of row_dim values (embedding gradients) */
} gcoll_sparsify_t;

typedef enum { GCOLL_SELECT_EXACT = 0, GCOLL_SELECT_SAMPLE, GCOLL_SELECT_REUSE } gcoll_select_t;

typedef enum {
    GCOLL_SCHED_NONE = 0, /* target density (bits) from step 0 */
    GCOLL_SCHED_EXP,      /* DGC: four equal stages, geometric from warmup_start to the target */
    GCOLL_SCHED_LINEAR,   /* warmup_start down to the target linearly over warmup_steps */
    GCOLL_SCHED_STEP      /* warmup_start for warmup_steps, then the target */
} gcoll_sched_t;

/* Value formats: how the kept values travel. Numbering is part of the wire format. */
typedef enum {
    GCOLL_VF_F32 = 1,
    GCOLL_VF_F16 = 2,
    GCOLL_VF_BF16 = 3,
    GCOLL_VF_Q8 = 4,    /* int8 per bucket, scale = max|x|/127, round to nearest (deterministic) */
    GCOLL_VF_QSGD = 5,  /* QSGD stochastic levels per bucket, l2-norm scale (unbiased) */
    GCOLL_VF_SIGN = 6,  /* 1 bit per value, one scale per chunk */
    GCOLL_VF_FP8 = 7,   /* OCP OFP8 E4M3/E5M2 (bits), one power-of-two scale per message */
    GCOLL_VF_MXFP8 = 8, /* OCP MX v1.0: blocks of 32 E4M3/E5M2 (bits) with an E8M0 scale */
    GCOLL_VF_MXFP4 = 9, /* OCP MX v1.0: blocks of 32 E2M1 with an E8M0 scale */
    GCOLL_VF_VQ = 10    /* vector quantization: codebook of 2^bits vectors of bucket values */
} gcoll_vfmt_t;

/* Element formats of fp8 and mxfp8 (the wire's bits field; mxfp4 carries E2M1) */
enum { GCOLL_FP8_E4M3 = 1, GCOLL_FP8_E5M2 = 2, GCOLL_FP8_E2M1 = 3 };

/* Rounding of the float formats (not on the wire: a decoder does not need it) */
enum { GCOLL_ROUND_NEAREST = 0, GCOLL_ROUND_STOCHASTIC = 1 };

typedef struct {
    gcoll_vfmt_t fmt;
    unsigned bits;   /* qsgd: 2..8; fp8/mxfp8/mxfp4: the element format (GCOLL_FP8_*) */
    uint32_t bucket; /* q8/qsgd values per scale; sign values per scale (0: whole message) */
    int sign_l2;     /* sign: scale is ||x||_2/sqrt(n) (1-bit Adam) instead of mean |x| */
    /* the encode feeds its error back (a state's residual): send the contractive form,
     * ||D(Q(x)) - x||^2 <= (1 - delta) ||x||^2 (QSGD's norm scaled by 1/(1 + omega), the
     * l2 sign scale capped); 0: the unbiased / published form. Not on the wire: the
     * scales carry it. See docs/compressors.md, "Error feedback". */
    int contract;
    int round; /* fp16/bf16/fp8/mx: GCOLL_ROUND_* */
} gcoll_vspec_t;

#define GCOLL_SPEC_MAX 256

/* Warm-up keys a spec set: warmup_steps (even 0: the caller's default does not apply),
 * and warmup_start, warmup_bits or schedule */
#define GCOLL_WARMUP_STEPS_GIVEN 1
#define GCOLL_WARMUP_SHAPE_GIVEN 2

struct gcoll_compressor {
    char spec[GCOLL_SPEC_MAX];  /* canonical spec string, equal on ranks iff settings equal */
    char given[GCOLL_SPEC_MAX]; /* the spec as the caller wrote it, for error messages */
    gcoll_sparsify_t sparsify;
    double density;   /* topk/randomk/dgc target density (0 when k is fixed) */
    uint64_t k_fixed; /* topk:k=K */
    gcoll_select_t select;
    uint32_t reuse_steps; /* select=reuse: recompute the threshold every N steps */
    uint64_t seed;        /* randomk */
    int unbiased;         /* randomk: scale kept values by n/k (ef=0 only: not a contraction) */
    /* randomk with ef=1 and feedback=ef21: EF21 (Richtarik, Sokolov, Fatkhullin 2021) instead of
     * classic error feedback: the state keeps the last values sent (g_i), a message carries x - g_i
     * at the k indices, and a collective's output is the running estimate G = mean_i g_i (its
     * server state), not the sum of the messages (docs/compressors.md, "Random-k") */
    int ef21;
    float tau;        /* threshold */
    uint32_t row_dim; /* rowsparse: values per row (density: of the touched rows; 0: all) */
    /* dgc: its velocity's momentum. randomk (classic error feedback only): the momentum M
     * of the SGD it stands in for; the residual takes g/(1-M) (docs/compressors.md) */
    float momentum;
    uint64_t warmup_steps; /* sparsifiers: of the density; dense qsgd: of the bit width */
    gcoll_sched_t sched;
    double clip;          /* clip=C: scale the gradient to l2 norm <= C (0: off) */
    double clip_value;    /* clip_value=V: clamp each element to [-V, V] first (0: off) */
    double warmup_start;  /* density at step 0 of the warm-up (1: dense) */
    unsigned warmup_bits; /* dense qsgd: bit width at step 0 of the warm-up */
    int warmup_given;     /* GCOLL_WARMUP_*_GIVEN: which warm-up keys the spec set */
    /* Per-layer selection inside a fused bucket (the bucketer sets it; not part of the
     * spec): top-k and DGC select k = density x length in each of the nlayers ranges
     * [layer_end[j-1], layer_end[j]) of the tensor, not across them. The array belongs to
     * whoever set it and outlives the compressor. */
    const size_t *layer_end;
    size_t nlayers;
    int ef; /* error feedback in states created from this compressor */
    gcoll_vspec_t vs;
};

/* Scratch buffers, grown on demand and kept in a state between encodes. */
typedef struct gcoll_scratch {
    uint32_t *idx;
    float *val;
    size_t cap_pairs;
    uint32_t *hist; /* 65536 counters for radix selection */
    uint32_t *samp;
    size_t cap_samp;
    uint64_t *bitmap;
    size_t cap_bitmap; /* words */
    float *tmp;
    size_t cap_tmp;
    int zeroed; /* the last selection left e = 0 at the indices it returned (see sparsify.h) */
    struct gcoll_select_stream *stream; /* the call's gcoll_encode_opts_t.stream, or NULL */
    struct gcoll_scratch *layer;        /* per-layer selection: one layer's pairs (sparsify.c) */
} gcoll_scratch_t;

typedef enum { GCOLL_STATE_WORKER = 0, GCOLL_STATE_SERVER = 1 } gcoll_state_mode_t;

struct gcoll_tensor_state {
    const gcoll_compressor_t *c;
    size_t count;
    uint64_t step;
    gcoll_state_mode_t mode;
    float *e;           /* error-feedback residual; for DGC the accumulation v */
    float *spare;       /* second residual buffer of a folded check (GCOLL_NANCHECK_FOLD) */
    float *u;           /* DGC velocity (worker mode only) */
    uint32_t reuse_thr; /* select=reuse: |x| bit pattern of the last threshold */
    uint64_t reuse_at;  /* step the threshold was computed at */
    int reuse_valid;
    uint64_t salt; /* mixed into QSGD's rounding stream; collectives set the rank */
    int nranks;    /* ranks of the collective encoding it (DGC's clip scale), 0 unset */
    gcoll_scratch_t sc;
    /* compressed allreduce: residual of the reduced chunk this rank re-compresses (the
     * "server" side of 1-bit Adam's scheme), created on first use, freed with the state */
    struct gcoll_tensor_state *server;
    /* hierarchical allreduce: the state of this rank's part of the step across hosts */
    struct gcoll_tensor_state *hier_part;
    float *clamped;            /* clip_value: the clamped input, the tensor's size, or NULL */
    size_t spare_reserved;     /* bytes of the spare budget this state holds (0: none yet) */
    int spare_refused;         /* the budget had no room for it (logged once) */
    struct gcoll_adapt *adapt; /* gcoll_adapt_attach's controller, or NULL */
    float *vq_book;            /* vq: the last codebook (warm start; checkpointed) */
    int spec_checked; /* the first compressed call compared the ranks' specs (compressed.c) */
};

/* How one call handles NaN/Inf in its input. The caller of a collective decides once
 * (collectives/compressed/compressed.c, run_compressed) and passes the decision down. */
typedef enum {
    /* the encoder scans the input first (where feedback or clipping needs it) */
    GCOLL_NANCHECK_SCAN = 0,
    /* the caller verified the input is finite: no scan */
    GCOLL_NANCHECK_DONE,
    /* top-k / random-k find NaN/Inf in their feedback pass (only where
     * gcoll_codec_folds_check holds: every failure then leaves the state as it was);
     * elsewhere as SCAN */
    GCOLL_NANCHECK_FOLD,
} gcoll_nancheck_t;

/* The step plan of one call: what the codec, the state and the step decide for the call's
 * count elements, computed once by whoever starts the call (gcoll_codec_plan; the
 * collective adds its scheme) and passed down in the per-call options, so that the
 * scheme's choice, the buffers and the selection read the same k and bound. */
typedef struct gcoll_step_plan {
    size_t count;   /* elements of the call (the whole tensor, offset 0) */
    uint64_t step;  /* the state's step (UINT64_MAX: a state past its warm-up) */
    double density; /* gcoll_codec_density at step (1 for codecs without one) */
    size_t k;       /* values the selection keeps: gcoll_codec_k_range(c, 0, count, step) */
    size_t bound;   /* gcoll_codec_bound of this step's codec for count elements */
    int layered;    /* gcoll_codec_layered(c, 0, count): selection layer by layer */
    int use_at;     /* this step's codec is at, not the state's (a bit-width warm-up) */
    gcoll_compressor_t at;
    int scheme;    /* the collective's scheme (collectives/compressed/compressed.c), -1: none */
    char why[160]; /* why that scheme */
} gcoll_step_plan_t;

/* The plan of a call of c on count elements at step (scheme -1). */
void gcoll_codec_plan(const gcoll_compressor_t *c, size_t count, uint64_t step,
                      gcoll_step_plan_t *p);
/* The codec the call encodes with: the plan's copy at this step, or c. */
static inline const gcoll_compressor_t *gcoll_plan_codec(const gcoll_step_plan_t *p,
                                                         const gcoll_compressor_t *c)
{
    return p->use_at ? &p->at : c;
}

/* Per-call options of an encode (NULL: GCOLL_NANCHECK_SCAN, no streaming, no plan). The
 * tensor state keeps only what persists across steps. */
typedef struct gcoll_encode_opts {
    gcoll_nancheck_t check;
    /* top-k's collecting pass streamed to this sink (sparsify.h), or NULL */
    struct gcoll_select_stream *stream;
    /* clip=C over the whole tensor: a collective that encodes it chunk by chunk passes
     * the factor of the whole (gcoll_codec_clip_factor), else each encode scales its
     * range by the range's own norm */
    int clip_preset;
    float clip_factor;
    /* the call's plan (NULL: none): an encode of its whole tensor at its step selects its
     * k instead of computing it again */
    const struct gcoll_step_plan *plan;
} gcoll_encode_opts_t;

/* The k an encode of elements [off, off + n) at step selects: the plan's (opt->plan) when
 * the encode is the planned one (the whole tensor, the plan's step, a worker state), else
 * computed (gcoll_codec_k, or gcoll_codec_k_range where the selection goes by layers). */
size_t gcoll_codec_call_k(const gcoll_compressor_t *c, const gcoll_tensor_state_t *s,
                          const gcoll_encode_opts_t *opt, size_t off, size_t n, uint64_t step);

/* Whether an encode of all count elements with s (GCOLL_NANCHECK_FOLD) finds
 * NaN/Inf in its feedback pass instead of scanning the input first, with e as it was on a
 * failure: top-k (sampled or exact threshold, not reuse) and random-k with error
 * feedback, no clipping. The residual then moves to the other buffer on every success
 * (gcoll_state_residual's pointer changes). */
int gcoll_codec_folds_check(const gcoll_compressor_t *c, const gcoll_tensor_state_t *s,
                            size_t count);

/* The clip=C factor min(1, C / ||g||) of g[0..n) (with clamp set: of g clamped to
 * [-clip_value, clip_value] first), 1 without clip=; for DGC on nranks > 1 ranks the limit
 * is C / sqrt(nranks). g must be finite. */
float gcoll_codec_clip_factor(const gcoll_compressor_t *c, const float *g, size_t n, int clamp,
                              int nranks);

/* Whether s may keep the spare residual of a folded check: it has one, or the process's
 * spare buffers (all states together) stay within budget bytes with it, which it then
 * reserves until gcoll_state_destroy (GCOLL_EF_SPARE_MAX). Thread safe. */
int gcoll_codec_spare_reserve(gcoll_tensor_state_t *s, size_t budget);
void gcoll_codec_spare_release(gcoll_tensor_state_t *s);

/* Codec properties (also public as GCOLL_CODEC_* in gcoll.h). */
unsigned gcoll_codec_flags(const gcoll_compressor_t *c);
/* Whether a compressed allreduce of c must reduce in fp32 and quantize once more at most
 * (the narrow float formats: fp8, mxfp8, mxfp4, fp16/bf16 rounded stochastically): the
 * all-to-all scheme does, the pipelined ring would re-round the partial sum at every hop. */
int gcoll_codec_reduce_fp32(const gcoll_compressor_t *c);

/* Density in force at step (warm-up schedule applied), and the k it gives for n elements
 * (0 for n == 0, else clamped to [1, n]). For sparsifiers without a density (threshold,
 * none) density is 1. */
double gcoll_codec_density(const gcoll_compressor_t *c, uint64_t step);
size_t gcoll_codec_k(const gcoll_compressor_t *c, size_t n, uint64_t step);
/* k for n elements at density d (gcoll_codec_k without the schedule). */
size_t gcoll_codec_k_of(const gcoll_compressor_t *c, size_t n, double d);
/* How many times gcoll_codec_k ran in this process (tests count one per call). */
uint64_t gcoll_codec_k_computed(void);
/* The one writer of a live codec's density (the adaptation controllers, the bucketer's
 * cuts): sets it and rewrites the spec (the spec's parse sets the first). */
void gcoll_codec_set_density(gcoll_compressor_t *c, double d);
/* The one rounding of a density d into a count of n elements, which gcoll_codec_k and the
 * adaptation's budget (adapt_stat.c) share: ceil(d n), at least 1, not capped at n (the
 * 1e-12 keeps d = k / n from rounding up to k + 1). */
static inline double gcoll_density_k(double d, double n)
{
    return fmax(1.0, ceil(d * n * (1.0 - 1e-12)));
}
/* QSGD's bit width in force at step (its warm-up schedule applied); c->vs.bits when c has
 * none. A collective encodes step `step` with gcoll_codec_at_step's copy of c. */
unsigned gcoll_codec_bits(const gcoll_compressor_t *c, uint64_t step);
/* 1 and *out = c with the bit width of step (spec rewritten) when that differs from c's;
 * else 0 and out untouched. */
int gcoll_codec_at_step(const gcoll_compressor_t *c, uint64_t step, gcoll_compressor_t *out);
/* The k a selection of elements [off, off + n) takes at step: gcoll_codec_k, or with
 * layers (c->nlayers > 1) the sum of each layer's k over its part of the range. */
size_t gcoll_codec_k_range(const gcoll_compressor_t *c, size_t off, size_t n, uint64_t step);
/* Whether the selection of elements [off, off + n) goes layer by layer. */
int gcoll_codec_layered(const gcoll_compressor_t *c, size_t off, size_t n);
/* Layer j's part [*a, *b) of [off, off + n) (tensor offsets); 0 if they do not meet. */
static inline int gcoll_codec_layer_part(const gcoll_compressor_t *c, size_t j, size_t off,
                                         size_t n, size_t *a, size_t *b)
{
    size_t lo = j ? c->layer_end[j - 1] : 0, hi = c->layer_end[j];
    *a = off > lo ? off : lo;
    *b = off + n < hi ? off + n : hi;
    return *a < *b;
}

/* Worst-case message size (header included) for n elements. 0 if it overflows. */
size_t gcoll_codec_bound(const gcoll_compressor_t *c, size_t n);

/* Encodes in[0..n), which is elements [off, off+n) of the tensor s was created for, at
 * the given step. With s, error feedback / DGC use the state's buffers at [off, off+n);
 * the state's step is NOT advanced (call gcoll_state_advance, public, once per step).
 * s == NULL: no feedback (dgc then fails: it needs its buffers). This is what a
 * collective calls per chunk; gcoll_encode is encode_range(off=0, n=count, s->step).
 * opt: the call's options (NULL: defaults). */
gcoll_status_t gcoll_codec_encode_range(const gcoll_compressor_t *c, gcoll_tensor_state_t *s,
                                        size_t off, const float *in, size_t n, uint64_t step,
                                        const gcoll_encode_opts_t *opt, void *out, size_t cap,
                                        size_t *len_p);

typedef enum { GCOLL_DECODE_SET = 0, GCOLL_DECODE_ADD = 1, GCOLL_DECODE_SUB = 2 } gcoll_dmode_t;

/* Decodes a message into out[0..count): overwrite, add or subtract. c may be NULL to
 * accept any well-formed message; otherwise the message's value format must be the one
 * c produces. The whole message is validated before out is touched. Sparse ADD/SUB cost
 * O(nnz), not O(count). */
gcoll_status_t gcoll_codec_decode(const gcoll_compressor_t *c, const void *in, size_t len,
                                  float *out, size_t count, gcoll_dmode_t mode);

/* out[0..count) = the sum of m messages (c as for gcoll_codec_decode), added in the order
 * given, then divided by div unless div is 1: the same bits as zeroing out, decoding each
 * message with GCOLL_DECODE_ADD and dividing, but for sorted sparse messages in one
 * sequential pass over out (cache-sized blocks) instead of a memset and m random-access
 * passes. Every message is validated before out is touched; on a malformed one *bad_p
 * (if not NULL) names it. */
gcoll_status_t gcoll_codec_sum(const gcoll_compressor_t *c, const uint8_t *const *msgs,
                               const size_t *lens, int m, float *out, size_t count, float div,
                               int *bad_p);

/* A source of the merged sum below: plain pairs (msgs NULL: idx/val[0..n), strictly
 * ascending, < count, checked by the caller), or a chain of nmsg sorted f32 sparse
 * messages of c (message j's indices in [j * seg, (j + 1) * seg) unless seg is 0), with
 * filter set read through a trim rule: keep |v| bits > thr, and the first ties pairs with
 * |v| bits == thr (sparsify.h). want: the pairs the source must yield; checked. */
typedef struct {
    const uint32_t *idx;
    const float *val;
    size_t n;
    const uint8_t *const *msgs;
    const size_t *lens;
    size_t nmsg, seg;
    int filter;
    uint32_t thr;
    size_t ties, want;
    size_t cand; /* filter: the pairs the messages hold in all; checked */
} gcoll_sum_src_t;

/* out[0..count) = the sum of m sources' pairs in the order given, divided by div unless
 * div is 1: the same bits as gcoll_codec_sum of f32 messages holding those pairs. Every
 * source is validated before out is touched; on a bad one *bad_p (if not NULL) names it. */
gcoll_status_t gcoll_sum_sources(const gcoll_compressor_t *c, const gcoll_sum_src_t *src, int m,
                                 float *out, size_t count, float div, int *bad_p);

/* Decodes a sparse, random-k or dense message to (index, value) pairs, indices ascending
 * (dense messages list every element, zeros included). cap is the room in idx/val;
 * GCOLL_ERR_INVALID if nnz > cap (use gcoll_wire_peek for nnz first). */
gcoll_status_t gcoll_codec_decode_pairs(const gcoll_compressor_t *c, const void *in, size_t len,
                                        size_t count, uint32_t *idx, float *val, size_t cap,
                                        size_t *nnz_p);

/* Builds a sparse message from pairs (strictly ascending indices < count, finite values),
 * values in c's value format (f32 when c is NULL). For re-sending a merged sparse chunk
 * (SparCML split-and-reduce): no state, no feedback. Bound: gcoll_codec_pairs_bound. */
gcoll_status_t gcoll_codec_encode_pairs(const gcoll_compressor_t *c, const uint32_t *idx,
                                        const float *val, size_t nnz, size_t count, void *out,
                                        size_t cap, size_t *len_p);
size_t gcoll_codec_pairs_bound(const gcoll_compressor_t *c, size_t nnz, size_t count);

/* A state for re-compressing a reduced chunk ("server" residual of the compressed
 * allreduce, as in 1-bit Adam, Tang et al. 2021): plain error feedback, no DGC momentum,
 * no clipping. count is the chunk length this rank owns. */
gcoll_status_t gcoll_state_create_mode(const gcoll_compressor_t *c, size_t count,
                                       gcoll_state_mode_t mode, gcoll_tensor_state_t **s_p);
/* Ranks that quantize stochastically the same tensor should draw independent rounding
 * noise, so averaging over ranks reduces the variance: set the salt to the rank. */
static inline void gcoll_state_set_salt(gcoll_tensor_state_t *s, uint64_t salt)
{
    s->salt = salt;
}

/* Random-k indices. Every rank derives the same key from (seed, step, offset of the
 * chunk) and the same sorted, distinct indices from (key, n, k), so only values travel.
 * bitmap: scratch of (n + 63) / 64 words, or NULL to allocate one. */
uint64_t gcoll_randomk_key(const gcoll_compressor_t *c, uint64_t step, size_t off);
gcoll_status_t gcoll_randomk_indices(uint64_t key, size_t n, size_t k, uint32_t *idx,
                                     uint64_t *bitmap);

/* Scratch management (sparsify.c). */
gcoll_status_t gcoll_scratch_pairs(gcoll_scratch_t *sc, size_t n);
gcoll_status_t gcoll_scratch_tmp(gcoll_scratch_t *sc, size_t n);
void gcoll_scratch_free(gcoll_scratch_t *sc);

/* Spec parsing (spec.c); errbuf receives the message naming the bad part. */
gcoll_status_t gcoll_spec_parse(const char *spec, gcoll_compressor_t *c, char *errbuf,
                                size_t errlen);

/* Rewrites c->spec from its fields (after a collective changes, say, the density). */
void gcoll_spec_canon(gcoll_compressor_t *c);

/* Kernel implementation in use. Tests force the generic (non-AVX2) kernels with
 * gcoll_simd_set(GCOLL_SIMD_GENERIC); GCOLL_CODEC_SIMD=generic|avx2|auto does the same
 * from the environment. Returns the level now in force (AVX2 is refused when the CPU
 * lacks it). Not thread safe with concurrent encodes. */
typedef enum { GCOLL_SIMD_AUTO = 0, GCOLL_SIMD_GENERIC = 1, GCOLL_SIMD_AVX2 = 2 } gcoll_simd_t;
gcoll_simd_t gcoll_simd_set(gcoll_simd_t level);
gcoll_simd_t gcoll_simd_active(void);
const char *gcoll_simd_name(gcoll_simd_t level);

#endif /* GCOLL_COMPRESS_H */
