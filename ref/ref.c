/* The reference layer: binding a checkpoint, and the forward (SPEC.md sections 2-5). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/formats.h"
#include "dsv4moe/ref.h"
#include "dsv4moe/weights.h"
#include "core/hash.h"
#include "core/err.h"
#include "core/parallel.h"
#include "core/swiglu.h"
#include "ref/ref_internal.h"

/* A matrix as the reference consumes it: a view into the checkpoint, or owned quantized bytes. */
typedef struct {
    dsv4_matrix_view v;
    uint8_t *owned_q, *owned_s;
    bool read; /* the view's bytes have been read from the checkpoint */
    uint8_t *alt_s; /* DSV4_ALT_TP2_FP4_SCALES: the scales as the second shard misreads them */
} matrix;

/* Every matrix of the layer is checked at creation (dsv4_weights_matrix_view), but its bytes
   are read only when a forward first runs its expert: a few tokens touch a few of 256
   experts, and the checkpoint reads into owned memory (never a mapping that could fault). */
struct dsv4_ref {
    dsv4_config cfg;
    int threads;
    dsv4_rounding rounding; /* of dsv4_ref_forward (SPEC.md section 10) */
    unsigned alt;           /* dsv4_ref_alternate bits; 0: the contract */
    const dsv4_checkpoint *ck;
    pthread_mutex_t read_mu; /* guards the `read` flags: forwards may run on several threads */
    bool mu_init;
    dsv4_router_tensors rt;
    matrix *experts;  /* [E][3] */
    matrix shared[3];
};

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static dsv4_status quantize_owned(const dsv4_config *c, dsv4_weight_format fmt, matrix *m, dsv4_error *err)
{
    int64_t n = m->v.n, k = m->v.k;
    float *w = malloc((size_t)(n * k) * sizeof *w);
    if (!w)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory quantizing at load");
    dsv4_matrix_dequant_rows(&m->v, 0, n, w);
    dsv4_status st;
    if (fmt == DSV4_FORMAT_FP8) {
        size_t ssz = c->weight_scale == DSV4_SCALE_FP32 ? 4 : 1;
        m->owned_q = malloc((size_t)(n * k));
        m->owned_s = malloc((size_t)(cdiv(n, 128) * cdiv(k, 128)) * ssz);
        st = !m->owned_q || !m->owned_s
                 ? dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory quantizing at load")
                 : dsv4_quant_fp8_block(w, n, k, c->weight_scale, m->owned_q, m->owned_s, m->v.key, err);
        m->v.row_bytes = (uint64_t)k;
        m->v.scale_format = c->weight_scale;
    } else {
        m->owned_q = malloc((size_t)(n * k / 2));
        m->owned_s = malloc((size_t)(n * (k / 32)));
        st = !m->owned_q || !m->owned_s
                 ? dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory quantizing at load")
                 : dsv4_quant_fp4_block(w, n, k, m->owned_q, m->owned_s, m->v.key, err);
        m->v.row_bytes = (uint64_t)k / 2;
    }
    free(w);
    if (st == DSV4_OK) {
        m->v.format = fmt;
        m->v.data = m->owned_q;
        m->v.scales = m->owned_s;
    }
    return st;
}

static dsv4_status bind_matrix(dsv4_ref *r, const dsv4_checkpoint *ck, int64_t e, int p, matrix *m, dsv4_error *err)
{
    dsv4_status st = dsv4_weights_matrix_view(ck, &r->cfg, e, (dsv4_proj)p, &m->v, err);
    if (st)
        return st;
    dsv4_weight_format want = e == DSV4_SHARED_EXPERT ? r->cfg.shared_format : r->cfg.routed_format;
    if (m->v.format != want) { /* a bf16 stacked export under a quantized config: quantized now */
        if ((st = dsv4_weights_matrix(ck, &r->cfg, e, (dsv4_proj)p, &m->v, err)))
            return st;
        m->read = true;
        return quantize_owned(&r->cfg, want, m, err);
    }
    return DSV4_OK;
}

/* DSV4_ALT_TP2_FP4_SCALES on an fp4 matrix ([n, k/32] ue8m0 scales): the intermediate dimension
   split over two tensor-parallel shards, the second reading the first's scale blocks, rows of w1
   and w3 (proj 0, 1: n = I) or columns of w2 (proj 2: k = I). */
static dsv4_status misalign_scales(matrix *m, int p, dsv4_error *err)
{
    int64_t n = m->v.n, kb = m->v.k / 32;
    if (!(m->alt_s = malloc((size_t)(n * kb))))
        return dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory for the alternate scales");
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < kb; c++) {
            int64_t sr = p < 2 && r >= n / 2 ? r - n / 2 : r, sc = p == 2 && c >= kb / 2 ? c - kb / 2 : c;
            m->alt_s[r * kb + c] = m->v.scales[sr * kb + sc];
        }
    m->v.scales = m->alt_s;
    return DSV4_OK;
}

/* Reads the three matrices of `expert` on its first use. */
static dsv4_status read_expert(const dsv4_ref *r, int64_t expert, dsv4_error *err)
{
    matrix *ms = expert == DSV4_SHARED_EXPERT ? (matrix *)r->shared : &r->experts[3 * expert];
    dsv4_status st = DSV4_OK;
    pthread_mutex_lock((pthread_mutex_t *)&r->read_mu);
    for (int p = 0; p < 3 && !st; p++) {
        if (!ms[p].read) {
            dsv4_matrix_view v;
            if (!(st = dsv4_weights_matrix(r->ck, &r->cfg, expert, (dsv4_proj)p, &v, err))) {
                ms[p].v = v;
                ms[p].read = true;
            }
        }
        if (!st && (r->alt & DSV4_ALT_TP2_FP4_SCALES) && expert != DSV4_SHARED_EXPERT && !ms[p].alt_s &&
            ms[p].v.format == DSV4_FORMAT_FP4)
            st = misalign_scales(&ms[p], p, err);
    }
    pthread_mutex_unlock((pthread_mutex_t *)&r->read_mu);
    return st;
}

