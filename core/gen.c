#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/rng.h"
#include "dsv4moe/weights.h"
#include "core/err.h"
#include "core/grow.h"
#include "core/parallel.h"

void dsv4_gen_options_init(dsv4_gen_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->seed = 1;
    o->threads = 1;
    o->layout = DSV4_LAYOUT_SPLIT;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* 1 in 64 hidden channels carries an outlier scale, as LLM activations do. */
static float channel_scale(uint64_t seed, int64_t h)
{
    return dsv4_rng_uniform(dsv4_rng_key(seed, "input.channel_scale"), (uint64_t)h) < (1.0f / 64.0f) ? 4.0f : 1.0f;
}

/* Expected rms of x: sqrt(1 + 15/64). Used to aim g and u at a std of about 4. */
#define X_RMS 1.1102f
#define GU_STD 4.0f

/* ---------------- tensor plan ---------------- */

typedef enum { T_GATE, T_BIAS, T_TID, T_PNORM, T_PW, T_PB, T_MAT, T_SCALE, T_GATEUP, T_DOWN } tkind;

typedef struct {
    tkind kind;
    int64_t expert; /* T_MAT / T_SCALE; DSV4_SHARED_EXPERT for the shared one */
    dsv4_proj proj;
} tdesc;

typedef struct {
    const dsv4_config *c;
    const dsv4_gen_options *o;
    tdesc *t;
    size_t n, cap;
    /* Scales of the matrix just written, consumed by the next T_SCALE tensor. */
    uint8_t *pending_scale;
    uint64_t pending_bytes;
    float *mat; /* fp32 scratch of the largest matrix */
    uint64_t total, done; /* the layer's data bytes, those written: the progress callback's */
} gen_ctx;

static dsv4_status push(gen_ctx *g, tkind k, int64_t e, dsv4_proj p, dsv4_error *err)
{
    tdesc *t = dsv4_grow(g->t, &g->cap, g->n + 1, sizeof *t, 64);
    if (!t)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "gen", "out of memory planning the tensors");
    g->t = t;
    g->t[g->n++] = (tdesc){k, e, p};
    return DSV4_OK;
}

typedef struct {
    uint64_t key;
    float sigma;
    int64_t k;
    float *out;
} fill_rows;

static void fill_normal_rows(void *p, int64_t b, int64_t e)
{
    fill_rows *f = p;
    for (int64_t r = b; r < e; r++)
        for (int64_t j = 0; j < f->k; j++)
            f->out[r * f->k + j] = dsv4_rng_normal(f->key, (uint64_t)(r * f->k + j)) * f->sigma;
}

/* The fp32 values of one expert matrix, identical for every layout and format. */
static void matrix_values(const gen_ctx *g, int64_t expert, dsv4_proj proj, float *out)
{
    const dsv4_config *c = g->c;
    static const char *pn[] = {"w1", "w3", "w2"};
    char name[128];
    if (expert == DSV4_SHARED_EXPERT)
        snprintf(name, sizeof name, "layers.%lld.shared_experts.%s", (long long)c->layer, pn[proj]);
    else
        snprintf(name, sizeof name, "layers.%lld.experts.%lld.%s", (long long)c->layer, (long long)expert, pn[proj]);
    int64_t n = proj == DSV4_PROJ_W2 ? c->dim : c->moe_inter_dim;
    int64_t k = proj == DSV4_PROJ_W2 ? c->moe_inter_dim : c->dim;
    float factor = 1.0f;
    if (expert != DSV4_SHARED_EXPERT) {
        char fname[64];
        snprintf(fname, sizeof fname, "layers.%lld.expert_factor", (long long)c->layer);
        factor = 0.8f + 0.4f * dsv4_rng_uniform(dsv4_rng_key(g->o->seed, fname), (uint64_t)expert);
    }
    float sigma = proj == DSV4_PROJ_W2 ? 0.5f / sqrtf((float)k) : GU_STD / (X_RMS * sqrtf((float)k));
    fill_rows f = {dsv4_rng_key(g->o->seed, name), sigma * factor, k, out};
    dsv4_parallel_for(g->o->threads, n, 128, fill_normal_rows, &f);
}

