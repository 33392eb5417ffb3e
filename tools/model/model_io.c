/* model_io.c: gcoll-model's files: the parameters, gcoll-codec-bench's output and the
 * measurements of bench/model-measure.sh, each line checked. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

int model_die(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "gcoll-model: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return 2;
}

/* A size in bytes with an optional K, M or G (powers of 1024) suffix. */
int model_parse_bytes(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0) || !(v < 1e18))
        return -1;
    if (*end == 'K' || *end == 'k')
        v *= 1024, end++;
    else if (*end == 'M' || *end == 'm')
        v *= 1048576, end++;
    else if (*end == 'G' || *end == 'g')
        v *= 1073741824.0, end++;
    if (*end)
        return -1;
    *out = v;
    return 0;
}

int model_parse_num(const char *s, double *out, double min)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= min) || !(v < 1e18))
        return -1;
    *out = v;
    return 0;
}

/* ---- parameters file: "key value" lines, "codec SPEC ratio density enc dec acc acc_nz" */

int model_params_write(const model_t *m, const char *path)
{
    FILE *f = path ? fopen(path, "w") : stdout;
    if (!f)
        return model_die("cannot write %s: %s", path, strerror(errno));
    fprintf(f, "# gcoll-model parameters (gcoll-model fit); times in s, sizes in bytes\n");
    fprintf(f, "link %s\ncores %g\nwire_cpu %d\n", m->link, m->cores, m->wire_cpu);
    fprintf(f, "alpha %.6e\nbeta %.6e\ngamma %.6e\nkappa %.4f\n", m->alpha, m->beta, m->gamma,
            m->kappa);
    fprintf(f, "intra_alpha %.6e\nintra_beta %.6e\n", m->ialpha, m->ibeta);
    fprintf(f, "fitted %d\nrms_rel_err %.4f\n", m->nfit, m->rms);
    fprintf(f, "# codec spec ratio density enc dec acc acc_nz (s per element or nonzero)\n");
    for (int i = 0; i < m->ncodec; i++) {
        const model_codec_t *c = &m->codec[i];
        fprintf(f, "codec %s %.6g %.6g %.6e %.6e %.6e %.6e\n", c->spec, c->ratio, c->density,
                c->enc, c->dec, c->acc, c->acc_nz);
    }
    if (path && fclose(f) != 0)
        return model_die("cannot write %s: %s", path, strerror(errno));
    return 0;
}

int model_params_read(model_t *m, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return model_die("cannot open parameters %s: %s", path, strerror(errno));
    memset(m, 0, sizeof(*m));
    char line[512], key[64];
    int ln = 0, seen = 0;
    while (fgets(line, sizeof(line), f)) {
        ln++;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        double v;
        model_codec_t c;
        memset(&c, 0, sizeof(c));
        if (sscanf(line, "codec %63s %lf %lf %lf %lf %lf %lf", c.spec, &c.ratio, &c.density, &c.enc,
                   &c.dec, &c.acc, &c.acc_nz) == 7 &&
            m->ncodec < MODEL_MAX_CODECS) {
            m->codec[m->ncodec++] = c;
        } else if (sscanf(line, "link %31s", m->link) == 1) {
        } else if (sscanf(line, "%63s %lf", key, &v) == 2 && isfinite(v) && v >= 0) {
            if (!strcmp(key, "alpha"))
                m->alpha = v, seen |= 1;
            else if (!strcmp(key, "beta"))
                m->beta = v, seen |= 2;
            else if (!strcmp(key, "gamma"))
                m->gamma = v, seen |= 4;
            else if (!strcmp(key, "kappa"))
                m->kappa = v;
            else if (!strcmp(key, "intra_alpha"))
                m->ialpha = v;
            else if (!strcmp(key, "intra_beta"))
                m->ibeta = v;
            else if (!strcmp(key, "cores"))
                m->cores = v;
            else if (!strcmp(key, "wire_cpu"))
                m->wire_cpu = v != 0;
            else if (!strcmp(key, "fitted"))
                m->nfit = (int)v;
            else if (!strcmp(key, "rms_rel_err"))
                m->rms = v;
        } else {
            fclose(f);
            fprintf(stderr, "gcoll-model: %s:%d: malformed line\n", path, ln);
            return 2;
        }
    }
    fclose(f);
    if (seen != 7)
        return model_die("%s: alpha, beta and gamma are required%s", path, "");
    return 0;
}

/* ---- gcoll-codec-bench output: the figures of the largest n for each codec -------- */

