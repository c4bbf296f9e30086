/*
 * The CPU production backend (fast/cpu): one rank, router LOCAL, every expert
 * on this rank. SPEC.md sections 2-5 on OpenBLAS sgemm.
 *
 * Per chunk of at most dsv4_plan_chunk_tokens(plan) tokens:
 *   1. x bf16 -> fp32; router logits by sgemm x[Tc, H] . Wg^T; per token scores,
 *      top-K (ties to the lower id), weights, norm top-p (sentinel E) as SPEC.md 2-3;
 *   2. act_quant of x (routed and shared modes), once per token;
 *   3. token-slots permuted into per-expert groups by a stable counting sort:
 *      ascending expert id, tokens ascending inside a group;
 *   4. per expert with rows, in ascending id (empty experts launch nothing):
 *        gate/up GEMM, fused epilogue (bf16 g/u, SwiGLU clamp with counts, silu,
 *        router weight before_w2, bf16 h, act_quant h), down GEMM, combine into fp32 y
 *        (bf16(o), or w bf16(o) after_w2). Ascending experts per token by construction;
 *   5. the shared expert over the chunk (shared_clamp), y += bf16(o); out = bf16(y).
 *
 * GEMM regimes (per group, by its row count n; groups of at most LARGE_ROWS rows run in
 * expert-parallel batches, one expert per worker at a time, single-threaded GEMMs):
 *   - fp4 weights on a CPU with AVX512-BF16 and activations exactly bf16 (every act_quant
 *     output and bf16 input is): "fused" at every n, in blocks of SMALL_ROWS rows: the
 *     bf16 decode-dot kernel (vdpbf16ps) reads the stored fp4 bytes, NW weight rows x RB
 *     activation rows per pass; it beats dequantize + sgemm at every group size measured;
 *   - fp4 and fp8 weights on a table whose decode-dot entries are blocked ones (dot_blocked:
 *     the avx2 table): "fused" at every n too, in blocks of SMALL_ROWS rows;
 *   - other formats / kernels, n <= FUSED_ROWS: "fused": dot products against weight rows
 *     decoded on the fly from fp4/fp8/bf16 (the kernel table's entries: AVX-512, AVX2+FMA+F16C
 *     or the portable reference, fast/cpu/kernels/),
 *     threads over weight rows; the weights are read once from their stored bytes, so
 *     T = 1 is bandwidth-bound;
 *   - larger n: "tiles": weight rows dequantized to fp32 in tiles of at most TILE_ROWS
 *     rows into per-thread scratch, then cblas_sgemm on the tile (one OpenBLAS thread
 *     per worker; our workers over tiles). The scratch is bounded independent of T.
 * The SIMD decoders give the same fp32 values as dsv4_matrix_dequant_rows (the reference
 * table uses it), checked by tests/test_cpu.c for every table the machine runs.
 *
 * Files: this one orchestrates (chunks, conversions, counting sort, batches, statistics) and
 * creates/frees; router.c routes; ffn.c holds the GEMM regimes and the FFN of one group;
 * kernels/ the kernel table (kernels/kernels.h), chosen at creation from
 * the backend parameter kernels=NAME (dsv4_backend_options.params; auto: the best this CPU runs).
 *
 * Memory: every byte through two accounting allocators owned by the backend: `persist`
 * (router tensors, quantized-at-load weights of a bf16 stacked checkpoint) and `ws`
 * (the workspace: chunk buffers, group buffers, tile scratch), kept between forwards
 * and grown only as needed; its peak is workspace_peak.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/alloc.h"
#include "dsv4moe/backend.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/weights.h"
#include "fast/backend/backend_reg.h"
#include "fast/backend/params.h"
#include "fast/cpu/cpu_impl.h"
#include "core/err.h"
#include "core/testctl.h"
#include "fast/cpu/kernels/kutil.h"
#include "core/parallel.h"

/* OpenBLAS's own thread count (declared here: not every cblas.h has it). */
void openblas_set_num_threads(int num_threads);

