#include <check.h>
#include <math.h>
#include <stdint.h>

#include "dsv4moe/rng.h"

Suite *rng_suite(void);

START_TEST(values_are_fixed)
{
    /* Pinned outputs: a change here changes every generated file. */
    uint64_t k = dsv4_rng_key(1, "layers.5.gate");
    ck_assert_uint_eq(k, 0xf1a86af983e9bfb7ULL);
    ck_assert_uint_eq(dsv4_rng_u64(k, 0), 0x70e630eb077c4327ULL);
    ck_assert(dsv4_rng_normal(k, 12345) == 0x1.6696bp-1f);
    ck_assert(dsv4_rng_uniform(k, 7) == 0x1.7cb72ep-1f);
    ck_assert_uint_ne(k, dsv4_rng_key(2, "layers.5.gate"));
    ck_assert_uint_ne(k, dsv4_rng_key(1, "layers.5.bias"));
    ck_assert_uint_eq(dsv4_rng_u64(k, 0), dsv4_rng_u64(k, 0));
    ck_assert_uint_ne(dsv4_rng_u64(k, 0), dsv4_rng_u64(k, 1));
    /* Order independence: element 1000 is the same whether computed first or last. */
    uint64_t late = 0, early = dsv4_rng_u64(k, 1000);
    for (uint64_t i = 0; i <= 1000; i++)
        late = dsv4_rng_u64(k, i);
    ck_assert_uint_eq(early, late);
    ck_assert_uint_eq(dsv4_rng_key(0, ""), dsv4_rng_key(0, NULL));
}
END_TEST

START_TEST(uniform_and_below_ranges)
{
    uint64_t k = dsv4_rng_key(7, "u");
    double sum = 0;
    uint32_t hist[10] = {0};
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        float u = dsv4_rng_uniform(k, (uint64_t)i);
        ck_assert(u >= 0.0f && u < 1.0f);
        sum += u;
        uint32_t b = dsv4_rng_below(k, (uint64_t)i, 10);
        ck_assert_uint_lt(b, 10);
        hist[b]++;
    }
    ck_assert(fabs(sum / n - 0.5) < 0.005);
    for (int b = 0; b < 10; b++)
        ck_assert_msg(hist[b] > n / 10 * 0.95 && hist[b] < n / 10 * 1.05, "bucket %d: %u", b, hist[b]);
    ck_assert_uint_eq(dsv4_rng_below(k, 3, 1), 0);
}
END_TEST

START_TEST(normal_moments)
{
    uint64_t k = dsv4_rng_key(3, "n");
    double s1 = 0, s2 = 0, s4 = 0;
    const int n = 400000;
    int beyond3 = 0;
    for (int i = 0; i < n; i++) {
        double z = dsv4_rng_normal(k, (uint64_t)i);
        ck_assert(fabs(z) <= 3.4642);
        s1 += z;
        s2 += z * z;
        s4 += z * z * z * z;
        beyond3 += fabs(z) > 3.0;
    }
    double mean = s1 / n, var = s2 / n - mean * mean;
    ck_assert_msg(fabs(mean) < 0.01, "mean %g", mean);
    ck_assert_msg(fabs(var - 1.0) < 0.01, "variance %g", var);
    /* Irwin-Hall(4) has kurtosis 3 - 1.2/4 = 2.7. */
    ck_assert_msg(fabs(s4 / n - 2.7) < 0.05, "fourth moment %g", s4 / n);
    ck_assert_int_gt(beyond3, 0);
}
END_TEST

Suite *rng_suite(void)
{
    Suite *s = suite_create("rng");
    TCase *tc = tcase_create("rng");
    tcase_add_test(tc, values_are_fixed);
    tcase_add_test(tc, uniform_and_below_ranges);
    tcase_add_test(tc, normal_moments);
    suite_add_tcase(s, tc);
    return s;
}
