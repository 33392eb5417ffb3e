/* gcoll-model: fits an alpha-beta-gamma cost model of gcoll's allreduce algorithms to
 * gcoll-bench and gcoll-codec-bench measurements, checks it against measurements, and
 * predicts and tabulates times out to thousands of ranks (docs/scaling.md, "Cost model"). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: gcoll-model fit [options] MEASUREMENTS.csv...\n"
               "       gcoll-model check -p PARAMS [options] MEASUREMENTS.csv...\n"
               "       gcoll-model predict -p PARAMS -n RANKS (-s BYTES | -c COUNT) [options]\n"
               "       gcoll-model table -p PARAMS [options]\n"
               "fit: alpha (s per message), beta (s per byte), gamma (s per byte reduced), by\n"
               "  least squares on the relative error, to the rows of bench/model-measure.sh\n"
               "  (header link,ranks,algo,codec,bytes,time_us,...); writes the parameters\n"
               "  -o FILE          write the parameters to FILE (default: standard output)\n"
               "  -l LINK          fit the rows of this link only (default: every row)\n"
               "  -R LIST          fit these rank counts only, e.g. 2,4,8 (default: all)\n"
               "  -S MIN[:MAX]     fit these sizes only, in bytes (K, M, G suffixes)\n"
               "  --cores N        CPUs the measured ranks shared (default 0: one per rank); a\n"
               "                   rank's CPU costs are scaled by max(1, ranks on host / N)\n"
               "  --fastest        repeated runs of a case: the fastest, not the median\n"
               "  --load           count the row's load column (the 1-minute load average)\n"
               "                   as processes sharing the N CPUs, if more than the ranks\n"
               "  --wire-cpu       the link's bytes are CPU copies (default for LINK loopback)\n"
               "  --codec-bench F  gcoll-codec-bench output: each codec's per-element costs\n"
               "  --intra PARAMS   inside-host alpha and beta from another fit (default: this\n"
               "                   fit's for loopback, else 5 us and 5 GB/s)\n"
               "  --alpha-us A, --beta-ns B, --gamma-ns G, --kappa K\n"
               "                   fix that parameter, fit the others (kappa: codec time in a\n"
               "                   collective over gcoll-codec-bench's, fitted from codec rows)\n"
               "check: predicted against measured for every row (filters as fit), with errors\n"
               "  --md             a Markdown table instead of columns\n"
               "predict / table:\n"
               "  -p PARAMS        parameters written by fit\n"
               "  -n RANKS         ranks (predict)\n"
               "  -s BYTES | -c COUNT  dense size in bytes (K, M, G: 2^10...) or float32 count\n"
               "                   (table: comma-separated counts, default 25000000,340000000)\n"
               "  -a ALGO          ring, rhd, rd, tree, best (dense); allgather, split,\n"
               "                   streamed, oktopk (sparsifier); alltoall, qring (quantizer);\n"
               "                   compressed: the scheme gcoll picks (default best / compressed)\n"
               "  -z SPEC          codec (its costs must be in PARAMS)\n"
               "  --density D      a sparsifier's density instead of SPEC's\n"
               "  --ppn L          ranks per host: hierarchical when 1 < L < RANKS\n"
               "  --nics N         hierarchical: the host's rails share N links (default: one\n"
               "                   link per rank, as on rail-optimised nodes)\n"
               "  --link-gbit G    link of G Gbit/s (beta = 8/G ns per byte; table: a list)\n"
               "  --alpha-us A     per-message latency instead of the fitted one\n"
               "  --kappa K        codec time scale instead of the fitted one (1: codec alone)\n"
               "  --gamma-ns G     reduction cost instead of the fitted one\n"
               "  --cores N        CPUs per host shared by its ranks (default 0: one per rank)\n"
               "  --max-ranks P    table: largest rank count (default 4096; from 2 by doubling)\n"
               "  --md             table: Markdown\n");
}

/* ---- the subcommands ------------------------------------------------------------------ */

#include <getopt.h>

typedef struct {
    const char *out, *params, *codec_bench, *intra, *spec;
    model_filter_t flt;
    double cores, density, alpha_us, beta_ns, gamma_ns, kappa, bytes, count, max_ranks;
    int cores_set, wire_cpu, md, ranks, ppn, nics, algo;
    double gbit[16], counts[16];
    int ngbit, ncounts;
} opts_t;

