/*
 * The CUDA backend against the reference on the GPU (built by `make cuda`, run by ci/cuda-test.sh
 * on the device machine): every quant mode, clamp on/off, top-p on/off, hash layer, after_w2,
 * graph on/off (replay bit-identical to eager), T = 0, 1, odd sizes, a chunked long prompt and a
 * v4-flash-shaped layer, with the tolerances of tests/test_cpu.c (SPEC.md section 7).
 *
 * Without a GPU every test that needs one is skipped (printed, and counted as passed) unless
 * DSV4MOE_CUDA_REQUIRED=1, which the device script sets. The workspace tests run everywhere.
 * Production formats run the fp8 tensor-core path (fast/cuda/mma.cuh); the "exact" Tcase runs
 * the same kinds of case through the exact path (DSV4MOE_CUDA_PATH=exact) and compares the two
 * paths with each other; "device" checks dsv4_backend_forward_device against the host forward;
 * "embed" the server calls (dsv4_backend_enqueue in a caller's capture, padding rows, a shared
 * caller workspace, the latched error word).
 * Tcases: "small" (quick, for compute-sanitizer), "numerics", "graphs", "flash", "exact",
 * "device", "embed", "host".
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "dsv4moe/backend.h"
#include "dsv4moe/compare.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"
#include "testutil.h"
#include "../../bench/bench_util.h"

/* fast/cuda/cuda.cu */
uint64_t dsv4_cuda_chunk_workspace_bytes(const dsv4_config *cfg, int64_t tc);

typedef struct {
    const char *name;
    const char *preset;
    int64_t layer;
    int64_t tokens;
    int64_t chunk;      /* topology chunk_tokens (0: planner) */
    float swiglu_limit; /* < 0: preset's */
    int shared_clamp;   /* -1: preset's */
    int after_w2;       /* -1: preset's */
    int graph;          /* cuda_graph on (buckets 1..128) */
    int64_t experts;    /* > 0: n_routed_experts override (v4-flash shapes with fewer experts) */
    int fp8;            /* gemm fp8 (SPEC.md section 9; its tolerance); 0: gemm exact */
} cuda_case;

/* dsv4_backend_create with the kernel variants the environment names (bench_util.h): the
   variant tests set DSV4MOE_CUDA_* around a creation, as the device scripts do. */
static dsv4_status create_env(const dsv4_plan *p, const dsv4_checkpoint *ck, int threads, dsv4_backend **b,
                              dsv4_error *e)
{
    char spec[256];
    dsv4_backend_options opt;
    dsv4_backend_options_init(&opt);
    opt.threads = threads;
    opt.cuda_kernels = bench_cuda_kernels_env(spec, sizeof spec);
    if (dsv4_plan_topology(p)->backend != DSV4_BACKEND_CUDA)
        opt.cuda_kernels = NULL;
    return dsv4_backend_create_with(p, ck, &opt, b, e);
}

static int g_have_gpu = -1;

/* Whether the cuda backend starts here (probed once on a tiny layer). */
static int have_gpu(void);

static dsv4_plan *make_plan(const dsv4_config *c0, dsv4_backend_kind kind, int64_t chunk, int graph)
{
    dsv4_config cc = *c0, *c = &cc;
    if (kind != DSV4_BACKEND_CUDA && c->gemm == DSV4_GEMM_FP8)
        c->gemm = DSV4_GEMM_AUTO; /* the reference of an fp8 case: gemm is a fast path's mode */
    dsv4_topology topo;
    dsv4_topology_init(&topo);
    topo.backend = kind;
    topo.chunk_tokens = chunk;
    topo.max_tokens_per_rank = 4096;
    if (graph) {
        topo.cuda_graph = true;
        topo.n_buckets = 8;
        for (int i = 0; i < 8; i++)
            topo.buckets[i] = 1 << i;
    }
    dsv4_budget bud;
    dsv4_budget_init(&bud);
    bud.device_bytes = 141ull << 30;
    dsv4_plan *p = NULL;
    dsv4_error e;
    dsv4_status st = dsv4_plan_create(c, &topo, &bud, &p, &e);
    ck_assert_msg(st == DSV4_OK, "plan: %s", e.message);
    return p;
}

static dsv4_config case_config(const cuda_case *k)
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
    if (k->experts > 0)
        c.n_routed_experts = k->experts;
    c.gemm = k->fp8 ? DSV4_GEMM_FP8 : DSV4_GEMM_EXACT;
    ck_assert_msg(dsv4_config_validate(&c, &e) == DSV4_OK, "%s", e.message);
    return c;
}