void dsv4_ref_free(dsv4_ref *r)
{
    if (!r)
        return;
    if (r->experts) {
        for (int64_t i = 0; i < 3 * r->cfg.n_routed_experts; i++) {
            free(r->experts[i].owned_q);
            free(r->experts[i].owned_s);
            free(r->experts[i].alt_s);
        }
        free(r->experts);
    }
    for (int p = 0; p < 3; p++) {
        free(r->shared[p].owned_q);
        free(r->shared[p].owned_s);
    }
    dsv4_router_tensors_release(&r->rt, NULL);
    if (r->mu_init)
        pthread_mutex_destroy(&r->read_mu);
    free(r);
}

const dsv4_config *dsv4_ref_config(const dsv4_ref *r) { return r ? &r->cfg : NULL; }

dsv4_status dsv4_ref_create(const dsv4_config *cfg, const dsv4_checkpoint *ck, int threads, dsv4_ref **out,
                            dsv4_error *err)
{
    if (!cfg || !ck || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref", "config, checkpoint and output must not be NULL");
    *out = NULL;
    if (threads < 1 || threads > 256)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref", "threads %d is outside [1, 256]", threads);
    dsv4_status st = dsv4_config_validate(cfg, err);
    if (st)
        return st;
    dsv4_ref *r = calloc(1, sizeof *r);
    if (!r)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "ref", "out of memory");
    r->cfg = *cfg;
    r->threads = threads;
    r->ck = ck;
    if (pthread_mutex_init(&r->read_mu, NULL) != 0) {
        free(r);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "ref", "cannot create a lock");
    }
    r->mu_init = true;
    const dsv4_config *c = &r->cfg;
    int64_t E = c->n_routed_experts;
    if ((st = dsv4_router_tensors_load(ck, c, NULL, &r->rt, err)))
        goto fail;
    r->experts = calloc((size_t)(3 * E), sizeof *r->experts);
    if (!r->experts)
        goto nomem;
    for (int64_t e = 0; e < E; e++)
        for (int p = 0; p < 3; p++)
            if ((st = bind_matrix(r, ck, e, p, &r->experts[3 * e + p], err)))
                goto fail;
    if (c->n_shared_experts > 0)
        for (int p = 0; p < 3; p++)
            if ((st = bind_matrix(r, ck, DSV4_SHARED_EXPERT, p, &r->shared[p], err)))
                goto fail;
    *out = r;
    return DSV4_OK;
nomem:
    st = dsv4_seterr(err, DSV4_ERR_NOMEM, "ref", "out of memory binding layer %lld", (long long)c->layer);
fail:
    dsv4_ref_free(r);
    return st;
}

/* ---------------- forward ---------------- */

typedef struct {
    const dsv4_ref *r;
    const float *xf;     /* [T, H] */
    const int32_t *in_ids;
    int32_t *ids;        /* [T, K] */
    float *w;            /* [T, K] */
    int32_t *kept;       /* [T] */
    unsigned char *nonfinite; /* [T] */
    atomic_int failed;   /* a worker could not allocate its scratch */
} route_job;

/* DSV4_ALT_HASH_FIRST_ID, _HASH_IDS_BF16: a hash token's ids into out [K]. An id past E-1 (a bf16
   rounding up) is gathered at E-1 by route_select and marked in past[k]: the caller makes it E. */
static const int32_t *alternate_hash_ids(const dsv4_ref *r, int32_t in_id, int32_t *out, bool *past)
{
    int64_t K = r->cfg.n_activated, E = r->cfg.n_routed_experts;
    const int32_t *row = r->rt.tid2eid + (int64_t)((r->alt & DSV4_ALT_HASH_FIRST_ID) ? 0 : in_id) * K;
    for (int64_t k = 0; k < K; k++) {
        int64_t v = (r->alt & DSV4_ALT_HASH_IDS_BF16) ? (int64_t)dsv4_round_bf16((float)row[k]) : row[k];
        past[k] = v >= E;
        out[k] = (int32_t)(past[k] ? E - 1 : v);
    }
    return out;
}

/* The weight alternates, after route_select. */
static void alternate_weights(const dsv4_ref *r, bool hash, const float *s, const int32_t *ids, float *w)
{
    const dsv4_config *c = &r->cfg;
    int64_t K = c->n_activated;
    bool bias = !hash && (r->alt & DSV4_ALT_BIAS_IN_WEIGHTS) && r->rt.bias;
    if ((r->alt & DSV4_ALT_WEIGHTS_UNNORMALIZED) || bias) {
        float sum = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            w[k] = s[ids[k]] + (bias ? r->rt.bias[ids[k]] : 0.0f);
            sum += w[k];
        }
        bool norm = c->score_func != DSV4_SCORE_SOFTMAX && !(r->alt & DSV4_ALT_WEIGHTS_UNNORMALIZED);
        for (int64_t k = 0; k < K; k++)
            w[k] = (norm ? w[k] / (sum + c->norm_eps) : w[k]) * c->route_scale;
    }
    if (hash && (r->alt & DSV4_ALT_HASH_UNIFORM))
        for (int64_t k = 0; k < K; k++)
            w[k] = c->route_scale / (float)K;
}