void *dsv4_cpu_ensure(cpu_be *b, int id, size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    if (b->buf[id].n >= bytes)
        return b->buf[id].p;
    dsv4_release(b->ws, b->buf[id].p);
    b->buf[id].p = dsv4_alloc(b->ws, bytes);
    b->buf[id].n = b->buf[id].p ? bytes : 0;
    return b->buf[id].p;
}

/* ---------------- per-row conversions ---------------- */

void dsv4_cpu_convert_rows(void *p, int64_t lo, int64_t hi)
{
    conv_job *j = p;
    int64_t H = j->H;
    for (int64_t t = lo; t < hi; t++) {
        float *xf = j->xf + t * H;
        const uint16_t *x = j->x + t * H;
        for (int64_t i = 0; i < H; i++)
            xf[i] = dsv4_f32_from_bits((uint32_t)x[i] << 16);
        if (j->qr)
            dsv4_act_quant_row(xf, H, j->mode, j->xq + t * H, NULL, NULL);
        if (j->qs && j->xqs != j->xq)
            dsv4_act_quant_row(xf, H, j->mode, j->xqs + t * H, NULL, NULL);
    }
}

void dsv4_cpu_output_rows(void *p, int64_t lo, int64_t hi)
{
    out_job *j = p;
    for (int64_t i = lo; i < hi; i++)
        j->out[i] = tobf16(j->y[i]);
}

/* ---------------- forward ---------------- */

void dsv4_cpu_route_chunk(cpu_be *b, int64_t Tc, const float *xf, const int32_t *in_ids, float *logits, int32_t *ids,
                          float *w, int32_t *kept, unsigned char *nonf)
{
    int64_t E = b->cfg.n_routed_experts, H = b->cfg.dim;
    logit_job lj = {b, xf, logits, Tc};
    if (Tc <= 4)
        dsv4_parallel_for((double)E * H < 4e5 ? 1 : b->threads, E, 16, dsv4_cpu_logits_cols, &lj);
    else
        dsv4_parallel_for((double)Tc * E * H < 4e6 ? 1 : b->threads, Tc, 16, dsv4_cpu_logits_rows, &lj);
    route_job rj = {b, xf, logits, in_ids, ids, kept, w, nonf};
    dsv4_parallel_for(Tc * E < 8192 ? 1 : b->threads, Tc, 16, dsv4_cpu_route, &rj);
}