int model_codec_bench_read(model_t *m, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return model_die("cannot open codec figures %s: %s", path, strerror(errno));
    char line[512];
    int found = 0;
    while (fgets(line, sizeof(line), f)) {
        model_codec_t c;
        double x[4], ef, dec, acc, enc;
        char nz[32];
        memset(&c, 0, sizeof(c));
        if (sscanf(line, "%63s %lf %lf %lf %lf %lf %lf %lf %lf %lf %31s", c.spec, &c.ratio, &enc,
                   &x[0], &ef, &x[1], &dec, &x[2], &acc, &x[3], nz) != 11 ||
            !(ef > 0 && dec > 0 && acc > 0 && c.ratio > 0))
            continue;
        c.enc = 4e-9 / ef; /* GB/s of fp32 input -> s per element */
        c.dec = 4e-9 / dec;
        c.acc = 4e-9 / acc;
        c.acc_nz = strcmp(nz, "nan") ? strtod(nz, NULL) * 1e-9 : 0;
        const char *d = strstr(c.spec, "density=");
        c.density = d ? strtod(d + 8, NULL) : 0;
        if (d && !(c.density > 0 && c.density <= 1))
            continue;
        found++;
        int i = 0; /* later blocks are larger tensors: they replace earlier figures */
        while (i < m->ncodec && strcmp(m->codec[i].spec, c.spec))
            i++;
        if (i == MODEL_MAX_CODECS)
            continue;
        m->codec[i] = c;
        if (i == m->ncodec)
            m->ncodec++;
    }
    fclose(f);
    if (!found)
        return model_die("%s: no gcoll-codec-bench rows%s", path, "");
    return 0;
}

/* ---- measurements: CSV with a header naming link,ranks,algo,codec,bytes,time_us ----- */

static int keep(const model_filter_t *flt, const char *link, int P, double bytes)
{
    if (flt->link && strcmp(flt->link, link))
        return 0;
    if (bytes < flt->smin || bytes > flt->smax)
        return 0;
    if (!flt->nranks)
        return 1;
    for (int i = 0; i < flt->nranks; i++)
        if (flt->ranks[i] == P)
            return 1;
    return 0;
}

static int split_csv(char *line, char **fld, int max)
{
    int n = 0;
    line[strcspn(line, "\r\n")] = 0;
    for (char *p = line; n < max;) {
        fld[n++] = p;
        p = strchr(p, ',');
        if (!p)
            break;
        *p++ = 0;
    }
    return n;
}

/* The columns: six required, then load, ppn and nics (hierarchical rows), optional. */
#define NCOL 9
static const char *const col_names[NCOL] = {"link",    "ranks", "algo", "codec", "bytes",
                                            "time_us", "load",  "ppn",  "nics"};

static int header(char **fld, int nf, int *col, const model_filter_t *flt, const char *path, int ln)
{
    int rc = 0;
    for (int i = 0; i < nf; i++)
        for (int j = 0; j < NCOL; j++)
            if (!strcmp(fld[i], col_names[j]))
                col[j] = i;
    for (int j = 0; j < 6; j++)
        if (col[j] < 0) {
            fprintf(stderr, "gcoll-model: %s:%d: header has no column %s\n", path, ln,
                    col_names[j]);
            rc = 2;
        }
    if (flt->use_load && col[6] < 0) {
        fprintf(stderr, "gcoll-model: %s:%d: --load needs a load column\n", path, ln);
        rc = 2;
    }
    return rc;
}

