/* The production planner: every topology either plans within its budget or is refused naming the fields. */
#include <check.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "dsv4moe/config.h"
#include "dsv4moe/plan.h"
#include "tests/testutil.h"

Suite *plan_suite(void);

#define GIB (UINT64_C(1) << 30)
#define MIB (UINT64_C(1) << 20)

static dsv4_config cfg_of(const char *preset, int64_t layer)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset(preset, &c, NULL), DSV4_OK);
    c.layer = layer;
    return c;
}

static dsv4_topology topo_of(int tp, int dp, int ep, int rank)
{
    dsv4_topology t;
    dsv4_topology_init(&t);
    t.tp = tp;
    t.dp = dp;
    t.ep = ep;
    t.world_size = tp * dp;
    t.rank = rank;
    return t;
}

static void set_graph(dsv4_topology *t, int sm, int64_t bmax)
{
    t->backend = DSV4_BACKEND_CUDA;
    t->sm = sm;
    t->cuda_graph = true;
    t->n_buckets = 0;
    for (int64_t b = 1; b <= bmax && t->n_buckets < DSV4_MAX_BUCKETS; b *= 2)
        t->buckets[t->n_buckets++] = b;
}

static dsv4_budget budget_of(double device_gib, double taken_gib, uint64_t reserve_mb)
{
    dsv4_budget b;
    dsv4_budget_init(&b);
    b.device_bytes = (uint64_t)(device_gib * (double)GIB);
    b.taken_bytes = (uint64_t)(taken_gib * (double)GIB);
    b.reserve_mb = reserve_mb;
    return b;
}

static int64_t largest_bucket(const dsv4_topology *t) { return t->cuda_graph ? t->buckets[t->n_buckets - 1] : 0; }

/* Every invariant of an accepted plan. */
static void check_plan(const dsv4_plan *p, const char *ctx)
{
    const dsv4_topology *t = dsv4_plan_topology(p);
    const dsv4_config *c = dsv4_plan_config(p);
    uint64_t avail = dsv4_plan_budget_available(p), wmax = dsv4_plan_workspace_max(p);
    int64_t chunk = dsv4_plan_chunk_tokens(p), bmax = largest_bucket(t);
    ck_assert_msg(wmax <= avail, "%s: workspace_max %" PRIu64 " > available %" PRIu64, ctx, wmax, avail);
    ck_assert_msg(chunk > 0 && (chunk % 128 == 0 || chunk == t->max_tokens_per_rank), "%s: chunk %lld", ctx,
                  (long long)chunk);
    ck_assert_msg(chunk <= t->max_tokens_per_rank, "%s", ctx);
    if (t->chunk_tokens > 0)
        ck_assert_int_eq(chunk, t->chunk_tokens);
    else
        ck_assert_msg(chunk <= 16384, "%s", ctx);
    if (t->cuda_graph)
        ck_assert_msg(bmax <= chunk, "%s: a replay is one chunk", ctx);

    int64_t ts[64];
    int nt = 0;
    const int64_t fixed[] = {0, 1, 2, 127, 128, 129};
    for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++)
        ts[nt++] = fixed[k];
    for (int k = 0; k < t->n_buckets; k++)
        ts[nt++] = t->buckets[k];
    ts[nt++] = chunk - 1;
    ts[nt++] = chunk;
    ts[nt++] = chunk + 1;
    ts[nt++] = t->max_tokens_per_rank;
    ts[nt++] = 4 * t->max_tokens_per_rank; /* beyond the max: still chunked */
    for (int k = 0; k < nt; k++) {
        int64_t T = ts[k];
        for (int g = 0; g < 2; g++) {
            uint64_t w = dsv4_plan_workspace_bytes(p, T, g);
            ck_assert_msg(w <= avail && w <= wmax, "%s: workspace(%lld, graph %d) %" PRIu64 " > %" PRIu64, ctx,
                          (long long)T, g, w, avail);
        }
        ck_assert_int_eq(dsv4_plan_chunks(p, T), T <= 0 ? 0 : (T + chunk - 1) / chunk);
        dsv4_executor_kind e = dsv4_plan_executor(p, T, false);
        if (e == DSV4_EXEC_MASKED)
            ck_assert_msg(t->cuda_graph ? T <= bmax : T <= chunk, "%s: masked for an eager step of %lld tokens", ctx,
                          (long long)T);
        if (t->executor == DSV4_EXECUTOR_AUTO)
            ck_assert_msg(e == DSV4_EXEC_CONTIGUOUS, "%s: eager executor", ctx);
        bool rep = dsv4_plan_can_replay(p, T);
        ck_assert_int_eq(rep, t->cuda_graph && T <= bmax);
        if (rep) {
            dsv4_executor_kind ge = dsv4_plan_executor(p, T, true);
            ck_assert_msg(ge != DSV4_EXEC_CONTIGUOUS, "%s: contiguous is not graph-safe", ctx);
            if (ge == DSV4_EXEC_MASKED)
                ck_assert_int_eq(t->sm, 90);
            else
                ck_assert_msg(t->sm == 120 || (t->ep == 1 && (t->sm == 100 || t->sm == 103)) ||
                                  (t->sm == 90 && t->executor == DSV4_EXECUTOR_PER_TOKEN),
                              "%s: per_token is not graph-safe on sm %d ep %d", ctx, t->sm, t->ep);
        } else {
            ck_assert_int_eq(dsv4_plan_executor(p, T, true), e); /* a step that cannot replay runs eager */
        }
    }
    /* router */
    dsv4_router_kind r = dsv4_plan_router(p);
    if (t->ep > 1)
        ck_assert_int_eq(r, t->dispatch == DSV4_DISPATCH_LOW_LATENCY ? DSV4_ROUTER_EP_LOW_LATENCY
                                                                      : DSV4_ROUTER_EP_ALL_TO_ALL);
    else
        ck_assert_int_eq(r, t->dp > 1 ? DSV4_ROUTER_DP_ALL_GATHER : DSV4_ROUTER_LOCAL);
    /* experts and inter */
    ck_assert_int_eq(dsv4_plan_expert_count(p) * t->ep, c->n_routed_experts);
    ck_assert_int_eq(dsv4_plan_expert_first(p), (t->rank % t->ep) * dsv4_plan_expert_count(p));
    ck_assert_int_eq(dsv4_plan_inter_count(p) * t->tp, c->moe_inter_dim);
    ck_assert_int_eq(dsv4_plan_inter_first(p), (t->rank % t->tp) * dsv4_plan_inter_count(p));
    const char *ex = dsv4_plan_explain(p);
    ck_assert_ptr_nonnull(strstr(ex, "router: "));
    ck_assert_ptr_nonnull(strstr(ex, "executor: "));
    ck_assert_ptr_nonnull(strstr(ex, "chunking: "));
    ck_assert_ptr_nonnull(strstr(ex, "symmetry: "));
}

