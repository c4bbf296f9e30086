/*
 * The backend test table and its checker (ggml's test-backend-ops as the model): one list of
 * layer cases, each run on a backend and on the reference through the backend interface, and
 * one comparison (SPEC.md section 7 metrics, routing, statistics; section 9's for gemm fp8).
 * tests/test_backend_ops.c runs the table over every backend the registry reports available
 * (ref and cpu here; ref, cpu and cuda in the device test program build/cuda/test_cuda, which
 * links that suite); test_cpu.c and tests/cuda/test_cuda.c use the same checker for the
 * backends' own cases (the cpu kernel tables; the cuda gemm fp8 mode, graphs, kernel variants).
 * Header-only (static inline functions): the device test program is built apart from the suite.
 */
#ifndef DSV4MOE_TESTS_BACKEND_OPS_H
#define DSV4MOE_TESTS_BACKEND_OPS_H

#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/backend.h"
#include "dsv4moe_harness/compare.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"
#include "fast/cpu/kernels/kernels.h" /* the cpu backend's kernel tables, named in its params */
#include "tests/testutil.h"
#ifdef DSV4_WITH_CUDA
#include "bench/bench_util.h" /* the kernel variants the environment names */
#endif

#ifndef BO_GEN_THREADS
#define BO_GEN_THREADS 2 /* threads generating the layers (test_cuda: the device machine's cores) */
#endif

typedef struct {
    const char *name;
    const char *preset;
    int64_t layer;
    int64_t tokens;
    int64_t chunk;      /* topology chunk_tokens (0: planner) */
    float swiglu_limit; /* < 0: preset's */
    int shared_clamp;   /* -1: preset's */
    int after_w2;       /* -1: preset's */
    int act_fp32;       /* 1: act_quant fp32 scales (activations not bf16-exact) */
    int graph;          /* cuda_graph on (buckets 1..128) */
    int64_t experts;    /* > 0: n_routed_experts override (v4-flash shapes with fewer experts) */
    int fp8;            /* gemm fp8 (cuda only; SPEC.md section 9's tolerances); 0: gemm exact */
} bo_case;

/* The table every backend runs: every quant mode, hash layers, clamp and top-p on and off,
   after_w2, T = 0 and 1, odd sizes, group sizes around the regime switches, chunked prompts
   (a long one: 3000 tokens in chunks of 1024). */
