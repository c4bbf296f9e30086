/*
 * The CUDA backend against the reference on the GPU (built by `make cuda`, run by ci/cuda-test.sh
 * on the device machine). This program runs two suites:
 *   - "backend_ops" (tests/test_backend_ops.c, linked in): the backend test table of
 *     tests/backend_ops.h over every backend the registry reports available (ref, cpu and cuda
 *     on the device machine) with its checker (SPEC.md section 7: every quant mode, clamp on/off,
 *     top-p on/off, hash layers, after_w2, T = 0, 1, odd sizes, chunked prompts up to 3000 tokens);
 *   - "cuda" (this file): the cuda backend's own cases, through the same checker (bo_check with
 *     bo_cuda_extra): gemm fp8 (SPEC.md section 9's tolerances), graphs on (replay bit-identical
 *     to eager), v4-flash-shaped layers, the exact path and the mma.sync tiles (kernel variants),
 *     and what the table does not model: the device-pointer forward, the server calls, latched
 *     errors, the workspace layout.
 *
 * Without a GPU every test that needs one is skipped (printed, and counted as passed) unless
 * DSV4MOE_CUDA_REQUIRED=1, which the device script sets. The workspace tests run everywhere.
 * Production formats run the fp8 tensor-core path (fast/cuda/mma.cuh); the "exact" Tcase runs
 * the same kinds of case through the exact path (kernel variant path=exact) and compares the two
 * paths with each other; "device" checks dsv4_backend_forward_device against the host forward;
 * "embed" the server calls (dsv4_backend_enqueue in a caller's capture, padding rows, a shared
 * caller workspace, the latched error word).
 * Tcases of "cuda": "small" (quick, for compute-sanitizer), "fp8", "graphs", "flash", "exact",
 * "device", "embed", "timing", "host"; of "backend_ops": "table".
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "dsv4moe/backend.h"
#include "dsv4moe_harness/compare.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"
#include "tests/testutil.h"
#include "bench/bench_util.h"

#define BO_GEN_THREADS 16 /* the device machine's cores */
#include "tests/backend_ops.h"
#include "tests/cuda/route_small_hw.h"
#include "tests/cuda/dec_mix_hw.h"
#include "tests/cuda/group_warp_hw.h"
#include "tests/cuda/logits_hw.h"
#include "tests/cuda/quant_x8_hw.h"
#include "tests/cuda/dec_qin_hw.h"
#include "tests/cuda/quant8_hw.h"
#include "tests/cuda/tile8_hw.h"
#include "fast/cuda/fragment.h"
#include "fast/cuda/repack.h"
#include "core/bits.h"
#include "core/route.h"
#include "core/swiglu.h"

/* fast/cuda/cuda.cu */
uint64_t dsv4_cuda_chunk_workspace_bytes(const dsv4_config *cfg, int64_t tc);
/* tests/test_backend_ops.c */
Suite *backend_ops_suite(void);

/* The cuda backend with the kernel variants the environment names (bench_util.h): the variant
   tests set DSV4MOE_CUDA_* around a creation, as the device scripts do. spec holds the list. */
static bo_backend cuda_backend(int threads, int forwards, char *spec, size_t n)
{
    bo_backend be = {DSV4_BACKEND_CUDA, threads, DSV4_CPU_KERNELS_AUTO, forwards, bench_cuda_kernels_env(spec, n)};
    return be;
}

/* dsv4_backend_create of the plan's backend with cuda_backend's variants. */
static dsv4_status create_env(const dsv4_plan *p, const dsv4_checkpoint *ck, int threads, dsv4_backend **b,
                              dsv4_error *e)
{
    char spec[256];
    bo_backend be = cuda_backend(threads, 1, spec, sizeof spec);
    be.kind = dsv4_plan_topology(p)->backend;
    return bo_create(p, ck, &be, b, e);
}

/* Whether the cuda backend starts here (probed once on a tiny layer; DSV4MOE_CUDA_REQUIRED=1: it must). */
static int have_gpu(void)
{
    return bo_backend_available(DSV4_BACKEND_CUDA);
}

/* A cuda-only case through the table's checker: two forwards on cuda against one of the reference. */
static void check_case(const bo_case *k)
{
    if (!have_gpu()) {
        printf("cuda_suite %-28s SKIPPED (no CUDA device)\n", k->name);
        return;
    }
    char spec[256];
    bo_backend be = cuda_backend(2, 2, spec, sizeof spec);
    bo_check(k, &be, bo_cuda_extra);
}

#define CASE(fn, ...)                                                                                       \
    START_TEST(fn)                                                                                          \
    {                                                                                                       \
        bo_case k = {__VA_ARGS__};                                                                         \
        check_case(&k);                                                                                     \
    }                                                                                                       \
    END_TEST

/* The table's cases (tests/backend_ops.h) run in the backend_ops suite; these are cuda's own. */
/*                name                     preset       layer T     chunk L     scl after fp32 graph E fp8 */
CASE(small_mini_t5, "mini T=5", "mini", 1, 5, 0, -1, -1, -1, 0, 0, 0, 0)
CASE(small_mini_graph_t5, "mini graph T=5", "mini", 1, 5, 0, -1, -1, -1, 0, 1, 0, 0)
CASE(small_fp8_t13, "mini-fp8 T=13", "mini-fp8", 1, 13, 0, -1, -1, -1, 0, 0, 0, 0)

CASE(graph_mini_t1, "graph mini T=1", "mini", 1, 1, 0, -1, -1, -1, 0, 1, 0, 0)
CASE(graph_mini_t77, "graph mini T=77", "mini", 1, 77, 0, -1, -1, -1, 0, 1, 0, 0)
CASE(graph_hash_t3, "graph mini hash T=3", "mini", 0, 3, 0, -1, -1, -1, 0, 1, 0, 0)
CASE(graph_fp8_t9, "graph mini-fp8 T=9", "mini-fp8", 1, 9, 0, -1, -1, -1, 0, 1, 0, 0)
CASE(graph_bf16_t128, "graph mini-bf16 T=128", "mini-bf16", 1, 128, 0, -1, -1, -1, 0, 1, 0, 0)
CASE(graph_topp_t33, "graph mini-topp T=33", "mini-topp", 1, 33, 0, -1, -1, -1, 0, 1, 0, 0)

