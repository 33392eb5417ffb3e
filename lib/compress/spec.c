/* spec.c: parses compressor spec strings ("topk:density=0.01+q8") and prints them canonically. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

/*
 * spec    := segment [ '+' segment ]
 * segment := name [ ':' key=value { ',' key=value } ]
 * The first segment names the codec; the optional second one the value format the kept
 * values travel in (after a sparsifier only). clip=, clip_value= and ef= may appear in any
 * segment.
 */

#define SEG_MAX 128

typedef struct {
    char *err;
    size_t errlen;
    const char *spec;
} pctx_t;

static gcoll_status_t perr(pctx_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static gcoll_status_t perr(pctx_t *p, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (p->err && p->errlen)
        snprintf(p->err, p->errlen, "compressor spec '%s': %s", p->spec, msg);
    GCOLL_WARN("compressor spec '%s': %s", p->spec, msg);
    return GCOLL_ERR_INVALID;
}

static int parse_double(const char *s, double *v)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(d))
        return -1;
    *v = d;
    return 0;
}

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long u = strtoull(s, &end, 10);
    if (*end != '\0' || errno == ERANGE)
        return -1;
    *v = u;
    return 0;
}

typedef struct {
    int have_density, have_k, have_select, have_reuse, have_seed, have_unbiased, have_tau;
    int have_momentum, have_warmup, have_sched, have_scale, have_chunk, have_bits;
    int have_bucket, have_clip, have_ef, have_clip_value, have_wstart, have_wbits;
    int have_round, have_format, have_feedback, have_dim;
} seen_t;

#define ONCE(flag, key)                                                                            \
    do {                                                                                           \
        if (seen->flag)                                                                            \
            return perr(p, "option '%s' given twice", key);                                        \
        seen->flag = 1;                                                                            \
    } while (0)

/* Options valid in any segment. Returns 1 if handled, 0 if not a global key, <0 error. */
static int parse_global(pctx_t *p, gcoll_compressor_t *c, seen_t *seen, const char *key,
                        const char *val)
{
    if (!strcmp(key, "clip")) {
        ONCE(have_clip, key);
        if (parse_double(val, &c->clip) || !(c->clip > 0))
            return perr(p, "clip=%s must be a positive number (gradient norm bound)", val);
        return 1;
    }
    if (!strcmp(key, "clip_value")) {
        ONCE(have_clip_value, key);
        if (parse_double(val, &c->clip_value) || !(c->clip_value >= 1.1754944e-38) ||
            c->clip_value > 3.0e38)
            return perr(p,
                        "clip_value=%s must be a positive number from 1.2e-38 to 3e38 "
                        "(elements clamped to [-V, V])",
                        val);
        return 1;
    }
    if (!strcmp(key, "ef")) {
        ONCE(have_ef, key);
        if (strcmp(val, "0") && strcmp(val, "1"))
            return perr(p, "ef=%s must be 0 or 1", val);
        c->ef = val[0] == '1';
        return 1;
    }
    return 0;
}

static gcoll_status_t parse_density(pctx_t *p, const char *val, double *d)
{
    if (parse_double(val, d) || !(*d > 0.0 && *d <= 1.0))
        return perr(p, "density=%s must be a number in (0, 1]", val);
    return GCOLL_OK;
}

/* warmup_steps=N, schedule=S and (density) warmup_start=D or (bits) warmup_bits=B.
 * Returns 1 if handled, 0 if not a warm-up key, <0 error. */