static dsv4_status cpu_forward(void *p, int64_t T, const uint16_t *x, const int32_t *in_ids, dsv4_forward_out *out,
                               dsv4_error *err)
{
    cpu_be *b = p;
    const dsv4_config *c = &b->cfg;
    int64_t E = c->n_routed_experts, H = c->dim, I = c->moe_inter_dim, K = c->n_activated;
    bool hash = dsv4_config_is_hash_layer(c);
    b->stats.launches += DSV4_TESTHOOK(ROUTER_WORK_ON_EMPTY) ? 3 : 0; /* test hook: sanitised ids, weights, mask per forward */
    if (T == 0) {
        b->stats.forwards++;
        return DSV4_OK;
    }
    /* Hash layers: every id checked before anything is written (as the reference). */
    dsv4_status st = dsv4_router_check_input_ids(c, b->rt.tid2eid, T, in_ids, "cpu forward", err);
    if (st)
        return st;
    openblas_set_num_threads(1); /* our workers own the cores; each sgemm runs on its caller */
    bool qr = c->routed_format != DSV4_FORMAT_BF16 && c->act_quant != DSV4_ACT_QUANT_NONE;
    bool qs = c->n_shared_experts > 0 && c->shared_format != DSV4_FORMAT_BF16 && c->act_quant != DSV4_ACT_QUANT_NONE;
    int64_t Tc0 = T < b->chunk ? T : b->chunk;
    size_t TH = (size_t)(Tc0 * H), TK = (size_t)(Tc0 * K);
    float *xf = dsv4_cpu_ensure(b, B_XF, TH * sizeof(float));
    float *xq = qr ? dsv4_cpu_ensure(b, B_XQ, TH * sizeof(float)) : xf;
    float *xqs = !qs ? xf : qr ? xq : dsv4_cpu_ensure(b, B_XQS, TH * sizeof(float));
    float *y = dsv4_cpu_ensure(b, B_Y, TH * sizeof(float));
    float *logits = dsv4_cpu_ensure(b, B_LOG, (size_t)(Tc0 * E) * sizeof(float));
    int32_t *ids = dsv4_cpu_ensure(b, B_IDS, TK * sizeof(int32_t));
    float *w = dsv4_cpu_ensure(b, B_W, TK * sizeof(float));
    int32_t *kept = dsv4_cpu_ensure(b, B_KEPT, (size_t)Tc0 * sizeof(int32_t));
    unsigned char *nonf = dsv4_cpu_ensure(b, B_NONF, (size_t)Tc0);
    int64_t *cnt = dsv4_cpu_ensure(b, B_CNT, (size_t)(E + 1) * sizeof(int64_t));
    int64_t *off = dsv4_cpu_ensure(b, B_OFF, (size_t)(E + 1) * sizeof(int64_t));
    int32_t *stok = dsv4_cpu_ensure(b, B_STOK, TK * sizeof(int32_t));
    float *sw = dsv4_cpu_ensure(b, B_SW, TK * sizeof(float));
    if (!xf || !xq || !xqs || !y || !logits || !ids || !w || !kept || !nonf || !cnt || !off || !stok || !sw)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "cpu forward", "out of memory for a chunk of %lld tokens",
                           (long long)Tc0);
    uint64_t rg = 0, ru = 0, sg = 0, su = 0, launches = 0, skips = 0, nonfinite = 0;
    for (int64_t t0 = 0; t0 < T; t0 += b->chunk) {
        int64_t Tc = T - t0 < b->chunk ? T - t0 : b->chunk;
        /* 1-2: convert and quantize x, route */
        conv_job cj = {x + t0 * H, xf, xq, xqs, H, c->act_quant, qr, qs};
        dsv4_parallel_for(Tc * H < 65536 ? 1 : b->threads, Tc, 8, dsv4_cpu_convert_rows, &cj);
        dsv4_cpu_route_chunk(b, Tc, xf, hash ? in_ids + t0 : NULL, logits, ids, w, kept, nonf);
        for (int64_t t = 0; t < Tc; t++)
            nonfinite += nonf[t];
        if (out->topk_ids)
            memcpy(out->topk_ids + t0 * K, ids, (size_t)(Tc * K) * sizeof *ids);
        if (out->topk_weights)
            memcpy(out->topk_weights + t0 * K, w, (size_t)(Tc * K) * sizeof *w);
        if (out->kept_counts)
            memcpy(out->kept_counts + t0, kept, (size_t)Tc * sizeof *kept);
        /* 3: stable counting sort of the kept slots by expert */
        memset(cnt, 0, (size_t)(E + 1) * sizeof *cnt);
        for (int64_t i = 0; i < Tc * K; i++) {
            int32_t e = ids[i];
            if (e < 0 || e > E)
                return dsv4_seterr(err, DSV4_ERR_INTERNAL, "cpu forward",
                                   "slot %lld holds expert id %d outside [0, %lld] (E is the sentinel)",
                                   (long long)(t0 + i / K), e, (long long)E);
            cnt[e]++;
        }
        int64_t maxn = c->n_shared_experts > 0 ? Tc : 0;
        off[0] = 0;
        for (int64_t e = 0; e < E; e++) {
            off[e + 1] = off[e] + cnt[e];
            maxn = cnt[e] > maxn ? cnt[e] : maxn;
        }
        for (int64_t e = 0; e < E; e++)
            cnt[e] = off[e];
        for (int64_t i = 0; i < Tc * K; i++) {
            int32_t e = ids[i];
            if (e == E)
                continue;
            stok[cnt[e]] = (int32_t)(i / K);
            sw[cnt[e]] = w[i];
            cnt[e]++;
        }
        /* Group buffers: a batch of groups (or one large group, or the shared expert). */
        int64_t rowbytes = (2 * H + 3 * I) * (int64_t)sizeof(float);
        int64_t cap = BATCH_BYTES / rowbytes;
        cap = cap > maxn ? cap : maxn;
        cap = cap < Tc * K ? cap : Tc * K;
        cap = cap > maxn ? cap : maxn;
        float *XG = dsv4_cpu_ensure(b, B_XG, (size_t)(cap * H) * sizeof(float));
        float *GU = dsv4_cpu_ensure(b, B_GU, (size_t)(cap * 2 * I) * sizeof(float));
        float *HB = dsv4_cpu_ensure(b, B_HB, (size_t)(cap * I) * sizeof(float));
        float *O = dsv4_cpu_ensure(b, B_O, (size_t)(cap * H) * sizeof(float));
        float *wbase = dsv4_cpu_ensure(b, B_TILE, (size_t)b->threads * dsv4_cpu_wscratch_floats(c) * sizeof(float));
        if (!XG || !GU || !HB || !O || !wbase)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, "cpu forward", "out of memory for groups of %lld rows",
                               (long long)cap);
        memset(y, 0, (size_t)(Tc * H) * sizeof *y);
        /* 4: routed experts in ascending id: large groups alone (threads inside the GEMMs), the others in
           batches of consecutive experts (one expert per worker at a time); each batch is combined in
           slot order, i.e. ascending expert id per token. */
        bool after = c->weight_point == DSV4_WEIGHT_AFTER_W2;
        int64_t e = 0;
        while (e < E) {
            int64_t n = off[e + 1] - off[e];
            if (n == 0) {
                skips++;
                e++;
                continue;
            }
            if (n > LARGE_ROWS) {
                const int32_t *tok = stok + off[e];
                const float *tw = sw + off[e];
                for (int64_t q = 0; q < n; q++)
                    memcpy(XG + q * H, xq + (int64_t)tok[q] * H, (size_t)H * sizeof *XG);
                _Atomic uint64_t gc = 0, uc = 0;
                if ((st = dsv4_cpu_ffn(b, wbase, NULL, &b->experts[3 * e], true, n, XG, tw, GU, HB, O, &gc, &uc, err)))
                    return st;
                rg += atomic_load(&gc);
                ru += atomic_load(&uc);
                launches++;
                comb_job cb = {y, O, tok, after ? tw : NULL, n, H};
                dsv4_parallel_for(n * H < 262144 ? 1 : b->threads, H, 64, dsv4_cpu_combine, &cb);
                e++;
                continue;
            }
            int64_t rows = 0;
            int64_t e1 = dsv4_cpu_run_batch(b, wbase, e, E, off, cap, stok, sw, xq, XG, GU, HB, O, &rows, &launches,
                                            &skips, &rg, &ru);
            comb_job cb = {y, O, stok + off[e], after ? sw + off[e] : NULL, rows, H};
            dsv4_parallel_for(rows * H < 262144 ? 1 : b->threads, H, 64, dsv4_cpu_combine, &cb);
            e = e1;
        }
        /* 5: shared expert */
        if (c->n_shared_experts > 0) {
            _Atomic uint64_t gc = 0, uc = 0;
            if ((st = dsv4_cpu_ffn(b, wbase, NULL, b->shared, c->shared_clamp, Tc, xqs, NULL, GU, HB, O, &gc, &uc, err)))
                return st;
            sg += atomic_load(&gc);
            su += atomic_load(&uc);
            launches++;
            comb_job cb = {y, O, NULL, NULL, Tc, H};
            dsv4_parallel_for(Tc * H < 262144 ? 1 : b->threads, H, 64, dsv4_cpu_combine, &cb);
        }
        out_job oj = {y, out->y + t0 * H};
        dsv4_parallel_for(Tc * H < 262144 ? 1 : b->threads, Tc * H, 4096, dsv4_cpu_output_rows, &oj);
    }
    b->stats.forwards++;
    b->stats.tokens += (uint64_t)T;
    b->stats.launches += launches;
    b->stats.empty_skips += skips;
    b->stats.nonfinite_rows += nonfinite;
    b->stats.routed_g_clamped += rg;
    b->stats.routed_u_clamped += ru;
    b->stats.shared_g_clamped += sg;
    b->stats.shared_u_clamped += su;
    return DSV4_OK;
}

