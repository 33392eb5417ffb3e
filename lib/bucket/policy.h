/* policy.h: the layer policy that picks each gradient tensor's compressor. */
#ifndef GCOLL_POLICY_H
#define GCOLL_POLICY_H

#include <stddef.h>

#include "gcoll.h"

typedef enum {
    GCOLL_RULE_NAME,    /* glob on the tensor name (fnmatch) */
    GCOLL_RULE_SMALLER, /* size<N elements */
    GCOLL_RULE_LARGER,  /* size>N elements */
    GCOLL_RULE_FIRST,   /* the network's first layer (registered last) */
    GCOLL_RULE_LAST     /* the network's last layer (registered first) */
} gcoll_rule_kind_t;

typedef struct {
    gcoll_rule_kind_t kind;
    char *pattern;
    size_t size;
    char *spec;
} gcoll_rule_t;

typedef struct {
    gcoll_rule_t *rule;
    size_t n;
} gcoll_policy_t;

/* Parses "sel=spec;sel=spec;...". Errors name the offending rule in err. */
gcoll_status_t gcoll_policy_parse(const char *text, gcoll_policy_t *p, char *err, size_t errlen);
void gcoll_policy_free(gcoll_policy_t *p);
/* Layers for the policy: a layer is the tensors whose names agree up to the last '.'
 * ("fc2.weight", "fc2.bias" -> "fc2"; a name without '.' is its own layer). Length of
 * name's layer prefix. */
size_t gcoll_policy_layer_len(const char *name);
/* Whether tensors a and b belong to the same layer. */
int gcoll_policy_same_layer(const char *a, const char *b);

/* The spec of the first rule matching a tensor, or deflt; *rule_p (if not NULL) gets the
 * rule's index, -1 for deflt. in_first / in_last: the tensor belongs to the model's first
 * / last layer in forward order. A size rule does not match a tensor of the first or last
 * layer when the policy has a first or last rule for it: a position names layers, a size
 * describes tensors in general (ResNet-50's conv1 has 9408 weights). */
const char *gcoll_policy_pick(const gcoll_policy_t *p, const char *name, size_t count, int in_first,
                              int in_last, const char *deflt, int *rule_p);

#endif /* GCOLL_POLICY_H */