/* gemm fp8: groups above fp8_cut rows (32 by default; the shared expert above 32 tokens) on the grouped FP8 GEMM */
/*                name                     preset       layer T     chunk L     scl after fp32 graph E fp8 */
CASE(fp8_small_t300, "fp8 mini T=300", "mini", 1, 300, 0, -1, -1, -1, 0, 0, 0, 1)
CASE(fp8_mini_t1100, "fp8 mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 1)
CASE(fp8_hash_t1100, "fp8 mini hash T=1100", "mini", 0, 1100, 0, -1, -1, -1, 0, 0, 0, 1)
CASE(fp8_fp8_t1100, "fp8 mini-fp8 T=1100", "mini-fp8", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 1)
CASE(fp8_topp_t1100, "fp8 mini-topp T=1100", "mini-topp", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 1)
CASE(fp8_noclamp_t1100, "fp8 mini no clamp", "mini", 1, 1100, 0, 0.0f, -1, -1, 0, 0, 0, 1)
CASE(fp8_after_t1100, "fp8 after_w2 noshclamp", "mini", 1, 1100, 0, -1, 0, 1, 0, 0, 0, 1)
CASE(fp8_t1, "fp8 mini T=1", "mini", 1, 1, 0, -1, -1, -1, 0, 0, 0, 1)
CASE(fp8_t0, "fp8 mini T=0", "mini", 1, 0, 0, -1, -1, -1, 0, 0, 0, 1)
CASE(fp8_odd_t77, "fp8 mini T=77", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0, 1)
CASE(fp8_chunked_t3000, "fp8 chunk 1024 T=3000", "mini", 1, 3000, 1024, -1, -1, -1, 0, 0, 0, 1)
CASE(fp8_graph_t128, "fp8 graph mini T=128", "mini", 1, 128, 0, -1, -1, -1, 0, 1, 0, 1)
CASE(fp8_graph_t100, "fp8 graph mini-fp8 T=100", "mini-fp8", 1, 100, 0, -1, -1, -1, 0, 1, 0, 1)
CASE(fp8_flash_t1024, "fp8 flash e32 T=1024", "v4-flash", 5, 1024, 0, -1, -1, -1, 0, 0, 32, 1)
CASE(fp8_flash_hash_t600, "fp8 flash e32 hash T=600", "v4-flash", 0, 600, 0, -1, -1, -1, 0, 0, 32, 1)
CASE(graph_eager_t200, "graph on, T=200 eager", "mini", 1, 200, 0, -1, -1, -1, 0, 1, 0, 0)
CASE(graph_t0, "graph T=0", "mini", 1, 0, 0, -1, -1, -1, 0, 1, 0, 0)

CASE(flash_t1, "v4-flash E32 T=1", "v4-flash", 5, 1, 0, -1, -1, -1, 0, 0, 32, 0)
CASE(flash_t8_graph, "v4-flash E32 graph T=8", "v4-flash", 5, 8, 0, -1, -1, -1, 0, 1, 32, 0)
CASE(flash_t40, "v4-flash E32 T=40", "v4-flash", 5, 40, 0, -1, -1, -1, 0, 0, 32, 0)
CASE(flash_hash_t5, "v4-flash E32 hash T=5", "v4-flash", 1, 5, 0, -1, -1, -1, 0, 0, 32, 0)

/* A checker case with the environment variable var set to val for its backend's creation. */
#define CASE_ENV(fn, var, val, ...)                                                                         \
    START_TEST(fn)                                                                                          \
    {                                                                                                       \
        bo_case k = {__VA_ARGS__};                                                                         \
        setenv(var, val, 1);                                                                                \
        check_case(&k);                                                                                     \
        unsetenv(var);                                                                                      \
    }                                                                                                       \
    END_TEST

/* The exact path (exact_gemm.cuh) on formats that otherwise take the fp8 path. */
#define CASE_EXACT(fn, ...) CASE_ENV(fn, "DSV4MOE_CUDA_PATH", "exact", __VA_ARGS__)

CASE_EXACT(exact_mini_t77, "exact mini T=77", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0)
CASE_EXACT(exact_fp8_t30, "exact mini-fp8 T=30", "mini-fp8", 1, 30, 0, -1, -1, -1, 0, 0, 0, 0)
CASE_EXACT(exact_mini_t1100, "exact mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 0)
CASE_EXACT(exact_graph_t5, "exact graph mini T=5", "mini", 1, 5, 0, -1, -1, -1, 0, 1, 0, 0)
CASE_EXACT(exact_flash_t40, "exact v4-flash E32 T=40", "v4-flash", 5, 40, 0, -1, -1, -1, 0, 0, 32, 0)

/* The fp8 path's mma.sync tile kernel for large groups (DSV4MOE_CUDA_TILE=mma) instead of k_tileh's wgmma. */
#define CASE_MMA(fn, ...) CASE_ENV(fn, "DSV4MOE_CUDA_TILE", "mma", __VA_ARGS__)

CASE_MMA(mma_mini_t77, "mma.sync mini T=77", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0)
CASE_MMA(mma_mini_t1100, "mma.sync mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 0)
CASE_MMA(mma_flash_t40, "mma.sync v4-flash E32 T=40", "v4-flash", 5, 40, 0, -1, -1, -1, 0, 0, 32, 0)
CASE_MMA(mma_graph_t5, "mma.sync graph mini T=5", "mini", 1, 5, 0, -1, -1, -1, 0, 1, 0, 0)

/* `forwards` forwards of case k on cuda (graph on or off) with cuda_backend's variants; o keeps the last. */
static void run_cuda(const dsv4_config *c, const bo_case *k, int graph, int forwards, const dsv4_checkpoint *ck,
                     const uint16_t *x, const int32_t *ids, bo_out *o)
{
    bo_case kg = *k;
    kg.graph = graph;
    char spec[256];
    bo_backend be = cuda_backend(2, forwards, spec, sizeof spec);
    bo_run(c, &kg, &be, ck, x, ids, o);
}

/* One eager cuda forward with the environment variable var set to val for its creation (var NULL: none). */
static void run_env(const bo_in *ci, bo_out *o, const char *var, const char *val)
{
    if (var)
        setenv(var, val, 1);
    run_cuda(&ci->c, &ci->k, 0, 1, ci->ck, ci->x, ci->ids, o);
    if (var)
        unsetenv(var);
}

/* The fp8 path against the exact path on one input: both within the reference's tolerances of each other. */
static void fast_vs_exact(const char *preset, int64_t layer, int64_t T, int64_t experts)
{
    if (!have_gpu())
        return;
    bo_case k = {"fast/exact", preset, layer, T, 0, -1, -1, -1, 0, 0, experts, 0};
    bo_in ci;
    bo_in_open(&k, &ci);
    const dsv4_config c = ci.c;
    bo_out f, x2;
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
    bo_free(&f);
    bo_free(&x2);
    bo_in_close(&ci);
}

typedef struct {
    const char *var, *val;
} env_kv;

/*
 * Kernel variants that must give the base's outputs (its variable set for creation; NULL: the
 * defaults) bit for bit (close = 0): they differ in scheduling only, never in the order of a sum
 * or a rounding point; the clamp counters too. With close, a variant that rounds one product in
 * another order (the router's logits in another sum order): the same routing, every routing weight
 * within 1e-5 of the base's (the bound every backend keeps against the reference, bo_compare; an
 * H100 measured up to 1.13e-6 between logits=blas and logits=tiles on v4-flash's hash layer, T 77),
 * DeepGEMM diff below 1e-5. How many outputs differ is printed, not bounded: a weight a few ulp
 * off flips an e4m3 code of h now and then (the weight is applied before the down projection),
 * and each flip moves the bf16 rounding of up to a whole row of y (logits=blas on an H100:
 * v4-flash T 33 381 of 135168 outputs, T 77 4870 of 315392).
 */
/* Set by a test whose variant must also count the same routing statistics (launches, empty skips,
   non-finite rows) as the base: variants_vs compares them too. */
static int g_cmp_route_stats;

static void variants_vs(const env_kv *base, const char *what, const char *preset, int64_t layer, int64_t T,
                        int64_t experts, int fp8, const env_kv *vs, size_t nv, int close)
{
    if (!have_gpu())
        return;
    bo_case k = {what, preset, layer, T, 0, -1, -1, -1, 0, 0, experts, fp8};
    bo_in ci;
    bo_in_open(&k, &ci);
    const int64_t n = T * ci.c.dim;
    bo_out d;
    run_env(&ci, &d, base ? base->var : NULL, base ? base->val : NULL);
    for (size_t v = 0; v < nv; v++) {
        const char *var = vs[v].var, *val = vs[v].val;
        bo_out o;
        run_env(&ci, &o, var, val);
        int64_t nd = 0;
        for (int64_t i = 0; i < n; i++)
            nd += o.y[i] != d.y[i];
        printf("cuda_suite %s %s=%-5s %-9s T %4lld: %lld of %lld outputs differ from %s\n", what, var, val, preset,
               (long long)T, (long long)nd, (long long)n, base ? base->val : "the default");
        fflush(stdout); /* a failing case's child exits before its buffer would reach the log */
        if (close) {
            dsv4_compare_metrics m;
            ck_assert(dsv4_compare_bf16(o.y, d.y, n, &m));
            ck_assert_msg(m.finite_ok && m.deepgemm_diff < 1e-5, "%s=%s on %s T=%lld: %lld differ, diff %g", var, val,
                          preset, (long long)T, (long long)nd, m.deepgemm_diff);
            ck_assert(memcmp(o.ids, d.ids, (size_t)(T * ci.c.n_activated) * 4) == 0);
            double dw = 0;
            for (int64_t i = 0; i < T * ci.c.n_activated; i++)
                dw = fmax(dw, fabs((double)o.w[i] - d.w[i]));
            ck_assert_msg(dw < 1e-5, "%s=%s on %s T=%lld: routing weights up to %g apart", var, val, preset,
                          (long long)T, dw);
            bo_free(&o);
            continue;
        }
        ck_assert_msg(nd == 0, "%s=%s on %s T=%lld: %lld outputs differ", var, val, preset, (long long)T, (long long)nd);
        const dsv4_backend_stats *a = &o.stats, *z = &d.stats;
        ck_assert_msg(a->routed_g_clamped == z->routed_g_clamped && a->routed_u_clamped == z->routed_u_clamped &&
                          a->shared_g_clamped == z->shared_g_clamped && a->shared_u_clamped == z->shared_u_clamped,
                      "%s=%s on %s: clamp counts %llu %llu %llu %llu, default %llu %llu %llu %llu", var, val, preset,
                      (unsigned long long)a->routed_g_clamped, (unsigned long long)a->routed_u_clamped,
                      (unsigned long long)a->shared_g_clamped, (unsigned long long)a->shared_u_clamped,
                      (unsigned long long)z->routed_g_clamped, (unsigned long long)z->routed_u_clamped,
                      (unsigned long long)z->shared_g_clamped, (unsigned long long)z->shared_u_clamped);
        if (g_cmp_route_stats)
            ck_assert_msg(a->launches == z->launches && a->empty_skips == z->empty_skips &&
                              a->nonfinite_rows == z->nonfinite_rows,
                          "%s=%s on %s T=%lld: launches %llu empty %llu non-finite %llu, default %llu %llu %llu", var,
                          val, preset, (long long)T, (unsigned long long)a->launches,
                          (unsigned long long)a->empty_skips, (unsigned long long)a->nonfinite_rows,
                          (unsigned long long)z->launches, (unsigned long long)z->empty_skips,
                          (unsigned long long)z->nonfinite_rows);
        bo_free(&o);
    }
    bo_free(&d);
    bo_in_close(&ci);
}

/* variants_vs against the default (no variable set). */
static void variants_identical(const char *what, const char *preset, int64_t layer, int64_t T, int64_t experts,
                               int fp8, const env_kv *vs, size_t nv, int close)
{
    variants_vs(NULL, what, preset, layer, T, experts, fp8, vs, nv, close);
}

/* Every k_tileh variant (DSV4MOE_CUDA_TILEH: tile width, pipelined decode, blocks per SM; and
   DSV4MOE_CUDA_MID for mid-size groups). */
START_TEST(tileh_variants_identical)
{
    static const env_kv vs[] = {{"DSV4MOE_CUDA_TILEH", "s64x2"}, {"DSV4MOE_CUDA_TILEH", "p64"},
                                {"DSV4MOE_CUDA_TILEH", "s64"},   {"DSV4MOE_CUDA_TILEH", "p128"},
                                {"DSV4MOE_CUDA_MID", "p32"},     {"DSV4MOE_CUDA_MID", "s32"}};
    variants_identical("k_tileh", "mini", 1, 1100, 0, 0, vs, sizeof vs / sizeof vs[0], 0);
    variants_identical("k_tileh", "mini-fp8", 1, 1100, 0, 0, vs, sizeof vs / sizeof vs[0], 0);
}
END_TEST

/* gemm fp8: the FP8 GEMM's weights with one scale per 128x128 block (the default where the layer
   converts so) and per row. With power-of-two (ue8m0) weight scales, every fp4 layer, the same
   outputs: the codes move by a power of two per row that the scale takes back, so every product
   and sum is the same number. With fp32 block scales (mini-fp8) CUTLASS rounds the product of the
   two scales in another order per mode: close, not identical (5 of 281600 outputs differed on the
   H200, 2026-12-03). */
START_TEST(fp8_scale_blocks_identical)
{
    static const env_kv vs[] = {{"DSV4MOE_CUDA_KERNELS", "fp8_scales=rows"}};
    variants_identical("fp8 scales", "mini", 1, 1100, 0, 1, vs, 1, 0);
    variants_identical("fp8 scales", "v4-flash", 5, 1024, 32, 1, vs, 1, 0);
    variants_identical("fp8 scales", "mini-fp8", 1, 1100, 0, 1, vs, 1, 1);
}
END_TEST

/* Programmatic dependent launch (the default; params pdl=on) against plain launches: the
   same outputs, ids and clamp counts bit for bit, eager and replayed from a graph, on the decode
   chain (T 1 and 8), a gemm fp8 chunk (k_gather8, k_quant8), a large chunk counted and placed by
   slices (k_hist, k_place2) and the exact path. */
START_TEST(pdl_identical)
{
    if (!have_gpu())
        return;
    static const struct {
        const char *preset;
        int64_t layer, T, experts;
        int fp8;
        const char *path;
    } cs[] = {{"v4-flash", 5, 1, 32, 1, NULL}, {"v4-flash", 5, 8, 32, 0, NULL}, {"v4-flash", 5, 300, 32, 1, NULL},
              {"mini", 1, 1100, 0, 0, NULL},  {"mini", 1, 77, 0, 0, "exact"}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int graph = 0; graph < 2; graph++) {
            bo_case k = {"pdl", cs[i].preset, cs[i].layer, cs[i].T, 0, -1, -1, -1, 0, graph, cs[i].experts, cs[i].fp8};
            bo_in ci;
            bo_in_open(&k, &ci);
            if (cs[i].path)
                setenv("DSV4MOE_CUDA_PATH", cs[i].path, 1);
            bo_out on, off;
            run_cuda(&ci.c, &ci.k, graph, 1 + graph, ci.ck, ci.x, ci.ids, &on);
            setenv("DSV4MOE_CUDA_KERNELS", "pdl=off", 1);
            run_cuda(&ci.c, &ci.k, graph, 1 + graph, ci.ck, ci.x, ci.ids, &off);
            unsetenv("DSV4MOE_CUDA_KERNELS");
            unsetenv("DSV4MOE_CUDA_PATH");
            const int64_t n = cs[i].T * ci.c.dim;
            int64_t nd = 0;
            for (int64_t j = 0; j < n; j++)
                nd += on.y[j] != off.y[j];
            printf("cuda_suite pdl on/off %-8s T %4lld graph %d%s: %lld of %lld outputs differ\n", cs[i].preset,
                   (long long)cs[i].T, graph, cs[i].path ? " exact" : "", (long long)nd, (long long)n);
            fflush(stdout);
            ck_assert_msg(nd == 0, "pdl on/off %s T %lld graph %d: %lld outputs differ", cs[i].preset, (long long)cs[i].T,
                          graph, (long long)nd);
            ck_assert(memcmp(on.ids, off.ids, (size_t)(cs[i].T * ci.c.n_activated) * 4) == 0);
            ck_assert(on.stats.routed_g_clamped == off.stats.routed_g_clamped &&
                      on.stats.routed_u_clamped == off.stats.routed_u_clamped &&
                      on.stats.shared_u_clamped == off.stats.shared_u_clamped);
            bo_free(&on), bo_free(&off);
            bo_in_close(&ci);
        }
}
END_TEST

/* Small chunks' router (params route=fused, the default: k_logits_small, which also quantizes
   x, and on the fp8 path k_router_count, the grouping in the router's launch) against the GEMM
   logits, k_router and k_count2 (route=split): the logits are the same fp32 sum in another order,
   so close, not identical; the same routing. Decode sizes on v4-flash (T 1, 8, 32; the hash layer
   at 17), the exact path (mini-bf16: no quantization of x), fp32 scales, the linear top-p
   predictor (the router reads x itself) and mini at T 40. */
/* One variant against the default over a list of cases (variants_identical per case). */
typedef struct {
    const char *preset;
    int64_t layer, T, experts;
    int fp8;
} var_case;

/* Each case's forward with the params `kernels` against one with `base_kernels` (NULL: the defaults;
   a base named in full keeps the comparison whichever of the two becomes the default). */
static void variant_cases_vs(const char *base_kernels, const char *what, const char *kernels, const var_case *cs,
                             size_t n, int close)
{
    const env_kv base = {"DSV4MOE_CUDA_KERNELS", base_kernels};
    const env_kv v = {"DSV4MOE_CUDA_KERNELS", kernels};
    for (size_t i = 0; i < n; i++)
        variants_vs(base_kernels ? &base : NULL, what, cs[i].preset, cs[i].layer, cs[i].T, cs[i].experts, cs[i].fp8,
                    &v, 1, close);
}

static void variant_cases(const char *what, const char *kernels, const var_case *cs, size_t n, int close)
{
    variant_cases_vs(NULL, what, kernels, cs, n, close);
}

/* params direct=b128|b64 (k_tile8, tile8.cuh): the routed fp4 experts' tile groups on fp8 wgmma
   from the fp4 weights, against the reference with the gemm fp8 mode's bounds (SPEC.md section 9):
   large groups (mini and v4-flash T 1100: 128- and 64-token tiles), mid-size ones (T 77 and 100:
   32-token tiles, the shared expert's among them at T <= 32 rows), the hash layer, top-p, no clamp,
   the weight after w2, a chunked run and a graph replay. */
#define CASE_DIRECT(fn, var, ...) CASE_ENV(fn, "DSV4MOE_CUDA_KERNELS", "direct=" var, __VA_ARGS__)

CASE_DIRECT(direct_mini_t1100, "b128", "direct mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 1)
CASE_DIRECT(direct_b64_t1100, "b64", "direct b64 mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 1)
CASE_DIRECT(direct_mini_t77, "b128", "direct mini T=77", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0, 1)
CASE_DIRECT(direct_flash_t100, "b128", "direct flash e32 T=100", "v4-flash", 5, 100, 0, -1, -1, -1, 0, 0, 32, 1)
CASE_DIRECT(direct_flash_t1100, "b64", "direct flash e32 T=1100", "v4-flash", 5, 1100, 0, -1, -1, -1, 0, 0, 32, 1)
CASE_DIRECT(direct_hash_t1100, "b128", "direct mini hash T=1100", "mini", 0, 1100, 0, -1, -1, -1, 0, 0, 0, 1)
CASE_DIRECT(direct_topp_t1100, "b128", "direct mini-topp T=1100", "mini-topp", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 1)
CASE_DIRECT(direct_noclamp, "b128", "direct mini no clamp", "mini", 1, 1100, 0, 0.0f, -1, -1, 0, 0, 0, 1)
CASE_DIRECT(direct_after, "b128", "direct after_w2 noshclamp", "mini", 1, 1100, 0, -1, 0, 1, 0, 0, 0, 1)
CASE_DIRECT(direct_chunked, "b128", "direct chunk 1024 T=3000", "mini", 1, 3000, 1024, -1, -1, -1, 0, 0, 0, 1)
CASE_DIRECT(direct_graph_t128, "b128", "direct graph mini T=128", "mini", 1, 128, 0, -1, -1, -1, 0, 1, 0, 1)
CASE_DIRECT(direct_q64_t1100, "q64", "direct q64 mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 1)
CASE_DIRECT(direct_q64_flash, "q64", "direct q64 flash e32 T=1100", "v4-flash", 5, 1100, 0, -1, -1, -1, 0, 0, 32, 1)
CASE_DIRECT(direct_q64_after, "q64", "direct q64 after_w2", "mini", 1, 1100, 0, -1, 0, 1, 0, 0, 0, 1)

/* params direct=q64 (gate/up of the large groups quantizes h in k_tile8's epilogue) against b64
   (k_tile8 writes bf16 h, k_quant8 quantizes it): the same h, amax, scales and codes by the same
   arithmetic, so the same outputs, ids and clamp counters bit for bit; v4-flash with 32 experts at
   T 1100 and 2000 (mid-size and large groups), the hash layer, top-p, mini-fp8 (fp8 experts:
   neither runs, the default's outputs). */
START_TEST(direct_variants_identical)
{
    static const env_kv base = {"DSV4MOE_CUDA_KERNELS", "direct=b64"};
    static const env_kv vs[] = {{"DSV4MOE_CUDA_KERNELS", "direct=q64"}};
    static const var_case cs[] = {{"v4-flash", 5, 1100, 32, 1}, {"v4-flash", 5, 2000, 32, 1}, {"v4-flash", 0, 1100, 32, 1},
                                  {"mini-topp", 1, 1100, 0, 1}, {"mini", 1, 300, 0, 1},      {"mini-fp8", 1, 1100, 0, 1}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        variants_vs(&base, "direct", cs[i].preset, cs[i].layer, cs[i].T, cs[i].experts, cs[i].fp8, vs, 1, 0);
}
END_TEST

/* params direct= against the default (the grouped FP8 GEMM on the e4m3 copies, k_quant8's SwiGLU):
   the same codes and scales, each block's partial on the same fp8 wgmma, so close (at most 1 % of
   the outputs differ, DeepGEMM diff below 1e-4, the same routing) where every routed group is
   large; on fp4 layers stats.fp8_direct says it ran, fewer weight bytes are bound (no e4m3 copies
   of the routed experts), and two runs agree bit for bit. mini-fp8 (fp8 routed experts) does not
   take it: fp8_direct 0, the same weights and the default's outputs. */
START_TEST(direct_close)
{
    if (!have_gpu())
        return;
    static const var_case cs[] = {{"v4-flash", 5, 1100, 32, 1}, {"v4-flash", 0, 1100, 32, 1}, {"mini", 1, 1100, 0, 1},
                                  {"mini-fp8", 1, 1100, 0, 1}};
    static const char *vals[] = {"direct=b128", "direct=b64", "direct=q64"};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const int fp4 = strcmp(cs[i].preset, "mini-fp8") != 0;
        bo_case k = {"direct", cs[i].preset, cs[i].layer, cs[i].T, 0, -1, -1, -1, 0, 0, cs[i].experts, cs[i].fp8};
        bo_in ci;
        bo_in_open(&k, &ci);
        const int64_t n = cs[i].T * ci.c.dim;
        bo_out d;
        run_env(&ci, &d, NULL, NULL);
        ck_assert_int_eq((int)d.stats.fp8_direct, 0);
        for (size_t v = 0; v < sizeof vals / sizeof vals[0]; v++) {
            bo_out o, o2;
            run_env(&ci, &o, "DSV4MOE_CUDA_KERNELS", vals[v]);
            run_env(&ci, &o2, "DSV4MOE_CUDA_KERNELS", vals[v]);
            int64_t nd = 0;
            for (int64_t j = 0; j < n; j++)
                nd += o.y[j] != d.y[j];
            dsv4_compare_metrics m;
            ck_assert(dsv4_compare_bf16(o.y, d.y, n, &m));
            printf("cuda_suite %s %-9s T %4lld: fp8_direct %llu, %lld of %lld outputs differ from the default, diff %g\n",
                   vals[v], cs[i].preset, (long long)cs[i].T, (unsigned long long)o.stats.fp8_direct, (long long)nd,
                   (long long)n, m.deepgemm_diff);
            ck_assert_int_eq((int)o.stats.fp8_direct, fp4);
            /* no e4m3 copies of the routed experts: fewer weight bytes bound */
            if (fp4)
                ck_assert_msg(o.stats.weights_allocated < d.stats.weights_allocated, "%s on %s: %llu weight bytes, default %llu",
                              vals[v], cs[i].preset, (unsigned long long)o.stats.weights_allocated,
                              (unsigned long long)d.stats.weights_allocated);
            else
                ck_assert(o.stats.weights_allocated == d.stats.weights_allocated);
            ck_assert_msg(memcmp(o.y, o2.y, (size_t)n * 2) == 0, "%s on %s: two runs differ", vals[v], cs[i].preset);
            ck_assert(memcmp(o.ids, d.ids, (size_t)(cs[i].T * ci.c.n_activated) * 4) == 0);
            if (fp4)
                ck_assert_msg(m.finite_ok && m.deepgemm_diff < 1e-4 && nd * 100 <= n, "%s on %s: %lld differ, diff %g",
                              vals[v], cs[i].preset, (long long)nd, m.deepgemm_diff);
            else
                ck_assert_msg(nd == 0, "%s on %s (fp8 experts): %lld outputs differ", vals[v], cs[i].preset, (long long)nd);
            bo_free(&o);
            bo_free(&o2);
        }
        bo_free(&d);
        bo_in_close(&ci);
    }
}
END_TEST

START_TEST(route_fused_close)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1},  {"v4-flash", 5, 8, 32, 1}, {"v4-flash", 5, 32, 32, 1},
                                  {"v4-flash", 0, 17, 32, 1}, {"mini-bf16", 1, 5, 0, 0}, {"mini-fp8", 1, 3, 0, 1},
                                  {"mini-topp", 1, 9, 0, 0},  {"mini", 1, 40, 0, 0}};
    variant_cases("route", "route=split", cs, sizeof cs / sizeof cs[0], 1);
}
END_TEST

/* The combine folded into the down projection (params combine=fold, the default, for chunks
   whose every group runs in k_dec: the block that writes a tile of o last sums y there) against
   k_combine after it (combine=kernel): the same sums in the same order, so the same outputs, ids
   and clamp counters bit for bit. v4-flash T 1, 8 and 16 (the shared expert's decode on its own
   stream with another K split), the hash layer, top-p (pruned slots), fp32 scales, the exact
   path's bf16 weights (no fold: the same either way) and T 40 (past the fold). */
START_TEST(combine_fold_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 0}, {"v4-flash", 5, 8, 32, 1}, {"v4-flash", 5, 16, 32, 1},
                                  {"v4-flash", 0, 3, 32, 1}, {"mini-topp", 1, 9, 0, 0}, {"mini-fp8", 1, 5, 0, 1},
                                  {"mini-bf16", 1, 5, 0, 0}, {"mini", 1, 40, 0, 0}};
    variant_cases("combine", "combine=kernel", cs, sizeof cs / sizeof cs[0], 0);
}
END_TEST

/* The decode kernel's B rows staged in shared memory (params dec_b=smem: fp4 launches whose
   K is not split) against every warp reading them through L1 (dec_b=l1, the default): the same
   products in the same order, so the same outputs, ids and clamp counters bit for bit. The
   staging runs where a launch has enough groups not to split K: v4-flash with 32 experts at T 8,
   16 and 40 (groups past 8 rows: two token tiles; past 16: the tile kernels), the hash layer and
   the full 256 experts at T 64 and 128, in both numerics modes; mini (its launches split K: the
   L1 path either way). */
START_TEST(dec_slab_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 8, 32, 1},   {"v4-flash", 5, 16, 32, 0}, {"v4-flash", 5, 40, 32, 1},
                                  {"v4-flash", 0, 17, 32, 1},  {"v4-flash", 5, 64, 0, 0},  {"v4-flash", 5, 128, 0, 1},
                                  {"mini", 1, 40, 0, 0}};
    variant_cases("dec_b", "dec_b=smem", cs, sizeof cs / sizeof cs[0], 0);
}
END_TEST

/* The small chunks' router logits variants' cases: v4-flash T 1, 3 (a group past the live tokens),
   4, 8, 13 and 32 (the hash layer at 17), mini-fp8 and mini-topp (the top-p predictor) and mini at
   T 40 (past k_logits_small: the GEMM logits either way). */
static const var_case logits_cases[] = {{"v4-flash", 5, 1, 32, 1},  {"v4-flash", 5, 3, 32, 1},  {"v4-flash", 5, 4, 32, 0},
                                        {"v4-flash", 5, 8, 32, 1},  {"v4-flash", 5, 13, 32, 1}, {"v4-flash", 5, 32, 32, 1},
                                        {"v4-flash", 0, 17, 32, 1}, {"mini-fp8", 1, 5, 0, 1},   {"mini-topp", 1, 9, 0, 0},
                                        {"mini", 1, 40, 0, 0}};
#define N_LOGITS_CASES (sizeof logits_cases / sizeof logits_cases[0])

/* The large chunks' router logits on cuBLASLt (params logits=blas) against k_tiles (logits=tiles),
   both on the block router: the same GEMM summed in another fixed order, so the logits differ in
   their last bits; variants_vs's close rule (the same ids, routing weights within 1e-5, DeepGEMM
   diff below 1e-5). v4-flash T 33 (the
   first chunk past k_logits_small), 64 and 300 (all 256 experts), the hash layer, mini-fp8 (fp32
   scales), mini-topp (the predictor reads x, not the logits: pruning on the new weights) and
   route=split at T 5 (a small chunk's logits from the GEMM, in one slice instead of split K). */
START_TEST(logits_blas_close)
{
    static const var_case cs[] = {{"v4-flash", 5, 33, 32, 1}, {"v4-flash", 5, 64, 0, 1},  {"v4-flash", 5, 300, 0, 1},
                                  {"v4-flash", 0, 77, 32, 1}, {"mini-fp8", 1, 100, 0, 1}, {"mini-topp", 1, 90, 0, 0}};
    variant_cases_vs("logits=tiles,router=block", "logits", "logits=blas,router=block", cs, sizeof cs / sizeof cs[0], 1);
    static const var_case sp[] = {{"mini", 1, 5, 0, 0}};
    variant_cases_vs("logits=tiles,route=split", "logits", "logits=blas,route=split", sp, 1, 1);
}
END_TEST