/* ---------------- create / free ---------------- */

static dsv4_backend_stats cpu_stats(const void *p)
{
    const cpu_be *b = p;
    dsv4_backend_stats s = b->stats;
    s.workspace_peak = dsv4_allocator_stats(b->ws).peak;
    return s;
}

static void cpu_free(void *p)
{
    cpu_be *b = p;
    if (!b)
        return;
    for (int i = 0; i < NBUF; i++)
        dsv4_release(b->ws, b->buf[i].p);
    if (b->experts) {
        for (int64_t i = 0; i < 3 * b->cfg.n_routed_experts; i++) {
            dsv4_release(b->persist, b->experts[i].own_q);
            dsv4_release(b->persist, b->experts[i].own_s);
        }
        dsv4_release(b->persist, b->experts);
    }
    for (int i = 0; i < 3; i++) {
        dsv4_release(b->persist, b->shared[i].own_q);
        dsv4_release(b->persist, b->shared[i].own_s);
    }
    dsv4_router_tensors_release(&b->rt, b->persist);
    dsv4_allocator_free(b->ws);
    dsv4_allocator_free(b->persist);
    free(b);
}

const char *dsv4_cpu_backend_kernels(const void *p) { return ((const cpu_be *)p)->kt->name; }

static const dsv4_backend_vtable cpu_vtable = {"cpu", cpu_forward, cpu_stats, cpu_free, NULL, NULL, NULL};

