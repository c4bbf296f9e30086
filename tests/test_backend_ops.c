/*
 * The backend test table (tests/backend_ops.h) over every backend this build and machine have:
 * ref (against itself: determinism and statistics), cpu on its best kernel table here and, where
 * that is not the AVX2 table, on the AVX2 table too (the AVX2-only servers' auto). Built
 * with DSV4_WITH_CUDA the list includes cuda (bo_cuda_extra: graphs, workspace within the step);
 * the `make cuda` test program does not link this suite yet (tests/cuda/test_cuda.c still carries
 * its own copy of the table, with the gemm fp8 cases and tolerances of SPEC.md section 9 that
 * this table does not model). One loop test per case; each iteration runs all the backends.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend_ops.h"

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


START_TEST(table_on_every_backend)
{
    const bo_case *k = &bo_cases[_i];
    if (bo_skipped_under_coverage(k))
        return;
    static const struct {
        bo_backend be;
        bo_extra_fn extra;
    } backends[] = {
        {{DSV4_BACKEND_REF, 3, DSV4_CPU_KERNELS_AUTO, 2}, NULL},
        {{DSV4_BACKEND_CPU, 2, DSV4_CPU_KERNELS_AUTO, 2}, cpu_extra},
        /* the AVX2 table (what an AVX2-only server runs as auto) where the CPU has a better one */
        {{DSV4_BACKEND_CPU, 2, DSV4_CPU_KERNELS_AVX2, 2}, cpu_extra},
#ifdef DSV4_WITH_CUDA
        {{DSV4_BACKEND_CUDA, 2, DSV4_CPU_KERNELS_AUTO, 2}, bo_cuda_extra},
#endif
    };
    int ran = 0;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        dsv4_cpu_kernels kl = backends[i].be.kernels;
        if (!bo_backend_available(backends[i].be.kind) ||
            (kl != DSV4_CPU_KERNELS_AUTO &&
             !(dsv4_cpu_kernels_available(kl) && dsv4_cpu_kernels_available((dsv4_cpu_kernels)(kl + 1)))))
            continue;
        bo_check(k, &backends[i].be, backends[i].extra);
        ran++;
    }
    ck_assert_int_ge(ran, 1);
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
