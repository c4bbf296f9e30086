/*
 * dsv4moe: the production planner (include/dsv4moe/plan.h, docs/planner.md).
 *
 * The planner knows no kernels and no backend by name. It checks the topology against the
 * layer config and the backend's capabilities (its registration, fast/backend/backend_reg.h),
 * picks a router and executors, sizes the chunking from the backend's memory model so that no
 * workspace grows with T without a bound, and writes every figure into the plan's record
 * (record.h). Every refusal happens here, at creation, naming the fields.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/plan.h"
#include "fast/backend/backend_reg.h"
#include "fast/plan/memory.h"
#include "fast/plan/record.h"
#include "core/err.h"
#include "core/strbuf.h"
#include "core/testctl.h"

/* Planner limits. */
#define PLAN_MAX_WORLD 64
#define PLAN_MAX_TOKENS_PER_RANK (INT64_C(1) << 24)
#define PLAN_AUTO_CHUNK_CAP INT64_C(16384)
#define PLAN_ALIGN INT64_C(128)
/* The per-step metadata collective: 8 int64 per rank of the world. */
#define PLAN_STEP_META_PER_RANK UINT64_C(64)

#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

static const char *dispatch_name(dsv4_dispatch_req d)
{
    switch (d) {
    case DSV4_DISPATCH_AUTO: return "auto";
    case DSV4_DISPATCH_ALL_GATHER: return "all_gather";
    case DSV4_DISPATCH_ALL_TO_ALL: return "all_to_all";
    case DSV4_DISPATCH_LOW_LATENCY: return "low_latency";
    }
    return "unknown";
}

static const char *executor_req_name(dsv4_executor_req e)
{
    switch (e) {
    case DSV4_EXECUTOR_AUTO: return "auto";
    case DSV4_EXECUTOR_CONTIGUOUS: return "contiguous";
    case DSV4_EXECUTOR_MASKED: return "masked";
    case DSV4_EXECUTOR_PER_TOKEN: return "per_token";
    }
    return "unknown";
}

/* ---------------------------------------------------------------------------
 * Explanation text
 * ------------------------------------------------------------------------- */