static int parse_warmup(pctx_t *p, gcoll_compressor_t *c, seen_t *seen, const char *key,
                        const char *val, int bits)
{
    uint64_t u;
    if (!strcmp(key, "warmup_steps")) {
        ONCE(have_warmup, key);
        if (parse_u64(val, &u))
            return perr(p, "warmup_steps=%s must be a non-negative integer", val);
        c->warmup_steps = u;
        c->warmup_given |= GCOLL_WARMUP_STEPS_GIVEN;
        return 1;
    }
    if (!strcmp(key, "schedule")) {
        ONCE(have_sched, key);
        if (!strcmp(val, "exp"))
            c->sched = GCOLL_SCHED_EXP;
        else if (!strcmp(val, "none"))
            c->sched = GCOLL_SCHED_NONE;
        else if (!strcmp(val, "linear"))
            c->sched = GCOLL_SCHED_LINEAR;
        else if (!strcmp(val, "step"))
            c->sched = GCOLL_SCHED_STEP;
        else
            return perr(p, "schedule=%s must be exp, linear, step or none", val);
        c->warmup_given |= GCOLL_WARMUP_SHAPE_GIVEN;
        return 1;
    }
    if (!bits && !strcmp(key, "warmup_start")) {
        ONCE(have_wstart, key);
        if (parse_double(val, &c->warmup_start) ||
            !(c->warmup_start > 0.0 && c->warmup_start <= 1.0))
            return perr(p, "warmup_start=%s must be a density in (0, 1] (1: dense)", val);
        c->warmup_given |= GCOLL_WARMUP_SHAPE_GIVEN;
        return 1;
    }
    if (bits && !strcmp(key, "warmup_bits")) {
        ONCE(have_wbits, key);
        if (parse_u64(val, &u) || u < 2 || u > 8)
            return perr(p, "warmup_bits=%s must be an integer in 2..8", val);
        c->warmup_bits = (unsigned)u;
        c->warmup_given |= GCOLL_WARMUP_SHAPE_GIVEN;
        return 1;
    }
    return 0;
}

static gcoll_status_t parse_vkey(pctx_t *p, gcoll_compressor_t *c, seen_t *seen, const char *name,
                                 const char *key, const char *val)
{
    gcoll_vspec_t *vs = &c->vs;
    uint64_t u;
    if (vs->fmt == GCOLL_VF_QSGD && c->sparsify == GCOLL_SPARSIFY_NONE) {
        /* the bit-width schedule of a dense qsgd */
        int w = parse_warmup(p, c, seen, key, val, 1);
        if (w)
            return w < 0 ? GCOLL_ERR_INVALID : GCOLL_OK;
    }
    if (vs->fmt == GCOLL_VF_QSGD && !strcmp(key, "bits")) {
        ONCE(have_bits, key);
        if (parse_u64(val, &u) || u < 2 || u > 8)
            return perr(p, "bits=%s must be an integer in 2..8", val);
        vs->bits = (unsigned)u;
        return GCOLL_OK;
    }
    if ((vs->fmt == GCOLL_VF_QSGD || vs->fmt == GCOLL_VF_Q8) && !strcmp(key, "bucket")) {
        ONCE(have_bucket, key);
        if (parse_u64(val, &u) || u < 1 || u > 0xffffffffull)
            return perr(p, "bucket=%s must be an integer in 1..4294967295", val);
        vs->bucket = (uint32_t)u;
        return GCOLL_OK;
    }
    int floatf = vs->fmt == GCOLL_VF_F16 || vs->fmt == GCOLL_VF_BF16 || vs->fmt == GCOLL_VF_FP8 ||
                 vs->fmt == GCOLL_VF_MXFP8 || vs->fmt == GCOLL_VF_MXFP4;
    if (floatf && !strcmp(key, "round")) {
        ONCE(have_round, key);
        if (!strcmp(val, "nearest"))
            vs->round = GCOLL_ROUND_NEAREST;
        else if (!strcmp(val, "stochastic"))
            vs->round = GCOLL_ROUND_STOCHASTIC;
        else
            return perr(p, "round=%s must be nearest or stochastic", val);
        return GCOLL_OK;
    }
    if (vs->fmt == GCOLL_VF_VQ && !strcmp(key, "dim")) {
        ONCE(have_bucket, key);
        if (parse_u64(val, &u) || u < 1 || u > 64)
            return perr(p, "dim=%s must be an integer in 1..64 (values per vector)", val);
        vs->bucket = (uint32_t)u;
        return GCOLL_OK;
    }
    if (vs->fmt == GCOLL_VF_VQ && !strcmp(key, "bits")) {
        ONCE(have_bits, key);
        if (parse_u64(val, &u) || u < 1 || u > 8)
            return perr(p, "bits=%s must be an integer in 1..8 (2^bits codewords)", val);
        vs->bits = (unsigned)u;
        return GCOLL_OK;
    }
    if ((vs->fmt == GCOLL_VF_FP8 || vs->fmt == GCOLL_VF_MXFP8) && !strcmp(key, "format")) {
        ONCE(have_format, key);
        if (!strcmp(val, "e4m3"))
            vs->bits = GCOLL_FP8_E4M3;
        else if (!strcmp(val, "e5m2"))
            vs->bits = GCOLL_FP8_E5M2;
        else
            return perr(p, "format=%s must be e4m3 or e5m2", val);
        return GCOLL_OK;
    }
    if (vs->fmt == GCOLL_VF_SIGN && !strcmp(key, "scale")) {
        ONCE(have_scale, key);
        if (!strcmp(val, "mean"))
            vs->sign_l2 = 0;
        else if (!strcmp(val, "l2"))
            vs->sign_l2 = 1;
        else
            return perr(p, "scale=%s must be mean or l2", val);
        return GCOLL_OK;
    }
    if (vs->fmt == GCOLL_VF_SIGN && !strcmp(key, "chunk")) {
        ONCE(have_chunk, key);
        if (parse_u64(val, &u) || u % 8 != 0 || u > 0xfffffff8ull)
            return perr(p, "chunk=%s must be a multiple of 8 (0: one scale per message)", val);
        vs->bucket = (uint32_t)u;
        return GCOLL_OK;
    }
    return perr(p, "unknown option '%s' for %s", key, name);
}