/* Plans and checks; fails the test with the message on refusal. */
static dsv4_plan *plan_ok(const dsv4_config *c, const dsv4_topology *t, const dsv4_budget *b)
{
    dsv4_plan *p = NULL;
    dsv4_error err;
    dsv4_error_clear(&err);
    dsv4_status st = dsv4_plan_create(c, t, b, &p, &err);
    ck_assert_msg(st == DSV4_OK, "expected a plan, got: %s", err.message);
    ck_assert_ptr_nonnull(p);
    check_plan(p, "plan_ok");
    return p;
}

/* Expects a refusal whose message contains every name (NULL-terminated); returns the message. */
static const char *refused(const dsv4_config *c, const dsv4_topology *t, const dsv4_budget *b, ...)
{
    static dsv4_error err;
    dsv4_error_clear(&err);
    dsv4_plan *p = (dsv4_plan *)&err; /* must be reset to NULL */
    dsv4_status st = dsv4_plan_create(c, t, b, &p, &err);
    ck_assert_msg(st == DSV4_ERR_REFUSED, "expected a refusal, got status %d: %s", (int)st, err.message);
    ck_assert_ptr_null(p);
    ck_assert_str_eq(err.where, "plan");
    va_list ap;
    va_start(ap, b);
    for (const char *n; (n = va_arg(ap, const char *));)
        ck_assert_msg(strstr(err.message, n) != NULL, "refusal lacks '%s': %s", n, err.message);
    va_end(ap);
    return err.message;
}

/* ------------------------------------------------------------------------- */

/* The names the first broken rule must mention, or NULL when the topology must plan. */
static const char *const *expected_refusal(const dsv4_config *c, const dsv4_topology *t)
{
    static const char *const world_range[] = {"world_size", NULL};
    static const char *const world_mismatch[] = {"world_size", "tp", "dp", NULL};
    static const char *const ep_world[] = {"ep", "world_size", NULL};
    static const char *const tp_ep[] = {"tp", "ep", "what would work", NULL};
    static const char *const e_ep[] = {"n_routed_experts", "ep", NULL};
    static const char *const inter[] = {"moe_inter_dim", "tp", NULL};
    static const char *const graph_backend[] = {"cuda_graph requires backend cuda", NULL};
    static const char *const disp_ep[] = {"dispatch", "needs ep > 1", NULL};
    static const char *const ll_role[] = {"low-latency dispatch is decode-only", "role", "all_to_all", NULL};
    static const char *const graph_ep_sm[] = {"cuda_graph", "ep", "sm", "what would work", "cuda_graph off", "sm 90",
                                              NULL};
    if (t->world_size > 64)
        return world_range;
    if (t->tp * t->dp != t->world_size)
        return world_mismatch;
    if (t->world_size % t->ep)
        return ep_world;
    if (t->tp > 1 && t->ep > 1)
        return tp_ep;
    if (c->n_routed_experts % t->ep)
        return e_ep;
    int64_t align = (c->routed_format == DSV4_FORMAT_FP8 || c->shared_format == DSV4_FORMAT_FP8) ? 128 : 32;
    if (c->moe_inter_dim % t->tp || (c->moe_inter_dim / t->tp) % align)
        return inter;
    if (t->cuda_graph && t->backend != DSV4_BACKEND_CUDA)
        return graph_backend;
    if (t->ep == 1 && t->dispatch == DSV4_DISPATCH_LOW_LATENCY)
        return disp_ep;
    if (t->dispatch == DSV4_DISPATCH_LOW_LATENCY && t->role != DSV4_ROLE_DECODE)
        return ll_role;
    if (t->cuda_graph && (t->sm == 100 || t->sm == 103) && t->ep > 1)
        return graph_ep_sm;
    return NULL;
}