static void route_tokens(void *p, int64_t b, int64_t e)
{
    route_job *j = p;
    const dsv4_ref *r = j->r;
    const dsv4_config *c = &r->cfg;
    int64_t E = c->n_routed_experts, H = c->dim, K = c->n_activated;
    float *l = malloc((size_t)(2 * E + K) * sizeof *l);
    if (!l) {
        atomic_store(&j->failed, 1);
        return;
    }
    float *s = l + E, *norms = l + 2 * E;
    bool hash = dsv4_config_is_hash_layer(c);
    for (int64_t t = b; t < e; t++) {
        const float *x = j->xf + t * H;
        int32_t *ids = j->ids + t * K;
        float *w = j->w + t * K;
        bool finite = true;
        for (int64_t ex = 0; ex < E; ex++) {
            l[ex] = dsv4_ref_dot(x, r->rt.gate + ex * H, H);
            if (c->gate_logits == DSV4_GATE_LOGITS_BF16)
                l[ex] = dsv4_round_bf16(l[ex]);
            finite = finite && isfinite(l[ex]);
        }
        if (finite) {
            dsv4_ref_scores(c, l, s);
            const int32_t *hid = hash ? r->rt.tid2eid + (int64_t)j->in_ids[t] * K : NULL;
            int32_t alt_ids[K > 0 ? K : 1];
            bool past[K > 0 ? K : 1];
            memset(past, 0, sizeof past);
            if (hash && r->alt)
                hid = alternate_hash_ids(r, j->in_ids[t], alt_ids, past);
            dsv4_route_select(c, s, r->rt.bias, hid, ids, w);
            if (r->alt)
                alternate_weights(r, hash, s, ids, w);
            for (int64_t k = 0; k < K; k++)
                if (past[k])
                    ids[k] = (int32_t)E;
            /* Finite logits so negative that every selected score underflows to 0 give 0/0
               weights: such a row takes the fallback too rather than poisoning its output. */
            for (int64_t k = 0; k < K; k++)
                finite = finite && isfinite(w[k]);
        }
        if (j->nonfinite)
            j->nonfinite[t] = !finite;
        if (!finite) {
            for (int64_t k = 0; k < K; k++) {
                ids[k] = (int32_t)k;
                w[k] = c->route_scale / (float)K;
            }
            if (j->kept)
                j->kept[t] = (int32_t)K;
            continue;
        }
        int kept = (int)K;
        if (!hash && c->top_p < 1.0f) {
            for (int64_t k = 0; k < K; k++) {
                int32_t ex = ids[k];
                if (c->top_p_predictor == DSV4_PREDICTOR_CONST)
                    norms[k] = r->rt.pred_norm[ex];
                else if (c->top_p_predictor == DSV4_PREDICTOR_LINEAR) {
                    float v = dsv4_ref_dot(r->rt.pred_w + (int64_t)ex * H, x, H) + r->rt.pred_b[ex];
                    norms[k] = v > 0.0f ? v : 0.0f;
                } else
                    norms[k] = 1.0f;
            }
            float w0[K > 0 ? K : 1];
            memcpy(w0, w, (size_t)K * sizeof *w);
            kept = dsv4_route_top_p(c, ids, w, norms);
            for (int64_t k = 0; k < K && (r->alt & DSV4_ALT_PRUNED_AS_EXPERT0); k++)
                if (ids[k] == (int32_t)E) {
                    ids[k] = 0;
                    w[k] = w0[k];
                }
        }
        if (j->kept)
            j->kept[t] = kept;
    }
    free(l);
}

dsv4_status dsv4_ref_check_ids(const dsv4_ref *r, int64_t T, const int32_t *in_ids, dsv4_error *err)
{
    return dsv4_router_check_input_ids(&r->cfg, r->rt.tid2eid, T, in_ids, "ref forward", err);
}

dsv4_status dsv4_ref_route(const dsv4_ref *r, int threads, int64_t T, const float *xf, const int32_t *in_ids,
                           int32_t *ids, float *w, int32_t *kept, unsigned char *nonfinite, dsv4_error *err)
{
    dsv4_status st = dsv4_ref_check_ids(r, T, in_ids, err);
    if (st)
        return st;
    route_job rj = {r, xf, in_ids, ids, w, kept, nonfinite, 0};
    atomic_init(&rj.failed, 0);
    dsv4_parallel_for(threads, T, 1, route_tokens, &rj);
    if (atomic_load(&rj.failed))
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "ref forward", "out of memory routing %lld tokens", (long long)T);
    return DSV4_OK;
}

/* One FFN (routed expert or shared) over n rows, on intermediate rows [i0, i0 + ni). */
typedef struct {
    const dsv4_config *c;
    dsv4_rounding rnd;
    const matrix *m;         /* w1, w3, w2 */
    bool clamp;
    unsigned alt;            /* the handle's dsv4_ref_alternate bits */
    const float *xq;         /* [n, H] activations as this FFN's GEMMs see them */
    const float *tw;         /* router weight per row (NULL: weight 1, shared) */
    int64_t n, i0, ni;
    float *h;                /* [n, ni] */
    float *out;              /* [n, H] */
    /* Tiled runs (n >= TILE_MIN_ROWS): xq and h transposed into blocks of DSV4_REF_TB rows
       (dsv4_ref_block_tokens); NULL otherwise. */
    double *xt, *ht;
    uint64_t *gclamp, *uclamp; /* per chunk of ni, summed after the join */
    atomic_bool nomem;       /* a worker could not allocate its weight rows */
} ffn_job;