/* Sets vs for a value-format name; returns 0 if name is not one. */
static int vfmt_by_name(const char *name, gcoll_vspec_t *vs)
{
    memset(vs, 0, sizeof(*vs));
    if (!strcmp(name, "fp32") || !strcmp(name, "f32"))
        vs->fmt = GCOLL_VF_F32;
    else if (!strcmp(name, "fp16"))
        vs->fmt = GCOLL_VF_F16;
    else if (!strcmp(name, "bf16"))
        vs->fmt = GCOLL_VF_BF16;
    else if (!strcmp(name, "q8")) {
        vs->fmt = GCOLL_VF_Q8;
        vs->bucket = 1024;
    } else if (!strcmp(name, "qsgd")) {
        vs->fmt = GCOLL_VF_QSGD;
        vs->bits = 4;
        vs->bucket = 512;
    } else if (!strcmp(name, "sign")) {
        /* one scale per 64 values (half a bit each): with error feedback and momentum the
         * whole-tensor scale's weak contraction diverges in gcoll-train, chunks of 64 train
         * (docs/training.md) */
        vs->fmt = GCOLL_VF_SIGN;
        vs->bucket = 64;
    } else if (!strcmp(name, "fp8")) {
        vs->fmt = GCOLL_VF_FP8;
        vs->bits = GCOLL_FP8_E4M3;
    } else if (!strcmp(name, "mxfp8")) {
        vs->fmt = GCOLL_VF_MXFP8;
        vs->bits = GCOLL_FP8_E4M3;
        vs->bucket = 32;
    } else if (!strcmp(name, "vq")) {
        vs->fmt = GCOLL_VF_VQ;
        vs->bits = 8;
        vs->bucket = 4;
    } else if (!strcmp(name, "mxfp4")) {
        vs->fmt = GCOLL_VF_MXFP4;
        vs->bits = GCOLL_FP8_E2M1;
        vs->bucket = 32;
    } else
        return 0;
    return 1;
}

