/*
 * The CPU backend's stages (fast/backend/backend_impl.h) for a rank of a sharded plan, and its
 * memory model (the registry's workspace_bytes, fast/backend/registry.c).
 *
 * The stages compute every value as the forward does (fast/cpu/cpu.c): the same conversions,
 * act_quant per row, router, GEMM regime per group size (dsv4_cpu_ffn, the expert-parallel
 * batches of groups of at most LARGE_ROWS rows), fp32 combine in the order given. Bound
 * weights: the plan's expert range, and under tp the rank's rows of moe_inter_dim
 * (dsv4_cpu_backend_create).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "dsv4moe/alloc.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/weights.h"
#include "fast/backend/backend_reg.h"
#include "fast/cpu/cpu_impl.h"
#include "core/err.h"
#include "core/parallel.h"

void openblas_set_num_threads(int num_threads);

static bool quantized(const dsv4_config *c, dsv4_weight_format f)
{
    return f != DSV4_FORMAT_BF16 && c->act_quant != DSV4_ACT_QUANT_NONE;
}

static dsv4_status cpu_route(void *p, int64_t n, const uint16_t *x, const int32_t *in_ids, int32_t *ids, float *w,
                             int32_t *kept, dsv4_error *err)
{
    cpu_be *b = p;
    const dsv4_config *c = &b->cfg;
    int64_t H = c->dim, E = c->n_routed_experts;
    if (n < 0 || n > b->chunk)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cpu route", "%lld tokens outside [0, chunk = %lld]",
                           (long long)n, (long long)b->chunk);
    dsv4_status st = dsv4_router_check_input_ids(c, b->rt.tid2eid, n, in_ids, "cpu route", err);
    if (st || n == 0)
        return st;
    openblas_set_num_threads(1);
    float *xf = dsv4_cpu_ensure(b, B_XF, (size_t)(n * H) * sizeof(float));
    float *logits = dsv4_cpu_ensure(b, B_LOG, (size_t)(n * E) * sizeof(float));
    int32_t *kp = kept ? kept : dsv4_cpu_ensure(b, B_KEPT, (size_t)n * sizeof(int32_t));
    unsigned char *nonf = dsv4_cpu_ensure(b, B_NONF, (size_t)n);
    if (!xf || !logits || !kp || !nonf)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "cpu route", "out of memory for %lld tokens", (long long)n);
    conv_job cj = {x, xf, xf, xf, H, c->act_quant, false, false};
    dsv4_parallel_for(n * H < 65536 ? 1 : b->threads, n, 8, dsv4_cpu_convert_rows, &cj);
    dsv4_cpu_route_chunk(b, n, xf, dsv4_config_is_hash_layer(c) ? in_ids : NULL, logits, ids, w, kp, nonf);
    for (int64_t t = 0; t < n; t++)
        b->stats.nonfinite_rows += nonf[t];
    b->stats.forwards++;
    b->stats.tokens += (uint64_t)n;
    return DSV4_OK;
}

/* The rows' expert ids: all the shared expert, or ascending runs inside the bound range. */
static dsv4_status check_groups(const cpu_be *b, int64_t m, const int32_t *expert, const float *w, bool *shared,
                                dsv4_error *err)
{
    *shared = m > 0 && expert[0] == DSV4_SHARED_EXPERT;
    if (*shared && (b->cfg.n_shared_experts == 0 || w))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cpu experts",
                           "the shared expert rows need a layer with a shared expert and no router weights");
    if (!*shared && m > 0 && !w)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cpu experts", "routed rows need their router weights");
    for (int64_t q = 0; q < m; q++) {
        int32_t e = expert[q];
        bool ok = *shared ? e == DSV4_SHARED_EXPERT
                          : e >= b->e_first && e < b->e_first + b->e_count && (q == 0 || e >= expert[q - 1]);
        if (!ok)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cpu experts",
                               "row %lld names expert %d: rows must be all shared or ascending in [%lld, %lld)",
                               (long long)q, e, (long long)b->e_first, (long long)(b->e_first + b->e_count));
    }
    return DSV4_OK;
}