/* Weight rows are dequantized to fp32 this many at a time, by the worker that uses them, and
   each one is used for every row of the FFN before the next chunk. */
#define ROWS_PER_CHUNK 64
/* From this many rows an FFN runs its dot products in tiles (dsv4_ref_dot_tile): the same
   bits either way, but a tile computes DSV4_REF_TB rows at once, so for fewer rows its
   padding costs more than the one-at-a-time dot. */
#define TILE_MIN_ROWS 3
/* A tiled pass reads the activations of this many rows (1 MB of doubles at H = 4096, held in
   L2) against each weight row of a chunk. */
#define TILE_PASS_ROWS (4 * DSV4_REF_TB)

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* g, u (the fp32 dot products), clamp, silu, router weight before w2: h[q, i], rounded where
   the profile rounds (SPEC.md sections 4 and 10.1). */
static void up_value(ffn_job *j, int64_t q, int64_t i, float gd, float ud, uint64_t *gc, uint64_t *uc)
{
    const dsv4_config *c = j->c;
    float L = c->swiglu_limit;
    bool fp32 = j->rnd == DSV4_ROUNDING_FP32, ops = j->rnd == DSV4_ROUNDING_BF16_OPS;
    float g = fp32 ? gd : dsv4_round_bf16(gd);
    float u = fp32 ? ud : dsv4_round_bf16(ud);
    if (j->clamp && L > 0.0f && !(j->alt & (DSV4_ALT_GATE_CLAMP_BOTH_SIDES | DSV4_ALT_UP_CLAMP_ONE_SIDE)))
        dsv4_swiglu_clamp(&g, &u, L, gc, uc);
    else if (j->clamp && L > 0.0f) { /* the clamp of another form; not counted */
        g = g > L ? L : g;
        g = (j->alt & DSV4_ALT_GATE_CLAMP_BOTH_SIDES) && g < -L ? -L : g;
        u = u > L ? L : u;
        u = !(j->alt & DSV4_ALT_UP_CLAMP_ONE_SIDE) && u < -L ? -L : u;
    }
    float s = dsv4_ref_siluf(g);
    if (ops)
        s = dsv4_round_bf16(s);
    float h = s * u;
    if (ops)
        h = dsv4_round_bf16(h);
    if (j->tw && c->weight_point == DSV4_WEIGHT_BEFORE_W2)
        h = h * j->tw[q];
    j->h[q * j->ni + i] = fp32 ? h : dsv4_round_bf16(h);
}

/* h[q, i] for i in [b, e) of the shard. */
static void ffn_up(void *p, int64_t b, int64_t e)
{
    ffn_job *j = p;
    int64_t H = j->c->dim;
    uint64_t gc = 0, uc = 0;
    float *w1 = malloc((size_t)(2 * ROWS_PER_CHUNK * H) * sizeof *w1); /* a chunk's w1 rows, then its w3 rows */
    if (!w1) {
        atomic_store(&j->nomem, true);
        return;
    }
    float *w3 = w1 + ROWS_PER_CHUNK * H;
    for (int64_t c0 = b; c0 < e; c0 += ROWS_PER_CHUNK) {
        int64_t c1 = min64(e, c0 + ROWS_PER_CHUNK);
        dsv4_matrix_dequant_rows(&j->m[0].v, j->i0 + c0, c1 - c0, w1);
        dsv4_matrix_dequant_rows(&j->m[1].v, j->i0 + c0, c1 - c0, w3);
        if (!j->xt) {
            for (int64_t q = 0; q < j->n; q++) {
                const float *x = j->xq + q * H;
                for (int64_t i = c0; i < c1; i++)
                    up_value(j, q, i, dsv4_ref_dot(x, w1 + (i - c0) * H, H), dsv4_ref_dot(x, w3 + (i - c0) * H, H),
                             &gc, &uc);
            }
            continue;
        }
        /* Two intermediate rows a tile: their w1 and w3 rows (the last row of an odd chunk twice). */
        for (int64_t p0 = 0; p0 < j->n; p0 += TILE_PASS_ROWS)
            for (int64_t i = c0; i < c1; i += 2) {
                int64_t i2 = i + 1 < c1 ? i + 1 : i;
                const float *w[DSV4_REF_NR] = {w1 + (i - c0) * H, w3 + (i - c0) * H, w1 + (i2 - c0) * H,
                                               w3 + (i2 - c0) * H};
                for (int64_t t0 = p0; t0 < min64(j->n, p0 + TILE_PASS_ROWS); t0 += DSV4_REF_TB) {
                    float d[DSV4_REF_NR * DSV4_REF_TB];
                    dsv4_ref_dot_tile(j->xt + t0 * H, w, H, d);
                    for (int64_t t = 0; t < min64(DSV4_REF_TB, j->n - t0); t++) {
                        up_value(j, t0 + t, i, d[t], d[DSV4_REF_TB + t], &gc, &uc);
                        if (i2 != i)
                            up_value(j, t0 + t, i2, d[2 * DSV4_REF_TB + t], d[3 * DSV4_REF_TB + t], &gc, &uc);
                    }
                }
            }
    }
    free(w1);
    j->gclamp[b / ROWS_PER_CHUNK] = gc;
    j->uclamp[b / ROWS_PER_CHUNK] = uc;
}