static gcoll_status_t parse_sparsifier_key(pctx_t *p, gcoll_compressor_t *c, seen_t *seen,
                                           const char *name, const char *key, const char *val)
{
    uint64_t u;
    gcoll_sparsify_t sp = c->sparsify;
    int has_density =
        sp == GCOLL_SPARSIFY_TOPK || sp == GCOLL_SPARSIFY_RANDOMK || sp == GCOLL_SPARSIFY_DGC;
    int has_select = sp == GCOLL_SPARSIFY_TOPK || sp == GCOLL_SPARSIFY_DGC;
    if (has_density) {
        int w = parse_warmup(p, c, seen, key, val, 0);
        if (w)
            return w < 0 ? GCOLL_ERR_INVALID : GCOLL_OK;
    }
    if (has_density && !strcmp(key, "density")) {
        ONCE(have_density, key);
        return parse_density(p, val, &c->density);
    }
    if (sp == GCOLL_SPARSIFY_TOPK && !strcmp(key, "k")) {
        ONCE(have_k, key);
        if (parse_u64(val, &u) || u < 1 || u > 0xffffffffull)
            return perr(p, "k=%s must be an integer in 1..4294967295", val);
        c->k_fixed = u;
        return GCOLL_OK;
    }
    if (has_select && !strcmp(key, "select")) {
        ONCE(have_select, key);
        if (!strcmp(val, "exact"))
            c->select = GCOLL_SELECT_EXACT;
        else if (!strcmp(val, "sample"))
            c->select = GCOLL_SELECT_SAMPLE;
        else if (!strcmp(val, "reuse"))
            c->select = GCOLL_SELECT_REUSE;
        else
            return perr(p, "select=%s must be exact, sample or reuse", val);
        return GCOLL_OK;
    }
    if (has_select && !strcmp(key, "reuse_steps")) {
        ONCE(have_reuse, key);
        if (parse_u64(val, &u) || u < 1 || u > 1000000)
            return perr(p, "reuse_steps=%s must be an integer in 1..1000000", val);
        c->reuse_steps = (uint32_t)u;
        return GCOLL_OK;
    }
    if ((sp == GCOLL_SPARSIFY_DGC || sp == GCOLL_SPARSIFY_RANDOMK) && !strcmp(key, "momentum")) {
        ONCE(have_momentum, key);
        double m;
        /* checked as the float it is kept as: 0.999999999 rounds to 1 (a fuzzer found it),
         * whose canonical spec would not parse back */
        if (parse_double(val, &m) || !(m >= 0.0 && (float)m < 1.0f))
            return perr(p,
                        "momentum=%s must be a number in [0, 1) (as a float: at most "
                        "0.99999994)",
                        val);
        c->momentum = (float)m;
        return GCOLL_OK;
    }
    if (sp == GCOLL_SPARSIFY_RANDOMK && !strcmp(key, "seed")) {
        ONCE(have_seed, key);
        if (parse_u64(val, &c->seed))
            return perr(p, "seed=%s must be a non-negative integer", val);
        return GCOLL_OK;
    }
    if (sp == GCOLL_SPARSIFY_RANDOMK && !strcmp(key, "feedback")) {
        ONCE(have_feedback, key);
        if (!strcmp(val, "ef21"))
            c->ef21 = 1;
        else if (!strcmp(val, "ef"))
            c->ef21 = 0;
        else
            return perr(p, "feedback=%s must be ef21 or ef", val);
        return GCOLL_OK;
    }
    if (sp == GCOLL_SPARSIFY_RANDOMK && !strcmp(key, "unbiased")) {
        ONCE(have_unbiased, key);
        if (strcmp(val, "0") && strcmp(val, "1"))
            return perr(p, "unbiased=%s must be 0 or 1", val);
        c->unbiased = val[0] == '1';
        return GCOLL_OK;
    }
    if (sp == GCOLL_SPARSIFY_ROWS && !strcmp(key, "dim")) {
        ONCE(have_dim, key);
        if (parse_u64(val, &u) || u < 1 || u > 0xffffffffull)
            return perr(p, "dim=%s must be an integer in 1..4294967295 (values per row)", val);
        c->row_dim = (uint32_t)u;
        return GCOLL_OK;
    }
    if (sp == GCOLL_SPARSIFY_ROWS && !strcmp(key, "density")) {
        ONCE(have_density, key);
        return parse_density(p, val, &c->density);
    }
    if (sp == GCOLL_SPARSIFY_THRESHOLD && !strcmp(key, "tau")) {
        ONCE(have_tau, key);
        double t;
        /* tau is kept as a float: values that round to zero or a subnormal would not
         * parse back from the canonical spec (a fuzzer found tau=2E-223) */
        if (parse_double(val, &t) || !(t >= 1.1754944e-38) || t > 3.0e38)
            return perr(p, "tau=%s must be a positive finite number from 1.2e-38 to 3e38", val);
        c->tau = (float)t;
        return GCOLL_OK;
    }
    return perr(p, "unknown option '%s' for %s", key, name);
}

