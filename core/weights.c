#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dsv4moe/formats.h"
#include "dsv4moe/weights.h"
#include "core/err.h"
#include "core/testctl.h"

float dsv4_load_bf16(const uint8_t *p, int64_t i)
{
    uint16_t b = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
    return dsv4_bf16_to_f32(b);
}

float dsv4_load_f32(const uint8_t *p, int64_t i)
{
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}

int32_t dsv4_load_i32(const uint8_t *p, int64_t i)
{
    int32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static const char *proj_name(dsv4_proj p) { return p == DSV4_PROJ_W1 ? "w1" : p == DSV4_PROJ_W3 ? "w3" : "w2"; }

static void shape_str(const dsv4_tensor_info *t, char *buf, size_t n)
{
    size_t off = (size_t)snprintf(buf, n, "%s [", dsv4_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (off < n)
        snprintf(buf + off, n - off, "]");
}

/* Looks up `key` and checks dtype and shape; `dtypes` lists the accepted dtypes (COUNT-terminated). */
/* `load`: read the bytes now; else only the contract is checked (dsv4_weights_matrix_view). */
static dsv4_status expect_as(const dsv4_checkpoint *ck, const char *key, const dsv4_dtype *dtypes, int ndim,
                             const int64_t *shape, bool load, const dsv4_tensor_info **out, dsv4_error *err)
{
    const dsv4_tensor_info *t = load ? NULL : dsv4_checkpoint_find_meta(ck, key);
    if (!t) { /* reads it, or says it is missing and where it was searched for */
        dsv4_status gst = dsv4_checkpoint_get(ck, key, &t, err);
        if (gst)
            return gst;
    }
    bool dt_ok = false;
    char want_dt[64] = "";
    for (const dsv4_dtype *d = dtypes; *d != DSV4_DTYPE_COUNT; d++) {
        dt_ok |= t->dtype == *d;
        strncat(want_dt, d == dtypes ? "" : " or ", sizeof want_dt - strlen(want_dt) - 1);
        strncat(want_dt, dsv4_dtype_name(*d), sizeof want_dt - strlen(want_dt) - 1);
    }
    bool sh_ok = t->ndim == ndim;
    for (int i = 0; sh_ok && i < ndim; i++)
        sh_ok = t->shape[i] == shape[i];
    if (!dt_ok || !sh_ok) {
        char got[128], want[128];
        shape_str(t, got, sizeof got);
        size_t off = (size_t)snprintf(want, sizeof want, "%s [", want_dt);
        for (int i = 0; i < ndim && off < sizeof want; i++)
            off += (size_t)snprintf(want + off, sizeof want - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (off < sizeof want)
            snprintf(want + off, sizeof want - off, "]");
        char where[300];
        snprintf(where, sizeof where, "%s: tensor '%s'", t->file, key);
        return dsv4_seterr(err, DSV4_ERR_SHAPE, where, "is %s, expected %s by the [N, K] contract", got, want);
    }
    *out = t;
    return DSV4_OK;
}

static dsv4_status expect(const dsv4_checkpoint *ck, const char *key, const dsv4_dtype *dtypes, int ndim,
                          const int64_t *shape, const dsv4_tensor_info **out, dsv4_error *err)
{
    return expect_as(ck, key, dtypes, ndim, shape, true, out, err);
}

static const dsv4_dtype DT_BF16[] = {DSV4_DTYPE_BF16, DSV4_DTYPE_COUNT};
static const dsv4_dtype DT_F32[] = {DSV4_DTYPE_F32, DSV4_DTYPE_COUNT};
static const dsv4_dtype DT_I32[] = {DSV4_DTYPE_I32, DSV4_DTYPE_COUNT};
static const dsv4_dtype DT_E4M3[] = {DSV4_DTYPE_F8_E4M3, DSV4_DTYPE_COUNT};
static const dsv4_dtype DT_E8M0[] = {DSV4_DTYPE_F8_E8M0, DSV4_DTYPE_COUNT};
static const dsv4_dtype DT_FP4[] = {DSV4_DTYPE_I8, DSV4_DTYPE_U8, DSV4_DTYPE_COUNT};

static dsv4_status matrix_split(const dsv4_checkpoint *ck, const dsv4_config *c, int64_t expert, dsv4_proj proj,
                                bool load, dsv4_matrix_view *m, dsv4_error *err)
{
    char key[160], skey[170];
    if (expert == DSV4_SHARED_EXPERT)
        snprintf(key, sizeof key, "layers.%lld.ffn.shared_experts.%s", (long long)c->layer, proj_name(proj));
    else
        snprintf(key, sizeof key, "layers.%lld.ffn.experts.%lld.%s", (long long)c->layer, (long long)expert,
                 proj_name(proj));
    snprintf(skey, sizeof skey, "%s.scale", key);
    strncat(key, ".weight", sizeof key - strlen(key) - 1);

    dsv4_weight_format fmt = expert == DSV4_SHARED_EXPERT ? c->shared_format : c->routed_format;
    int64_t n = m->n, k = m->k;
    const dsv4_tensor_info *w = NULL, *s = NULL;
    dsv4_status st;
    m->format = fmt;
    m->scale_format = c->weight_scale;
    m->scales = NULL;
    switch (fmt) {
    case DSV4_FORMAT_BF16: {
        int64_t sh[2] = {n, k};
        if ((st = expect_as(ck, key, DT_BF16, 2, sh, load, &w, err)))
            return st;
        m->row_bytes = (uint64_t)k * 2;
        break;
    }
    case DSV4_FORMAT_FP8: {
        int64_t sh[2] = {n, k}, ssh[2] = {cdiv(n, 128), cdiv(k, 128)};
        if ((st = expect_as(ck, key, DT_E4M3, 2, sh, load, &w, err)) ||
            (st = expect_as(ck, skey, c->weight_scale == DSV4_SCALE_FP32 ? DT_F32 : DT_E8M0, 2, ssh, load, &s,
                            err)))
            return st;
        m->row_bytes = (uint64_t)k;
        break;
    }
    case DSV4_FORMAT_FP4: {
        int64_t sh[2] = {n, k / 2}, ssh[2] = {n, k / 32};
        if ((st = expect_as(ck, key, DT_FP4, 2, sh, load, &w, err)) ||
            (st = expect_as(ck, skey, DT_E8M0, 2, ssh, load, &s, err)))
            return st;
        m->row_bytes = (uint64_t)k / 2;
        break;
    }
    }
    m->key = w->name;
    m->data = w->data;
    m->scales = s ? s->data : NULL;
    return DSV4_OK;
}

static dsv4_status matrix_stacked(const dsv4_checkpoint *ck, const dsv4_config *c, int64_t expert,
                                  dsv4_proj proj, bool load, dsv4_matrix_view *m, dsv4_error *err)
{
    const char *p = dsv4_checkpoint_prefix(ck);
    char key[192];
    int64_t H = c->dim, I = c->moe_inter_dim, E = c->n_routed_experts;
    const dsv4_tensor_info *t = NULL;
    dsv4_status st;
    m->format = DSV4_FORMAT_BF16;
    m->scale_format = DSV4_SCALE_UE8M0;
    m->scales = NULL;
    m->row_bytes = (uint64_t)m->k * 2;
    if (expert == DSV4_SHARED_EXPERT) {
        const char *nm = proj == DSV4_PROJ_W1 ? "gate" : proj == DSV4_PROJ_W3 ? "up" : "down";
        snprintf(key, sizeof key, "%slayers.%lld.mlp.shared_experts.%s_proj.weight", p, (long long)c->layer, nm);
        int64_t sh[2] = {m->n, m->k};
        if (DSV4_TESTHOOK(TRANSPOSE_SHARED_2D) && c->shared_format == DSV4_FORMAT_FP8 && c->weight_scale == DSV4_SCALE_FP32)
            sh[0] = m->k, sh[1] = m->n; /* test hook: non-e8m0 online quantization's 2D view as [K, N] */
        if ((st = expect_as(ck, key, DT_BF16, 2, sh, load, &t, err)))
            return st;
        m->data = t->data;
    } else if (proj == DSV4_PROJ_W2) {
        snprintf(key, sizeof key, "%slayers.%lld.mlp.experts.down_proj", p, (long long)c->layer);
        int64_t sh[3] = {E, H, I};
        if ((st = expect_as(ck, key, DT_BF16, 3, sh, load, &t, err)))
            return st;
        m->data = (const uint8_t *)t->data + (uint64_t)expert * (uint64_t)H * (uint64_t)I * 2;
    } else {
        snprintf(key, sizeof key, "%slayers.%lld.mlp.experts.gate_up_proj", p, (long long)c->layer);
        int64_t sh[3] = {E, 2 * I, H};
        if ((st = expect_as(ck, key, DT_BF16, 3, sh, load, &t, err)))
            return st;
        /* Rows [0, I) are the gate (w1), rows [I, 2I) the up projection (w3). */
        uint64_t row0 = (uint64_t)expert * 2 * (uint64_t)I + (proj == DSV4_PROJ_W3 ? (uint64_t)I : 0);
        m->data = (const uint8_t *)t->data + row0 * (uint64_t)H * 2;
    }
    m->key = t->name;
    return DSV4_OK;
}

/* A shape mismatch names the config values that set the expected shapes (a file made for another
   preset is the usual cause). */
static dsv4_status shape_hint(const dsv4_config *c, dsv4_status st, dsv4_error *err)
{
    if (st == DSV4_ERR_SHAPE && err && c) {
        size_t len = strlen(err->message);
        snprintf(err->message + len, sizeof err->message - len,
                 "; the config sets dim %lld, moe_inter_dim %lld, n_routed_experts %lld (its preset or --set; the "
                 "file's own shapes: dsv4moe inspect)",
                 (long long)c->dim, (long long)c->moe_inter_dim, (long long)c->n_routed_experts);
    }
    return st;
}

static dsv4_status weights_matrix(const dsv4_checkpoint *ck, const dsv4_config *c, int64_t expert, dsv4_proj proj,
                                  bool load, dsv4_matrix_view *out, dsv4_error *err)
{
    if (!ck || !c || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "weights", "checkpoint, config and output must not be NULL");
    dsv4_status vst = dsv4_config_validate(c, err);
    if (vst)
        return vst;
    if (expert != DSV4_SHARED_EXPERT && (expert < 0 || expert >= c->n_routed_experts))
        return dsv4_seterr(err, DSV4_ERR_RANGE, "weights", "expert id %lld is outside [0, %lld)",
                           (long long)expert, (long long)c->n_routed_experts);
    if (expert == DSV4_SHARED_EXPERT && c->n_shared_experts == 0)
        return dsv4_seterr(err, DSV4_ERR_NOT_FOUND, "weights", "the config has no shared expert (n_shared_experts = 0)");
    dsv4_matrix_view m;
    memset(&m, 0, sizeof m);
    m.n = proj == DSV4_PROJ_W2 ? c->dim : c->moe_inter_dim;
    m.k = proj == DSV4_PROJ_W2 ? c->moe_inter_dim : c->dim;
    dsv4_status st;
    switch (dsv4_checkpoint_layout(ck)) {
    case DSV4_LAYOUT_SPLIT: st = matrix_split(ck, c, expert, proj, load, &m, err); break;
    case DSV4_LAYOUT_STACKED: st = matrix_stacked(ck, c, expert, proj, load, &m, err); break;
    default:
        return dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_checkpoint_file_count(ck) ? dsv4_checkpoint_file_path(ck, 0) : "checkpoint",
                           "no DSV4 MoE layout detected (neither layers.N.ffn.* nor [model.]layers.N.mlp.* keys)");
    }
    if (st == DSV4_OK)
        *out = m;
    return shape_hint(c, st, err);
}

dsv4_status dsv4_weights_matrix(const dsv4_checkpoint *ck, const dsv4_config *c, int64_t expert, dsv4_proj proj,
                                dsv4_matrix_view *out, dsv4_error *err)
{
    return weights_matrix(ck, c, expert, proj, true, out, err);
}

dsv4_status dsv4_weights_matrix_view(const dsv4_checkpoint *ck, const dsv4_config *c, int64_t expert,
                                     dsv4_proj proj, dsv4_matrix_view *out, dsv4_error *err)
{
    return weights_matrix(ck, c, expert, proj, false, out, err);
}

static dsv4_status weights_router(const dsv4_checkpoint *ck, const dsv4_config *c, dsv4_router_view *out,
                                  dsv4_error *err);

dsv4_status dsv4_weights_router(const dsv4_checkpoint *ck, const dsv4_config *c, dsv4_router_view *out,
                                dsv4_error *err)
{
    return shape_hint(c, weights_router(ck, c, out, err), err);
}

static dsv4_status weights_router(const dsv4_checkpoint *ck, const dsv4_config *c, dsv4_router_view *out,
                                  dsv4_error *err)
{
    if (!ck || !c || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "weights", "checkpoint, config and output must not be NULL");
    dsv4_status vst = dsv4_config_validate(c, err);
    if (vst)
        return vst;
    dsv4_layout lay = dsv4_checkpoint_layout(ck);
    if (lay == DSV4_LAYOUT_UNKNOWN)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, "checkpoint", "no DSV4 MoE layout detected");
    const char *p = dsv4_checkpoint_prefix(ck);
    long long L = (long long)c->layer;
    int64_t E = c->n_routed_experts, H = c->dim;
    char gate[192], bias[192], tid[192], pn[192], pw[192], pb[192];
    if (lay == DSV4_LAYOUT_SPLIT) {
        snprintf(gate, sizeof gate, "layers.%lld.ffn.gate.weight", L);
        snprintf(bias, sizeof bias, "layers.%lld.ffn.gate.bias", L);
        snprintf(tid, sizeof tid, "layers.%lld.ffn.gate.tid2eid", L);
        snprintf(pn, sizeof pn, "layers.%lld.ffn.norm_predictor.norm", L);
        snprintf(pw, sizeof pw, "layers.%lld.ffn.norm_predictor.weight", L);
        snprintf(pb, sizeof pb, "layers.%lld.ffn.norm_predictor.bias", L);
    } else {
        snprintf(gate, sizeof gate, "%slayers.%lld.mlp.gate.weight", p, L);
        snprintf(bias, sizeof bias, "%slayers.%lld.mlp.gate.e_score_correction_bias", p, L);
        snprintf(tid, sizeof tid, "%slayers.%lld.mlp.gate.tid2eid", p, L);
        snprintf(pn, sizeof pn, "%slayers.%lld.mlp.norm_predictor.norm", p, L);
        snprintf(pw, sizeof pw, "%slayers.%lld.mlp.norm_predictor.weight", p, L);
        snprintf(pb, sizeof pb, "%slayers.%lld.mlp.norm_predictor.bias", p, L);
    }
    dsv4_router_view r;
    memset(&r, 0, sizeof r);
    const dsv4_tensor_info *t;
    dsv4_status st;
    int64_t sg[2] = {E, H}, se[1] = {E}, st2[2] = {c->vocab_size, c->n_activated};
    if ((st = expect(ck, gate, DT_BF16, 2, sg, &t, err)))
        return st;
    r.gate_key = t->name;
    r.gate = t->data;
    if (dsv4_config_is_hash_layer(c)) {
        if ((st = expect(ck, tid, DT_I32, 2, st2, &t, err)))
            return st;
        r.tid2eid = t->data;
    } else {
        /* A tid2eid for this layer says the checkpoint is a hash layer; routing it by score
           (the config's n_hash_layers makes it non-hash) would ignore the table silently. */
        const dsv4_tensor_info *ht = dsv4_checkpoint_find(ck, tid);
        if (ht) {
            char where[300];
            snprintf(where, sizeof where, "%s: tensor '%s'", ht->file, tid);
            return dsv4_seterr(err, DSV4_ERR_CONFIG, where,
                               "the checkpoint routes layer %lld by hash (it holds tid2eid), but the config makes "
                               "it a score-routed layer (n_hash_layers = %lld); set n_hash_layers above %lld",
                               L, (long long)c->n_hash_layers, L);
        }
        /* The bias is part of a non-hash layer's routing (SPEC.md): a checkpoint without it
           would route as if it were 0, silently; it is required. */
        if ((st = expect(ck, bias, DT_F32, 1, se, &t, err)))
            return st;
        r.bias = t->data;
        if (c->top_p < 1.0f && c->top_p_predictor == DSV4_PREDICTOR_CONST) {
            if ((st = expect(ck, pn, DT_F32, 1, se, &t, err)))
                return st;
            r.pred_norm = t->data;
        } else if (c->top_p < 1.0f && c->top_p_predictor == DSV4_PREDICTOR_LINEAR) {
            if ((st = expect(ck, pw, DT_F32, 2, sg, &t, err)))
                return st;
            r.pred_weight = t->data;
            if ((st = expect(ck, pb, DT_F32, 1, se, &t, err)))
                return st;
            r.pred_bias = t->data;
        }
    }
    /* A NaN gate weight makes every score of its token NaN, and the token silently falls back to
       experts 0..K-1; a NaN bias or predictor value would reorder every later expert: refuse
       them here, where every consumer binds the router. */
    for (int64_t i = 0; i < E * H; i++) {
        float v = dsv4_load_bf16(r.gate, i);
        if (!isfinite(v)) {
            const dsv4_tensor_info *ti = dsv4_checkpoint_find(ck, gate);
            char where[300];
            snprintf(where, sizeof where, "%s: tensor '%s'", ti ? ti->file : "checkpoint", gate);
            return dsv4_seterr(err, DSV4_ERR_NUMERIC, where,
                               "element %lld (expert %lld, column %lld) is %.9g; routing tensors must be finite",
                               (long long)i, (long long)(i / H), (long long)(i % H), (double)v);
        }
    }
    const struct {
        const uint8_t *v;
        int64_t n;
        const char *key;
    } vecs[] = {{r.bias, E, bias}, {r.pred_norm, E, pn}, {r.pred_weight, E * H, pw}, {r.pred_bias, E, pb}};
    for (size_t q = 0; q < sizeof vecs / sizeof vecs[0]; q++)
        for (int64_t i = 0; vecs[q].v && i < vecs[q].n; i++) {
            float v = dsv4_load_f32(vecs[q].v, i);
            if (!isfinite(v)) {
                const dsv4_tensor_info *ti = dsv4_checkpoint_find(ck, vecs[q].key);
                char where[300];
                snprintf(where, sizeof where, "%s: tensor '%s'", ti ? ti->file : "checkpoint", vecs[q].key);
                return dsv4_seterr(err, DSV4_ERR_NUMERIC, where, "element %lld is %.9g; routing tensors must be finite",
                                   (long long)i, (double)v);
            }
        }
    *out = r;
    return DSV4_OK;
}

void dsv4_matrix_dequant_rows(const dsv4_matrix_view *m, int64_t n0, int64_t rows, float *out)
{
    switch (m->format) {
    case DSV4_FORMAT_BF16:
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *src = m->data + (uint64_t)(n0 + r) * m->row_bytes;
            for (int64_t j = 0; j < m->k; j++)
                out[r * m->k + j] = dsv4_load_bf16(src, j);
        }
        break;
    case DSV4_FORMAT_FP8:
        dsv4_dequant_fp8_rows(m->data, m->scales, m->scale_format, m->n, m->k, n0, rows, out);
        break;
    case DSV4_FORMAT_FP4:
        dsv4_dequant_fp4_rows(m->data, m->scales, m->n, m->k, n0, rows, out);
        break;
    }
}