/* out[q, r] for the output rows r in [b, e). */
static void ffn_down(void *p, int64_t b, int64_t e)
{
    ffn_job *j = p;
    int64_t I = j->c->moe_inter_dim, H = j->c->dim, ni = j->ni;
    float *w2 = malloc((size_t)(ROWS_PER_CHUNK * I) * sizeof *w2); /* a chunk's rows, all I columns */
    if (!w2) {
        atomic_store(&j->nomem, true);
        return;
    }
    for (int64_t c0 = b; c0 < e; c0 += ROWS_PER_CHUNK) {
        int64_t c1 = min64(e, c0 + ROWS_PER_CHUNK);
        dsv4_matrix_dequant_rows(&j->m[2].v, c0, c1 - c0, w2);
        if (!j->ht) {
            for (int64_t q = 0; q < j->n; q++)
                for (int64_t r = c0; r < c1; r++)
                    j->out[q * H + r] = dsv4_ref_dot(j->h + q * ni, w2 + (r - c0) * I + j->i0, ni);
            continue;
        }
        for (int64_t p0 = 0; p0 < j->n; p0 += TILE_PASS_ROWS)
            for (int64_t r = c0; r < c1; r += DSV4_REF_NR) {
                const float *w[DSV4_REF_NR];
                for (int k = 0; k < DSV4_REF_NR; k++) /* past the chunk: its last row again, not stored */
                    w[k] = w2 + (min64(r + k, c1 - 1) - c0) * I + j->i0;
                for (int64_t t0 = p0; t0 < min64(j->n, p0 + TILE_PASS_ROWS); t0 += DSV4_REF_TB) {
                    float d[DSV4_REF_NR * DSV4_REF_TB];
                    dsv4_ref_dot_tile(j->ht + t0 * ni, w, ni, d);
                    for (int64_t t = 0; t < min64(DSV4_REF_TB, j->n - t0); t++)
                        for (int64_t k = 0; k < min64(DSV4_REF_NR, c1 - r); k++)
                            j->out[(t0 + t) * H + r + k] = d[k * DSV4_REF_TB + t];
                }
            }
    }
    free(w2);
}

/* The row blocks of a tiled FFN: x [n, k] into xt (n rounded up to DSV4_REF_TB rows, x k). */
static void block_rows(const float *x, int64_t n, int64_t k, double *xt)
{
    for (int64_t t0 = 0; t0 < n; t0 += DSV4_REF_TB)
        dsv4_ref_block_tokens(x, n, k, t0, xt + t0 * k);
}

/* The activation quantization of n rows of k values in place: per 1 x 128 block (SPEC.md), or with
   DSV4_ALT_ACT_SCALE_PER_TOKEN / _PER_TENSOR every block of a row quantized with the scale of the
   row's (or all n rows') amax. */
static void act_quant_rows(unsigned alt, float *x, int64_t n, int64_t k, dsv4_act_quant mode)
{
    bool tensor = alt & DSV4_ALT_ACT_SCALE_PER_TENSOR, token = alt & DSV4_ALT_ACT_SCALE_PER_TOKEN;
    if (!tensor && !token) {
        for (int64_t q = 0; q < n; q++)
            dsv4_act_quant_row(x + q * k, k, mode, x + q * k, NULL, NULL);
        return;
    }
    float tmax = 0.0f;
    for (int64_t i = 0; i < n * k && tensor; i++)
        tmax = fabsf(x[i]) > tmax ? fabsf(x[i]) : tmax; /* NaN compares false: not taken */
    for (int64_t q = 0; q < n; q++) {
        float amax = tmax;
        for (int64_t i = 0; i < k && !tensor; i++)
            amax = fabsf(x[q * k + i]) > amax ? fabsf(x[q * k + i]) : amax;
        amax = amax < DSV4_AMAX_FLOOR ? DSV4_AMAX_FLOOR : amax;
        float s = mode == DSV4_ACT_QUANT_UE8M0 ? dsv4_ue8m0_to_f32(dsv4_ue8m0_scale_for(amax, DSV4_E4M3_MAX))
                                               : amax / DSV4_E4M3_MAX;
        for (int64_t i = 0; i < k; i++)
            x[q * k + i] = dsv4_e4m3_to_f32(dsv4_f32_to_e4m3(x[q * k + i] / s)) * s;
    }
}