static bool explainf(dsv4_plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool explainf(dsv4_plan *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dsv4_sb_vprintf(&p->explain, fmt, ap);
    va_end(ap);
    dsv4_sb_put(&p->explain, "\n", 1);
    return !p->explain.oom;
}

/* "12.0 MiB", "1.2 GiB", "512 B". */
static const char *fmt_bytes(char *buf, size_t n, uint64_t v)
{
    if (v >= GIB)
        snprintf(buf, n, "%.2f GiB", (double)v / (double)GIB);
    else if (v >= MIB)
        snprintf(buf, n, "%.1f MiB", (double)v / (double)MIB);
    else if (v >= 1024)
        snprintf(buf, n, "%.1f KiB", (double)v / 1024.0);
    else
        snprintf(buf, n, "%llu B", (unsigned long long)v);
    return buf;
}

/*
 * The workspace of one chunk of tc tokens (tc > 0) with executor ex, by the backend's memory model
 * (its registration's; the executor layout model for one that brings none), plus the multi-rank
 * driver's buffers on a rank of several next to a backend's own model. 0 for tc <= 0.
 */
static uint64_t chunk_ws(const dsv4_plan *p, int64_t tc, dsv4_executor_kind ex)
{
    if (tc <= 0)
        return 0;
    const dsv4_backend_reg *be = p->backend_reg;
    if (!be->workspace_bytes)
        return dsv4_mem_layout_bytes(&p->cfg, &p->shard, tc, ex);
    uint64_t w = be->workspace_bytes(&p->cfg, &p->shard, tc, ex);
    if (p->topo.world_size > 1)
        w = dsv4_sat_add(w, dsv4_mem_driver_bytes(&p->cfg, &p->shard, tc, be->caps.device_rows));
    return w;
}

static uint64_t align128(uint64_t v) { return v > UINT64_MAX - 127 ? UINT64_MAX : (v + 127) / 128 * 128; }

static uint64_t step_meta(const dsv4_plan *p) { return PLAN_STEP_META_PER_RANK * (uint64_t)p->topo.world_size; }

/* The largest eager chunk workspace for a chunk size tc (monotone in tc). */
static uint64_t eager_ws_max(const dsv4_plan *p, int64_t tc)
{
    uint64_t w = chunk_ws(p, tc, p->eager_exec);
    if (p->eager_masked) {
        int64_t lim = p->masked_limit > 0 && p->masked_limit < tc ? p->masked_limit : tc;
        uint64_t m = chunk_ws(p, lim, DSV4_EXEC_MASKED);
        if (m > w)
            w = m;
    }
    return w;
}

/* What chunk sizing must fit: with graphs, eager masked steps (T <= the largest bucket) are
   bounded by the graph check at the largest bucket instead. */
static uint64_t sizing_ws(const dsv4_plan *p, int64_t tc)
{
    return p->topo.cuda_graph ? chunk_ws(p, tc, p->eager_exec) : eager_ws_max(p, tc);
}

/* The largest t in [1, hi] with chunk_ws(t, ex) <= avail, 0 if none. */
static int64_t largest_fitting(const dsv4_plan *p, int64_t hi, dsv4_executor_kind ex, uint64_t avail)
{
    int64_t lo = 0;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (chunk_ws(p, mid, ex) <= avail)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ---------------------------------------------------------------------------
 * Creation
 * ------------------------------------------------------------------------- */
#define REFUSE(...) dsv4_seterr(err, DSV4_ERR_REFUSED, "plan", __VA_ARGS__)

/* Whether the config's GEMMs can run on FP8 tensor cores (SPEC.md section 9): fp8/fp4 routed
   experts, an fp8 shared expert (or none), quantized activations, dims multiples of 128. */
static bool fp8_gemm_eligible(const dsv4_config *c, const char **why)
{
    if (c->routed_format == DSV4_FORMAT_BF16)
        *why = "routed_format is bf16";
    else if (c->n_shared_experts > 0 && c->shared_format == DSV4_FORMAT_BF16)
        *why = "shared_format is bf16";
    else if (c->act_quant == DSV4_ACT_QUANT_NONE)
        *why = "act_quant is none";
    else if (c->dim % 128 || c->moe_inter_dim % 128)
        *why = "dim or moe_inter_dim is not a multiple of 128";
    else
        return true;
    return false;
}

/* The backend's graph capabilities on architecture sm; NULL where it does not run that sm. */
static const dsv4_backend_sm *caps_of(const dsv4_backend_reg *be, int sm)
{
    for (int i = 0; i < be->caps.n_sms; i++)
        if (be->caps.sms[i].sm == sm)
            return &be->caps.sms[i];
    return NULL;
}

/* "90, 100, 103 or 120": the architectures a backend runs. */
static void sm_list(const dsv4_backend_reg *be, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < be->caps.n_sms && len < n; i++) {
        int w = snprintf(buf + len, n - len, "%s%d", !i ? "" : i == be->caps.n_sms - 1 ? " or " : ", ",
                         be->caps.sms[i].sm);
        if (w < 0)
            break;
        len += (size_t)w;
    }
}

static bool has_fp8(const dsv4_backend_reg *r) { return r->caps.gemm_fp8; }
static bool has_graphs(const dsv4_backend_reg *r) { return r->caps.graphs; }

static bool per_token_graph_safe(const dsv4_backend_sm *c, int ep)
{
    return c && (ep > 1 ? c->per_token_graph_ep : c->per_token_graph);
}

/* Writes the tp values in [1, 64] that satisfy the moe_inter_dim rule. */
static void working_tps(int64_t I, int64_t align, char *buf, size_t n)
{
    buf[0] = '\0';
    size_t len = 0;
    for (int64_t t = 1; t <= PLAN_MAX_WORLD; t++) {
        if (I % t || (align > 1 && (I / t) % align))
            continue;
        int w = snprintf(buf + len, n - len, "%s%lld", len ? ", " : "", (long long)t);
        if (w < 0 || (size_t)w >= n - len)
            break;
        len += (size_t)w;
    }
}

static dsv4_status budget_words(const dsv4_budget *b, uint64_t avail, char *buf, size_t n)
{
    char d[32], t[32], r[32], a[32];
    snprintf(buf, n,
             "device_bytes %llu (%s) - taken_bytes %llu (%s) - reserve %s = max(reserve_mb %llu MiB, 2 GiB, 5%% of "
             "device_bytes) leaves %llu bytes (%s) available",
             (unsigned long long)b->device_bytes, fmt_bytes(d, sizeof d, b->device_bytes),
             (unsigned long long)b->taken_bytes, fmt_bytes(t, sizeof t, b->taken_bytes),
             fmt_bytes(r, sizeof r, dsv4_budget_reserve(b)), (unsigned long long)b->reserve_mb,
             (unsigned long long)avail, fmt_bytes(a, sizeof a, avail));
    return DSV4_OK;
}

static dsv4_status check_topology(const dsv4_config *c, const dsv4_topology *t, dsv4_error *err)
{
    if ((unsigned)t->role > DSV4_ROLE_MIXED)
        return REFUSE("role %d is not prefill, decode or mixed", (int)t->role);
    const dsv4_backend_reg *be = dsv4_backend_registry_find(t->backend);
    char names[128];
    if (!be) {
        dsv4_backend_names_with(NULL, " or ", names, sizeof names);
        return REFUSE("backend %d is not %s", (int)t->backend, names);
    }
    if (c->gemm == DSV4_GEMM_FP8) {
        const char *why = "";
        dsv4_backend_names_with(has_fp8, " or ", names, sizeof names);
        if (!be->caps.gemm_fp8)
            return REFUSE("gemm fp8 needs backend %s (FP8 tensor cores; backend is %s): set gemm exact or auto", names,
                          be->name);
        if (!fp8_gemm_eligible(c, &why))
            return REFUSE("gemm fp8 needs fp8/fp4 weights with quantized activations and dims multiples of 128, "
                          "but %s: set gemm exact or auto", why);
    }
    if ((unsigned)t->dispatch > DSV4_DISPATCH_LOW_LATENCY)
        return REFUSE("dispatch %d is not auto, all_gather, all_to_all or low_latency", (int)t->dispatch);
    if ((unsigned)t->executor > DSV4_EXECUTOR_PER_TOKEN)
        return REFUSE("executor %d is not auto, contiguous, masked or per_token", (int)t->executor);
    if (t->world_size < 1 || t->world_size > PLAN_MAX_WORLD)
        return REFUSE("world_size %d is outside [1, %d]", t->world_size, PLAN_MAX_WORLD);
    if (t->tp < 1 || t->dp < 1 || t->ep < 1)
        return REFUSE("tp %d, dp %d and ep %d must each be >= 1", t->tp, t->dp, t->ep);
    if ((int64_t)t->tp * t->dp != t->world_size)
        return REFUSE("world_size %d != tp %d x dp %d (= %lld): set world_size to tp x dp, or tp and dp so that "
                      "their product is world_size",
                      t->world_size, t->tp, t->dp, (long long)t->tp * t->dp);
    if (t->world_size % t->ep)
        return REFUSE("ep %d does not divide world_size %d: ep groups are blocks of ep consecutive ranks; use an ep "
                      "that divides world_size",
                      t->ep, t->world_size);
    if (t->rank < 0 || t->rank >= t->world_size)
        return REFUSE("rank %d is outside [0, world_size %d)", t->rank, t->world_size);
    if (t->tp > 1 && t->ep > 1)
        return REFUSE("tp %d > 1 together with ep %d > 1: the MoE layer shards either moe_inter_dim over tp (with "
                      "an all_reduce) or the experts over ep, not both; what would work: tp 1, dp %d, ep %d (experts "
                      "over ep), or ep 1 with tp %d (inter over tp)",
                      t->tp, t->ep, t->world_size, t->ep, t->tp);
    if (c->n_routed_experts % t->ep)
        return REFUSE("n_routed_experts %lld is not a multiple of ep %d: every rank of an ep group holds "
                      "n_routed_experts / ep experts; use an ep that divides n_routed_experts",
                      (long long)c->n_routed_experts, t->ep);
    bool fp8 = c->routed_format == DSV4_FORMAT_FP8 || c->shared_format == DSV4_FORMAT_FP8;
    bool fp4 = c->routed_format == DSV4_FORMAT_FP4 || c->shared_format == DSV4_FORMAT_FP4;
    /* Activation quantization of h runs in groups of 128 along I: a shard must hold whole groups. */
    bool act_groups = (fp8 || fp4) && c->act_quant != DSV4_ACT_QUANT_NONE;
    int64_t align = fp8 || act_groups ? 128 : fp4 ? 32 : 1;
    if (c->moe_inter_dim % t->tp || (c->moe_inter_dim / t->tp) % align) {
        char tps[256];
        working_tps(c->moe_inter_dim, align, tps, sizeof tps);
        if (c->moe_inter_dim % t->tp)
            return REFUSE("moe_inter_dim %lld is not a multiple of tp %d; tp values that work: %s",
                          (long long)c->moe_inter_dim, t->tp, tps);
        return REFUSE("moe_inter_dim %lld / tp %d = %lld is not a multiple of %lld (%s groups need whole "
                      "blocks per shard); tp values that work: %s",
                      (long long)c->moe_inter_dim, t->tp, (long long)(c->moe_inter_dim / t->tp), (long long)align,
                      fp8 ? "fp8" : act_groups ? "activation quantization" : "fp4", tps);
    }
    if (be->caps.n_sms && !caps_of(be, t->sm)) {
        char sms[64];
        sm_list(be, sms, sizeof sms);
        return REFUSE("backend %s needs sm %s (sm is %d)", be->name, sms, t->sm);
    }
    if (t->cuda_graph && !be->caps.graphs) {
        dsv4_backend_names_with(has_graphs, " or ", names, sizeof names);
        return REFUSE("cuda_graph requires backend %s (backend is %s): set cuda_graph off, or backend %s", names,
                      be->name, names);
    }
    if (t->host_threads < 0 || t->host_threads > 256)
        return REFUSE("host_threads %d is outside [0, 256]", t->host_threads);
    if (t->max_tokens_per_rank < 1 || t->max_tokens_per_rank > PLAN_MAX_TOKENS_PER_RANK)
        return REFUSE("max_tokens_per_rank %lld is outside [1, %lld]", (long long)t->max_tokens_per_rank,
                      (long long)PLAN_MAX_TOKENS_PER_RANK);
    if (t->chunk_tokens < 0)
        return REFUSE("chunk_tokens %lld is negative (0 lets the planner choose)", (long long)t->chunk_tokens);
    if (t->chunk_tokens > 0 && t->chunk_tokens % PLAN_ALIGN && t->chunk_tokens != t->max_tokens_per_rank)
        return REFUSE("chunk_tokens %lld must be a multiple of 128 or equal to max_tokens_per_rank %lld (0 lets the "
                      "planner choose)",
                      (long long)t->chunk_tokens, (long long)t->max_tokens_per_rank);
    if (t->chunk_tokens > t->max_tokens_per_rank)
        return REFUSE("chunk_tokens %lld exceeds max_tokens_per_rank %lld: use chunk_tokens <= max_tokens_per_rank "
                      "(0 lets the planner choose)",
                      (long long)t->chunk_tokens, (long long)t->max_tokens_per_rank);
    if (t->n_buckets < 0 || t->n_buckets > DSV4_MAX_BUCKETS)
        return REFUSE("n_buckets %d is outside [0, %d] (buckets)", t->n_buckets, DSV4_MAX_BUCKETS);
    if (t->cuda_graph) {
        if (t->n_buckets < 1)
            return REFUSE("cuda_graph needs at least one capture bucket (buckets are empty, n_buckets 0): give "
                          "buckets, e.g. 1,2,4,...,256, or set cuda_graph off");
        for (int i = 0; i < t->n_buckets; i++) {
            if (t->buckets[i] < 1)
                return REFUSE("buckets[%d] %lld must be positive", i, (long long)t->buckets[i]);
            if (i && t->buckets[i] <= t->buckets[i - 1])
                return REFUSE("buckets must be strictly ascending: buckets[%d] %lld after buckets[%d] %lld", i,
                              (long long)t->buckets[i], i - 1, (long long)t->buckets[i - 1]);
            if (t->buckets[i] > t->max_tokens_per_rank)
                return REFUSE("buckets[%d] %lld exceeds max_tokens_per_rank %lld: use buckets <= "
                              "max_tokens_per_rank",
                              i, (long long)t->buckets[i], (long long)t->max_tokens_per_rank);
        }
    }
    if (DSV4_TESTHOOK(REFUSE_SINGLE_RANK_ALL_GATHER) && t->world_size == 1 && t->dispatch == DSV4_DISPATCH_ALL_GATHER)
        return REFUSE("no suitable MoE strategy found for configuration: check routed_format, ep and parallelism");
    /* Dispatch. */
    if (t->ep == 1 && (t->dispatch == DSV4_DISPATCH_ALL_TO_ALL || t->dispatch == DSV4_DISPATCH_LOW_LATENCY))
        return REFUSE("dispatch %s needs ep > 1 (ep is 1): with ep 1 every rank holds every expert; use dispatch "
                      "auto%s, or ep > 1",
                      dispatch_name(t->dispatch), t->dp > 1 ? " or all_gather" : "");
    if (t->ep > 1 && t->dispatch == DSV4_DISPATCH_ALL_GATHER)
        return REFUSE("dispatch all_gather with ep %d > 1: experts are sharded over ep, so token-slots travel by "
                      "all-to-all; use dispatch auto, all_to_all or low_latency (decode), or ep 1",
                      t->ep);
    if (t->dispatch == DSV4_DISPATCH_LOW_LATENCY && t->role != DSV4_ROLE_DECODE && !DSV4_TESTHOOK(LOW_LATENCY_ANY_ROLE))
        return REFUSE("low-latency dispatch is decode-only: role %s with dispatch low_latency would fail at the "
                      "first prefill request; use dispatch all_to_all (normal) for prefill, or role decode",
                      dsv4_role_name(t->role));
    /* Executors under graphs. */
    if (t->cuda_graph) {
        const dsv4_backend_sm *cap = caps_of(be, t->sm);
        if (t->executor == DSV4_EXECUTOR_CONTIGUOUS)
            return REFUSE("executor contiguous with cuda_graph on: contiguous is not graph-safe (its per-expert "
                          "group sizes are read on the host); use executor auto, or cuda_graph off");
        if (t->executor == DSV4_EXECUTOR_MASKED && !cap->masked_graph)
            return REFUSE("executor masked with cuda_graph on sm %d: masked is graph-validated on sm 90 only; use "
                          "executor auto%s, sm 90, or cuda_graph off",
                          t->sm, per_token_graph_safe(cap, t->ep) ? " or per_token" : "");
        if (t->executor == DSV4_EXECUTOR_PER_TOKEN && !per_token_graph_safe(cap, t->ep))
            return REFUSE("executor per_token with cuda_graph on sm %d and ep %d: per_token is not graph-safe "
                          "there; use executor auto%s, or cuda_graph off",
                          t->sm, t->ep, cap->masked_graph ? " or masked" : "");
        bool f04 = DSV4_TESTHOOK(MASKED_GRAPH_ON_SM10X) && t->sm / 10 == 10; /* test hook: sm 10x taken as masked-safe */
        if (!cap->masked_graph && !per_token_graph_safe(cap, t->ep) && !f04) {
            if (DSV4_TESTHOOK(REFUSAL_OMITS_CUDA_GRAPH)) /* test hook: the refusal names the wrong settings */
                return REFUSE("no suitable MoE strategy found for configuration: check routed_format, ep, parallelism");
            return REFUSE("cuda_graph on with ep %d > 1 on sm %d: no executor is graph-safe there (masked is "
                          "graph-validated on sm 90; per_token on sm %d only with ep 1); what would work: "
                          "cuda_graph off, or sm 90, or ep 1",
                          t->ep, t->sm, t->sm);
        }
    }
    return DSV4_OK;
}

static uint64_t workspace_max(const dsv4_plan *plan);

static dsv4_status plan_budget(dsv4_plan *p, dsv4_error *err)
{
    const dsv4_topology *t = &p->topo;
    uint64_t avail = p->available;
    char words[512], a[32], b[32];
    budget_words(&p->budget, avail, words, sizeof words);
    uint64_t meta = step_meta(p);
    uint64_t room = avail > meta ? avail - meta : 0;
    int64_t min_chunk = t->max_tokens_per_rank < PLAN_ALIGN ? t->max_tokens_per_rank : PLAN_ALIGN;
    if (t->chunk_tokens > 0 && t->chunk_tokens < min_chunk)
        min_chunk = t->chunk_tokens;
    if (p->eager_masked && !t->cuda_graph)
        p->masked_limit = INT64_MAX; /* every eager chunk; the chunk is sized by masked */
    uint64_t need_min = dsv4_sat_add(sizing_ws(p, min_chunk), meta);
    if (need_min > avail)
        return REFUSE("budget too small: the smallest chunk (%lld tokens, executor %s) needs %llu bytes (%s) of "
                      "workspace but %s; what would work: lower taken_bytes or reserve_mb, a larger device_bytes, "
                      "or more ranks to spread the experts (ep) or moe_inter_dim (tp)",
                      (long long)min_chunk, dsv4_executor_kind_name(p->eager_masked && !t->cuda_graph ? DSV4_EXEC_MASKED : p->eager_exec),
                      (unsigned long long)need_min, fmt_bytes(a, sizeof a, need_min), words);
    /* The largest chunk that fits: max_tokens_per_rank itself when it is at most the cap, else a
       multiple of 128 (eager_ws_max is monotone in the chunk). */
    int64_t cap = t->max_tokens_per_rank < PLAN_AUTO_CHUNK_CAP ? t->max_tokens_per_rank : PLAN_AUTO_CHUNK_CAP;
    int64_t best;
    if (sizing_ws(p, cap) <= room) {
        best = cap;
    } else {
        int64_t lo = 0, hi = cap / PLAN_ALIGN; /* in units of 128 */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo + 1) / 2;
            if (sizing_ws(p, mid * PLAN_ALIGN) <= room)
                lo = mid;
            else
                hi = mid - 1;
        }
        best = lo ? lo * PLAN_ALIGN : min_chunk;
    }
    if (t->chunk_tokens > 0) {
        uint64_t need = dsv4_sat_add(sizing_ws(p, t->chunk_tokens), meta);
        if (need > avail)
            return REFUSE("chunk_tokens %lld needs %llu bytes (%s) of workspace but %s; the largest chunk that fits "
                          "is %lld tokens: use chunk_tokens %lld (or 0 to let the planner choose), or a larger budget",
                          (long long)t->chunk_tokens, (unsigned long long)need, fmt_bytes(a, sizeof a, need), words,
                          (long long)best, (long long)best);
        p->chunk = t->chunk_tokens;
    } else {
        p->chunk = best;
    }
    if (p->eager_masked && !t->cuda_graph)
        p->masked_limit = p->chunk;
    uint64_t ew = dsv4_sat_add(sizing_ws(p, p->chunk), meta);
    explainf(p, "chunking: %lld tokens per chunk (workspace %s of %s available; %s)", (long long)p->chunk,
             fmt_bytes(a, sizeof a, ew), fmt_bytes(b, sizeof b, avail),
             t->chunk_tokens > 0 ? "chunk_tokens as asked"
             : p->chunk == t->max_tokens_per_rank && p->chunk <= PLAN_AUTO_CHUNK_CAP
                 ? "max_tokens_per_rank fits in one chunk"
                 : p->chunk == PLAN_AUTO_CHUNK_CAP ? "the cap of 16384 tokens"
                                                   : "the largest multiple of 128 that fits");
    return DSV4_OK;
}

