/*
 * The CPU backend's router (SPEC.md 2-3): logits by OpenBLAS, then per token the scores,
 * then the reference's top-K (ties to the lower id), weights and norm top-p (pruned slots get
 * the sentinel E).
 */
#include <math.h>

#include <cblas.h>
#ifdef I
#undef I /* complex.h through OpenBLAS's cblas.h */
#endif

#include "fast/cpu/cpu_impl.h"
#include "fast/cpu/kernels/kutil.h"
#include "core/route.h" /* dsv4_route_select, dsv4_route_top_p (core) */

void dsv4_cpu_route(void *p, int64_t lo, int64_t hi)
{
    route_job *j = p;
    const cpu_be *b = j->b;
    const dsv4_config *c = &b->cfg;
    int64_t E = c->n_routed_experts, H = c->dim, K = c->n_activated;
    bool hash = dsv4_config_is_hash_layer(c);
    float s[E], norms[K];
    for (int64_t t = lo; t < hi; t++) {
        const float *l = j->logits + t * E;
        int32_t *ids = j->ids + t * K;
        float *w = j->w + t * K;
        bool finite = true;
        float lb[E];
        for (int64_t e = 0; e < E; e++) {
            lb[e] = c->gate_logits == DSV4_GATE_LOGITS_BF16 ? rbf16(l[e]) : l[e];
            finite = finite && isfinite(lb[e]);
        }
        j->nonf[t] = !finite;
        if (!finite) {
            for (int64_t k = 0; k < K; k++) {
                ids[k] = (int32_t)k;
                w[k] = c->route_scale / (float)K;
            }
            j->kept[t] = (int32_t)K;
            continue;
        }
        /* scores (SPEC.md 2.2) */
        if (c->score_func == DSV4_SCORE_SQRTSOFTPLUS) {
            for (int64_t e = 0; e < E; e++)
                s[e] = sqrtf(lb[e] > 20.0f ? lb[e] : log1pf(expf(lb[e])));
        } else if (c->score_func == DSV4_SCORE_SIGMOID) {
            for (int64_t e = 0; e < E; e++)
                s[e] = 1.0f / (1.0f + expf(-lb[e]));
        } else {
            float mx = lb[0], sum = 0.0f;
            for (int64_t e = 1; e < E; e++)
                mx = lb[e] > mx ? lb[e] : mx;
            for (int64_t e = 0; e < E; e++) {
                s[e] = expf(lb[e] - mx);
                sum += s[e];
            }
            for (int64_t e = 0; e < E; e++)
                s[e] = s[e] / sum;
        }
        /* selection and weights (2.3-2.4), and norm top-p (3) below, are the reference's functions:
           with no transcendental in them their bits do not depend on the build */
        dsv4_route_select(c, s, b->rt.bias, hash ? b->rt.tid2eid + (int64_t)j->in_ids[t] * K : NULL, ids, w);
        int64_t keep = K;
        /* norm top-p (3) */
        if (!hash && c->top_p < 1.0f) {
            const float *x = j->xf + t * H;
            for (int64_t k = 0; k < K; k++) {
                int32_t ex = ids[k];
                if (c->top_p_predictor == DSV4_PREDICTOR_CONST)
                    norms[k] = b->rt.pred_norm[ex];
                else if (c->top_p_predictor == DSV4_PREDICTOR_LINEAR) {
                    float v = dot4(x, b->rt.pred_w + (int64_t)ex * H, H) + b->rt.pred_b[ex];
                    norms[k] = v > 0.0f ? v : 0.0f;
                } else
                    norms[k] = 1.0f;
            }
            keep = dsv4_route_top_p(c, ids, w, norms);
        }
        j->kept[t] = (int32_t)keep;
    }
}

void dsv4_cpu_logits_rows(void *p, int64_t lo, int64_t hi)
{
    logit_job *j = p;
    const dsv4_config *c = &j->b->cfg;
    int64_t E = c->n_routed_experts, H = c->dim;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(hi - lo), (int)E, (int)H, 1.0f, j->xf + lo * H,
                (int)H, j->b->rt.gate, (int)H, 0.0f, j->logits + lo * E, (int)E);
}

/* Few tokens: experts [lo, hi) of every token by sgemv, the gate rows split over the workers (sgemm
   at M = 1 packs the whole gate first: a second pass over its 4 MiB). */
void dsv4_cpu_logits_cols(void *p, int64_t lo, int64_t hi)
{
    logit_job *j = p;
    const dsv4_config *c = &j->b->cfg;
    int64_t E = c->n_routed_experts, H = c->dim;
    for (int64_t t = 0; t < j->Tc; t++)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)(hi - lo), (int)H, 1.0f, j->b->rt.gate + lo * H, (int)H,
                    j->xf + t * H, 1, 0.0f, j->logits + t * E + lo, 1);
}
