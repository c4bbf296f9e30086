/* The router and norm top-p pruning of the reference (SPEC.md sections 2 and 3). */
#include <math.h>
#include <string.h>

#include "ref/ref_internal.h"

void dsv4_ref_scores(const dsv4_config *c, const float *l, float *s)
{
    int64_t E = c->n_routed_experts;
    switch (c->score_func) {
    case DSV4_SCORE_SQRTSOFTPLUS:
        for (int64_t e = 0; e < E; e++)
            s[e] = sqrtf(dsv4_ref_softplusf(l[e]));
        break;
    case DSV4_SCORE_SIGMOID:
        for (int64_t e = 0; e < E; e++)
            s[e] = 1.0f / (1.0f + dsv4_ref_expf(-l[e]));
        break;
    case DSV4_SCORE_SOFTMAX: {
        float mx = l[0];
        for (int64_t e = 1; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        float sum = 0.0f;
        for (int64_t e = 0; e < E; e++) {
            s[e] = dsv4_ref_expf(l[e] - mx);
            sum += s[e];
        }
        for (int64_t e = 0; e < E; e++)
            s[e] = s[e] / sum;
        break;
    }
    }
}
