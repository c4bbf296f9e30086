/* bench/timeline.c's summary of a step's kernels (bench_cuda --timeline) on hand-made records:
 * kernel names shortened from their mangled forms, graph replays split by correlation id and eager
 * calls by start time, kernels on a forked stream starting in either order, the medians of each
 * kernel's start, duration and the idle before it, the step's span, busy time and sum, and the
 * records that do not make steps refused with a reason; and bench/group_fill.h's count of the
 * grouped GEMM's rows and padded rows. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench/group_fill.h"
#include "bench/timeline.h"

Suite *timeline_suite(void);

START_TEST(short_names)
{
    char b[TL_NAME];
    tl_short_name("_ZN8dsv4cuda38_GLOBAL__N__426b78c9_6_dec_cu_16aef3e25k_decILi2ELi1ELb0ELi3ELb1EEEvNS_8FastArgsE", b,
                  sizeof b);
    ck_assert_str_eq(b, "k_dec<2,1,0,3,1>");
    tl_short_name("_ZN8dsv4cuda48_GLOBAL__N__8275f6de_15_logits_small_cu_ab1eb84214k_logits_smallILi4ELb1EEEvNS_10LogitsArgsE",
                  b, sizeof b);
    ck_assert_str_eq(b, "k_logits_small<4,1>");
    tl_short_name("_ZN8dsv4cuda7k_quantEPKfi", b, sizeof b); /* no template arguments */
    ck_assert_str_eq(b, "k_quant");
    tl_short_name("_ZN8dsv4cuda5k_twoILin3EN4cute5ShapeEEEvv", b, sizeof b); /* a negative, then a type */
    ck_assert_str_eq(b, "k_two<-3,..>");
    tl_short_name("_ZN7cutlass13device_kernelIN4cute6KernelEEEvNT_6ParamsE", b, sizeof b);
    ck_assert_str_eq(b, "cutlass::device_kernel");
    tl_short_name("copy_kernel", b, sizeof b); /* not mangled */
    ck_assert_str_eq(b, "copy_kernel");
    char s4[8];
    tl_short_name("_ZN8dsv4cuda5k_decILi2ELi1EEEvv", s4, sizeof s4); /* cut to the buffer */
    ck_assert_int_eq((int)strlen(s4), 7);
    tl_short_name("_Z", b, sizeof b);
    ck_assert_str_eq(b, "_Z");
}
END_TEST

static tl_kernel kr(const char *name, uint64_t start, uint64_t end, uint32_t stream, uint32_t corr)
{
    tl_kernel k;
    memset(&k, 0, sizeof k);
    snprintf(k.name, sizeof k.name, "%s", name);
    k.start = start, k.end = end, k.stream = stream, k.corr = corr;
    return k;
}

/* Three graph replays of a step: a, then b on the main stream beside s on a fork (s starts first
   in step 1), then c after both; records shuffled. */
