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

#include "tests/backend_ops.h"

Suite *backend_ops_suite(void);

START_TEST(table_on_every_backend)
{
    ck_assert_int_ge(bo_every_backend(_i, NULL), 2); /* ref and cpu are in every build */
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
