/* The CPU backend against the reference, through the backend interface (SPEC.md section 7 metrics). */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/backend.h"
#include "dsv4moe_harness/compare.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe/weights.h"
#include "tests/testutil.h"

/* The registry: every kind listed, with what this build and machine hold. */
START_TEST(registry_lists_backends)
{
    dsv4_error e;
    dsv4_backend_info info;
    ck_assert_int_eq(dsv4_backend_count(), 3);
    const char *names[3] = {"ref", "cpu", "cuda"};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(dsv4_backend_info_at(i, &info, &e), DSV4_OK);
        ck_assert_str_eq(info.name, names[i]);
        ck_assert_int_eq((int)info.kind, i);
        ck_assert_uint_eq(info.struct_size, sizeof info);
        if (i < 2) { /* ref and cpu: in every build, on every machine, with stages */
            ck_assert(info.built && info.available && info.sharded);
            ck_assert_str_eq(info.why, "");
        }
    }
#ifndef DSV4_WITH_CUDA
    ck_assert(!info.built && !info.available && !info.sharded);
    ck_assert_msg(strstr(info.why, "not available in this build (available: ref, cpu)") != NULL, "%s", info.why);
#endif
    ck_assert_int_eq(dsv4_backend_info_at(3, &info, &e), DSV4_ERR_RANGE);
    ck_assert_int_eq(dsv4_backend_info_at(-1, &info, &e), DSV4_ERR_RANGE);
    ck_assert_int_eq(dsv4_backend_info_at(0, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_backend_info_of((dsv4_backend_kind)7, &info, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_backend_info_of(DSV4_BACKEND_CPU, &info, &e), DSV4_OK);
    ck_assert_str_eq(info.name, "cpu");
    ck_assert_int_eq(dsv4_backend_plan_supported(NULL, &e), DSV4_ERR_INVALID_ARG);
}
END_TEST

Suite *cpu_suite(void);

/* The CPU backend's kernel tables and its fused regime on one matrix (internal headers). */
#include "fast/cpu/cpu_impl.h"
#include "fast/cpu/kernels/kernels.h"

/* The backend test table and its checker: the common cases run in tests/test_backend_ops.c on
   every backend; this suite keeps what is the cpu backend's own (its kernel tables). */
#include "tests/backend_ops.h"

typedef bo_case cpu_case;
typedef bo_out run_out;
#define free_out bo_free

static dsv4_plan *make_plan(const dsv4_config *c, dsv4_backend_kind kind, int64_t chunk)
{
    return bo_plan(c, kind, chunk, 0);
}

static void run_backend(const dsv4_config *c, dsv4_backend_kind kind, int64_t chunk, int threads,
                        const dsv4_checkpoint *ck, int64_t T, const uint16_t *x, const int32_t *in_ids, run_out *r)
{
    bo_case k = {"run", "mini", c->layer, T, chunk, -1, -1, -1, 0, 0, 0, 0};
    bo_backend be = {kind, threads, DSV4_CPU_KERNELS_AUTO, 1, NULL};
    bo_run(c, &k, &be, ck, x, in_ids, r);
}

/* The reference through the backend interface: the same bytes at 1, 2 and 3 threads (the pool
   must not change how work is split into results). */
START_TEST(ref_same_bytes_at_any_thread_count)
{
    cpu_case k = {"ref threads", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0};
    bo_in io;
    bo_in_open(&k, &io);
    const uint16_t *x = io.x;
    const int32_t *ids = io.ids;
    run_out r1, r2, r3;
    run_backend(&io.c, DSV4_BACKEND_REF, 0, 1, io.ck, k.tokens, x, ids, &r1);
    run_backend(&io.c, DSV4_BACKEND_REF, 0, 2, io.ck, k.tokens, x, ids, &r2);
    run_backend(&io.c, DSV4_BACKEND_REF, 0, 3, io.ck, k.tokens, x, ids, &r3);
    size_t n = (size_t)(k.tokens * io.c.dim) * sizeof *r1.y;
    ck_assert(memcmp(r1.y, r2.y, n) == 0);
    ck_assert(memcmp(r1.y, r3.y, n) == 0);
    free_out(&r1);
    free_out(&r2);
    free_out(&r3);
    bo_in_close(&io);
}
END_TEST

/* Every kernel table this CPU runs below its best (the best runs every case above), each on
   the regimes it changes: the reference (portable C), AVX2 only (tile2 and the blocked kernels;
   T = 300: a shared group above 256 rows, in blocks), AVX-512 without the bf16
   kernels (the fp32 fp4 kernel, dequantize + sgemm for large groups), AVX512-BF16 without VBMI
   (the 64-block bf16 fp4 kernel instead of the grouped-scale one). */
START_TEST(every_kernel_table)
{
    static const struct {
        dsv4_cpu_kernels level;
        cpu_case k[2];
    } runs[] = {
        {DSV4_CPU_KERNELS_REF,
         {{"ref mini", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0},
          {"ref mini-fp8 T=1", "mini-fp8", 1, 1, 0, -1, -1, -1, 0, 0, 0, 0}}},
        {DSV4_CPU_KERNELS_AVX2,
         {{"avx2 mini T=30", "mini", 1, 30, 0, -1, -1, -1, 0, 0, 0, 0},
          {"avx2 mini-fp8 T=300", "mini-fp8", 1, 300, 0, -1, -1, -1, 0, 0, 0, 0}}},
        {DSV4_CPU_KERNELS_AVX512,
         {{"fp32-512 mini T=30", "mini", 1, 30, 0, -1, -1, -1, 0, 0, 0, 0},
          {"fp32-512 mini T=1100", "mini", 1, 1100, 0, -1, -1, -1, 0, 0, 0, 0}}},
        {DSV4_CPU_KERNELS_AVX512_BF16,
         {{"bf16-64 mini T=30", "mini", 1, 30, 0, -1, -1, -1, 0, 0, 0, 0},
          {"bf16-64 mini T=1", "mini", 1, 1, 0, -1, -1, -1, 0, 0, 0, 0}}},
    };
    int ran = 0;
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        if (!dsv4_cpu_kernels_available(runs[r].level))
            continue;
        bo_backend be = {DSV4_BACKEND_CPU, 2, runs[r].level, 1, NULL};
        for (int i = 0; i < 2; i++)
            if (!bo_skipped_under_coverage(&runs[r].k[i]))
                bo_check(&runs[r].k[i], &be, NULL);
        ran++;
    }
    ck_assert_int_ge(ran, 1); /* the reference runs everywhere */
}
END_TEST