START_TEST(graph_steps)
{
    tl_kernel r[12];
    int n = 0;
    for (uint32_t st = 0; st < 3; st++) {
        const uint64_t t0 = 1000000ull * (st + 1);
        const uint64_t jit = st * 1000ull; /* step 2's b lasts 1 us longer */
        r[n++] = kr("c", t0 + 14000 + jit, t0 + 20000 + jit, 7, 40 + st);
        r[n++] = kr("a", t0, t0 + 2000, 7, 40 + st);
        r[n++] = kr("b", t0 + (st == 1 ? 3500 : 3000), t0 + 12000 + jit, 7, 40 + st);
        r[n++] = kr("s", t0 + (st == 1 ? 3000 : 3200), t0 + 9000, 9, 40 + st);
    }
    tl_summary s;
    char err[200] = "";
    ck_assert_msg(tl_summarize(r, n, 3, &s, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(s.steps, 3);
    ck_assert_int_eq(s.kernels, 4);
    ck_assert_str_eq(s.rows[0].name, "a");
    ck_assert_str_eq(s.rows[1].name, "b"); /* step 0's order */
    ck_assert_str_eq(s.rows[2].name, "s");
    ck_assert_str_eq(s.rows[3].name, "c");
    ck_assert_int_eq(s.rows[0].stream, 0);
    ck_assert_int_eq(s.rows[1].stream, 0);
    ck_assert_int_eq(s.rows[2].stream, 1);
    ck_assert_int_eq(s.rows[3].stream, 0);
    ck_assert(fabs(s.rows[0].dur_us - 2.0) < 1e-9);
    ck_assert(fabs(s.rows[1].start_us - 3.0) < 1e-9); /* median of 3.0, 3.5, 3.0 */
    ck_assert(fabs(s.rows[1].dur_us - 9.5) < 1e-9);   /* 9.0, 9.5, 11.0 */
    ck_assert(fabs(s.rows[1].gap_us - 1.0) < 1e-9);   /* after a's end: 1.0, 0 (s began first), 1.0 */
    ck_assert(fabs(s.rows[2].gap_us) < 1e-9);         /* s: 0 (b runs), 1.0, 0 */
    ck_assert(fabs(s.rows[3].gap_us - 2.0) < 1e-9);   /* c after b: 2.0 each */
    ck_assert(fabs(s.span_us - 21.0) < 1e-9);         /* 20, 21, 22 */
    ck_assert(fabs(s.busy_us - 18.0) < 1e-9);         /* a 2 + b|s 9, 10, 11 + c 6 */
    ck_assert(fabs(s.sum_us - 23.5) < 1e-9);          /* 22.8, 23.5, 24.8 */
}
END_TEST

/* Eager calls: every kernel its own launch; the records split into equal runs by start time. */
START_TEST(eager_steps)
{
    tl_kernel r[6];
    int n = 0;
    for (uint32_t st = 0; st < 3; st++) {
        const uint64_t t0 = 100000ull * st;
        r[n++] = kr("y", t0 + 5000, t0 + 6000, 3, 2 * st + 1);
        r[n++] = kr("x", t0, t0 + 4000, 3, 2 * st);
    }
    tl_summary s;
    char err[200] = "";
    ck_assert_msg(tl_summarize(r, n, 3, &s, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(s.kernels, 2);
    ck_assert_str_eq(s.rows[0].name, "x");
    ck_assert(fabs(s.rows[1].gap_us - 1.0) < 1e-9);
    ck_assert(fabs(s.busy_us - 5.0) < 1e-9);
    ck_assert(fabs(s.span_us - 6.0) < 1e-9);
    /* 5 records do not make 3 steps; a step with another kernel is named */
    ck_assert_int_eq(tl_summarize(r, 5, 3, &s, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "do not split into 3 steps") != NULL, "%s", err);
    r[3] = kr("z", 100000 + 5000, 100000 + 6000, 3, 3);
    ck_assert_int_eq(tl_summarize(r, n, 3, &s, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "step 1 runs z") != NULL, "%s", err);
    ck_assert_int_eq(tl_summarize(r, 0, 3, &s, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no kernels") != NULL, "%s", err);
}
END_TEST

/* Graph replays whose launches hold different numbers of kernels are refused. */
START_TEST(uneven_launches)
{
    tl_kernel r[4] = {kr("a", 0, 10, 1, 5), kr("b", 20, 30, 1, 5), kr("a", 100, 110, 1, 6), kr("a", 120, 130, 1, 7)};
    tl_summary s;
    char err[200] = "";
    ck_assert_int_eq(tl_summarize(r, 4, 3, &s, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "different numbers") != NULL || strstr(err, "step") != NULL, "%s", err);
}
END_TEST

/* bench/group_fill.h: the grouped GEMM's groups by chunk (an expert's rows of two chunks are two
   groups), only those above the cut, padded to whole tiles; pruned slots counted nowhere. */
START_TEST(group_fill_by_chunk)
{
    /* K 2, E 4, chunks of 3 tokens, cut 1, tiles of 4: chunk 0 has expert 0 thrice (a group: 3
       rows, 4 padded), 1 and 2 once; chunk 1 has expert 3 twice (2 rows, 4 padded) and 2 once,
       and two pruned slots (ids E and -1) */
    const int32_t ids[] = {0, 1, 0, 2, 0, 4, 3, 2, 3, -1};
    bench_fill f;
    ck_assert_int_eq(bench_group_fill(ids, 5, 2, 4, 3, 1, 4, &f), 0);
    ck_assert_uint_eq(f.groups, 2);
    ck_assert_uint_eq(f.rows, 5);
    ck_assert_uint_eq(f.padded, 8);
    ck_assert_uint_eq(f.slots, 8);
    /* one chunk of all five tokens: expert 0 (3), 2 (2), 3 (2) above the cut; 1 not */
    ck_assert_int_eq(bench_group_fill(ids, 5, 2, 4, 128, 1, 4, &f), 0);
    ck_assert_uint_eq(f.groups, 3);
    ck_assert_uint_eq(f.rows, 7);
    ck_assert_uint_eq(f.padded, 12);
    /* cut 2: expert 0 alone; tiles of 128 */
    ck_assert_int_eq(bench_group_fill(ids, 5, 2, 4, 128, 2, 128, &f), 0);
    ck_assert_uint_eq(f.groups, 1);
    ck_assert_uint_eq(f.rows, 3);
    ck_assert_uint_eq(f.padded, 128);
    ck_assert_int_eq(bench_group_fill(ids, 0, 2, 4, 3, 1, 4, &f), 0);
    ck_assert_uint_eq(f.slots + f.groups + f.padded, 0);
    ck_assert_int_eq(bench_group_fill(ids, 5, 2, 4, 0, 1, 4, &f), -1);
    ck_assert_int_eq(bench_group_fill(ids, 5, 0, 4, 3, 1, 4, &f), -1);
    ck_assert_int_eq(bench_group_fill(NULL, 5, 2, 4, 3, 1, 4, &f), -1);
    ck_assert_int_eq(bench_group_fill(ids, 5, 2, 4, 3, 1, 0, &f), -1);
}
END_TEST

Suite *timeline_suite(void)
{
    Suite *s = suite_create("timeline");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, short_names);
    tcase_add_test(tc, graph_steps);
    tcase_add_test(tc, eager_steps);
    tcase_add_test(tc, uneven_launches);
    tcase_add_test(tc, group_fill_by_chunk);
    suite_add_tcase(s, tc);
    return s;
}