typedef struct {
    const float *w;
    int64_t n, k;
    dsv4_weight_format fmt;
    dsv4_scale_format sfmt;
    uint8_t *q, *s;
    dsv4_status st;
    dsv4_error err;
    const char *name;
    pthread_mutex_t mu; /* guards st and err */
} quant_job;

static void quant_rows(void *p, int64_t b, int64_t e)
{
    quant_job *j = p;
    int64_t rows = e - b;
    dsv4_error err;
    dsv4_status st = DSV4_OK;
    if (j->fmt == DSV4_FORMAT_FP8) {
        size_t ssz = j->sfmt == DSV4_SCALE_FP32 ? 4 : 1;
        st = dsv4_quant_fp8_block(j->w + b * j->k, rows, j->k, j->sfmt, j->q + b * j->k,
                                  j->s + (size_t)(b / 128) * (size_t)cdiv(j->k, 128) * ssz, j->name, &err);
    } else if (j->fmt == DSV4_FORMAT_FP4) {
        st = dsv4_quant_fp4_block(j->w + b * j->k, rows, j->k, j->q + b * j->k / 2, j->s + b * (j->k / 32), j->name,
                                  &err);
    } else {
        for (int64_t i = b * j->k; i < e * j->k; i++) {
            uint16_t v = dsv4_f32_to_bf16(j->w[i]);
            j->q[2 * i] = (uint8_t)(v & 0xff);
            j->q[2 * i + 1] = (uint8_t)(v >> 8);
        }
    }
    if (st) { /* generated values are finite, so this is a bug guard */
        pthread_mutex_lock(&j->mu);
        if (j->st == DSV4_OK) {
            j->st = st;
            j->err = err;
        }
        pthread_mutex_unlock(&j->mu);
    }
}

static uint64_t scale_bytes(const dsv4_config *c, int64_t n, int64_t k, dsv4_weight_format f)
{
    if (f == DSV4_FORMAT_FP8)
        return (uint64_t)(cdiv(n, 128) * cdiv(k, 128)) * (c->weight_scale == DSV4_SCALE_FP32 ? 4u : 1u);
    if (f == DSV4_FORMAT_FP4)
        return (uint64_t)(n * (k / 32));
    return 0;
}

static void put_f32(uint8_t *buf, int64_t i, float v) { memcpy(buf + 4 * i, &v, 4); }
static void put_i32(uint8_t *buf, int64_t i, int32_t v) { memcpy(buf + 4 * i, &v, 4); }
static void put_bf16(uint8_t *buf, int64_t i, float v)
{
    uint16_t b = dsv4_f32_to_bf16(v);
    buf[2 * i] = (uint8_t)(b & 0xff);
    buf[2 * i + 1] = (uint8_t)(b >> 8);
}

/* The random stream of the layer's tensor layers.<layer>.<what>. */
static uint64_t layer_key(const gen_ctx *g, const char *what)
{
    char key[96];
    snprintf(key, sizeof key, "layers.%lld.%s", (long long)g->c->layer, what);
    return dsv4_rng_key(g->o->seed, key);
}

/* n fp32 values lo + span u, u uniform in [0, 1) from the stream k. */
static void put_uniform(uint8_t *buf, uint64_t k, int64_t n, float lo, float span)
{
    for (int64_t i = 0; i < n; i++)
        put_f32(buf, i, lo + span * dsv4_rng_uniform(k, (uint64_t)i));
}

