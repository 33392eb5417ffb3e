/* plan.c: what a codec does at a step -- its density, bit width and k under the warm-up
 * schedule -- and the step plan that a call computes from them once (compress.h). */
#include <math.h>
#include <string.h>

#include "compress/compress.h"

/* Warm-up (Lin et al. 2018, sec. 3.4: DGC's sparsity 75%, 93.75%, 98.4375%, 99.6%, 99.9%
 * over the first epochs, each stage a quarter of the density before): from warmup_start
 * (1 = dense) to the target over warmup_steps. exp: four equal stages, geometric between
 * the two (0.25 to 0.001 gives the paper's stages within 1.3%); linear; step: warmup_start
 * until warmup_steps. Never sparser than the target. */
static double warm(gcoll_sched_t sched, double from, double to, uint64_t step, uint64_t steps)
{
    switch (sched) {
    case GCOLL_SCHED_EXP: {
        unsigned stage = (unsigned)((__uint128_t)step * 4 / steps);
        return from * pow(to / from, stage / 4.0);
    }
    case GCOLL_SCHED_LINEAR:
        return from + (to - from) * ((double)step / (double)steps);
    case GCOLL_SCHED_STEP:
        return from;
    default:
        return to;
    }
}

double gcoll_codec_density(const gcoll_compressor_t *c, uint64_t step)
{
    if (c->sparsify == GCOLL_SPARSIFY_NONE || c->sparsify == GCOLL_SPARSIFY_THRESHOLD ||
        c->sparsify == GCOLL_SPARSIFY_ROWS)
        return 1.0;
    double d = c->density;
    if (c->k_fixed || c->warmup_steps == 0 || step >= c->warmup_steps)
        return d;
    double w = warm(c->sched, c->warmup_start, d, step, c->warmup_steps);
    return w > d ? (w < 1.0 ? w : 1.0) : d;
}

unsigned gcoll_codec_bits(const gcoll_compressor_t *c, uint64_t step)
{
    unsigned b = c->vs.bits;
    if (c->vs.fmt != GCOLL_VF_QSGD || c->sparsify != GCOLL_SPARSIFY_NONE || c->warmup_steps == 0 ||
        step >= c->warmup_steps || c->warmup_bits <= b)
        return b;
    double w = warm(c->sched, c->warmup_bits, b, step, c->warmup_steps);
    unsigned r = (unsigned)(w + 0.5);
    return r < b ? b : r > c->warmup_bits ? c->warmup_bits : r;
}

int gcoll_codec_at_step(const gcoll_compressor_t *c, uint64_t step, gcoll_compressor_t *out)
{
    unsigned b = gcoll_codec_bits(c, step);
    if (b == c->vs.bits)
        return 0;
    *out = *c;
    out->vs.bits = b;
    gcoll_spec_canon(out);
    return 1;
}

size_t gcoll_codec_k_of(const gcoll_compressor_t *c, size_t n, double d)
{
    if (n == 0)
        return 0;
    if (c->k_fixed)
        return (size_t)GCOLL_MIN((uint64_t)n, c->k_fixed);
    double kf = gcoll_density_k(d, (double)n);
    return kf >= (double)n ? n : (size_t)kf;
}

/* gcoll_codec_k's computations in this process (gcoll_codec_k_computed) */
static uint64_t k_computed;

size_t gcoll_codec_k(const gcoll_compressor_t *c, size_t n, uint64_t step)
{
    __atomic_fetch_add(&k_computed, 1, __ATOMIC_RELAXED);
    return gcoll_codec_k_of(c, n, gcoll_codec_density(c, step));
}

uint64_t gcoll_codec_k_computed(void)
{
    return __atomic_load_n(&k_computed, __ATOMIC_RELAXED);
}

int gcoll_codec_layered(const gcoll_compressor_t *c, size_t off, size_t n)
{
    return c->nlayers > 1 && c->layer_end &&
           (c->sparsify == GCOLL_SPARSIFY_TOPK || c->sparsify == GCOLL_SPARSIFY_DGC) &&
           off + n <= c->layer_end[c->nlayers - 1];
}

size_t gcoll_codec_k_range(const gcoll_compressor_t *c, size_t off, size_t n, uint64_t step)
{
    if (!gcoll_codec_layered(c, off, n))
        return gcoll_codec_k(c, n, step);
    size_t k = 0, a, b;
    for (size_t j = 0; j < c->nlayers; j++)
        if (gcoll_codec_layer_part(c, j, off, n, &a, &b))
            k += gcoll_codec_k(c, b - a, step);
    return k;
}

/* --- the step plan ------------------------------------------------------------------- */

void gcoll_codec_plan(const gcoll_compressor_t *c, size_t count, uint64_t step,
                      gcoll_step_plan_t *p)
{
    memset(p, 0, sizeof(*p));
    p->count = count;
    p->step = step;
    p->scheme = -1;
    p->use_at = gcoll_codec_at_step(c, step, &p->at);
    const gcoll_compressor_t *at = gcoll_plan_codec(p, c);
    p->density = gcoll_codec_density(at, step);
    p->layered = gcoll_codec_layered(at, 0, count);
    p->k = gcoll_codec_k_range(at, 0, count, step);
    p->bound = gcoll_codec_bound(at, count);
}

size_t gcoll_codec_call_k(const gcoll_compressor_t *c, const gcoll_tensor_state_t *s,
                          const gcoll_encode_opts_t *opt, size_t off, size_t n, uint64_t step)
{
    const gcoll_step_plan_t *p = opt ? opt->plan : NULL;
    /* a server state's tensor is one chunk: the layers' offsets are not its own */
    int server = s && s->mode == GCOLL_STATE_SERVER;
    if (p && !server && off == 0 && n == p->count && step == p->step)
        return p->k;
    return !server && gcoll_codec_layered(c, off, n) ? gcoll_codec_k_range(c, off, n, step)
                                                     : gcoll_codec_k(c, n, step);
}

void gcoll_codec_set_density(gcoll_compressor_t *c, double d)
{
    if (c->density == d)
        return;
    c->density = d;
    gcoll_spec_canon(c);
}