/* Splits "name:k=v,k=v" in place and feeds each pair to the right parser. */
static gcoll_status_t parse_segment(pctx_t *p, gcoll_compressor_t *c, seen_t *seen, char *seg,
                                    int is_quant)
{
    char *colon = strchr(seg, ':');
    char *opts = NULL;
    if (colon) {
        *colon = '\0';
        opts = colon + 1;
        if (*opts == '\0')
            return perr(p, "empty option list after '%s:'", seg);
    }
    const char *name = seg;
    if (*name == '\0')
        return perr(p, "empty codec name");
    if (is_quant) {
        if (!vfmt_by_name(name, &c->vs) || c->vs.fmt == GCOLL_VF_F32)
            return perr(p,
                        "'+%s' is not a value format (q8, qsgd, fp16, bf16, sign, fp8, mxfp8, "
                        "mxfp4)",
                        name);
    } else if (!strcmp(name, "topk")) {
        c->sparsify = GCOLL_SPARSIFY_TOPK;
    } else if (!strcmp(name, "randomk")) {
        c->sparsify = GCOLL_SPARSIFY_RANDOMK;
    } else if (!strcmp(name, "threshold")) {
        c->sparsify = GCOLL_SPARSIFY_THRESHOLD;
    } else if (!strcmp(name, "dgc")) {
        c->sparsify = GCOLL_SPARSIFY_DGC;
        c->select = GCOLL_SELECT_SAMPLE;
        c->momentum = 0.9f;
        c->sched = GCOLL_SCHED_EXP;
        c->density = 0.001;
    } else if (!strcmp(name, "rowsparse")) {
        c->sparsify = GCOLL_SPARSIFY_ROWS;
    } else if (!strcmp(name, "none")) {
        c->sparsify = GCOLL_SPARSIFY_NONE;
    } else if (!vfmt_by_name(name, &c->vs) || c->vs.fmt == GCOLL_VF_F32) {
        return perr(p,
                    "unknown codec '%s' (none, fp16, bf16, fp8, mxfp8, mxfp4, vq, q8, qsgd, sign, "
                    "topk, randomk, threshold, dgc, rowsparse)",
                    name);
    }
    int vkeys = is_quant || c->sparsify == GCOLL_SPARSIFY_NONE;
    for (char *tok = opts; tok;) {
        char *next = strchr(tok, ',');
        if (next)
            *next++ = '\0';
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok || eq[1] == '\0')
            return perr(p, "option '%s' of %s is not key=value", tok, name);
        *eq = '\0';
        const char *key = tok, *val = eq + 1;
        int g = parse_global(p, c, seen, key, val);
        if (g < 0)
            return GCOLL_ERR_INVALID;
        if (g == 0) {
            gcoll_status_t st = vkeys ? parse_vkey(p, c, seen, name, key, val)
                                      : parse_sparsifier_key(p, c, seen, name, key, val);
            if (st != GCOLL_OK)
                return st;
        }
        tok = next;
    }
    return GCOLL_OK;
}

/* Shortest decimal that reads back as the same double (or float). */
static const char *num(char *b, size_t len, double v, int is_float)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(b, len, "%.*g", prec, v);
        double back = strtod(b, NULL);
        if (is_float ? (float)back == (float)v : back == v)
            break;
    }
    char *e = strstr(b, "e+"); /* "9e+01" -> "9e01": '+' separates segments */
    if (e)
        memmove(e + 1, e + 2, strlen(e + 2) + 1);
    return b;
}