/* A comma-separated list of numbers >= MIN; returns how many, or -1. */
static int parse_list(const char *s, double *v, int max, double min)
{
    char buf[256], *save = NULL;
    int n = 0;
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == max || model_parse_num(t, &v[n], min))
            return -1;
        n++;
    }
    return n ? n : -1;
}

/* Over 100 lines: one switch case per option, each a line or two; splitting it would only
 * scatter the table of options. */
static int parse_opts(int argc, char **argv, opts_t *o)
{
    static const struct option lo[] = {
        {"cores", 1, 0, 1},    {"wire-cpu", 0, 0, 2},   {"codec-bench", 1, 0, 3},
        {"intra", 1, 0, 4},    {"alpha-us", 1, 0, 5},   {"beta-ns", 1, 0, 6},
        {"gamma-ns", 1, 0, 7}, {"md", 0, 0, 8},         {"density", 1, 0, 9},
        {"ppn", 1, 0, 10},     {"link-gbit", 1, 0, 11}, {"max-ranks", 1, 0, 12},
        {"load", 0, 0, 14},    {"nics", 1, 0, 16},      {"fastest", 0, 0, 15},
        {"kappa", 1, 0, 13},   {"help", 0, 0, 'h'},     {0, 0, 0, 0}};
    memset(o, 0, sizeof(*o));
    o->flt.smax = 1e300;
    o->alpha_us = o->beta_ns = o->gamma_ns = o->kappa = -1;
    o->bytes = o->count = -1;
    o->algo = -1;
    o->max_ranks = 4096;
    int c;
    double v[64], smin;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:l:R:S:p:n:s:c:a:z:h", lo, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'o':
            o->out = optarg;
            break;
        case 'l':
            o->flt.link = optarg;
            break;
        case 'R': {
            int n = parse_list(optarg, v, 64, 1);
            bad = n < 0;
            for (int i = 0; i < n; i++)
                o->flt.ranks[i] = (int)v[i];
            o->flt.nranks = n > 0 ? n : 0;
            break;
        }
        case 'S': {
            char buf[64], *colon;
            snprintf(buf, sizeof(buf), "%s", optarg);
            if ((colon = strchr(buf, ':')))
                *colon = 0;
            bad = model_parse_bytes(buf, &smin) ||
                  (colon && model_parse_bytes(colon + 1, &o->flt.smax));
            o->flt.smin = smin;
            break;
        }
        case 'p':
            o->params = optarg;
            break;
        case 'n':
            bad = model_parse_num(optarg, &v[0], 1) || v[0] > 1 << 24 || v[0] != floor(v[0]);
            o->ranks = (int)v[0];
            break;
        case 's':
            bad = model_parse_bytes(optarg, &o->bytes);
            break;
        case 'c':
            o->ncounts = parse_list(optarg, o->counts, 16, 0);
            bad = o->ncounts < 0;
            o->count = o->counts[0];
            break;
        case 'a':
            o->algo = model_algo_parse(optarg);
            bad = o->algo == ALG_COUNT;
            break;
        case 'z':
            o->spec = optarg;
            break;
        case 1:
            bad = model_parse_num(optarg, &o->cores, 0);
            o->cores_set = 1;
            break;
        case 2:
            o->wire_cpu = 1;
            break;
        case 3:
            o->codec_bench = optarg;
            break;
        case 4:
            o->intra = optarg;
            break;
        case 5:
            bad = model_parse_num(optarg, &o->alpha_us, 0);
            break;
        case 6:
            bad = model_parse_num(optarg, &o->beta_ns, 0);
            break;
        case 7:
            bad = model_parse_num(optarg, &o->gamma_ns, 0);
            break;
        case 8:
            o->md = 1;
            break;
        case 9:
            bad = model_parse_num(optarg, &o->density, 1e-9) || o->density > 1;
            break;
        case 10:
            bad = model_parse_num(optarg, &v[0], 1) || v[0] != floor(v[0]);
            o->ppn = (int)v[0];
            break;
        case 11:
            o->ngbit = parse_list(optarg, o->gbit, 16, 1e-6);
            bad = o->ngbit < 0;
            break;
        case 12:
            bad = model_parse_num(optarg, &o->max_ranks, 2) || o->max_ranks > 1 << 24;
            break;
        case 13:
            bad = model_parse_num(optarg, &o->kappa, 0);
            break;
        case 14:
            o->flt.use_load = 1;
            break;
        case 15:
            o->flt.use_min = 1;
            break;
        case 16:
            bad = model_parse_num(optarg, &v[0], 1) || v[0] != floor(v[0]) || v[0] > 1 << 20;
            o->nics = (int)v[0];
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            return model_die("bad option (see gcoll-model --help)%s%s", "", "");
        }
        if (bad) {
            char name[32] = {'-', (char)c, 0};
            for (int i = 0; lo[i].name; i++)
                if (lo[i].val == c)
                    snprintf(name, sizeof(name), "--%s", lo[i].name);
            return model_die("bad value %s for %s", optarg, name);
        }
    }
    return 0;
}