/* A bf16 (stacked) matrix under a quantized config: quantized here exactly as the reference does. */
static dsv4_status quantize_at_load(cpu_be *b, dsv4_weight_format fmt, cmat *m, dsv4_error *err)
{
    int64_t n = m->v.n, k = m->v.k;
    float *w = dsv4_alloc(b->persist, (size_t)(n * k) * sizeof *w);
    if (!w)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory quantizing at load");
    dsv4_matrix_dequant_rows(&m->v, 0, n, w);
    dsv4_status st;
    if (fmt == DSV4_FORMAT_FP8) {
        size_t ssz = b->cfg.weight_scale == DSV4_SCALE_FP32 ? 4 : 1;
        m->own_q = dsv4_alloc(b->persist, (size_t)(n * k));
        m->own_s = dsv4_alloc(b->persist, (size_t)(cdiv(n, 128) * cdiv(k, 128)) * ssz);
        st = !m->own_q || !m->own_s ? dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory quantizing at load")
                                    : dsv4_quant_fp8_block(w, n, k, b->cfg.weight_scale, m->own_q, m->own_s,
                                                           m->v.key, err);
        m->v.row_bytes = (uint64_t)k;
        m->v.scale_format = b->cfg.weight_scale;
    } else {
        m->own_q = dsv4_alloc(b->persist, (size_t)(n * k / 2));
        m->own_s = dsv4_alloc(b->persist, (size_t)(n * (k / 32)));
        st = !m->own_q || !m->own_s ? dsv4_seterr(err, DSV4_ERR_NOMEM, m->v.key, "out of memory quantizing at load")
                                    : dsv4_quant_fp4_block(w, n, k, m->own_q, m->own_s, m->v.key, err);
        m->v.row_bytes = (uint64_t)k / 2;
    }
    dsv4_release(b->persist, w);
    if (st == DSV4_OK) {
        m->v.format = fmt;
        m->v.data = m->own_q;
        m->v.scales = m->own_s;
    }
    return st;
}

/* Bytes of the scale entries: fp8 block scales per 128 x 128 (fp32 or ue8m0), fp4 per 32. */
static size_t scale_size(const cpu_be *b, const dsv4_matrix_view *v)
{
    (void)b;
    return v->format == DSV4_FORMAT_FP8 && v->scale_format == DSV4_SCALE_FP32 ? 4 : 1;
}

/* tp: w1 / w3 rows [i_first, i_first + inter) as a view into the same bytes (the planner keeps the
   range on whole scale blocks). */