/* The '+' that separates segments: not one inside a number's exponent ("1e+3"). */
static char *find_plus(char *s)
{
    for (char *q = s; (q = strchr(q, '+')) != NULL; q++)
        if (!(q - s >= 2 && (q[-1] == 'e' || q[-1] == 'E') &&
              ((q[-2] >= '0' && q[-2] <= '9') || q[-2] == '.')))
            return q;
    return NULL;
}

void gcoll_spec_canon(gcoll_compressor_t *c)
{
    char n1[32], n2[32];
    char b[GCOLL_SPEC_MAX];
    int n = 0;
    const size_t cap = sizeof(b);
#define APP(...) n += snprintf(b + n, (size_t)n < cap ? cap - (size_t)n : 0, __VA_ARGS__)
    static const char *sel[] = {"exact", "sample", "reuse"};
    static const char *sch[] = {"none", "exp", "linear", "step"};
    static const char *rnd[] = {"nearest", "stochastic"};
    /* the warm-up keys, when the spec gave any (as given: a caller may supply the steps) */
    char warm[96] = "";
    if (c->warmup_given) {
        int bits = c->sparsify == GCOLL_SPARSIFY_NONE;
        int w = 0;
        if (c->warmup_steps || (c->warmup_given & GCOLL_WARMUP_STEPS_GIVEN))
            w = snprintf(warm, sizeof(warm), ",warmup_steps=%llu",
                         (unsigned long long)c->warmup_steps);
        if (bits)
            snprintf(warm + w, sizeof(warm) - (size_t)w, ",warmup_bits=%u,schedule=%s",
                     c->warmup_bits, sch[c->sched]);
        else
            snprintf(warm + w, sizeof(warm) - (size_t)w, ",warmup_start=%s,schedule=%s",
                     num(n2, sizeof(n2), c->warmup_start, 0), sch[c->sched]);
    }
    switch (c->sparsify) {
    case GCOLL_SPARSIFY_TOPK:
        if (c->k_fixed)
            APP("topk:k=%llu", (unsigned long long)c->k_fixed);
        else
            APP("topk:density=%s", num(n1, sizeof(n1), c->density, 0));
        APP(",select=%s", sel[c->select]);
        if (c->select == GCOLL_SELECT_REUSE)
            APP(",reuse_steps=%u", c->reuse_steps);
        APP("%s", warm);
        break;
    case GCOLL_SPARSIFY_RANDOMK:
        APP("randomk:density=%s,seed=%llu,unbiased=%d%s%s", num(n1, sizeof(n1), c->density, 0),
            (unsigned long long)c->seed, c->unbiased,
            c->ef ? (c->ef21 ? ",feedback=ef21" : ",feedback=ef") : "", warm);
        if (c->momentum > 0)
            APP(",momentum=%s", num(n2, sizeof(n2), c->momentum, 1));
        break;
    case GCOLL_SPARSIFY_THRESHOLD:
        APP("threshold:tau=%s", num(n1, sizeof(n1), c->tau, 1));
        break;
    case GCOLL_SPARSIFY_ROWS:
        APP("rowsparse:dim=%u", c->row_dim);
        if (c->density > 0)
            APP(",density=%s", num(n1, sizeof(n1), c->density, 0));
        break;
    case GCOLL_SPARSIFY_DGC:
        APP("dgc:density=%s,momentum=%s%s,select=%s", num(n1, sizeof(n1), c->density, 0),
            num(n2, sizeof(n2), c->momentum, 1), warm, sel[c->select]);
        if (c->select == GCOLL_SELECT_REUSE)
            APP(",reuse_steps=%u", c->reuse_steps);
        break;
    default:
        break;
    }
    const gcoll_vspec_t *vs = &c->vs;
    const char *sep = c->sparsify == GCOLL_SPARSIFY_NONE ? "" : "+";
    switch (vs->fmt) {
    case GCOLL_VF_F32:
        if (c->sparsify == GCOLL_SPARSIFY_NONE)
            APP("none");
        break;
    case GCOLL_VF_F16:
        APP("%sfp16%s", sep, vs->round ? ":round=stochastic" : "");
        break;
    case GCOLL_VF_BF16:
        APP("%sbf16%s", sep, vs->round ? ":round=stochastic" : "");
        break;
    case GCOLL_VF_FP8:
    case GCOLL_VF_MXFP8:
        APP("%s%s:format=%s,round=%s", sep, vs->fmt == GCOLL_VF_FP8 ? "fp8" : "mxfp8",
            vs->bits == GCOLL_FP8_E5M2 ? "e5m2" : "e4m3", rnd[vs->round]);
        break;
    case GCOLL_VF_MXFP4:
        APP("%smxfp4:round=%s", sep, rnd[vs->round]);
        break;
    case GCOLL_VF_VQ:
        APP("%svq:dim=%u,bits=%u", sep, vs->bucket, vs->bits);
        break;
    case GCOLL_VF_Q8:
        APP("%sq8:bucket=%u", sep, vs->bucket);
        break;
    case GCOLL_VF_QSGD:
        APP("%sqsgd:bits=%u,bucket=%u%s", sep, vs->bits, vs->bucket,
            c->sparsify == GCOLL_SPARSIFY_NONE ? warm : "");
        break;
    case GCOLL_VF_SIGN:
        APP("%ssign:scale=%s,chunk=%u", sep, vs->sign_l2 ? "l2" : "mean", vs->bucket);
        break;
    }
    const char *last = strrchr(b, '+');
    APP("%sef=%d", strchr(last ? last : b, ':') ? "," : ":", c->ef);
    if (c->clip > 0)
        APP(",clip=%s", num(n1, sizeof(n1), c->clip, 0));
    if (c->clip_value > 0)
        APP(",clip_value=%s", num(n1, sizeof(n1), c->clip_value, 0));
#undef APP
    snprintf(c->spec, sizeof(c->spec), "%s", b);
}