START_TEST(matrix)
{
    const char *presets[] = {"v4-flash", "mini"};
    const int64_t layers[] = {5, 2};
    const int vals[] = {1, 2, 4, 8};
    const int sms[] = {90, 100, 103, 120};
    int planned = 0, refusals = 0;
    for (int pi = 0; pi < 2; pi++) {
        dsv4_config c = cfg_of(presets[pi], layers[pi]);
        dsv4_budget b = budget_of(141, 20, 1024);
        for (int a = 0; a < 4; a++)
            for (int d = 0; d < 4; d++)
                for (int e = 0; e < 4; e++)
                    for (int wm = 0; wm < 3; wm++)
                        for (int role = 0; role < 3; role++)
                            for (int g = 0; g < 2; g++)
                                for (int si = 0; si < 4; si++)
                                    for (int be = 0; be < 2; be++)
                                        for (int di = 0; di < 2; di++) {
                                            int tp = vals[a], dp = vals[d], ep = vals[e];
                                            if (be == 1 && si > 0)
                                                continue; /* cpu ignores sm */
                                            dsv4_topology t = topo_of(tp, dp, ep, 0);
                                            t.world_size = wm == 0 ? tp * dp : wm == 1 ? tp * dp + 1 : tp * dp * 2;
                                            t.rank = (tp * dp) - 1;
                                            if (t.rank >= t.world_size)
                                                t.rank = t.world_size - 1;
                                            t.role = (dsv4_role)role;
                                            t.backend = be ? DSV4_BACKEND_CPU : DSV4_BACKEND_CUDA;
                                            t.sm = sms[si];
                                            t.max_tokens_per_rank = 8192;
                                            t.dispatch = di ? DSV4_DISPATCH_LOW_LATENCY : DSV4_DISPATCH_AUTO;
                                            if (g) {
                                                t.cuda_graph = true;
                                                t.n_buckets = 0;
                                                for (int64_t bk = 1; bk <= 256; bk *= 2)
                                                    t.buckets[t.n_buckets++] = bk;
                                            }
                                            const char *const *names = expected_refusal(&c, &t);
                                            dsv4_plan *p = NULL;
                                            dsv4_error err;
                                            dsv4_error_clear(&err);
                                            dsv4_status st = dsv4_plan_create(&c, &t, &b, &p, &err);
                                            char ctx[256];
                                            snprintf(ctx, sizeof ctx,
                                                     "%s tp %d dp %d ep %d world %d rank %d role %d graph %d sm %d "
                                                     "backend %d dispatch %d",
                                                     presets[pi], tp, dp, ep, t.world_size, t.rank, role, g, t.sm,
                                                     (int)t.backend, (int)t.dispatch);
                                            if (!names) {
                                                ck_assert_msg(st == DSV4_OK, "%s: refused: %s", ctx, err.message);
                                                check_plan(p, ctx);
                                                dsv4_plan_free(p);
                                                planned++;
                                            } else {
                                                ck_assert_msg(st == DSV4_ERR_REFUSED, "%s: expected a refusal (%s), got %d",
                                                              ctx, names[0], (int)st);
                                                ck_assert_ptr_null(p);
                                                for (int k = 0; names[k]; k++)
                                                    ck_assert_msg(strstr(err.message, names[k]), "%s: refusal lacks '%s': %s",
                                                                  ctx, names[k], err.message);
                                                refusals++;
                                            }
                                        }
    }
    ck_assert_int_gt(planned, 100);
    ck_assert_int_gt(refusals, 100);
}
END_TEST

START_TEST(low_latency_is_decode_only)
{
    dsv4_config c = cfg_of("v4-flash", 5);
    dsv4_budget b = budget_of(141, 20, 1024);
    dsv4_topology t = topo_of(1, 8, 8, 3);
    t.dispatch = DSV4_DISPATCH_LOW_LATENCY;
    t.role = DSV4_ROLE_PREFILL;
    refused(&c, &t, &b, "low-latency dispatch is decode-only", "role prefill", "dispatch all_to_all (normal)", NULL);
    t.role = DSV4_ROLE_MIXED;
    refused(&c, &t, &b, "low-latency dispatch is decode-only", "role mixed", "all_to_all", NULL);
    t.role = DSV4_ROLE_DECODE;
    dsv4_plan *p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_router(p), DSV4_ROUTER_EP_LOW_LATENCY);
    dsv4_plan_free(p);
    /* The normal all-to-all serves prefill. */
    t.role = DSV4_ROLE_PREFILL;
    t.dispatch = DSV4_DISPATCH_ALL_TO_ALL;
    p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_router(p), DSV4_ROUTER_EP_ALL_TO_ALL);
    ck_assert_ptr_nonnull(strstr(dsv4_plan_explain(p), "router: ep_all_to_all (ep 8 > 1: experts 96..127 of 256 on rank 3"));
    dsv4_plan_free(p);
}
END_TEST