static float *unpack_f32(dsv4_allocator *a, const uint8_t *p, int64_t n)
{
    float *o = dsv4_alloc(a, (size_t)(n > 0 ? n : 1) * sizeof *o);
    if (o)
        for (int64_t i = 0; i < n; i++)
            o[i] = dsv4_load_f32(p, i);
    return o;
}

void dsv4_router_tensors_release(dsv4_router_tensors *t, dsv4_allocator *a)
{
    if (!t)
        return;
    dsv4_release(a, t->gate);
    dsv4_release(a, t->bias);
    dsv4_release(a, t->tid2eid);
    dsv4_release(a, t->pred_norm);
    dsv4_release(a, t->pred_w);
    dsv4_release(a, t->pred_b);
    memset(t, 0, sizeof *t);
}

dsv4_status dsv4_router_tensors_load(const dsv4_checkpoint *ck, const dsv4_config *c, dsv4_allocator *a,
                                     dsv4_router_tensors *out, dsv4_error *err)
{
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "weights", "output must not be NULL");
    memset(out, 0, sizeof *out);
    dsv4_router_view v;
    dsv4_status st = dsv4_weights_router(ck, c, &v, err);
    if (st)
        return st;
    int64_t E = c->n_routed_experts, H = c->dim, VK = c->vocab_size * c->n_activated;
    dsv4_router_tensors t;
    memset(&t, 0, sizeof t);
    if (!(t.gate = dsv4_alloc(a, (size_t)(E * H) * sizeof *t.gate)))
        goto nomem;
    for (int64_t i = 0; i < E * H; i++)
        t.gate[i] = dsv4_load_bf16(v.gate, i);
    if (v.tid2eid) {
        if (!(t.tid2eid = dsv4_alloc(a, (size_t)VK * sizeof *t.tid2eid)))
            goto nomem;
        for (int64_t i = 0; i < VK; i++)
            t.tid2eid[i] = dsv4_load_i32(v.tid2eid, i);
    }
    if ((v.bias && !(t.bias = unpack_f32(a, v.bias, E))) ||
        (v.pred_norm && !(t.pred_norm = unpack_f32(a, v.pred_norm, E))) ||
        (v.pred_weight && (!(t.pred_w = unpack_f32(a, v.pred_weight, E * H)) || !(t.pred_b = unpack_f32(a, v.pred_bias, E)))))
        goto nomem;
    *out = t;
    return DSV4_OK;