static dsv4_status cpu_experts(void *p, int64_t m, const uint16_t *x, const int32_t *expert, const float *w,
                               int64_t i0, int64_t ni, float *out, dsv4_error *err)
{
    cpu_be *b = p;
    const dsv4_config *c = &b->cfg;
    int64_t H = c->dim, I = b->inter, E = c->n_routed_experts;
    if (i0 != b->i_first || ni != b->inter)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cpu experts",
                           "inter rows [%lld, %lld) are not the [%lld, %lld) this rank's plan bound",
                           (long long)i0, (long long)(i0 + ni), (long long)b->i_first,
                           (long long)(b->i_first + b->inter));
    bool shared;
    dsv4_status st = check_groups(b, m, expert, w, &shared, err);
    if (st || m == 0)
        return st;
    openblas_set_num_threads(1);
    bool q = quantized(c, shared ? c->shared_format : c->routed_format);
    float *xf = dsv4_cpu_ensure(b, B_XQS, (size_t)(m * H) * sizeof(float));
    float *xq = q ? dsv4_cpu_ensure(b, B_XQ, (size_t)(m * H) * sizeof(float)) : xf;
    int64_t *off = dsv4_cpu_ensure(b, B_OFF, (size_t)(E + 1) * sizeof(int64_t));
    int32_t *stok = dsv4_cpu_ensure(b, B_STOK, (size_t)m * sizeof(int32_t));
    float *wbase = dsv4_cpu_ensure(b, B_TILE, (size_t)b->threads * dsv4_cpu_wscratch_floats(c) * sizeof(float));
    if (!xf || !xq || !off || !stok || !wbase)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "cpu experts", "out of memory for %lld rows", (long long)m);
    conv_job cj = {x, xf, xq, xq, H, c->act_quant, q, false};
    dsv4_parallel_for(m * H < 65536 ? 1 : b->threads, m, 8, dsv4_cpu_convert_rows, &cj);
    /* Group rows by expert (they arrive grouped): offsets over every id, the row itself as token. */
    int64_t maxn = shared ? m : 0;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int64_t r = 0; r < m; r++) {
        stok[r] = (int32_t)r;
        if (!shared)
            off[expert[r] + 1]++;
    }
    for (int64_t e = 0; e < E; e++) {
        maxn = off[e + 1] > maxn ? off[e + 1] : maxn;
        off[e + 1] += off[e];
    }
    int64_t rowbytes = (H + 3 * I) * (int64_t)sizeof(float);
    int64_t cap = BATCH_BYTES / rowbytes;
    cap = cap > maxn ? cap : maxn;
    cap = cap < m ? cap : m;
    cap = cap > maxn ? cap : maxn;
    float *XG = dsv4_cpu_ensure(b, B_XG, (size_t)(cap * H) * sizeof(float));
    float *GU = dsv4_cpu_ensure(b, B_GU, (size_t)(cap * 2 * I) * sizeof(float));
    float *HB = dsv4_cpu_ensure(b, B_HB, (size_t)(cap * I) * sizeof(float));
    if (!XG || !GU || !HB)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "cpu experts", "out of memory for groups of %lld rows",
                           (long long)cap);
    if (shared) {
        _Atomic uint64_t gc = 0, uc = 0;
        if ((st = dsv4_cpu_ffn(b, wbase, NULL, b->shared, c->shared_clamp, m, xq, NULL, GU, HB, out, &gc, &uc, err)))
            return st;
        b->stats.shared_g_clamped += atomic_load(&gc);
        b->stats.shared_u_clamped += atomic_load(&uc);
        b->stats.launches++;
        return DSV4_OK;
    }
    /* As the forward: large groups alone (threads inside the GEMMs), the others in batches of
       consecutive experts, one expert per worker at a time. */
    int64_t e = b->e_first, e_end = b->e_first + b->e_count;
    while (e < e_end) {
        int64_t n = off[e + 1] - off[e];
        if (n == 0) {
            b->stats.empty_skips++;
            e++;
            continue;
        }
        if (n > LARGE_ROWS) {
            _Atomic uint64_t gc = 0, uc = 0;
            if ((st = dsv4_cpu_ffn(b, wbase, NULL, &b->experts[3 * e], true, n, xq + off[e] * H, w + off[e], GU, HB,
                                   out + off[e] * H, &gc, &uc, err)))
                return st;
            b->stats.routed_g_clamped += atomic_load(&gc);
            b->stats.routed_u_clamped += atomic_load(&uc);
            b->stats.launches++;
            e++;
            continue;
        }
        int64_t rows = 0;
        int64_t e1 = dsv4_cpu_run_batch(b, wbase, e, e_end, off, cap, stok, w, xq, XG, GU, HB, out + off[e] * H, &rows,
                                        &b->stats.launches, &b->stats.empty_skips, &b->stats.routed_g_clamped,
                                        &b->stats.routed_u_clamped);
        e = e1;
    }
    return DSV4_OK;
}