START_TEST(dispatch_vs_ep)
{
    dsv4_config c = cfg_of("v4-flash", 5);
    dsv4_budget b = budget_of(141, 20, 1024);
    dsv4_topology t = topo_of(1, 4, 1, 0);
    t.dispatch = DSV4_DISPATCH_ALL_TO_ALL;
    refused(&c, &t, &b, "dispatch all_to_all", "needs ep > 1", NULL);
    t.dispatch = DSV4_DISPATCH_LOW_LATENCY;
    t.role = DSV4_ROLE_DECODE;
    refused(&c, &t, &b, "dispatch low_latency", "needs ep > 1", NULL);
    t = topo_of(1, 4, 4, 0);
    t.dispatch = DSV4_DISPATCH_ALL_GATHER;
    refused(&c, &t, &b, "dispatch all_gather", "ep 4", NULL);
    /* all_gather on one rank is local: a single device always has a strategy. */
    t = topo_of(1, 1, 1, 0);
    t.dispatch = DSV4_DISPATCH_ALL_GATHER;
    dsv4_plan *p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_router(p), DSV4_ROUTER_LOCAL);
    dsv4_plan_free(p);
    t = topo_of(2, 4, 1, 5);
    t.dispatch = DSV4_DISPATCH_ALL_GATHER;
    p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_router(p), DSV4_ROUTER_DP_ALL_GATHER);
    ck_assert_int_eq(dsv4_plan_inter_first(p), 1024);
    ck_assert_int_eq(dsv4_plan_inter_count(p), 1024);
    dsv4_plan_free(p);
}
END_TEST

START_TEST(graph_capabilities)
{
    dsv4_config c = cfg_of("v4-flash", 5);
    dsv4_budget b = budget_of(141, 20, 1024);
    const int bad[] = {100, 103};
    for (int k = 0; k < 2; k++) {
        dsv4_topology t = topo_of(1, 8, 8, 0);
        set_graph(&t, bad[k], 256);
        char sm[16];
        snprintf(sm, sizeof sm, "sm %d", bad[k]);
        refused(&c, &t, &b, "cuda_graph", "ep 8", sm, "what would work", "cuda_graph off", "sm 90", NULL);
        t.cuda_graph = false; /* what would work */
        dsv4_plan_free(plan_ok(&c, &t, &b));
        t = topo_of(1, 1, 1, 0); /* ep 1 on sm 100/103: per_token */
        set_graph(&t, bad[k], 256);
        dsv4_plan *p = plan_ok(&c, &t, &b);
        ck_assert_int_eq(dsv4_plan_executor(p, 256, true), DSV4_EXEC_PER_TOKEN);
        ck_assert_int_eq(dsv4_plan_executor(p, 256, false), DSV4_EXEC_CONTIGUOUS);
        dsv4_plan_free(p);
    }
    dsv4_topology t = topo_of(1, 8, 8, 0);
    set_graph(&t, 90, 256);
    dsv4_plan *p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_executor(p, 200, true), DSV4_EXEC_MASKED);
    ck_assert_int_eq(dsv4_plan_executor(p, 257, true), DSV4_EXEC_CONTIGUOUS); /* cannot replay: eager */
    ck_assert(!dsv4_plan_can_replay(p, 257));
    ck_assert_ptr_nonnull(strstr(dsv4_plan_explain(p), "executor: masked for graph replays (bucket <= 256 tokens: 32 x"));
    dsv4_plan_free(p);
    set_graph(&t, 120, 256);
    p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_executor(p, 1, true), DSV4_EXEC_PER_TOKEN);
    dsv4_plan_free(p);
    /* Explicit executors under graphs. */
    t.executor = DSV4_EXECUTOR_CONTIGUOUS;
    refused(&c, &t, &b, "executor contiguous", "cuda_graph", "not graph-safe", NULL);
    t.executor = DSV4_EXECUTOR_MASKED;
    refused(&c, &t, &b, "executor masked", "sm 120", NULL);
    t.executor = DSV4_EXECUTOR_PER_TOKEN;
    set_graph(&t, 90, 256);
    refused(&c, &t, &b, "executor per_token", "sm 90", NULL);
    t.executor = DSV4_EXECUTOR_MASKED;
    p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_executor(p, 100, false), DSV4_EXEC_MASKED);
    ck_assert_int_eq(dsv4_plan_executor(p, 256, false), DSV4_EXEC_MASKED);
    ck_assert_int_eq(dsv4_plan_executor(p, 257, false), DSV4_EXEC_CONTIGUOUS);
    dsv4_plan_free(p);
    /* Graphs need the CUDA backend. */
    t = topo_of(1, 1, 1, 0);
    set_graph(&t, 90, 256);
    t.backend = DSV4_BACKEND_CPU;
    refused(&c, &t, &b, "cuda_graph requires backend cuda", "backend is cpu", NULL);
    t.backend = DSV4_BACKEND_REF;
    refused(&c, &t, &b, "cuda_graph requires backend cuda", "backend is ref", NULL);
    /* sm */
    t = topo_of(1, 1, 1, 0);
    t.backend = DSV4_BACKEND_CUDA;
    t.sm = 89;
    refused(&c, &t, &b, "sm", "89", NULL);
    t.backend = DSV4_BACKEND_CPU; /* cpu ignores sm */
    dsv4_plan_free(plan_ok(&c, &t, &b));
}
END_TEST