dsv4_status dsv4_ref_ffn_partial(const dsv4_ref *r, int threads, dsv4_rounding rnd, int64_t expert, int64_t n,
                                 const float *x, const float *w, int64_t i0, int64_t ni, float *out, uint64_t *gclamped,
                                 uint64_t *uclamped, dsv4_error *err)
{
    const dsv4_config *c = &r->cfg;
    int64_t E = c->n_routed_experts, H = c->dim, I = c->moe_inter_dim;
    bool shared = expert == DSV4_SHARED_EXPERT;
    if ((!shared && (expert < 0 || expert >= E)) || (shared && c->n_shared_experts == 0) || i0 < 0 || ni < 0 ||
        i0 + ni > I || n < 0)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref ffn",
                           "expert %lld, rows %lld, intermediate range [%lld, %lld) of %lld", (long long)expert,
                           (long long)n, (long long)i0, (long long)(i0 + ni), (long long)I);
    if (n == 0 || ni == 0) {
        if (n > 0)
            memset(out, 0, (size_t)(n * H) * sizeof *out);
        return DSV4_OK;
    }
    dsv4_status rst = read_expert(r, expert, err);
    if (rst)
        return rst;
    dsv4_weight_format fmt = shared ? c->shared_format : c->routed_format;
    bool quant = fmt != DSV4_FORMAT_BF16 && c->act_quant != DSV4_ACT_QUANT_NONE;
    int64_t chunks = cdiv(ni, ROWS_PER_CHUNK);
    float *xq = malloc((size_t)(n * H) * sizeof *xq);
    float *h = malloc((size_t)(n * ni) * sizeof *h);
    uint64_t *gcl = calloc((size_t)chunks, sizeof *gcl), *ucl = calloc((size_t)chunks, sizeof *ucl);
    bool tiled = n >= TILE_MIN_ROWS;
    int64_t nb = cdiv(n, DSV4_REF_TB) * DSV4_REF_TB;
    double *xt = tiled ? malloc((size_t)(nb * H) * sizeof *xt) : NULL;
    double *ht = tiled ? malloc((size_t)(nb * ni) * sizeof *ht) : NULL;
    dsv4_status st = DSV4_OK;
    if (!xq || !h || !gcl || !ucl || (tiled && (!xt || !ht)))
        goto nomem;
    memcpy(xq, x, (size_t)(n * H) * sizeof *xq);
    if (quant)
        act_quant_rows(r->alt, xq, n, H, c->act_quant);
    bool clamp = shared ? c->shared_clamp && !(r->alt & DSV4_ALT_SHARED_CLAMP_OFF)
                        : !(r->alt & DSV4_ALT_ROUTED_CLAMP_OFF);
    ffn_job j = {.c = c, .rnd = rnd, .m = shared ? r->shared : &r->experts[3 * expert], .clamp = clamp, .alt = r->alt,
                 .xq = xq, .tw = w, .n = n, .i0 = i0, .ni = ni, .h = h, .out = out, .xt = xt, .ht = ht,
                 .gclamp = gcl, .uclamp = ucl};
    atomic_init(&j.nomem, false);
    if (tiled)
        block_rows(xq, n, H, xt);
    dsv4_parallel_for(threads, ni, ROWS_PER_CHUNK, ffn_up, &j);
    if (atomic_load(&j.nomem))
        goto nomem;
    for (int64_t k = 0; k < chunks; k++) {
        *gclamped += gcl[k];
        *uclamped += ucl[k];
    }
    if (quant) /* the down projection's activations; i0 is 128-aligned so the groups are the row's */
        act_quant_rows(r->alt, h, n, ni, c->act_quant);
    if (tiled)
        block_rows(h, n, ni, ht);
    dsv4_parallel_for(threads, H, ROWS_PER_CHUNK, ffn_down, &j);
    if (atomic_load(&j.nomem))
        goto nomem;
done:
    free(xq);
    free(h);
    free(xt);
    free(ht);
    free(gcl);
    free(ucl);
    return st;
nomem:
    st = dsv4_seterr(err, DSV4_ERR_NOMEM, "ref ffn", "out of memory for %lld rows", (long long)n);
    goto done;
}

void dsv4_ref_accumulate(const dsv4_config *c, dsv4_rounding rnd, int64_t H, const float *o, float w, float *y,
                         float *terms)
{
    bool after = c->weight_point == DSV4_WEIGHT_AFTER_W2, ops = rnd == DSV4_ROUNDING_BF16_OPS;
    for (int64_t i = 0; i < H; i++) {
        float v = o[i];
        if (after) {
            v = w * v;
            if (ops)
                v = dsv4_round_bf16(v);
        }
        y[i] += v;
        if (terms)
            terms[i] += fabsf(v);
    }
}

void dsv4_ref_round_rows(float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = dsv4_round_bf16(v[i]);
}

dsv4_status dsv4_ref_forward(dsv4_ref *r, int64_t T, const uint16_t *x, const int32_t *in_ids, dsv4_ref_output *out,
                             dsv4_error *err)
{
    return dsv4_ref_forward_terms(r, T, x, in_ids, out, NULL, err);
}