static dsv4_status fill_tensor_data(void *user, size_t index, const char *name, void *vbuf, uint64_t nbytes,
                                    dsv4_error *err)
{
    gen_ctx *g = user;
    const dsv4_config *c = g->c;
    const tdesc *t = &g->t[index];
    uint8_t *buf = vbuf;
    int64_t E = c->n_routed_experts, H = c->dim, I = c->moe_inter_dim;
    switch (t->kind) {
    case T_GATE: {
        uint64_t k = layer_key(g, "gate");
        float sigma = 1.0f / sqrtf((float)H);
        for (int64_t i = 0; i < E * H; i++)
            put_bf16(buf, i, dsv4_rng_normal(k, (uint64_t)i) * sigma);
        break;
    }
    case T_BIAS: {
        uint64_t k = layer_key(g, "bias");
        for (int64_t e = 0; e < E; e++)
            put_f32(buf, e, dsv4_rng_normal(k, (uint64_t)e) * 0.1f);
        break;
    }
    case T_TID: {
        uint64_t k = layer_key(g, "tid2eid");
        int32_t *perm = malloc((size_t)E * sizeof *perm);
        if (!perm)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, name, "out of memory");
        int64_t K = c->n_activated;
        int64_t *swapped = malloc((size_t)K * sizeof *swapped);
        if (!swapped) {
            free(perm);
            return dsv4_seterr(err, DSV4_ERR_NOMEM, name, "out of memory");
        }
        for (int64_t e = 0; e < E; e++)
            perm[e] = (int32_t)e;
        for (int64_t v = 0; v < c->vocab_size; v++) {
            /* A partial Fisher-Yates shuffle: K distinct experts per token id; the swaps are
               undone afterwards so each row starts from the identity in O(K). */
            for (int64_t j = 0; j < K; j++) {
                int64_t r = j + dsv4_rng_below(k, (uint64_t)(v * E + j), (uint32_t)(E - j));
                int32_t tmp = perm[j];
                perm[j] = perm[r];
                perm[r] = tmp;
                swapped[j] = r;
                put_i32(buf, v * K + j, perm[j]);
            }
            for (int64_t j = K - 1; j >= 0; j--) {
                int32_t tmp = perm[j];
                perm[j] = perm[swapped[j]];
                perm[swapped[j]] = tmp;
            }
        }
        free(swapped);
        free(perm);
        break;
    }
    case T_PNORM:
        put_uniform(buf, layer_key(g, "pred_norm"), E, 0.5f, 1.5f);
        break;
    case T_PW: {
        uint64_t k = layer_key(g, "pred_weight");
        float sigma = 0.3f / (X_RMS * sqrtf((float)H));
        for (int64_t i = 0; i < E * H; i++)
            put_f32(buf, i, dsv4_rng_normal(k, (uint64_t)i) * sigma);
        break;
    }
    case T_PB:
        put_uniform(buf, layer_key(g, "pred_bias"), E, 1.0f, 0.5f);
        break;
    case T_MAT: {
        dsv4_weight_format f = t->expert == DSV4_SHARED_EXPERT ? c->shared_format : c->routed_format;
        int64_t n = t->proj == DSV4_PROJ_W2 ? H : I, k = t->proj == DSV4_PROJ_W2 ? I : H;
        matrix_values(g, t->expert, t->proj, g->mat);
        uint64_t sb = scale_bytes(c, n, k, f);
        if (sb > g->pending_bytes) {
            uint8_t *p = realloc(g->pending_scale, sb);
            if (!p)
                return dsv4_seterr(err, DSV4_ERR_NOMEM, name, "out of memory");
            g->pending_scale = p;
        }
        g->pending_bytes = sb;
        quant_job j = {g->mat, n, k, f, c->weight_scale, buf, g->pending_scale, DSV4_OK, {0}, name,
                       PTHREAD_MUTEX_INITIALIZER};
        /* fp8 block rows are 128 high; fp4 and bf16 rows are independent. */
        dsv4_parallel_for(g->o->threads, n, 128, quant_rows, &j);
        pthread_mutex_destroy(&j.mu);
        if (j.st) {
            if (err)
                *err = j.err;
            return j.st;
        }
        break;
    }
    case T_SCALE:
        if (nbytes != g->pending_bytes)
            return dsv4_seterr(err, DSV4_ERR_INTERNAL, name, "scale size %llu does not match its weight (%llu)",
                               (unsigned long long)nbytes, (unsigned long long)g->pending_bytes);
        memcpy(buf, g->pending_scale, nbytes);
        break;
    case T_GATEUP:
    case T_DOWN:
        for (int64_t e = 0; e < E; e++) {
            if (t->kind == T_GATEUP) {
                for (int p = 0; p < 2; p++) {
                    matrix_values(g, e, p ? DSV4_PROJ_W3 : DSV4_PROJ_W1, g->mat);
                    uint8_t *dst = buf + ((uint64_t)e * 2 * (uint64_t)I + (uint64_t)p * (uint64_t)I) * (uint64_t)H * 2;
                    for (int64_t i = 0; i < I * H; i++)
                        put_bf16(dst, i, g->mat[i]);
                }
            } else {
                matrix_values(g, e, DSV4_PROJ_W2, g->mat);
                uint8_t *dst = buf + (uint64_t)e * (uint64_t)H * (uint64_t)I * 2;
                for (int64_t i = 0; i < I * H; i++)
                    put_bf16(dst, i, g->mat[i]);
            }
        }
        break;
    }
    return DSV4_OK;
}