static const bo_case bo_cases[] = {
    /* name                      preset       layer T    chunk L     scl after fp32 graph E fp8 */
    {"mini fp4/fp8", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini hash layer", "mini", 0, 77, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini-fp8", "mini-fp8", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini-bf16", "mini-bf16", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini-bf16 hash", "mini-bf16", 0, 77, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini no clamp", "mini", 1, 77, 0, 0.0f, -1, -1, 0, 0, 0, 0},
    {"mini-topp", "mini-topp", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini-topp no clamp", "mini-topp", 1, 77, 0, 0.0f, -1, -1, 0, 0, 0, 0},
    {"mini after_w2 noshclamp", "mini", 1, 77, 0, -1, 0, 1, 0, 0, 0, 0},
    {"mini-fp8 after_w2", "mini-fp8", 1, 77, 0, -1, 0, 1, 0, 0, 0, 0},
    {"mini T=1", "mini", 1, 1, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini hash T=1", "mini", 0, 1, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini-fp8 T=1", "mini-fp8", 1, 1, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini-bf16 T=1", "mini-bf16", 1, 1, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini T=0", "mini", 1, 0, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini chunk 128 T=300", "mini", 1, 300, 128, -1, -1, -1, 0, 0, 0, 0},
    {"mini-topp chunk 128", "mini-topp", 1, 300, 128, -1, -1, -1, 0, 0, 0, 0},
    {"mini hash chunk 128", "mini", 0, 300, 128, -1, -1, -1, 0, 0, 0, 0},
    {"mini chunk 1024 T=3000", "mini", 1, 3000, 1024, -1, -1, -1, 0, 0, 0, 0},
    {"tiny bf16", "tiny", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini T=5", "mini", 1, 5, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini T=30", "mini", 1, 30, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini-fp8 T=30", "mini-fp8", 1, 30, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini-bf16 T=30", "mini-bf16", 1, 30, 0, -1, -1, -1, 0, 0, 0, 0},
    {"mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 0},
    /* fp4 with fp32-scaled activations: not bf16-exact, so bf16 kernels must step aside */
    {"mini fp4 act fp32", "mini", 1, 77, 0, -1, -1, -1, 1, 0, 0, 0},
    {"mini fp4 act fp32 T=1100", "mini", 1, 1100, 0, -1, -1, -1, 1, 0, 0, 0},
};
#define BO_NCASES ((int)(sizeof bo_cases / sizeof bo_cases[0]))

/* Under the coverage build (make coverage-run sets DSV4MOE_TEST_COVERAGE=1) the large-T
   duplicates are skipped: "mini T=1100" still runs the lone-large-group path; the other
   T = 1100 cases repeat it with another kernel table or activation format (fast/cpu is reported,
   not gated, and each costs seconds under gcov). */
/* A metric row: appended to $DSV4MOE_TEST_ROWS when set (make test: build/tests/rows.txt, so the
   runner's output stays the runner's), else printed (test_cuda: ci/cuda-test.sh reads its rows). */
static inline void bo_row(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void bo_row(const char *fmt, ...)
{
    const char *path = getenv("DSV4MOE_TEST_ROWS");
    FILE *f = path && *path ? fopen(path, "a") : stdout;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f ? f : stdout, fmt, ap);
    va_end(ap);
    if (f && f != stdout)
        fclose(f);
    else
        fflush(stdout);
}

static inline bool bo_skipped_under_coverage(const bo_case *k)
{
    const char *v = getenv("DSV4MOE_TEST_COVERAGE");
    if (!v || strcmp(v, "1") || k->tokens < 1000 || !strcmp(k->name, "mini T=1100"))
        return false;
    bo_row("backend_ops %-26s skipped under coverage (a duplicate of mini T=1100)\n", k->name);
    return true;
}

/* How one backend runs a case. */
typedef struct {
    dsv4_backend_kind kind;
    int threads;
    dsv4_cpu_kernels kernels; /* cpu: the kernel table (AUTO: the best this CPU runs) */
    int forwards;             /* forwards of the same input (>= 1); all must give the same bytes */
    const char *cuda_kernels; /* cuda: the kernel variants (its params, docs/cuda.md; NULL: defaults) */
} bo_backend;

typedef struct {
    uint16_t *y;
    int32_t *ids, *kept;
    float *w;
    dsv4_backend_stats stats;
    uint64_t planned_step; /* dsv4_plan_workspace_bytes at this T */
    int repeat_same;       /* every forward gave the first one's bytes */
    char kernels[32];      /* dsv4_backend_kernels */
} bo_out;

/* gemm fp8 is a mode of the cuda backend only: the other backends run such a case's layer as the
   planner resolves auto (the reference of an fp8 case is the exact one). */
static inline dsv4_plan *bo_plan(const dsv4_config *c0, dsv4_backend_kind kind, int64_t chunk, int graph)
{
    dsv4_config c = *c0;
    if (kind != DSV4_BACKEND_CUDA && c.gemm == DSV4_GEMM_FP8)
        c.gemm = DSV4_GEMM_AUTO;
    dsv4_topology topo;
    dsv4_topology_init(&topo);
    topo.backend = kind;
    topo.chunk_tokens = chunk;
    if (kind == DSV4_BACKEND_CUDA)
        topo.max_tokens_per_rank = 4096;
    if (graph) {
        topo.cuda_graph = true;
        topo.n_buckets = 8;
        for (int i = 0; i < 8; i++)
            topo.buckets[i] = 1 << i;
    }
    dsv4_budget bud;
    dsv4_budget_init(&bud);
    if (kind == DSV4_BACKEND_CUDA)
        bud.device_bytes = 141ull << 30;
    dsv4_plan *p = NULL;
    dsv4_error e;
    ck_assert_msg(dsv4_plan_create(&c, &topo, &bud, &p, &e) == DSV4_OK, "plan: %s", e.message);
    return p;
}

/* The case's layer config; the cuda backend's gemm mode explicit (exact unless the case is fp8). */
static inline dsv4_config bo_config(const bo_case *k)
{
    dsv4_config c;
    dsv4_error e;
    ck_assert_int_eq(dsv4_config_preset(k->preset, &c, &e), DSV4_OK);
    c.layer = k->layer;
    if (k->swiglu_limit >= 0)
        c.swiglu_limit = k->swiglu_limit;
    if (k->shared_clamp >= 0)
        c.shared_clamp = k->shared_clamp != 0;
    if (k->after_w2 >= 0)
        c.weight_point = k->after_w2 ? DSV4_WEIGHT_AFTER_W2 : DSV4_WEIGHT_BEFORE_W2;
    if (k->act_fp32)
        c.act_quant = DSV4_ACT_QUANT_FP32;
    if (k->experts > 0)
        c.n_routed_experts = k->experts;
    c.gemm = k->fp8 ? DSV4_GEMM_FP8 : DSV4_GEMM_EXACT;
    ck_assert_msg(dsv4_config_validate(&c, &e) == DSV4_OK, "%s", e.message);
    return c;
}

/* Generates the case's layer (once per preset, expert count and layer) and input; opens both. */
static inline void bo_data(const bo_case *k, const dsv4_config *c, dsv4_checkpoint **ck, dsv4_st_file **in)
{
    char wp[512], ip[512], n1[160], n2[160];
    snprintf(n1, sizeof n1, "bo_%s_e%lld_l%lld_w.safetensors", k->preset, (long long)c->n_routed_experts,
             (long long)k->layer);
    snprintf(n2, sizeof n2, "bo_%s_e%lld_l%lld_T%lld_in.safetensors", k->preset, (long long)c->n_routed_experts,
             (long long)k->layer, (long long)k->tokens);
    tu_path(wp, sizeof wp, n1);
    tu_path(ip, sizeof ip, n2);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.seed = 7;
    o.threads = BO_GEN_THREADS;
    dsv4_error e;
    /* The weights depend on the preset, expert count and layer only (the switches act at run time). */
    if (!tu_file_exists(wp))
        ck_assert_msg(dsv4_gen_weights(c, &o, wp, &e) == DSV4_OK, "%s", e.message);
    o.seed = 11;
    ck_assert_msg(dsv4_gen_input(c, &o, k->tokens, ip, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_checkpoint_open(wp, ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_st_open(ip, in, &e) == DSV4_OK, "%s", e.message);
}

/* Creates be's backend for plan p (its threads, cpu kernel table and cuda kernel variants). */
static inline dsv4_status bo_create(const dsv4_plan *p, const dsv4_checkpoint *ck, const bo_backend *be,
                                    dsv4_backend **b, dsv4_error *e)
{
    dsv4_backend_options bo;
    dsv4_backend_options_init(&bo);
    bo.threads = be->threads;
    char params[320] = "";
    if (be->kind == DSV4_BACKEND_CPU && be->kernels != DSV4_CPU_KERNELS_AUTO)
        snprintf(params, sizeof params, "kernels=%s", dsv4_cpu_kernels_name(be->kernels));
    else if (be->kind == DSV4_BACKEND_CUDA && be->cuda_kernels)
        snprintf(params, sizeof params, "%s", be->cuda_kernels);
    bo.params = params;
    return dsv4_backend_create_with(p, ck, &bo, b, e);
}

/* Output buffers for T tokens, y poisoned (NaN everywhere until written). */
static inline void bo_alloc(const dsv4_config *c, int64_t T, bo_out *r)
{
    int64_t H = c->dim, K = c->n_activated;
    r->y = malloc((size_t)(T * H + 1) * sizeof *r->y);
    memset(r->y, 0xFF, (size_t)(T * H + 1) * sizeof *r->y);
    r->ids = calloc((size_t)(T * K + 1), sizeof *r->ids);
    r->w = calloc((size_t)(T * K + 1), sizeof *r->w);
    r->kept = calloc((size_t)(T + 1), sizeof *r->kept);
}

/* be->forwards forwards of x on one backend; r keeps the last and whether all were equal. */
static inline void bo_run(const dsv4_config *c, const bo_case *k, const bo_backend *be, const dsv4_checkpoint *ck,
                          const uint16_t *x, const int32_t *in_ids, bo_out *r)
{
    int64_t T = k->tokens, H = c->dim;
    int graph = be->kind == DSV4_BACKEND_CUDA && k->graph;
    dsv4_plan *p = bo_plan(c, be->kind, k->chunk, graph);
    dsv4_backend *b = NULL;
    dsv4_error e;
    ck_assert_msg(bo_create(p, ck, be, &b, &e) == DSV4_OK, "create: %s", e.message);
    ck_assert_str_eq(dsv4_backend_name(b), dsv4_backend_kind_name(be->kind));
    snprintf(r->kernels, sizeof r->kernels, "%s", dsv4_backend_kernels(b));
    if (be->kind == DSV4_BACKEND_CPU && be->kernels != DSV4_CPU_KERNELS_AUTO)
        ck_assert_str_eq(r->kernels, dsv4_cpu_kernels_name(be->kernels));
    bo_alloc(c, T, r);
    uint16_t *first = NULL;
    r->repeat_same = 1;
    for (int f = 0; f < be->forwards; f++) {
        dsv4_forward_out o = {r->y, r->ids, r->w, r->kept};
        ck_assert_msg(dsv4_backend_forward(b, T, x, in_ids, &o, &e) == DSV4_OK, "forward: %s", e.message);
        if (f == 0 && be->forwards > 1) {
            first = malloc((size_t)(T * H + 1) * sizeof *first);
            memcpy(first, r->y, (size_t)(T * H) * sizeof *first);
        } else if (first && memcmp(first, r->y, (size_t)(T * H) * sizeof *first) != 0) {
            r->repeat_same = 0;
        }
    }
    free(first);
    r->stats = dsv4_backend_get_stats(b);
    r->planned_step = dsv4_plan_workspace_bytes(p, T, graph && dsv4_plan_can_replay(p, T));
    dsv4_backend_free(b);
    dsv4_plan_free(p);
}

static inline void bo_free(bo_out *r)
{
    free(r->y);
    free(r->ids);
    free(r->w);
    free(r->kept);
}

/* Whether a backend starts here: creating it on a tiny layer succeeds (a build without it, or a
   machine without its device, answers DSV4_ERR_UNSUPPORTED / DSV4_ERR_DEVICE). */
static inline bool bo_backend_available(dsv4_backend_kind kind)
{
    static int known[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    if (known[kind] >= 0)
        return known[kind];
    bo_case k = {"probe", "tiny", 1, 1, 0, -1, -1, -1, 0, 0, 0, 0};
    dsv4_config c = bo_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    bo_data(&k, &c, &ck, &in);
    dsv4_plan *p = bo_plan(&c, kind, 0, 0);
    dsv4_backend *b = NULL;
    dsv4_error e;
    dsv4_status st = dsv4_backend_create(p, ck, 1, &b, &e);
    if (st != DSV4_OK) {
        printf("backend_ops: the %s backend does not start here: %s\n", dsv4_backend_kind_name(kind), e.message);
        const char *req = getenv("DSV4MOE_CUDA_REQUIRED"); /* the device script: cuda must run */
        ck_assert_msg(!(kind == DSV4_BACKEND_CUDA && req && req[0] == '1'), "DSV4MOE_CUDA_REQUIRED=1 but: %s",
                      e.message);
    }
    known[kind] = st == DSV4_OK;
    dsv4_backend_free(b);
    dsv4_plan_free(p);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
    return known[kind];
}

/* Whether a backend runs the case: gemm fp8 is the cuda backend's alone. */
static inline bool bo_runs_on(const bo_case *k, dsv4_backend_kind kind)
{
    return !k->fp8 || kind == DSV4_BACKEND_CUDA;
}

/* Backend-specific checks after the common ones (NULL: none). */
typedef void (*bo_extra_fn)(const bo_case *k, const dsv4_config *c, const bo_backend *be, const bo_out *ref,
                            const bo_out *got);

/* A case's layer config, checkpoint and input, opened once for any number of runs. */
typedef struct {
    bo_case k;
    dsv4_config c;
    dsv4_checkpoint *ck;
    dsv4_st_file *in;
    const uint16_t *x;  /* NULL when T = 0 */
    const int32_t *ids; /* NULL when T = 0 */
} bo_in;

static inline void bo_in_open(const bo_case *k, bo_in *d)
{
    d->k = *k;
    d->c = bo_config(k);
    d->ck = NULL;
    d->in = NULL;
    bo_data(k, &d->c, &d->ck, &d->in);
    d->x = k->tokens ? dsv4_st_find(d->in, "x")->data : NULL;
    d->ids = k->tokens ? dsv4_st_find(d->in, "input_ids")->data : NULL;
}

static inline void bo_in_close(bo_in *d)
{
    dsv4_st_close(d->in);
    dsv4_checkpoint_close(d->ck);
}

/* A case's input and reference output (one forward of the ref backend), made once and compared
   with any number of backends. */
typedef struct {
    bo_in d;
    bo_out ref;
} bo_ref;

static inline void bo_ref_open(const bo_case *k, bo_ref *r)
{
    bo_in_open(k, &r->d);
    bo_backend rb = {DSV4_BACKEND_REF, 2, DSV4_CPU_KERNELS_AUTO, 1, NULL};
    bo_run(&r->d.c, k, &rb, r->d.ck, r->d.x, r->d.ids, &r->ref);
}

static inline void bo_ref_close(bo_ref *r)
{
    bo_free(&r->ref);
    bo_in_close(&r->d);
}

/*
 * Runs the case of r on backend be and asserts the contract every backend keeps: identical bytes
 * on repeated forwards; identical top-k ids and kept counts, router weights within 1e-5, ids in
 * [0, E]; the output within SPEC.md section 7's tolerances (finite where the reference is,
 * deepgemm diff and nmse < 1e-3, bf16 ULP p99 <= 2, at most 0.1 % beyond atol = rtol = 0.035),
 * or for gemm fp8 section 9's (deepgemm diff < 1e-3, at most 2 % beyond atol = rtol = 0.035,
 * max |a-b| <= 0.035 + 0.2 rms(reference)); forwards, tokens and non-finite rows counted; a
 * planned workspace; and, for a backend that reports its groups (not the reference), launches
 * exactly when T > 0, the gemm mode it ran, and clamp hits within 2 % (+2) of the reference's
 * (gemm fp8: 5 % + 4, its sums move g and u by a few ulp; none when the limit is 0).
 */
static inline void bo_compare(const bo_ref *r, const bo_backend *be, bo_extra_fn extra)
{
    const bo_case *k = &r->d.k;
    const dsv4_config c = r->d.c;
    const bo_out ref = r->ref;
    int64_t T = k->tokens, H = c.dim, K = c.n_activated, E = c.n_routed_experts;
    bo_out got;
    bo_run(&c, k, be, r->d.ck, r->d.x, r->d.ids, &got);
    dsv4_compare_metrics m;
    ck_assert(dsv4_compare_bf16(got.y, ref.y, T * H, &m));
    char line[512];
    dsv4_compare_format(&m, line, sizeof line);
    int64_t id_diff = 0, kept_diff = 0;
    double wmax = 0;
    for (int64_t i = 0; i < T * K; i++) {
        id_diff += got.ids[i] != ref.ids[i];
        double d = fabs((double)got.w[i] - ref.w[i]);
        wmax = d > wmax ? d : wmax;
    }
    for (int64_t t = 0; t < T; t++)
        kept_diff += got.kept[t] != ref.kept[t];
    uint64_t fw = (uint64_t)be->forwards;
    bo_row("backend_ops %-5s %-12s %-26s T %4lld: %s; ids differ %lld; kept differ %lld; max |dw| %.3g; "
           "clamp routed g/u %llu/%llu (ref %llu/%llu) shared %llu/%llu; launches %llu skips %llu replays %llu; "
           "workspace peak %llu planned %llu step %llu allocated %llu device %llu; repeat %s\n",
           dsv4_backend_kind_name(be->kind), got.kernels, k->name, (long long)T, line, (long long)id_diff,
           (long long)kept_diff, wmax, (unsigned long long)(got.stats.routed_g_clamped / fw),
           (unsigned long long)(got.stats.routed_u_clamped / fw), (unsigned long long)ref.stats.routed_g_clamped,
           (unsigned long long)ref.stats.routed_u_clamped, (unsigned long long)(got.stats.shared_g_clamped / fw),
           (unsigned long long)(got.stats.shared_u_clamped / fw), (unsigned long long)got.stats.launches,
           (unsigned long long)got.stats.empty_skips, (unsigned long long)got.stats.graph_replays,
           (unsigned long long)got.stats.workspace_peak, (unsigned long long)got.stats.workspace_planned,
           (unsigned long long)got.planned_step, (unsigned long long)got.stats.workspace_allocated,
           (unsigned long long)got.stats.device_allocated, got.repeat_same ? "identical" : "DIFFERS");
    fflush(stdout);
    ck_assert_msg(got.repeat_same, "%s: two forwards of the same input differ", k->name);
    /* Routing: identical for these seeds (no near-ties in the data). */
    ck_assert_msg(id_diff == 0, "%s: %lld topk ids differ", k->name, (long long)id_diff);
    ck_assert_msg(kept_diff == 0, "%s: %lld kept counts differ", k->name, (long long)kept_diff);
    ck_assert_msg(wmax < 1e-5, "%s: router weights differ by %g", k->name, wmax);
    for (int64_t i = 0; i < T * K; i++)
        ck_assert(got.ids[i] >= 0 && got.ids[i] <= E);
    /* Output: SPEC.md section 7 (gemm exact), section 9 (gemm fp8). */
    ck_assert_msg(m.finite_ok, "%s: %lld non-finite values where the reference is finite", k->name,
                  (long long)m.bad_nonfinite);
    if (T > 0) {
        ck_assert_uint_eq(got.stats.gemm_fp8, k->fp8 ? 1 : 0);
        ck_assert_msg(m.deepgemm_diff < 1e-3, "%s: diff %g", k->name, m.deepgemm_diff);
        if (k->fp8) {
            ck_assert_msg(m.tol_violations * 50 <= m.n, "%s: %lld of %lld past atol=rtol=0.035", k->name,
                          (long long)m.tol_violations, (long long)m.n);
            ck_assert_msg(m.max_abs <= 0.035 + 0.2 * m.rms_ref, "%s: max|a-b| %g > 0.035 + 0.2 rms %g", k->name,
                          m.max_abs, m.rms_ref);
        } else {
            ck_assert_msg(m.nmse < 1e-3, "%s: nmse %g", k->name, m.nmse);
            ck_assert_msg(m.ulp_p99 <= 2, "%s: bf16 ulp p99 %u", k->name, m.ulp_p99);
            ck_assert_msg(m.tol_violations * 1000 <= m.n, "%s: %lld of %lld past atol=rtol=0.035", k->name,
                          (long long)m.tol_violations, (long long)m.n);
        }
    }
    /* Statistics */
    ck_assert_uint_eq(got.stats.forwards, fw);
    ck_assert_uint_eq(got.stats.tokens, fw * (uint64_t)T);
    ck_assert_uint_eq(got.stats.nonfinite_rows, fw * ref.stats.nonfinite_rows);
    ck_assert(got.stats.workspace_planned > 0);
    if (be->kind != DSV4_BACKEND_REF) {
        if (T > 0) {
            ck_assert(got.stats.launches > 0);
            /* clamp hits may differ only where a g or u sits at the bf16 rounding of L */
            const double rel = k->fp8 ? 0.05 : 0.02, abs_ = k->fp8 ? 4 : 2;
            double rg = (double)ref.stats.routed_u_clamped, cg = (double)got.stats.routed_u_clamped / (double)fw;
            ck_assert_msg(fabs(rg - cg) <= rel * rg + abs_, "%s: u clamp hits %g vs %g", k->name, cg, rg);
            double sr = (double)ref.stats.shared_u_clamped, sc = (double)got.stats.shared_u_clamped / (double)fw;
            ck_assert_msg(fabs(sr - sc) <= rel * sr + abs_, "%s: shared u clamp hits %g vs %g", k->name, sc, sr);
            if (c.swiglu_limit == 0.0f)
                ck_assert_uint_eq(got.stats.routed_u_clamped + got.stats.routed_g_clamped, 0);
        } else {
            ck_assert_uint_eq(got.stats.launches, 0);
        }
    }
    if (extra)
        extra(k, &c, be, &ref, &got);
    bo_free(&got);
}

/* bo_compare of case k on one backend (its reference made for it). */
static inline void bo_check(const bo_case *k, const bo_backend *be, bo_extra_fn extra)
{
    bo_ref r;
    bo_ref_open(k, &r);
    bo_compare(&r, be, extra);
    bo_ref_close(&r);
}

#ifdef DSV4_WITH_CUDA
/* The cuda backend: graphs replay exactly when asked and T fits a bucket; the step's measured
   workspace within the plan's step. */
static inline void bo_cuda_extra(const bo_case *k, const dsv4_config *c, const bo_backend *be, const bo_out *ref,
                                 const bo_out *got)
{
    (void)c, (void)ref;
    if (k->tokens == 0) {
        ck_assert_uint_eq(got->stats.workspace_peak, 0);
        return;
    }
    if (k->graph && k->tokens <= 128)
        ck_assert_uint_eq(got->stats.graph_replays, (uint64_t)be->forwards);
    else
        ck_assert_uint_eq(got->stats.graph_replays, 0);
    ck_assert_msg(got->stats.workspace_peak <= got->planned_step, "%s: workspace peak %llu above the plan's %llu",
                  k->name, (unsigned long long)got->stats.workspace_peak, (unsigned long long)got->planned_step);
}
#endif

/* ---------------- the table on every backend ---------------- */


/* ---------------- the table on every backend ---------------- */

/* The cpu backend's memory model bounds what it really allocated (every shape of the table). */
static inline void bo_cpu_extra(const bo_case *k, const dsv4_config *c, const bo_backend *be, const bo_out *ref,
                      const bo_out *got)
{
    (void)c, (void)be, (void)ref;
    ck_assert_msg(got->stats.workspace_peak <= got->stats.workspace_planned, "%s: workspace peak %llu > planned %llu",
                  k->name, (unsigned long long)got->stats.workspace_peak,
                  (unsigned long long)got->stats.workspace_planned);
    if (k->tokens > 0)
        ck_assert(got->stats.workspace_peak > 0);
}

/* How the table runs on a backend of this kind, and its own checks. */
static inline bo_backend bo_backend_of(dsv4_backend_kind kind, bo_extra_fn *extra, char *spec, size_t n)
{
    bo_backend be = {kind, kind == DSV4_BACKEND_REF ? 3 : 2, DSV4_CPU_KERNELS_AUTO, 2, NULL};
    *extra = kind == DSV4_BACKEND_CPU ? bo_cpu_extra : NULL;
    spec[0] = 0;
#ifdef DSV4_WITH_CUDA
    if (kind == DSV4_BACKEND_CUDA) {
        *extra = bo_cuda_extra;
        be.cuda_kernels = bench_cuda_kernels_env(spec, n);
    }
#else
    (void)n;
#endif
    return be;
}

/* Case i of the table on every backend the registry reports available (the cpu backend also on
   the AVX2 table where the CPU has a better one); the number of backends it ran on (2 for a case
   skipped under coverage), and in *names (when not NULL, 128 bytes) their names. */
static inline int bo_every_backend(int i, char *names)
{
    const bo_case *k = &bo_cases[i];
    if (names)
        names[0] = 0;
    if (bo_skipped_under_coverage(k))
        return 2;
    bo_ref r;
    bo_ref_open(k, &r);
    int ran = 0;
    for (int b = 0; b < dsv4_backend_count(); b++) {
        dsv4_backend_info info;
        dsv4_error e;
        ck_assert_int_eq(dsv4_backend_info_at(b, &info, &e), DSV4_OK);
        if (info.built && !info.available) {
            const char *req = getenv("DSV4MOE_CUDA_REQUIRED"); /* the device scripts: cuda must run */
            ck_assert_msg(!(info.kind == DSV4_BACKEND_CUDA && req && req[0] == '1'),
                          "DSV4MOE_CUDA_REQUIRED=1 but the cuda backend is not available: %s", info.why);
            if (i == 0)
                printf("backend_ops: the %s backend is built but not available here: %s\n", info.name, info.why);
        }
        if (!info.available || !bo_runs_on(k, info.kind))
            continue;
        bo_extra_fn extra;
        char spec[256];
        bo_backend be = bo_backend_of(info.kind, &extra, spec, sizeof spec);
        bo_compare(&r, &be, extra);
        ran++;
        if (names)
            snprintf(names + strlen(names), 128 - strlen(names), "%s%s", ran > 1 ? " " : "", info.name);
        /* the AVX2 table where the CPU has a better one */
        if (info.kind == DSV4_BACKEND_CPU && dsv4_cpu_kernels_available(DSV4_CPU_KERNELS_AVX2) &&
            dsv4_cpu_kernels_available((dsv4_cpu_kernels)(DSV4_CPU_KERNELS_AVX2 + 1))) {
            be.kernels = DSV4_CPU_KERNELS_AVX2;
            bo_compare(&r, &be, extra);
        }
    }
    bo_ref_close(&r);
    return ran;
}

#endif