nomem:
    dsv4_router_tensors_release(&t, a);
    return dsv4_seterr(err, DSV4_ERR_NOMEM, "weights", "out of memory unpacking the router of layer %lld",
                       (long long)c->layer);
}

dsv4_status dsv4_router_check_input_ids(const dsv4_config *c, const int32_t *tid2eid, int64_t T,
                                        const int32_t *in_ids, const char *who, dsv4_error *err)
{
    if (!c || !dsv4_config_is_hash_layer(c) || T <= 0)
        return DSV4_OK;
    int64_t E = c->n_routed_experts, K = c->n_activated;
    if (!in_ids)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, who, "layer %lld is a hash layer: input_ids are required",
                           (long long)c->layer);
    if (!tid2eid)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, who, "layer %lld is a hash layer without a tid2eid table",
                           (long long)c->layer);
    for (int64_t t = 0; t < T; t++) {
        if (in_ids[t] < 0 || in_ids[t] >= c->vocab_size) {
            char where[64];
            snprintf(where, sizeof where, "input_ids[%lld]", (long long)t);
            return dsv4_seterr(err, DSV4_ERR_RANGE, where, "token id %d is outside [0, vocab_size = %lld)", in_ids[t],
                               (long long)c->vocab_size);
        }
        for (int64_t k = 0; k < K; k++) {
            int32_t ex = tid2eid[(int64_t)in_ids[t] * K + k];
            if (ex < 0 || ex >= E) {
                char where[96];
                snprintf(where, sizeof where, "tid2eid[%d, %lld]", in_ids[t], (long long)k);
                return dsv4_seterr(err, DSV4_ERR_RANGE, where,
                                   "expert id %d (token %lld) is outside [0, n_routed_experts = %lld)", ex,
                                   (long long)t, (long long)E);
            }
        }
    }
    return DSV4_OK;
}