START_TEST(buckets_rules)
{
    dsv4_config c = cfg_of("mini", 2);
    dsv4_budget b;
    dsv4_budget_init(&b);
    dsv4_topology t = topo_of(1, 1, 1, 0);
    set_graph(&t, 90, 256);
    t.n_buckets = 0;
    refused(&c, &t, &b, "cuda_graph", "buckets", NULL);
    set_graph(&t, 90, 256);
    t.buckets[3] = t.buckets[2];
    refused(&c, &t, &b, "buckets", "ascending", NULL);
    set_graph(&t, 90, 256);
    t.buckets[0] = 0;
    refused(&c, &t, &b, "buckets", "positive", NULL);
    set_graph(&t, 90, 256);
    t.max_tokens_per_rank = 100;
    refused(&c, &t, &b, "buckets", "max_tokens_per_rank", NULL);
    t.max_tokens_per_rank = 4096;
    t.chunk_tokens = 128;
    refused(&c, &t, &b, "buckets", "chunk", NULL); /* a replay is one chunk */
}
END_TEST

START_TEST(reserve_rule)
{
    dsv4_budget b;
    dsv4_budget_init(&b);
    ck_assert_uint_eq(b.device_bytes, 80 * GIB);
    ck_assert_uint_eq(b.reserve_mb, 1024);
    ck_assert_uint_eq(dsv4_budget_available(&b), 76 * GIB); /* 5 % of 80 GiB = 4 GiB > 2 GiB > 1 GiB */
    /* 141 GiB (H200): the reserve is 5 % = 7.05 GiB. */
    b.device_bytes = 141 * GIB;
    uint64_t reserve = 141 * GIB / 20;
    ck_assert_uint_eq(reserve, UINT64_C(7569879859)); /* 7.05 GiB */
    ck_assert_uint_eq(reserve, (uint64_t)(7.05 * (double)GIB));
    ck_assert_uint_eq(dsv4_budget_available(&b), 141 * GIB - reserve);
    b.reserve_mb = 10240; /* 10 GiB asked: larger than 5 % */
    ck_assert_uint_eq(dsv4_budget_available(&b), 131 * GIB);
    /* 24 GiB: 5 % is 1.2 GiB, the floor of 2 GiB wins over reserve_mb 1024. */
    b.device_bytes = 24 * GIB;
    b.reserve_mb = 1024;
    ck_assert_uint_eq(dsv4_budget_available(&b), 22 * GIB);
    b.taken_bytes = 20 * GIB;
    ck_assert_uint_eq(dsv4_budget_available(&b), 2 * GIB);
    b.taken_bytes = 23 * GIB; /* negative: 0 */
    ck_assert_uint_eq(dsv4_budget_available(&b), 0);
    b.taken_bytes = UINT64_MAX;
    ck_assert_uint_eq(dsv4_budget_available(&b), 0);
    ck_assert_uint_eq(dsv4_budget_available(NULL), 0);
}
END_TEST

static uint64_t parse_needs(const char *msg)
{
    const char *s = strstr(msg, "needs ");
    ck_assert_ptr_nonnull(s);
    return strtoull(s + 6, NULL, 10);
}

START_TEST(budget_too_small)
{
    dsv4_config c = cfg_of("v4-flash", 5);
    dsv4_topology t = topo_of(1, 1, 1, 0);
    dsv4_budget b = budget_of(24, 22, 1024); /* available 0 */
    const char *m = refused(&c, &t, &b, "budget too small", "device_bytes", "taken_bytes", "reserve_mb", "2 GiB",
                            "available", "what would work", NULL);
    uint64_t need = parse_needs(m);
    ck_assert_uint_gt(need, 0);
    /* The minimum is exact: need bytes available plans (with 128-token chunks), one less refuses. */
    b = budget_of(100, 0, 1024);
    b.taken_bytes = b.device_bytes - 5 * GIB - need;
    ck_assert_uint_eq(dsv4_budget_available(&b), need);
    dsv4_plan *p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_chunk_tokens(p), 128);
    ck_assert_uint_eq(dsv4_plan_workspace_max(p), need);
    dsv4_plan_free(p);
    b.taken_bytes++;
    m = refused(&c, &t, &b, "budget too small", "reserve_mb", NULL);
    ck_assert_uint_eq(parse_needs(m), need);
    /* The reserve follows max(reserve_mb, 2 GiB, 5 %): a large reserve_mb refuses too. */
    b = budget_of(100, 0, 1024);
    b.reserve_mb = 100 * 1024;
    refused(&c, &t, &b, "budget too small", "reserve_mb 102400", NULL);
}
END_TEST