dsv4_status dsv4_ref_forward_terms(dsv4_ref *r, int64_t T, const uint16_t *x, const int32_t *in_ids,
                                   dsv4_ref_output *out, float *y_terms, dsv4_error *err)
{
    if (!r || !out || !out->y || (T > 0 && !x))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref forward", "handle, x and out->y must not be NULL");
    if (T < 0 || T > DSV4_REF_MAX_TOKENS)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref forward", "token count %lld is outside [0, %d]",
                           (long long)T, DSV4_REF_MAX_TOKENS);
    const dsv4_config *c = &r->cfg;
    dsv4_rounding rnd = r->rounding;
    int64_t E = c->n_routed_experts, H = c->dim, I = c->moe_inter_dim, K = c->n_activated;
    size_t TH = (size_t)(T * H), TK = (size_t)(T * K);
    dsv4_status st = DSV4_OK;
    float *xf = malloc((TH ? TH : 1) * sizeof *xf);
    float *y = calloc(TH ? TH : 1, sizeof *y);
    float *terms = y_terms ? calloc(TH ? TH : 1, sizeof *terms) : NULL;
    int32_t *ids = malloc((TK ? TK : 1) * sizeof *ids);
    float *w = malloc((TK ? TK : 1) * sizeof *w);
    int32_t *kept = malloc((size_t)(T ? T : 1) * sizeof *kept);
    unsigned char *nonfinite = malloc((size_t)(T ? T : 1));
    int64_t *tok = malloc((TK ? TK : 1) * sizeof *tok);
    float *tw = malloc((TK ? TK : 1) * sizeof *tw);
    /* One expert can collect up to T*K rows: a hash table row may name it twice. */
    size_t rows_max = (size_t)(TK > (size_t)T ? TK : (size_t)T);
    float *xg = malloc((rows_max ? rows_max : 1) * (size_t)H * sizeof *xg);
    float *o = malloc((rows_max ? rows_max : 1) * (size_t)H * sizeof *o);
    if (!xf || !y || (y_terms && !terms) || !ids || !w || !kept || !nonfinite || !tok || !tw || !xg || !o) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, "ref forward", "out of memory for %lld tokens", (long long)T);
        goto done;
    }
    dsv4_ref_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.tokens = T;
    for (size_t i = 0; i < TH; i++)
        xf[i] = dsv4_bf16_to_f32(x[i]);
    if ((st = dsv4_ref_route(r, r->threads, T, xf, in_ids, ids, w, kept, nonfinite, err)))
        goto done;
    for (int64_t t = 0; t < T; t++) {
        stats.nonfinite_rows += nonfinite[t];
        stats.kept_slots += kept[t];
    }
    stats.pruned_slots = T * K - stats.kept_slots;

    /* Routed experts in ascending id: each token's y accumulates in that order. */
    for (int64_t ex = 0; ex < E; ex++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < K; k++)
                if (ids[t * K + k] == ex) {
                    tok[n] = t;
                    tw[n] = w[t * K + k];
                    memcpy(xg + n * H, xf + t * H, (size_t)H * sizeof *xg);
                    n++;
                }
        if (!n)
            continue;
        if ((st = dsv4_ref_ffn_partial(r, r->threads, rnd, ex, n, xg, tw, 0, I, o, &stats.routed_g_clamped,
                                       &stats.routed_u_clamped, err)))
            goto done;
        if (rnd != DSV4_ROUNDING_FP32)
            dsv4_ref_round_rows(o, n * H);
        stats.routed_values += (uint64_t)(n * I);
        for (int64_t q = 0; q < n; q++)
            dsv4_ref_accumulate(c, rnd, H, o + q * H, tw[q], y + tok[q] * H, terms ? terms + tok[q] * H : NULL);
    }
    if (c->n_shared_experts > 0 && T > 0) {
        if ((st = dsv4_ref_ffn_partial(r, r->threads, rnd, DSV4_SHARED_EXPERT, T, xf, NULL, 0, I, o,
                                       &stats.shared_g_clamped, &stats.shared_u_clamped, err)))
            goto done;
        if (rnd != DSV4_ROUNDING_FP32)
            dsv4_ref_round_rows(o, (int64_t)TH);
        for (size_t i = 0; i < TH && (r->alt & DSV4_ALT_SHARED_ROUTE_SCALED); i++)
            o[i] = rnd == DSV4_ROUNDING_BF16_OPS ? dsv4_round_bf16(o[i] * c->route_scale) : o[i] * c->route_scale;
        stats.shared_values = (uint64_t)(T * I);
        for (size_t i = 0; i < TH; i++) {
            y[i] += o[i];
            if (terms)
                terms[i] += fabsf(o[i]);
        }
    }
    for (size_t i = 0; i < TH; i++)
        out->y[i] = dsv4_f32_to_bf16(y[i]);
    if (out->topk_ids)
        memcpy(out->topk_ids, ids, TK * sizeof *ids);
    if (out->topk_weights)
        memcpy(out->topk_weights, w, TK * sizeof *w);
    if (out->kept_counts)
        memcpy(out->kept_counts, kept, (size_t)T * sizeof *kept);
    if (y_terms)
        memcpy(y_terms, terms, TH * sizeof *terms);
    out->stats = stats;
done:
    free(xf);
    free(y);
    free(terms);
    free(ids);
    free(w);
    free(kept);
    free(nonfinite);
    free(tok);
    free(tw);
    free(xg);
    free(o);
    return st;
}

uint64_t dsv4_ref_hash(const dsv4_config *c, int64_t T, const dsv4_ref_output *out)
{
    uint64_t h = DSV4_FNV_OFFSET;
    if (!c || !out || T < 0)
        return h;
    if (out->y)
        h = dsv4_fnv1a(h, out->y, (size_t)(T * c->dim) * sizeof *out->y);
    if (out->topk_ids)
        h = dsv4_fnv1a(h, out->topk_ids, (size_t)(T * c->n_activated) * sizeof *out->topk_ids);
    if (out->topk_weights)
        h = dsv4_fnv1a(h, out->topk_weights, (size_t)(T * c->n_activated) * sizeof *out->topk_weights);
    return h;
}

/* ---------------- the stages (dsv4moe/ref.h) ---------------- */

dsv4_status dsv4_ref_stage_route(const dsv4_ref *r, int64_t n, const uint16_t *x, const int32_t *in_ids, int32_t *ids,
                                 float *w, int32_t *kept, uint64_t *nonfinite_rows, dsv4_error *err)
{
    if (!r || n < 0 || (n > 0 && (!x || !ids || !w)))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref route", "handle, x, ids and w must not be NULL");
    int64_t H = r->cfg.dim;
    float *xf = malloc((size_t)(n * H + 1) * sizeof *xf);
    unsigned char *nf = malloc((size_t)n + 1);
    dsv4_status st = DSV4_OK;
    if (!xf || !nf) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, "ref route", "out of memory for %lld tokens", (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n * H; i++)
        xf[i] = dsv4_bf16_to_f32(x[i]);
    if ((st = dsv4_ref_route(r, r->threads, n, xf, in_ids, ids, w, kept, nf, err)))
        goto done;
    if (nonfinite_rows)
        for (int64_t t = 0; t < n; t++)
            *nonfinite_rows += nf[t];
done:
    free(xf);
    free(nf);
    return st;
}

