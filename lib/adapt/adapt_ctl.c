/* adapt_ctl.c: the adaptation controller any gcoll_compressed_allreduce caller can attach
 * to a tensor state (gcoll_adapt_*), and the codec edits it shares with the bucketer
 * (density, bit width). After each call the ranks agree on its measurements in one small
 * allreduce and run the same rules on them: every rank decides alike. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adapt/adapt.h"
#include "adapt/adapt_stat.h"
#include "collectives/coll.h"
#include "core/comm.h"
#include "core/ops.h"
#include "compress/compress.h"
#include "base/util.h"

/* Values per rank in the agreement: the sampled gradient values, then bytes sent, wire
 * time and the compute window before the call (the last two negated: MAX gives the
 * shortest). */
#define AGREE_W (GCOLL_SNR_SAMPLE + 3)
#define ADAPT_SUB 0xf1000000u /* message tags apart from the call's own and the bucketer's */

struct gcoll_adapt {
    gcoll_comm_t *comm;
    unsigned rules;
    gcoll_tensor_state_t *s;
    const gcoll_compressor_t *orig; /* the state's own compressor */
    gcoll_compressor_t *mine;       /* the copy it encodes with while attached */
    gcoll_adapt_sig_t sig;
    gcoll_phase_t phase;
    double boost;
    gcoll_bw_est_t bw;
    gcoll_density_ctl_t ctl;
    double sample[GCOLL_SNR_SAMPLE];
    size_t m;
    uint64_t sent0, wire0;
    double t_begin, t_end_prev; /* this call's start, the last call's end (s) */
    long steps;
    /* gcoll_adapt_join: a ring of the controllers that share one budget (itself when
     * alone); need is the density the other rules chose at the last decision and count
     * the state's size then, so a member's split can read the others' */
    gcoll_adapt_t *next;
    double need;
    size_t count;
};

int gcoll_adapt_is_quant(const gcoll_compressor_t *c)
{
    return c->sparsify == GCOLL_SPARSIFY_NONE &&
           (c->vs.fmt == GCOLL_VF_QSGD || c->vs.fmt == GCOLL_VF_Q8);
}

int gcoll_adapt_has_density(const gcoll_compressor_t *c)
{
    return c->density > 0 && c->k_fixed == 0 &&
           (c->sparsify == GCOLL_SPARSIFY_TOPK || c->sparsify == GCOLL_SPARSIFY_RANDOMK ||
            c->sparsify == GCOLL_SPARSIFY_DGC);
}

unsigned gcoll_adapt_bits_of(const gcoll_compressor_t *c)
{
    return c->vs.fmt == GCOLL_VF_Q8 ? 8 : c->vs.fmt == GCOLL_VF_QSGD ? c->vs.bits : 0;
}

void gcoll_adapt_set_bits(gcoll_compressor_t *c, unsigned bits, int orig_q8)
{
    /* q8 is the 8-bit width; narrower widths of a q8 codec are QSGD's levels */
    if (bits >= 8 && orig_q8) {
        c->vs.fmt = GCOLL_VF_Q8;
        c->vs.bits = 8;
    } else {
        c->vs.fmt = GCOLL_VF_QSGD;
        c->vs.bits = bits;
    }
    c->warmup_steps = 0; /* the controller's width replaces a bit-width warm-up */
    gcoll_spec_canon(c);
}

GCOLL_EXPORT gcoll_status_t gcoll_adapt_parse(const char *rules, unsigned *mask_p)
{
    if (!rules || !mask_p)
        return GCOLL_ERR_INVALID;
    return gcoll_adapt_rules_parse(rules, mask_p) == 0 ? GCOLL_OK : GCOLL_ERR_INVALID;
}