/* One tensor, then the progress callback (when the caller gave one). */
static dsv4_status fill_tensor(void *user, size_t index, const char *name, void *vbuf, uint64_t nbytes,
                               dsv4_error *err)
{
    gen_ctx *g = user;
    dsv4_status st = fill_tensor_data(user, index, name, vbuf, nbytes, err);
    g->done += nbytes;
    if (!st && g->o->struct_size == sizeof *g->o && g->o->progress)
        g->o->progress(g->o->progress_user, g->done, g->total);
    return st;
}

static const char *const proj_split[] = {"w1", "w3", "w2"};
static const char *const proj_stacked[] = {"gate", "up", "down"};

static dsv4_status declare(dsv4_st_writer *w, gen_ctx *g, tkind kind, int64_t e, dsv4_proj p, const char *name,
                           dsv4_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2, dsv4_error *err)
{
    int64_t shape[3] = {d0, d1, d2};
    uint64_t bytes = dsv4_dtype_size(dt);
    for (int i = 0; i < ndim; i++)
        bytes *= (uint64_t)shape[i];
    g->total += bytes;
    dsv4_status st = dsv4_st_writer_add(w, name, dt, ndim, shape, NULL, err);
    return st ? st : push(g, kind, e, p, err);
}

static dsv4_status declare_matrix(dsv4_st_writer *w, gen_ctx *g, int64_t e, dsv4_proj p, dsv4_error *err)
{
    const dsv4_config *c = g->c;
    char base[128], name[160];
    if (e == DSV4_SHARED_EXPERT)
        snprintf(base, sizeof base, "layers.%lld.ffn.shared_experts.%s", (long long)c->layer, proj_split[p]);
    else
        snprintf(base, sizeof base, "layers.%lld.ffn.experts.%lld.%s", (long long)c->layer, (long long)e,
                 proj_split[p]);
    dsv4_weight_format f = e == DSV4_SHARED_EXPERT ? c->shared_format : c->routed_format;
    int64_t n = p == DSV4_PROJ_W2 ? c->dim : c->moe_inter_dim, k = p == DSV4_PROJ_W2 ? c->moe_inter_dim : c->dim;
    dsv4_status st;
    snprintf(name, sizeof name, "%s.weight", base);
    if (f == DSV4_FORMAT_BF16)
        return declare(w, g, T_MAT, e, p, name, DSV4_DTYPE_BF16, 2, n, k, 0, err);
    if (f == DSV4_FORMAT_FP8) {
        if ((st = declare(w, g, T_MAT, e, p, name, DSV4_DTYPE_F8_E4M3, 2, n, k, 0, err)))
            return st;
        snprintf(name, sizeof name, "%s.scale", base);
        return declare(w, g, T_SCALE, e, p, name,
                       c->weight_scale == DSV4_SCALE_FP32 ? DSV4_DTYPE_F32 : DSV4_DTYPE_F8_E8M0, 2, cdiv(n, 128),
                       cdiv(k, 128), 0, err);
    }
    if ((st = declare(w, g, T_MAT, e, p, name, DSV4_DTYPE_I8, 2, n, k / 2, 0, err)))
        return st;
    snprintf(name, sizeof name, "%s.scale", base);
    return declare(w, g, T_SCALE, e, p, name, DSV4_DTYPE_F8_E8M0, 2, n, k / 32, 0, err);
}