static void bf16_to_f32(const uint16_t *in, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = dsv4_bf16_to_f32(in[i]);
}

static dsv4_status cpu_combine(void *p, int64_t n, int64_t ns, const int32_t *tok, const float *w, const uint16_t *o,
                               const uint16_t *shared, uint16_t *yout, dsv4_error *err)
{
    cpu_be *b = p;
    const dsv4_config *c = &b->cfg;
    int64_t H = c->dim;
    if (n < 0 || ns < 0 || n > b->chunk || ns > n * c->n_activated)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cpu combine",
                           "%lld tokens and %lld slots outside the chunk's [0, %lld] and [0, tokens x K]",
                           (long long)n, (long long)ns, (long long)b->chunk);
    for (int64_t s = 0; s < ns; s++)
        if (tok[s] < 0 || tok[s] >= n)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cpu combine", "slot %lld names token %d outside [0, %lld)",
                               (long long)s, tok[s], (long long)n);
    if (n == 0)
        return DSV4_OK;
    float *y = dsv4_cpu_ensure(b, B_Y, (size_t)(n * H) * sizeof(float));
    float *oc = dsv4_cpu_ensure(b, B_OC, (size_t)(ns * H) * sizeof(float));
    float *sh = shared ? dsv4_cpu_ensure(b, B_SH, (size_t)(n * H) * sizeof(float)) : NULL;
    if (!y || !oc || (shared && !sh))
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "cpu combine", "out of memory for %lld tokens", (long long)n);
    memset(y, 0, (size_t)(n * H) * sizeof *y);
    bf16_to_f32(o, oc, ns * H);
    comb_job cb = {y, oc, tok, c->weight_point == DSV4_WEIGHT_AFTER_W2 ? w : NULL, ns, H};
    dsv4_parallel_for(ns * H < 262144 ? 1 : b->threads, H, 64, dsv4_cpu_combine, &cb);
    if (shared) {
        bf16_to_f32(shared, sh, n * H);
        comb_job cs = {y, sh, NULL, NULL, n, H};
        dsv4_parallel_for(n * H < 262144 ? 1 : b->threads, H, 64, dsv4_cpu_combine, &cs);
    }
    out_job oj = {y, yout};
    dsv4_parallel_for(n * H < 262144 ? 1 : b->threads, n * H, 4096, dsv4_cpu_output_rows, &oj);
    return DSV4_OK;
}

const dsv4_backend_stages dsv4_cpu_backend_stages = {cpu_route, cpu_experts, cpu_combine, NULL, NULL};

/* ---------------- the memory model ---------------- */

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static uint64_t sat_mul(uint64_t a, uint64_t b) { return a && b > UINT64_MAX / a ? UINT64_MAX : a * b; }

/* Group buffers of `cap` rows of `rowb` bytes: one 64 MiB batch, at least the largest group
   and at most every row. */