GCOLL_EXPORT gcoll_status_t gcoll_adapt_create(gcoll_comm_t *comm, const char *rules,
                                               gcoll_adapt_t **a_p)
{
    if (!comm || !a_p)
        return GCOLL_ERR_INVALID;
    unsigned mask = (unsigned)comm->cfg.adapt;
    if (rules)
        GCOLL_CHECK(gcoll_comm_check_args(comm, "gcoll_adapt_create",
                                          gcoll_adapt_rules_parse(rules, &mask) == 0,
                                          "rules '%s': expected off, both, or rules joined by "
                                          "'+' from bandwidth, phase, snr, stage, budget",
                                          rules));
    gcoll_adapt_t *a = calloc(1, sizeof(*a));
    if (!a)
        return GCOLL_ERR_NOMEM;
    a->comm = comm;
    a->rules = mask;
    a->next = a;
    *a_p = a;
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_adapt_join(gcoll_adapt_t *a, gcoll_adapt_t *with)
{
    if (!a || !with)
        return GCOLL_ERR_INVALID;
    const char *what = "gcoll_adapt_join";
    gcoll_comm_t *comm = a->comm;
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, a != with && a->next == a,
                                      "the controller already shares a budget"));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, with->comm == comm,
                                      "the controllers are on different communicators"));
    GCOLL_CHECK(gcoll_comm_check_args(
        comm, what, (a->rules & GCOLL_AR_BUDGET) && (with->rules & GCOLL_AR_BUDGET),
        "both controllers need the budget rule"));
    GCOLL_CHECK(gcoll_comm_check_args(
        comm, what,
        a->mine && with->mine && !gcoll_adapt_is_quant(a->mine) &&
            !gcoll_adapt_is_quant(with->mine),
        "both controllers must be attached to states whose codec has a density"));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, a->steps == 0 && with->steps == 0,
                                      "join before the first call on either state"));
    a->next = with->next;
    with->next = a;
    return GCOLL_OK;
}

/* The density this controller takes from its group's budget: the split of the members'
 * total k (each at the density the other rules chose for it) by their energies, as the
 * bucketer splits over its buckets, over the members that decided at least once. */
static double budget_share(gcoll_adapt_t *a, double d)
{
    a->need = d;
    int len = 1;
    for (gcoll_adapt_t *m = a->next; m != a; m = m->next)
        len++;
    size_t *cnt = malloc((size_t)len * sizeof(size_t));
    double *buf = malloc((size_t)len * 2 * sizeof(double));
    if (!cnt || !buf) {
        free(cnt);
        free(buf);
        return d; /* the other rules' density stands */
    }
    double *energy = buf, *dens = buf + len;
    int n = 0; /* this controller first, then the members that decided at least once */
    gcoll_adapt_t *m = a;
    do {
        if (m == a || m->steps > 0) {
            cnt[n] = m->count;
            energy[n] = gcoll_sig_energy(&m->sig);
            dens[n++] = m->need;
        }
        m = m->next;
    } while (m != a);
    gcoll_adapt_budget(n, cnt, energy, a->sig.dmin, a->sig.dmax, dens);
    double out = dens[0];
    free(cnt);
    free(buf);
    return out;
}

GCOLL_EXPORT gcoll_status_t gcoll_adapt_attach(gcoll_adapt_t *a, gcoll_tensor_state_t *s)
{
    if (!a || !s)
        return GCOLL_ERR_INVALID;
    const char *what = "gcoll_adapt_attach";
    gcoll_comm_t *comm = a->comm;
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, !a->s, "the controller is already attached"));
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, !s->adapt, "the state has a controller"));
    GCOLL_CHECK(
        gcoll_comm_check_args(comm, what, s->mode == GCOLL_STATE_WORKER, "not a worker state"));
    int quant = gcoll_adapt_is_quant(s->c);
    GCOLL_CHECK(gcoll_comm_check_args(comm, what, quant || gcoll_adapt_has_density(s->c),
                                      "codec '%s' has no density or bit width to adapt",
                                      s->c->spec));
    gcoll_compressor_t *c = malloc(sizeof(*c));
    if (!c)
        return GCOLL_ERR_NOMEM;
    *c = *s->c;
    const gcoll_config_t *cf = &comm->cfg;
    gcoll_sig_init(&a->sig, a->rules, cf->density_min, cf->density_max, quant ? 0 : c->density,
                   quant ? gcoll_adapt_bits_of(c) : 0, (double)cf->adapt_stat_half_life);
    gcoll_phase_init(&a->phase, 0.5, 2);
    gcoll_bw_init(&a->bw, (double)cf->adapt_half_life);
    gcoll_ctl_init(&a->ctl, cf->density_min, cf->density_max, quant ? 1 : c->density);
    a->orig = s->c;
    a->mine = c;
    a->s = s;
    s->c = c;
    if (s->server)
        s->server->c = c;
    s->adapt = a;
    return GCOLL_OK;
}

