/* parse.c: the typed parsers of settings' text (integers, sizes such as 8kb, durations such
 * as 30s, booleans, enums, flag sets, host:port), shared by the config table and its callers. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/config.h"
#include "base/util.h"

int gcoll_parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    while (isspace((unsigned char)*end))
        end++;
    if (errno || end == s || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Splits "12.5mb" into a number and a suffix; the suffix is compared case-insensitively. */
static int split_number(const char *s, double *num, const char **suffix)
{
    char *end;
    while (isspace((unsigned char)*s))
        s++;
    if (*s == '-' || *s == '\0')
        return -1;
    errno = 0;
    *num = strtod(s, &end);
    if (errno || end == s || !(*num >= 0))
        return -1;
    while (isspace((unsigned char)*end))
        end++;
    *suffix = end;
    return 0;
}

int gcoll_parse_size(const char *s, size_t *out)
{
    /* clang-format off */
    static const struct {
        const char *sfx;
        double mul;
    } units[] = {{"", 1},                {"b", 1},
                 {"k", 1024.0},          {"kb", 1024.0},          {"kib", 1024.0},
                 {"m", 1048576.0},       {"mb", 1048576.0},       {"mib", 1048576.0},
                 {"g", 1073741824.0},    {"gb", 1073741824.0},    {"gib", 1073741824.0},
                 {"t", 1099511627776.0}, {"tb", 1099511627776.0}, {"tib", 1099511627776.0}};
    /* clang-format on */
    double num;
    const char *sfx;
    if (split_number(s, &num, &sfx) != 0)
        return -1;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(sfx, units[i].sfx) == 0) {
            double v = num * units[i].mul;
            if (v >= 18446744073709551615.0 || v != (double)(size_t)v)
                return -1;
            *out = (size_t)v;
            return 0;
        }
    }
    return -1;
}

int gcoll_parse_duration_ms(const char *s, int64_t *out)
{
    static const struct {
        const char *sfx;
        double ms;
    } units[] = {{"", 1},      {"ms", 1},      {"us", 0.001}, {"s", 1000},
                 {"m", 60000}, {"min", 60000}, {"h", 3600000}};
    double num;
    const char *sfx;
    if (split_number(s, &num, &sfx) != 0)
        return -1;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(sfx, units[i].sfx) == 0) {
            double v = num * units[i].ms;
            if (v > 9.0e15)
                return -1;
            *out = (int64_t)(v + 0.5);
            return 0;
        }
    }
    return -1;
}

int gcoll_parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"1", "y", "yes", "true", "on"};
    static const char *const no[] = {"0", "n", "no", "false", "off"};
    for (size_t i = 0; i < 5; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

int gcoll_split_hostport(const char *s, char *host, size_t hlen, char *port, size_t plen)
{
    const char *colon;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':')
            return -1;
        if ((size_t)(end - s - 1) >= hlen)
            return -1;
        memcpy(host, s + 1, (size_t)(end - s - 1));
        host[end - s - 1] = '\0';
        colon = end + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= hlen || colon == s)
            return -1;
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = '\0';
    }
    long p;
    if (gcoll_parse_long(colon + 1, 1, 65535, &p) != 0)
        return -1;
    snprintf(port, plen, "%ld", p);
    return 0;
}

int gcoll_parse_enum(const char *s, const char *choices, int *out)
{
    size_t n = strlen(s);
    int idx = 0;
    for (const char *c = choices; *c; idx++) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && strncasecmp(c, s, n) == 0) {
            *out = idx;
            return 0;
        }
        if (!bar)
            break;
        c = bar + 1;
    }
    return -1;
}

/* One word of a flag set: its bit among choices' plain names, or an alias's expansion
 * ("both=bandwidth+phase"); -1 if it names none. */
static int flag_word(const char *w, size_t n, const char *choices, unsigned *bits)
{
    unsigned bit = 1;
    for (const char *c = choices; *c;) {
        size_t len = strcspn(c, "|");
        const char *eq = memchr(c, '=', len);
        size_t name_len = eq ? (size_t)(eq - c) : len;
        if (name_len == n && strncasecmp(c, w, n) == 0) {
            if (!eq) {
                *bits = bit;
                return 0;
            }
            char exp[128];
            size_t el = len - name_len - 1;
            if (el >= sizeof(exp))
                return -1;
            memcpy(exp, eq + 1, el);
            exp[el] = '\0';
            *bits = 0;
            for (char *t = strtok(exp, "+"); t; t = strtok(NULL, "+")) {
                unsigned b;
                if (strchr(t, '=') || flag_word(t, strlen(t), choices, &b))
                    return -1;
                *bits |= b;
            }
            return 0;
        }
        if (!eq)
            bit <<= 1;
        c += len + (c[len] == '|');
    }
    return -1;
}

int gcoll_parse_flags(const char *s, const char *choices, unsigned *out)
{
    if (!s || !*s)
        return -1;
    if (strcasecmp(s, "off") == 0 || strcmp(s, "0") == 0) {
        *out = 0;
        return 0;
    }
    unsigned m = 0;
    for (const char *w = s;;) {
        size_t n = strcspn(w, "+,");
        unsigned b;
        if (n == 0 || flag_word(w, n, choices, &b))
            return -1;
        m |= b;
        if (!w[n])
            break;
        w += n + 1;
    }
    *out = m;
    return 0;
}