static void case_data(const cuda_case *k, const dsv4_config *c, dsv4_checkpoint **ck, dsv4_st_file **in)
{
    char wp[512], ip[512], n1[160], n2[160];
    snprintf(n1, sizeof n1, "cuda_%s_e%lld_l%lld_w.safetensors", k->preset, (long long)c->n_routed_experts,
             (long long)k->layer);
    snprintf(n2, sizeof n2, "cuda_%s_e%lld_l%lld_T%lld_in.safetensors", k->preset, (long long)c->n_routed_experts,
             (long long)k->layer, (long long)k->tokens);
    tu_path(wp, sizeof wp, n1);
    tu_path(ip, sizeof ip, n2);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.seed = 7;
    o.threads = 16;
    dsv4_error e;
    if (!tu_file_exists(wp))
        ck_assert_msg(dsv4_gen_weights(c, &o, wp, &e) == DSV4_OK, "%s", e.message);
    o.seed = 11;
    ck_assert_msg(dsv4_gen_input(c, &o, k->tokens, ip, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_checkpoint_open(wp, ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_st_open(ip, in, &e) == DSV4_OK, "%s", e.message);
}

typedef struct {
    uint16_t *y;
    int32_t *ids, *kept;
    float *w;
    dsv4_backend_stats stats;
    uint64_t planned_step;
} run_out;

static void alloc_out(const dsv4_config *c, int64_t T, run_out *r)
{
    int64_t H = c->dim, K = c->n_activated;
    r->y = malloc((size_t)(T * H + 1) * sizeof *r->y);
    memset(r->y, 0xFF, (size_t)(T * H + 1) * sizeof *r->y); /* poisoned: NaN everywhere until written */
    r->ids = calloc((size_t)(T * K + 1), sizeof *r->ids);
    r->w = calloc((size_t)(T * K + 1), sizeof *r->w);
    r->kept = calloc((size_t)(T + 1), sizeof *r->kept);
}

/* `forwards` forwards of the same input on one backend; r keeps the last, *same says all were equal. */
static void run_backend(const dsv4_config *c, dsv4_backend_kind kind, int64_t chunk, int graph,
                        const dsv4_checkpoint *ck, int64_t T, const uint16_t *x, const int32_t *in_ids, run_out *r,
                        int forwards, int *same)
{
    dsv4_plan *p = make_plan(c, kind, chunk, graph);
    dsv4_backend *b = NULL;
    dsv4_error e;
    ck_assert_msg(create_env(p, ck, 2, &b, &e) == DSV4_OK, "create: %s", e.message);
    ck_assert_str_eq(dsv4_backend_name(b), kind == DSV4_BACKEND_CUDA ? "cuda" : "ref");
    alloc_out(c, T, r);
    int64_t H = c->dim;
    uint16_t *first = NULL;
    if (same)
        *same = 1;
    for (int f = 0; f < forwards; f++) {
        dsv4_forward_out o = {r->y, r->ids, r->w, r->kept};
        ck_assert_msg(dsv4_backend_forward(b, T, x, in_ids, &o, &e) == DSV4_OK, "forward: %s", e.message);
        if (same && f == 0 && forwards > 1) {
            first = malloc((size_t)(T * H + 1) * sizeof *first);
            memcpy(first, r->y, (size_t)(T * H) * sizeof *first);
        } else if (same && first && memcmp(first, r->y, (size_t)(T * H) * sizeof *first) != 0) {
            *same = 0;
        }
    }
    free(first);
    r->stats = dsv4_backend_get_stats(b);
    r->planned_step = dsv4_plan_workspace_bytes(p, T, graph && dsv4_plan_can_replay(p, T));
    dsv4_backend_free(b);
    dsv4_plan_free(p);
}

static void free_out(run_out *r)
{
    free(r->y);
    free(r->ids);
    free(r->w);
    free(r->kept);
}

static void check_case(const cuda_case *k)
{
    if (!have_gpu()) {
        printf("cuda_suite %-28s SKIPPED (no CUDA device)\n", k->name);
        return;
    }
    dsv4_config c = case_config(k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(k, &c, &ck, &in);
    int64_t T = k->tokens, H = c.dim, K = c.n_activated, E = c.n_routed_experts;
    const uint16_t *x = T ? dsv4_st_find(in, "x")->data : NULL;
    const int32_t *ids = T ? dsv4_st_find(in, "input_ids")->data : NULL;
    run_out ref, cu;
    run_backend(&c, DSV4_BACKEND_REF, k->chunk, 0, ck, T, x, ids, &ref, 1, NULL);
    int same = 1;
    run_backend(&c, DSV4_BACKEND_CUDA, k->chunk, k->graph, ck, T, x, ids, &cu, 2, &same);

    dsv4_compare_metrics m;
    ck_assert(dsv4_compare_bf16(cu.y, ref.y, T * H, &m));
    char line[512];
    dsv4_compare_format(&m, line, sizeof line);
    int64_t id_diff = 0, kept_diff = 0;
    double wmax = 0;
    for (int64_t i = 0; i < T * K; i++) {
        id_diff += cu.ids[i] != ref.ids[i];
        double d = fabs((double)cu.w[i] - ref.w[i]);
        wmax = d > wmax ? d : wmax;
    }
    for (int64_t t = 0; t < T; t++)
        kept_diff += cu.kept[t] != ref.kept[t];
    printf("cuda_suite %-28s T %5lld: %s; ids differ %lld; kept differ %lld; max|dw| %.3g; clamp routed g/u "
           "%llu/%llu (ref %llu/%llu) shared %llu/%llu (ref %llu/%llu); launches %llu skips %llu replays %llu; "
           "ws peak %llu step-planned %llu allocated %llu device %llu; repeat %s\n",
           k->name, (long long)T, line, (long long)id_diff, (long long)kept_diff, wmax,
           (unsigned long long)cu.stats.routed_g_clamped, (unsigned long long)cu.stats.routed_u_clamped,
           (unsigned long long)ref.stats.routed_g_clamped, (unsigned long long)ref.stats.routed_u_clamped,
           (unsigned long long)cu.stats.shared_g_clamped, (unsigned long long)cu.stats.shared_u_clamped,
           (unsigned long long)ref.stats.shared_g_clamped, (unsigned long long)ref.stats.shared_u_clamped,
           (unsigned long long)cu.stats.launches, (unsigned long long)cu.stats.empty_skips,
           (unsigned long long)cu.stats.graph_replays, (unsigned long long)cu.stats.workspace_peak,
           (unsigned long long)cu.planned_step, (unsigned long long)cu.stats.workspace_allocated,
           (unsigned long long)cu.stats.device_allocated, same ? "identical" : "DIFFERS");
    fflush(stdout);
    ck_assert_msg(same, "%s: two forwards of the same input differ", k->name);
    ck_assert_msg(id_diff == 0, "%s: %lld topk ids differ", k->name, (long long)id_diff);
    ck_assert_msg(kept_diff == 0, "%s: %lld kept counts differ", k->name, (long long)kept_diff);
    ck_assert_msg(wmax < 1e-5, "%s: router weights differ by %g", k->name, wmax);
    for (int64_t i = 0; i < T * K; i++)
        ck_assert(cu.ids[i] >= 0 && cu.ids[i] <= E);
    ck_assert_msg(m.finite_ok, "%s: %lld non-finite values where the reference is finite", k->name,
                  (long long)m.bad_nonfinite);
    if (T > 0 && k->fp8) {
        /* SPEC.md section 9, gemm fp8: DeepGEMM diff < 1e-3, at most 2 % beyond atol = rtol = 0.035,
           max |a-b| <= 0.035 + 0.2 rms(reference) */
        ck_assert_uint_eq(cu.stats.gemm_fp8, 1);
        ck_assert_msg(m.deepgemm_diff < 1e-3, "%s: diff %g", k->name, m.deepgemm_diff);
        ck_assert_msg(m.tol_violations * 50 <= m.n, "%s: %lld of %lld past atol=rtol=0.035", k->name,
                      (long long)m.tol_violations, (long long)m.n);
        ck_assert_msg(m.max_abs <= 0.035 + 0.2 * m.rms_ref, "%s: max|a-b| %g > 0.035 + 0.2 rms %g", k->name, m.max_abs,
                      m.rms_ref);
    } else if (T > 0) {
        ck_assert_uint_eq(cu.stats.gemm_fp8, 0);
        ck_assert_msg(m.deepgemm_diff < 1e-3, "%s: diff %g", k->name, m.deepgemm_diff);
        ck_assert_msg(m.nmse < 1e-3, "%s: nmse %g", k->name, m.nmse);
        ck_assert_msg(m.ulp_p99 <= 2, "%s: bf16 ulp p99 %u", k->name, m.ulp_p99);
        ck_assert_msg(m.tol_violations * 1000 <= m.n, "%s: %lld of %lld past atol=rtol=0.035", k->name,
                      (long long)m.tol_violations, (long long)m.n);
    }
    ck_assert_uint_eq(cu.stats.forwards, 2);
    ck_assert_uint_eq(cu.stats.tokens, 2 * (uint64_t)T);
    ck_assert_uint_eq(cu.stats.nonfinite_rows, 2 * ref.stats.nonfinite_rows);
    ck_assert(cu.stats.workspace_planned > 0);
    if (T > 0) {
        ck_assert(cu.stats.launches > 0);
        /* fp8 sums move g and u by a few ulp, so values at the limit may fall on the other side */
        const double rel = k->fp8 ? 0.05 : 0.02, abs_ = k->fp8 ? 4 : 2;
        double rg = (double)ref.stats.routed_u_clamped, cg = (double)cu.stats.routed_u_clamped / 2;
        ck_assert_msg(fabs(rg - cg) <= rel * rg + abs_, "%s: u clamp hits %g vs %g", k->name, cg, rg);
        double sr = (double)ref.stats.shared_u_clamped, sc = (double)cu.stats.shared_u_clamped / 2;
        ck_assert_msg(fabs(sr - sc) <= rel * sr + abs_, "%s: shared u clamp hits %g vs %g", k->name, sc, sr);
        if (c.swiglu_limit == 0.0f)
            ck_assert_uint_eq(cu.stats.routed_u_clamped + cu.stats.routed_g_clamped, 0);
        if (k->graph && T <= 128)
            ck_assert_uint_eq(cu.stats.graph_replays, 2);
        else
            ck_assert_uint_eq(cu.stats.graph_replays, 0);
        ck_assert_msg(cu.stats.workspace_peak <= cu.planned_step, "%s: workspace peak %llu above the plan's %llu",
                      k->name, (unsigned long long)cu.stats.workspace_peak, (unsigned long long)cu.planned_step);
    } else {
        ck_assert_uint_eq(cu.stats.launches, 0);
        ck_assert_uint_eq(cu.stats.workspace_peak, 0);
    }
    free_out(&ref);
    free_out(&cu);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}

static int have_gpu(void)
{
    if (g_have_gpu >= 0)
        return g_have_gpu;
    cuda_case k = {"probe", "tiny", 1, 1, 0, -1, -1, -1, 0, 0, 0};
    dsv4_config c = case_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(&k, &c, &ck, &in);
    dsv4_plan *p = make_plan(&c, DSV4_BACKEND_CUDA, 0, 0);
    dsv4_backend *b = NULL;
    dsv4_error e;
    dsv4_status st = create_env(p, ck, 1, &b, &e);
    const char *req = getenv("DSV4MOE_CUDA_REQUIRED");
    if (st != DSV4_OK) {
        printf("cuda_suite: the cuda backend does not start here: %s\n", e.message);
        ck_assert_msg(!(req && req[0] == '1'), "DSV4MOE_CUDA_REQUIRED=1 but: %s", e.message);
    }
    g_have_gpu = st == DSV4_OK;
    dsv4_backend_free(b);
    dsv4_plan_free(p);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
    return g_have_gpu;
}

#define CASE(fn, ...)                                                                                       \
    START_TEST(fn)                                                                                          \
    {                                                                                                       \
        cuda_case k = {__VA_ARGS__};                                                                        \
        check_case(&k);                                                                                     \
    }                                                                                                       \
    END_TEST

/*                name                     preset       layer T     chunk L     scl after graph experts */
CASE(small_mini_t5, "mini T=5", "mini", 1, 5, 0, -1, -1, -1, 0, 0, 0)
CASE(small_mini_graph_t5, "mini graph T=5", "mini", 1, 5, 0, -1, -1, -1, 1, 0, 0)
CASE(small_fp8_t13, "mini-fp8 T=13", "mini-fp8", 1, 13, 0, -1, -1, -1, 0, 0, 0)

CASE(mini_fp4_t77, "mini fp4/fp8", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_fp4_hash_t77, "mini hash layer", "mini", 0, 77, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_fp8_t77, "mini-fp8", "mini-fp8", 1, 77, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_bf16_t77, "mini-bf16", "mini-bf16", 1, 77, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_bf16_hash_t77, "mini-bf16 hash", "mini-bf16", 0, 77, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_noclamp_t77, "mini no clamp", "mini", 1, 77, 0, 0.0f, -1, -1, 0, 0, 0)
CASE(mini_topp_t77, "mini-topp", "mini-topp", 1, 77, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_topp_noclamp_t77, "mini-topp no clamp", "mini-topp", 1, 77, 0, 0.0f, -1, -1, 0, 0, 0)
CASE(mini_after_w2_t77, "mini after_w2 noshclamp", "mini", 1, 77, 0, -1, 0, 1, 0, 0, 0)
CASE(mini_fp8_after_t77, "mini-fp8 after_w2", "mini-fp8", 1, 77, 0, -1, 0, 1, 0, 0, 0)
CASE(mini_t1, "mini T=1", "mini", 1, 1, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_hash_t1, "mini hash T=1", "mini", 0, 1, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_fp8_t1, "mini-fp8 T=1", "mini-fp8", 1, 1, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_bf16_t1, "mini-bf16 T=1", "mini-bf16", 1, 1, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_t0, "mini T=0", "mini", 1, 0, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_chunked_t300, "mini chunk 128 T=300", "mini", 1, 300, 128, -1, -1, -1, 0, 0, 0)
CASE(mini_topp_chunked_t300, "mini-topp chunk 128", "mini-topp", 1, 300, 128, -1, -1, -1, 0, 0, 0)
CASE(mini_hash_chunked_t300, "mini hash chunk 128", "mini", 0, 300, 128, -1, -1, -1, 0, 0, 0)
CASE(mini_long_t3000, "mini chunk 1024 T=3000", "mini", 1, 3000, 1024, -1, -1, -1, 0, 0, 0)
CASE(tiny_t77, "tiny bf16", "tiny", 1, 77, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_t30, "mini T=30", "mini", 1, 30, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_fp8_t30, "mini-fp8 T=30", "mini-fp8", 1, 30, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_bf16_t30, "mini-bf16 T=30", "mini-bf16", 1, 30, 0, -1, -1, -1, 0, 0, 0)
CASE(mini_t1100, "mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0)

CASE(graph_mini_t1, "graph mini T=1", "mini", 1, 1, 0, -1, -1, -1, 1, 0, 0)
CASE(graph_mini_t77, "graph mini T=77", "mini", 1, 77, 0, -1, -1, -1, 1, 0, 0)
CASE(graph_hash_t3, "graph mini hash T=3", "mini", 0, 3, 0, -1, -1, -1, 1, 0, 0)
CASE(graph_fp8_t9, "graph mini-fp8 T=9", "mini-fp8", 1, 9, 0, -1, -1, -1, 1, 0, 0)
CASE(graph_bf16_t128, "graph mini-bf16 T=128", "mini-bf16", 1, 128, 0, -1, -1, -1, 1, 0, 0)
CASE(graph_topp_t33, "graph mini-topp T=33", "mini-topp", 1, 33, 0, -1, -1, -1, 1, 0, 0)

/* gemm fp8: groups above fp8_cut rows (32 by default; the shared expert above 32 tokens) on the grouped FP8 GEMM */
/*                name                     preset       layer T     chunk L     scl after graph experts fp8 */
CASE(fp8_small_t300, "fp8 mini T=300", "mini", 1, 300, 0, -1, -1, -1, 0, 0, 1)
CASE(fp8_mini_t1100, "fp8 mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 1)
CASE(fp8_hash_t1100, "fp8 mini hash T=1100", "mini", 0, 1100, 0, -1, -1, -1, 0, 0, 1)
CASE(fp8_fp8_t1100, "fp8 mini-fp8 T=1100", "mini-fp8", 1, 1100, 0, -1, -1, -1, 0, 0, 1)
CASE(fp8_topp_t1100, "fp8 mini-topp T=1100", "mini-topp", 1, 1100, 0, -1, -1, -1, 0, 0, 1)
CASE(fp8_noclamp_t1100, "fp8 mini no clamp", "mini", 1, 1100, 0, 0.0f, -1, -1, 0, 0, 1)
CASE(fp8_after_t1100, "fp8 after_w2 noshclamp", "mini", 1, 1100, 0, -1, 0, 1, 0, 0, 1)
CASE(fp8_t1, "fp8 mini T=1", "mini", 1, 1, 0, -1, -1, -1, 0, 0, 1)
CASE(fp8_t0, "fp8 mini T=0", "mini", 1, 0, 0, -1, -1, -1, 0, 0, 1)
CASE(fp8_odd_t77, "fp8 mini T=77", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 1)
CASE(fp8_chunked_t3000, "fp8 chunk 1024 T=3000", "mini", 1, 3000, 1024, -1, -1, -1, 0, 0, 1)
CASE(fp8_graph_t128, "fp8 graph mini T=128", "mini", 1, 128, 0, -1, -1, -1, 1, 0, 1)
CASE(fp8_graph_t100, "fp8 graph mini-fp8 T=100", "mini-fp8", 1, 100, 0, -1, -1, -1, 1, 0, 1)
CASE(fp8_flash_t1024, "fp8 flash e32 T=1024", "v4-flash", 5, 1024, 0, -1, -1, -1, 0, 32, 1)
CASE(fp8_flash_hash_t600, "fp8 flash e32 hash T=600", "v4-flash", 0, 600, 0, -1, -1, -1, 0, 32, 1)
CASE(graph_eager_t200, "graph on, T=200 eager", "mini", 1, 200, 0, -1, -1, -1, 1, 0, 0)
CASE(graph_t0, "graph T=0", "mini", 1, 0, 0, -1, -1, -1, 1, 0, 0)

CASE(flash_t1, "v4-flash E32 T=1", "v4-flash", 5, 1, 0, -1, -1, -1, 0, 32, 0)
CASE(flash_t8_graph, "v4-flash E32 graph T=8", "v4-flash", 5, 8, 0, -1, -1, -1, 1, 32, 0)
CASE(flash_t40, "v4-flash E32 T=40", "v4-flash", 5, 40, 0, -1, -1, -1, 0, 32, 0)
CASE(flash_hash_t5, "v4-flash E32 hash T=5", "v4-flash", 1, 5, 0, -1, -1, -1, 0, 32, 0)

/* The exact path (exact_gemm.cuh) on formats that otherwise take the fp8 path. */
#define CASE_EXACT(fn, ...)                                                                                 \
    START_TEST(fn)                                                                                          \
    {                                                                                                       \
        cuda_case k = {__VA_ARGS__};                                                                        \
        setenv("DSV4MOE_CUDA_PATH", "exact", 1);                                                            \
        check_case(&k);                                                                                     \
        unsetenv("DSV4MOE_CUDA_PATH");                                                                      \
    }                                                                                                       \
    END_TEST

CASE_EXACT(exact_mini_t77, "exact mini T=77", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0)
CASE_EXACT(exact_fp8_t30, "exact mini-fp8 T=30", "mini-fp8", 1, 30, 0, -1, -1, -1, 0, 0, 0)
CASE_EXACT(exact_mini_t1100, "exact mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0)
CASE_EXACT(exact_graph_t5, "exact graph mini T=5", "mini", 1, 5, 0, -1, -1, -1, 1, 0, 0)
CASE_EXACT(exact_flash_t40, "exact v4-flash E32 T=40", "v4-flash", 5, 40, 0, -1, -1, -1, 0, 32, 0)

/* The fp8 path's mma.sync tile kernel for large groups (DSV4MOE_CUDA_TILE=mma) instead of k_tileh's wgmma. */
#define CASE_MMA(fn, ...)                                                                                   \
    START_TEST(fn)                                                                                          \
    {                                                                                                       \
        cuda_case k = {__VA_ARGS__};                                                                        \
        setenv("DSV4MOE_CUDA_TILE", "mma", 1);                                                              \
        check_case(&k);                                                                                     \
        unsetenv("DSV4MOE_CUDA_TILE");                                                                      \
    }                                                                                                       \
    END_TEST

CASE_MMA(mma_mini_t77, "mma.sync mini T=77", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0)
CASE_MMA(mma_mini_t1100, "mma.sync mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0)
CASE_MMA(mma_flash_t40, "mma.sync v4-flash E32 T=40", "v4-flash", 5, 40, 0, -1, -1, -1, 0, 32, 0)
CASE_MMA(mma_graph_t5, "mma.sync graph mini T=5", "mini", 1, 5, 0, -1, -1, -1, 1, 0, 0)

/* A case's config, checkpoint and input, for tests that run the backend themselves. */
typedef struct {
    dsv4_config c;
    dsv4_checkpoint *ck;
    dsv4_st_file *in;
    const uint16_t *x;
    const int32_t *ids;
    int64_t T;
} case_in;

static void open_case(const cuda_case *k, case_in *ci)
{
    ci->c = case_config(k);
    ci->ck = NULL;
    ci->in = NULL;
    ci->T = k->tokens;
    case_data(k, &ci->c, &ci->ck, &ci->in);
    ci->x = dsv4_st_find(ci->in, "x")->data;
    ci->ids = dsv4_st_find(ci->in, "input_ids")->data;
}

static void close_case(case_in *ci)
{
    dsv4_st_close(ci->in);
    dsv4_checkpoint_close(ci->ck);
}

/* One eager cuda forward with the environment variable var set to val for its creation (var NULL: none). */
static void run_env(const case_in *ci, run_out *o, const char *var, const char *val)
{
    if (var)
        setenv(var, val, 1);
    run_backend(&ci->c, DSV4_BACKEND_CUDA, 0, 0, ci->ck, ci->T, ci->x, ci->ids, o, 1, NULL);
    if (var)
        unsetenv(var);
}

/* The fp8 path against the exact path on one input: both within the reference's tolerances of each other. */
static void fast_vs_exact(const char *preset, int64_t layer, int64_t T, int64_t experts)
{
    if (!have_gpu())
        return;
    cuda_case k = {"fast/exact", preset, layer, T, 0, -1, -1, -1, 0, experts, 0};
    case_in ci;
    open_case(&k, &ci);
    const dsv4_config c = ci.c;
    run_out f, x2;
    run_env(&ci, &f, NULL, NULL);
    run_env(&ci, &x2, "DSV4MOE_CUDA_PATH", "exact");
    dsv4_compare_metrics m;
    ck_assert(dsv4_compare_bf16(f.y, x2.y, T * c.dim, &m));
    char line[512];
    dsv4_compare_format(&m, line, sizeof line);
    int64_t nd = 0;
    for (int64_t i = 0; i < T * c.dim; i++)
        nd += f.y[i] != x2.y[i];
    printf("cuda_suite fp8 path vs exact path %-9s E%lld layer %lld T %4lld: %s; %lld of %lld outputs differ\n",
           preset, (long long)c.n_routed_experts, (long long)layer, (long long)T, line, (long long)nd,
           (long long)(T * c.dim));
    ck_assert(memcmp(f.ids, x2.ids, (size_t)(T * c.n_activated) * 4) == 0);
    ck_assert_msg(m.finite_ok && m.deepgemm_diff < 1e-3 && m.ulp_p99 <= 2, "%s: %s", preset, line);
    free_out(&f);
    free_out(&x2);
    close_case(&ci);
}

typedef struct {
    const char *var, *val;
} env_kv;

/*
 * Kernel variants that must give the default's outputs bit for bit: they differ in scheduling
 * only, never in the order of a sum or a rounding point. The clamp counters too.
 */
static void variants_identical(const char *what, const char *preset, int64_t layer, int64_t T, int64_t experts,
                               int fp8, const env_kv *vs, size_t nv)
{
    if (!have_gpu())
        return;
    cuda_case k = {what, preset, layer, T, 0, -1, -1, -1, 0, experts, fp8};
    case_in ci;
    open_case(&k, &ci);
    const int64_t n = T * ci.c.dim;
    run_out d;
    run_env(&ci, &d, NULL, NULL);
    for (size_t v = 0; v < nv; v++) {
        const char *var = vs[v].var, *val = vs[v].val;
        run_out o;
        run_env(&ci, &o, var, val);
        int64_t nd = 0;
        for (int64_t i = 0; i < n; i++)
            nd += o.y[i] != d.y[i];
        printf("cuda_suite %s %s=%-5s %-9s T %4lld: %lld of %lld outputs differ from the default\n", what, var, val,
               preset, (long long)T, (long long)nd, (long long)n);
        ck_assert_msg(nd == 0, "%s=%s on %s T=%lld: %lld outputs differ", var, val, preset, (long long)T, (long long)nd);
        const dsv4_backend_stats *a = &o.stats, *z = &d.stats;
        ck_assert_msg(a->routed_g_clamped == z->routed_g_clamped && a->routed_u_clamped == z->routed_u_clamped &&
                          a->shared_g_clamped == z->shared_g_clamped && a->shared_u_clamped == z->shared_u_clamped,
                      "%s=%s on %s: clamp counts %llu %llu %llu %llu, default %llu %llu %llu %llu", var, val, preset,
                      (unsigned long long)a->routed_g_clamped, (unsigned long long)a->routed_u_clamped,
                      (unsigned long long)a->shared_g_clamped, (unsigned long long)a->shared_u_clamped,
                      (unsigned long long)z->routed_g_clamped, (unsigned long long)z->routed_u_clamped,
                      (unsigned long long)z->shared_g_clamped, (unsigned long long)z->shared_u_clamped);
        free_out(&o);
    }
    free_out(&d);
    close_case(&ci);
}

/* Every k_tileh variant (DSV4MOE_CUDA_TILEH: tile width, pipelined decode, blocks per SM; and
   DSV4MOE_CUDA_MID for mid-size groups). */
START_TEST(tileh_variants_identical)
{
    static const env_kv vs[] = {{"DSV4MOE_CUDA_TILEH", "s64x2"}, {"DSV4MOE_CUDA_TILEH", "p64"},
                                {"DSV4MOE_CUDA_TILEH", "s64"},   {"DSV4MOE_CUDA_TILEH", "p128"},
                                {"DSV4MOE_CUDA_MID", "p32"},     {"DSV4MOE_CUDA_MID", "s32"}};
    variants_identical("k_tileh", "mini", 1, 1100, 0, 0, vs, sizeof vs / sizeof vs[0]);
    variants_identical("k_tileh", "mini-fp8", 1, 1100, 0, 0, vs, sizeof vs / sizeof vs[0]);
}
END_TEST

START_TEST(fast_matches_exact)
{
    fast_vs_exact("mini", 1, 77, 0);
    fast_vs_exact("mini-fp8", 1, 300, 0);
    fast_vs_exact("v4-flash", 5, 40, 32);
}
END_TEST

/* Device buffers of one forward's tensors. */
typedef struct {
    void *x, *ids, *y, *ti, *tw, *kept;
} dev_io;

static void dev_io_alloc(const dsv4_config *c, int64_t T, const uint16_t *x, const int32_t *ids, dev_io *d)
{
    const size_t H = (size_t)c->dim, K = (size_t)c->n_activated, t = (size_t)T;
    ck_assert(cudaMalloc(&d->x, t * H * 2) == cudaSuccess);
    ck_assert(cudaMalloc(&d->ids, t * 4) == cudaSuccess);
    ck_assert(cudaMalloc(&d->y, t * H * 2) == cudaSuccess);
    ck_assert(cudaMalloc(&d->ti, t * K * 4) == cudaSuccess);
    ck_assert(cudaMalloc(&d->tw, t * K * 4) == cudaSuccess);
    ck_assert(cudaMalloc(&d->kept, t * 4) == cudaSuccess);
    ck_assert(cudaMemcpy(d->x, x, t * H * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    ck_assert(cudaMemcpy(d->ids, ids, t * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    ck_assert(cudaMemset(d->y, 0xFF, t * H * 2) == cudaSuccess); /* NaN until written */
    ck_assert(cudaMemset(d->ti, 0xFF, t * K * 4) == cudaSuccess);
}

static void dev_io_free(dev_io *d)
{
    cudaFree(d->x), cudaFree(d->ids), cudaFree(d->y), cudaFree(d->ti), cudaFree(d->tw), cudaFree(d->kept);
}

static dsv4_forward_out dev_out(const dev_io *d)
{
    dsv4_forward_out o = {(uint16_t *)d->y, (int32_t *)d->ti, (float *)d->tw, (int32_t *)d->kept};
    return o;
}

/* The outputs of d on the host. */
static void dev_fetch(const dsv4_config *c, int64_t T, const dev_io *d, run_out *r)
{
    const size_t H = (size_t)c->dim, K = (size_t)c->n_activated, t = (size_t)T;
    alloc_out(c, T, r);
    ck_assert(cudaMemcpy(r->y, d->y, t * H * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(cudaMemcpy(r->ids, d->ti, t * K * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(cudaMemcpy(r->w, d->tw, t * K * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(cudaMemcpy(r->kept, d->kept, t * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
}

/* Rows [0, n) of a and b are equal bit for bit (all four outputs). */
static void same_rows(const dsv4_config *c, const run_out *a, const run_out *b, int64_t n, const char *what)
{
    const size_t H = (size_t)c->dim, K = (size_t)c->n_activated, t = (size_t)n;
    ck_assert_msg(memcmp(a->y, b->y, t * H * 2) == 0, "%s: y differs", what);
    ck_assert_msg(memcmp(a->ids, b->ids, t * K * 4) == 0, "%s: topk ids differ", what);
    ck_assert_msg(memcmp(a->w, b->w, t * K * 4) == 0, "%s: topk weights differ", what);
    ck_assert_msg(memcmp(a->kept, b->kept, t * 4) == 0, "%s: kept counts differ", what);
}

/*
 * dsv4_backend_forward_device on device copies of the inputs gives the host forward's outputs bit
 * for bit (eager and replayed, hash and not), and a hash-layer id out of range is found on the
 * device and named.
 */
static void device_vs_host(const char *preset, int64_t layer, int64_t T, int graph)
{
    cuda_case k = {"device", preset, layer, T, 0, -1, -1, -1, graph, 0, 0};
    dsv4_config c = case_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    dsv4_plan *p = make_plan(&c, DSV4_BACKEND_CUDA, 0, graph);
    dsv4_backend *b = NULL;
    dsv4_error e;
    ck_assert_msg(create_env(p, ck, 2, &b, &e) == DSV4_OK, "%s", e.message);
    run_out h, d;
    alloc_out(&c, T, &h);
    dsv4_forward_out oh = {h.y, h.ids, h.w, h.kept};
    ck_assert_msg(dsv4_backend_forward(b, T, x, ids, &oh, &e) == DSV4_OK, "%s", e.message);
    dev_io dv;
    dev_io_alloc(&c, T, x, ids, &dv);
    dsv4_forward_out od = dev_out(&dv);
    for (int rep = 0; rep < 2; rep++)
        ck_assert_msg(dsv4_backend_forward_device(b, T, dv.x, (const int32_t *)dv.ids, &od, &e) == DSV4_OK, "%s",
                      e.message);
    dev_fetch(&c, T, &dv, &d);
    same_rows(&c, &h, &d, T, preset);
    dsv4_backend_stats st = dsv4_backend_get_stats(b);
    ck_assert_uint_eq(st.forwards, 3);
    if (dsv4_config_is_hash_layer(&c)) {
        /* an id out of range at token T - 1 (and a NULL id pointer) */
        int32_t bad = (int32_t)c.vocab_size + 3;
        ck_assert(cudaMemcpy((int32_t *)dv.ids + (T - 1), &bad, 4, cudaMemcpyHostToDevice) == cudaSuccess);
        ck_assert_int_eq(dsv4_backend_forward_device(b, T, dv.x, (const int32_t *)dv.ids, &od, &e), DSV4_ERR_RANGE);
        char want[64];
        snprintf(want, sizeof want, "input_ids[%lld]", (long long)(T - 1));
        ck_assert_msg(strstr(e.message, want) != NULL, "%s", e.message);
        ck_assert_int_eq(dsv4_backend_forward_device(b, T, dv.x, NULL, &od, &e), DSV4_ERR_INVALID_ARG);
    }
    printf("cuda_suite device forward %-9s layer %lld T %4lld graph %d: identical to the host forward\n", preset,
           (long long)layer, (long long)T, graph);
    dev_io_free(&dv);
    free_out(&h);
    free_out(&d);
    dsv4_backend_free(b);
    dsv4_plan_free(p);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}

/* ---------------- embedding: dsv4_backend_enqueue, a caller workspace, the error word ---------------- */

/*
 * The layer enqueued on a caller stream between the caller's own operations (a copy of x in
 * before, a copy of y out after), eagerly and captured in the caller's graph (replayed twice):
 * bit-identical to dsv4_backend_forward_device. Then padding: tokens T with a device count of
 * V valid rows gives forward_device(V)'s rows and zeros after them. T and V stay within one
 * 128-row tile of the router's logits, so both runs split its K the same way.
 */
static void enqueue_case(const char *preset, int64_t layer, int64_t T, int64_t V, int fp8)
{
    cuda_case k = {"embed", preset, layer, T, 0, -1, -1, -1, 0, 0, fp8};
    dsv4_config c = case_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    const int64_t H = c.dim;
    dsv4_plan *p = make_plan(&c, DSV4_BACKEND_CUDA, 0, 0);
    dsv4_backend *b = NULL;
    dsv4_error e;
    ck_assert_msg(create_env(p, ck, 2, &b, &e) == DSV4_OK, "%s", e.message);
    dev_io ref, eag, cap, pad, vref;
    dev_io_alloc(&c, T, x, ids, &ref);
    dev_io_alloc(&c, T, x, ids, &eag);
    dev_io_alloc(&c, T, x, ids, &cap);
    dev_io_alloc(&c, T, x, ids, &pad);
    dev_io_alloc(&c, V, x, ids, &vref);
    dsv4_forward_out o = dev_out(&ref);
    ck_assert_msg(dsv4_backend_forward_device(b, T, ref.x, (const int32_t *)ref.ids, &o, &e) == DSV4_OK, "%s",
                  e.message);
    o = dev_out(&vref);
    ck_assert_msg(dsv4_backend_forward_device(b, V, vref.x, (const int32_t *)vref.ids, &o, &e) == DSV4_OK, "%s",
                  e.message);
    /* the caller's stream, its staging x and its y after the layer */
    cudaStream_t s = NULL;
    ck_assert(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    void *stage = NULL, *after = NULL;
    ck_assert(cudaMalloc(&stage, (size_t)(T * H) * 2) == cudaSuccess);
    ck_assert(cudaMalloc(&after, (size_t)(T * H) * 2) == cudaSuccess);
    ck_assert(cudaMemcpy(stage, x, (size_t)(T * H) * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    ck_assert(cudaMemset(eag.x, 0, (size_t)(T * H) * 2) == cudaSuccess);
    ck_assert(cudaMemset(cap.x, 0, (size_t)(T * H) * 2) == cudaSuccess);
    /* eager */
    ck_assert(cudaMemcpyAsync(eag.x, stage, (size_t)(T * H) * 2, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    o = dev_out(&eag);
    ck_assert_msg(dsv4_backend_enqueue(b, s, T, NULL, eag.x, (const int32_t *)eag.ids, &o, &e) == DSV4_OK, "%s",
                  e.message);
    ck_assert(cudaStreamSynchronize(s) == cudaSuccess);
    dsv4_device_errors de;
    de.struct_size = sizeof de;
    ck_assert_msg(dsv4_backend_poll_error(b, s, &de, &e) == DSV4_OK, "%s", e.message);
    ck_assert_uint_eq(de.bad_input_ids, 0);
    ck_assert_int_eq(de.first_bad_input, -1);
    /* captured by the caller, between its copies */
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    ck_assert(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    ck_assert(cudaMemcpyAsync(cap.x, stage, (size_t)(T * H) * 2, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    o = dev_out(&cap);
    dsv4_status st = dsv4_backend_enqueue(b, s, T, NULL, cap.x, (const int32_t *)cap.ids, &o, &e);
    ck_assert(cudaMemcpyAsync(after, cap.y, (size_t)(T * H) * 2, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    ck_assert(cudaStreamEndCapture(s, &g) == cudaSuccess);
    ck_assert_msg(st == DSV4_OK, "enqueue under capture: %s", e.message);
    ck_assert(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    run_out rr, re, rc, ra, rp, rv;
    dev_fetch(&c, T, &ref, &rr);
    dev_fetch(&c, T, &eag, &re);
    same_rows(&c, &rr, &re, T, "eager enqueue vs forward_device");
    for (int rep = 0; rep < 2; rep++) {
        ck_assert(cudaMemset(cap.y, 0xFF, (size_t)(T * H) * 2) == cudaSuccess);
        ck_assert(cudaMemset(after, 0xFF, (size_t)(T * H) * 2) == cudaSuccess);
        ck_assert(cudaGraphLaunch(ge, s) == cudaSuccess);
        ck_assert(cudaStreamSynchronize(s) == cudaSuccess);
        ck_assert_msg(dsv4_backend_poll_error(b, s, NULL, &e) == DSV4_OK, "%s", e.message);
        dev_fetch(&c, T, &cap, &rc);
        same_rows(&c, &rr, &rc, T, "replayed enqueue vs forward_device");
        alloc_out(&c, T, &ra);
        ck_assert(cudaMemcpy(ra.y, after, (size_t)(T * H) * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
        ck_assert_msg(memcmp(ra.y, rr.y, (size_t)(T * H) * 2) == 0, "the caller's copy after the layer differs");
        free_out(&rc);
        free_out(&ra);
    }
    /* padding: V valid rows of T */
    int32_t *dv = NULL;
    const int32_t v32 = (int32_t)V;
    ck_assert(cudaMalloc((void **)&dv, 4) == cudaSuccess);
    ck_assert(cudaMemcpy(dv, &v32, 4, cudaMemcpyHostToDevice) == cudaSuccess);
    o = dev_out(&pad);
    ck_assert_msg(dsv4_backend_enqueue(b, s, T, dv, pad.x, (const int32_t *)pad.ids, &o, &e) == DSV4_OK, "%s",
                  e.message);
    ck_assert(cudaStreamSynchronize(s) == cudaSuccess);
    ck_assert_msg(dsv4_backend_poll_error(b, s, NULL, &e) == DSV4_OK, "%s", e.message);
    dev_fetch(&c, T, &pad, &rp);
    dev_fetch(&c, V, &vref, &rv);
    same_rows(&c, &rv, &rp, V, "padded enqueue vs forward_device of the valid rows");
    const int64_t K = c.n_activated;
    for (int64_t i = V * H; i < T * H; i++)
        ck_assert_msg(rp.y[i] == 0, "padding row %lld: y not zero", (long long)(i / H));
    for (int64_t i = V * K; i < T * K; i++)
        ck_assert(rp.ids[i] == 0 && rp.w[i] == 0.0f);
    for (int64_t t = V; t < T; t++)
        ck_assert(rp.kept[t] == 0);
    dsv4_backend_stats bs = dsv4_backend_get_stats(b);
    printf("cuda_suite enqueue %-9s layer %lld T %4lld fp8 %d: eager, captured between the caller's copies "
           "(2 replays) and padded (%lld valid) identical to forward_device; forwards %llu launches %llu\n",
           preset, (long long)layer, (long long)T, fp8, (long long)V, (unsigned long long)bs.forwards,
           (unsigned long long)bs.launches);
    ck_assert_uint_eq(bs.forwards, 5);
    free_out(&rr), free_out(&re), free_out(&rp), free_out(&rv);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(dv), cudaFree(stage), cudaFree(after);
    cudaStreamDestroy(s);
    dev_io_free(&ref), dev_io_free(&eag), dev_io_free(&cap), dev_io_free(&pad), dev_io_free(&vref);
    dsv4_backend_free(b);
    dsv4_plan_free(p);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}

START_TEST(enqueue_captured)
{
    if (!have_gpu())
        return;
    enqueue_case("mini", 1, 77, 40, 0);
    enqueue_case("mini", 0, 77, 31, 0);
    enqueue_case("mini-bf16", 1, 64, 9, 0);
    enqueue_case("mini", 1, 120, 100, 1);
}
END_TEST

/* Two layers (a dense one, then a hash one reading its output) sharing one caller workspace on one
   stream give each layer's output with its own workspace; a workspace too small or misaligned is
   refused. */
START_TEST(shared_workspace)
{
    if (!have_gpu())
        return;
    const int64_t T = 96;
    cuda_case ka = {"ws a", "mini", 1, T, 0, -1, -1, -1, 0, 0, 0}, kb = {"ws b", "mini", 0, T, 0, -1, -1, -1, 0, 0, 0};
    dsv4_config ca = case_config(&ka), cb = case_config(&kb);
    dsv4_checkpoint *cka = NULL, *ckb = NULL;
    dsv4_st_file *ina = NULL, *inb = NULL;
    case_data(&ka, &ca, &cka, &ina);
    case_data(&kb, &cb, &ckb, &inb);
    const uint16_t *x = dsv4_st_find(ina, "x")->data;
    const int32_t *ids = dsv4_st_find(inb, "input_ids")->data;
    dsv4_plan *pa = make_plan(&ca, DSV4_BACKEND_CUDA, 0, 0), *pb = make_plan(&cb, DSV4_BACKEND_CUDA, 0, 0);
    dsv4_error e;
    /* own workspaces: the expected outputs */
    dsv4_backend *oa = NULL, *ob = NULL;
    ck_assert_msg(create_env(pa, cka, 2, &oa, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(create_env(pb, ckb, 2, &ob, &e) == DSV4_OK, "%s", e.message);
    dev_io a1, b1, a2, b2;
    dev_io_alloc(&ca, T, x, ids, &a1);
    dev_io_alloc(&ca, T, x, ids, &b1);
    dev_io_alloc(&ca, T, x, ids, &a2);
    dev_io_alloc(&ca, T, x, ids, &b2);
    dsv4_forward_out o = dev_out(&a1);
    ck_assert_msg(dsv4_backend_forward_device(oa, T, a1.x, NULL, &o, &e) == DSV4_OK, "%s", e.message);
    o = dev_out(&b1);
    ck_assert_msg(dsv4_backend_forward_device(ob, T, a1.y, (const int32_t *)b1.ids, &o, &e) == DSV4_OK, "%s",
                  e.message);
    /* one caller workspace for both */
    uint64_t wa = 0, wb = 0, full = 0;
    ck_assert_int_eq(dsv4_backend_workspace_size(pa, T, &wa, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_backend_workspace_size(pb, T, &wb, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_backend_workspace_size(pa, 1 << 20, &full, &e), DSV4_OK);
    ck_assert_msg(full >= dsv4_backend_get_stats(oa).workspace_allocated, "bound %llu < own workspace %llu",
                  (unsigned long long)full, (unsigned long long)dsv4_backend_get_stats(oa).workspace_allocated);
    const uint64_t wbytes = wa > wb ? wa : wb;
    void *ws = NULL;
    ck_assert(cudaMalloc(&ws, wbytes) == cudaSuccess);
    dsv4_backend_options opt;
    dsv4_backend_options_init(&opt);
    opt.threads = 2;
    opt.workspace = ws;
    opt.workspace_bytes = wbytes;
    dsv4_backend *sa = NULL, *sb = NULL;
    ck_assert_msg(dsv4_backend_create_with(pa, cka, &opt, &sa, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_backend_create_with(pb, ckb, &opt, &sb, &e) == DSV4_OK, "%s", e.message);
    ck_assert_uint_eq(dsv4_backend_get_stats(sa).workspace_allocated, 0);
    cudaStream_t s = NULL;
    ck_assert(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    for (int rep = 0; rep < 2; rep++) {
        o = dev_out(&a2);
        ck_assert_msg(dsv4_backend_enqueue(sa, s, T, NULL, a2.x, NULL, &o, &e) == DSV4_OK, "%s", e.message);
        o = dev_out(&b2);
        ck_assert_msg(dsv4_backend_enqueue(sb, s, T, NULL, a2.y, (const int32_t *)b2.ids, &o, &e) == DSV4_OK, "%s",
                      e.message);
    }
    ck_assert_msg(dsv4_backend_poll_error(sa, s, NULL, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_backend_poll_error(sb, s, NULL, &e) == DSV4_OK, "%s", e.message);
    run_out ea, eb, ga, gb;
    dev_fetch(&ca, T, &a1, &ea);
    dev_fetch(&ca, T, &b1, &eb);
    dev_fetch(&ca, T, &a2, &ga);
    dev_fetch(&ca, T, &b2, &gb);
    same_rows(&ca, &ea, &ga, T, "layer a on the shared workspace");
    same_rows(&ca, &eb, &gb, T, "layer b on the shared workspace");
    /* refusals */
    dsv4_backend *bad = NULL;
    opt.workspace_bytes = 1000;
    ck_assert_int_eq(dsv4_backend_create_with(pa, cka, &opt, &bad, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_msg(strstr(e.message, "1-token chunk") != NULL, "%s", e.message);
    opt.workspace = (uint8_t *)ws + 16;
    opt.workspace_bytes = wbytes - 16;
    ck_assert_int_eq(dsv4_backend_create_with(pa, cka, &opt, &bad, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_msg(strstr(e.message, "256-byte aligned") != NULL, "%s", e.message);
    ck_assert_ptr_null(bad);
    /* kernel variants: every malformed list refused by name, none half-applied */
    dsv4_backend_options ko;
    dsv4_backend_options_init(&ko);
    const char *badk[][2] = {{"fp8_cut=8", "fp8_cut"},     {"fp8_cut=65", "fp8_cut"}, {"fp8_cut=3x", "fp8_cut"},
                             {"tileh=s256", "tileh"},      {"colour=red", "colour"},  {"path", "key=value"},
                             {"path=exact,mid=z", "mid"}};
    for (size_t i = 0; i < sizeof badk / sizeof badk[0]; i++) {
        ko.cuda_kernels = badk[i][0];
        ck_assert_int_eq(dsv4_backend_create_with(pa, cka, &ko, &bad, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_msg(strstr(e.message, badk[i][1]) != NULL, "%s: %s", badk[i][0], e.message);
        ck_assert_ptr_null(bad);
    }
    printf("cuda_suite shared workspace: two layers on one %llu-byte caller workspace (bound for T %lld: %llu and "
           "%llu; for the plan's chunk %llu) identical to their own workspaces\n",
           (unsigned long long)wbytes, (long long)T, (unsigned long long)wa, (unsigned long long)wb,
           (unsigned long long)full);
    free_out(&ea), free_out(&eb), free_out(&ga), free_out(&gb);
    cudaStreamDestroy(s);
    dsv4_backend_free(sa);
    dsv4_backend_free(sb);
    cudaFree(ws);
    dsv4_backend_free(oa);
    dsv4_backend_free(ob);
    dev_io_free(&a1), dev_io_free(&b1), dev_io_free(&a2), dev_io_free(&b2);
    dsv4_plan_free(pa);
    dsv4_plan_free(pb);
    dsv4_st_close(ina);
    dsv4_st_close(inb);
    dsv4_checkpoint_close(cka);
    dsv4_checkpoint_close(ckb);
}
END_TEST

/* A bad input id in a captured graph is latched on replay and reported by the poll (then cleared);
   a non-finite x row is reported as DSV4_ERR_NUMERIC; argument errors are immediate. */
START_TEST(errors_latched)
{
    if (!have_gpu())
        return;
    const int64_t T = 16;
    cuda_case k = {"latch", "mini", 0, T, 0, -1, -1, -1, 0, 0, 0};
    dsv4_config c = case_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    dsv4_plan *p = make_plan(&c, DSV4_BACKEND_CUDA, 0, 0);
    dsv4_backend *b = NULL;
    dsv4_error e;
    ck_assert_msg(create_env(p, ck, 2, &b, &e) == DSV4_OK, "%s", e.message);
    dev_io d;
    dev_io_alloc(&c, T, x, ids, &d);
    dsv4_forward_out o = dev_out(&d);
    ck_assert_int_eq(dsv4_backend_enqueue(b, NULL, T, NULL, d.x, NULL, &o, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_backend_enqueue(b, NULL, 4097, NULL, d.x, (const int32_t *)d.ids, &o, &e),
                     DSV4_ERR_INVALID_ARG);
    cudaStream_t s = NULL;
    ck_assert(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    ck_assert(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    dsv4_status st = dsv4_backend_enqueue(b, s, T, NULL, d.x, (const int32_t *)d.ids, &o, &e);
    ck_assert(cudaStreamEndCapture(s, &g) == cudaSuccess);
    ck_assert_msg(st == DSV4_OK, "%s", e.message);
    ck_assert(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    /* clean replay, then a bad id at rows 5 and 9 */
    dsv4_device_errors de;
    de.struct_size = sizeof de;
    ck_assert(cudaGraphLaunch(ge, s) == cudaSuccess);
    ck_assert_msg(dsv4_backend_poll_error(b, s, &de, &e) == DSV4_OK, "%s", e.message);
    const int32_t bad = (int32_t)c.vocab_size + 3, neg = -2;
    ck_assert(cudaMemcpy((int32_t *)d.ids + 9, &bad, 4, cudaMemcpyHostToDevice) == cudaSuccess);
    ck_assert(cudaMemcpy((int32_t *)d.ids + 5, &neg, 4, cudaMemcpyHostToDevice) == cudaSuccess);
    ck_assert(cudaGraphLaunch(ge, s) == cudaSuccess);
    ck_assert_int_eq(dsv4_backend_poll_error(b, s, &de, &e), DSV4_ERR_RANGE);
    ck_assert_msg(strstr(e.message, "input_ids[5]") != NULL, "%s", e.message);
    ck_assert_uint_eq(de.bad_input_ids, 2);
    ck_assert_int_eq(de.first_bad_input, 5);
    /* read and cleared */
    ck_assert_int_eq(dsv4_backend_poll_error(b, s, &de, &e), DSV4_OK);
    ck_assert_uint_eq(de.bad_input_ids, 0);
    ck_assert_int_eq(de.first_bad_input, -1);
    /* latched over two replays, then good ids again */
    ck_assert(cudaGraphLaunch(ge, s) == cudaSuccess);
    ck_assert(cudaGraphLaunch(ge, s) == cudaSuccess);
    ck_assert_int_eq(dsv4_backend_poll_error(b, NULL, &de, &e), DSV4_ERR_RANGE);
    ck_assert_uint_eq(de.bad_input_ids, 4);
    ck_assert(cudaMemcpy(d.ids, ids, (size_t)T * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    ck_assert(cudaGraphLaunch(ge, s) == cudaSuccess);
    ck_assert_int_eq(dsv4_backend_poll_error(b, s, &de, &e), DSV4_OK);
    /* a NaN row of x: fallback routing, reported as numeric */
    uint16_t nan_row[4096];
    ck_assert(c.dim <= 4096);
    for (int64_t i = 0; i < c.dim; i++)
        nan_row[i] = 0x7FC0;
    ck_assert(cudaMemcpy((uint16_t *)d.x + 3 * c.dim, nan_row, (size_t)c.dim * 2, cudaMemcpyHostToDevice) ==
              cudaSuccess);
    ck_assert(cudaGraphLaunch(ge, s) == cudaSuccess);
    st = dsv4_backend_poll_error(b, s, &de, &e);
    printf("cuda_suite errors latched: bad ids at rows 5, 9 reported after replay (%s), cleared by the poll; "
           "a NaN row: status %d, %llu non-finite rows\n",
           "input_ids[5]", (int)st, (unsigned long long)de.nonfinite_rows);
    if (de.nonfinite_rows) {
        ck_assert_int_eq(st, DSV4_ERR_NUMERIC);
    } else {
        /* a hash layer still computes the logits' finite check only when scores are used */
        ck_assert_int_eq(st, DSV4_OK);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    dev_io_free(&d);
    dsv4_backend_free(b);
    dsv4_plan_free(p);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}
END_TEST

START_TEST(device_forward)
{
    if (!have_gpu())
        return;
    device_vs_host("mini", 1, 77, 0);
    device_vs_host("mini", 0, 5, 0);
    device_vs_host("mini", 1, 5, 1);
    device_vs_host("mini-bf16", 0, 9, 1);
    device_vs_host("mini", 1, 300, 0);
}
END_TEST

START_TEST(device_forward_unsupported)
{
    /* ref and cpu hold no device tensors: the call says so (no GPU needed) */
    cuda_case k = {"ref", "mini", 1, 3, 0, -1, -1, -1, 0, 0, 0};
    dsv4_config c = case_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(&k, &c, &ck, &in);
    dsv4_plan *p = make_plan(&c, DSV4_BACKEND_REF, 0, 0);
    dsv4_backend *b = NULL;
    dsv4_error e;
    ck_assert_int_eq(create_env(p, ck, 1, &b, &e), DSV4_OK);
    uint16_t y[1];
    dsv4_forward_out o = {y, NULL, NULL, NULL};
    ck_assert_int_eq(dsv4_backend_forward_device(b, 3, y, NULL, &o, &e), DSV4_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(e.message, "ref"));
    ck_assert_int_eq(dsv4_backend_forward_device(b, -1, y, NULL, &o, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_backend_forward_device(NULL, 3, y, NULL, &o, &e), DSV4_ERR_INVALID_ARG);
    dsv4_backend_free(b);
    dsv4_plan_free(p);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}
END_TEST

/* Replay bit-identical to eager: the same input through a graph-on and a graph-off backend. */
static void replay_vs_eager(const char *preset, int64_t layer, int64_t T)
{
    if (!have_gpu()) {
        printf("cuda_suite replay %s T %lld SKIPPED (no CUDA device)\n", preset, (long long)T);
        return;
    }
    cuda_case k = {"replay", preset, layer, T, 0, -1, -1, -1, 1, 0, 0};
    dsv4_config c = case_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    run_out g, eg;
    run_backend(&c, DSV4_BACKEND_CUDA, 0, 1, ck, T, x, ids, &g, 3, NULL);
    run_backend(&c, DSV4_BACKEND_CUDA, 0, 0, ck, T, x, ids, &eg, 1, NULL);
    size_t n = (size_t)(T * c.dim);
    int64_t nd = 0;
    for (size_t i = 0; i < n; i++)
        nd += g.y[i] != eg.y[i];
    printf("cuda_suite replay vs eager %-10s layer %lld T %4lld: %lld of %zu bf16 outputs differ; replays %llu\n",
           preset, (long long)layer, (long long)T, (long long)nd, n, (unsigned long long)g.stats.graph_replays);
    ck_assert_msg(nd == 0, "%s T %lld: replay differs from eager in %lld outputs", preset, (long long)T, (long long)nd);
    ck_assert(memcmp(g.ids, eg.ids, (size_t)(T * c.n_activated) * 4) == 0);
    ck_assert(memcmp(g.w, eg.w, (size_t)(T * c.n_activated) * 4) == 0);
    ck_assert_uint_eq(g.stats.graph_replays, 3);
    free_out(&g);
    free_out(&eg);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}

START_TEST(replay_bit_identical)
{
    replay_vs_eager("mini", 1, 1);
    replay_vs_eager("mini", 1, 5);
    replay_vs_eager("mini", 1, 100);
    replay_vs_eager("mini", 0, 7);
    replay_vs_eager("mini-fp8", 1, 64);
    replay_vs_eager("mini-bf16", 1, 17);
    replay_vs_eager("mini-topp", 1, 50);
}
END_TEST

/* A graph captured at bucket 8 serves T = 5 and then T = 8 (the static inputs are rewritten). */
START_TEST(one_graph_many_t)
{
    if (!have_gpu())
        return;
    cuda_case k = {"multi", "mini", 1, 8, 0, -1, -1, -1, 1, 0, 0};
    dsv4_config c = case_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    dsv4_plan *pg = make_plan(&c, DSV4_BACKEND_CUDA, 0, 1), *pe = make_plan(&c, DSV4_BACKEND_CUDA, 0, 0);
    dsv4_backend *bg = NULL, *be = NULL;
    dsv4_error e;
    ck_assert_msg(create_env(pg, ck, 1, &bg, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(create_env(pe, ck, 1, &be, &e) == DSV4_OK, "%s", e.message);
    int64_t H = c.dim;
    uint16_t *y1 = calloc((size_t)(8 * H), 2), *y2 = calloc((size_t)(8 * H), 2);
    int64_t Ts[4] = {5, 8, 6, 5};
    for (int i = 0; i < 4; i++) {
        dsv4_forward_out o1 = {y1, NULL, NULL, NULL}, o2 = {y2, NULL, NULL, NULL};
        ck_assert_int_eq(dsv4_backend_forward(bg, Ts[i], x, ids, &o1, &e), DSV4_OK);
        ck_assert_int_eq(dsv4_backend_forward(be, Ts[i], x, ids, &o2, &e), DSV4_OK);
        ck_assert_msg(memcmp(y1, y2, (size_t)(Ts[i] * H) * 2) == 0, "T %lld: replay differs", (long long)Ts[i]);
    }
    ck_assert_int_eq(dsv4_backend_forward(bg, 0, NULL, NULL, &(dsv4_forward_out){y1, NULL, NULL, NULL}, &e), DSV4_OK);
    dsv4_backend_stats s = dsv4_backend_get_stats(bg);
    ck_assert_uint_eq(s.graph_replays, 4);
    ck_assert_uint_eq(s.forwards, 5);
    printf("cuda_suite one graph (bucket 8) for T = 5, 8, 6, 5: identical to eager; replays %llu\n",
           (unsigned long long)s.graph_replays);
    free(y1);
    free(y2);
    dsv4_backend_free(bg);
    dsv4_backend_free(be);
    dsv4_plan_free(pg);
    dsv4_plan_free(pe);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}
END_TEST

START_TEST(bad_input_ids)
{
    if (!have_gpu())
        return;
    cuda_case k = {"bad id", "mini", 0, 5, 0, -1, -1, -1, 0, 0, 0};
    dsv4_config c = case_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    int32_t ids[5];
    memcpy(ids, dsv4_st_find(in, "input_ids")->data, sizeof ids);
    ids[3] = (int32_t)c.vocab_size;
    uint16_t *y = calloc((size_t)(5 * c.dim), 2);
    dsv4_plan *p = make_plan(&c, DSV4_BACKEND_CUDA, 0, 0);
    dsv4_backend *b = NULL;
    dsv4_error e;
    ck_assert_int_eq(create_env(p, ck, 1, &b, &e), DSV4_OK);
    dsv4_forward_out o = {y, NULL, NULL, NULL};
    ck_assert_int_eq(dsv4_backend_forward(b, 5, x, ids, &o, &e), DSV4_ERR_RANGE);
    ck_assert_msg(strstr(e.message, "input_ids[3]") != NULL, "%s", e.message);
    ck_assert_int_eq(dsv4_backend_forward(b, 5, x, NULL, &o, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_backend_get_stats(b).launches, 0);
    dsv4_backend_free(b);
    dsv4_plan_free(p);
    free(y);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}
END_TEST

/* The workspace layout against the plan's step bytes for every preset and a range of T (no GPU). */
START_TEST(workspace_within_plan)
{
    const char *presets[] = {"mini", "mini-fp8", "mini-bf16", "mini-topp", "tiny", "v4-flash", "v4-pro", NULL};
    for (int i = 0; presets[i]; i++) {
        for (int layer = 0; layer < 2; layer++) {
            /* layer 0 is a hash layer of every preset; n_hash_layers is the first non-hash one */
            dsv4_config pc;
            dsv4_error pe;
            ck_assert_int_eq(dsv4_config_preset(presets[i], &pc, &pe), DSV4_OK);
          for (int f8 = 0; f8 < 2; f8++) {
            if (f8 && (pc.routed_format == DSV4_FORMAT_BF16 || pc.act_quant == DSV4_ACT_QUANT_NONE))
                continue; /* gemm fp8 needs quantized weights and activations */
            cuda_case k = {"ws", presets[i], layer == 0 ? 0 : pc.n_hash_layers, 1, 0, -1, -1, -1, 0, 0, f8};
            dsv4_config c = case_config(&k);
            for (int graph = 0; graph < 2; graph++) {
                dsv4_plan *p = make_plan(&c, DSV4_BACKEND_CUDA, 0, graph);
                int64_t chunk = dsv4_plan_chunk_tokens(p);
                int64_t Ts[] = {1, 2, 3, 5, 8, 16, 77, 128, 129, 300, 1000, 4096};
                for (size_t j = 0; j < sizeof Ts / sizeof Ts[0]; j++) {
                    int64_t T = Ts[j];
                    bool rep = graph && dsv4_plan_can_replay(p, T);
                    int64_t tc = T < chunk ? T : chunk;
                    if (rep) /* the smallest bucket holding T */
                        for (int q = 0; q < dsv4_plan_topology(p)->n_buckets; q++)
                            if (dsv4_plan_topology(p)->buckets[q] >= T) {
                                tc = dsv4_plan_topology(p)->buckets[q];
                                break;
                            }
                    uint64_t mine = dsv4_cuda_chunk_workspace_bytes(&c, tc), plan = dsv4_plan_workspace_bytes(p, T, rep);
                    ck_assert_msg(mine <= plan, "%s layer %d graph %d fp8 %d T %lld: cuda workspace %llu > plan %llu",
                                  presets[i], (int)k.layer, graph, f8, (long long)T, (unsigned long long)mine,
                                  (unsigned long long)plan);
                    /* the caller-workspace size covers the chunk's layout and grows with the tokens */
                    uint64_t bound = 0, bound1 = 0;
                    dsv4_error we;
                    ck_assert_int_eq(dsv4_backend_workspace_size(p, tc, &bound, &we), DSV4_OK);
                    ck_assert_int_eq(dsv4_backend_workspace_size(p, 1, &bound1, &we), DSV4_OK);
                    ck_assert_msg(bound >= mine && bound >= bound1, "%s T %lld: workspace_size %llu < layout %llu",
                                  presets[i], (long long)tc, (unsigned long long)bound, (unsigned long long)mine);
                }
                dsv4_plan_free(p);
            }
          }
        }
    }
}
END_TEST

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/*
 * Timings through the public API (host clock around dsv4_backend_forward: H2D of x, the kernels,
 * D2H of y and the routing outputs, one synchronisation), v4-flash shapes, eager and graph replay.
 * Only with DSV4MOE_CUDA_BENCH=1; DSV4MOE_CUDA_BENCH_E sets the expert count (default 256).
 */
START_TEST(time_flash)
{
    const char *on = getenv("DSV4MOE_CUDA_BENCH");
    if (!on || on[0] != '1' || !have_gpu())
        return;
    const char *es = getenv("DSV4MOE_CUDA_BENCH_E");
    int64_t E = es ? atoll(es) : 256;
    int64_t Tmax = 4096;
    cuda_case k = {"bench", "v4-flash", 5, Tmax, 0, -1, -1, -1, 0, E, 0};
    dsv4_config c = case_config(&k);
    double tg = now_s();
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    case_data(&k, &c, &ck, &in);
    printf("cuda_bench v4-flash E %lld: data ready in %.1f s\n", (long long)E, now_s() - tg);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    int64_t H = c.dim, I = c.moe_inter_dim, K = c.n_activated;
    /* bytes of one routed expert (fp4 + ue8m0 1x32 scales, three matrices) and of the shared one (fp8 128x128) */
    double eb = 3.0 * ((double)I * H / 2 + (double)I * H / 32);
    double sb = 3.0 * ((double)I * H + (double)(I / 128) * (H / 128));
    int64_t Ts[] = {1, 8, 32, 128, 256, 1024, 4096};
    uint16_t *y = malloc((size_t)(Tmax * H) * 2);
    int32_t *tk = malloc((size_t)(Tmax * K) * 4);
    for (int graph = 0; graph < 2; graph++) {
        dsv4_topology topo;
        dsv4_topology_init(&topo);
        topo.backend = DSV4_BACKEND_CUDA;
        topo.max_tokens_per_rank = Tmax;
        if (graph) {
            topo.cuda_graph = true;
            topo.n_buckets = 9;
            for (int i = 0; i < 9; i++)
                topo.buckets[i] = 1 << i;
        }
        dsv4_budget bud;
        dsv4_budget_init(&bud);
        bud.device_bytes = 141ull << 30;
        dsv4_plan *p = NULL;
        dsv4_error e;
        ck_assert_msg(dsv4_plan_create(&c, &topo, &bud, &p, &e) == DSV4_OK, "%s", e.message);
        dsv4_backend *b = NULL;
        ck_assert_msg(create_env(p, ck, 1, &b, &e) == DSV4_OK, "%s", e.message);
        dsv4_backend_stats s0 = dsv4_backend_get_stats(b);
        printf("cuda_bench %s: workspace %llu bytes allocated (plan max %llu), device memory taken %llu bytes\n",
               graph ? "graph" : "eager", (unsigned long long)s0.workspace_allocated,
               (unsigned long long)s0.workspace_planned, (unsigned long long)s0.device_allocated);
        for (size_t j = 0; j < sizeof Ts / sizeof Ts[0]; j++) {
            int64_t T = Ts[j];
            if (graph && T > 256)
                break;
            dsv4_forward_out o = {y, tk, NULL, NULL};
            ck_assert_msg(dsv4_backend_forward(b, T, x, ids, &o, &e) == DSV4_OK, "%s", e.message);
            /* experts touched */
            unsigned char seen[1024];
            memset(seen, 0, sizeof seen);
            int64_t touched = 0;
            for (int64_t i = 0; i < T * K; i++)
                if (tk[i] >= 0 && tk[i] < E && tk[i] < 1024 && !seen[tk[i]]) {
                    seen[tk[i]] = 1;
                    touched++;
                }
            int reps = T <= 256 ? 50 : 10;
            double t[64];
            for (int r = 0; r < reps; r++) {
                double a = now_s();
                ck_assert_int_eq(dsv4_backend_forward(b, T, x, ids, &o, &e), DSV4_OK);
                t[r] = now_s() - a;
            }
            qsort(t, (size_t)reps, sizeof t[0], cmp_d);
            double med = t[reps / 2];
            double bytes = (double)touched * eb + sb;
            double flops = 2.0 * 3.0 * (double)H * I * (double)(T * K + T);
            printf("cuda_bench %s T %5lld: median %9.1f us (min %9.1f); experts touched %3lld; weight bytes %.1f MB "
                   "-> %.0f GB/s; %.1f TFLOP/s\n",
                   graph ? "graph" : "eager", (long long)T, med * 1e6, t[0] * 1e6, (long long)touched, bytes / 1e6,
                   bytes / med / 1e9, flops / med / 1e12);
            fflush(stdout);
        }
        dsv4_backend_free(b);
        dsv4_plan_free(p);
    }
    free(y);
    free(tk);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}
END_TEST

static Suite *cuda_suite(void)
{
    Suite *s = suite_create("cuda");
    TCase *sm = tcase_create("small");
    tcase_set_timeout(sm, 600);
    tcase_add_test(sm, small_mini_t5);
    tcase_add_test(sm, small_mini_graph_t5);
    tcase_add_test(sm, small_fp8_t13);
    tcase_add_test(sm, bad_input_ids);
    tcase_add_test(sm, fp8_small_t300);
    suite_add_tcase(s, sm);
    TCase *f8 = tcase_create("fp8");
    tcase_set_timeout(f8, 600);
    tcase_add_test(f8, fp8_mini_t1100);
    tcase_add_test(f8, fp8_hash_t1100);
    tcase_add_test(f8, fp8_fp8_t1100);
    tcase_add_test(f8, fp8_topp_t1100);
    tcase_add_test(f8, fp8_noclamp_t1100);
    tcase_add_test(f8, fp8_after_t1100);
    tcase_add_test(f8, fp8_t1);
    tcase_add_test(f8, fp8_t0);
    tcase_add_test(f8, fp8_odd_t77);
    tcase_add_test(f8, fp8_chunked_t3000);
    tcase_add_test(f8, fp8_graph_t128);
    tcase_add_test(f8, fp8_graph_t100);
    tcase_add_test(f8, fp8_flash_t1024);
    tcase_add_test(f8, fp8_flash_hash_t600);
    suite_add_tcase(s, f8);
    TCase *nu = tcase_create("numerics");
    tcase_set_timeout(nu, 600);
    tcase_add_test(nu, mini_fp4_t77);
    tcase_add_test(nu, mini_fp4_hash_t77);
    tcase_add_test(nu, mini_fp8_t77);
    tcase_add_test(nu, mini_bf16_t77);
    tcase_add_test(nu, mini_bf16_hash_t77);
    tcase_add_test(nu, mini_noclamp_t77);
    tcase_add_test(nu, mini_topp_t77);
    tcase_add_test(nu, mini_topp_noclamp_t77);
    tcase_add_test(nu, mini_after_w2_t77);
    tcase_add_test(nu, mini_fp8_after_t77);
    tcase_add_test(nu, mini_t1);
    tcase_add_test(nu, mini_hash_t1);
    tcase_add_test(nu, mini_fp8_t1);
    tcase_add_test(nu, mini_bf16_t1);
    tcase_add_test(nu, mini_t0);
    tcase_add_test(nu, mini_chunked_t300);
    tcase_add_test(nu, mini_topp_chunked_t300);
    tcase_add_test(nu, mini_hash_chunked_t300);
    tcase_add_test(nu, mini_long_t3000);
    tcase_add_test(nu, tiny_t77);
    tcase_add_test(nu, mini_t30);
    tcase_add_test(nu, mini_fp8_t30);
    tcase_add_test(nu, mini_bf16_t30);
    tcase_add_test(nu, mini_t1100);
    suite_add_tcase(s, nu);
    TCase *gr = tcase_create("graphs");
    tcase_set_timeout(gr, 600);
    tcase_add_test(gr, graph_mini_t1);
    tcase_add_test(gr, graph_mini_t77);
    tcase_add_test(gr, graph_hash_t3);
    tcase_add_test(gr, graph_fp8_t9);
    tcase_add_test(gr, graph_bf16_t128);
    tcase_add_test(gr, graph_topp_t33);
    tcase_add_test(gr, graph_eager_t200);
    tcase_add_test(gr, graph_t0);
    tcase_add_test(gr, replay_bit_identical);
    tcase_add_test(gr, one_graph_many_t);
    suite_add_tcase(s, gr);
    TCase *fl = tcase_create("flash");
    tcase_set_timeout(fl, 600);
    tcase_add_test(fl, flash_t1);
    tcase_add_test(fl, flash_t8_graph);
    tcase_add_test(fl, flash_t40);
    tcase_add_test(fl, flash_hash_t5);
    suite_add_tcase(s, fl);
    TCase *ex = tcase_create("exact");
    tcase_set_timeout(ex, 600);
    tcase_add_test(ex, exact_mini_t77);
    tcase_add_test(ex, exact_fp8_t30);
    tcase_add_test(ex, exact_mini_t1100);
    tcase_add_test(ex, exact_graph_t5);
    tcase_add_test(ex, exact_flash_t40);
    tcase_add_test(ex, fast_matches_exact);
    tcase_add_test(ex, tileh_variants_identical);
    tcase_add_test(ex, mma_mini_t77);
    tcase_add_test(ex, mma_mini_t1100);
    tcase_add_test(ex, mma_flash_t40);
    tcase_add_test(ex, mma_graph_t5);
    suite_add_tcase(s, ex);
    TCase *dv = tcase_create("device");
    tcase_set_timeout(dv, 600);
    tcase_add_test(dv, device_forward);
    suite_add_tcase(s, dv);
    TCase *em = tcase_create("embed");
    tcase_set_timeout(em, 600);
    tcase_add_test(em, enqueue_captured);
    tcase_add_test(em, shared_workspace);
    tcase_add_test(em, errors_latched);
    suite_add_tcase(s, em);
    TCase *ti = tcase_create("timing");
    tcase_set_timeout(ti, 600);
    tcase_add_test(ti, time_flash);
    suite_add_tcase(s, ti);
    TCase *ho = tcase_create("host");
    tcase_add_test(ho, workspace_within_plan);
    tcase_add_test(ho, device_forward_unsupported);
    suite_add_tcase(s, ho);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(cuda_suite());
    srunner_set_xml(sr, getenv("DSV4MOE_CUDA_XML") ? getenv("DSV4MOE_CUDA_XML") : "/dev/null");
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