static void shard_rows(const cpu_be *b, cmat *m)
{
    dsv4_matrix_view *v = &m->v;
    int64_t r0 = b->i_first;
    v->data += (uint64_t)r0 * v->row_bytes;
    if (v->format == DSV4_FORMAT_FP8)
        v->scales += (size_t)(r0 / 128) * (size_t)cdiv(v->k, 128) * scale_size(b, v);
    else if (v->format == DSV4_FORMAT_FP4)
        v->scales += (size_t)r0 * (size_t)(v->k / 32);
    v->n = b->inter;
}

/* tp: w2 columns [i_first, i_first + inter), copied into bytes of their own (a column range of
   a row-major matrix is no view: its rows and scale rows would keep the whole width). */
static dsv4_status shard_columns(cpu_be *b, cmat *m, dsv4_error *err)
{
    dsv4_matrix_view *v = &m->v;
    int64_t n = v->n, c0 = b->i_first, nc = b->inter;
    size_t ss = scale_size(b, v);
    uint64_t rb = v->format == DSV4_FORMAT_FP8 ? (uint64_t)nc : v->format == DSV4_FORMAT_FP4 ? (uint64_t)nc / 2
                                                                                               : (uint64_t)nc * 2;
    uint64_t skip = v->format == DSV4_FORMAT_FP8 ? (uint64_t)c0 : v->format == DSV4_FORMAT_FP4 ? (uint64_t)c0 / 2
                                                                                                 : (uint64_t)c0 * 2;
    size_t sbytes = v->format == DSV4_FORMAT_FP8   ? (size_t)cdiv(n, 128) * (size_t)cdiv(nc, 128) * ss
                    : v->format == DSV4_FORMAT_FP4 ? (size_t)n * (size_t)(nc / 32)
                                                   : 0;
    uint8_t *q = dsv4_alloc(b->persist, (size_t)(rb * (uint64_t)n)), *sc = sbytes ? dsv4_alloc(b->persist, sbytes) : NULL;
    if (!q || (sbytes && !sc)) {
        dsv4_release(b->persist, q);
        dsv4_release(b->persist, sc);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, v->key, "out of memory for the tp shard");
    }
    for (int64_t r = 0; r < n; r++)
        memcpy(q + (uint64_t)r * rb, v->data + (uint64_t)r * v->row_bytes + skip, (size_t)rb);
    if (v->format == DSV4_FORMAT_FP8) {
        int64_t kb = cdiv(v->k, 128), nb = cdiv(nc, 128);
        for (int64_t r = 0; r < cdiv(n, 128); r++)
            memcpy(sc + (size_t)(r * nb) * ss, v->scales + (size_t)(r * kb + c0 / 128) * ss, (size_t)nb * ss);
    } else if (v->format == DSV4_FORMAT_FP4) {
        for (int64_t r = 0; r < n; r++)
            memcpy(sc + (size_t)(r * (nc / 32)), v->scales + (size_t)(r * (v->k / 32) + c0 / 32), (size_t)(nc / 32));
    }
    dsv4_release(b->persist, m->own_q);
    dsv4_release(b->persist, m->own_s);
    m->own_q = q;
    m->own_s = sc;
    v->data = q;
    v->scales = sc;
    v->row_bytes = rb;
    v->k = nc;
    return DSV4_OK;
}

static dsv4_status bind(cpu_be *b, const dsv4_checkpoint *ck, int64_t e, int p, cmat *m, dsv4_error *err)
{
    dsv4_status st = dsv4_weights_matrix(ck, &b->cfg, e, (dsv4_proj)p, &m->v, err);
    if (st)
        return st;
    dsv4_weight_format want = e == DSV4_SHARED_EXPERT ? b->cfg.shared_format : b->cfg.routed_format;
    if (m->v.format != want && (st = quantize_at_load(b, want, m, err)))
        return st;
    if (b->inter == b->cfg.moe_inter_dim)
        return DSV4_OK;
    return p == DSV4_PROJ_W2 ? shard_columns(b, m, err) : (shard_rows(b, m), DSV4_OK);
}