/* x quantized once after the grouping and gathered there (params gather=quant, k_quant_x8)
   against the router's quantization and k_gather8's copy (gather=copy), both on the block router:
   the same codes and scales in the same
   places, so the same outputs, ids and clamp counters bit for bit. v4-flash with 32 experts at T
   13 (k_logits_small's chunk: gathered only), 300 and 1100 (groups on the FP8 GEMM), all 256
   experts at T 300, the hash layer, mini-fp8 (fp32 scales, groups past the cut) and mini-topp
   (pruned slots); and with route=split at T 13 (x quantized here, not by k_logits_small), close to
   the default as route=split alone is. */
START_TEST(gather_quant_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 13, 32, 1},   {"v4-flash", 5, 300, 32, 1}, {"v4-flash", 5, 1100, 32, 1},
                                  {"v4-flash", 5, 300, 0, 1},   {"v4-flash", 0, 77, 32, 1},  {"mini-fp8", 1, 1100, 0, 1},
                                  {"mini-topp", 1, 90, 0, 0}};
    variant_cases_vs("gather=copy,router=block", "gather", "gather=quant,router=block", cs, sizeof cs / sizeof cs[0], 0);
    /* route=split's own logits differ from route=fused's in their last bits (route_fused_close) */
    static const var_case sp[] = {{"v4-flash", 5, 13, 32, 1}};
    variant_cases_vs("gather=copy,router=block", "gather", "gather=quant,router=block,route=split", sp, 1, 1);
}
END_TEST

/* The large chunks' router a warp a token (params router=warp, k_router_warp; x quantized by
   k_quant_x8) against the block a token (k_router), both on the cuBLASLt logits (logits=blas: one
   slice, which k_router_warp reads; k_tiles splits K below about 8000 rows of 256 experts): the
   same operations on the same values, so the same outputs, ids and clamp counters bit for bit.
   Chunks past k_router_count's 1024 slots: v4-flash T 300 (all 256 experts) and 1100 (32), the
   hash layer, mini-topp at T 300 (the predictor and top-p on one warp) and mini-fp8 at T 1100. */
START_TEST(router_warp_identical)
{
    static const env_kv base = {"DSV4MOE_CUDA_KERNELS", "logits=blas,router=block"};
    static const env_kv vs[] = {{"DSV4MOE_CUDA_KERNELS", "logits=blas,router=warp"}};
    static const var_case cs[] = {{"v4-flash", 5, 300, 0, 1}, {"v4-flash", 5, 1100, 32, 1}, {"v4-flash", 0, 300, 32, 1},
                                  {"mini-topp", 1, 300, 0, 0}, {"mini-fp8", 1, 1100, 0, 1}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        variants_vs(&base, "router", cs[i].preset, cs[i].layer, cs[i].T, cs[i].experts, cs[i].fp8, vs, 1, 0);
}
END_TEST

/* k_quant8's values by fewer instructions (params quant8=lean, the default: the hardware bf16
   rounding of h, the codes packed as they are encoded, the NaN codes' signs set only in a lane with
   an Inf or NaN) against its former instructions (quant8=std): the same h, codes and scales, so
   the same outputs, ids and clamp counters bit for bit. gemm fp8 chunks with large groups:
   v4-flash with 32 experts at T 300 and 1100, all 256 at T 300, the hash layer, mini-fp8 (fp32
   scales) and mini-topp (pruned slots). */
START_TEST(quant8_lean_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 300, 32, 1}, {"v4-flash", 5, 1100, 32, 1}, {"v4-flash", 5, 300, 0, 1},
                                  {"v4-flash", 0, 77, 32, 1},  {"mini-fp8", 1, 1100, 0, 1},  {"mini-topp", 1, 300, 0, 1}};
    variant_cases_vs("quant8=std", "quant8", "quant8=lean", cs, sizeof cs / sizeof cs[0], 0);
}
END_TEST

/* The router logits of small chunks with one token's x loaded at a time (params logits_tg=1)
   against four tokens' together (logits_tg=4, the default): every token's sum in the same order, so
   the same outputs, ids and clamp counters bit for bit (logits_cases). */
START_TEST(logits_tg_identical)
{
    const var_case *cs = logits_cases;
    variant_cases("logits_tg", "logits_tg=1", cs, N_LOGITS_CASES, 0);
}
END_TEST

/* The router logits of small chunks with the tokens unrolled (params logits_loop=off: 128 KB of
   SASS against 15 KB) against the default's loop that is not unrolled: every token's sum in the
   same order, so the same outputs, ids and clamp counters bit for bit (logits_cases), then with one
   token's x loaded at a time (logits_tg=1) at T 3, 13 and 32, and with route=one (k_route_small:
   its own logits, the same either way). */
START_TEST(logits_loop_identical)
{
    const var_case *cs = logits_cases;
    variant_cases("logits_loop", "logits_loop=off", cs, N_LOGITS_CASES, 0);
    variant_cases("logits_loop", "logits_loop=off,logits_tg=1", cs + 1, 1, 0);
    variant_cases("logits_loop", "logits_loop=off,logits_tg=1", cs + 4, 2, 0);
    variant_cases("logits_loop", "logits_loop=off,route=one", cs, 1, 0);
}
END_TEST

/* The grouping of chunks of up to 32 slots by one warp of k_router_count (params group=warp,
   count2_warp) against the block (count2_block, the default): the same counts, offsets and
   placement, so the same outputs, ids and clamp counters bit for bit. v4-flash T 1 to 5 (6 to 30
   slots) in both numerics modes, T 6 (36 slots: the block's grouping either way), the hash layer,
   mini-topp (pruned slots), mini-fp8, and T 1 on all 256 experts. */
START_TEST(group_warp_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 3, 32, 0}, {"v4-flash", 5, 5, 32, 1},
                                  {"v4-flash", 5, 6, 32, 1}, {"v4-flash", 0, 4, 32, 1}, {"mini-topp", 1, 9, 0, 0},
                                  {"mini-fp8", 1, 5, 0, 1},  {"v4-flash", 5, 1, 0, 1}};
    variant_cases("group", "group=warp", cs, sizeof cs / sizeof cs[0], 0);
}
END_TEST

/* The routing weights on the selecting warp of k_router_count (params weights=warp: lane k divides
   its score by the K scores' sum, which every lane adds in slot order) against thread 0's serial
   loop (weights=thread, the default): the same sum, division and scale, so the same outputs, ids
   and clamp counters bit for bit. v4-flash T 1, 8 and 32 in both numerics modes, the hash layer,
   mini-topp (top-p pruning reads the weights), mini-fp8, mini at T 40, and with group=warp. */
START_TEST(weights_warp_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1},  {"v4-flash", 5, 8, 32, 0}, {"v4-flash", 5, 32, 32, 1},
                                  {"v4-flash", 0, 5, 32, 1},  {"mini-topp", 1, 9, 0, 0}, {"mini-fp8", 1, 5, 0, 1},
                                  {"mini", 1, 40, 0, 0}};
    variant_cases("weights", "weights=warp", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("weights", "weights=warp,group=warp", cs, 1, 0);
}
END_TEST

/* k_router_count compiled for the decode configuration only (params route_code=lean: route_block's
   and count2_block's other configurations' code left out), and that kernel with a dry pass before
   the programmatic wait (warm: the router's code brought into the instruction caches while
   k_logits_small runs; its writes written again, no statistic counted), against the whole kernel
   (full, the default): the same operations in the same order, so the same outputs, ids and clamp
   counters (and the statistics they carry) bit for bit. v4-flash T 1, 3, 8, 17 (mid tiles) and 32
   in both numerics modes, 256 experts, the hash layer and mini-topp (both outside the lean
   kernel's configuration: the full one), mini-fp8, with group=warp,weights=warp, with dec_pf=early
   (the ticket's signal), with quant=down, and the plain launches (warm runs lean then). */
START_TEST(route_code_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 8, 32, 0},   {"v4-flash", 5, 3, 32, 1},
                                  {"v4-flash", 5, 17, 32, 1}, {"v4-flash", 5, 32, 32, 0}, {"v4-flash", 5, 4, 0, 1},
                                  {"v4-flash", 0, 5, 32, 1},  {"mini-topp", 1, 9, 0, 0},  {"mini-fp8", 1, 5, 0, 1}};
    g_cmp_route_stats = 1; /* warm's dry pass must count nothing */
    variant_cases("route_code", "route_code=lean", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("route_code", "route_code=lean,group=warp,weights=warp", cs, 2, 0);
    variant_cases("route_code", "route_code=lean,dec_pf=early", cs, 2, 0);
    variant_cases("route_code", "route_code=lean,pdl=off", cs, 1, 0);
    variant_cases("route_code", "route_code=warm", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("route_code", "route_code=warm,group=warp,weights=warp", cs, 2, 0);
    variant_cases("route_code", "route_code=warm,dec_pf=early,quant=down", cs, 4, 0);
    variant_cases("route_code", "route_code=warm,pdl=off", cs, 1, 0);
    g_cmp_route_stats = 0;
}
END_TEST

/* The one-launch router of small chunks (params route=one: k_route_small, route_small.cu) against
   k_logits_small + k_router_count (route=fused, the default): the same logits sums, the same
   routing arithmetic and the same grouping, so the same outputs, ids and clamp counters bit for
   bit. v4-flash T 1, 3, 8, 13, 16 and 32 in both numerics modes (T 32: 32-row tiles for groups past
   16 rows), the hash layer at 17, with one token's x loaded at a time (logits_tg=1), mini-fp8,
   mini-topp (top-p pruning and its predictor) and mini-bf16 (the exact path: the default's kernels
   either way); then replayed from a graph at T 3 and 13 (a padded bucket: fewer live tokens than
   the chunk's rows) and with plain launches (pdl=off). */
START_TEST(route_one_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1},  {"v4-flash", 5, 3, 32, 0},  {"v4-flash", 5, 8, 32, 1},
                                  {"v4-flash", 5, 13, 32, 1}, {"v4-flash", 5, 16, 32, 0}, {"v4-flash", 5, 32, 32, 1},
                                  {"v4-flash", 0, 17, 32, 1}, {"mini-fp8", 1, 5, 0, 1},   {"mini-topp", 1, 9, 0, 0},
                                  {"mini-bf16", 1, 5, 0, 0}};
    variant_cases("route", "route=one", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("route", "route=one,logits_tg=1", cs, 3, 0);
    if (!have_gpu())
        return;
    static const struct {
        int64_t T;
        const char *kernels;
    } gs[] = {{3, "route=one"}, {13, "route=one"}, {8, "route=one,pdl=off"}};
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
        bo_case k = {"route one", "v4-flash", 5, gs[i].T, 0, -1, -1, -1, 0, 1, 32, 1};
        bo_in ci;
        bo_in_open(&k, &ci);
        bo_out d, o;
        run_cuda(&ci.c, &ci.k, 0, 1, ci.ck, ci.x, ci.ids, &d);
        setenv("DSV4MOE_CUDA_KERNELS", gs[i].kernels, 1);
        run_cuda(&ci.c, &ci.k, 1, 2, ci.ck, ci.x, ci.ids, &o);
        unsetenv("DSV4MOE_CUDA_KERNELS");
        const int64_t n = gs[i].T * ci.c.dim;
        int64_t nd = 0;
        for (int64_t j = 0; j < n; j++)
            nd += o.y[j] != d.y[j];
        printf("cuda_suite route %s graph T %lld: %lld of %lld outputs differ from the default eager\n", gs[i].kernels,
               (long long)gs[i].T, (long long)nd, (long long)n);
        ck_assert_msg(nd == 0, "%s graph T %lld: %lld outputs differ", gs[i].kernels, (long long)gs[i].T, (long long)nd);
        ck_assert(memcmp(o.ids, d.ids, (size_t)(gs[i].T * ci.c.n_activated) * 4) == 0);
        bo_free(&o), bo_free(&d);
        bo_in_close(&ci);
    }
}
END_TEST

/* The fp8 shared expert's decode in the fp4 routed experts' launch (params shared_dec=one:
   k_dec_mix, mma.cuh) against its own k_dec on a forked stream (shared_dec=fork, the default): each
   group with the same K split and code, so the same outputs, ids and clamp counters bit for bit.
   v4-flash T 1, 2, 8 and 16 in both numerics modes (the folded combine at each), the hash layer,
   the full 256 experts at T 4, T 40 (past the decode regime: the shared expert on the tiles either
   way), with the combine as its own kernel, and replayed from a graph. */
START_TEST(shared_dec_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 2, 32, 0},  {"v4-flash", 5, 8, 32, 1},
                                  {"v4-flash", 5, 16, 32, 0}, {"v4-flash", 0, 5, 32, 1}, {"v4-flash", 5, 4, 0, 1},
                                  {"v4-flash", 5, 40, 32, 1}};
    variant_cases("shared_dec", "shared_dec=one", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("shared_dec", "shared_dec=one,combine=kernel", cs, 2, 0);
    variant_cases("shared_dec", "shared_dec=one,route=one", cs, 3, 0);
    if (!have_gpu())
        return;
    bo_case k = {"shared dec", "v4-flash", 5, 3, 0, -1, -1, -1, 0, 1, 32, 1};
    bo_in ci;
    bo_in_open(&k, &ci);
    bo_out d, o;
    run_cuda(&ci.c, &ci.k, 0, 1, ci.ck, ci.x, ci.ids, &d);
    setenv("DSV4MOE_CUDA_KERNELS", "shared_dec=one", 1);
    run_cuda(&ci.c, &ci.k, 1, 2, ci.ck, ci.x, ci.ids, &o);
    unsetenv("DSV4MOE_CUDA_KERNELS");
    int64_t nd = 0;
    for (int64_t j = 0; j < 3 * ci.c.dim; j++)
        nd += o.y[j] != d.y[j];
    printf("cuda_suite shared_dec=one graph T 3: %lld outputs differ from the default eager\n", (long long)nd);
    ck_assert_int_eq(nd, 0);
    bo_free(&o), bo_free(&d);
    bo_in_close(&ci);
}
END_TEST

/* k_dec with the deep rings (params dec_ring=deep: 8 fp4 / 4 fp8 K blocks a warp, two blocks per
   multiprocessor), and with each stage's weights one bulk asynchronous copy into them (dec_ring=bulk),
   against the default's (4 / 3): the prefetch distance and the copy change, not a product nor
   its order, so the same outputs, ids and clamp counters bit for bit. v4-flash T 1 (K split over
   four warps), 8 and 16 with 32 experts (enough groups not to split K: each warp streams all of
   its tile's K blocks through the ring), both numerics modes (fp4 and fp8 launches, the folded
   combine), the hash layer, mini-fp8 (fp8 routed experts), combine=kernel (the plain down
   projection) and quant=fold (the folded quantization of h). */
START_TEST(dec_ring_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 8, 32, 0}, {"v4-flash", 5, 16, 32, 1},
                                  {"v4-flash", 0, 5, 32, 1}, {"mini-fp8", 1, 5, 0, 1}};
    variant_cases("dec_ring", "dec_ring=deep", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("dec_ring", "dec_ring=deep,combine=kernel", cs + 1, 1, 0);
    variant_cases("dec_ring", "dec_ring=deep,quant=fold", cs, 2, 0);
    variant_cases("dec_ring", "dec_ring=bulk", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("dec_ring", "dec_ring=bulk,quant=fold", cs, 2, 0);
    variant_cases("dec_ring", "dec_ring=bulk_ef", cs, 3, 0);
}
END_TEST

/* The decode kernels bounded for two blocks per multiprocessor (params dec_regs=128: 102-114
   registers, no spills) against three (dec_regs=80, the default: 80 registers with a few spilled):
   the same arithmetic, so the same outputs, ids and clamp counters bit for bit. v4-flash T 1, 8
   and 16 in both numerics modes (fp4 and fp8 decode launches, the folded combine), dec_b=smem (the
   B slabs), the hash layer, mini-fp8 and with shared_dec=one (k_dec_mix). */
START_TEST(dec_regs_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 8, 32, 0}, {"v4-flash", 5, 16, 32, 1},
                                  {"v4-flash", 0, 5, 32, 1}, {"mini-fp8", 1, 5, 0, 1}};
    variant_cases("dec_regs", "dec_regs=128", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("dec_regs", "dec_regs=128,dec_b=smem", cs + 1, 1, 0);
    variant_cases("dec_regs", "dec_regs=128,shared_dec=one", cs, 2, 0);
}
END_TEST

/* The quantization of h folded into gate/up's decode launch (params quant=fold: the block that
   writes a group's 128 features last quantizes them, fold_quant, mma.cuh) against k_quant after it
   (quant=kernel, the default): the same values through the same quantizer, so the same outputs, ids
   and clamp counters bit for bit. v4-flash T 1, 3, 8 and 16 in both numerics modes (the K splits
   of 1 to 8 warps), the hash layer, 256 experts, mini-fp8 and mini-topp (fp32 scales, pruned slots),
   T 40 (past the decode regime: k_quant either way), then with the other decode variants (the
   shared expert in the routed launch, the one-launch router, no spills, combine=kernel). */
START_TEST(quant_fold_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 3, 32, 0},  {"v4-flash", 5, 8, 32, 1},
                                  {"v4-flash", 5, 16, 32, 0}, {"v4-flash", 0, 5, 32, 1}, {"v4-flash", 5, 4, 0, 1},
                                  {"mini-fp8", 1, 5, 0, 1},   {"mini-topp", 1, 9, 0, 0}, {"v4-flash", 5, 40, 32, 1}};
    variant_cases("quant", "quant=fold", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("quant", "quant=fold,shared_dec=one,route=one", cs, 4, 0);
    variant_cases("quant", "quant=fold,shared_dec=one,route=one,dec_regs=128", cs, 2, 0);
    variant_cases("quant", "quant=fold,combine=kernel", cs + 2, 1, 0);
    variant_cases("quant", "quant=auto", cs, 4, 0); /* T 1 on k_quant, T 3, 8, 16 folded */
}
END_TEST

/* k_dec_mix's blocks with their weight ranges prefetched into L2 (params dec_pf=l2, a hint) against
   none (off, the default): the same outputs, ids and clamp counters bit for bit; v4-flash T 1, 8 and
   16 in both numerics modes (the shared expert's prefetch before the programmatic wait), the hash
   layer, and with the three-launch step (route=one, quant=fold). */
START_TEST(dec_pf_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 8, 32, 0}, {"v4-flash", 5, 16, 32, 1},
                                  {"v4-flash", 0, 5, 32, 1}};
    variant_cases("dec_pf", "shared_dec=one,dec_pf=l2", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("dec_pf", "dec_pf=l2,route=one,shared_dec=one,quant=fold", cs, 3, 0);
}
END_TEST

