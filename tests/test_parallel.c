/* core/parallel.c: the persistent pool behind dsv4_parallel_for. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/parallel.h"

Suite *parallel_suite(void);

typedef struct {
    _Atomic int *hits; /* per index */
    int64_t n, grain;
    _Atomic int calls;
    _Atomic int bad_edges; /* a range edge not on a grain multiple (but n) */
} cover_ctx;

static void cover(void *p, int64_t b, int64_t e)
{
    cover_ctx *c = p;
    atomic_fetch_add(&c->calls, 1);
    if (b % c->grain != 0 || (e % c->grain != 0 && e != c->n))
        atomic_fetch_add(&c->bad_edges, 1);
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&c->hits[i], 1);
}

/* Runs one loop and checks every index ran exactly once in at most `threads` ranges. */
static void check_cover(int threads, int64_t n, int64_t grain)
{
    cover_ctx c;
    c.hits = calloc((size_t)n + 1, sizeof *c.hits);
    ck_assert_ptr_nonnull(c.hits);
    c.n = n;
    c.grain = grain < 1 ? 1 : grain;
    atomic_init(&c.calls, 0);
    atomic_init(&c.bad_edges, 0);
    dsv4_parallel_for(threads, n, grain, cover, &c);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(atomic_load(&c.hits[i]) == 1, "threads %d n %lld grain %lld: index %lld ran %d times",
                      threads, (long long)n, (long long)grain, (long long)i, atomic_load(&c.hits[i]));
    ck_assert_int_le(atomic_load(&c.calls), threads < 1 ? 1 : threads);
    ck_assert_int_eq(atomic_load(&c.bad_edges), 0);
    free(c.hits);
}

START_TEST(every_index_once)
{
    const int th[] = {1, 2, 3, 4, 7};
    const int64_t ns[] = {1, 2, 5, 16, 17, 1000, 4099};
    const int64_t gs[] = {0, 1, 3, 16, 4096};
    for (size_t a = 0; a < sizeof th / sizeof th[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (size_t g = 0; g < sizeof gs / sizeof gs[0]; g++)
                check_cover(th[a], ns[b], gs[g]);
    dsv4_parallel_for(4, 0, 1, cover, NULL); /* n = 0: fn never called (ctx NULL would crash) */
}
END_TEST

/* Many back-to-back loops: workers that miss a wake-up or run a range twice show up here. */
START_TEST(back_to_back_loops)
{
    for (int r = 0; r < 3000; r++)
        check_cover(1 + r % 4, 1 + r % 97, 1 + r % 5);
}
END_TEST

START_TEST(pool_persists_and_shuts_down)
{
    dsv4_parallel_shutdown();
    ck_assert_int_eq(dsv4_parallel_pool_size(), 0);
    check_cover(3, 300, 1);
    ck_assert_int_eq(dsv4_parallel_pool_size(), 2); /* the caller takes range 0 */
    check_cover(2, 300, 1);
    ck_assert_int_eq(dsv4_parallel_pool_size(), 2); /* kept, not shrunk or recreated */
    dsv4_parallel_shutdown();
    dsv4_parallel_shutdown(); /* idempotent */
    ck_assert_int_eq(dsv4_parallel_pool_size(), 0);
    check_cover(2, 300, 1); /* a new pool after shutdown */
    ck_assert_int_eq(dsv4_parallel_pool_size(), 1);
    dsv4_parallel_shutdown();
}
END_TEST

/* A loop inside a loop body runs (serially on a pool worker, on own threads elsewhere). */
typedef struct {
    _Atomic int64_t sum;
} nest_ctx;

static void inner(void *p, int64_t b, int64_t e)
{
    nest_ctx *c = p;
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&c->sum, i);
}

static void outer(void *p, int64_t b, int64_t e)
{
    for (int64_t i = b; i < e; i++)
        dsv4_parallel_for(2, 100, 1, inner, p);
}

START_TEST(nested_loops)
{
    nest_ctx c;
    atomic_init(&c.sum, 0);
    dsv4_parallel_for(2, 8, 1, outer, &c);
    ck_assert_int_eq(atomic_load(&c.sum), 8 * 4950);
}
END_TEST

/* Callers on several threads at once: one gets the pool, the others their own threads. */
static void *caller(void *p)
{
    (void)p;
    for (int r = 0; r < 300; r++)
        check_cover(2 + r % 3, 50 + r, 1);
    return NULL;
}

START_TEST(concurrent_callers)
{
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, caller, NULL), 0);
    caller(NULL);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
}
END_TEST

Suite *parallel_suite(void)
{
    Suite *s = suite_create("parallel");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, every_index_once);
    tcase_add_test(tc, back_to_back_loops);
    tcase_add_test(tc, pool_persists_and_shuts_down);
    tcase_add_test(tc, nested_loops);
    tcase_add_test(tc, concurrent_callers);
    suite_add_tcase(s, tc);
    return s;
}