static dsv4_status plan_graph(dsv4_plan *p, dsv4_error *err)
{
    const dsv4_topology *t = &p->topo;
    const dsv4_backend_sm *cap = caps_of(p->backend_reg, t->sm);
    int64_t bmax = dsv4_plan_largest_bucket(p);
    uint64_t meta = step_meta(p), avail = p->available;
    uint64_t room = avail > meta ? avail - meta : 0;
    char words[512], a[32], r[32];
    budget_words(&p->budget, avail, words, sizeof words);
    if (bmax > p->chunk)
        return REFUSE("buckets up to %lld tokens exceed the chunk of %lld tokens (chunk_tokens%s): a graph replays "
                      "one chunk; use buckets <= %lld, a larger budget, or cuda_graph off",
                      (long long)bmax, (long long)p->chunk, t->chunk_tokens ? "" : " chosen for the budget",
                      (long long)p->chunk);
    uint64_t tg, s;
    dsv4_mem_chunk_shape(&p->cfg, &p->shard, bmax, &tg, &s);
    uint64_t mw = dsv4_sat_add(chunk_ws(p, bmax, DSV4_EXEC_MASKED), meta);
    bool masked_fits = mw <= avail;
    bool pt_safe = per_token_graph_safe(cap, t->ep);
    bool masked_ok = cap->masked_graph || (DSV4_TESTHOOK(MASKED_GRAPH_ON_SM10X) && t->sm / 10 == 10);
    if (t->executor == DSV4_EXECUTOR_MASKED || (t->executor == DSV4_EXECUTOR_AUTO && masked_ok)) {
        if (masked_fits) {
            p->graph_exec = DSV4_EXEC_MASKED;
            explainf(p,
                     "executor: masked for graph replays (bucket <= %lld tokens: %lld x %llu rows = %s fits; masked "
                     "is graph-validated on sm %d), %s for eager steps%s",
                     (long long)bmax, (long long)p->shard.e_count, (unsigned long long)align128(tg),
                     fmt_bytes(a, sizeof a, mw), t->sm, dsv4_executor_kind_name(p->eager_exec),
                     p->eager_masked ? " beyond the largest bucket (masked up to it)" : "");
            return DSV4_OK;
        }
        int64_t fit = largest_fitting(p, bmax, DSV4_EXEC_MASKED, room);
        if (t->executor == DSV4_EXECUTOR_MASKED)
            return REFUSE("executor masked at the largest bucket (buckets up to %lld tokens) needs %llu bytes (%s) "
                          "but %s; what would work: executor auto, buckets up to %lld tokens, or a larger budget",
                          (long long)bmax, (unsigned long long)mw, fmt_bytes(a, sizeof a, mw), words, (long long)fit);
        if (!pt_safe)
            return REFUSE("cuda_graph: the masked executor at the largest bucket (buckets up to %lld tokens) needs "
                          "%llu bytes (%s) but %s, and no other executor is graph-safe on sm %d; what would work: "
                          "buckets up to %lld tokens, a larger budget, or cuda_graph off",
                          (long long)bmax, (unsigned long long)mw, fmt_bytes(a, sizeof a, mw), words, t->sm,
                          (long long)fit);
    }
    /* per_token: asked for, the only graph-safe executor, or the fallback when masked does not fit. */
    uint64_t pw = dsv4_sat_add(chunk_ws(p, bmax, DSV4_EXEC_PER_TOKEN), meta);
    if (pw > avail)
        return REFUSE("cuda_graph: the per_token executor at the largest bucket (buckets up to %lld tokens) needs "
                      "%llu bytes (%s) but %s; what would work: smaller buckets, a larger budget, or cuda_graph off",
                      (long long)bmax, (unsigned long long)pw, fmt_bytes(a, sizeof a, pw), words);
    p->graph_exec = DSV4_EXEC_PER_TOKEN;
    if (t->executor == DSV4_EXECUTOR_PER_TOKEN)
        explainf(p, "executor: per_token for graph replays and eager steps (executor per_token as asked; graph-safe "
                    "on sm %d with ep %d; bucket <= %lld tokens: %s)",
                 t->sm, t->ep, (long long)bmax, fmt_bytes(a, sizeof a, pw));
    else if (cap->masked_graph)
        explainf(p, "executor: per_token for graph replays (masked at bucket %lld would need %s of %s available; "
                    "per_token is graph-safe on sm %d), %s for eager steps",
                 (long long)bmax, fmt_bytes(a, sizeof a, mw), fmt_bytes(r, sizeof r, avail), t->sm,
                 dsv4_executor_kind_name(p->eager_exec));
    else
        explainf(p, "executor: per_token for graph replays (the graph-safe executor on sm %d with ep %d; bucket <= "
                    "%lld tokens: %s), %s for eager steps",
                 t->sm, t->ep, (long long)bmax, fmt_bytes(a, sizeof a, pw), dsv4_executor_kind_name(p->eager_exec));
    return DSV4_OK;
}