/* k_dec's first-wave blocks prefetching during the routing chain (params dec_pf=early, dec_early.cuh:
   gate/up polling the router's ticket, down reading the grouping) against none: the same outputs,
   ids and clamp counters bit for bit; v4-flash T 1, 8 and 16 in both numerics modes, the hash
   layer, T 40 (groups past the decode regime, whose blocks ask for nothing), T 43 (more slots than
   a block's threads: off), with the folded quantization, the one-block grouping by a warp and
   without programmatic launches (no block is early). */
START_TEST(dec_early_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 8, 32, 0}, {"v4-flash", 5, 16, 32, 1},
                                  {"v4-flash", 0, 5, 32, 1}, {"v4-flash", 5, 40, 32, 1}, {"v4-flash", 5, 43, 32, 0}};
    variant_cases("dec_pf", "dec_pf=early", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("dec_pf", "dec_pf=early,quant=fold", cs, 2, 0);
    variant_cases("dec_pf", "dec_pf=early,group=warp,weights=warp", cs, 1, 0);
    variant_cases("dec_pf", "dec_pf=early,pdl=off", cs, 1, 0);
}
END_TEST

/* The fp8 shared expert's gate/up decode forked after k_logits_small, beside the router (params
   shared_gu=early), against after the router (late, the default): the same launch on the same
   inputs, so the same outputs, ids and clamp counters bit for bit; v4-flash T 1, 8 and 16 in both
   numerics modes, the hash layer, T 20 (the shared expert on the 32-row tiles: its decode launch
   returns), with dec_pf=early, and with quant=auto (folded from T 2: not early there). */
START_TEST(shared_gu_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 8, 32, 0}, {"v4-flash", 5, 16, 32, 1},
                                  {"v4-flash", 0, 5, 32, 1}, {"v4-flash", 5, 20, 32, 0}};
    variant_cases("shared_gu", "shared_gu=early", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("shared_gu", "shared_gu=early,dec_pf=early", cs, 2, 0);
    variant_cases("shared_gu", "shared_gu=early,quant=auto", cs + 1, 1, 0); /* T 8: folded, so not early */
}
END_TEST

/* h quantized by the down projection's decode blocks as they read it (params quant=down,
   dec_qin.cuh: each block quantizes its group's rows into shared memory with k_quant's quantizer)
   against k_quant (quant=kernel, the default): the same codes and scales, so the same outputs, ids
   and clamp counters bit for bit. v4-flash T 1, 3 and 8 in both numerics modes (the K splits, the
   folded combine, the forked fp8 shared expert's own launch), T 9 and 16 (groups past
   FM_DEC_QIN_MAX rows: k_quant), the hash layer, mini-fp8 and mini-topp (fp32 scales, pruned
   slots), then with two blocks a multiprocessor, the combine in its own kernel (k_dec without an
   epilogue), the early prefetch, the shared expert in the routed launch (k_dec_mix), the
   three-launch step on it (route=one, shared_dec=one), on persistent blocks, and plain launches. */
START_TEST(quant_down_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 8, 32, 0}, {"v4-flash", 5, 3, 32, 1},
                                  {"v4-flash", 5, 8, 32, 1}, {"v4-flash", 5, 1, 32, 0}, {"v4-flash", 5, 9, 32, 1},
                                  {"v4-flash", 5, 16, 32, 0}, {"v4-flash", 0, 5, 32, 1}, {"mini-fp8", 1, 5, 0, 1},
                                  {"mini-topp", 1, 7, 0, 0}};
    variant_cases("quant_down", "quant=down", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("quant_down", "quant=down,dec_regs=128", cs, 2, 0);
    variant_cases("quant_down", "quant=down,combine=kernel", cs, 2, 0);
    variant_cases("quant_down", "quant=down,dec_pf=early,shared_gu=early", cs, 2, 0);
    variant_cases("quant_down", "quant=down,shared_dec=one", cs, 2, 0);
    variant_cases("quant_down", "quant=down,shared_dec=one,route=one", cs, 4, 0);
    variant_cases("quant_down", "quant=down,shared_dec=one,dec_sched=persist,combine=kernel", cs, 2, 0);
    variant_cases("quant_down", "quant=down,pdl=off", cs, 1, 0);
}
END_TEST

/* k_dec_mix on persistent blocks (params dec_sched=persist: at most the resident blocks, each over
   every gridDim-th unit, its next unit's weights into L2 first with dec_pf=l2) against the grid
   (the default): the same units computed the same way, so the same outputs, ids and clamp counters
   bit for bit. v4-flash T 1, 8 and 16 in both numerics modes, the hash layer, with the prefetch,
   with 128 registers, and in the three-launch step (the folded combine and quantization). */
START_TEST(dec_sched_identical)
{
    static const var_case cs[] = {{"v4-flash", 5, 1, 32, 1}, {"v4-flash", 5, 8, 32, 0}, {"v4-flash", 5, 16, 32, 1},
                                  {"v4-flash", 0, 5, 32, 1}};
    variant_cases("dec_sched", "shared_dec=one,dec_sched=persist", cs, sizeof cs / sizeof cs[0], 0);
    variant_cases("dec_sched", "shared_dec=one,dec_sched=persist,dec_pf=l2,dec_regs=128", cs, 2, 0);
    variant_cases("dec_sched", "route=one,shared_dec=one,quant=fold,dec_sched=persist,dec_pf=l2", cs, 3, 0);
}
END_TEST

/* tests/cuda/route_small_hw.cu: k_route_small on small shapes against the reference's arithmetic. */
static uint32_t rs_rand(uint64_t *st)
{
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*st >> 33);
}

static void route_small_case(int E, int K, int H, int T, int score, int with_bias, uint64_t seed)
{
    const int n = T * K;
    uint16_t *x = malloc((size_t)T * H * 2), *gate = malloc((size_t)E * H * 2);
    float *bias = with_bias ? malloc((size_t)E * 4) : NULL;
    int64_t *lx = malloc((size_t)T * H * 8), *lg = malloc((size_t)E * H * 8);
    ck_assert(x && gate && lx && lg && (!with_bias || bias));
    /* values whose products and sums are exact in fp32 (multiples of 2^-10 below 2^14): the logits
       are one number whatever the order of the sum, the reference's and the kernel's */
    for (int64_t i = 0; i < (int64_t)T * H; i++) {
        lx[i] = (int64_t)(rs_rand(&seed) % 17) - 8;
        x[i] = dsv4_f32_to_bf16((float)lx[i] / 16.0f);
    }
    for (int64_t i = 0; i < (int64_t)E * H; i++) {
        lg[i] = (int64_t)(rs_rand(&seed) % 33) - 16;
        gate[i] = dsv4_f32_to_bf16((float)lg[i] / 64.0f);
    }
    for (int e = 0; with_bias && e < E; e++)
        bias[e] = (float)((int)(rs_rand(&seed) % 9) - 4) / 8.0f;
    dsv4_test_route_in in = {E, K, H, T, score, 1.5f, 1e-20f, x, gate, bias};
    dsv4_test_route_out o;
    memset(&o, 0, sizeof o);
    o.logits = malloc((size_t)T * E * 4), o.ids = malloc((size_t)n * 4), o.kept = malloc((size_t)T * 4);
    o.w = malloc((size_t)n * 4), o.cnt = malloc((size_t)E * 4), o.slot_off = malloc((size_t)(E + 1) * 4);
    o.pad_off = malloc((size_t)E * 4), o.active = malloc((size_t)E * 4), o.meta = malloc(16);
    o.tile_e = malloc((size_t)2 * n * 4), o.tile_r0 = malloc((size_t)2 * n * 4), o.slot_tok = malloc((size_t)n * 4);
    o.slot_row = malloc((size_t)n * 4), o.rowmap = malloc((size_t)n * 4), o.slot_w = malloc((size_t)n * 4);
    ck_assert_int_eq(dsv4_test_route_small(&in, &o), 0);
    ck_assert_msg(o.ticket == 0, "the ticket is %llu after the launch", o.ticket);
    dsv4_config c;
    memset(&c, 0, sizeof c);
    c.n_routed_experts = E, c.n_activated = K, c.score_func = (dsv4_score_func)score;
    c.route_scale = 1.5f, c.norm_eps = 1e-20f;
    float *sc = malloc((size_t)E * 4);
    int32_t ids[32];
    float w[32];
    int near_ties = 0;
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) {
            int64_t acc = 0;
            for (int h = 0; h < H; h++)
                acc += lx[(int64_t)t * H + h] * lg[(int64_t)e * H + h];
            const float l = (float)acc / 1024.0f;
            ck_assert_msg(o.logits[(int64_t)t * E + e] == l, "T %d token %d expert %d: logit %.9g, want %.9g", T, t, e,
                          o.logits[(int64_t)t * E + e], l);
            sc[e] = score == 0 ? sqrtf(l > 20.0f ? l : log1pf(expf(l))) : 1.0f / (1.0f + expf(-l));
        }
        dsv4_route_select(&c, sc, bias, NULL, ids, w);
        ck_assert_int_eq(o.kept[t], K);
        for (int k = 0; k < K; k++) {
            const int32_t got = o.ids[t * K + k];
            if (got != ids[k]) {
                /* the device's expf / log1pf may round a score differently: only keys within a few
                   ulps of each other may change places */
                ck_assert(got >= 0 && got < E);
                const float ka = sc[got] + (bias ? bias[got] : 0.0f), kb = sc[ids[k]] + (bias ? bias[ids[k]] : 0.0f);
                ck_assert_msg(fabsf(ka - kb) <= 1e-6f * fabsf(kb) + 1e-30f, "T %d token %d slot %d: expert %d, want %d",
                              T, t, k, got, ids[k]);
                near_ties++;
                continue;
            }
            ck_assert_msg(fabsf(o.w[t * K + k] - w[k]) <= 2e-6f * fabsf(w[k]), "T %d token %d slot %d: weight %.9g, want %.9g",
                          T, t, k, o.w[t * K + k], w[k]);
        }
    }
    /* the grouping of the kernel's own ids, as k_count2 defines it */
    int *cnt = calloc((size_t)E, sizeof(int)), so = 0, po = 0, na = 0, nm = 0, nb = 0;
    for (int i = 0; i < n; i++)
        cnt[o.ids[i]]++;
    for (int e = 0; e < E; e++) {
        const int ce = cnt[e];
        ck_assert_int_eq(o.cnt[e], ce);
        ck_assert_int_eq(o.slot_off[e], so);
        ck_assert_int_eq(o.pad_off[e], po);
        if (ce > 0)
            ck_assert_int_eq(o.active[na++], e);
        const int mid = ce > 16 && ce <= 64 ? (ce + 31) / 32 : 0, big = ce > 64 ? (ce + 127) / 128 : 0;
        for (int i = 0; i < mid; i++, nm++)
            ck_assert(o.tile_e[nm] == e && o.tile_r0[nm] == 32 * i);
        for (int i = 0; i < big; i++, nb++)
            ck_assert(o.tile_e[o.cap_mid + nb] == e && o.tile_r0[o.cap_mid + nb] == 128 * i);
        /* expert e's slots in slot order */
        int r = 0;
        for (int i = 0; i < n; i++) {
            if (o.ids[i] != e)
                continue;
            const int q = so + r;
            ck_assert_msg(o.slot_tok[q] == i / K && o.slot_w[q] == o.w[i] && o.slot_row[q] == po + r &&
                              o.rowmap[i] == po + r,
                          "T %d expert %d rank %d (slot %d): token %d row %d, want token %d row %d", T, e, r, i,
                          o.slot_tok[q], o.slot_row[q], i / K, po + r);
            r++;
        }
        so += ce;
        po += (ce + 127) / 128 * 128;
    }
    ck_assert_int_eq(o.slot_off[E], so);
    ck_assert(o.meta[0] == na && o.meta[1] == nm && o.meta[2] == so && o.meta[3] == nb);
    printf("cuda_suite k_route_small E %d K %d H %d T %2d score %d bias %d: logits exact, routing as the reference "
           "(%d near-tie swaps), grouping as k_count2 (%d active, %d mid tiles)\n",
           E, K, H, T, score, with_bias, near_ties, na, nm);
    ck_assert_int_le(near_ties, 2);
    free(cnt), free(sc), free(x), free(gate), free(bias), free(lx), free(lg);
    free(o.logits), free(o.ids), free(o.kept), free(o.w), free(o.cnt), free(o.slot_off), free(o.pad_off);
    free(o.active), free(o.meta), free(o.tile_e), free(o.tile_r0), free(o.slot_tok), free(o.slot_row), free(o.rowmap);
    free(o.slot_w);
}

/* The test's own generator (independent of the library's). */
static uint32_t dm_next(uint32_t *st)
{
    *st = *st * 1664525u + 1013904223u;
    return *st >> 8;
}

/* Values with few significant bits and close exponents: every partial sum the kernel forms (a
   k32 step on the tensor cores, a 128-block, a K split's part, their sum) is exact in fp32, so
   the expected output is one bf16 rounding of the exact sum, whatever order the kernel adds in. */
static const float dm_act[] = {0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 1.5f, -1.5f};
static const float dm_w8[] = {0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 1.5f, -1.5f, 2.0f, -2.0f, 3.0f, -3.0f};

/* The per-kernel GEMM tests' operands (dec_mix_case, tile8_case): E fp4 routed experts and the fp8
   shared expert, [N, K] each, in the natural layout (the expected sums read it) and repacked into
   the fragment-native one (the kernels read it); activation rows A (routed, by padded row) and Ash
   (the shared expert's, by token) with their 1x128 scales. Values from dm_act and dm_w8, e2m1
   magnitudes 0 to 2, scales 2^-1 .. 2^1. */
typedef struct {
    int E, N, K, rows, ntok;
    uint64_t d4, sc4, d8, sc8;
    uint8_t *nat4, *sb4, *w4, *s4, *nat8, *sb8, *w8, *A, *Ash;
    float *s8, *As, *Assh;
} dm_ops;

static void dm_ops_make(dm_ops *m, int E, int N, int K, int rows, int ntok, uint32_t seed)
{
    const int NG = K / 128;
    uint32_t st = seed;
    m->E = E, m->N = N, m->K = K, m->rows = rows, m->ntok = ntok;
    dsv4_fn_sizes(1, N, K, 0, &m->d4, &m->sc4);
    dsv4_fn_sizes(0, N, K, 0, &m->d8, &m->sc8);
    m->nat4 = malloc((size_t)E * N * K / 2), m->sb4 = malloc((size_t)E * N * K / 32);
    m->w4 = malloc((size_t)E * m->d4), m->s4 = malloc((size_t)E * m->sc4);
    m->nat8 = malloc((size_t)N * K), m->sb8 = malloc((size_t)(N / 128) * NG), m->w8 = malloc(m->d8);
    m->s8 = malloc(m->sc8);
    m->A = malloc((size_t)rows * K), m->Ash = malloc((size_t)ntok * K + 1);
    m->As = malloc(sizeof(float) * rows * NG), m->Assh = malloc(sizeof(float) * ntok * NG + 1);
    ck_assert(m->nat4 && m->sb4 && m->w4 && m->s4 && m->nat8 && m->sb8 && m->w8 && m->s8);
    ck_assert(m->A && m->Ash && m->As && m->Assh);
    for (size_t i = 0; i < (size_t)E * N * K / 2; i++) { /* e2m1 magnitudes 0 to 2, either sign */
        const uint32_t lo = (dm_next(&st) % 5) | (dm_next(&st) & 1u) << 3, hi = (dm_next(&st) % 5) | (dm_next(&st) & 1u) << 3;
        m->nat4[i] = (uint8_t)(lo | hi << 4);
    }
    for (size_t i = 0; i < (size_t)E * N * K / 32; i++)
        m->sb4[i] = (uint8_t)(126 + dm_next(&st) % 3); /* 2^-1 .. 2^1 */
    for (int e = 0; e < E; e++) {
        const dsv4_fn_src a = {m->nat4 + (size_t)e * N * K / 2, K / 2, m->sb4 + (size_t)e * N * K / 32, 0};
        int bw = 0;
        int64_t br = 0, bg = 0;
        ck_assert_int_eq(dsv4_fn_repack_fp4(&a, NULL, N, K, m->w4 + e * m->d4, m->s4 + e * m->sc4, &bw, &br, &bg, NULL, NULL), 0);
    }
    for (size_t i = 0; i < (size_t)N * K; i++)
        m->nat8[i] = dsv4_f32_to_e4m3(dm_w8[dm_next(&st) % (sizeof dm_w8 / sizeof dm_w8[0])]);
    for (int i = 0; i < (N / 128) * NG; i++)
        m->sb8[i] = (uint8_t)(126 + dm_next(&st) % 3);
    const dsv4_fn_src a8 = {m->nat8, K, m->sb8, 0};
    dsv4_fn_repack_fp8(&a8, NULL, N, K, m->w8, m->s8);
    for (size_t i = 0; i < (size_t)rows * K; i++)
        m->A[i] = dsv4_f32_to_e4m3(dm_act[dm_next(&st) % 7]);
    for (size_t i = 0; i < (size_t)ntok * K; i++)
        m->Ash[i] = dsv4_f32_to_e4m3(dm_act[dm_next(&st) % 7]);
    for (int i = 0; i < rows * NG; i++)
        m->As[i] = ldexpf(1.0f, (int)(dm_next(&st) % 3) - 1);
    for (int i = 0; i < ntok * NG; i++)
        m->Assh[i] = ldexpf(1.0f, (int)(dm_next(&st) % 3) - 1);
}

static void dm_ops_free(dm_ops *m)
{
    free(m->nat4), free(m->sb4), free(m->w4), free(m->s4), free(m->nat8), free(m->sb8), free(m->w8), free(m->s8);
    free(m->A), free(m->Ash), free(m->As), free(m->Assh);
}

/* The device halves' view of m with the groups cnt / pad_off and K splits ks, ks_sh. */
static dsv4_test_decmix_in dm_in(const dm_ops *m, const int *cnt, const int *pad_off, int ks, int ks_sh)
{
    const dsv4_test_decmix_in in = {m->E,  m->N,    m->K,    ks,      ks_sh, m->w4, m->s4,   m->d4,
                                    m->sc4, m->w8,  m->s8,   m->d8,   m->sc8 / 4, cnt, pad_off, m->rows,
                                    m->A,  m->As,   m->ntok, m->Ash,  m->Assh};
    return in;
}

/* The exact sum (as the reference defines the values: SPEC.md section 5's e2m1 / e4m3 values and
   ue8m0 scales) of weight row r of group g (E: the shared expert) with activation row arow (of A,
   or of Ash for the shared expert). */