static dsv4_status plan_tensors(dsv4_st_writer *w, gen_ctx *g, dsv4_error *err)
{
    const dsv4_config *c = g->c;
    bool stacked = g->o->layout == DSV4_LAYOUT_STACKED;
    const char *pre = stacked && g->o->model_prefix ? "model." : "";
    char ffn[96], name[192];
    snprintf(ffn, sizeof ffn, stacked ? "%slayers.%lld.mlp" : "%slayers.%lld.ffn", pre, (long long)c->layer);
    int64_t E = c->n_routed_experts, H = c->dim, I = c->moe_inter_dim;
    dsv4_status st;
#define DECL(kind, suffix, dt, nd, a, b, cc)                                                                  \
    do {                                                                                                      \
        snprintf(name, sizeof name, "%s.%s", ffn, suffix);                                                   \
        if ((st = declare(w, g, kind, 0, DSV4_PROJ_W1, name, dt, nd, a, b, cc, err)))                         \
            return st;                                                                                        \
    } while (0)
    DECL(T_GATE, "gate.weight", DSV4_DTYPE_BF16, 2, E, H, 0);
    if (dsv4_config_is_hash_layer(c)) {
        DECL(T_TID, "gate.tid2eid", DSV4_DTYPE_I32, 2, c->vocab_size, c->n_activated, 0);
    } else {
        DECL(T_BIAS, stacked ? "gate.e_score_correction_bias" : "gate.bias", DSV4_DTYPE_F32, 1, E, 0, 0);
        if (c->top_p < 1.0f && c->top_p_predictor == DSV4_PREDICTOR_CONST)
            DECL(T_PNORM, "norm_predictor.norm", DSV4_DTYPE_F32, 1, E, 0, 0);
        if (c->top_p < 1.0f && c->top_p_predictor == DSV4_PREDICTOR_LINEAR) {
            DECL(T_PW, "norm_predictor.weight", DSV4_DTYPE_F32, 2, E, H, 0);
            DECL(T_PB, "norm_predictor.bias", DSV4_DTYPE_F32, 1, E, 0, 0);
        }
    }
    if (stacked) {
        DECL(T_GATEUP, "experts.gate_up_proj", DSV4_DTYPE_BF16, 3, E, 2 * I, H);
        DECL(T_DOWN, "experts.down_proj", DSV4_DTYPE_BF16, 3, E, H, I);
        if (c->n_shared_experts > 0)
            for (int p = 0; p < 3; p++) {
                snprintf(name, sizeof name, "%s.shared_experts.%s_proj.weight", ffn, proj_stacked[p]);
                if ((st = declare(w, g, T_MAT, DSV4_SHARED_EXPERT, (dsv4_proj)p, name, DSV4_DTYPE_BF16, 2,
                                  p == DSV4_PROJ_W2 ? H : I, p == DSV4_PROJ_W2 ? I : H, 0, err)))
                    return st;
            }
    } else {
        for (int64_t e = 0; e < E; e++)
            for (int p = 0; p < 3; p++)
                if ((st = declare_matrix(w, g, e, (dsv4_proj)p, err)))
                    return st;
        if (c->n_shared_experts > 0)
            for (int p = 0; p < 3; p++)
                if ((st = declare_matrix(w, g, DSV4_SHARED_EXPERT, (dsv4_proj)p, err)))
                    return st;
    }
#undef DECL
    return DSV4_OK;
}

