/* mlp.h: a multilayer perceptron (fully connected, ReLU, softmax cross-entropy) in plain C. */
#ifndef GCOLL_TRAIN_MLP_H
#define GCOLL_TRAIN_MLP_H

#include <stddef.h>
#include <stdint.h>

#define TRAIN_MAX_LAYERS 8

/* Layer l maps in -> out: z = x W^T + b, W row-major out x in (as PyTorch's Linear). */
typedef struct {
    int in, out;
    float *w, *b;   /* parameters */
    float *gw, *gb; /* gradients of the mean loss over the batch */
    float *vw, *vb; /* momentum buffers (SGD with momentum) */
} train_layer_t;

typedef struct {
    int nl;
    train_layer_t l[TRAIN_MAX_LAYERS];
    int cap;                          /* largest batch the buffers hold */
    float *act[TRAIN_MAX_LAYERS + 1]; /* act[l + 1]: output of layer l (ReLU'd but the last) */
    float *dz, *dz2;                  /* backward scratch: gradient wrt a layer's output */
    const float *x;                   /* the batch of the last forward */
    int batch;
} train_mlp_t;

/* Creates layers sizes[0] -> sizes[1] -> ... -> sizes[n-1] (2 <= n <= TRAIN_MAX_LAYERS + 1)
 * for batches of up to cap examples, with He-normal weights (He et al. 2015) and zero biases
 * drawn from seed: the same on every rank. Returns 0, or -1 (bad sizes, out of memory). */
int train_mlp_init(train_mlp_t *m, const int *sizes, int n, int cap, uint64_t seed);
void train_mlp_free(train_mlp_t *m);

/* Forward pass over batch x (b x sizes[0]); with labels y, returns the mean cross-entropy
 * and (when correct_p is not NULL) adds the number of correct predictions; keeps what
 * backward needs. b <= cap. */
double train_mlp_forward(train_mlp_t *m, const float *x, const uint8_t *y, int b, long *correct_p);

/* Called by backward as soon as layer l's gw and gb are final (last layer first), so a
 * data-parallel trainer can start reducing them while the earlier layers are computed. */
typedef int (*train_layer_ready_fn)(int layer, void *arg);

/* Backward pass of the last forward: gradients of the mean loss into every gw, gb. Stops
 * with the callback's value if it returns non-zero. Does not read gw or gb after handing
 * them to the callback. */
int train_mlp_backward(train_mlp_t *m, const uint8_t *y, train_layer_ready_fn ready, void *arg);

/* w -= lr * v with v = momentum * v + g (PyTorch's SGD form; momentum 0 is plain SGD). */
void train_mlp_sgd(train_mlp_t *m, float lr, float momentum);
/* The same with a momentum per tensor: mom[2l] for layer l's weight, mom[2l+1] its bias. */
void train_mlp_sgd_each(train_mlp_t *m, float lr, const float *mom);

/* Number of parameters, and a copy of all of them (w then b, layer by layer) into out. */
size_t train_mlp_num_params(const train_mlp_t *m);
void train_mlp_get_params(const train_mlp_t *m, float *out);

#endif