GCOLL_EXPORT gcoll_status_t gcoll_adapt_stats(const gcoll_adapt_t *a, gcoll_adapt_stats_t *out)
{
    if (!a || !out)
        return GCOLL_ERR_INVALID;
    int P = a->comm->size;
    memset(out, 0, sizeof(*out));
    out->steps = a->steps;
    out->noise_scale = gcoll_snr_noise_scale(&a->sig.snr);
    out->grad_sq = gcoll_snr_g2(&a->sig.snr);
    out->noise_sq = gcoll_snr_s(&a->sig.snr);
    out->noise_share = gcoll_snr_noise_share(&a->sig.snr, P);
    out->stage = a->sig.stage.stage;
    out->phase_boost = a->boost;
    out->bandwidth = a->bw.bw;
    out->density = a->mine ? (gcoll_adapt_has_density(a->mine) ? a->mine->density : 1) : 0;
    out->bits = a->mine ? gcoll_adapt_bits_of(a->mine) : 0;
    return GCOLL_OK;
}

GCOLL_EXPORT void gcoll_adapt_destroy(gcoll_adapt_t *a)
{
    if (!a)
        return;
    gcoll_adapt_t *prev = a;
    while (prev->next != a)
        prev = prev->next;
    prev->next = a->next; /* leave the group */
    if (a->s) {
        a->s->c = a->orig;
        if (a->s->server)
            a->s->server->c = a->orig;
        a->s->adapt = NULL;
    }
    free(a->mine);
    free(a);
}

void gcoll_adapt_before(gcoll_comm_t *comm, gcoll_tensor_state_t *s, const float *grad,
                        size_t count)
{
    gcoll_adapt_t *a = s->adapt;
    size_t idx[GCOLL_SNR_SAMPLE];
    a->m = gcoll_snr_sample_idx(count, s->step, count, idx);
    for (size_t i = 0; i < a->m; i++)
        a->sample[i] = grad[idx[i]];
    if (s->server)
        s->server->c = a->mine;
    a->sent0 = comm->chan.counters.bytes_sent;
    a->wire0 = comm->chan.counters.ns_wire;
    a->t_begin = (double)gcoll_time_ns() * 1e-9;
}