/* A table this CPU lacks is refused at creation naming the rule; unknown names and values too. */
START_TEST(kernel_table_choice_errors)
{
    dsv4_cpu_kernels k;
    dsv4_error e;
    ck_assert_int_eq(dsv4_cpu_kernels_from_name("avx2", &k, &e), DSV4_OK);
    ck_assert_int_eq(k, DSV4_CPU_KERNELS_AVX2);
    ck_assert_int_eq(dsv4_cpu_kernels_from_name("sse9", &k, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "avx512-vbmi"));
    ck_assert_str_eq(dsv4_cpu_kernels_name((dsv4_cpu_kernels)42), "unknown");
    ck_assert(dsv4_cpu_kernels_available(DSV4_CPU_KERNELS_REF));
    const dsv4_cpu_kernels_table *t = NULL;
    ck_assert_int_eq(dsv4_cpu_kernels_get((dsv4_cpu_kernels)-1, &t, &e), DSV4_ERR_INVALID_ARG);
    for (int l = DSV4_CPU_KERNELS_REF; l <= DSV4_CPU_KERNELS_AVX512_VBMI; l++) {
        dsv4_status st = dsv4_cpu_kernels_get((dsv4_cpu_kernels)l, &t, &e);
        if (dsv4_cpu_kernels_available((dsv4_cpu_kernels)l)) {
            ck_assert_int_eq(st, DSV4_OK);
            ck_assert_str_eq(t->name, dsv4_cpu_kernels_name((dsv4_cpu_kernels)l));
        } else {
            ck_assert_int_eq(st, DSV4_ERR_UNSUPPORTED);
            ck_assert_ptr_nonnull(strstr(e.message, "lacks"));
        }
    }
    /* through the backend: a bad struct_size and an out-of-range value are refused */
    cpu_case kc = {"opts", "mini", 1, 1, 0, -1, -1, -1, 0, 0, 0, 0};
    bo_in io;
    bo_in_open(&kc, &io);
    dsv4_plan *p = make_plan(&io.c, DSV4_BACKEND_CPU, 0);
    dsv4_backend *b = NULL;
    dsv4_backend_options bo;
    dsv4_backend_options_init(&bo);
    bo.struct_size = 4;
    ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, &bo, &b, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "struct_size"));
    /* dsv4moe 0.1's layout (cpu_kernels, cuda_kernels) is refused by name */
    bo.struct_size = 40;
    ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, &bo, &b, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_msg(strstr(e.message, "dsv4moe 0.1") && strstr(e.message, "params"), "%s", e.message);
    /* the backend's params: an unknown table, key or form is refused by name, none half-applied */
    static const char *const badp[][2] = {{"kernels=sse9", "sse9"}, {"colour=red", "colour"},
                                          {"kernels", "key=value"}, {"kernels=ref,fp8_cut=16", "fp8_cut"}};
    for (size_t i = 0; i < sizeof badp / sizeof badp[0]; i++) {
        dsv4_backend_options_init(&bo);
        bo.params = badp[i][0];
        ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, &bo, &b, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_msg(strstr(e.message, badp[i][1]) != NULL, "%s: %s", badp[i][0], e.message);
        ck_assert_ptr_null(b);
    }
    dsv4_backend_options_init(&bo);
    bo.params = "kernels=ref";
    ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, &bo, &b, &e), DSV4_OK);
    ck_assert_str_eq(dsv4_backend_kernels(b), "ref");
    dsv4_backend_free(b);
    b = NULL;
    ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, NULL, &b, &e), DSV4_OK);
    ck_assert_str_ne(dsv4_backend_kernels(b), "auto");
    dsv4_backend_free(b);
    dsv4_plan_free(p);
    bo_in_close(&io);
}
END_TEST