static double dm_sum(const dm_ops *m, int g, long arow, int r)
{
    const int N = m->N, K = m->K, NG = K / 128;
    const uint8_t *ar = (g < m->E ? m->A : m->Ash) + arow * K;
    const float *as = (g < m->E ? m->As : m->Assh) + arow * NG;
    double sum = 0.0;
    for (int k = 0; k < K; k++) {
        double w;
        if (g < m->E) {
            const uint8_t byte = m->nat4[(size_t)g * N * K / 2 + (size_t)r * (K / 2) + k / 2];
            w = (double)dsv4_e2m1_to_f32(k & 1 ? byte >> 4 : byte & 15) *
                dsv4_ue8m0_decode(m->sb4[(size_t)g * N * K / 32 + (size_t)r * (K / 32) + k / 32]);
        } else {
            w = (double)dsv4_e4m3_to_f32(m->nat8[(size_t)r * K + k]) * dsv4_ue8m0_decode(m->sb8[(r / 128) * NG + k / 128]);
        }
        sum += w * dsv4_e4m3_to_f32(ar[k]) * as[k / 128];
    }
    return sum;
}

/* The outputs of out [rows, cols] in rows no group (cnt / pad_off of E) owns that are not 0xFFFF. */
static long dm_untouched(const uint16_t *out, int rows, int cols, int E, const int *cnt, const int *pad_off)
{
    long n = 0;
    for (int row = 0; row < rows; row++) {
        int owned = 0;
        for (int e = 0; e < E; e++)
            owned |= row >= pad_off[e] && row < pad_off[e] + cnt[e];
        for (int c = 0; c < cols && !owned; c++)
            n += out[(long)row * cols + c] != 0xFFFFu;
    }
    return n;
}

/* One k_dec_mix launch: E = 4 fp4 routed experts with cnt[e] rows each (0 to 16: no group, one or
   two 8-token tiles), K split ks, and the fp8 shared expert with ntok rows and split ks_sh; N 256,
   K 512 (ks 8: half the warps have no K block). The groups' rows sit apart, with rows no group
   owns between them, which must keep their contents. */
/* ring -1: k_dec_mix; 0 to 3: k_dec's own launches with params dec_ring std, deep, bulk, bulk_ef */
static void dec_mix_case(int ring, int ks, int ks_sh, const int cnt[4], int ntok, uint32_t seed)
{
    static const char *const kname[] = {"k_dec_mix", "k_dec std", "k_dec deep", "k_dec bulk", "k_dec bulk_ef"};
    enum { E = 4, N = 256, K = 512 };
    /* activations: each group's rows 16 e + (e & 1) .., the shared expert's own */
    int pad_off[E];
    for (int e = 0; e < E; e++)
        pad_off[e] = 17 * e + (e & 1);
    const int rows = 17 * E + 2;
    dm_ops m;
    dm_ops_make(&m, E, N, K, rows, ntok, seed);
    uint16_t *out = malloc(sizeof(uint16_t) * rows * N), *out_sh = malloc(sizeof(uint16_t) * ntok * N);
    ck_assert(out && out_sh);
    for (int i = 0; i < rows * N; i++)
        out[i] = 0xFFFFu; /* a NaN no sum gives */
    for (int i = 0; i < ntok * N; i++)
        out_sh[i] = 0xFFFFu;
    const dsv4_test_decmix_in in = dm_in(&m, cnt, pad_off, ks, ks_sh);
    const int rc = ring < 0 ? dsv4_test_dec_mix(&in, out, out_sh) : dsv4_test_dec(&in, ring, out, out_sh);
    ck_assert_msg(rc == 0, "%s: CUDA error %d (%s)", kname[ring + 1], rc, cudaGetErrorString((cudaError_t)rc));
    /* expected: the exact sums (double), one fp32 and one bf16 rounding; a zero of either sign is zero */
    long bad = 0, checked = 0, untouched = 0;
    for (int g = 0; g <= E; g++) {
        const int n = g < E ? cnt[g] : ntok;
        for (int j = 0; j < n; j++) {
            const long arow = g < E ? pad_off[g] + j : j;
            for (int r = 0; r < N; r++) {
                const double sum = dm_sum(&m, g, arow, r);
                const float f = (float)sum;
                ck_assert_msg((double)f == sum, "the test's values must sum exactly in fp32");
                const uint16_t want = dsv4_bf16_bits(f), got = g < E ? out[arow * N + r] : out_sh[arow * N + r];
                if (got != want && !((got & 0x7FFFu) == 0 && (want & 0x7FFFu) == 0)) {
                    if (bad++ < 5)
                        fprintf(stderr, "%s ks %d/%d group %d row %d col %d: got 0x%04x want 0x%04x\n", kname[ring + 1],
                                ks, ks_sh, g, j, r, got, want);
                }
                checked++;
            }
        }
    }
    untouched += dm_untouched(out, rows, N, E, cnt, pad_off);
    printf("cuda_suite %-13s ks %d/%d rows %d %d %d %d + shared %2d: %ld outputs as the exact sums (%ld differ), "
           "%ld written outside the groups\n",
           kname[ring + 1], ks, ks_sh, cnt[0], cnt[1], cnt[2], cnt[3], ntok, checked, bad, untouched);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(untouched, 0);
    dm_ops_free(&m);
    free(out), free(out_sh);
}

/* k_dec_mix alone (params shared_dec=one's kernel) through its launcher, then k_dec's own launches
   (the routed groups in one, the shared expert in another) with each of its rings (params dec_ring
   std, deep, bulk): fp4 routed groups of 1 to 16 rows (one and two token tiles, empty groups
   skipped) and the fp8 shared expert's group, each with its own K split (1, 2, 4, 8), against the
   exact products and sums of the weights and activations as the reference defines them (SPEC.md
   section 5's e2m1 / e4m3 values and ue8m0 scales), one bf16 rounding; rows no group owns
   untouched. */
START_TEST(dec_mix_kernel)
{
    static const int c0[4] = {1, 0, 3, 16}, c1[4] = {9, 2, 0, 5}, c2[4] = {16, 16, 1, 8}, c3[4] = {0, 0, 4, 0};
    if (!have_gpu())
        return;
    for (int ring = -1; ring <= 3; ring++) {
        dec_mix_case(ring, 1, 1, c0, 1, 11u);
        dec_mix_case(ring, 2, 8, c1, 7, 12u);
        dec_mix_case(ring, 4, 2, c2, 16, 13u);
        dec_mix_case(ring, 8, 4, c3, 3, 14u);
    }
}
END_TEST

/* One chunk grouped by count2_block (the default) and by count2_warp (params group=warp): every
   output the same, byte for byte, and the block's as the inputs say (valid slots, active experts).
   ids: kind 0 distinct per token from a pool of `pool` experts, 1 every token's slot 0 on expert 3
   (K 1: a group past 16 rows), then `pruned` slots set to E, `bad` slots out of range. */
static void group_warp_case(int E, int K, int T, int pool, int pruned, int bad, int cut, int rows, uint64_t seed)
{
    const int n = T * K;
    int32_t ids[32];
    float w[32];
    uint8_t cut_ok[257];
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                e = (int)((r >> 33) % (uint64_t)pool);
                if (K == 1 && (r >> 20) % 8 < 5)
                    e = 3; /* most tokens on expert 3 */
                dup = 0;
                for (int j = 0; j < k; j++)
                    dup |= ids[t * K + j] == e;
            } while (dup);
            ids[t * K + k] = e;
            w[t * K + k] = 0.125f * (float)(1 + (t * K + k) % 7);
        }
    for (int i = 0; i < pruned; i++)
        ids[(5 * i + 1) % n] = E;
    for (int i = 0; i < bad; i++)
        ids[(7 * i + 2) % n] = i % 2 ? -2 : E + 3;
    memset(cut_ok, 0, sizeof cut_ok);
    if (cut)
        cut_ok[3] = 1, cut_ok[E] = 1;
    dsv4_test_group_in in = {.E = E, .K = K, .T = T, .ids = ids, .w = w, .cut_ok = cut ? cut_ok : NULL,
                             .cut_rows = 16, .has_shared = 1, .rows = rows, .cap_mid = 16, .cap_big = 8, .nzero = 5};
    static dsv4_test_group_out blk, wrp;
    ck_assert_int_eq(dsv4_test_group_warp(&in, &blk, &wrp), 0);
    int valid = 0, active = 0;
    for (int i = 0; i < n; i++) {
        int first = ids[i] >= 0 && ids[i] < E;
        valid += first;
        for (int j = 0; j < i && first; j++)
            first = ids[j] != ids[i];
        active += first;
    }
    const int fits = active * 128 <= rows;
    ck_assert_int_eq(blk.meta[0], fits ? active : 0);
    ck_assert_int_eq(blk.meta[2], fits ? valid : 0);
    ck_assert_uint_eq(blk.badid, (unsigned long long)(bad + !fits));
    const unsigned char *a = (const unsigned char *)&blk, *b = (const unsigned char *)&wrp;
    size_t first_diff = sizeof blk;
    for (size_t i = 0; i < sizeof blk && first_diff == sizeof blk; i++)
        if (a[i] != b[i])
            first_diff = i;
    ck_assert_msg(first_diff == sizeof blk, "E %d K %d T %d seed %llu: count2_warp differs from count2_block at byte %zu",
                  E, K, T, (unsigned long long)seed, first_diff);
    printf("cuda_suite count2_warp E %3d K %d T %2d: %d valid slots, %d experts, %d mid tiles, as count2_block\n", E, K,
           T, blk.meta[2], blk.meta[0], blk.meta[1]);
}

/* count2_warp (params group=warp's grouping) against count2_block on chunks of up to 32 slots:
   one token of v4-flash's shape, repeated experts, an odd E, pruned and out-of-range slots, a group
   past 16 rows (a mid tile; the shared expert's tile at T 32), its cut to the GEMM, the layout's
   bound failed, and no slot valid. */
START_TEST(group_warp_kernel)
{
    if (!have_gpu())
        return;
    group_warp_case(256, 6, 1, 256, 0, 0, 0, 1 << 20, 1);
    group_warp_case(256, 6, 5, 9, 0, 0, 0, 1 << 20, 2);
    group_warp_case(72, 4, 8, 12, 3, 0, 0, 1 << 20, 3);
    group_warp_case(8, 1, 32, 8, 0, 0, 0, 1 << 20, 4);
    group_warp_case(8, 1, 32, 8, 2, 0, 1, 1 << 20, 5);
    group_warp_case(16, 2, 4, 16, 0, 2, 0, 1 << 20, 6);
    group_warp_case(32, 4, 4, 32, 0, 0, 0, 256, 7);
    group_warp_case(16, 2, 3, 16, 6, 0, 0, 1 << 20, 8);
}
END_TEST

/* The logits tests' inputs: x [T, H] and the gate [E, H] as bf16 of small uniform values. */
static void logits_inputs(int T, int E, int H, uint32_t seed, uint16_t *x, uint16_t *g)
{
    uint32_t st = seed;
    for (size_t i = 0; i < (size_t)T * H; i++)
        x[i] = dsv4_bf16_bits((float)((int)(dm_next(&st) % 2001) - 1000) * 1e-3f);
    for (size_t i = 0; i < (size_t)E * H; i++)
        g[i] = dsv4_bf16_bits((float)((int)(dm_next(&st) % 2001) - 1000) * 1e-4f);
}

/* |v - l[t, e]| relative to sum |x[t, k] g[e, k]|, l the host's double sum of the exact products. */
static double logits_err(const uint16_t *x, const uint16_t *g, int t, int e, int H, float v)
{
    double ref = 0.0, mag = 0.0;
    for (int k = 0; k < H; k++) {
        const double p = (double)dsv4_bf16_to_f32(x[(size_t)t * H + k]) * dsv4_bf16_to_f32(g[(size_t)e * H + k]);
        ref += p, mag += fabs(p);
    }
    return fabs((double)v - ref) / (mag + 1e-30);
}

/* One shape of logits_small_kernel: the four variants bit for bit, and near the host's sums. */
static void logits_small_case(int T, int E, int H, uint32_t seed)
{
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)T * H), *g = malloc(sizeof(uint16_t) * (size_t)E * H);
    float *out[4];
    for (int v = 0; v < 4; v++)
        out[v] = malloc(sizeof(float) * (size_t)T * E);
    ck_assert(x && g && out[0] && out[1] && out[2] && out[3]);
    logits_inputs(T, E, H, seed, x, g);
    int fits = -1;
    const int rc = dsv4_test_logits_small(T, E, H, x, g, out, &fits);
    ck_assert_msg(rc == 0, "dsv4_test_logits_small: CUDA error %d (%s)", rc, cudaGetErrorString((cudaError_t)rc));
    long differ = 0, far = 0;
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            const size_t j = (size_t)t * E + e;
            for (int v = 1; v < 4; v++)
                differ += memcmp(&out[v][j], &out[0][j], sizeof(float)) != 0;
            /* fp32 rounding: about sqrt(H) eps of mag; a lost 8-element piece: about 1e-3 of it */
            far += logits_err(x, g, t, e, H, out[0][j]) > 1e-4;
        }
    printf("cuda_suite k_logits_small T %2d E %3d H %5d (loop %s): %ld of %d logits differ between the variants, %ld far "
           "from the host's sums\n",
           T, E, H, fits ? "reaches" : "does not reach", differ, 3 * T * E, far);
    ck_assert_int_eq(differ, 0);
    ck_assert_int_eq(far, 0);
    free(x), free(g);
    for (int v = 0; v < 4; v++)
        free(out[v]);
}

/* k_logits_small alone through its launcher in its four variants (params logits_tg 1 / 4,
   logits_loop off / on): the same logits bit for bit (each token's sum in the same order), within
   fp32 rounding of the host's double sums; T 1, 3, 13, 32, E 16, 72 (an odd pair of experts) and
   256, H 4096, 7168, 8192 (the loop's reach, logits_loop_fits) and 8200 (past it: the unrolled
   kernel either way). */
START_TEST(logits_small_kernel)
{
    if (!have_gpu())
        return;
    logits_small_case(1, 256, 4096, 21u);
    logits_small_case(3, 72, 4096, 22u);
    logits_small_case(13, 256, 4096, 23u);
    logits_small_case(32, 256, 4096, 24u);
    logits_small_case(32, 72, 7168, 25u);
    logits_small_case(8, 16, 8192, 26u);
    logits_small_case(4, 16, 8200, 27u);
}
END_TEST

/* One shape of logits_blas_call: run to run the same bit for bit, near the host's sums, 0 rows refused. */
static void logits_blas_case(int T, int E, int H, uint32_t seed)
{
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)T * H), *g = malloc(sizeof(uint16_t) * (size_t)E * H);
    float *out = malloc(sizeof(float) * (size_t)T * E), *again = malloc(sizeof(float) * (size_t)T * E);
    ck_assert(x && g && out && again);
    logits_inputs(T, E, H, seed, x, g);
    char why[256] = "";
    int refused = 0;
    const int rc = dsv4_test_logits_blas(T, E, H, x, g, out, again, &refused, why, (int)sizeof why);
    ck_assert_msg(rc == 0, "dsv4_test_logits_blas T %d E %d H %d: CUDA error %d (%s) %s", T, E, H, rc,
                  cudaGetErrorString((cudaError_t)rc), why);
    ck_assert_int_eq(refused, (int)cudaErrorInvalidValue);
    long differ = 0, far = 0;
    double worst = 0.0;
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            const size_t j = (size_t)t * E + e;
            differ += memcmp(&out[j], &again[j], sizeof(float)) != 0;
            const double d = logits_err(x, g, t, e, H, out[j]);
            worst = d > worst ? d : worst;
            far += d > 1e-4; /* the bound of logits_small_case; a transposed operand or a lost K block is far past it */
        }
    printf("cuda_suite cuBLASLt logits T %4d E %3d H %5d: %ld of %d logits differ between two runs, %ld far from the "
           "host's sums (worst %.2e of the magnitude)\n",
           T, E, H, differ, T * E, far, worst);
    ck_assert_int_eq(differ, 0);
    ck_assert_int_eq(far, 0);
    free(x), free(g), free(out), free(again);
}

/* The large chunks' router logits on cuBLASLt (params logits=blas) alone through their launcher:
   the same logits in two runs bit for bit (no split of K, no workspace), within fp32 rounding of
   the host's double sums, and a call of 0 rows refused. T 1, 33 (past the small-chunk kernel), 300
   and 1024; E 16, 72 and 256; H 256, 4096 and 7168. */
START_TEST(logits_blas_call)
{
    if (!have_gpu())
        return;
    logits_blas_case(1, 16, 256, 31u);
    logits_blas_case(33, 256, 4096, 32u);
    logits_blas_case(300, 72, 7168, 33u);
    logits_blas_case(1024, 256, 4096, 34u);
}
END_TEST

/* One chunk of quant_x8_kernel: T rows (ntok live), K distinct experts a live token (slot j of
   token t pruned when (t + j) % 7 == 6: id E), placed tokens ascending per expert at 128-aligned
   group bases; expert 1 not on the GEMM (ok 0). Every output against the host's quantization
   (dsv4_act_quant_row of the bf16 values), and every byte nobody should write still 0xA5. */
