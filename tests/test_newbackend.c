/*
 * A newcomer's fourth backend: "refcopy", a test-only copy of the reference backend, added by one
 * registration (fast/backend/backend_reg.h) and one dsv4_backend_register call, nothing else. The
 * planner plans for it and refuses by its capabilities, dsv4_backend_create runs it, the backend
 * test table (tests/backend_ops.h) runs on it, and the scenario runner runs a matrix on it.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "fast/backend/backend_reg.h"
#include "tests/backend_ops.h"
#include "dsv4moe/ref.h"
#include "dsv4moe_harness/run.h"
#include "core/err.h"
#include "tests/scenutil.h"

Suite *newbackend_suite(void);

typedef struct {
    dsv4_ref *ref;
    dsv4_backend_stats stats;
    int64_t n_experts;
} refcopy;

/* One forward of the reference; launches count the expert groups that got rows (routed and
   shared), empty_skips the routed experts that got none. */
static dsv4_status rc_forward(void *p, int64_t T, const uint16_t *x, const int32_t *ids, dsv4_forward_out *out,
                              dsv4_error *err)
{
    refcopy *r = p;
    dsv4_ref_output ro;
    memset(&ro, 0, sizeof ro);
    ro.y = out->y;
    const dsv4_config *c = dsv4_ref_config(r->ref);
    int32_t *own = out->topk_ids ? NULL : malloc((size_t)(T * c->n_activated + 1) * sizeof *own);
    ro.topk_ids = out->topk_ids ? out->topk_ids : own;
    ro.topk_weights = out->topk_weights;
    ro.kept_counts = out->kept_counts;
    if (!ro.topk_ids)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "refcopy", "out of memory");
    dsv4_status st = dsv4_ref_forward(r->ref, T, x, ids, &ro, err);
    if (!st) {
        char *hit = calloc((size_t)r->n_experts, 1);
        for (int64_t i = 0; hit && i < T * c->n_activated; i++)
            if (ro.topk_ids[i] >= 0 && ro.topk_ids[i] < r->n_experts)
                hit[ro.topk_ids[i]] = 1;
        uint64_t groups = 0;
        for (int64_t e = 0; hit && e < r->n_experts; e++)
            groups += (uint64_t)hit[e];
        free(hit);
        r->stats.forwards++;
        r->stats.tokens += (uint64_t)T;
        r->stats.launches += groups + (T > 0 && c->n_shared_experts > 0);
        r->stats.empty_skips += (uint64_t)r->n_experts - groups;
        r->stats.nonfinite_rows += (uint64_t)ro.stats.nonfinite_rows;
        r->stats.routed_g_clamped += ro.stats.routed_g_clamped;
        r->stats.routed_u_clamped += ro.stats.routed_u_clamped;
        r->stats.shared_g_clamped += ro.stats.shared_g_clamped;
        r->stats.shared_u_clamped += ro.stats.shared_u_clamped;
    }
    free(own);
    return st;
}

static dsv4_backend_stats rc_stats(const void *p) { return ((const refcopy *)p)->stats; }

static void rc_free(void *p)
{
    refcopy *r = p;
    if (r)
        dsv4_ref_free(r->ref);
    free(r);
}

static const dsv4_backend_vtable rc_vtable = {.name = "refcopy", .forward = rc_forward, .stats = rc_stats,
                                              .free = rc_free};

static int rc_created; /* instances created in this process */

static dsv4_status rc_create(const dsv4_plan *plan, const dsv4_checkpoint *ck, const dsv4_backend_options *opt,
                             void **impl, const dsv4_backend_vtable **vt, dsv4_error *err)
{
    refcopy *r = calloc(1, sizeof *r);
    if (!r)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "refcopy", "out of memory");
    dsv4_status st = dsv4_ref_create(dsv4_plan_config(plan), ck, opt->threads, &r->ref, err);
    if (st) {
        free(r);
        return st;
    }
    r->n_experts = dsv4_plan_config(plan)->n_routed_experts;
    r->stats.workspace_planned = dsv4_plan_workspace_max(plan);
    rc_created++;
    *impl = r;
    *vt = &rc_vtable;
    return DSV4_OK;
}