static dsv4_status check_opts(const dsv4_config *cfg, const dsv4_gen_options *opt, const char *path,
                              dsv4_error *err)
{
    if (!cfg || !opt || !path)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "gen", "config, options and path must not be NULL");
    /* the size before `progress` (callers built without it) still works, without progress */
    if (opt->struct_size != sizeof *opt && opt->struct_size != offsetof(dsv4_gen_options, progress))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "gen options",
                           "struct_size %u is not %zu (initialise with dsv4_gen_options_init)", opt->struct_size,
                           sizeof *opt);
    if (opt->threads < 1 || opt->threads > 256)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "gen option 'threads'", "value %d is outside [1, 256]",
                           opt->threads);
    if (opt->layout != DSV4_LAYOUT_SPLIT && opt->layout != DSV4_LAYOUT_STACKED)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "gen option 'layout'", "must be split or stacked");
    return dsv4_config_validate(cfg, err);
}

dsv4_status dsv4_gen_weights(const dsv4_config *cfg, const dsv4_gen_options *opt, const char *path,
                             dsv4_error *err)
{
    dsv4_status st = check_opts(cfg, opt, path, err);
    if (st)
        return st;
    if (opt->layout == DSV4_LAYOUT_STACKED &&
        (cfg->routed_format != DSV4_FORMAT_BF16 || cfg->shared_format != DSV4_FORMAT_BF16))
        return dsv4_seterr(err, DSV4_ERR_CONFIG, "gen option 'layout'",
                           "the stacked layout holds bf16 weights; set routed_format=bf16 and shared_format=bf16");
    gen_ctx g = {.c = cfg, .o = opt};
    size_t big = (size_t)(cfg->dim * cfg->moe_inter_dim);
    g.mat = malloc(big * sizeof(float));
    dsv4_st_writer *w = NULL;
    if (!g.mat) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory for a %lld x %lld matrix",
                         (long long)cfg->moe_inter_dim, (long long)cfg->dim);
        goto done;
    }
    if ((st = dsv4_st_writer_create(&w, err)) || (st = plan_tensors(w, &g, err)))
        goto done;
    char seed[32], layer[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)opt->seed);
    snprintf(layer, sizeof layer, "%lld", (long long)cfg->layer);
    if ((st = dsv4_st_writer_set_metadata(w, "generator", "dsv4moe gen " DSV4_VERSION, err)) ||
        (st = dsv4_st_writer_set_metadata(w, "seed", seed, err)) ||
        (st = dsv4_st_writer_set_metadata(w, "layer", layer, err)))
        goto done;
    st = dsv4_st_writer_write(w, path, fill_tensor, &g, err);
done:
    dsv4_st_writer_free(w);
    free(g.mat);
    free(g.t);
    free(g.pending_scale);
    return st;
}

typedef struct {
    const dsv4_config *c;
    uint64_t seed;
    int64_t tokens;
} input_ctx;

static dsv4_status fill_input(void *user, size_t index, const char *name, void *vbuf, uint64_t nbytes,
                              dsv4_error *err)
{
    input_ctx *in = user;
    uint8_t *buf = vbuf;
    int64_t H = in->c->dim;
    if (index == 0) {
        uint64_t k = dsv4_rng_key(in->seed, "input.x");
        float *chan = malloc((size_t)H * sizeof *chan);
        if (!chan)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, name, "out of memory");
        for (int64_t h = 0; h < H; h++)
            chan[h] = channel_scale(in->seed, h);
        for (int64_t t = 0; t < in->tokens; t++)
            for (int64_t h = 0; h < H; h++)
                put_bf16(buf, t * H + h, dsv4_rng_normal(k, (uint64_t)(t * H + h)) * chan[h]);
        free(chan);
    } else {
        uint64_t k = dsv4_rng_key(in->seed, "input.ids");
        for (int64_t t = 0; t < in->tokens; t++)
            put_i32(buf, t, (int32_t)dsv4_rng_below(k, (uint64_t)t, (uint32_t)in->c->vocab_size));
    }
    return DSV4_OK;
}

