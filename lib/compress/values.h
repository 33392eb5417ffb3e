/* values.h: encode, validate and decode value sections (see wire.h for their layout). */
#ifndef GCOLL_COMPRESS_VALUES_H
#define GCOLL_COMPRESS_VALUES_H

#include <stddef.h>
#include <stdint.h>

#include "compress/compress.h"

/* Encodes x[0..n) into out (gcoll_vsec_size(vs, n) bytes). key seeds QSGD's rounding.
 * GCOLL_ERR_INVALID (logged) if x holds NaN/Inf. */
gcoll_status_t gcoll_vsec_put(const gcoll_vspec_t *vs, const float *x, size_t n, uint64_t key,
                              uint8_t *out);

/* Error feedback fused with encoding: x = e + a*g, out = the section gcoll_vsec_put
 * writes for x, e = x - D(out) as gcoll_vsec_apply_range(SUB) computes it, all bit for bit,
 * but in cache-sized blocks (one memory pass instead of three). g must be finite. On
 * GCOLL_ERR_INVALID (x overflowed) e is left as e_old + a*g (sign: exactly; the other
 * formats: exactly unless subtracting a decoded value rounded) and out is garbage. */
gcoll_status_t gcoll_vsec_put_ef(const gcoll_vspec_t *vs, float *e, const float *g, float a,
                                 size_t n, uint64_t key, uint8_t *out);

/* QSGD's relative variance bound omega for a bucket of m values of the given bits. */
double gcoll_qsgd_omega(unsigned bits, size_t m);

/* Checks a value section of n values whose size was already checked: finite values and
 * scales, codes in range. */
gcoll_status_t gcoll_vsec_check(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n);

/* Decodes values [start, start+m) of a checked section of n values into out[0..m). */
void gcoll_vsec_apply_range(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n, size_t start,
                            size_t m, float *out, int mode);

#endif /* GCOLL_COMPRESS_VALUES_H */