static int cmd_fit(opts_t *o, int nfiles, char **files)
{
    model_t m;
    memset(&m, 0, sizeof(m));
    m.cores = o->cores;
    m.ialpha = 5e-6; /* a shared-memory step and copy, as lib/hier/hier.c assumes */
    m.ibeta = 1.0 / 5e9;
    if (nfiles < 1)
        return model_die("fit: no measurement files%s%s", "", "");
    if (o->codec_bench && model_codec_bench_read(&m, o->codec_bench))
        return 2;
    if (o->intra) {
        model_t im;
        if (model_params_read(&im, o->intra))
            return 2;
        m.ialpha = im.alpha;
        m.ibeta = im.beta;
    }
    model_obs_set_t set;
    memset(&set, 0, sizeof(set));
    for (int i = 0; i < nfiles; i++)
        if (model_meas_read(&m, files[i], &o->flt, &set)) {
            free(set.obs);
            return 2;
        }
    model_obs_median(&set, NULL, o->flt.use_min);
    snprintf(m.link, sizeof(m.link), "%s", o->flt.link ? o->flt.link : set.link);
    m.wire_cpu = o->wire_cpu || !strcmp(m.link, "loopback");
    unsigned fixed = 0;
    if (o->alpha_us >= 0)
        m.alpha = o->alpha_us * 1e-6, fixed |= 1;
    if (o->beta_ns >= 0)
        m.beta = o->beta_ns * 1e-9, fixed |= 2;
    if (o->gamma_ns >= 0)
        m.gamma = o->gamma_ns * 1e-9, fixed |= 4;
    if (o->kappa >= 0)
        m.kappa = o->kappa, fixed |= 8;
    else if (!m.ncodec) /* no codec rows: nothing determines it */
        m.kappa = 1, fixed |= 8;
    char why[256];
    int rc = model_fit(&m, set.obs, set.n, fixed, why, sizeof(why));
    free(set.obs);
    if (rc)
        return model_die("fit: %s%s", why, "");
    if (m.wire_cpu && !o->intra) {
        m.ialpha = m.alpha;
        m.ibeta = m.beta;
    }
    fprintf(stderr,
            "gcoll-model: %s, %d rows: alpha %.2f us, beta %.4f ns/B (%.3f GB/s), gamma %.4f "
            "ns/B, kappa %.2f, rms relative error %.1f%%\n",
            m.link, m.nfit, m.alpha * 1e6, m.beta * 1e9, m.beta > 0 ? 1e-9 / m.beta : 0,
            m.gamma * 1e9, m.kappa, 100 * m.rms);
    return model_params_write(&m, o->out);
}

