/* mlp.c: forward and backward passes of a ReLU MLP with softmax cross-entropy, on sgemm. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "gemm.h"
#include "mlp.h"

/* Standard normal deviates by Box-Muller from splitmix64 (deterministic across builds). */
static double normal(uint64_t *s)
{
    double u1 = ((double)(train_splitmix64(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(train_splitmix64(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void train_mlp_free(train_mlp_t *m)
{
    for (int l = 0; l < m->nl; l++) {
        train_layer_t *L = &m->l[l];
        free(L->w);
        free(L->b);
        free(L->gw);
        free(L->gb);
        free(L->vw);
        free(L->vb);
    }
    for (int l = 1; l <= m->nl; l++)
        free(m->act[l]);
    free(m->dz);
    free(m->dz2);
    memset(m, 0, sizeof(*m));
}

int train_mlp_init(train_mlp_t *m, const int *sizes, int n, int cap, uint64_t seed)
{
    memset(m, 0, sizeof(*m));
    if (n < 2 || n > TRAIN_MAX_LAYERS + 1 || cap < 1)
        return -1;
    for (int i = 0; i < n; i++)
        if (sizes[i] < 1 || sizes[i] > (1 << 20))
            return -1;
    m->nl = n - 1;
    m->cap = cap;
    int widest = 0;
    uint64_t s = seed * 0xd1342543de82ef95ull + 0x5851f42d4c957f2dull;
    for (int l = 0; l < m->nl; l++) {
        train_layer_t *L = &m->l[l];
        L->in = sizes[l];
        L->out = sizes[l + 1];
        size_t nw = (size_t)L->in * L->out;
        L->w = malloc(nw * sizeof(float));
        L->gw = calloc(nw, sizeof(float));
        L->vw = calloc(nw, sizeof(float));
        L->b = calloc((size_t)L->out, sizeof(float));
        L->gb = calloc((size_t)L->out, sizeof(float));
        L->vb = calloc((size_t)L->out, sizeof(float));
        m->act[l + 1] = malloc((size_t)cap * L->out * sizeof(float));
        if (!L->w || !L->gw || !L->vw || !L->b || !L->gb || !L->vb || !m->act[l + 1]) {
            train_mlp_free(m);
            return -1;
        }
        double std = sqrt(2.0 / L->in); /* He et al. 2015, for ReLU */
        for (size_t i = 0; i < nw; i++)
            L->w[i] = (float)(std * normal(&s));
        if (L->in > widest)
            widest = L->in;
        if (L->out > widest)
            widest = L->out;
    }
    m->dz = malloc((size_t)cap * widest * sizeof(float));
    m->dz2 = malloc((size_t)cap * widest * sizeof(float));
    if (!m->dz || !m->dz2) {
        train_mlp_free(m);
        return -1;
    }
    return 0;
}

double train_mlp_forward(train_mlp_t *m, const float *x, const uint8_t *y, int b, long *correct_p)
{
    m->x = x;
    m->batch = b;
    const float *in = x;
    for (int l = 0; l < m->nl; l++) {
        train_layer_t *L = &m->l[l];
        float *z = m->act[l + 1];
        for (int i = 0; i < b; i++)
            memcpy(z + (size_t)i * L->out, L->b, (size_t)L->out * sizeof(float));
        train_sgemm(0, 1, b, L->out, L->in, 1.0f, in, L->in, L->w, L->in, 1.0f, z, L->out);
        if (l + 1 < m->nl)
            for (size_t i = 0; i < (size_t)b * L->out; i++)
                z[i] = z[i] > 0.0f ? z[i] : 0.0f;
        in = z;
    }
    /* Softmax in place over the logits, loss in double (log-sum-exp with the max shifted
     * out, so no overflow). */
    int k = m->l[m->nl - 1].out;
    float *p = m->act[m->nl];
    double loss = 0.0;
    long correct = 0;
    for (int i = 0; i < b; i++) {
        float *pi = p + (size_t)i * k;
        int arg = 0;
        for (int j = 1; j < k; j++)
            if (pi[j] > pi[arg])
                arg = j;
        double mx = pi[arg], sum = 0.0;
        for (int j = 0; j < k; j++)
            sum += exp((double)pi[j] - mx);
        if (y) {
            loss += log(sum) - ((double)pi[y[i]] - mx);
            correct += arg == y[i];
        }
        for (int j = 0; j < k; j++)
            pi[j] = (float)(exp((double)pi[j] - mx) / sum);
    }
    if (correct_p)
        *correct_p += correct;
    return b > 0 ? loss / b : 0.0;
}

int train_mlp_backward(train_mlp_t *m, const uint8_t *y, train_layer_ready_fn ready, void *arg)
{
    int b = m->batch;
    int k = m->l[m->nl - 1].out;
    float *dz = m->dz, *dn = m->dz2;
    /* d(mean loss)/d logits = (softmax - onehot) / b */
    const float *p = m->act[m->nl];
    float inv = 1.0f / (float)b;
    for (int i = 0; i < b; i++)
        for (int j = 0; j < k; j++)
            dz[(size_t)i * k + j] = (p[(size_t)i * k + j] - (j == y[i] ? 1.0f : 0.0f)) * inv;
    for (int l = m->nl - 1; l >= 0; l--) {
        train_layer_t *L = &m->l[l];
        const float *in = l > 0 ? m->act[l] : m->x;
        /* gW = dz^T in (out x in); gb = column sums of dz */
        train_sgemm(1, 0, L->out, L->in, b, 1.0f, dz, L->out, in, L->in, 0.0f, L->gw, L->in);
        for (int j = 0; j < L->out; j++)
            L->gb[j] = 0.0f;
        for (int i = 0; i < b; i++)
            for (int j = 0; j < L->out; j++)
                L->gb[j] += dz[(size_t)i * L->out + j];
        if (ready) {
            int rc = ready(l, arg);
            if (rc != 0)
                return rc;
        }
        if (l == 0)
            break;
        /* gradient wrt the input: dz W, through the ReLU that produced it */
        train_sgemm(0, 0, b, L->in, L->out, 1.0f, dz, L->out, L->w, L->in, 0.0f, dn, L->in);
        for (size_t i = 0; i < (size_t)b * L->in; i++)
            if (in[i] <= 0.0f)
                dn[i] = 0.0f;
        float *t = dz;
        dz = dn;
        dn = t;
    }
    return 0;
}

static void sgd(float *w, float *v, const float *g, size_t n, float lr, float mom)
{
    if (mom == 0.0f) {
        for (size_t i = 0; i < n; i++)
            w[i] -= lr * g[i];
        return;
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = mom * v[i] + g[i];
        w[i] -= lr * v[i];
    }
}

void train_mlp_sgd(train_mlp_t *m, float lr, float momentum)
{
    for (int l = 0; l < m->nl; l++) {
        train_layer_t *L = &m->l[l];
        sgd(L->w, L->vw, L->gw, (size_t)L->in * L->out, lr, momentum);
        sgd(L->b, L->vb, L->gb, (size_t)L->out, lr, momentum);
    }
}

void train_mlp_sgd_each(train_mlp_t *m, float lr, const float *mom)
{
    for (int l = 0; l < m->nl; l++) {
        train_layer_t *L = &m->l[l];
        sgd(L->w, L->vw, L->gw, (size_t)L->in * L->out, lr, mom[2 * l]);
        sgd(L->b, L->vb, L->gb, (size_t)L->out, lr, mom[2 * l + 1]);
    }
}

size_t train_mlp_num_params(const train_mlp_t *m)
{
    size_t n = 0;
    for (int l = 0; l < m->nl; l++)
        n += (size_t)m->l[l].in * m->l[l].out + (size_t)m->l[l].out;
    return n;
}

void train_mlp_get_params(const train_mlp_t *m, float *out)
{
    for (int l = 0; l < m->nl; l++) {
        const train_layer_t *L = &m->l[l];
        size_t nw = (size_t)L->in * L->out;
        memcpy(out, L->w, nw * sizeof(float));
        out += nw;
        memcpy(out, L->b, (size_t)L->out * sizeof(float));
        out += L->out;
    }
}