/* The decision from the agreed numbers: the same function of the same inputs everywhere. */
static void decide(gcoll_adapt_t *a, int P, double bytes, double wire, double window,
                   double local_sq, double global_sq)
{
    gcoll_compressor_t *c = a->mine;
    gcoll_sig_update(&a->sig, P, local_sq, global_sq);
    int critical = 0;
    if (a->rules & GCOLL_AR_PHASE) {
        critical = gcoll_phase_update(&a->phase, sqrt(global_sq));
        a->boost = gcoll_phase_boost(a->boost, critical);
    }
    int bwr = (a->rules & GCOLL_AR_BANDWIDTH) && a->steps > 0; /* the first: connections */
    if (bwr)
        gcoll_bw_update(&a->bw, bytes, wire);
    if (gcoll_adapt_is_quant(c)) {
        unsigned now = gcoll_adapt_bits_of(c);
        double need = gcoll_sig_need_bits(&a->sig, P);
        need = gcoll_adapt_combine(0, need, 8, a->boost);
        unsigned b = gcoll_pick_bits(need, bwr && a->bw.bw > 0 ? bytes / a->bw.bw : 0, now,
                                     bwr ? window : 0);
        if (b != now)
            gcoll_adapt_set_bits(c, b, a->orig->vs.fmt == GCOLL_VF_Q8);
        GCOLL_DEBUG(GCOLL_SUBSYS_ADAPT,
                    "controller step %ld: noise share %.3f stage %.3f "
                    "boost %.2f window %.2f ms wire %.2f ms: bits %u -> %u",
                    a->steps, gcoll_snr_noise_share(&a->sig.snr, P), a->sig.stage.stage, a->boost,
                    window * 1e3, wire * 1e3, now, b);
        return;
    }
    double need = gcoll_sig_need_density(&a->sig, P), cap = 0;
    if (bwr && a->bw.bw > 0 && bytes > 0) {
        double full = bytes / c->density;
        a->ctl.density = c->density;
        cap = gcoll_ctl_step(&a->ctl, window, 0, a->bw.bw, full, 0);
    }
    double d = gcoll_adapt_combine(cap, need, a->sig.dmax, a->boost);
    if ((a->rules & GCOLL_AR_BUDGET) && a->next != a)
        d = budget_share(a, d);
    GCOLL_DEBUG(GCOLL_SUBSYS_ADAPT,
                "controller step %ld: noise share %.3f stage %.3f boost "
                "%.2f critical %d; bandwidth %.1f MB/s cap %g need %g: density %g -> %g",
                a->steps, gcoll_snr_noise_share(&a->sig.snr, P), a->sig.stage.stage, a->boost,
                critical, a->bw.bw / 1e6, cap, need, c->density, d);
    gcoll_codec_set_density(c, d);
}

gcoll_status_t gcoll_adapt_after(gcoll_comm_t *comm, gcoll_tensor_state_t *s, size_t count)
{
    gcoll_adapt_t *a = s->adapt;
    const int P = comm->size, r = comm->rank;
    double *v = malloc((size_t)P * AGREE_W * sizeof(double));
    if (!v)
        return GCOLL_ERR_NOMEM;
    /* each rank's own row, -inf elsewhere: MAX gives every row exactly (an allgather in
     * the shape of the reduction every transport has) */
    for (size_t i = 0; i < (size_t)P * AGREE_W; i++)
        v[i] = -HUGE_VAL;
    double *row = v + (size_t)r * AGREE_W;
    for (size_t i = 0; i < GCOLL_SNR_SAMPLE; i++)
        row[i] = i < a->m ? a->sample[i] : 0;
    row[GCOLL_SNR_SAMPLE] = (double)(comm->chan.counters.bytes_sent - a->sent0);
    row[GCOLL_SNR_SAMPLE + 1] = -(double)(comm->chan.counters.ns_wire - a->wire0) * 1e-9;
    row[GCOLL_SNR_SAMPLE + 2] = a->t_end_prev > 0 ? -(a->t_begin - a->t_end_prev) : 0;
    uint32_t sig =
        gcoll_call_sig(GCOLL_KIND_ALLREDUCE, (size_t)P * AGREE_W, GCOLL_FLOAT64, GCOLL_MAX, 0);
    gcoll_status_t st = gcoll_ring_allreduce_at(comm, v, (size_t)P * AGREE_W, GCOLL_FLOAT64,
                                                GCOLL_MAX, sig, ADAPT_SUB);
    if (st == GCOLL_OK) {
        double bytes = 0, wire = 1e300, window = 1e300;
        for (int q = 0; q < P; q++) {
            const double *x = v + (size_t)q * AGREE_W;
            bytes = fmax(bytes, x[GCOLL_SNR_SAMPLE]);
            wire = fmin(wire, -x[GCOLL_SNR_SAMPLE + 1]);
            window = fmin(window, -x[GCOLL_SNR_SAMPLE + 2]);
        }
        double loc = 0, glob = 0;
        if (a->m)
            gcoll_snr_from_samples(P, a->m, AGREE_W, v, (double)count / (double)a->m, &loc, &glob);
        a->count = count;
        decide(a, P, bytes, wire, window, loc, glob);
        a->steps++;
    }
    free(v);
    a->t_end_prev = (double)gcoll_time_ns() * 1e-9;
    return st;
}