/* Random-k with error feedback below density 0.1, without momentum=: what is known to
 * diverge (docs/compressors.md, "Random-k with error feedback"). Classic feedback is in
 * expectation a heavy-ball momentum of 1-k/n (Mitliagkas et al. 2016 find the same in
 * asynchronous SGD): it trains at dense's step without the optimizer's momentum, but NaN
 * with 0.9 on top. EF21's estimate is ~n/k steps stale: it needs a step ~k/n times smaller
 * (Richtarik et al. 2021). Said once per process: specs are parsed often. */
static void randomk_warn_once(double density, int ef21)
{
    static int said;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        return;
    if (ef21)
        GCOLL_WARN("compressor: random-k at density %g with EF21 contracts by only k/n: at an SGD "
                   "step size that suits dense training it is known to diverge; it needs a step "
                   "size about k/n times smaller (docs/compressors.md, \"Random-k with error "
                   "feedback\")",
                   density);
    else
        GCOLL_WARN("compressor: random-k at density %g with error feedback is itself a momentum "
                   "of 1-k/n: under an optimizer's momentum it is known to diverge; hand the "
                   "momentum to the codec (momentum=M in the spec, SGD without momentum) or run "
                   "SGD without momentum at lr/(1-M) (docs/compressors.md, \"Random-k with error "
                   "feedback\")",
                   density);
}

