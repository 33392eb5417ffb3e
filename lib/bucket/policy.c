/* policy.c: the layer policy (GCOLL_LAYER_POLICY): which compressor each gradient tensor
 * uses, by name pattern, size and position, first matching rule wins. */
#include "bucket/policy.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/util.h"

static void free_rules(gcoll_policy_t *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->rule[i].pattern);
        free(p->rule[i].spec);
    }
    free(p->rule);
    p->rule = NULL;
    p->n = 0;
}

void gcoll_policy_free(gcoll_policy_t *p)
{
    free_rules(p);
}

/* "selector=spec" where selector is a glob on the name, size<N, size>N, first or last. */
static gcoll_status_t parse_rule(const char *text, gcoll_rule_t *r, char *err, size_t errlen)
{
    const char *eq = strchr(text, '=');
    memset(r, 0, sizeof(*r));
    if (!eq || eq == text || !eq[1]) {
        snprintf(err, errlen, "rule '%s' is not selector=compressor", text);
        return GCOLL_ERR_INVALID;
    }
    size_t sl = (size_t)(eq - text);
    char sel[256];
    if (sl >= sizeof(sel)) {
        snprintf(err, errlen, "rule '%s': selector too long", text);
        return GCOLL_ERR_INVALID;
    }
    memcpy(sel, text, sl);
    sel[sl] = '\0';
    char cerr[256];
    if (gcoll_compressor_check(eq + 1, cerr, sizeof(cerr)) != GCOLL_OK) {
        snprintf(err, errlen, "rule '%s': %s", text, cerr);
        return GCOLL_ERR_INVALID;
    }
    if (strncmp(sel, "type:", 5) == 0) {
        /* module classes are PyTorch's: its hook and fsdp_compress expand these rules */
        snprintf(err, errlen,
                 "rule '%s': type: selectors match PyTorch module classes and are resolved "
                 "by gcoll.torch (the DDP hook, fsdp_compress); name, size<N, size>N, "
                 "first and last work everywhere",
                 text);
        return GCOLL_ERR_INVALID;
    }
    if (strncmp(sel, "size<", 5) == 0 || strncmp(sel, "size>", 5) == 0) {
        if (gcoll_parse_size(sel + 5, &r->size) != 0) {
            snprintf(err, errlen, "rule '%s': '%s' is not a size (elements)", text, sel + 5);
            return GCOLL_ERR_INVALID;
        }
        r->kind = sel[4] == '<' ? GCOLL_RULE_SMALLER : GCOLL_RULE_LARGER;
    } else if (strcmp(sel, "first") == 0) {
        r->kind = GCOLL_RULE_FIRST;
    } else if (strcmp(sel, "last") == 0) {
        r->kind = GCOLL_RULE_LAST;
    } else {
        r->kind = GCOLL_RULE_NAME;
    }
    r->pattern = strdup(sel);
    r->spec = strdup(eq + 1);
    return r->pattern && r->spec ? GCOLL_OK : GCOLL_ERR_NOMEM;
}

gcoll_status_t gcoll_policy_parse(const char *text, gcoll_policy_t *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
    if (!text || !*text)
        return GCOLL_OK;
    char *copy = strdup(text), *save = NULL;
    if (!copy)
        return GCOLL_ERR_NOMEM;
    gcoll_status_t st = GCOLL_OK;
    for (char *tok = strtok_r(copy, ";", &save); tok && st == GCOLL_OK;
         tok = strtok_r(NULL, ";", &save)) {
        while (*tok == ' ')
            tok++;
        if (!*tok)
            continue;
        gcoll_rule_t *grown = realloc(p->rule, (p->n + 1) * sizeof(*grown));
        if (!grown) {
            st = GCOLL_ERR_NOMEM;
            break;
        }
        p->rule = grown;
        st = parse_rule(tok, &p->rule[p->n], err, errlen);
        if (st == GCOLL_OK)
            p->n++;
    }
    free(copy);
    if (st != GCOLL_OK)
        free_rules(p);
    return st;
}

size_t gcoll_policy_layer_len(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? (size_t)(dot - name) : strlen(name);
}

int gcoll_policy_same_layer(const char *a, const char *b)
{
    size_t la = gcoll_policy_layer_len(a);
    return la == gcoll_policy_layer_len(b) && strncmp(a, b, la) == 0;
}

static int has_rule(const gcoll_policy_t *p, gcoll_rule_kind_t kind)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->rule[i].kind == kind)
            return 1;
    return 0;
}

const char *gcoll_policy_pick(const gcoll_policy_t *p, const char *name, size_t count, int in_first,
                              int in_last, const char *deflt, int *rule_p)
{
    int named =
        (in_first && has_rule(p, GCOLL_RULE_FIRST)) || (in_last && has_rule(p, GCOLL_RULE_LAST));
    for (size_t i = 0; i < p->n; i++) {
        const gcoll_rule_t *r = &p->rule[i];
        int hit = 0;
        /* clang-format off */
        switch (r->kind) {
        case GCOLL_RULE_NAME: hit = fnmatch(r->pattern, name, 0) == 0; break;
        case GCOLL_RULE_SMALLER: hit = !named && count < r->size; break;
        case GCOLL_RULE_LARGER: hit = !named && count > r->size; break;
        case GCOLL_RULE_FIRST: hit = in_first; break;
        case GCOLL_RULE_LAST: hit = in_last; break;
        }
        /* clang-format on */
        if (hit) {
            if (rule_p)
                *rule_p = (int)i;
            return r->spec;
        }
    }
    if (rule_p)
        *rule_p = -1;
    return deflt;
}