/* One matrix of 139 rows (a 128-row fp8 scale block boundary, odd NW-block tails) against 1, 3, 9
   and 40 activation rows (40: the blocked kernels' uneven row blocks; k = 1152 their k slices): the fused kernel within 1e-5 of sum |w x| of the double dot of the library's
   dequantized rows; NaN where the library's row has one. bf16-exact X (the bf16 kernels) and,
   with exact = 0, X off the bf16 grid (the fp32 kernels). */
static void fused_dot_case(const dsv4_cpu_kernels_table *kt, dsv4_weight_format fmt, dsv4_scale_format sf, int64_t k, int exact)
{
    const int64_t n = 139;
    dsv4_matrix_view v;
    memset(&v, 0, sizeof v);
    v.key = "test";
    v.format = fmt;
    v.scale_format = sf;
    v.n = n;
    v.k = k;
    v.row_bytes = (uint64_t)(fmt == DSV4_FORMAT_FP4 ? k / 2 : k);
    size_t nd = (size_t)n * v.row_bytes;
    size_t ns = fmt == DSV4_FORMAT_FP4 ? (size_t)(n * (k / 32))
                                       : (size_t)(((n + 127) / 128) * ((k + 127) / 128)) * (sf == DSV4_SCALE_FP32 ? 4 : 1);
    uint8_t *d = malloc(nd), *sc = malloc(ns);
    for (size_t i = 0; i < nd; i++) {
        d[i] = (uint8_t)((i * 2654435761u) >> 11);
        if (fmt == DSV4_FORMAT_FP8 && (d[i] & 0x7F) == 0x7F)
            d[i] = (uint8_t)(d[i] - 1); /* no NaN codes: the kernels decode them as 480 */
        if (fmt == DSV4_FORMAT_FP8 && i < 256)
            d[i] = (uint8_t)(i == 0x7F || i == 0xFF ? 0 : i); /* every other code, subnormals included */
    }
    if (fmt == DSV4_FORMAT_FP8) /* rows 40, 41: only subnormal codes and zeros, both signs */
        for (int64_t i = 0; i < 2 * k; i++)
            d[40 * k + i] = (uint8_t)((i & 7) | ((i & 8) << 4));
    if (fmt == DSV4_FORMAT_FP8 && sf == DSV4_SCALE_FP32)
        for (size_t i = 0; i < ns / 4; i++) {
            float f = 0.0123f * (float)(i + 1);
            memcpy(sc + 4 * i, &f, 4);
        }
    else
        for (size_t i = 0; i < ns; i++)
            sc[i] = (uint8_t)(120 + (i * 7) % 15);
    if (fmt == DSV4_FORMAT_FP4) {
        sc[9 * (k / 32) + 2] = 0;   /* 2^-127: the table path of the grouped-scale kernel */
        sc[20 * (k / 32) + 0] = 255; /* NaN: the row's result is NaN */
        sc[30 * (k / 32) + 1] = 1;   /* plain extremes */
        sc[30 * (k / 32) + 2] = 250;
    }
    v.data = d;
    v.scales = sc;
    float *W = malloc((size_t)(n * k) * sizeof *W);
    dsv4_matrix_dequant_rows(&v, 0, n, W);
    const int64_t rows[4] = {1, 3, 9, 40};
    for (int ri = 0; ri < 4; ri++) {
        int64_t nx = rows[ri];
        float *X = malloc((size_t)(nx * k) * sizeof *X), *C = malloc((size_t)(nx * n) * sizeof *C);
        for (int64_t i = 0; i < nx * k; i++) {
            X[i] = ldexpf((float)((int)(((uint64_t)i * 40503u + 17u) % 255u) - 127), -7); /* bf16-exact */
            if (!exact)
                X[i] += ldexpf(1.0f, -20);
        }
        ck_assert_int_eq(dsv4_cpu_fused_dot(kt, &v, nx, X, C), 0);
        for (int64_t q = 0; q < nx; q++)
            for (int64_t j = 0; j < n; j++) {
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < k; i++) {
                    ref += (double)W[j * k + i] * (double)X[q * k + i];
                    mag += fabs((double)W[j * k + i] * (double)X[q * k + i]);
                }
                double got = C[q * n + j];
                if (isnan(ref)) {
                    ck_assert_msg(isnan(got), "fmt %d k %lld row %lld: %g, want NaN", fmt, (long long)k, (long long)j, got);
                    continue;
                }
                ck_assert_msg(fabs(got - ref) <= 1e-5 * mag + 1e-37, "%s fmt %d sf %d k %lld exact %d rows %lld: C[%lld, %lld] %.9g vs %.9g",
                              kt->name, fmt, sf, (long long)k, exact, (long long)nx, (long long)q, (long long)j, got, ref);
            }
        free(X);
        free(C);
    }
    free(W);
    free(d);
    free(sc);
}