dsv4_status dsv4_plan_create(const dsv4_config *cfg, const dsv4_topology *topo, const dsv4_budget *budget,
                             dsv4_plan **out, dsv4_error *err)
{
    if (out)
        *out = NULL;
    if (!cfg || !topo || !budget || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "plan", "cfg, topo, budget and out must not be NULL");
    if (topo->struct_size != sizeof(dsv4_topology))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "plan",
                           "topology struct_size %u is not %zu: fill it with dsv4_topology_init()",
                           (unsigned)topo->struct_size, sizeof(dsv4_topology));
    if (budget->struct_size != sizeof(dsv4_budget))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "plan",
                           "budget struct_size %u is not %zu: fill it with dsv4_budget_init()",
                           (unsigned)budget->struct_size, sizeof(dsv4_budget));
    dsv4_status st = dsv4_config_validate(cfg, err);
    if (st)
        return st;
    if ((st = check_topology(cfg, topo, err)))
        return st;

    dsv4_plan *p = calloc(1, sizeof *p);
    if (!p)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "plan", "out of memory");
    p->cfg = *cfg;
    p->topo = *topo;
    p->budget = *budget;
    p->available = dsv4_budget_available(budget);
    const dsv4_topology *t = &p->topo;
    int64_t E = cfg->n_routed_experts;
    p->shard.e_count = E / t->ep;
    p->shard.e_first = (int64_t)(t->rank % t->ep) * p->shard.e_count;
    p->shard.i_count = cfg->moe_inter_dim / t->tp;
    p->shard.i_first = (int64_t)(t->rank % t->tp) * p->shard.i_count;
    const dsv4_backend_reg *be = dsv4_backend_registry_find(t->backend);
    p->backend_reg = be;
    p->shard.world = t->world_size, p->shard.tp = t->tp, p->shard.dp = t->dp, p->shard.ep = t->ep;
    p->shard.rank = t->rank;
    p->shard.host_threads = t->host_threads > 0 ? t->host_threads : 1;
    char nofp8buf[128] = "";
    const char *nofp8 = nofp8buf;
    bool fp8 = be->caps.gemm_fp8 && fp8_gemm_eligible(cfg, &nofp8);
    if (!be->caps.gemm_fp8) { /* the explanation names the backends that would run it */
        char fp8names[96];
        dsv4_backend_names_with(has_fp8, " or ", fp8names, sizeof fp8names);
        snprintf(nofp8buf, sizeof nofp8buf, "backend is not %s", fp8names);
    }
    p->shard.gemm = cfg->gemm == DSV4_GEMM_AUTO ? (fp8 ? DSV4_GEMM_FP8 : DSV4_GEMM_EXACT) : cfg->gemm;
    uint64_t row_bytes = dsv4_mem_row_bytes(cfg, p->shard.i_count, p->shard.gemm);

    char a[32], b[32], c[32], d[32], smw[16] = "";
    uint64_t reserve = dsv4_budget_reserve(budget);
    if (be->caps.n_sms)
        snprintf(smw, sizeof smw, " sm %d", t->sm);
    bool ok = explainf(p, "topology: rank %d of world_size %d (tp %d x dp %d, ep %d), role %s, backend %s%s, "
                          "cuda_graph %s, max_tokens_per_rank %lld, dispatch %s, executor %s",
                       t->rank, t->world_size, t->tp, t->dp, t->ep, dsv4_role_name(t->role),
                       dsv4_backend_kind_name(t->backend), smw, t->cuda_graph ? "on" : "off",
                       (long long)t->max_tokens_per_rank, dispatch_name(t->dispatch), executor_req_name(t->executor));
    ok = ok && explainf(p, "gemm: %s (%s)", dsv4_gemm_mode_name(p->shard.gemm),
                        p->shard.gemm == DSV4_GEMM_FP8 ? (cfg->gemm == DSV4_GEMM_FP8 ? "as asked: e4m3 tensor cores, fp32 "
                                                                                "promotion every 128 of K"
                                                                              : "auto: e4m3 tensor cores on cuda, fp32 "
                                                                                "promotion every 128 of K")
                        : cfg->gemm == DSV4_GEMM_EXACT ? "as asked: exact products"
                                                       : nofp8);
    ok = ok && explainf(p, "budget: device %s - taken %s - reserve %s (max(reserve_mb %llu MiB, 2 GiB, 5%% of "
                           "device)) = %s available",
                        fmt_bytes(a, sizeof a, budget->device_bytes), fmt_bytes(b, sizeof b, budget->taken_bytes),
                        fmt_bytes(c, sizeof c, reserve), (unsigned long long)budget->reserve_mb,
                        fmt_bytes(d, sizeof d, p->available));

    /* Router. */
    if (t->ep > 1) {
        p->shard.router = t->dispatch == DSV4_DISPATCH_LOW_LATENCY ? DSV4_ROUTER_EP_LOW_LATENCY : DSV4_ROUTER_EP_ALL_TO_ALL;
        ok = ok && explainf(p, "router: %s (ep %d > 1: experts %lld..%lld of %lld on rank %d, ep rank %d%s)",
                            dsv4_router_kind_name(p->shard.router), t->ep, (long long)p->shard.e_first,
                            (long long)(p->shard.e_first + p->shard.e_count - 1), (long long)E, t->rank, t->rank % t->ep,
                            p->shard.router == DSV4_ROUTER_EP_LOW_LATENCY ? "; low_latency as asked, role decode"
                            : t->dispatch == DSV4_DISPATCH_AUTO     ? "; normal mode"
                                                                    : "; all_to_all as asked");
    } else if (t->dp > 1) {
        p->shard.router = DSV4_ROUTER_DP_ALL_GATHER;
        ok = ok && explainf(p, "router: dp_all_gather (ep 1, dp %d > 1: tokens of the %d dp ranks gathered, all %lld "
                               "experts on every rank%s)",
                            t->dp, t->dp, (long long)E, t->tp > 1 ? ", moe_inter_dim over tp with an all_reduce" : "");
    } else {
        p->shard.router = DSV4_ROUTER_LOCAL;
        ok = ok && explainf(p, "router: local (ep 1, dp 1: all %lld experts on this rank%s%s)", (long long)E,
                            t->tp > 1 ? ", moe_inter_dim over tp with an all_reduce" : "",
                            t->dispatch == DSV4_DISPATCH_ALL_GATHER ? "; all_gather over dp 1 is local" : "");
    }
    ok = ok && explainf(p, "experts: %lld..%lld of %lld (ep rank %d of %d); inter: %lld..%lld of %lld (tp rank %d of %d)",
                        (long long)p->shard.e_first, (long long)(p->shard.e_first + p->shard.e_count - 1), (long long)E, t->rank % t->ep,
                        t->ep, (long long)p->shard.i_first, (long long)(p->shard.i_first + p->shard.i_count - 1),
                        (long long)cfg->moe_inter_dim, t->rank % t->tp, t->tp);
    ok = ok && explainf(p, "rows: %llu bytes per executor row (H %lld, Il %lld, %s activations)",
                        (unsigned long long)row_bytes, (long long)cfg->dim, (long long)p->shard.i_count,
                        dsv4_mem_acts_quantized(cfg) ? "fp8 (1 byte + fp32 scale per 128)" : "bf16 (2 bytes)");
    p->shard.sharded = p->shard.router != DSV4_ROUTER_LOCAL || p->shard.e_count != E ||
                       p->shard.i_count != cfg->moe_inter_dim;
    uint64_t wb = p->weight_bytes = be->weight_bytes ? be->weight_bytes(cfg, &p->shard) : 0;
    if (wb)
        ok = ok && explainf(p, "weights: %s on this rank (backend %s: the router, experts %lld..%lld, inter %lld..%lld), "
                               "outside the workspace: count them in the budget's taken_bytes",
                            fmt_bytes(a, sizeof a, wb), dsv4_backend_kind_name(t->backend), (long long)p->shard.e_first,
                            (long long)(p->shard.e_first + p->shard.e_count - 1), (long long)p->shard.i_first,
                            (long long)(p->shard.i_first + p->shard.i_count - 1));

    /* Eager executor. */
    p->eager_exec = DSV4_EXEC_CONTIGUOUS;
    if (t->executor == DSV4_EXECUTOR_PER_TOKEN)
        p->eager_exec = DSV4_EXEC_PER_TOKEN;
    if (t->executor == DSV4_EXECUTOR_MASKED) {
        p->eager_masked = true;
        p->masked_limit = dsv4_plan_largest_bucket(p);
    }
    if (DSV4_TESTHOOK(UNBOUNDED_MASKED_PREFILL) && t->cuda_graph && t->world_size == 1 && t->executor == DSV4_EXECUTOR_AUTO)
        p->eager_masked = true, p->masked_limit = INT64_MAX; /* test hook: eager prefill masked, no token bound */
    if (!ok) {
        dsv4_plan_free(p);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "plan", "out of memory");
    }
    if ((st = plan_budget(p, err)) || (t->cuda_graph && (st = plan_graph(p, err)))) {
        dsv4_plan_free(p);
        return st;
    }
    if (!t->cuda_graph) {
        if (t->executor == DSV4_EXECUTOR_MASKED)
            ok = explainf(p, "executor: masked for eager steps of at most one chunk (executor masked as asked; %lld "
                             "x align128(tokens) rows, sized into the chunk), contiguous beyond",
                          (long long)p->shard.e_count);
        else
            ok = explainf(p, "executor: %s for eager steps (%s; no graph replays: cuda_graph off)",
                          dsv4_executor_kind_name(p->eager_exec),
                          t->executor == DSV4_EXECUTOR_AUTO ? "token-slots grouped per expert, rows bounded by the chunk"
                                                            : "as asked");
    }
    uint64_t wmax = p->workspace_max = workspace_max(p);
    ok = ok && explainf(p, "workspace: at most %s of %s available (eager chunk %s%s%s)", fmt_bytes(a, sizeof a, wmax),
                        fmt_bytes(b, sizeof b, p->available),
                        fmt_bytes(c, sizeof c, dsv4_sat_add(eager_ws_max(p, p->chunk), step_meta(p))),
                        t->cuda_graph ? ", graph at the largest bucket " : "",
                        t->cuda_graph ? fmt_bytes(d, sizeof d, dsv4_sat_add(chunk_ws(p, dsv4_plan_largest_bucket(p), p->graph_exec),
                                                                       step_meta(p)))
                                      : "");
    ok = ok && explainf(p, "symmetry: every step first issues one %llu-byte metadata collective over the world (max "
                           "T, chunks, replay: eager if any rank cannot replay), then ceil(max T / %lld) chunks on every "
                           "rank, each with its dispatch and combine even for 0 rows",
                        (unsigned long long)step_meta(p), (long long)p->chunk);
    if (!ok) {
        dsv4_plan_free(p);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "plan", "out of memory");
    }
    if (wmax > p->available && !DSV4_TESTHOOK(UNBOUNDED_MASKED_PREFILL)) { /* cannot happen by construction */
        dsv4_plan_free(p);
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, "plan", "workspace %llu exceeds the available %llu",
                           (unsigned long long)wmax, (unsigned long long)p->available);
    }
    *out = p;
    return DSV4_OK;
}

uint64_t dsv4_plan_workspace_bytes(const dsv4_plan *plan, int64_t tokens, bool graph_replay)
{
    if (!plan)
        return 0;
    if (tokens < 0)
        tokens = 0;
    uint64_t meta = step_meta(plan);
    if (graph_replay && dsv4_plan_can_replay(plan, tokens))
        return dsv4_sat_add(chunk_ws(plan, dsv4_plan_bucket_for(plan, tokens), plan->graph_exec), meta);
    int64_t tc = tokens < plan->chunk ? tokens : plan->chunk;
    return dsv4_sat_add(chunk_ws(plan, tc, dsv4_plan_eager_exec_at(plan, tokens)), meta);
}

/* The largest workspace over every step of the plan (the record's workspace_max). */
static uint64_t workspace_max(const dsv4_plan *plan)
{
    uint64_t w = eager_ws_max(plan, plan->chunk);
    if (plan->topo.cuda_graph) {
        uint64_t g = chunk_ws(plan, dsv4_plan_largest_bucket(plan), plan->graph_exec);
        if (g > w)
            w = g;
    }
    return dsv4_sat_add(w, step_meta(plan));
}