static void quant_x8_case(int T, int ntok, int H, int E, int K, int qmode, int small, int min_rows, int use_ok,
                          uint32_t seed)
{
    const int ng = (H + 127) / 128;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)T * H);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * K), *rowmap = malloc(sizeof(int32_t) * (size_t)T * K);
    int *cnt = calloc((size_t)E, sizeof(int)), *pad_off = calloc((size_t)E, sizeof(int));
    uint8_t *ok = malloc((size_t)E + 1), *codes = malloc((size_t)T * H), *xq = malloc((size_t)T * H);
    float *scales = malloc(sizeof(float) * (size_t)T * ng), *xs = malloc(sizeof(float) * (size_t)T * ng);
    float *row = malloc(sizeof(float) * (size_t)H), *out = malloc(sizeof(float) * (size_t)H);
    ck_assert(x && ids && rowmap && cnt && pad_off && ok && codes && xq && scales && xs && row && out);
    uint32_t st = seed;
    for (size_t i = 0; i < (size_t)T * H; i++) /* a few large values so groups get different scales */
        x[i] = dsv4_bf16_bits((float)((int)(dm_next(&st) % 2001) - 1000) * (i % 97 == 0 ? 0.05f : 1e-3f));
    memset(codes, 0, (size_t)T * H);
    memset(scales, 0, sizeof(float) * (size_t)T * ng);
    for (int t = 0; t < ntok; t++) {
        for (int k = 0; k < H; k++)
            row[k] = dsv4_bf16_to_f32(x[(size_t)t * H + k]);
        dsv4_act_quant_row(row, H, (dsv4_act_quant)qmode, out, codes + (size_t)t * H, scales + (size_t)t * ng);
    }
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++)
            ids[t * K + j] = (t + j) % 7 == 6 ? E : (t * 3 + j) % E; /* K <= E: distinct */
    for (int t = 0; t < ntok; t++)
        for (int j = 0; j < K; j++)
            if (ids[t * K + j] < E)
                cnt[ids[t * K + j]]++;
    int rows = 0;
    for (int e = 0; e < E; e++)
        pad_off[e] = rows, rows += (cnt[e] + 127) / 128 * 128;
    int *fill = calloc((size_t)E, sizeof(int));
    ck_assert(fill);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            const int e = ids[t * K + j];
            rowmap[t * K + j] = t < ntok && e < E ? pad_off[e] + fill[e]++ : -7;
        }
    memset(ok, 1, (size_t)E + 1);
    ok[1] = 0;
    /* before the call: k_logits_small's codes (small) or bytes the kernel must overwrite */
    float *xs_in = malloc(sizeof(float) * (size_t)T * ng);
    uint8_t *xq_in = malloc((size_t)T * H);
    ck_assert(xs_in && xq_in);
    memcpy(xq_in, codes, (size_t)T * H);
    memcpy(xs_in, scales, sizeof(float) * (size_t)T * ng);
    if (!small)
        for (int t = 0; t < ntok; t++)
            memset(xq_in + (size_t)t * H, 0x3C, (size_t)H), xs_in[(size_t)t * ng] = -1.0f;
    dsv4_test_qx8_in in = {T, ntok, H, E, K, qmode, 1, min_rows, small ? T : 0, rows, x, ids, rowmap, cnt, pad_off,
                           use_ok ? ok : NULL, xq_in, xs_in};
    uint8_t *xp = malloc((size_t)rows * H + 1);
    float *xs8 = malloc(sizeof(float) * ((size_t)rows + T) * ng);
    ck_assert(xp && xs8);
    const int rc = dsv4_test_quant_x8(&in, xq, xs, xp, xs8);
    ck_assert_msg(rc == 0, "dsv4_test_quant_x8: CUDA error %d (%s)", rc, cudaGetErrorString((cudaError_t)rc));
    long bad_q = 0, bad_p = 0, bad_s8 = 0, gathered = 0;
    for (int t = 0; t < ntok; t++)
        bad_q += memcmp(xq + (size_t)t * H, codes + (size_t)t * H, (size_t)H) != 0 ||
                 memcmp(xs + (size_t)t * ng, scales + (size_t)t * ng, sizeof(float) * (size_t)ng) != 0;
    /* every row of xp and every M-major scale: the token's where gathered, else untouched */
    uint8_t *want_p = malloc((size_t)rows * H + 1);
    float *want_s8 = malloc(sizeof(float) * ((size_t)rows + T) * ng);
    ck_assert(want_p && want_s8);
    memset(want_p, 0xA5, (size_t)rows * H + 1);
    memset(want_s8, 0xA5, sizeof(float) * ((size_t)rows + T) * ng);
    for (int t = 0; use_ok && t < ntok; t++) {
        for (int j = 0; j < K; j++) {
            const int e = ids[t * K + j];
            if (e >= E || !ok[e] || cnt[e] <= min_rows)
                continue;
            const int r = rowmap[t * K + j];
            memcpy(want_p + (size_t)r * H, codes + (size_t)t * H, (size_t)H);
            for (int g = 0; g < ng; g++)
                want_s8[(size_t)pad_off[e] * ng + (size_t)g * cnt[e] + (size_t)(r - pad_off[e])] = scales[(size_t)t * ng + g];
            gathered++;
        }
        if (ntok > min_rows)
            for (int g = 0; g < ng; g++)
                want_s8[(size_t)rows * ng + (size_t)g * ntok + t] = scales[(size_t)t * ng + g];
    }
    for (int r = 0; r < rows; r++)
        bad_p += memcmp(xp + (size_t)r * H, want_p + (size_t)r * H, (size_t)H) != 0;
    for (size_t i = 0; i < ((size_t)rows + T) * ng; i++)
        bad_s8 += memcmp(&xs8[i], &want_s8[i], sizeof(float)) != 0;
    printf("cuda_suite k_quant_x8 T %3d live %3d H %4d E %2d K %d qmode %d %s, min_rows %d%s: %ld slots gathered; "
           "%ld rows of x, %ld gathered rows, %ld M-major scales wrong\n",
           T, ntok, H, E, K, qmode, small ? "quantized before" : "quantizing", min_rows, use_ok ? "" : ", no gather",
           gathered, bad_q, bad_p, bad_s8);
    ck_assert_int_eq(bad_q, 0);
    ck_assert_int_eq(bad_p, 0);
    ck_assert_int_eq(bad_s8, 0);
    ck_assert(!use_ok || gathered > 0);
    free(x), free(ids), free(rowmap), free(cnt), free(pad_off), free(ok), free(codes), free(xq), free(scales);
    free(xs), free(row), free(out), free(fill), free(xs_in), free(xq_in), free(xp), free(xs8), free(want_p), free(want_s8);
}

/* k_quant_x8 alone (params gather=quant's kernel): x's codes and scales as the host's
   dsv4_act_quant_row gives them, each gathered row the token's codes, each large group's M-major
   scales and the shared expert's at their places, nothing else written; ue8m0 and fp32 scales,
   H 256 and 4096, K 1, 3 and 6, rows past the live tokens, groups at and past min_rows, an expert
   off the GEMM, a chunk quantized before (k_logits_small's: gathered only) and no gather (ok NULL). */
START_TEST(quant_x8_kernel)
{
    if (!have_gpu())
        return;
    quant_x8_case(40, 37, 256, 8, 3, 1, 0, 4, 1, 41u);
    quant_x8_case(300, 300, 4096, 16, 6, 1, 0, 32, 1, 42u);
    quant_x8_case(64, 50, 256, 5, 1, 2, 0, 2, 1, 43u);
    quant_x8_case(13, 13, 4096, 8, 6, 1, 1, 1, 1, 44u);
    quant_x8_case(33, 20, 384, 8, 3, 2, 0, 1, 0, 45u);
}
END_TEST

static int bf16_near(uint16_t a, uint16_t b); /* below: within one bf16 step */

/* The f16 bits of an e4m3 value (every finite e4m3 value is a normal f16 or zero). */
static uint16_t f16_of_e4m3(uint8_t c)
{
    const float v = dsv4_e4m3_to_f32(c);
    uint32_t u;
    memcpy(&u, &v, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7FFFFFFFu) == 0)
        return sign;
    return (uint16_t)(sign | ((((u >> 23) & 0xFFu) - 127u + 15u) << 10) | ((u >> 13) & 0x3FFu));
}

/* Where store_f16_codes (kernels.cuh) puts element k of a row: k_tileh's K order. */
static int f16_code_place(int k)
{
    const int base = k & ~31, p = k & 31, s2 = p >> 4, t = (p >> 2) & 3, j = k & 3;
    return base + 16 * s2 + (j < 2 ? 2 * t + j : 8 + 2 * t + j - 2);
}

/*
 * One chunk of quant8_kernel: six routed experts of 40, 3, 70, 0, 20 and 33 kept slots (placed per
 * expert, 5 rows apart), 9 slots past the kept ones, expert 2 off the GEMM (ok 0), and the shared
 * expert's Tc tokens (ntok live) after the routed rows. Large groups (more than min_rows rows of an
 * ok expert) get h from the GEMM's g and u: their codes, K-major and M-major scales as the host
 * quantizes the device's own SwiGLU of those rows (dsv4_act_quant_row of k_swiglu_ref's h, itself
 * within a bf16 step of the host's SwiGLU), the clamp counts the host's; every other live row is
 * quantized from its bf16 h (NaN, -NaN and Inf among them), its h replaced by the f16 copies of its
 * codes when f16_codes; with skip_direct the routed rows of groups above FM_MID_MAX that are not
 * large are left alone; every byte nobody should write keeps its 0xA5 (h: its input).
 */
static void quant8_case(int lean, int I, int qmode, int f16_codes, int before, int clamp_r, int clamp_s, float L,
                        int has_shared, int Tc, int ntok, int min_rows, int ok_shared, int skip_direct, uint32_t seed)
{
    enum { E = 6, EXTRA = 9, MID_MAX = 64 };
    static const int cnt[E] = {40, 3, 70, 0, 20, 33};
    const int ng = I / 128;
    int pad_off[E], kept = 0, R = 2;
    for (int e = 0; e < E; e++)
        pad_off[e] = R, R += cnt[e] + 5, kept += cnt[e];
    const int slots = kept + EXTRA;
    const long long hrows = R + Tc, nh = hrows * I;
    uint8_t ok[E + 1] = {1, 1, 0, 1, 1, 1, (uint8_t)ok_shared};
    int32_t *slot_row = malloc(sizeof(int32_t) * (slots + 1)), *slot_tok = malloc(sizeof(int32_t) * (slots + 1));
    int32_t *slot_e = malloc(sizeof(int32_t) * (slots + 1));
    float *slot_w = malloc(sizeof(float) * (slots + 1)), *row_w = malloc(sizeof(float) * hrows);
    uint8_t *row_clamp = calloc((size_t)hrows, 1), *q = malloc((size_t)nh), *wq = malloc((size_t)I);
    int *row_kind = malloc(sizeof(int) * hrows); /* 0 nobody's, 1 quantized from h, 2 large, 3 skipped */
    long long *row_r0 = calloc((size_t)hrows, sizeof(long long));
    int *row_m = calloc((size_t)hrows, sizeof(int)), *row_idx = calloc((size_t)hrows, sizeof(int));
    int *row_shared = calloc((size_t)hrows, sizeof(int));
    uint16_t *gu8 = malloc(sizeof(uint16_t) * 2 * nh), *h_in = malloc(sizeof(uint16_t) * nh);
    uint16_t *h = malloc(sizeof(uint16_t) * nh), *h_ref = malloc(sizeof(uint16_t) * nh);
    float *sk = malloc(sizeof(float) * hrows * ng), *s8 = malloc(sizeof(float) * hrows * ng);
    float *want_s8 = malloc(sizeof(float) * hrows * ng), *row = malloc(sizeof(float) * I);
    float *out = malloc(sizeof(float) * I), ws[8];
    ck_assert(slot_row && slot_tok && slot_e && slot_w && row_w && row_clamp && q && wq && row_kind && row_r0 &&
              row_m && row_idx && row_shared && gu8 && h_in && h && h_ref && sk && s8 && want_s8 && row && out);
    ck_assert(ng <= 8);
    uint32_t st = seed;
    for (long long i = 0; i < 2 * nh; i++)
        gu8[i] = dsv4_bf16_bits((float)((int)(dm_next(&st) % 2001) - 1000) * (i % 53 == 0 ? 0.014f : 0.004f));
    for (long long i = 0; i < nh; i++)
        h_in[i] = dsv4_bf16_bits((float)((int)(dm_next(&st) % 2001) - 1000) * (i % 89 == 0 ? 0.01f : 1e-3f));
    for (long long r = 0; r < hrows; r++)
        row_kind[r] = 0, row_w[r] = 1.0f;
    int b = 0;
    for (int e = 0; e < E; e++)
        for (int j = 0; j < cnt[e]; j++, b++) {
            const long long r = pad_off[e] + j;
            slot_row[b] = (int32_t)r, slot_e[b] = e, slot_tok[b] = (7 * b + 3) % (Tc > 0 ? Tc : 1);
            slot_w[b] = 0.25f * (float)(2 + b % 5);
            const int large = ok[e] && cnt[e] > min_rows;
            row_kind[r] = large ? 2 : skip_direct && cnt[e] > MID_MAX ? 3 : 1;
            row_w[r] = before ? slot_w[b] : 1.0f;
            row_clamp[r] = (uint8_t)clamp_r;
            row_r0[r] = pad_off[e], row_m[r] = cnt[e], row_idx[r] = j;
        }
    for (; b < slots; b++) /* past the kept slots: never read */
        slot_row[b] = -1, slot_e[b] = E + 7, slot_tok[b] = -1, slot_w[b] = 9.0f;
    for (int t = 0; has_shared && t < ntok; t++) {
        const long long r = R + t;
        row_kind[r] = ok[E] && ntok > min_rows ? 2 : 1;
        row_clamp[r] = (uint8_t)clamp_s, row_shared[r] = 1;
        row_r0[r] = R, row_m[r] = ntok, row_idx[r] = t;
    }
    /* NaN, -NaN and Inf in rows quantized from their h */
    for (long long r = 0, n = 0; r < hrows && n < 3; r++)
        if (row_kind[r] == 1)
            h_in[r * I + 5 + 40 * n] = n == 0 ? 0x7FC1u : n == 1 ? 0xFFC0u : 0x7F80u, n++;
    const dsv4_test_q8_in in = {I, qmode, f16_codes, before, clamp_r, clamp_s, L, E, slots, kept, Tc, ntok, has_shared,
                                min_rows, skip_direct, lean, R, hrows, slot_row, slot_tok, slot_e, cnt, pad_off, ok,
                                slot_w, gu8, h_in};
    unsigned long long cl[4];
    const int rc = dsv4_test_quant8(&in, row_w, row_clamp, q, sk, s8, h, h_ref, cl);
    ck_assert_msg(rc == 0, "dsv4_test_quant8: CUDA error %d (%s)", rc, cudaGetErrorString((cudaError_t)rc));
    unsigned long long hc[4] = {0, 0, 0, 0};
    long bad_q = 0, bad_s = 0, bad_h = 0, bad_ref = 0, bad_s8 = 0, large = 0, plain = 0;
    memset(want_s8, 0xA5, sizeof(float) * hrows * ng);
    for (long long r = 0; r < hrows; r++) {
        const int kind = row_kind[r];
        const uint16_t *src = kind == 2 ? h_ref + r * I : h_in + r * I;
        if (kind == 2) {
            large++;
            for (int k = 0; k < I; k++) { /* k_swiglu_ref against the host's SwiGLU */
                float gv = dsv4_round_bf16(dsv4_bf16_to_f32(gu8[r * 2 * I + k]));
                float uv = dsv4_round_bf16(dsv4_bf16_to_f32(gu8[r * 2 * I + I + k]));
                uint64_t gc = 0, uc = 0;
                if (row_clamp[r] && L > 0.0f)
                    dsv4_swiglu_clamp(&gv, &uv, L, &gc, &uc);
                hc[row_shared[r] ? 2 : 0] += gc, hc[row_shared[r] ? 3 : 1] += uc;
                float hv = gv / (1.0f + expf(-gv)) * uv;
                if (row_w[r] != 1.0f)
                    hv *= row_w[r];
                bad_ref += !bf16_near(h_ref[r * I + k], dsv4_bf16_bits(hv));
            }
        }
        plain += kind == 1;
        if (kind == 1 || kind == 2) {
            for (int k = 0; k < I; k++)
                row[k] = dsv4_bf16_to_f32(src[k]);
            dsv4_act_quant_row(row, I, (dsv4_act_quant)qmode, out, wq, ws);
            bad_q += memcmp(q + r * I, wq, (size_t)I) != 0;
            bad_s += memcmp(sk + r * ng, ws, sizeof(float) * ng) != 0;
            if (kind == 2)
                for (int g = 0; g < ng; g++)
                    want_s8[row_r0[r] * ng + (long long)g * row_m[r] + row_idx[r]] = ws[g];
            for (int k = 0; k < I; k++) {
                const uint16_t want = kind == 1 && f16_codes ? f16_of_e4m3(wq[k]) : h_in[r * I + k];
                const uint16_t got = h[r * I + (kind == 1 && f16_codes ? f16_code_place(k) : k)];
                const int nan = (wq[k] & 0x7Fu) == 0x7Fu && (got & 0x7C00u) == 0x7C00u && (got & 0x3FFu);
                bad_h += got != want && !(kind == 1 && f16_codes && nan);
            }
        } else {
            for (long long i = r * I; i < (r + 1) * I; i++)
                bad_q += q[i] != 0xA5u, bad_h += h[i] != h_in[i];
            for (int g = 0; g < ng; g++) {
                uint32_t u;
                memcpy(&u, &sk[r * ng + g], 4);
                bad_s += u != 0xA5A5A5A5u;
            }
        }
    }
    for (long long i = 0; i < hrows * ng; i++)
        bad_s8 += memcmp(&s8[i], &want_s8[i], sizeof(float)) != 0;
    printf("cuda_suite k_quant8%s I %d qmode %d f16 %d before %d clamp %d/%d L %g shared %d (%d of %d) min_rows %d "
           "ok_shared %d skip %d: %ld large rows, %ld from h; wrong: %ld codes, %ld scales, %ld M-major scales, %ld "
           "h, %ld reference h; clamps %llu %llu %llu %llu\n",
           lean ? " lean" : "", I, qmode, f16_codes, before, clamp_r, clamp_s, (double)L, has_shared, ntok, Tc, min_rows, ok_shared,
           skip_direct, large, plain, bad_q, bad_s, bad_s8, bad_h, bad_ref, cl[0], cl[1], cl[2], cl[3]);
    ck_assert_int_eq(bad_ref, 0);
    ck_assert_int_eq(bad_q, 0);
    ck_assert_int_eq(bad_s, 0);
    ck_assert_int_eq(bad_s8, 0);
    ck_assert_int_eq(bad_h, 0);
    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(cl[i], hc[i]);
    ck_assert(large > 0 && plain > 0);
    free(slot_row), free(slot_tok), free(slot_e), free(slot_w), free(row_w), free(row_clamp), free(q), free(wq);
    free(row_kind), free(row_r0), free(row_m), free(row_idx), free(row_shared), free(gu8), free(h_in), free(h);
    free(h_ref), free(sk), free(s8), free(want_s8), free(row), free(out);
}

/* k_quant8 alone (the gemm fp8 mode's SwiGLU and quantization of h, fast/cuda/quant8.cu): quant8_case
   with ue8m0 and fp32 scales, I 256 and 384 (half of a 256-wide chunk past the row), the weight
   before and after w2, the clamp on both sides, on one, and off (L 0), the shared expert large, not
   large (ok 0; its rows at most min_rows), and absent, rows past the live tokens, f16 copies of the
   codes, and params direct=q64's launch (routed rows of groups above 64 rows left to k_tile8); each
   case on params quant8=lean's kernel (the default) and on quant8=std's, both against the same
   host values. */
