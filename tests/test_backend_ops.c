/*
 * The backend test table (tests/backend_ops.h) over every backend the registry reports available
 * (dsv4_backend_info_at: built into this library and runnable on this machine): ref (against
 * itself: determinism and statistics) and cpu on its best kernel table in `make test` (and, where
 * that is not the AVX2 table, on the AVX2 table too: the AVX2-only servers' auto); ref, cpu
 * and cuda in the device test program build/cuda/test_cuda, which links this suite compiled with
 * DSV4_WITH_CUDA (the cuda backend with the kernel variants the environment names, bench_util.h).
 * One loop test per case; each iteration makes the case's reference once and runs every backend.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend_ops.h"
#ifdef DSV4_WITH_CUDA
#include "../bench/bench_util.h"
#endif

Suite *backend_ops_suite(void);

/* The cpu backend's memory model bounds what it really allocated (every shape of the table). */
static void cpu_extra(const bo_case *k, const dsv4_config *c, const bo_backend *be, const bo_out *ref,
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
static bo_backend backend_of(dsv4_backend_kind kind, bo_extra_fn *extra, char *spec, size_t n)
{
    bo_backend be = {kind, kind == DSV4_BACKEND_REF ? 3 : 2, DSV4_CPU_KERNELS_AUTO, 2, NULL};
    *extra = kind == DSV4_BACKEND_CPU ? cpu_extra : NULL;
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

START_TEST(table_on_every_backend)
{
    const bo_case *k = &bo_cases[_i];
    if (bo_skipped_under_coverage(k))
        return;
    bo_ref r;
    bo_ref_open(k, &r);
    int ran = 0;
    for (int i = 0; i < dsv4_backend_count(); i++) {
        dsv4_backend_info info;
        dsv4_error e;
        ck_assert_int_eq(dsv4_backend_info_at(i, &info, &e), DSV4_OK);
        if (info.built && !info.available) {
            const char *req = getenv("DSV4MOE_CUDA_REQUIRED"); /* the device scripts: cuda must run */
            ck_assert_msg(!(info.kind == DSV4_BACKEND_CUDA && req && req[0] == '1'),
                          "DSV4MOE_CUDA_REQUIRED=1 but the cuda backend is not available: %s", info.why);
            if (_i == 0)
                printf("backend_ops: the %s backend is built but not available here: %s\n", info.name, info.why);
        }
        if (!info.available || !bo_runs_on(k, info.kind))
            continue;
        bo_extra_fn extra;
        char spec[256];
        bo_backend be = backend_of(info.kind, &extra, spec, sizeof spec);
        bo_compare(&r, &be, extra);
        ran++;
        /* the AVX2 table where the CPU has a better one */
        if (info.kind == DSV4_BACKEND_CPU && dsv4_cpu_kernels_available(DSV4_CPU_KERNELS_AVX2) &&
            dsv4_cpu_kernels_available((dsv4_cpu_kernels)(DSV4_CPU_KERNELS_AVX2 + 1))) {
            be.kernels = DSV4_CPU_KERNELS_AVX2;
            bo_compare(&r, &be, extra);
        }
    }
    bo_ref_close(&r);
    ck_assert_int_ge(ran, 2); /* ref and cpu are in every build */
}
END_TEST

Suite *backend_ops_suite(void)
{
    Suite *s = suite_create("backend_ops");
    TCase *tc = tcase_create("table");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, table_on_every_backend, 0, BO_NCASES);
    suite_add_tcase(s, tc);
    return s;
}
