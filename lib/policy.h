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
/* The spec of the first rule matching tensor position (registration order) of ntensors,
 * or deflt. */
const char *gcoll_policy_pick(const gcoll_policy_t *p, const char *name, size_t count,
                              int position, int ntensors, const char *deflt);

#endif /* GCOLL_POLICY_H */