START_TEST(quant8_kernel)
{
    if (!have_gpu())
        return;
    for (int lean = 0; lean < 2; lean++) {
        quant8_case(lean, 256, 1, 0, 1, 1, 1, 10.0f, 1, 48, 45, 32, 1, 0, 51u);
        quant8_case(lean, 384, 2, 0, 0, 1, 0, 10.0f, 1, 40, 40, 16, 1, 0, 52u);
        quant8_case(lean, 256, 1, 1, 1, 0, 1, 10.0f, 1, 30, 20, 32, 0, 0, 53u);
        quant8_case(lean, 384, 1, 1, 1, 1, 1, 0.0f, 0, 8, 8, 32, 1, 0, 54u);
        quant8_case(lean, 256, 2, 0, 1, 1, 1, 10.0f, 1, 70, 66, 32, 1, 1, 55u);
    }
}
END_TEST

/* k_tile8's weight conversion (params direct=, fast/cuda/mma_tile8.cuh) against the host's
   formats: each lane's e4m3 code of element i of k32 step c is the code of e2m1 v 2^(sc - max s + 6)
   (the 1x128 conversion of dsv4_fp4_to_e4m3_blocks, include/dsv4moe/formats.h: fragment.h's byte
   is the code of v 2^-6), its rows' scales 2^(max s - 133); random bytes (each is two nibbles) and
   scale rows of every spread 0 .. DSV4_FP4_TO_FP8_SPREAD, at both ends of the scale range (0 and
   DSV4_FN_FP4_SCALE_MAX). fp8 chunks: the stored codes in wgmma's register order, the stored block
   scales. */
START_TEST(tile8_conversion)
{
    if (!have_gpu())
        return;
    enum { N = 60 };
    uint8_t *ch = malloc((size_t)N * DSV4_FN_FP8_CHUNK), *sc = malloc((size_t)N * DSV4_FN_FP4_SCHUNK);
    uint32_t *af = malloc((size_t)N * 32 * 16 * 4);
    float *w = malloc((size_t)N * 32 * 2 * 4);
    ck_assert(ch && sc && af && w);
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < (size_t)N * DSV4_FN_FP8_CHUNK; i++)
        ch[i] = (uint8_t)rs_rand(&r);
    for (int n = 0; n < N; n++)
        for (int row = 0; row < 16; row++) { /* row = 2 gid + h: the scale chunk's [gid][h][c] */
            const int spread = (n * 16 + row) % (DSV4_FP4_TO_FP8_SPREAD + 1);
            const int top = n % 3 == 0 ? DSV4_FN_FP4_SCALE_MAX : n % 3 == 1 ? spread : spread + (int)(rs_rand(&r) % 200);
            uint8_t *s4 = sc + n * DSV4_FN_FP4_SCHUNK + row * 4;
            for (int c = 0; c < 4; c++)
                s4[c] = (uint8_t)(dsv4_fn_fp4_scale_store((uint32_t)(top - (int)(rs_rand(&r) % (spread + 1)))));
            s4[rs_rand(&r) % 4] = (uint8_t)dsv4_fn_fp4_scale_store((uint32_t)top);
            s4[(n + row) % 4] = (uint8_t)dsv4_fn_fp4_scale_store((uint32_t)(top - spread));
        }
    ck_assert_int_eq(dsv4_test_tile8_frags(1, N, ch, sc, af, w), 0);
    int64_t bad = 0, bad_w = 0, checked = 0;
    for (int n = 0; n < N; n++)
        for (int lane = 0; lane < 32; lane++) {
            const int gid = lane >> 2;
            for (int h = 0; h < 2; h++) {
                const uint8_t *s4 = sc + n * DSV4_FN_FP4_SCHUNK + gid * 8 + h * 4;
                int m = 0;
                for (int c = 0; c < 4; c++)
                    m = s4[c] > m ? s4[c] : m;
                bad_w += w[((size_t)n * 32 + lane) * 2 + h] != ldexpf(1.0f, m - 139);
                for (int c = 0; c < 4; c++) {
                    uint32_t x;
                    memcpy(&x, ch + (size_t)n * DSV4_FN_FP4_CHUNK + h * 512 + lane * 16 + c * 4, 4);
                    for (int run = 0; run < 2; run++) {
                        const uint32_t codes = run ? dsv4_fn_hi(x) : dsv4_fn_lo(x);
                        const uint32_t got = af[((size_t)n * 32 + lane) * 16 + 4 * c + 2 * run + h];
                        for (int i = 0; i < 4; i++) {
                            const float v = ldexpf(dsv4_e4m3_to_f32((uint8_t)(codes >> (8 * i))), s4[c] - m + 12);
                            const uint8_t want = dsv4_f32_to_e4m3(v), have = (uint8_t)(got >> (8 * i));
                            bad += want != have;
                            checked++;
                            /* exact: the code's value is v itself */
                            bad += dsv4_e4m3_to_f32(have) != v;
                        }
                    }
                }
            }
        }
    printf("cuda_suite k_tile8 conversion: %lld fp4 codes, %lld wrong, %lld row scales wrong\n", (long long)checked,
           (long long)bad, (long long)bad_w);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(bad_w, 0);
    /* fp8: planes [2 h + c / 2][lane][step c's 8 bytes (run A, run B), step c + 1's], scales [h] fp32 */
    for (int n = 0; n < N; n++) {
        float *fs = (float *)(void *)(sc + n * DSV4_FN_FP8_SCHUNK);
        fs[0] = ldexpf(1.0f, n - 30), fs[1] = ldexpf(1.5f, 7 - n);
    }
    float *sc8 = malloc((size_t)N * DSV4_FN_FP8_SCHUNK);
    ck_assert(sc8);
    for (int n = 0; n < N; n++)
        memcpy((uint8_t *)sc8 + n * DSV4_FN_FP8_SCHUNK, sc + n * DSV4_FN_FP8_SCHUNK, DSV4_FN_FP8_SCHUNK);
    ck_assert_int_eq(dsv4_test_tile8_frags(0, N, ch, (const uint8_t *)sc8, af, w), 0);
    bad = 0;
    for (int n = 0; n < N; n++)
        for (int lane = 0; lane < 32; lane++)
            for (int c = 0; c < 4; c++)
                for (int reg = 0; reg < 4; reg++) {
                    const int h = reg & 1, run = reg >> 1;
                    uint32_t want;
                    memcpy(&want, ch + (size_t)n * DSV4_FN_FP8_CHUNK + (2 * h + c / 2) * 512 + lane * 16 + (c & 1) * 8 + run * 4, 4);
                    bad += af[((size_t)n * 32 + lane) * 16 + 4 * c + reg] != want;
                }
    for (int n = 0; n < N; n++)
        for (int lane = 0; lane < 32; lane++)
            for (int h = 0; h < 2; h++)
                bad += memcmp(&w[((size_t)n * 32 + lane) * 2 + h], (uint8_t *)sc8 + n * DSV4_FN_FP8_SCHUNK + h * 4, 4) != 0;
    ck_assert_int_eq(bad, 0);
    free(ch), free(sc), free(sc8), free(af), free(w);
}
END_TEST

/* params quant=down's quantization of a decode group's h rows in a block's shared memory
   (dec_qin.cuh, dec_quant_rows; dec_qin_hw.cu runs it in one block) against the host's quantizer
   (dsv4_act_quant_row): every code and scale bit for bit, on 1 to 8 rows of 128 to 2048 features,
   both scale modes, with a NaN, -NaN, Inf and -Inf, a group of zeros and a group of tiny values. */
START_TEST(dec_qin_kernel)
{
    static const int cs[][3] = {{1, 2048, 1}, {8, 2048, 1}, {3, 256, 2}, {8, 384, 2}, {5, 128, 1}, {2, 1024, 2}};
    uint32_t st = 71u;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const int n = cs[ci][0], K = cs[ci][1], qmode = cs[ci][2], ng = K / 128;
        uint16_t *h = malloc(sizeof(uint16_t) * n * K);
        uint8_t *codes = malloc((size_t)n * K), *want = malloc((size_t)K);
        float *sc = malloc(sizeof(float) * n * ng), *row = malloc(sizeof(float) * K), *out = malloc(sizeof(float) * K);
        float *ws = malloc(sizeof(float) * ng);
        ck_assert(h && codes && want && sc && row && out && ws);
        for (int i = 0; i < n * K; i++)
            h[i] = dsv4_bf16_bits((float)((int)(dm_next(&st) % 2001) - 1000) * (i % 61 == 0 ? 0.5f : 2e-3f));
        for (int k = 0; k < 128; k++) /* the last row's first group: zeros; its last group: tiny values */
            h[(size_t)(n - 1) * K + k] = 0, h[(size_t)(n - 1) * K + K - 128 + k] = dsv4_bf16_bits(1e-7f * (float)(k - 64));
        if (K >= 256) { /* specials in the first row's second group */
            h[130] = 0x7FC0u, h[131] = 0xFFC0u, h[140] = 0x7F80u, h[141] = 0xFF80u;
        }
        const int rc = dsv4_test_dec_qin(h, n, K, qmode, codes, sc);
        ck_assert_msg(rc == 0, "dsv4_test_dec_qin: CUDA error %d (%s)", rc, cudaGetErrorString((cudaError_t)rc));
        int bad_c = 0, bad_s = 0;
        for (int r = 0; r < n; r++) {
            for (int k = 0; k < K; k++)
                row[k] = dsv4_bf16_to_f32(h[(size_t)r * K + k]);
            dsv4_act_quant_row(row, K, (dsv4_act_quant)qmode, out, want, ws);
            for (int k = 0; k < K; k++)
                bad_c += codes[(size_t)r * K + k] != want[k];
            for (int g = 0; g < ng; g++)
                bad_s += memcmp(&sc[r * ng + g], &ws[g], 4) != 0;
        }
        printf("cuda_suite dec_quant_rows n %d K %d qmode %d: %d codes, %d scales differ\n", n, K, qmode, bad_c, bad_s);
        ck_assert_int_eq(bad_c, 0);
        ck_assert_int_eq(bad_s, 0);
        free(h), free(codes), free(want), free(sc), free(row), free(out), free(ws);
    }
}
END_TEST

/* One bf16 step apart or less (the same sign; a zero of either sign is zero). */
static int bf16_near(uint16_t a, uint16_t b)
{
    if ((a & 0x7FFFu) == 0 && (b & 0x7FFFu) == 0)
        return 1;
    if ((a ^ b) & 0x8000u)
        return 0;
    return abs((int)(a & 0x7FFFu) - (int)(b & 0x7FFFu)) <= 1;
}

/*
 * One k_tile8 launch (tile8_hw.h) on E = 4 fp4 routed experts of cnt[e] rows and the fp8 shared
 * expert's ntok rows (N 512, K 512, dm_ops' values), every group in tiles of 32 rows (big 0) or of
 * variant v's (big 1: 1 b128, 2 b64, 3 q64); rows no group owns between the groups, which gate/up
 * reads gathered (a slot's A row from slot_tok, as the fast path). gu 0: every
 * output the exact sum, one bf16 rounding (dm_ops' values sum exactly on the tensor cores too); gu
 * 1: h as SPEC.md section 4 makes it from the bf16 exact g and u (clamp at L = 10, counted, silu in
 * fp32, router weight before w2 when `before`, bf16), within one bf16 step (the host's expf is
 * not the device's), and the clamp counts the host's. h (gu, not q64) and, for q64's gate/up, hq
 * and hs get the device's outputs, routed rows then the shared expert's, when not NULL.
 */
static void tile8_case(int big, int v, int gu, int before, const int cnt[4], int ntok, int qmode, uint32_t seed,
                       uint16_t *h, uint8_t *hq, float *hs)
{
    static const char *const vname[] = {"mid", "b128", "b64", "q64"};
    enum { E = 4, N = 512, K = 512, I = N / 2 };
    const float L = 10.0f;
    int pad_off[E], slot_off[E + 1], rows = 1;
    slot_off[0] = 0;
    for (int e = 0; e < E; e++) {
        pad_off[e] = rows;
        rows += cnt[e] + 3;
        slot_off[e + 1] = slot_off[e] + cnt[e];
    }
    const int slots = slot_off[E];
    dm_ops m;
    dm_ops_make(&m, E, N, K, rows, ntok, seed);
    const int cols = gu ? I : N, q = big && v == 3 && gu;
    float *slot_w = malloc(sizeof(float) * (slots + 1));
    uint16_t *out = malloc(sizeof(uint16_t) * rows * cols), *out_sh = malloc(sizeof(uint16_t) * (ntok * cols + 1));
    uint8_t *dq = malloc((size_t)(rows + ntok) * I);
    float *ds = malloc(sizeof(float) * (rows + ntok) * (I / 128));
    ck_assert(slot_w && out && out_sh && dq && ds);
    for (int i = 0; i < slots; i++)
        slot_w[i] = 0.25f * (float)(2 + i % 5);
    for (int i = 0; i < rows * cols; i++)
        out[i] = 0xFFFFu;
    for (int i = 0; i < ntok * cols; i++)
        out_sh[i] = 0xFFFFu;
    memset(dq, 0xA5, (size_t)(rows + ntok) * I);
    for (int i = 0; i < (rows + ntok) * (I / 128); i++)
        ds[i] = -1.0f;
    /* gate/up reads its rows gathered, as the fast path does (slot j of a group: A row slot_tok[j],
       repeats allowed); the down projection by padded row */
    int32_t *slot_tok = malloc(sizeof(int32_t) * (slots + 1));
    ck_assert(slot_tok);
    for (int i = 0; i < slots; i++)
        slot_tok[i] = (int32_t)((7 * i + 3) % rows);
    const dsv4_test_tile8_in in = {dm_in(&m, cnt, pad_off, 1, 1), gu, slot_w, before, gu ? L : 0.0f, qmode,
                                   gu ? slot_tok : NULL};
    unsigned long long cl[4];
    const int rc = dsv4_test_tile8_run(&in, big, v, out, out_sh, dq, ds, cl);
    ck_assert_msg(rc == 0, "k_tile8 %s: CUDA error %d (%s)", vname[big ? v : 0], rc, cudaGetErrorString((cudaError_t)rc));
    long bad = 0, last_bit = 0, checked = 0, untouched = 0;
    unsigned long long hc[4] = {0, 0, 0, 0};
    for (int g = 0; g <= E; g++) {
        const int n = g < E ? cnt[g] : ntok;
        for (int j = 0; j < n; j++) {
            const long orow = g < E ? pad_off[g] + j : j;
            const long arow = g < E && gu ? slot_tok[slot_off[g] + j] : orow;
            const uint16_t *o = (g < E ? out : out_sh) + orow * cols;
            for (int c = 0; c < cols; c++) {
                uint16_t want;
                if (!gu) {
                    want = dsv4_bf16_bits((float)dm_sum(&m, g, arow, c));
                } else {
                    const int rg = (c / 8) * 16 + c % 8;
                    float gv = dsv4_round_bf16((float)dm_sum(&m, g, arow, rg));
                    float uv = dsv4_round_bf16((float)dm_sum(&m, g, arow, rg + 8));
                    uint64_t gc = 0, uc = 0;
                    dsv4_swiglu_clamp(&gv, &uv, L, &gc, &uc);
                    hc[g < E ? 0 : 2] += gc, hc[g < E ? 1 : 3] += uc;
                    float hv = gv / (1.0f + expf(-gv)) * uv;
                    if (g < E && before)
                        hv *= slot_w[slot_off[g] + j];
                    want = dsv4_bf16_bits(hv);
                }
                if (q) { /* q64 writes no h: the codes are checked by the caller */
                    untouched += o[c] != 0xFFFFu;
                    continue;
                }
                if (h)
                    h[(g < E ? orow : rows + orow) * cols + c] = o[c];
                const int same = o[c] == want || ((o[c] & 0x7FFFu) == 0 && (want & 0x7FFFu) == 0);
                last_bit += !same && bf16_near(o[c], want);
                if (!same && (!gu || !bf16_near(o[c], want)) && bad++ < 5)
                    fprintf(stderr, "k_tile8 %s gu %d group %d row %d col %d: got 0x%04x want 0x%04x\n",
                            vname[big ? v : 0], gu, g, j, c, o[c], want);
                checked++;
            }
        }
    }
    untouched += dm_untouched(out, rows, cols, E, cnt, pad_off);
    if (hq)
        memcpy(hq, dq, (size_t)(rows + ntok) * I);
    if (hs)
        memcpy(hs, ds, sizeof(float) * (rows + ntok) * (I / 128));
    printf("cuda_suite k_tile8 %-4s gu %d rows %3d %3d %3d %3d + shared %3d: %ld outputs as expected (%ld a bf16 step "
           "off; q64's codes below), clamps %llu %llu %llu %llu, %ld written outside\n",
           vname[big ? v : 0], gu, cnt[0], cnt[1], cnt[2], cnt[3], ntok, checked - bad, last_bit, cl[0], cl[1], cl[2],
           cl[3], untouched);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(untouched, 0);
    if (gu)
        for (int i = 0; i < 4; i++)
            ck_assert_uint_eq(cl[i], hc[i]);
    dm_ops_free(&m);
    free(slot_w), free(slot_tok), free(out), free(out_sh), free(dq), free(ds);
}

/* q64's gate/up (h quantized in its epilogue) against b64's h quantized on the host
   (dsv4_act_quant_row in qmode): every code and scale of every group's rows the same; the bytes
   of rows no group owns untouched. */
static void tile8_q64_case(int before, const int cnt[4], int ntok, int qmode, uint32_t seed)
{
    enum { I = 256, NGI = I / 128 };
    int rows = 1;
    for (int e = 0; e < 4; e++)
        rows += cnt[e] + 3;
    const int hrows = rows + ntok;
    uint16_t *h = malloc(sizeof(uint16_t) * hrows * I);
    uint8_t *hq = malloc((size_t)hrows * I), *want = malloc(I);
    float *hs = malloc(sizeof(float) * hrows * NGI), hv[I], out[I], ws[NGI];
    ck_assert(h && hq && hs && want);
    for (int i = 0; i < hrows * I; i++)
        h[i] = 0xFFFFu;
    tile8_case(1, 2, 1, before, cnt, ntok, qmode, seed, h, NULL, NULL);
    tile8_case(1, 3, 1, before, cnt, ntok, qmode, seed, NULL, hq, hs);
    long bad = 0, rows_q = 0, untouched = 0;
    for (int r = 0; r < hrows; r++) {
        if (h[(long)r * I] == 0xFFFFu) { /* no group's row: untouched */
            for (int c = 0; c < I; c++)
                untouched += hq[(long)r * I + c] != 0xA5;
            continue;
        }
        for (int c = 0; c < I; c++)
            hv[c] = dsv4_bf16_to_f32(h[(long)r * I + c]);
        dsv4_act_quant_row(hv, I, (dsv4_act_quant)qmode, out, want, ws);
        for (int c = 0; c < I; c++)
            if (hq[(long)r * I + c] != want[c] && bad++ < 5)
                fprintf(stderr, "q64 row %d col %d: code 0x%02x want 0x%02x\n", r, c, hq[(long)r * I + c], want[c]);
        for (int b = 0; b < NGI; b++)
            if (hs[(long)r * NGI + b] != ws[b] && bad++ < 5)
                fprintf(stderr, "q64 row %d group %d: scale %g want %g\n", r, b, hs[(long)r * NGI + b], ws[b]);
        rows_q++;
    }
    printf("cuda_suite k_tile8 q64 quantization (mode %d): %ld rows as b64's h quantized by the host (%ld differ), "
           "%ld bytes written outside\n", qmode, rows_q, bad, untouched);
    ck_assert_int_gt(rows_q, 0);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(untouched, 0);
    free(h), free(hq), free(hs), free(want);
}