/* The newcomer's whole registration: a name, its kind (the next one) and create; no stages (one
   unsharded rank), no device, the executor layout model. */
static dsv4_backend_reg rc_reg = {.name = "refcopy", .create = rc_create};

static void add_refcopy(void)
{
    dsv4_error e;
    rc_reg.kind = (dsv4_backend_kind)dsv4_backend_count();
    ck_assert_msg(dsv4_backend_register(&rc_reg, &e) == DSV4_OK, "%s", e.message);
}

static void drop_refcopy(void)
{
    dsv4_error e;
    ck_assert_msg(dsv4_backend_unregister(&rc_reg, &e) == DSV4_OK, "%s", e.message);
}

START_TEST(registry_and_planner)
{
    int before = dsv4_backend_count();
    add_refcopy();
    ck_assert_int_eq(dsv4_backend_count(), before + 1);
    dsv4_backend_info info;
    dsv4_error e;
    ck_assert_int_eq(dsv4_backend_info_at(before, &info, &e), DSV4_OK);
    ck_assert_str_eq(info.name, "refcopy");
    ck_assert(info.built && info.available && !info.sharded);
    ck_assert_str_eq(dsv4_backend_kind_name(rc_reg.kind), "refcopy");
    ck_assert_ptr_nonnull(strstr(dsv4_backends_available(), "refcopy"));
    /* a second registration of the name, or a kind out of order, is refused */
    dsv4_backend_reg dup = rc_reg;
    dup.kind = (dsv4_backend_kind)dsv4_backend_count();
    ck_assert_int_eq(dsv4_backend_register(&dup, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "taken"));
    dup.name = "other";
    dup.kind = (dsv4_backend_kind)(dsv4_backend_count() + 1);
    ck_assert_int_eq(dsv4_backend_register(&dup, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "the next kind is"));

    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset("mini", &c, NULL), DSV4_OK);
    c.layer = 2;
    dsv4_topology t;
    dsv4_topology_init(&t);
    t.backend = rc_reg.kind;
    dsv4_budget b;
    dsv4_budget_init(&b);
    dsv4_plan *p = NULL;
    ck_assert_msg(dsv4_plan_create(&c, &t, &b, &p, &e) == DSV4_OK, "%s", e.message);
    ck_assert_ptr_nonnull(strstr(dsv4_plan_explain(p), "backend refcopy,"));
    ck_assert_ptr_nonnull(strstr(dsv4_plan_explain(p), "gemm: exact (backend is not cuda)"));
    dsv4_plan_free(p);
    /* refused by capability: graphs and gemm fp8 are cuda's */
    t.cuda_graph = true;
    t.n_buckets = 1;
    t.buckets[0] = 8;
    ck_assert_int_eq(dsv4_plan_create(&c, &t, &b, &p, &e), DSV4_ERR_REFUSED);
    ck_assert_str_eq(e.message, "plan: cuda_graph requires backend cuda (backend is refcopy): set cuda_graph off, or "
                                "backend cuda");
    t.cuda_graph = false;
    c.gemm = DSV4_GEMM_FP8;
    ck_assert_int_eq(dsv4_plan_create(&c, &t, &b, &p, &e), DSV4_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.message, "gemm fp8 needs backend cuda (FP8 tensor cores; backend is refcopy)"));
    c.gemm = DSV4_GEMM_AUTO;
    /* a sharded plan plans (the layout model), but the backend has no stages to run it */
    t.world_size = t.dp = t.ep = 2;
    ck_assert_msg(dsv4_plan_create(&c, &t, &b, &p, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(dsv4_backend_plan_supported(p, &e), DSV4_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(e.message, "backend refcopy runs one unsharded rank"));
    dsv4_plan_free(p);
    /* an unknown kind names every backend */
    t.world_size = t.dp = t.ep = 1;
    t.backend = (dsv4_backend_kind)(rc_reg.kind + 1);
    ck_assert_int_eq(dsv4_plan_create(&c, &t, &b, &p, &e), DSV4_ERR_REFUSED);
    ck_assert_str_eq(e.message, "plan: backend 4 is not ref, cpu, cuda or refcopy");
    ck_assert_str_eq(dsv4_backends_registered(), "ref, cpu, cuda or refcopy");
    drop_refcopy();
    ck_assert_int_eq(dsv4_backend_count(), before);
    ck_assert_str_eq(dsv4_backends_registered(), "ref, cpu or cuda");
    ck_assert_ptr_null(strstr(dsv4_backends_available(), "refcopy"));
    ck_assert_int_eq(dsv4_backend_unregister(&rc_reg, &e), DSV4_ERR_INVALID_ARG);
}
END_TEST

/* The backend test table picks it up: cases of the table (the quant modes, a hash layer, top-p,
   T = 0 and 1) run on every registered backend, the newcomer among them, its output held to the
   reference's by the table's rules, its statistics checked like any backend's. */
START_TEST(backend_table)
{
    add_refcopy();
    static const char *const pick[] = {"mini fp4/fp8", "mini hash layer", "mini-fp8", "mini-bf16", "mini-topp",
                                       "mini T=1", "mini T=0"};
    int ran_cases = 0;
    for (int i = 0; i < BO_NCASES; i++) {
        bool picked = false;
        for (size_t j = 0; j < sizeof pick / sizeof pick[0]; j++)
            picked = picked || !strcmp(bo_cases[i].name, pick[j]);
        if (!picked)
            continue;
        ran_cases++;
        char names[128];
        int ran = bo_every_backend(i, names);
        ck_assert_int_ge(ran, 3);
        ck_assert_msg(strstr(names, "refcopy") != NULL, "%s ran on %s", bo_cases[i].name, names);
    }
    ck_assert_int_eq(ran_cases, (int)(sizeof pick / sizeof pick[0]));
    drop_refcopy();
}
END_TEST

/* The scenario runner runs a matrix on it (dsv4_run_options.backend, run --backend) and every
   check passes. */
START_TEST(scenario_run)
{
    add_refcopy();
    dsv4_scenario *s = tu_scenario_text("name: newcomer\n"
                                        "defaults:\n"
                                        "  preset: tiny\n"
                                        "  topology: {world: 1, tp: 1, dp: 1, ep: 1, backend: cpu}\n"
                                        "  seed: 5\n"
                                        "  checks: [numerics, determinism, memory, empty]\n"
                                        "axes:\n"
                                        "  layer: [0, 1]\n"
                                        "  tokens: [[0], [7], [130]]\n",
                                        "newcomer.yaml");
    char cache[1024];
    tu_path(cache, sizeof cache, "newbackend-cache");
    dsv4_run_results *r = tu_run(s, cache, (int)rc_reg.kind, NULL);
    ck_assert_uint_eq(dsv4_run_count(r), 6);
    for (size_t i = 0; i < dsv4_run_count(r); i++) {
        const dsv4_case_result *c = dsv4_run_get(r, i);
        const char *d = "";
        dsv4_case_check(c, DSV4_CHECK_NUMERICS, &d);
        ck_assert_msg(dsv4_case_status(c) == DSV4_RESULT_PASS, "%s: %s (%s)", dsv4_case_name(c),
                      dsv4_result_name(dsv4_case_status(c)), d);
    }
    ck_assert_int_ge(rc_created, 6);
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
    drop_refcopy();
}
END_TEST

Suite *newbackend_suite(void)
{
    Suite *s = suite_create("newbackend");
    TCase *tc = tcase_create("newcomer");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, registry_and_planner);
    tcase_add_test(tc, backend_table);
    tcase_add_test(tc, scenario_run);
    suite_add_tcase(s, tc);
    return s;
}
