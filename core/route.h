/*
 * Internal (not installed): the routing steps after the scores that the reference and the cpu
 * backend share (core/route.c). Depends on the config only, so ref/ and fast/ may both use it.
 */
#ifndef DSV4MOE_CORE_ROUTE_H
#define DSV4MOE_CORE_ROUTE_H

#include <stdint.h>

#include "dsv4moe/config.h"

/*
 * Selection and weights of one token (SPEC.md 2.3-2.4): the top K of scores + bias (bias may be
 * NULL: zero) by key descending, ties to the lower expert id, or with hash_ids non-NULL (a hash
 * layer) its K ids; weights the selected scores, normalised (not for softmax) and times
 * route_scale. ids and weights are [K].
 */
void dsv4_route_select(const dsv4_config *cfg, const float *scores, const float *bias, const int32_t *hash_ids,
                       int32_t *ids, float *weights);

/*
 * Norm top-p pruning of one token's K slots in place (SPEC.md 3); norms[j] is the predictor's
 * estimate for slot j. Pruned slots get id E and weight 0; returns the number of slots kept.
 */
int dsv4_route_top_p(const dsv4_config *cfg, int32_t *ids, float *weights, const float *norms);

#endif
