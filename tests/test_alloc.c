#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "dsv4moe/alloc.h"

Suite *alloc_suite(void);

START_TEST(accounting_and_peak)
{
    dsv4_allocator *a;
    ck_assert_int_eq(dsv4_allocator_create(0, &a, NULL), DSV4_OK);
    char *p = dsv4_alloc(a, 1000), *q = dsv4_alloc(a, 24);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(q);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(p[i], 0); /* zeroed */
    dsv4_alloc_stats s = dsv4_allocator_stats(a);
    ck_assert_uint_eq(s.current, 1024);
    ck_assert_uint_eq(s.peak, 1024);
    ck_assert_uint_eq(s.count, 2);
    dsv4_release(a, p);
    s = dsv4_allocator_stats(a);
    ck_assert_uint_eq(s.current, 24);
    ck_assert_uint_eq(s.peak, 1024);
    dsv4_allocator_reset_peak(a);
    ck_assert_uint_eq(dsv4_allocator_stats(a).peak, 24);
    void *z = dsv4_alloc(a, 0);
    ck_assert_ptr_nonnull(z);
    dsv4_release(a, z);
    dsv4_release(a, q);
    dsv4_release(a, NULL);
    s = dsv4_allocator_stats(a);
    ck_assert_uint_eq(s.current, 0);
    ck_assert_uint_eq(s.total, 1024);
    dsv4_allocator_free(a);
    dsv4_allocator_free(NULL);
    /* Without an allocator: plain memory, nothing counted. */
    void *r = dsv4_alloc(NULL, 16);
    ck_assert_ptr_nonnull(r);
    dsv4_release(NULL, r);
    ck_assert_uint_eq(dsv4_allocator_stats(NULL).peak, 0);
    ck_assert_int_eq(dsv4_allocator_create(0, NULL, NULL), DSV4_ERR_INVALID_ARG);
}
END_TEST

START_TEST(limit_refuses_cleanly)
{
    dsv4_allocator *a;
    ck_assert_int_eq(dsv4_allocator_create(4096, &a, NULL), DSV4_OK);
    void *p = dsv4_alloc(a, 4000);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_null(dsv4_alloc(a, 100));
    ck_assert_ptr_null(dsv4_alloc(a, SIZE_MAX));
    ck_assert_ptr_null(dsv4_alloc(a, 5000));
    void *q = dsv4_alloc(a, 96);
    ck_assert_ptr_nonnull(q);
    dsv4_alloc_stats s = dsv4_allocator_stats(a);
    ck_assert_uint_eq(s.refused, 3);
    ck_assert_uint_eq(s.current, 4096);
    ck_assert_uint_eq(s.limit, 4096);
    dsv4_release(a, p);
    dsv4_release(a, q);
    dsv4_allocator_free(a);
}
END_TEST

static void *hammer(void *p)
{
    dsv4_allocator *a = p;
    for (int i = 0; i < 2000; i++) {
        void *b = dsv4_alloc(a, (size_t)(i % 97) + 1);
        dsv4_release(a, b);
    }
    return NULL;
}

START_TEST(threads_balance)
{
    dsv4_allocator *a;
    ck_assert_int_eq(dsv4_allocator_create(0, &a, NULL), DSV4_OK);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, hammer, a);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    dsv4_alloc_stats s = dsv4_allocator_stats(a);
    ck_assert_uint_eq(s.current, 0);
    ck_assert_uint_eq(s.count, 8000);
    ck_assert_uint_le(s.peak, 4 * 97);
    dsv4_allocator_free(a);
}
END_TEST

Suite *alloc_suite(void)
{
    Suite *s = suite_create("alloc");
    TCase *tc = tcase_create("alloc");
    tcase_add_test(tc, accounting_and_peak);
    tcase_add_test(tc, limit_refuses_cleanly);
    tcase_add_test(tc, threads_balance);
    suite_add_tcase(s, tc);
    return s;
}
