/*
 * Internal: SPEC.md sections 2.3, 2.4 and 3 for one token, the reference's selection, weights and
 * norm top-p pruning. One copy for the reference (ref/ref.c) and the cpu backend's router
 * (fast/cpu/router.c), which compute their scores each their own way (the reference with its
 * fixed-form transcendentals, the cpu backend with libm). Compiled with -ffp-contract=off, as the
 * reference is (the Makefile's rule for this file), so its bits do not depend on the compiler.
 */
#include "core/route.h"

/* a ranks before b: larger key, ties to the lower expert id. */
static int before(float ka, int32_t ia, float kb, int32_t ib) { return ka > kb || (ka == kb && ia < ib); }

void dsv4_route_select(const dsv4_config *c, const float *s, const float *bias, const int32_t *hash_ids, int32_t *ids,
                       float *w)
{
    int64_t E = c->n_routed_experts, K = c->n_activated;
    if (hash_ids) {
        for (int64_t j = 0; j < K; j++)
            ids[j] = hash_ids[j];
    } else {
        /* Insertion into a sorted top-K list: O(E K), exact ordering of the spec. */
        float key[K > 0 ? K : 1];
        int64_t n = 0;
        for (int64_t e = 0; e < E; e++) {
            float b = bias ? s[e] + bias[e] : s[e];
            if (n == K && !before(b, (int32_t)e, key[K - 1], ids[K - 1]))
                continue;
            int64_t pos = n < K ? n++ : K - 1;
            while (pos > 0 && before(b, (int32_t)e, key[pos - 1], ids[pos - 1])) {
                key[pos] = key[pos - 1];
                ids[pos] = ids[pos - 1];
                pos--;
            }
            key[pos] = b;
            ids[pos] = (int32_t)e;
        }
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < K; j++) {
        w[j] = s[ids[j]];
        sum += w[j];
    }
    if (c->score_func != DSV4_SCORE_SOFTMAX) {
        float denom = sum + c->norm_eps;
        for (int64_t j = 0; j < K; j++)
            w[j] = w[j] / denom;
    }
    for (int64_t j = 0; j < K; j++)
        w[j] = w[j] * c->route_scale;
}

int dsv4_route_top_p(const dsv4_config *c, int32_t *ids, float *w, const float *norms)
{
    int64_t K = c->n_activated;
    int32_t E = (int32_t)c->n_routed_experts;
    float contrib[K > 0 ? K : 1];
    int order[K > 0 ? K : 1];
    for (int64_t j = 0; j < K; j++) {
        contrib[j] = w[j] * norms[j];
        /* Stable insertion by contribution descending, ties to the lower expert id. */
        int64_t pos = j;
        while (pos > 0 && before(contrib[j], ids[j], contrib[order[pos - 1]], ids[order[pos - 1]])) {
            order[pos] = order[pos - 1];
            pos--;
        }
        order[pos] = (int)j;
    }
    float total = 0.0f;
    for (int64_t r = 0; r < K; r++)
        total += contrib[order[r]];
    float threshold = c->top_p * total;
    int64_t keep = K;
    float cum = 0.0f;
    for (int64_t r = 0; r < K; r++) {
        cum += contrib[order[r]];
        if (cum >= threshold) {
            keep = r + 1;
            break;
        }
    }
    if (keep < c->top_p_min_keep)
        keep = c->top_p_min_keep;
    float orig = 0.0f, kept = 0.0f;
    for (int64_t j = 0; j < K; j++)
        orig += w[j];
    for (int64_t r = keep; r < K; r++) {
        ids[order[r]] = E;
        w[order[r]] = 0.0f;
    }
    for (int64_t j = 0; j < K; j++)
        kept += w[j];
    if (c->top_p_renorm && keep < K && kept > 0.0f) {
        float scale = orig / kept;
        for (int64_t j = 0; j < K; j++)
            w[j] = w[j] * scale;
    }
    return (int)keep;
}