static uint64_t groups_bytes(uint64_t rows, uint64_t largest, uint64_t rowb)
{
    uint64_t batch = (uint64_t)BATCH_BYTES / (rowb ? rowb : 1);
    uint64_t cap = batch < rows ? batch : rows;
    cap = cap > largest ? cap : largest;
    return sat_mul(cap, rowb);
}

/*
 * One rank alone (world 1), the forward: x, its two quantized copies and y as fp32 [Tc, H];
 * logits [Tc, E]; ids, weights and the permutation [Tc, K]; kept and flags [Tc]; per-expert
 * counts and offsets; group buffers of 2H + 3I fp32 values a row for `cap` rows (the largest
 * group is Tc, or Tc K when a hash row repeats an expert). A rank of several, the stages: route
 * (x fp32, logits, kept, flags), experts over at most M rows (M = the slots a rank can receive:
 * ep Tc min(K, E_local), ep Tc K on hash layers, Tc K without ep; at least Tc for the shared
 * expert; the rows fp32 and quantized, their order, offsets, group buffers of H + 3 I_rank
 * values a row), combine (y and the shared rows fp32 [Tc, H], the slots' outputs fp32
 * [Tc K, H]). Both: per worker a scratch of TILE_ROWS + SMALL_ROWS + 1 rows of max(H, I) fp32
 * values and the scalar path's decoded row.
 */
uint64_t dsv4_cpu_backend_workspace_bytes(const dsv4_config *c, const dsv4_shard *topo, int64_t tokens,
                                          dsv4_executor_kind ex)
{
    uint64_t t = (uint64_t)(tokens > 0 ? tokens : 0), E = (uint64_t)c->n_routed_experts, K = (uint64_t)c->n_activated;
    uint64_t H = (uint64_t)c->dim, I = (uint64_t)c->moe_inter_dim, kmax = H > I ? H : I;
    uint64_t workers = topo->host_threads > 0 ? (uint64_t)topo->host_threads : 1;
    bool hash = dsv4_config_is_hash_layer(c);
    uint64_t w = sat_mul(workers, sat_mul((uint64_t)(TILE_ROWS + SMALL_ROWS + 1), sat_mul(kmax, 4)));
    w = sat_add(w, sat_mul(workers, sat_mul(kmax, 4)));
    w = sat_add(w, sat_add(sat_mul(sat_mul(t, E), 4), sat_mul(2 * (E + 1), 8)));
    if (topo->world <= 1) {
        w = sat_add(w, sat_mul(sat_mul(4, t), sat_mul(H, 4)));
        w = sat_add(w, sat_mul(sat_mul(4, t), sat_mul(K, 4)));
        w = sat_add(w, sat_mul(t, 5));
        uint64_t tk = sat_mul(t, K);
        return sat_add(w, groups_bytes(tk, hash ? tk : t, sat_mul(sat_add(sat_mul(2, H), sat_mul(3, I)), 4)));
    }
    uint64_t ep = topo->ep > 1 ? (uint64_t)topo->ep : 1, tp = topo->tp > 1 ? (uint64_t)topo->tp : 1;
    uint64_t El = E / ep, Ir = I / tp;
    uint64_t kc = ep > 1 && !hash && El < K ? El : K;
    uint64_t M = sat_mul(sat_mul(ep, t), kc);
    M = M > t ? M : t;
    uint64_t largest = sat_mul(sat_mul(ep, t), hash ? K : 1);
    w = sat_add(w, sat_add(sat_mul(sat_mul(t, H), 4), sat_mul(t, 5)));           /* route */
    w = sat_add(w, sat_add(sat_mul(sat_mul(M, H), 8), sat_mul(M, 4)));           /* experts: rows, order */
    w = sat_add(w, groups_bytes(M, largest, sat_mul(sat_add(H, sat_mul(3, Ir)), 4)));
    w = sat_add(w, sat_mul(sat_mul(t, H), 8));                                   /* combine: y, shared */
    return sat_add(w, sat_mul(sat_mul(sat_mul(t, K), H), 4));                    /* combine: outputs */
}