gcoll_status_t gcoll_spec_parse(const char *spec, gcoll_compressor_t *c, char *errbuf,
                                size_t errlen)
{
    pctx_t p = {errbuf, errlen, spec ? spec : "(null)"};
    if (errbuf && errlen)
        errbuf[0] = '\0';
    if (spec == NULL || *spec == '\0')
        return perr(&p, "empty spec");
    if (strlen(spec) >= SEG_MAX * 2)
        return perr(&p, "spec longer than %d characters", SEG_MAX * 2 - 1);
    for (const char *q = spec; *q; q++)
        if (*q == ' ' || *q == '\t' || *q == '\n')
            return perr(&p, "white space at offset %d", (int)(q - spec));

    memset(c, 0, sizeof(*c));
    snprintf(c->given, sizeof(c->given), "%s", spec);
    c->vs.fmt = GCOLL_VF_F32;
    c->ef = 1;
    c->reuse_steps = 10;
    c->sched = GCOLL_SCHED_EXP;
    c->warmup_start = 1.0;
    c->warmup_bits = 8;
    seen_t seen;
    memset(&seen, 0, sizeof(seen));

    char buf[SEG_MAX * 2];
    snprintf(buf, sizeof(buf), "%s", spec);
    char *plus = find_plus(buf);
    if (plus) {
        *plus = '\0';
        if (find_plus(plus + 1))
            return perr(&p, "at most one '+' (sparsifier + value format)");
    }
    GCOLL_CHECK(parse_segment(&p, c, &seen, buf, 0));
    if (plus) {
        if (c->sparsify == GCOLL_SPARSIFY_NONE)
            return perr(&p,
                        "'+%s' needs a sparsifier before it (topk, randomk, threshold, dgc, "
                        "rowsparse)",
                        plus + 1);
        seen_t s2; /* value-format keys start afresh; clip/ef stay given-once */
        memset(&s2, 0, sizeof(s2));
        s2.have_clip = seen.have_clip;
        s2.have_ef = seen.have_ef;
        s2.have_clip_value = seen.have_clip_value;
        GCOLL_CHECK(parse_segment(&p, c, &s2, plus + 1, 1));
    }

    switch (c->sparsify) {
    case GCOLL_SPARSIFY_TOPK:
        if (seen.have_density == seen.have_k)
            return perr(&p, "topk needs exactly one of density=D or k=K");
        if (seen.have_reuse && c->select != GCOLL_SELECT_REUSE)
            return perr(&p, "reuse_steps only applies to select=reuse");
        if ((seen.have_warmup || seen.have_sched || seen.have_wstart) && seen.have_k)
            return perr(&p, "warm-up needs density=D, not k=K");
        break;
    case GCOLL_SPARSIFY_RANDOMK:
        if (!seen.have_density)
            return perr(&p, "randomk needs density=D");
        /* scaled by n/k random-k is unbiased with omega = n/k - 1, not a contraction:
         * with error feedback its residual grows without bound */
        if (c->ef && c->unbiased)
            return perr(&p, "randomk: unbiased=1 (values scaled by n/k) is not a contraction, "
                            "error feedback would diverge: use it with ef=0");
        if (!seen.have_unbiased)
            c->unbiased = !c->ef;
        if (!c->ef && seen.have_feedback)
            return perr(&p, "randomk: feedback= applies with error feedback (ef=1) only");
        if (c->momentum > 0 && (!c->ef || c->ef21))
            return perr(&p, "randomk: momentum= applies with classic error feedback only "
                            "(ef=1, feedback=ef)");
        if (c->ef && c->density < 0.1 && !(c->momentum > 0))
            randomk_warn_once(c->density, c->ef21);
        break;
    case GCOLL_SPARSIFY_ROWS:
        if (!seen.have_dim)
            return perr(&p, "rowsparse needs dim=D (values per row)");
        break;
    case GCOLL_SPARSIFY_THRESHOLD:
        if (!seen.have_tau)
            return perr(&p, "threshold needs tau=T");
        break;
    case GCOLL_SPARSIFY_DGC:
        if (!c->ef)
            return perr(&p, "dgc always accumulates what it did not send; ef=0 is not allowed");
        if (seen.have_reuse && c->select != GCOLL_SELECT_REUSE)
            return perr(&p, "reuse_steps only applies to select=reuse");
        break;
    default:
        break;
    }
    if (seen.have_wstart && c->warmup_start < c->density)
        return perr(&p, "warmup_start=%g is below density=%g: the warm-up starts denser",
                    c->warmup_start, c->density);
    if (seen.have_wbits && c->warmup_bits < c->vs.bits)
        return perr(&p, "warmup_bits=%u is below bits=%u: the warm-up starts wider", c->warmup_bits,
                    c->vs.bits);
    gcoll_spec_canon(c);
    return GCOLL_OK;
}