/* The backend's parameters (dsv4_backend_options.params, docs/cpu.md "Parameters"): kernels=NAME,
   the kernel table (auto, ref, avx2, avx512, avx512-bf16, avx512-vbmi). */
static dsv4_status parse_params(const char *params, dsv4_cpu_kernels *level, dsv4_error *err)
{
    *level = DSV4_CPU_KERNELS_AUTO;
    dsv4_param it;
    int more;
    while ((more = dsv4_params_next(&params, &it, "cpu", "kernels", err)) > 0) {
        if (!dsv4_param_key_is(&it, "kernels"))
            return dsv4_param_unknown_key(&it, "cpu", "kernels", err);
        char name[32];
        size_t vl = it.val_len < sizeof name ? it.val_len : sizeof name - 1;
        memcpy(name, it.val, vl);
        name[vl] = '\0';
        dsv4_status st = dsv4_cpu_kernels_from_name(name, level, err);
        if (st)
            return st;
    }
    return more ? DSV4_ERR_INVALID_ARG : DSV4_OK;
}

dsv4_status dsv4_cpu_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ck, const dsv4_backend_options *opt,
                                    void **impl, const dsv4_backend_vtable **vt, dsv4_error *err)
{
    const dsv4_config *cfg = dsv4_plan_config(plan); /* validated by the planner */
    const dsv4_cpu_kernels_table *kt = NULL;
    dsv4_cpu_kernels level;
    dsv4_status st;
    if ((st = parse_params(opt->params, &level, err)) || (st = dsv4_cpu_kernels_get(level, &kt, err)))
        return st;
    int threads = opt->threads;
    cpu_be *b = calloc(1, sizeof *b);
    if (!b)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "backend cpu", "out of memory");
    b->cfg = *cfg;
    /* The plan sized the per-worker scratch for host_threads workers. */
    int planned = dsv4_plan_topology(plan)->host_threads;
    b->threads = threads < (planned > 0 ? planned : 1) ? threads : (planned > 0 ? planned : 1);
    b->chunk = dsv4_plan_chunk_tokens(plan);
    b->max_tokens = dsv4_plan_topology(plan)->max_tokens_per_rank;
    if (b->chunk < 1)
        b->chunk = b->max_tokens > 0 ? b->max_tokens : 128;
    if (DSV4_TESTHOOK(UNCHUNKED_PREFILL))
        b->chunk = b->max_tokens; /* test hook: long prefills unchunked, no token bound */
    b->kt = kt;
    b->e_first = dsv4_plan_expert_first(plan);
    b->e_count = dsv4_plan_expert_count(plan);
    b->i_first = dsv4_plan_inter_first(plan);
    b->inter = dsv4_plan_inter_count(plan);
    b->stats.workspace_planned = dsv4_plan_workspace_max(plan);
    atomic_init(&b->nomem, 0);
    if ((st = dsv4_allocator_create(0, &b->persist, err)) || (st = dsv4_allocator_create(0, &b->ws, err)))
        goto fail;
    const dsv4_config *c = &b->cfg;
    int64_t E = c->n_routed_experts;
    if ((st = dsv4_router_tensors_load(ck, c, b->persist, &b->rt, err)))
        goto fail;
    b->experts = dsv4_alloc(b->persist, (size_t)(3 * E) * sizeof *b->experts);
    if (!b->experts)
        goto nomem;
    memset(b->experts, 0, (size_t)(3 * E) * sizeof *b->experts);
    for (int64_t e = b->e_first; e < b->e_first + b->e_count; e++)
        for (int p = 0; p < 3; p++)
            if ((st = bind(b, ck, e, p, &b->experts[3 * e + p], err)))
                goto fail;
    if (c->n_shared_experts > 0)
        for (int p = 0; p < 3; p++)
            if ((st = bind(b, ck, DSV4_SHARED_EXPERT, p, &b->shared[p], err)))
                goto fail;
    *impl = b;
    *vt = &cpu_vtable;
    return DSV4_OK;
nomem:
    st = dsv4_seterr(err, DSV4_ERR_NOMEM, "backend cpu", "out of memory binding layer %lld", (long long)c->layer);
fail:
    cpu_free(b);
    return st;
}