dsv4_status dsv4_ref_stage_experts(const dsv4_ref *r, int64_t m, const uint16_t *x, const int32_t *expert,
                                   const float *w, int64_t i0, int64_t ni, float *out, dsv4_ref_stats *stats,
                                   dsv4_error *err)
{
    if (!r || m < 0 || (m > 0 && (!x || !expert || !out)))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref experts", "handle, x, expert and out must not be NULL");
    const dsv4_config *c = &r->cfg;
    int64_t H = c->dim;
    float *xf = malloc((size_t)(m * H + 1) * sizeof *xf);
    if (!xf)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "ref experts", "out of memory for %lld rows", (long long)m);
    for (int64_t i = 0; i < m * H; i++)
        xf[i] = dsv4_bf16_to_f32(x[i]);
    dsv4_ref_stats dummy;
    memset(&dummy, 0, sizeof dummy);
    if (!stats)
        stats = &dummy;
    dsv4_status st = DSV4_OK;
    for (int64_t a = 0; a < m && !st;) {
        int64_t b = a, e = expert[a];
        while (b < m && expert[b] == e)
            b++;
        bool shared = e == DSV4_SHARED_EXPERT;
        if (shared && w)
            st = dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref experts", "the shared expert takes no router weights");
        else
            st = dsv4_ref_ffn_partial(r, r->threads, DSV4_ROUNDING_SPEC, e, b - a, xf + a * H, shared ? NULL : w + a, i0, ni, out + a * H,
                                      shared ? &stats->shared_g_clamped : &stats->routed_g_clamped,
                                      shared ? &stats->shared_u_clamped : &stats->routed_u_clamped, err);
        a = b;
    }
    free(xf);
    return st;
}

dsv4_status dsv4_ref_stage_combine(const dsv4_ref *r, int64_t n, int64_t ns, const int32_t *tok, const float *w,
                                   const uint16_t *o, const uint16_t *shared, uint16_t *y, dsv4_error *err)
{
    if (!r || n < 0 || ns < 0 || (ns > 0 && (!tok || !w || !o)) || (n > 0 && !y))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref combine", "handle, slots and y must not be NULL");
    const dsv4_config *c = &r->cfg;
    int64_t H = c->dim;
    float *acc = calloc((size_t)(n * H + 1), sizeof *acc);
    float *row = malloc((size_t)H * sizeof *row);
    if (!acc || !row) {
        free(acc);
        free(row);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "ref combine", "out of memory for %lld tokens", (long long)n);
    }
    dsv4_status st = DSV4_OK;
    for (int64_t s = 0; s < ns; s++) {
        if (tok[s] < 0 || tok[s] >= n) {
            st = dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "ref combine", "slot %lld names token %d outside [0, %lld)",
                             (long long)s, tok[s], (long long)n);
            break;
        }
        for (int64_t h = 0; h < H; h++)
            row[h] = dsv4_bf16_to_f32(o[s * H + h]);
        dsv4_ref_accumulate(c, DSV4_ROUNDING_SPEC, H, row, w[s], acc + (int64_t)tok[s] * H, NULL);
    }
    if (!st)
        for (int64_t i = 0; i < n * H; i++)
            y[i] = dsv4_f32_to_bf16(shared ? acc[i] + dsv4_bf16_to_f32(shared[i]) : acc[i]);
    free(acc);
    free(row);
    return st;
}

/* ---------------- rounding profiles (SPEC.md section 10) ---------------- */

static const char *const ROUNDING_NAMES[DSV4_ROUNDING_COUNT] = {"spec", "bf16_ops", "fp32"};

const char *dsv4_rounding_name(dsv4_rounding v) { return (unsigned)v < DSV4_ROUNDING_COUNT ? ROUNDING_NAMES[v] : NULL; }

dsv4_status dsv4_rounding_parse(const char *s, dsv4_rounding *out, dsv4_error *err)
{
    for (int i = 0; s && i < DSV4_ROUNDING_COUNT; i++)
        if (!strcmp(s, ROUNDING_NAMES[i])) {
            if (out)
                *out = (dsv4_rounding)i;
            return DSV4_OK;
        }
    return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "rounding", "'%s' is not a rounding profile (spec, bf16_ops, fp32)",
                       s ? s : "(null)");
}

dsv4_status dsv4_ref_set_rounding(dsv4_ref *r, dsv4_rounding v, dsv4_error *err)
{
    if (!r)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "rounding", "handle must not be NULL");
    if (!dsv4_rounding_name(v))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "rounding", "profile %d is outside [0, %d)", (int)v,
                           DSV4_ROUNDING_COUNT);
    r->rounding = v;
    return DSV4_OK;
}

dsv4_rounding dsv4_ref_rounding(const dsv4_ref *r) { return r ? r->rounding : DSV4_ROUNDING_SPEC; }

dsv4_status dsv4_ref_set_alternates(dsv4_ref *r, unsigned alt, dsv4_error *err)
{
    if (!r)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "alternates", "handle must not be NULL");
    if (alt & ~DSV4_ALT_ALL)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "alternates", "bits 0x%x are not dsv4_ref_alternate values",
                           alt & ~DSV4_ALT_ALL);
    r->alt = alt;
    return DSV4_OK;
}