/* Every kernel the CPU has (and each fallback) on fp4 and fp8 rows, k a multiple of 128 (the
   grouped kernels) and not (320: the 64-block bf16 kernel / fp32 kernels). */
START_TEST(fused_kernels_match_dequant)
{
    for (int l = DSV4_CPU_KERNELS_REF; l <= DSV4_CPU_KERNELS_AVX512_VBMI; l++) {
        const dsv4_cpu_kernels_table *kt = NULL;
        dsv4_error e;
        if (!dsv4_cpu_kernels_available((dsv4_cpu_kernels)l))
            continue;
        ck_assert_int_eq(dsv4_cpu_kernels_get((dsv4_cpu_kernels)l, &kt, &e), DSV4_OK);
        for (int exact = 0; exact < 2; exact++) {
            fused_dot_case(kt, DSV4_FORMAT_FP4, DSV4_SCALE_UE8M0, 384, exact);
            fused_dot_case(kt, DSV4_FORMAT_FP4, DSV4_SCALE_UE8M0, 320, exact);
            fused_dot_case(kt, DSV4_FORMAT_FP8, DSV4_SCALE_UE8M0, 384, exact);
            fused_dot_case(kt, DSV4_FORMAT_FP8, DSV4_SCALE_FP32, 384, exact);
            fused_dot_case(kt, DSV4_FORMAT_FP8, DSV4_SCALE_UE8M0, 320, exact);
            fused_dot_case(kt, DSV4_FORMAT_FP4, DSV4_SCALE_UE8M0, 1152, exact);
            fused_dot_case(kt, DSV4_FORMAT_FP8, DSV4_SCALE_FP32, 1152, exact);
        }
    }
}
END_TEST

