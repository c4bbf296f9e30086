/*
 * Internal pieces of the reference, exposed to the tests of hand-worked cases.
 * Not installed.
 */
#ifndef DSV4MOE_REF_INTERNAL_H
#define DSV4MOE_REF_INTERNAL_H

#include <stdint.h>
#include "dsv4moe/config.h"

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

/* Scores from logits (SPEC.md 2.2) for the E experts. */
void dsv4_ref_scores(const dsv4_config *cfg, const float *logits, float *scores);

/*
 * Selection and weights of one token (SPEC.md 2.3-2.4). bias may be NULL
 * (zero). With `hash_ids` non-NULL (hash layers) the ids are taken from it.
 * ids and weights are [K].
 */
void dsv4_ref_select(const dsv4_config *cfg, const float *scores, const float *bias, const int32_t *hash_ids,
                     int32_t *ids, float *weights);

/*
 * Norm top-p pruning of one token's K slots in place (SPEC.md 3); norms[j]
 * is the predictor's estimate for slot j. Returns the number of slots kept.
 */
int dsv4_ref_top_p(const dsv4_config *cfg, int32_t *ids, float *weights, const float *norms);

#endif
