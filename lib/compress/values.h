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

/* The narrow float sections of values_float.c: fp8, mxfp8, mxfp4, and fp16/bf16 with
 * stochastic rounding (whether vs is one of them). put encodes x[0..n), elements lo.. of
 * the section (lo: where the rounding stream starts; the whole section for fp8/mx); check
 * and apply_range as gcoll_vsec_check / gcoll_vsec_apply_range, which call them. */
int gcoll_vsec_is_float_lowp(const gcoll_vspec_t *vs);
gcoll_status_t gcoll_vsec_float_put(const gcoll_vspec_t *vs, const float *x, size_t n, size_t lo,
                                    uint64_t key, uint8_t *out);
gcoll_status_t gcoll_vsec_float_check(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n);
void gcoll_vsec_float_apply_range(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n,
                                  size_t start, size_t m, float *out, int mode);
/* vq (values_vq.c): encode with the state's codebook *book_p (NULL: no state; *book_p
 * NULL: cold start, then set to a new codebook the state owns), check, decode. */
gcoll_status_t gcoll_vq_put(const gcoll_vspec_t *vs, const float *x, size_t n, float **book_p,
                            uint8_t *out);
gcoll_status_t gcoll_vq_check(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n);
void gcoll_vq_apply_range(const gcoll_vspec_t *vs, const uint8_t *p, uint64_t n, size_t start,
                          size_t m, float *out, int mode);
/* The value of an fp8 / mxfp8 / mxfp4 element code (sign included), unscaled. */
float gcoll_float_elem_value(const gcoll_vspec_t *vs, uint32_t code);

#endif /* GCOLL_COMPRESS_VALUES_H */