/* k_tile8 (params direct=) alone through its launcher: fp4 routed groups of 1 to 300 rows (partial
   last tiles, an empty group skipped) and the fp8 shared expert's group, on the mid-size kernel
   (32-row tiles) and the large groups' variants; the plain projection against the exact sums, the
   gate/up's SwiGLU epilogue against the host's, q64's fused quantization of h against the host's
   quantization of b64's h (ue8m0 and fp32 scales). */
START_TEST(tile8_kernel)
{
    static const int c_mid[4] = {40, 17, 0, 65}, c_big[4] = {130, 1, 0, 257}, c_gu[4] = {70, 20, 0, 129};
    if (!have_gpu())
        return;
    tile8_case(0, 1, 0, 0, c_mid, 33, 1, 41u, NULL, NULL, NULL);
    tile8_case(1, 1, 0, 0, c_big, 129, 1, 42u, NULL, NULL, NULL);
    tile8_case(1, 2, 0, 0, c_big, 129, 1, 43u, NULL, NULL, NULL);
    tile8_case(0, 1, 1, 1, c_mid, 20, 1, 44u, NULL, NULL, NULL);
    tile8_case(1, 1, 1, 0, c_gu, 65, 1, 45u, NULL, NULL, NULL);
    tile8_q64_case(1, c_gu, 65, 1, 46u);
    tile8_q64_case(0, c_big, 33, 2, 47u);
}
END_TEST

/* k_route_small alone (params route=one's kernel) on small shapes: logits of exact sums bit for bit,
   the reference's selection and weights (dsv4_route_select on scores from the same formulas), its
   kept counts, and k_count2's counts, offsets, active list, tile lists and placement of its own
   ids; the ticket back at 0. T 1, 5, 8, 13 and 32 (groups past 16 rows: mid tiles), E 16 and 72
   (an odd expert pair), K 1, 4 and 6, both elementwise scores, with and without bias. */
START_TEST(route_small_kernel)
{
    if (!have_gpu())
        return;
    route_small_case(16, 4, 256, 1, 0, 1, 1);
    route_small_case(16, 4, 256, 5, 1, 0, 2);
    route_small_case(16, 4, 256, 8, 0, 1, 3);
    route_small_case(16, 4, 256, 13, 0, 0, 4);
    route_small_case(16, 4, 256, 32, 0, 1, 5);
    route_small_case(72, 6, 512, 32, 1, 1, 6);
    route_small_case(72, 1, 128, 9, 0, 1, 7);
}
END_TEST

/* tests/cuda/e4m3_hw.cu */
int dsv4_test_e4m3_hw(unsigned long long *bad, unsigned *first, uint8_t *sample, unsigned stride, unsigned nsample);

/* The quantizers' hardware e4m3 conversion gives core/formats.c's codes: on the device against its
   integer copy for all 2^32 inputs, and a sample of 2^20 against the host's dsv4_f32_to_e4m3. */
START_TEST(e4m3_hardware_encode)
{
    if (!have_gpu())
        return;
    enum { STRIDE = 4096, NS = (int)((1ull << 32) / STRIDE) };
    uint8_t *sample = malloc(NS);
    ck_assert_ptr_nonnull(sample);
    unsigned long long bad = 0;
    unsigned first = 0;
    ck_assert_int_eq(dsv4_test_e4m3_hw(&bad, &first, sample, STRIDE, NS), 0);
    ck_assert_msg(bad == 0, "%llu inputs encode differently, the first 0x%08x", bad, first);
    int64_t host_bad = 0;
    for (uint64_t i = 0; i < NS; i++) {
        uint32_t u = (uint32_t)(i * STRIDE);
        float f;
        memcpy(&f, &u, 4);
        host_bad += sample[i] != dsv4_f32_to_e4m3(f);
    }
    printf("cuda_suite e4m3 hardware conversion: 2^32 inputs against the device's integer algorithm, %llu differ; "
           "%d sampled against the host's, %lld differ\n", bad, NS, (long long)host_bad);
    ck_assert_int_eq(host_bad, 0);
    free(sample);
}
END_TEST

/* tests/cuda/e4m3_hw.cu */
int dsv4_test_bf16_hw(unsigned long long *bad, unsigned *first);

/* params quant8=lean's bf16 rounding of h (f2bf16_hw: the hardware conversion, the host's NaN) gives
   dsv4_bf16_bits's bits for all 2^32 inputs, on the device. */
START_TEST(bf16_hardware_round)
{
    if (!have_gpu())
        return;
    unsigned long long bad = 0;
    unsigned first = 0;
    ck_assert_int_eq(dsv4_test_bf16_hw(&bad, &first), 0);
    printf("cuda_suite bf16 hardware rounding: 2^32 inputs against dsv4_bf16_bits, %llu differ\n", bad);
    ck_assert_msg(bad == 0, "%llu inputs round differently, the first 0x%08x", bad, first);
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
static void dev_fetch(const dsv4_config *c, int64_t T, const dev_io *d, bo_out *r)
{
    const size_t H = (size_t)c->dim, K = (size_t)c->n_activated, t = (size_t)T;
    bo_alloc(c, T, r);
    ck_assert(cudaMemcpy(r->y, d->y, t * H * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(cudaMemcpy(r->ids, d->ti, t * K * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(cudaMemcpy(r->w, d->tw, t * K * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(cudaMemcpy(r->kept, d->kept, t * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
}

/* Rows [0, n) of a and b are equal bit for bit (all four outputs). */
static void same_rows(const dsv4_config *c, const bo_out *a, const bo_out *b, int64_t n, const char *what)
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
    bo_case k = {"device", preset, layer, T, 0, -1, -1, -1, 0, graph, 0, 0};
    dsv4_config c = bo_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    bo_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    dsv4_plan *p = bo_plan(&c, DSV4_BACKEND_CUDA, 0, graph);
    dsv4_backend *b = NULL;
    dsv4_error e;
    ck_assert_msg(create_env(p, ck, 2, &b, &e) == DSV4_OK, "%s", e.message);
    bo_out h, d;
    bo_alloc(&c, T, &h);
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
    bo_free(&h);
    bo_free(&d);
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
    bo_case k = {"embed", preset, layer, T, 0, -1, -1, -1, 0, 0, 0, fp8};
    dsv4_config c = bo_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    bo_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    const int64_t H = c.dim;
    dsv4_plan *p = bo_plan(&c, DSV4_BACKEND_CUDA, 0, 0);
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
    bo_out rr, re, rc, ra, rp, rv;
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
        bo_alloc(&c, T, &ra);
        ck_assert(cudaMemcpy(ra.y, after, (size_t)(T * H) * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
        ck_assert_msg(memcmp(ra.y, rr.y, (size_t)(T * H) * 2) == 0, "the caller's copy after the layer differs");
        bo_free(&rc);
        bo_free(&ra);
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
    bo_free(&rr), bo_free(&re), bo_free(&rp), bo_free(&rv);
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
    bo_case ka = {"ws a", "mini", 1, T, 0, -1, -1, -1, 0, 0, 0, 0};
    bo_case kb = {"ws b", "mini", 0, T, 0, -1, -1, -1, 0, 0, 0, 0};
    dsv4_config ca = bo_config(&ka), cb = bo_config(&kb);
    dsv4_checkpoint *cka = NULL, *ckb = NULL;
    dsv4_st_file *ina = NULL, *inb = NULL;
    bo_data(&ka, &ca, &cka, &ina);
    bo_data(&kb, &cb, &ckb, &inb);
    const uint16_t *x = dsv4_st_find(ina, "x")->data;
    const int32_t *ids = dsv4_st_find(inb, "input_ids")->data;
    dsv4_plan *pa = bo_plan(&ca, DSV4_BACKEND_CUDA, 0, 0), *pb = bo_plan(&cb, DSV4_BACKEND_CUDA, 0, 0);
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
    bo_out ea, eb, ga, gb;
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
    const char *badk[][2] = {{"fp8_cut=8", "fp8_cut"},        {"fp8_cut=65", "fp8_cut"},  {"fp8_cut=3x", "fp8_cut"},
                             {"tileh=s256", "tileh"},         {"colour=red", "colour"},   {"path", "key=value"},
                             {"path=exact,mid=z", "mid"},     {"fp8_scales=cols", "fp8_scales"},
                             {"dec_fill=0", "dec_fill"},      {"dec_fill=9", "dec_fill"}, {"pdl=maybe", "pdl"},
                             {"route=both", "route"},         {"route=once", "route"},    {"combine=late", "combine"},
                             {"shared_dec=two", "shared_dec"}, {"logits_tg=2", "logits_tg"},
                             {"dec_regs=96", "dec_regs"},     {"quant=late", "quant"},
                             {"dec_pf=l3", "dec_pf"},         {"dec_sched=pool", "dec_sched"},
                             {"group=thread", "group"},      {"dec_ring=8", "dec_ring"},
                             {"logits_loop=yes", "logits_loop"}, {"weights=lane", "weights"},
                             {"logits=cublas", "logits"}, {"gather=both", "gather"},
                             {"router=thread", "router"}, {"quant8=fast", "quant8"},
                             {"shared_gu=soon", "shared_gu"}, {"dec_pf=earlier", "dec_pf"}};
    for (size_t i = 0; i < sizeof badk / sizeof badk[0]; i++) {
        ko.params = badk[i][0];
        ck_assert_int_eq(dsv4_backend_create_with(pa, cka, &ko, &bad, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_msg(strstr(e.message, badk[i][1]) != NULL, "%s: %s", badk[i][0], e.message);
        ck_assert_ptr_null(bad);
    }
    printf("cuda_suite shared workspace: two layers on one %llu-byte caller workspace (bound for T %lld: %llu and "
           "%llu; for the plan's chunk %llu) identical to their own workspaces\n",
           (unsigned long long)wbytes, (long long)T, (unsigned long long)wa, (unsigned long long)wb,
           (unsigned long long)full);
    bo_free(&ea), bo_free(&eb), bo_free(&ga), bo_free(&gb);
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
    bo_case k = {"latch", "mini", 0, T, 0, -1, -1, -1, 0, 0, 0, 0};
    dsv4_config c = bo_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    bo_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    dsv4_plan *p = bo_plan(&c, DSV4_BACKEND_CUDA, 0, 0);
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
    bo_case k = {"ref", "mini", 1, 3, 0, -1, -1, -1, 0, 0, 0, 0};
    dsv4_config c = bo_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    bo_data(&k, &c, &ck, &in);
    dsv4_plan *p = bo_plan(&c, DSV4_BACKEND_REF, 0, 0);
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
    bo_case k = {"replay", preset, layer, T, 0, -1, -1, -1, 0, 1, 0, 0};
    dsv4_config c = bo_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    bo_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    bo_out g, eg;
    run_cuda(&c, &k, 1, 3, ck, x, ids, &g);
    run_cuda(&c, &k, 0, 1, ck, x, ids, &eg);
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
    bo_free(&g);
    bo_free(&eg);
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
    bo_case k = {"multi", "mini", 1, 8, 0, -1, -1, -1, 0, 1, 0, 0};
    dsv4_config c = bo_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    bo_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    const int32_t *ids = dsv4_st_find(in, "input_ids")->data;
    dsv4_plan *pg = bo_plan(&c, DSV4_BACKEND_CUDA, 0, 1), *pe = bo_plan(&c, DSV4_BACKEND_CUDA, 0, 0);
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
    bo_case k = {"bad id", "mini", 0, 5, 0, -1, -1, -1, 0, 0, 0, 0};
    dsv4_config c = bo_config(&k);
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    bo_data(&k, &c, &ck, &in);
    const uint16_t *x = dsv4_st_find(in, "x")->data;
    int32_t ids[5];
    memcpy(ids, dsv4_st_find(in, "input_ids")->data, sizeof ids);
    ids[3] = (int32_t)c.vocab_size;
    uint16_t *y = calloc((size_t)(5 * c.dim), 2);
    dsv4_plan *p = bo_plan(&c, DSV4_BACKEND_CUDA, 0, 0);
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
            bo_case k = {"ws", presets[i], layer == 0 ? 0 : pc.n_hash_layers, 1, 0, -1, -1, -1, 0, 0, 0, f8};
            dsv4_config c = bo_config(&k);
            for (int graph = 0; graph < 2; graph++) {
                dsv4_plan *p = bo_plan(&c, DSV4_BACKEND_CUDA, 0, graph);
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
    bo_case k = {"bench", "v4-flash", 5, Tmax, 0, -1, -1, -1, 0, 0, E, 0};
    dsv4_config c = bo_config(&k);
    double tg = now_s();
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    bo_data(&k, &c, &ck, &in);
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
    tcase_add_test(sm, e4m3_hardware_encode);
    tcase_add_test(sm, bf16_hardware_round);
    tcase_add_test(sm, route_small_kernel);
    tcase_add_test(sm, dec_mix_kernel);
    tcase_add_test(sm, group_warp_kernel);
    tcase_add_test(sm, logits_small_kernel);
    tcase_add_test(sm, logits_blas_call);
    tcase_add_test(sm, quant_x8_kernel);
    tcase_add_test(sm, quant8_kernel);
    tcase_add_test(sm, dec_qin_kernel);
    tcase_add_test(sm, tile8_conversion);
    tcase_add_test(sm, tile8_kernel);
    suite_add_tcase(s, sm);
    TCase *f8 = tcase_create("fp8");
    tcase_set_timeout(f8, 600);
    tcase_add_test(f8, fp8_mini_t1100);
    tcase_add_test(f8, direct_mini_t1100);
    tcase_add_test(f8, direct_b64_t1100);
    tcase_add_test(f8, direct_mini_t77);
    tcase_add_test(f8, direct_flash_t100);
    tcase_add_test(f8, direct_flash_t1100);
    tcase_add_test(f8, direct_hash_t1100);
    tcase_add_test(f8, direct_topp_t1100);
    tcase_add_test(f8, direct_noclamp);
    tcase_add_test(f8, direct_after);
    tcase_add_test(f8, direct_chunked);
    tcase_add_test(f8, direct_graph_t128);
    tcase_add_test(f8, direct_close);
    tcase_add_test(f8, direct_q64_t1100);
    tcase_add_test(f8, direct_q64_flash);
    tcase_add_test(f8, direct_q64_after);
    tcase_add_test(f8, direct_variants_identical);
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
    tcase_add_test(ex, fp8_scale_blocks_identical);
    tcase_add_test(ex, mma_mini_t77);
    tcase_add_test(ex, mma_mini_t1100);
    tcase_add_test(ex, mma_flash_t40);
    tcase_add_test(ex, mma_graph_t5);
    suite_add_tcase(s, ex);
    TCase *pd = tcase_create("pdl");
    tcase_set_timeout(pd, 300);
    tcase_add_test(pd, pdl_identical);
    tcase_add_test(pd, route_fused_close);
    tcase_add_test(pd, combine_fold_identical);
    tcase_add_test(pd, dec_slab_identical);
    suite_add_tcase(s, pd);
    /* the routing variants, each against the default or its named base: the small chunks' (logits
       a token or four at a time, unrolled or in a loop; the grouping and weights by one warp), then
       the large chunks' (logits on k_tiles or cuBLASLt, x gathered by copy or quantized after the
       grouping, the block or warp router) in a Tcase of their own, so a call running Tcases at once
       (ci/device-check.sh, DSV4_DEVCHECK_PAR=1) runs the two halves side by side */
    TCase *lg = tcase_create("routing");
    tcase_set_timeout(lg, 600);
    tcase_add_test(lg, logits_tg_identical);
    tcase_add_test(lg, logits_loop_identical);
    tcase_add_test(lg, group_warp_identical);
    tcase_add_test(lg, weights_warp_identical);
    tcase_add_test(lg, route_code_identical);
    suite_add_tcase(s, lg);
    TCase *ll = tcase_create("routing_large");
    tcase_set_timeout(ll, 300);
    tcase_add_test(ll, logits_blas_close);
    tcase_add_test(ll, gather_quant_identical);
    tcase_add_test(ll, router_warp_identical);
    suite_add_tcase(s, ll);
    /* the decode launches' deep rings (params dec_ring=deep), in a Tcase of their own so a short
       device call can decide that default */
    TCase *ri = tcase_create("ring");
    tcase_set_timeout(ri, 300);
    tcase_add_test(ri, dec_ring_identical);
    suite_add_tcase(s, ri);
    /* the decode step's variants not yet the default (docs/cuda.md "Parameters"), each bit for bit
       against the default */
    TCase *va = tcase_create("variants");
    tcase_set_timeout(va, 600);
    tcase_add_test(va, route_one_identical);
    tcase_add_test(va, shared_dec_identical);
    tcase_add_test(va, dec_regs_identical);
    tcase_add_test(va, quant_fold_identical);
    tcase_add_test(va, dec_pf_identical);
    tcase_add_test(va, dec_sched_identical);
    tcase_add_test(va, quant8_lean_identical);
    suite_add_tcase(s, va);
    /* the decode step's overlaps of weight streaming with its latency-bound kernels (params
       dec_pf=early, shared_gu=early), beside variants in a call that runs Tcases at once */
    TCase *ea = tcase_create("early");
    tcase_set_timeout(ea, 600);
    tcase_add_test(ea, dec_early_identical);
    tcase_add_test(ea, shared_gu_identical);
    tcase_add_test(ea, quant_down_identical);
    suite_add_tcase(s, ea);
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
    SRunner *sr = srunner_create(backend_ops_suite());
    srunner_add_suite(sr, cuda_suite());
    srunner_set_xml(sr, getenv("DSV4MOE_CUDA_XML") ? getenv("DSV4MOE_CUDA_XML") : "/dev/null");
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