START_TEST(chunking)
{
    dsv4_config c = cfg_of("v4-flash", 5);
    dsv4_topology t = topo_of(1, 1, 1, 0);
    dsv4_budget b = budget_of(8, 5, 1024); /* 1 GiB available */
    dsv4_plan *p = plan_ok(&c, &t, &b);
    int64_t auto_chunk = dsv4_plan_chunk_tokens(p);
    ck_assert_int_lt(auto_chunk, 4096);
    ck_assert_int_eq(auto_chunk % 128, 0);
    /* The next multiple of 128 does not fit. */
    t.chunk_tokens = auto_chunk + 128;
    char want[64];
    snprintf(want, sizeof want, "largest chunk that fits is %lld tokens", (long long)auto_chunk);
    refused(&c, &t, &b, "chunk_tokens", want, "available", NULL);
    dsv4_plan_free(p);
    t.chunk_tokens = 100;
    refused(&c, &t, &b, "chunk_tokens 100", "multiple of 128", "max_tokens_per_rank", NULL);
    t.chunk_tokens = 8192;
    refused(&c, &t, &b, "chunk_tokens 8192", "max_tokens_per_rank", NULL);
    t.chunk_tokens = -1;
    refused(&c, &t, &b, "chunk_tokens", NULL);
    /* chunks(T) */
    b = budget_of(141, 0, 1024);
    t.chunk_tokens = 2048;
    t.max_tokens_per_rank = 65536;
    p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_chunks(p, 0), 0);
    ck_assert_int_eq(dsv4_plan_chunks(p, -5), 0);
    ck_assert_int_eq(dsv4_plan_chunks(p, 1), 1);
    ck_assert_int_eq(dsv4_plan_chunks(p, 2048), 1);
    ck_assert_int_eq(dsv4_plan_chunks(p, 2049), 2);
    ck_assert_int_eq(dsv4_plan_chunks(p, 65536), 32);
    /* A long prompt reuses the chunk's workspace. */
    ck_assert_uint_eq(dsv4_plan_workspace_bytes(p, 65536, false), dsv4_plan_workspace_bytes(p, 2048, false));
    dsv4_plan_free(p);
    /* chunk_tokens equal to a max that is not a multiple of 128 */
    t.max_tokens_per_rank = 1000;
    t.chunk_tokens = 1000;
    p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_chunks(p, 1000), 1);
    dsv4_plan_free(p);
    t.chunk_tokens = 0;
    t.max_tokens_per_rank = 100; /* smaller than 128: one chunk of max */
    p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_chunk_tokens(p), 100);
    dsv4_plan_free(p);
    t.max_tokens_per_rank = 1 << 20; /* the auto chunk is capped at 16384 */
    p = plan_ok(&c, &t, &b);
    ck_assert_int_le(dsv4_plan_chunk_tokens(p), 16384);
    dsv4_plan_free(p);
}
END_TEST

/* The review's defect: auto + graph picked masked for long eager prefills, E x align(T, 128) rows. */
START_TEST(long_prompt_never_masked)
{
    dsv4_config c = cfg_of("v4-flash-base", 5);
    dsv4_topology t = topo_of(1, 1, 1, 0);
    set_graph(&t, 90, 256);
    t.max_tokens_per_rank = 16384;
    dsv4_budget b = budget_of(96, 80, 1024); /* ~11 GiB available */
    dsv4_plan *p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_executor(p, 16383, false), DSV4_EXEC_CONTIGUOUS);
    ck_assert_int_eq(dsv4_plan_executor(p, 16383, true), DSV4_EXEC_CONTIGUOUS);
    ck_assert_int_eq(dsv4_plan_executor(p, 256, true), DSV4_EXEC_MASKED);
    dsv4_plan_free(p);
    /* Masked does not fit at bucket 4096 and nothing else is graph-safe on sm 90: refused, naming buckets. */
    t.max_tokens_per_rank = 8192;
    set_graph(&t, 90, 4096);
    t.chunk_tokens = 4096;
    b = budget_of(141, 115, 1024);
    refused(&c, &t, &b, "buckets", "available", "masked", "sm 90", NULL);
    t.executor = DSV4_EXECUTOR_MASKED;
    refused(&c, &t, &b, "executor masked", "buckets", "available", NULL);
    /* On sm 120 per_token takes the replays. */
    t.executor = DSV4_EXECUTOR_AUTO;
    set_graph(&t, 120, 4096);
    p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_executor(p, 4096, true), DSV4_EXEC_PER_TOKEN);
    dsv4_plan_free(p);
    /* Explicit masked without graphs: bounded by the chunk. */
    t = topo_of(1, 1, 1, 0);
    t.executor = DSV4_EXECUTOR_MASKED;
    t.max_tokens_per_rank = 16384;
    b = budget_of(80, 60, 1024);
    p = plan_ok(&c, &t, &b);
    ck_assert_int_eq(dsv4_plan_executor(p, dsv4_plan_chunk_tokens(p), false), DSV4_EXEC_MASKED);
    ck_assert_int_eq(dsv4_plan_executor(p, dsv4_plan_chunk_tokens(p) + 1, false), DSV4_EXEC_CONTIGUOUS);
    dsv4_plan_free(p);
}
END_TEST