/* Every table's decoders give exactly dsv4_matrix_dequant_rows's values. */
START_TEST(decoders_match_library)
{
    const char *presets[] = {"mini", "mini-fp8", "mini-bf16"};
    for (int pi = 0; pi < 3; pi++) {
        cpu_case k = {"dec", presets[pi], 1, 1, 0, -1, -1, -1, 0, 0, 0, 0};
        bo_in io;
        bo_in_open(&k, &io);
        for (int64_t ex = -1; ex < 3; ex++) {
            if (ex == DSV4_SHARED_EXPERT && io.c.n_shared_experts == 0)
                continue;
            for (int p = 0; p < 3; p++) {
                dsv4_matrix_view v;
                dsv4_error e;
                ck_assert_int_eq(dsv4_weights_matrix(io.ck, &io.c, ex, (dsv4_proj)p, &v, &e), DSV4_OK);
                size_t nn = (size_t)(v.n * v.k);
                float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b);
                dsv4_matrix_dequant_rows(&v, 0, v.n, a);
                for (int l = DSV4_CPU_KERNELS_REF; l <= DSV4_CPU_KERNELS_AVX512_VBMI; l++) {
                    const dsv4_cpu_kernels_table *kt = NULL;
                    if (dsv4_cpu_kernels_get((dsv4_cpu_kernels)l, &kt, &e) != DSV4_OK)
                        continue; /* a table this CPU lacks */
                    memset(b, 0, nn * sizeof *b);
                    kt->dequant(&v, 0, v.n, b);
                    for (size_t i = 0; i < nn; i++)
                        ck_assert_msg(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])), "%s %s %s [%zu]: %a vs %a",
                                      kt->name, presets[pi], v.key, i, (double)a[i], (double)b[i]);
                }
                free(a);
                free(b);
            }
        }
        bo_in_close(&io);
    }
}
END_TEST