dsv4_status dsv4_gen_input(const dsv4_config *cfg, const dsv4_gen_options *opt, int64_t tokens, const char *path,
                           dsv4_error *err)
{
    dsv4_status st = check_opts(cfg, opt, path, err);
    if (st)
        return st;
    if (tokens < 0 || tokens > (1 << 24))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "gen option 'tokens'", "value %lld is outside [0, 16777216]",
                           (long long)tokens);
    dsv4_st_writer *w = NULL;
    input_ctx in = {cfg, opt->seed, tokens};
    int64_t sx[2] = {tokens, cfg->dim}, si[1] = {tokens};
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)opt->seed);
    if (!(st = dsv4_st_writer_create(&w, err)) && !(st = dsv4_st_writer_add(w, "x", DSV4_DTYPE_BF16, 2, sx, NULL, err)) &&
        !(st = dsv4_st_writer_add(w, "input_ids", DSV4_DTYPE_I32, 1, si, NULL, err)) &&
        !(st = dsv4_st_writer_set_metadata(w, "seed", seed, err)))
        st = dsv4_st_writer_write(w, path, fill_input, &in, err);
    dsv4_st_writer_free(w);
    return st;
}

/* ---------------- clamp probe ---------------- */

dsv4_status dsv4_gen_probe_clamp(const dsv4_checkpoint *ckpt, const dsv4_config *cfg, const dsv4_st_file *input,
                                 int64_t max_tokens, int64_t max_experts, dsv4_clamp_probe *out, dsv4_error *err)
{
    if (!ckpt || !cfg || !input || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "probe", "arguments must not be NULL");
    if (max_tokens < 1 || max_experts < 1)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "probe", "max_tokens %lld and max_experts %lld must be >= 1",
                           (long long)max_tokens, (long long)max_experts);
    dsv4_status st = dsv4_config_validate(cfg, err);
    if (st)
        return st;
    const dsv4_tensor_info *x = dsv4_st_find(input, "x");
    int64_t H = cfg->dim, I = cfg->moe_inter_dim;
    if (!x)
        return dsv4_seterr(err, DSV4_ERR_NOT_FOUND, dsv4_st_path(input), "tensor 'x' is missing");
    if (x->dtype != DSV4_DTYPE_BF16 || x->ndim != 2 || x->shape[1] != H) {
        char where[300];
        snprintf(where, sizeof where, "%s: tensor 'x'", dsv4_st_path(input));
        return dsv4_seterr(err, DSV4_ERR_SHAPE, where, "must be BF16 [T, %lld]", (long long)H);
    }
    int64_t T = x->shape[0] < max_tokens ? x->shape[0] : max_tokens;
    int64_t E = cfg->n_routed_experts < max_experts ? cfg->n_routed_experts : max_experts;
    memset(out, 0, sizeof *out);
    out->tokens = T;
    out->experts = E;
    float *xq = malloc((size_t)(T * H) * sizeof(float));
    float *w = malloc((size_t)(I * H) * sizeof(float));
    if (!xq || !w) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, "probe", "out of memory");
        goto done;
    }
    bool quant = cfg->routed_format != DSV4_FORMAT_BF16;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H; h++)
            xq[t * H + h] = dsv4_load_bf16(x->data, t * H + h);
        if (quant)
            dsv4_act_quant_row(xq + t * H, H, cfg->act_quant, xq + t * H, NULL, NULL);
    }
    float L = cfg->swiglu_limit;
    for (int64_t e = 0; e < E; e++) {
        for (int p = 0; p < 2; p++) {
            dsv4_matrix_view m;
            if ((st = dsv4_weights_matrix(ckpt, cfg, e, p ? DSV4_PROJ_W3 : DSV4_PROJ_W1, &m, err)))
                goto done;
            dsv4_matrix_dequant_rows(&m, 0, I, w);
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < I; i++) {
                    float acc = 0;
                    for (int64_t h = 0; h < H; h++)
                        acc += xq[t * H + h] * w[i * H + h];
                    float v = dsv4_round_bf16(acc);
                    if (p == 0)
                        out->g_clamped += L > 0 && v > L;
                    else
                        out->u_clamped += L > 0 && fabsf(v) > L;
                }
        }
        out->values += (uint64_t)(T * I);
    }
done:
    free(xq);
    free(w);
    return st;
}