START_TEST(topology_rules)
{
    dsv4_config flash = cfg_of("v4-flash", 5), mini = cfg_of("mini", 2);
    dsv4_budget b = budget_of(141, 20, 1024);
    dsv4_topology t = topo_of(2, 2, 2, 0);
    refused(&flash, &t, &b, "tp 2", "ep 2", "what would work", NULL);
    t = topo_of(2, 2, 1, 0);
    t.world_size = 8;
    refused(&flash, &t, &b, "world_size 8", "tp 2", "dp 2", NULL);
    t.world_size = 65;
    refused(&flash, &t, &b, "world_size 65", NULL);
    t = topo_of(1, 6, 4, 0);
    refused(&flash, &t, &b, "ep 4", "world_size 6", NULL);
    t = topo_of(1, 3, 3, 0);
    refused(&mini, &t, &b, "n_routed_experts 16", "ep 3", NULL);
    t = topo_of(1, 1, 1, 1);
    refused(&mini, &t, &b, "rank 1", "world_size", NULL);
    t.rank = -1;
    refused(&mini, &t, &b, "rank -1", NULL);
    t = topo_of(2, 1, 1, 0);
    refused(&mini, &t, &b, "moe_inter_dim 128", "tp 2", "128", NULL);
    t = topo_of(32, 1, 1, 0);
    refused(&flash, &t, &b, "moe_inter_dim 2048", "tp 32", NULL);
    t = topo_of(3, 1, 1, 0);
    refused(&flash, &t, &b, "moe_inter_dim 2048", "tp 3", NULL);
    t = topo_of(0, 1, 1, 0);
    t.world_size = 1;
    refused(&flash, &t, &b, "tp 0", NULL);
    t = topo_of(1, 1, 1, 0);
    t.max_tokens_per_rank = 0;
    refused(&flash, &t, &b, "max_tokens_per_rank", NULL);
    t = topo_of(1, 1, 1, 0);
    t.role = (dsv4_role)7;
    refused(&flash, &t, &b, "role", NULL);
    /* Not refusals: bad arguments and bad configs. */
    dsv4_plan *p = NULL;
    dsv4_error err;
    t = topo_of(1, 1, 1, 0);
    t.struct_size = 4;
    ck_assert_int_eq(dsv4_plan_create(&flash, &t, &b, &p, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.message, "struct_size"));
    t = topo_of(1, 1, 1, 0);
    dsv4_budget bb = b;
    bb.struct_size = 0;
    ck_assert_int_eq(dsv4_plan_create(&flash, &t, &bb, &p, &err), DSV4_ERR_INVALID_ARG);
    dsv4_config bad = flash;
    bad.layer = -1;
    ck_assert_int_eq(dsv4_plan_create(&bad, &t, &b, &p, &err), DSV4_ERR_CONFIG);
    ck_assert_int_eq(dsv4_plan_create(NULL, &t, &b, &p, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_plan_create(&flash, &t, &b, NULL, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_null(p);
    dsv4_plan_free(NULL);
    dsv4_topology_init(NULL);
    dsv4_budget_init(NULL);
    ck_assert_int_eq(dsv4_plan_chunks(NULL, 5), 0);
    ck_assert_str_eq(dsv4_plan_explain(NULL), "");
    ck_assert_str_eq(dsv4_router_kind_name(DSV4_ROUTER_DP_ALL_GATHER), "dp_all_gather");
    ck_assert_str_eq(dsv4_executor_kind_name(DSV4_EXEC_PER_TOKEN), "per_token");
    ck_assert_str_eq(dsv4_role_name(DSV4_ROLE_MIXED), "mixed");
    ck_assert_str_eq(dsv4_backend_kind_name(DSV4_BACKEND_CUDA), "cuda");
}
END_TEST

START_TEST(expert_and_inter_ranges)
{
    dsv4_config c = cfg_of("v4-flash", 5);
    dsv4_budget b = budget_of(141, 20, 1024);
    const int eps[] = {1, 2, 4, 8, 16, 32, 64};
    for (int k = 0; k < 7; k++) {
        int ep = eps[k];
        int world = ep <= 16 ? ep * 4 : ep; /* several ep groups when they fit */
        if (world > 64)
            world = ep;
        for (int g = 0; g < world / ep; g++) {
            int seen[256] = {0};
            for (int r = g * ep; r < (g + 1) * ep; r++) {
                dsv4_topology t = topo_of(1, world, ep, r);
                dsv4_plan *p = plan_ok(&c, &t, &b);
                for (int64_t e = 0; e < dsv4_plan_expert_count(p); e++)
                    seen[dsv4_plan_expert_first(p) + e]++;
                dsv4_plan_free(p);
            }
            for (int e = 0; e < 256; e++)
                ck_assert_msg(seen[e] == 1, "ep %d group %d: expert %d seen %d times", ep, g, e, seen[e]);
        }
    }
    const int tps[] = {1, 2, 4, 8, 16};
    for (int k = 0; k < 5; k++) {
        int tp = tps[k], seen[2048] = {0};
        for (int r = tp; r < 2 * tp; r++) { /* the second tp group */
            dsv4_topology t = topo_of(tp, 2, 1, r);
            dsv4_plan *p = plan_ok(&c, &t, &b);
            for (int64_t i = 0; i < dsv4_plan_inter_count(p); i++)
                seen[dsv4_plan_inter_first(p) + i]++;
            dsv4_plan_free(p);
        }
        for (int i = 0; i < 2048; i++)
            ck_assert_int_eq(seen[i], 1);
    }
}
END_TEST

/* The memory model in numbers (docs/planner.md). */
START_TEST(memory_model_numbers)
{
    dsv4_config c = cfg_of("v4-flash", 5);
    dsv4_budget b = budget_of(141, 20, 1024);
    dsv4_topology t = topo_of(1, 1, 1, 0);
    t.chunk_tokens = 128;
    dsv4_plan *p = plan_ok(&c, &t, &b);
    /* R = 4096 + 4*32 + 2*2048*2 + 2048 + 4*16 + 4096*2 = 22720 bytes per row. */
    ck_assert_ptr_nonnull(strstr(dsv4_plan_explain(p), "22720 bytes per executor row"));
    /* T = 1 (one chunk of 1 token, K = 6): router 256*4 + 6*8, meta 6*8 + 256*8,
       rows align128(6 + 6*127) = 768, combine 4096*4, step meta 64. */
    uint64_t w1 = 1024 + 48 + 48 + 2048 + UINT64_C(768) * 22720 + 16384 + 64;
    ck_assert_uint_eq(dsv4_plan_workspace_bytes(p, 1, false), w1);
    ck_assert_uint_eq(dsv4_plan_workspace_bytes(p, 0, false), 64);
    dsv4_plan_free(p);
    /* bf16 activations: 2 bytes, no scales. */
    dsv4_config m = cfg_of("mini-bf16", 2);
    t.chunk_tokens = 0;
    p = plan_ok(&m, &t, &b);
    ck_assert_ptr_nonnull(strstr(dsv4_plan_explain(p), "1792 bytes per executor row")); /* 512 + 512 + 256 + 512 */
    dsv4_plan_free(p);
}
END_TEST

/* ------------------------------------------------------------------------- */

static char cli_out[1 << 16];

static int run_cli(const char *args) { return tu_run_cli(args, "plan_cli_out.txt", cli_out, sizeof cli_out); }

START_TEST(cli_plan)
{
    if (!getenv("DSV4MOE_CLI"))
        return; /* run through make test */
    ck_assert_int_eq(run_cli("plan --help"), 0);
    ck_assert_ptr_nonnull(strstr(cli_out, "--executor"));
    ck_assert_ptr_nonnull(strstr(cli_out, "--reserve-mb"));
    ck_assert_int_eq(run_cli("plan --layer 5 --world 8 --dp 8 --ep 8 --rank 1 --role decode --backend cuda --sm 90 "
                             "--graph on --device-gib 141 --taken-gib 100 --tokens 5000"),
                     0);
    ck_assert_ptr_nonnull(strstr(cli_out, "router: ep_all_to_all (ep 8 > 1: experts 32..63 of 256 on rank 1"));
    ck_assert_ptr_nonnull(strstr(cli_out, "executor: masked for graph replays"));
    ck_assert_ptr_nonnull(strstr(cli_out, "max workspace"));
    ck_assert_ptr_nonnull(strstr(cli_out, "5000"));
    ck_assert_int_eq(run_cli("plan --layer 5 --dp 4 --ep 4 --role prefill --dispatch low_latency"), 2);
    ck_assert_ptr_nonnull(strstr(cli_out, "low-latency dispatch is decode-only"));
    /* The place is named once: the command, not the command and then the library's "plan:". */
    ck_assert_ptr_nonnull(strstr(cli_out, "dsv4moe plan: "));
    ck_assert_ptr_null(strstr(cli_out, "plan: plan:"));
    ck_assert_int_eq(run_cli("plan --layer 5 --dp 8 --ep 8 --backend cuda --sm 103 --graph on"), 2);
    ck_assert_ptr_nonnull(strstr(cli_out, "sm 103"));
    ck_assert_int_eq(run_cli("plan --layer 5 --graph on"), 2);
    ck_assert_ptr_nonnull(strstr(cli_out, "cuda_graph requires backend cuda"));
    ck_assert_int_eq(run_cli("plan --layer 5 --device-gib 8 --taken-gib 7"), 2);
    ck_assert_ptr_nonnull(strstr(cli_out, "reserve_mb"));
    ck_assert_int_eq(run_cli("plan --layer 5 --role nope"), 2);
    ck_assert_int_eq(run_cli("plan --layer 5 --buckets 1,x"), 2);
    ck_assert_int_eq(run_cli("plan"), 2); /* --layer is required */
}
END_TEST

Suite *plan_suite(void)
{
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, matrix);
    tcase_add_test(tc, low_latency_is_decode_only);
    tcase_add_test(tc, dispatch_vs_ep);
    tcase_add_test(tc, graph_capabilities);
    tcase_add_test(tc, buckets_rules);
    tcase_add_test(tc, reserve_rule);
    tcase_add_test(tc, budget_too_small);
    tcase_add_test(tc, chunking);
    tcase_add_test(tc, long_prompt_never_masked);
    tcase_add_test(tc, topology_rules);
    tcase_add_test(tc, expert_and_inter_ranges);
    tcase_add_test(tc, memory_model_numbers);
    tcase_add_test(tc, cli_plan);
    suite_add_tcase(s, tc);
    return s;
}