START_TEST(hash_bad_input_id_is_range_error)
{
    cpu_case k = {"bad id", "mini", 0, 5, 0, -1, -1, -1, 0, 0, 0, 0};
    bo_in io;
    bo_in_open(&k, &io);
    int64_t T = 5, H = io.c.dim;
    const uint16_t *x = io.x;
    int32_t ids[5];
    memcpy(ids, io.ids, sizeof ids);
    ids[3] = (int32_t)io.c.vocab_size;
    uint16_t *y = calloc((size_t)(T * H), sizeof *y);
    dsv4_backend_kind kinds[2] = {DSV4_BACKEND_REF, DSV4_BACKEND_CPU};
    for (int i = 0; i < 2; i++) {
        dsv4_plan *p = make_plan(&io.c, kinds[i], 0);
        dsv4_backend *b = NULL;
        dsv4_error e;
        ck_assert_int_eq(dsv4_backend_create(p, io.ck, 2, &b, &e), DSV4_OK);
        dsv4_forward_out o = {y, NULL, NULL, NULL};
        ck_assert_int_eq(dsv4_backend_forward(b, T, x, ids, &o, &e), DSV4_ERR_RANGE);
        ck_assert_msg(strstr(e.message, "input_ids[3]") != NULL, "%s", e.message);
        ids[3] = -1;
        ck_assert_int_eq(dsv4_backend_forward(b, T, x, ids, &o, &e), DSV4_ERR_RANGE);
        ids[3] = (int32_t)io.c.vocab_size;
        ck_assert_int_eq(dsv4_backend_forward(b, T, x, NULL, &o, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_int_eq(dsv4_backend_forward(b, -1, x, ids, &o, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_int_eq(dsv4_backend_forward(b, 4097, x, ids, &o, &e), DSV4_ERR_INVALID_ARG);
        dsv4_backend_free(b);
        dsv4_plan_free(p);
    }
    free(y);
    bo_in_close(&io);
}
END_TEST

/* The embedding calls on the host backends (include/dsv4moe/backend.h): no device, so no
   workspace, no enqueue and nothing latched; argument checks name the rule. */
START_TEST(embedding_calls_on_host_backends)
{
    cpu_case k = {"embed", "mini", 0, 5, 0, -1, -1, -1, 0, 0, 0, 0};
    bo_in io;
    bo_in_open(&k, &io);
    const uint16_t *x = io.x;
    uint16_t y[1];
    dsv4_error e;
    dsv4_backend_kind kinds[2] = {DSV4_BACKEND_REF, DSV4_BACKEND_CPU};
    for (int i = 0; i < 2; i++) {
        dsv4_plan *p = make_plan(&io.c, kinds[i], 0);
        uint64_t bytes = 7;
        ck_assert_int_eq(dsv4_backend_workspace_size(p, 16, &bytes, &e), DSV4_OK);
        ck_assert_uint_eq(bytes, 0);
        ck_assert_int_eq(dsv4_backend_workspace_size(p, 0, &bytes, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_msg(strstr(e.message, "max_tokens 0") != NULL, "%s", e.message);
        ck_assert_int_eq(dsv4_backend_workspace_size(NULL, 1, &bytes, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_int_eq(dsv4_backend_workspace_size(p, 1, NULL, &e), DSV4_ERR_INVALID_ARG);
        dsv4_backend_options opt;
        dsv4_backend_options_init(&opt);
        ck_assert_ptr_null(opt.workspace);
        ck_assert_uint_eq(opt.workspace_bytes, 0);
        dsv4_backend *b = NULL;
        static uint8_t area[4096] __attribute__((aligned(256)));
        opt.workspace = area;
        opt.workspace_bytes = sizeof area;
        ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, &opt, &b, &e), DSV4_ERR_UNSUPPORTED);
        ck_assert_msg(strstr(e.message, "cuda only") != NULL, "%s", e.message);
        ck_assert_ptr_null(b);
        opt.workspace = NULL;
        ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, &opt, &b, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_msg(strstr(e.message, "without a workspace pointer") != NULL, "%s", e.message);
        opt.workspace_bytes = 0;
        ck_assert_ptr_null(opt.params);
        opt.params = "fp8_cut=16"; /* the cuda backend's kernel variant: not a cpu key; ref takes none */
        if (kinds[i] == DSV4_BACKEND_CPU) {
            ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, &opt, &b, &e), DSV4_ERR_INVALID_ARG);
            ck_assert_msg(strstr(e.message, "fp8_cut") != NULL && strstr(e.message, "keys: kernels") != NULL, "%s",
                          e.message);
        } else {
            ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, &opt, &b, &e), DSV4_ERR_UNSUPPORTED);
            ck_assert_msg(strstr(e.message, "takes no parameters") != NULL, "%s", e.message);
        }
        ck_assert_ptr_null(b);
        opt.params = ""; /* empty: the defaults, accepted everywhere */
        ck_assert_int_eq(dsv4_backend_create_with(p, io.ck, &opt, &b, &e), DSV4_OK);
        dsv4_forward_out o = {y, NULL, NULL, NULL};
        ck_assert_int_eq(dsv4_backend_enqueue(b, NULL, 5, NULL, x, NULL, &o, &e), DSV4_ERR_UNSUPPORTED);
        ck_assert_msg(strstr(e.message, "dsv4_backend_forward") != NULL, "%s", e.message);
        ck_assert_int_eq(dsv4_backend_enqueue(b, NULL, 4097, NULL, x, NULL, &o, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_int_eq(dsv4_backend_enqueue(NULL, NULL, 5, NULL, x, NULL, &o, &e), DSV4_ERR_INVALID_ARG);
        dsv4_device_errors d;
        memset(&d, 0xAB, sizeof d);
        d.struct_size = sizeof d;
        ck_assert_int_eq(dsv4_backend_poll_error(b, NULL, &d, &e), DSV4_OK);
        ck_assert_uint_eq(d.bad_input_ids, 0);
        ck_assert_int_eq(d.first_bad_input, -1);
        ck_assert_uint_eq(d.nonfinite_rows, 0);
        ck_assert_uint_eq(d.bad_expert_ids, 0);
        ck_assert_int_eq(dsv4_backend_poll_error(b, NULL, NULL, &e), DSV4_OK);
        d.struct_size = 3;
        ck_assert_int_eq(dsv4_backend_poll_error(b, NULL, &d, &e), DSV4_ERR_INVALID_ARG);
        ck_assert_int_eq(dsv4_backend_poll_error(NULL, NULL, NULL, &e), DSV4_ERR_INVALID_ARG);
        dsv4_backend_free(b);
        dsv4_plan_free(p);
    }
    /* cuda: not in this build, or (a CUDA build) a workspace that grows with the tokens */
    dsv4_plan *p = make_plan(&io.c, DSV4_BACKEND_CUDA, 0);
    uint64_t b1 = 0, b64 = 0;
#ifdef DSV4_WITH_CUDA
    ck_assert_int_eq(dsv4_backend_workspace_size(p, 1, &b1, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_backend_workspace_size(p, 64, &b64, &e), DSV4_OK);
    ck_assert(b1 > 0 && b64 > b1);
#else
    ck_assert_int_eq(dsv4_backend_workspace_size(p, 1, &b1, &e), DSV4_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.message, "not in this build") != NULL, "%s", e.message);
    (void)b64;
#endif
    dsv4_plan_free(p);
    bo_in_close(&io);
}
END_TEST

START_TEST(refusals_name_backend_and_router)
{
    cpu_case k = {"refuse", "mini", 1, 1, 0, -1, -1, -1, 0, 0, 0, 0};
    bo_in io;
    bo_in_open(&k, &io);
    dsv4_error e;
    dsv4_backend *b = NULL;
    /* cuda: not in this backend set */
    dsv4_topology topo;
    dsv4_topology_init(&topo);
    topo.backend = DSV4_BACKEND_CUDA;
    topo.sm = 90;
    dsv4_budget bud;
    dsv4_budget_init(&bud);
    dsv4_plan *p = NULL;
    ck_assert_msg(dsv4_plan_create(&io.c, &topo, &bud, &p, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(dsv4_backend_create(p, io.ck, 2, &b, &e), DSV4_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.message, "cuda") != NULL, "%s", e.message);
    ck_assert_ptr_null(b);
    dsv4_plan_free(p);
    /* cpu with an expert-parallel router: a rank of it runs the stages (fast/multirank), not a forward */
    dsv4_topology_init(&topo);
    topo.backend = DSV4_BACKEND_CPU;
    topo.world_size = 2;
    topo.dp = 2;
    topo.ep = 2;
    ck_assert_msg(dsv4_plan_create(&io.c, &topo, &bud, &p, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_backend_create(p, io.ck, 2, &b, &e) == DSV4_OK, "%s", e.message);
    uint16_t x1[2 * 256] = {0}, y1[2 * 256];
    int32_t id1[2] = {1, 2};
    dsv4_forward_out fo = {.y = y1};
    ck_assert_int_eq(dsv4_backend_forward(b, 1, x1, id1, &fo, &e), DSV4_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.message, "dsv4_dist_forward") != NULL, "%s", e.message);
    dsv4_backend_free(b);
    b = NULL;
    dsv4_plan_free(p);
    /* bad arguments */
    p = make_plan(&io.c, DSV4_BACKEND_CPU, 0);
    ck_assert_int_eq(dsv4_backend_create(p, io.ck, 0, &b, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_backend_create(NULL, io.ck, 1, &b, &e), DSV4_ERR_INVALID_ARG);
    dsv4_plan_free(p);
    dsv4_backend_free(NULL);
    ck_assert_str_eq(dsv4_backend_name(NULL), "none");
    bo_in_close(&io);
}
END_TEST

/* Two forwards on one backend: the same bytes, stats accumulate, the workspace does not grow. */
START_TEST(repeat_forward_is_stable)
{
    cpu_case k = {"repeat", "mini", 1, 77, 0, -1, -1, -1, 0, 0, 0, 0};
    bo_in io;
    bo_in_open(&k, &io);
    int64_t T = 77, H = io.c.dim;
    const uint16_t *x = io.x;
    const int32_t *ids = io.ids;
    dsv4_plan *p = make_plan(&io.c, DSV4_BACKEND_CPU, 0);
    dsv4_backend *b = NULL;
    dsv4_error e;
    ck_assert_int_eq(dsv4_backend_create(p, io.ck, 2, &b, &e), DSV4_OK);
    uint16_t *y1 = calloc((size_t)(T * H), 2), *y2 = calloc((size_t)(T * H), 2);
    dsv4_forward_out o1 = {y1, NULL, NULL, NULL}, o2 = {y2, NULL, NULL, NULL};
    ck_assert_int_eq(dsv4_backend_forward(b, T, x, ids, &o1, &e), DSV4_OK);
    uint64_t peak1 = dsv4_backend_get_stats(b).workspace_peak;
    ck_assert_int_eq(dsv4_backend_forward(b, T, x, ids, &o2, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_backend_forward(b, 0, NULL, NULL, &o2, &e), DSV4_OK);
    dsv4_backend_stats s = dsv4_backend_get_stats(b);
    ck_assert(memcmp(y1, y2, (size_t)(T * H) * 2) == 0);
    ck_assert_uint_eq(s.forwards, 3);
    ck_assert_uint_eq(s.tokens, 2 * (uint64_t)T);
    ck_assert_uint_eq(s.workspace_peak, peak1);
    free(y1);
    free(y2);
    dsv4_backend_free(b);
    dsv4_plan_free(p);
    bo_in_close(&io);
}
END_TEST

START_TEST(compare_metrics_basics)
{
    uint16_t a[4], b[4];
    float va[4] = {1.0f, -2.0f, 0.5f, 0.0f};
    for (int i = 0; i < 4; i++)
        a[i] = b[i] = dsv4_f32_to_bf16(va[i]);
    dsv4_compare_metrics m;
    ck_assert(dsv4_compare_bf16(a, b, 4, &m));
    ck_assert(m.max_abs == 0 && m.nmse == 0 && m.deepgemm_diff == 0 && m.ulp_max == 0 && m.finite_ok);
    a[0] = (uint16_t)(a[0] + 1); /* one ulp up */
    a[1] = (uint16_t)(a[1] + 2); /* -2 two ulps away from zero... more negative */
    ck_assert(dsv4_compare_bf16(a, b, 4, &m));
    ck_assert_uint_eq(m.ulp_max, 2);
    ck_assert_int_eq(m.ulp_nonzero, 2);
    ck_assert(m.max_abs > 0 && m.deepgemm_diff > 0);
    a[2] = 0x7FC0; /* NaN where the reference is finite */
    ck_assert(dsv4_compare_bf16(a, b, 4, &m));
    ck_assert(!m.finite_ok);
    ck_assert_int_eq(m.bad_nonfinite, 1);
    /* the ulp distance crosses zero: +0 and the smallest negative are one apart */
    uint16_t p0 = 0x0000, n1 = 0x8001;
    ck_assert(dsv4_compare_bf16(&p0, &n1, 1, &m));
    ck_assert_uint_eq(m.ulp_max, 1);
    ck_assert(dsv4_compare_bf16(NULL, NULL, 0, &m));
    ck_assert_int_eq(m.n, 0);
}
END_TEST

Suite *cpu_suite(void)
{
    Suite *s = suite_create("cpu");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, compare_metrics_basics);
    tcase_add_test(tc, decoders_match_library);
    tcase_add_test(tc, fused_kernels_match_dequant);
    tcase_add_test(tc, ref_same_bytes_at_any_thread_count);
    tcase_add_test(tc, every_kernel_table);
    tcase_add_test(tc, kernel_table_choice_errors);
    tcase_add_test(tc, hash_bad_input_id_is_range_error);
    tcase_add_test(tc, refusals_name_backend_and_router);
    tcase_add_test(tc, embedding_calls_on_host_backends);
    tcase_add_test(tc, registry_lists_backends);
    tcase_add_test(tc, repeat_forward_is_stable);
    suite_add_tcase(s, tc);
    return s;
}