int model_meas_read(const model_t *m, const char *path, const model_filter_t *flt,
                    model_obs_set_t *set)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return model_die("cannot open measurements %s: %s", path, strerror(errno));
    char line[1024], *fld[32];
    int ln = 0, col[NCOL], rc = 0;
    for (int j = 0; j < NCOL; j++)
        col[j] = -1;
    while (fgets(line, sizeof(line), f) && rc == 0) {
        ln++;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        int nf = split_csv(line, fld, 32);
        if (col[0] < 0 && col[1] < 0) { /* the header */
            rc = header(fld, nf, col, flt, path, ln);
            continue;
        }
        double P, bytes, us;
        int maxc = 0;
        for (int j = 0; j < 6; j++)
            maxc = col[j] > maxc ? col[j] : maxc;
        if (nf <= maxc || model_parse_num(fld[col[1]], &P, 1) || P != floor(P) || P > 1 << 20 ||
            model_parse_num(fld[col[4]], &bytes, 0) || model_parse_num(fld[col[5]], &us, 1e-6)) {
            fprintf(stderr,
                    "gcoll-model: %s:%d: malformed row (ranks an integer >= 1, bytes >= 0, "
                    "time_us > 0)\n",
                    path, ln);
            rc = 2;
            break;
        }
        if (!keep(flt, fld[col[0]], (int)P, bytes))
            continue;
        model_obs_t o;
        memset(&o, 0, sizeof(o));
        o.q.ranks = (int)P;
        o.q.bytes = bytes;
        o.q.cores = m->cores;
        o.time = us * 1e-6;
        if (flt->use_load && (col[6] >= nf || model_parse_num(fld[col[6]], &o.q.load, 0))) {
            fprintf(stderr, "gcoll-model: %s:%d: malformed load\n", path, ln);
            rc = 2;
            break;
        }
        double ppn = 0, nics = 0;
        if ((col[7] >= 0 && (col[7] >= nf || model_parse_num(fld[col[7]], &ppn, 0) || ppn > P)) ||
            (col[8] >= 0 && (col[8] >= nf || model_parse_num(fld[col[8]], &nics, 0) || nics > P))) {
            fprintf(stderr, "gcoll-model: %s:%d: malformed ppn or nics\n", path, ln);
            rc = 2;
            break;
        }
        o.q.ppn = (int)ppn;
        o.q.nics = (int)nics;
        const char *codec = fld[col[3]];
        if (strcmp(codec, "none") && *codec) {
            o.q.codec = model_codec_find(m, codec);
            if (!o.q.codec) {
                fprintf(stderr,
                        "gcoll-model: %s:%d: codec %s has no costs: give --codec-bench with "
                        "gcoll-codec-bench -c %s\n",
                        path, ln, codec, codec);
                rc = 2;
                break;
            }
        }
        o.q.algo = model_algo_parse(fld[col[2]]);
        if (o.q.algo == ALG_COUNT || !model_algo_valid(o.q.algo, o.q.codec)) {
            fprintf(stderr, "gcoll-model: %s:%d: algorithm %s does not apply to codec %s\n", path,
                    ln, fld[col[2]], codec);
            rc = 2;
            break;
        }
        if (!set->link[0])
            snprintf(set->link, sizeof(set->link), "%s", fld[col[0]]);
        if (set->n == set->cap) {
            int cap = set->cap ? 2 * set->cap : 256;
            model_obs_t *p = realloc(set->obs, (size_t)cap * sizeof(*p));
            if (!p) {
                rc = model_die("out of memory%s%s", "", "");
                break;
            }
            set->obs = p;
            set->cap = cap;
        }
        set->obs[set->n++] = o;
    }
    if (rc == 0 && col[0] < 0 && col[1] < 0)
        rc = model_die("%s: no header line (link,ranks,algo,codec,bytes,time_us)%s", path, "");
    fclose(f);
    return rc;
}

/* Orders by (ranks, algo, codec, bytes), then time. */
static int obs_cmp(const void *pa, const void *pb)
{
    const model_obs_t *a = pa, *b = pb;
    if (a->q.ranks != b->q.ranks)
        return a->q.ranks < b->q.ranks ? -1 : 1;
    if (a->q.algo != b->q.algo)
        return a->q.algo < b->q.algo ? -1 : 1;
    if (a->q.codec != b->q.codec)
        return a->q.codec < b->q.codec ? -1 : 1;
    if (a->q.bytes != b->q.bytes)
        return a->q.bytes < b->q.bytes ? -1 : 1;
    if (a->q.ppn != b->q.ppn)
        return a->q.ppn < b->q.ppn ? -1 : 1;
    if (a->q.nics != b->q.nics)
        return a->q.nics < b->q.nics ? -1 : 1;
    return (a->time > b->time) - (a->time < b->time);
}

static int same_case(const model_obs_t *a, const model_obs_t *b)
{
    return a->q.ranks == b->q.ranks && a->q.algo == b->q.algo && a->q.codec == b->q.codec &&
           a->q.bytes == b->q.bytes && a->q.ppn == b->q.ppn && a->q.nics == b->q.nics;
}

/* Repeated runs of one case become one row: their median time, or with USE_MIN their
 * fastest (the run least disturbed by other jobs); runs[] counts them. */
void model_obs_median(model_obs_set_t *set, int *runs, int use_min)
{
    qsort(set->obs, (size_t)set->n, sizeof(*set->obs), obs_cmp);
    int out = 0;
    for (int i = 0; i < set->n;) {
        int j = i + 1;
        while (j < set->n && same_case(&set->obs[j], &set->obs[i]))
            j++;
        int k = j - i;
        model_obs_t o = set->obs[i + k / 2];
        if (use_min)
            o = set->obs[i];
        else if (k % 2 == 0)
            o.time = 0.5 * (set->obs[i + k / 2 - 1].time + set->obs[i + k / 2].time);
        if (runs)
            runs[out] = k;
        set->obs[out++] = o;
        i = j;
    }
    set->n = out;
}
