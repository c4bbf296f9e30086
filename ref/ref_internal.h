/*
 * Internal pieces of the reference, exposed to the tests of hand-worked cases.
 * Not installed.
 */
#ifndef DSV4MOE_REF_INTERNAL_H
#define DSV4MOE_REF_INTERNAL_H

#include <stdint.h>
#include "dsv4moe/config.h"
#include "dsv4moe/ref.h"
#include "core/route.h"

/* Deterministic transcendental functions: double-precision range reduction and
   polynomials of fixed form, rounded once to float. Same bits everywhere. */
double dsv4_ref_exp_d(double x);
double dsv4_ref_log1p_d(double x);
float dsv4_ref_expf(float x);
/* softplus(l) = l if l > 20 else log1p(exp(l)), rounded to float. */
float dsv4_ref_softplusf(float l);
/* silu(g) = g / (1 + exp(-g)) in fp32. */
float dsv4_ref_siluf(float g);

/* Dot product of two fp32 vectors in double (four partial sums over i mod 4, combined
   pairwise), rounded once to fp32. */
float dsv4_ref_dot(const float *a, const float *b, int64_t n);

/* The experts' dot products in tiles of DSV4_REF_TB tokens by DSV4_REF_NR weight rows (ref/dot.c). */
#define DSV4_REF_TB 8
#define DSV4_REF_NR 4

/* Tokens [t0, t0 + DSV4_REF_TB) of x [n, k], transposed into xt [k][DSV4_REF_TB] as doubles
   (element i of token t0 + t at xt[i * DSV4_REF_TB + t]); tokens past n are zeros. */
void dsv4_ref_block_tokens(const float *x, int64_t n, int64_t k, int64_t t0, double *xt);

/* out[r * DSV4_REF_TB + t] = dsv4_ref_dot(token t, w[r], n) for the tokens of one block xt
   (dsv4_ref_block_tokens) and DSV4_REF_NR weight rows of n floats (a row may repeat), bit for
   bit: each lane runs dsv4_ref_dot's products and partial sums in its order. */
void dsv4_ref_dot_tile(const double *xt, const float *const w[DSV4_REF_NR], int64_t n,
                       float out[DSV4_REF_NR * DSV4_REF_TB]);

/* Scores from logits (SPEC.md 2.2) for the E experts. */
void dsv4_ref_scores(const dsv4_config *cfg, const float *logits, float *scores);

/* Selection, weights and norm top-p (SPEC.md 2.3-3): core/route.h, shared with the cpu backend. */

/*
 * The layer's pieces, shared by dsv4_ref_forward and the distributed driver so
 * that a sharded run computes each value with the same operations.
 */

/* The range checks of a forward's input ids on hash layers (input_ids[t], tid2eid[v, j]). */
dsv4_status dsv4_ref_check_ids(const dsv4_ref *ref, int64_t tokens, const int32_t *input_ids, dsv4_error *err);

/* Routing of T tokens: xf [T, H] (bf16 values). ids, w [T, K]; kept and nonfinite [T] may be NULL.
   Range errors as dsv4_ref_forward. */
dsv4_status dsv4_ref_route(const dsv4_ref *ref, int threads, int64_t tokens, const float *xf, const int32_t *input_ids,
                           int32_t *ids, float *w, int32_t *kept, unsigned char *nonfinite, dsv4_error *err);

/*
 * One FFN over n rows in the rounding profile `rnd` (SPEC.md section 10; the stages pass
 * DSV4_ROUNDING_SPEC): routed expert `expert` or DSV4_SHARED_EXPERT; x [n, H]
 * (bf16 values, not yet activation-quantized); w [n] router weights (NULL
 * for the shared expert); intermediate rows [i0, i0 + ni) (i0 a multiple of
 * 128). out [n, H] receives the down projection summed over those rows, in
 * fp32, not rounded: over [0, I) bf16(out) is the expert output o (out itself in the fp32
 * profile). Clamp hits
 * are added to *g_clamped and *u_clamped. Thread-safe on a shared handle.
 */
dsv4_status dsv4_ref_ffn_partial(const dsv4_ref *ref, int threads, dsv4_rounding rnd, int64_t expert, int64_t n,
                                 const float *x, const float *w, int64_t i0, int64_t ni, float *out, uint64_t *g_clamped,
                                 uint64_t *u_clamped, dsv4_error *err);

/* y[0, H) += o (before_w2) or w o (after_w2, rounded to bf16 in the bf16_ops profile), in fp32;
   terms[0, H) (may be NULL) += the magnitude of what was added (SPEC.md section 10.2). o is an
   expert output as the profile rounds it. */
void dsv4_ref_accumulate(const dsv4_config *cfg, dsv4_rounding rnd, int64_t H, const float *o, float w, float *y,
                         float *terms);

/* Rounds n values to bf16 in place. */
void dsv4_ref_round_rows(float *v, int64_t n);

#endif