static int cmd_check(opts_t *o, int nfiles, char **files)
{
    model_t m;
    if (!o->params)
        return model_die("check: -p PARAMS is required%s%s", "", "");
    if (model_params_read(&m, o->params))
        return 2;
    if (o->cores_set)
        m.cores = o->cores;
    model_obs_set_t set;
    memset(&set, 0, sizeof(set));
    for (int i = 0; i < nfiles; i++)
        if (model_meas_read(&m, files[i], &o->flt, &set)) {
            free(set.obs);
            return 2;
        }
    int *runs = set.n ? calloc((size_t)set.n, sizeof(int)) : NULL;
    if (nfiles < 1 || set.n == 0 || !runs) {
        free(set.obs);
        free(runs);
        return model_die("check: no measurements%s%s", "", "");
    }
    model_obs_median(&set, runs, o->flt.use_min);
    if (o->md)
        printf("| ranks | algorithm | codec | size (B) | runs | measured (us) | predicted (us) "
               "| error |\n| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    else
        printf("%5s %-10s %-20s %12s %4s %14s %14s %8s\n", "ranks", "algo", "codec", "bytes",
               "runs", "measured_us", "predicted_us", "error");
    double sum = 0, worst = 0;
    int within = 0;
    for (int i = 0; i < set.n; i++) {
        const model_obs_t *x = &set.obs[i];
        double t = model_predict(&m, &x->q, NULL, 0), e = (t - x->time) / x->time;
        char algo[48];
        snprintf(algo, sizeof(algo), "%s", model_algo_names[model_resolve(&m, &x->q)]);
        if (x->q.ppn > 1 && x->q.ppn < x->q.ranks) /* hierarchical: L ranks per host */
            snprintf(algo + strlen(algo), sizeof(algo) - strlen(algo), "/hier%d", x->q.ppn);
        const char *codec = x->q.codec ? x->q.codec->spec : "none";
        if (o->md)
            printf("| %d | %s | %s | %.0f | %d | %.1f | %.1f | %+.0f%% |\n", x->q.ranks, algo,
                   codec, x->q.bytes, runs[i], x->time * 1e6, t * 1e6, 100 * e);
        else
            printf("%5d %-10s %-20s %12.0f %4d %14.1f %14.1f %+7.1f%%\n", x->q.ranks, algo, codec,
                   x->q.bytes, runs[i], x->time * 1e6, t * 1e6, 100 * e);
        sum += fabs(e);
        worst = fabs(e) > worst ? fabs(e) : worst;
        within += fabs(e) <= 0.15;
    }
    printf("# %d rows: mean |error| %.1f%%, worst %.1f%%, %d within 15%%\n", set.n,
           100 * sum / set.n, 100 * worst, within);
    free(set.obs);
    free(runs);
    return 0;
}

/* M with the link of the options (--link-gbit G, --alpha-us A) instead of the fitted one. */
static void relink(model_t *m, const opts_t *o, double gbit)
{
    if (gbit > 0) {
        m->beta = 8e-9 / gbit;
        m->wire_cpu = 0;
    }
    if (o->alpha_us >= 0)
        m->alpha = o->alpha_us * 1e-6;
    if (o->kappa >= 0)
        m->kappa = o->kappa;
    if (o->gamma_ns >= 0)
        m->gamma = o->gamma_ns * 1e-9;
}

static int cmd_predict(opts_t *o)
{
    model_t m;
    if (!o->params || o->ranks < 1 || (o->bytes < 0 && o->count < 0))
        return model_die("predict: -p PARAMS, -n RANKS and -s BYTES or -c COUNT are required%s%s",
                         "", "");
    if (model_params_read(&m, o->params))
        return 2;
    relink(&m, o, o->ngbit ? o->gbit[0] : 0);
    model_query_t q;
    memset(&q, 0, sizeof(q));
    q.ranks = o->ranks;
    q.bytes = o->bytes >= 0 ? o->bytes : 4 * o->count;
    q.density = o->density;
    q.ppn = o->ppn;
    q.nics = o->nics;
    q.cores = o->cores;
    if (o->spec && !(q.codec = model_codec_find(&m, o->spec)))
        return model_die("predict: codec %s has no costs in %s", o->spec, o->params);
    for (int a = 0; a < ALG_COUNT; a++) {
        if (o->algo >= 0 ? a != o->algo : (a == ALG_BEST || a == ALG_COMPRESSED))
            continue;
        q.algo = (model_algo_t)a;
        if (o->algo < 0 && !model_algo_valid(q.algo, q.codec))
            continue;
        char why[256];
        double t = model_predict(&m, &q, why, sizeof(why));
        if (t < 0)
            return model_die("predict: %s%s", why, "");
        printf("%-10s %-20s ranks %d ppn %d bytes %.0f: %.6g s (%s)\n", model_algo_names[a],
               q.codec ? q.codec->spec : "none", q.ranks, q.ppn, q.bytes, t,
               model_algo_names[model_resolve(&m, &q)]);
    }
    return 0;
}

/* The columns of the projection: dense flat, sparse flat, quantized, hierarchical. */
typedef struct {
    const char *name;
    model_algo_t algo;
    int sparse, quant, hier;
} col_t;

static int cmd_table(opts_t *o)
{
    model_t m;
    if (!o->params)
        return model_die("table: -p PARAMS is required%s%s", "", "");
    if (model_params_read(&m, o->params))
        return 2;
    const model_codec_t *sp = NULL, *qz = NULL;
    for (int i = m.ncodec - 1; i >= 0; i--)
        *(m.codec[i].density > 0 ? &sp : &qz) = &m.codec[i];
    if (o->spec && !(sp = qz = model_codec_find(&m, o->spec)))
        return model_die("table: codec %s has no costs in %s", o->spec, o->params);
    static const col_t cols[] = {
        {"ring", ALG_RING, 0, 0, 0},           {"rhd", ALG_RHD, 0, 0, 0},
        {"tree", ALG_TREE, 0, 0, 0},           {"topk ag", ALG_ALLGATHER, 1, 0, 0},
        {"topk split", ALG_SPLIT, 1, 0, 0},    {"topk oktopk", ALG_OKTOPK, 1, 0, 0},
        {"q8", ALG_COMPRESSED, 0, 1, 0},       {"hier ring", ALG_RING, 0, 0, 1},
        {"hier topk", ALG_COMPRESSED, 1, 0, 1}};
    int ncol = (int)(sizeof(cols) / sizeof(cols[0]));
    double dflt_counts[2] = {25e6, 340e6}, dflt_gbit[1] = {0};
    double *counts = o->ncounts ? o->counts : dflt_counts, *gbits = o->ngbit ? o->gbit : dflt_gbit;
    int ncounts = o->ncounts ? o->ncounts : 2, ngbit = o->ngbit ? o->ngbit : 1;
    int ppn = o->ppn ? o->ppn : 8;
    for (int g = 0; g < ngbit; g++)
        for (int ci = 0; ci < ncounts; ci++) {
            model_t lm = m;
            relink(&lm, o, gbits[g]);
            printf("\n%s %.0f floats (%.0f MB), link %s%g Gbit/s, alpha %.1f us, kappa %.2f; "
                   "topk: %s, q8: %s; hierarchical: %d ranks per host; time per allreduce in s\n",
                   o->md ? "####" : "#", counts[ci], counts[ci] * 4e-6, gbits[g] ? "" : "fitted ",
                   lm.beta > 0 ? 8e-9 / lm.beta : 0, lm.alpha * 1e6, lm.kappa,
                   sp ? sp->spec : "none", qz ? qz->spec : "none", ppn);
            printf(o->md ? "| ranks |" : "%6s", o->md ? "" : "#ranks");
            for (int c = 0; c < ncol; c++)
                printf(o->md ? " %s |" : " %11s", cols[c].name);
            printf(o->md ? " winner |\n|---:|" : " %11s\n", "winner");
            if (o->md) {
                for (int c = 0; c <= ncol; c++)
                    printf(c < ncol ? "---:|" : "---|\n");
            }
            for (double P = 2; P <= o->max_ranks; P *= 2) {
                printf(o->md ? "| %.0f |" : "%6.0f", P);
                double best = 1e300;
                int bc = -1;
                for (int c = 0; c < ncol; c++) {
                    model_query_t q;
                    memset(&q, 0, sizeof(q));
                    q.ranks = (int)P;
                    q.bytes = 4 * counts[ci];
                    q.algo = cols[c].algo;
                    q.codec = cols[c].sparse ? sp : cols[c].quant ? qz : NULL;
                    q.density = cols[c].sparse ? o->density : 0;
                    q.ppn = cols[c].hier ? ppn : 0;
                    q.nics = o->nics;
                    q.cores = o->cores;
                    double t = (cols[c].sparse || cols[c].quant) && !q.codec
                                   ? -1
                                   : model_predict(&lm, &q, NULL, 0);
                    if (t < 0) {
                        printf(o->md ? " - |" : " %11s", "-");
                        continue;
                    }
                    if (t < best)
                        best = t, bc = c;
                    printf(o->md ? " %.3g |" : " %11.4g", t);
                }
                printf(o->md ? " %s |\n" : " %11s\n", bc >= 0 ? cols[bc].name : "-");
            }
        }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    opts_t o;
    int rc = parse_opts(argc - 1, argv + 1, &o);
    if (rc)
        return rc;
    int nfiles = argc - 1 - optind;
    char **files = argv + 1 + optind;
    if (!strcmp(cmd, "fit"))
        return cmd_fit(&o, nfiles, files);
    if (!strcmp(cmd, "check"))
        return cmd_check(&o, nfiles, files);
    if (nfiles > 0)
        return model_die("%s takes no file arguments (%s)", cmd, files[0]);
    if (!strcmp(cmd, "predict"))
        return cmd_predict(&o);
    if (!strcmp(cmd, "table"))
        return cmd_table(&o);
    return model_die("unknown command %s (fit, check, predict or table; see gcoll-model --help)%s",
                     cmd, "");
}
