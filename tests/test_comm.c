/* The communicator: sim collectives over threads, fingerprints, deadlock reports, poisoning. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4moe/comm.h"
#include "dsv4moe/formats.h"
#include "tests/testutil.h"

Suite *comm_suite(void);

/* ---------------- harness: one pthread per rank ---------------- */

typedef struct rank_ctx rank_ctx;
typedef void (*rank_fn)(rank_ctx *ctx);

struct rank_ctx {
    dsv4_comm *c;
    int rank, n;
    void *arg;          /* shared by the test */
    rank_fn fn;
    char fail[512];     /* first failed check inside the thread */
    dsv4_status st;     /* what the test wants the main thread to look at */
    dsv4_error err;
    dsv4_status st2;
    dsv4_error err2;
    double elapsed;
    double elapsed2;
};

/* Checks inside a rank thread record the first failure and leave the body (the main thread asserts). */
#define T_CHECK(ctx, cond, ...)                                                                  \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            if (!(ctx)->fail[0])                                                                 \
                snprintf((ctx)->fail, sizeof (ctx)->fail, "rank %d: line %d: ", (ctx)->rank, __LINE__); \
            size_t l_ = strlen((ctx)->fail);                                                     \
            snprintf((ctx)->fail + l_, sizeof (ctx)->fail - l_, __VA_ARGS__);                  \
            return;                                                                              \
        }                                                                                        \
    } while (0)

#define T_OK(ctx, call)                                                                          \
    do {                                                                                         \
        dsv4_error e_;                                                                           \
        dsv4_error_clear(&e_);                                                                   \
        dsv4_status s_ = (call);                                                                 \
        T_CHECK(ctx, s_ == DSV4_OK, "%s -> %d: %s", #call, (int)s_, e_.message);                 \
    } while (0)

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *thread_main(void *p)
{
    rank_ctx *ctx = p;
    ctx->fn(ctx);
    return NULL;
}

static dsv4_sim_world *make_world(int n, int tp, int dp, int ep, int timeout_ms)
{
    dsv4_comm_groups g;
    dsv4_error err;
    ck_assert_int_eq(dsv4_comm_groups_init(&g, n, tp, dp, ep, &err), DSV4_OK);
    dsv4_sim_options opt;
    dsv4_sim_options_init(&opt);
    if (timeout_ms > 0)
        opt.timeout_ms = timeout_ms;
    dsv4_sim_world *w = NULL;
    ck_assert_int_eq(dsv4_sim_world_create(&g, &opt, &w, &err), DSV4_OK);
    ck_assert_ptr_nonnull(w);
    return w;
}

/* Runs fn on every rank of w as threads; ctx[n] is returned to the caller for further checks. */
static void run_world(dsv4_sim_world *w, int n, rank_fn fn, void *arg, rank_ctx *ctx)
{
    pthread_t th[DSV4_COMM_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        memset(&ctx[r], 0, sizeof ctx[r]);
        ctx[r].c = dsv4_sim_world_comm(w, r);
        ck_assert_ptr_nonnull(ctx[r].c);
        ctx[r].rank = r;
        ctx[r].n = n;
        ctx[r].arg = arg;
        ctx[r].fn = fn;
        dsv4_error_clear(&ctx[r].err);
        dsv4_error_clear(&ctx[r].err2);
    }
    for (int r = 0; r < n; r++)
        ck_assert_int_eq(pthread_create(&th[r], NULL, thread_main, &ctx[r]), 0);
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        ck_assert_msg(ctx[r].fail[0] == '\0', "%s", ctx[r].fail);
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Values of widely varying magnitude and sign, so the summation order changes the rounding. */
static float wild(int r, uint64_t e)
{
    uint64_t h = mix((uint64_t)r * 1000003u + e);
    float m = 1.0f + (float)(h % 8192) / 8192.0f;
    int ex = (int)((h >> 13) % 40) - 12;
    float v = ldexpf(m, ex);
    return (h >> 40) & 1 ? -v : v;
}

/* ---------------- all_reduce ---------------- */

typedef struct ar_arg {
    dsv4_dtype dt;
    uint64_t count;
    unsigned char *buf[DSV4_COMM_MAX_RANKS]; /* in: the rank's values; out: the sum */
} ar_arg;

static void ar_body(rank_ctx *ctx)
{
    ar_arg *a = ctx->arg;
    T_OK(ctx, dsv4_comm_all_reduce(ctx->c, DSV4_GROUP_WORLD, a->dt, a->buf[ctx->rank], a->count, "ar", &e_));
}

static void check_all_reduce(int n, dsv4_dtype dt, uint64_t count)
{
    dsv4_sim_world *w = make_world(n, n, 1, 1, 0);
    ar_arg a = {dt, count, {0}};
    size_t dsz = dsv4_dtype_size(dt);
    for (int r = 0; r < n; r++) {
        a.buf[r] = malloc(count * dsz);
        for (uint64_t e = 0; e < count; e++) {
            float v = wild(r, e);
            if (dt == DSV4_DTYPE_F32)
                memcpy(a.buf[r] + e * dsz, &v, dsz);
            else if (dt == DSV4_DTYPE_BF16) {
                uint16_t b = dsv4_f32_to_bf16(v);
                memcpy(a.buf[r] + e * dsz, &b, dsz);
            } else if (dt == DSV4_DTYPE_I64) {
                int64_t x = (int64_t)mix((uint64_t)r * 77 + e) >> 8; /* |x| < 2^55: no overflow for 8 ranks */
                memcpy(a.buf[r] + e * dsz, &x, dsz);
            } else if (dt == DSV4_DTYPE_F64) {
                double x = (double)v * 1e-3;
                memcpy(a.buf[r] + e * dsz, &x, dsz);
            } else if (dt == DSV4_DTYPE_I32) {
                int32_t x = (int32_t)(mix((uint64_t)r * 31 + e) % 2000001) - 1000000;
                memcpy(a.buf[r] + e * dsz, &x, dsz);
            }
        }
    }
    /* Expected: ascending-rank sum, computed from the inputs before they are overwritten. */
    unsigned char *want = malloc(count * dsz + 1);
    int order_matters = 0, rounded_once = 0;
    for (uint64_t e = 0; e < count; e++) {
        if (dt == DSV4_DTYPE_F32) {
            float s = 0, d = 0, x;
            memcpy(&s, a.buf[0] + e * 4, 4);
            for (int r = 1; r < n; r++) {
                memcpy(&x, a.buf[r] + e * 4, 4);
                s += x;
            }
            memcpy(&d, a.buf[n - 1] + e * 4, 4);
            for (int r = n - 2; r >= 0; r--) {
                memcpy(&x, a.buf[r] + e * 4, 4);
                d += x;
            }
            order_matters += s != d;
            memcpy(want + e * 4, &s, 4);
        } else if (dt == DSV4_DTYPE_BF16) {
            uint16_t b;
            memcpy(&b, a.buf[0] + e * 2, 2);
            float s = dsv4_bf16_to_f32(b), step = s;
            for (int r = 1; r < n; r++) {
                memcpy(&b, a.buf[r] + e * 2, 2);
                s += dsv4_bf16_to_f32(b);
                step = dsv4_round_bf16(step + dsv4_bf16_to_f32(b));
            }
            uint16_t o = dsv4_f32_to_bf16(s);
            rounded_once += o != dsv4_f32_to_bf16(step);
            memcpy(want + e * 2, &o, 2);
        } else if (dt == DSV4_DTYPE_I64) {
            int64_t s = 0, x;
            for (int r = 0; r < n; r++) {
                memcpy(&x, a.buf[r] + e * 8, 8);
                s += x;
            }
            memcpy(want + e * 8, &s, 8);
        } else if (dt == DSV4_DTYPE_F64) {
            double s, x;
            memcpy(&s, a.buf[0] + e * 8, 8);
            for (int r = 1; r < n; r++) {
                memcpy(&x, a.buf[r] + e * 8, 8);
                s += x;
            }
            memcpy(want + e * 8, &s, 8);
        } else if (dt == DSV4_DTYPE_I32) {
            int32_t s = 0, x;
            for (int r = 0; r < n; r++) {
                memcpy(&x, a.buf[r] + e * 4, 4);
                s += x;
            }
            memcpy(want + e * 4, &s, 4);
        }
    }
    if (n >= 4 && count >= 256) {
        if (dt == DSV4_DTYPE_F32)
            ck_assert_msg(order_matters > 0, "the test values do not make the order matter");
        if (dt == DSV4_DTYPE_BF16)
            ck_assert_msg(rounded_once > 0, "the test values do not distinguish rounding once");
    }
    rank_ctx ctx[DSV4_COMM_MAX_RANKS];
    run_world(w, n, ar_body, &a, ctx);
    for (int r = 0; r < n; r++) {
        ck_assert_msg(count == 0 || memcmp(a.buf[r], want, count * dsz) == 0, "%s n=%d: rank %d differs",
                      dsv4_dtype_name(dt), n, r);
        ck_assert(count == 0 || memcmp(a.buf[r], a.buf[0], count * dsz) == 0);
    }
    for (int r = 0; r < n; r++)
        free(a.buf[r]);
    free(want);
    dsv4_sim_world_free(w);
}

START_TEST(all_reduce_rank_order)
{
    const int ns[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        check_all_reduce(ns[i], DSV4_DTYPE_F32, 1000);
        check_all_reduce(ns[i], DSV4_DTYPE_BF16, 1000);
        check_all_reduce(ns[i], DSV4_DTYPE_I64, 257);
        check_all_reduce(ns[i], DSV4_DTYPE_F64, 100);
        check_all_reduce(ns[i], DSV4_DTYPE_I32, 100);
        check_all_reduce(ns[i], DSV4_DTYPE_F32, 1);
    }
}
END_TEST

static void ar_null_body(rank_ctx *ctx)
{
    T_OK(ctx, dsv4_comm_all_reduce(ctx->c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, NULL, 0, "empty", &e_));
    T_OK(ctx, dsv4_comm_all_gather(ctx->c, DSV4_GROUP_TP, DSV4_DTYPE_U8, NULL, 0, NULL, "empty", &e_));
    uint64_t zeros[DSV4_COMM_MAX_RANKS] = {0};
    T_OK(ctx, dsv4_comm_all_to_allv(ctx->c, DSV4_GROUP_EP, DSV4_DTYPE_F8_E4M3, NULL, zeros, NULL, zeros, "empty", &e_));
    size_t nt;
    const dsv4_coll_record *t = dsv4_comm_trace(ctx->c, &nt);
    T_CHECK(ctx, nt == 3, "trace has %zu records", nt);
    T_CHECK(ctx, t[0].count == 0 && t[1].count == 0 && t[2].count == 0, "counts not 0");
}

START_TEST(count_zero_is_a_collective)
{
    dsv4_sim_world *w = make_world(4, 2, 2, 2, 0);
    rank_ctx ctx[4];
    run_world(w, 4, ar_null_body, NULL, ctx);
    dsv4_sim_world_free(w);
}
END_TEST

/* ---------------- all_gather ---------------- */

static void ag_body(rank_ctx *ctx)
{
    int r = ctx->rank, n = ctx->n;
    uint16_t send[5], recv[5 * 8 + 1];
    for (int k = 0; k < 5; k++)
        send[k] = (uint16_t)(r * 100 + k);
    recv[5 * n] = 0xBEEF;
    T_OK(ctx, dsv4_comm_all_gather(ctx->c, DSV4_GROUP_WORLD, DSV4_DTYPE_U16, send, 5, recv, "ag", &e_));
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 5; k++)
            T_CHECK(ctx, recv[j * 5 + k] == j * 100 + k, "recv[%d] = %u", j * 5 + k, recv[j * 5 + k]);
    T_CHECK(ctx, recv[5 * n] == 0xBEEF, "wrote past the end");

    /* In place: send is this rank's block of recv. */
    double buf[3 * 8];
    for (int k = 0; k < 3; k++)
        buf[r * 3 + k] = r + k * 0.25;
    T_OK(ctx, dsv4_comm_all_gather(ctx->c, DSV4_GROUP_WORLD, DSV4_DTYPE_F64, buf + r * 3, 3, buf, "ag2", &e_));
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 3; k++)
            T_CHECK(ctx, buf[j * 3 + k] == j + k * 0.25, "in place recv[%d] = %g", j * 3 + k, buf[j * 3 + k]);

    /* Over tp (blocks of 2): only the block's ranks, in group order. */
    int32_t one = r, two[2] = {-1, -1};
    T_OK(ctx, dsv4_comm_all_gather(ctx->c, DSV4_GROUP_TP, DSV4_DTYPE_I32, &one, 1, two, "tp ag", &e_));
    T_CHECK(ctx, two[0] == r / 2 * 2 && two[1] == r / 2 * 2 + 1, "tp gather %d %d", two[0], two[1]);
}

START_TEST(all_gather_concatenates)
{
    const int ns[] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        dsv4_sim_world *w = make_world(ns[i], 2, ns[i] / 2, 2, 0);
        rank_ctx ctx[8];
        run_world(w, ns[i], ag_body, NULL, ctx);
        dsv4_sim_world_free(w);
    }
}
END_TEST

/* ---------------- all_to_allv ---------------- */

static uint64_t a2a_count(int i, int j)
{
    return (uint64_t)((i * 7 + j * 3) % 5); /* 0 .. 4, zero on the diagonal of rank 0 and elsewhere */
}

static int32_t a2a_value(int src, int dst, uint64_t k)
{
    return (int32_t)(src * 1000000 + dst * 1000 + (int)k);
}

static void a2a_body(rank_ctx *ctx)
{
    int r = ctx->rank, n = ctx->n;
    uint64_t sc[DSV4_COMM_MAX_RANKS], rc[DSV4_COMM_MAX_RANKS], ns = 0, nr = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = a2a_count(r, j);
        rc[j] = a2a_count(j, r);
        ns += sc[j];
        nr += rc[j];
    }
    int32_t *send = malloc((ns + 1) * sizeof *send), *recv = malloc((nr + 1) * sizeof *recv);
    uint64_t p = 0;
    for (int j = 0; j < n; j++)
        for (uint64_t k = 0; k < sc[j]; k++)
            send[p++] = a2a_value(r, j, k);
    for (uint64_t i = 0; i <= nr; i++)
        recv[i] = -7;
    dsv4_error e;
    dsv4_status st = dsv4_comm_all_to_allv(ctx->c, DSV4_GROUP_WORLD, DSV4_DTYPE_I32, send, sc, recv, rc, "a2a", &e);
    int bad = -1;
    if (st == DSV4_OK) {
        p = 0;
        for (int i = 0; i < n && bad < 0; i++)
            for (uint64_t k = 0; k < rc[i]; k++, p++)
                if (recv[p] != a2a_value(i, r, k)) {
                    bad = (int)p;
                    break;
                }
        if (recv[nr] != -7)
            bad = (int)nr;
    }
    free(send);
    free(recv);
    T_CHECK(ctx, st == DSV4_OK, "all_to_allv: %s", e.message);
    T_CHECK(ctx, bad < 0, "recv[%d] wrong", bad);
    size_t nt;
    const dsv4_coll_record *t = dsv4_comm_trace(ctx->c, &nt);
    T_CHECK(ctx, nt == 1 && t[0].count == ns, "record count %llu, want %llu", (unsigned long long)t[0].count,
            (unsigned long long)ns);
}

START_TEST(all_to_allv_uneven)
{
    ck_assert_uint_eq(a2a_count(0, 0), 0);
    const int ns[] = {1, 2, 4, 5, 8};
    for (int i = 0; i < 5; i++) {
        dsv4_sim_world *w = make_world(ns[i], ns[i], 1, 1, 0);
        rank_ctx ctx[8];
        run_world(w, ns[i], a2a_body, NULL, ctx);
        dsv4_sim_world_free(w);
    }
}
END_TEST

/* ---------------- barrier ---------------- */

typedef struct barrier_arg {
    atomic_int count[50];
} barrier_arg;

static void barrier_body(rank_ctx *ctx)
{
    barrier_arg *a = ctx->arg;
    for (int round = 0; round < 50; round++) {
        atomic_fetch_add(&a->count[round], 1);
        T_OK(ctx, dsv4_comm_barrier(ctx->c, DSV4_GROUP_WORLD, "b", &e_));
        int seen = atomic_load(&a->count[round]);
        T_CHECK(ctx, seen == ctx->n, "round %d: %d ranks had arrived when the barrier released", round, seen);
    }
}

START_TEST(barrier_synchronizes)
{
    dsv4_sim_world *w = make_world(8, 8, 1, 1, 0);
    barrier_arg a;
    for (int i = 0; i < 50; i++)
        atomic_init(&a.count[i], 0);
    rank_ctx ctx[8];
    run_world(w, 8, barrier_body, &a, ctx);
    dsv4_sim_world_free(w);
}
END_TEST

/* ---------------- groups ---------------- */

static void groups4_body(rank_ctx *ctx)
{
    int r = ctx->rank;
    dsv4_comm *c = ctx->c;
    T_CHECK(ctx, dsv4_comm_rank(c) == r, "rank");
    T_CHECK(ctx, dsv4_comm_group_size(c, DSV4_GROUP_WORLD) == 4 && dsv4_comm_group_rank(c, DSV4_GROUP_WORLD) == r,
            "world");
    T_CHECK(ctx, dsv4_comm_group_size(c, DSV4_GROUP_TP) == 2 && dsv4_comm_group_rank(c, DSV4_GROUP_TP) == r % 2, "tp");
    T_CHECK(ctx, dsv4_comm_group_size(c, DSV4_GROUP_DP) == 2 && dsv4_comm_group_rank(c, DSV4_GROUP_DP) == r / 2, "dp");
    T_CHECK(ctx, dsv4_comm_group_size(c, DSV4_GROUP_EP) == 4 && dsv4_comm_group_rank(c, DSV4_GROUP_EP) == r, "ep");
    int64_t v = r + 1;
    T_OK(ctx, dsv4_comm_all_reduce(c, DSV4_GROUP_TP, DSV4_DTYPE_I64, &v, 1, "tp", &e_));
    T_CHECK(ctx, v == (r < 2 ? 3 : 7), "tp sum %lld", (long long)v);
    v = r + 1;
    T_OK(ctx, dsv4_comm_all_reduce(c, DSV4_GROUP_DP, DSV4_DTYPE_I64, &v, 1, "dp", &e_));
    T_CHECK(ctx, v == (r % 2 == 0 ? 4 : 6), "dp sum %lld", (long long)v);
    v = r + 1;
    T_OK(ctx, dsv4_comm_all_reduce(c, DSV4_GROUP_EP, DSV4_DTYPE_I64, &v, 1, "ep", &e_));
    T_CHECK(ctx, v == 10, "ep sum %lld", (long long)v);
}

static void groups8_body(rank_ctx *ctx)
{
    int r = ctx->rank;
    dsv4_comm *c = ctx->c;
    T_CHECK(ctx, dsv4_comm_group_size(c, DSV4_GROUP_EP) == 4 && dsv4_comm_group_rank(c, DSV4_GROUP_EP) == r % 4, "ep");
    T_CHECK(ctx, dsv4_comm_group_size(c, DSV4_GROUP_DP) == 4 && dsv4_comm_group_rank(c, DSV4_GROUP_DP) == r / 2, "dp");
    T_CHECK(ctx, dsv4_comm_group_rank(c, DSV4_GROUP_COUNT) == -1 && dsv4_comm_group_size(c, (dsv4_group)-1) == -1,
            "bad group");
    int32_t v = 1 << r;
    T_OK(ctx, dsv4_comm_all_reduce(c, DSV4_GROUP_EP, DSV4_DTYPE_I32, &v, 1, "ep", &e_));
    T_CHECK(ctx, v == (r < 4 ? 0x0f : 0xf0), "ep sum %#x", (unsigned)v);
    /* all_to_allv over ep: one element to each ep peer, carrying world ranks. */
    int32_t send[4], recv[4];
    uint64_t ones[4] = {1, 1, 1, 1};
    for (int j = 0; j < 4; j++)
        send[j] = r * 10 + j;
    T_OK(ctx, dsv4_comm_all_to_allv(c, DSV4_GROUP_EP, DSV4_DTYPE_I32, send, ones, recv, ones, "ep a2a", &e_));
    for (int i = 0; i < 4; i++)
        T_CHECK(ctx, recv[i] == (r / 4 * 4 + i) * 10 + r % 4, "ep a2a recv[%d] = %d", i, recv[i]);
    float f = (float)r;
    T_OK(ctx, dsv4_comm_all_reduce(c, DSV4_GROUP_DP, DSV4_DTYPE_F32, &f, 1, "dp", &e_));
    T_CHECK(ctx, f == (r % 2 ? 1 + 3 + 5 + 7 : 0 + 2 + 4 + 6), "dp sum %g", f);
}

START_TEST(groups_partition_the_world)
{
    dsv4_sim_world *w = make_world(4, 2, 2, 4, 0);
    rank_ctx ctx[8];
    run_world(w, 4, groups4_body, NULL, ctx);
    dsv4_sim_world_free(w);
    w = make_world(8, 2, 4, 4, 0);
    run_world(w, 8, groups8_body, NULL, ctx);
    dsv4_sim_world_free(w);
}
END_TEST

START_TEST(groups_init_colours_and_errors)
{
    dsv4_comm_groups g;
    dsv4_error err;
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 8, 2, 4, 4, &err), DSV4_OK);
    ck_assert_int_eq(g.world, 8);
    for (int r = 0; r < 8; r++) {
        ck_assert_int_eq(g.color[DSV4_GROUP_TP][r], r / 2);
        ck_assert_int_eq(g.color[DSV4_GROUP_DP][r], r % 2);
        ck_assert_int_eq(g.color[DSV4_GROUP_EP][r], r / 4);
        ck_assert_int_eq(g.color[DSV4_GROUP_WORLD][r], 0);
    }
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 8, 3, 2, 1, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_str_eq(err.message, "comm groups field 'tp': tp 3 x dp 2 = 6 is not world_size 8");
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 6, 2, 3, 4, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_str_eq(err.message, "comm groups field 'ep': ep 4 does not divide world_size 6");
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 0, 1, 1, 1, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_str_eq(err.message, "comm groups field 'world_size': world_size 0 is outside [1, 64]");
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 65, 65, 1, 1, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.message, "world_size 65"));
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 4, 0, 4, 1, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_str_eq(err.message, "comm groups field 'tp': tp 0 must be >= 1");
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 4, 4, 1, 0, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.message, "'ep'"));
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 4, 4, -1, 1, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.message, "'dp'"));
    ck_assert_int_eq(dsv4_comm_groups_init(NULL, 4, 4, 1, 1, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 64, 8, 8, 16, NULL), DSV4_OK);

    /* world creation */
    dsv4_sim_world *w = (dsv4_sim_world *)&g;
    ck_assert_int_eq(dsv4_sim_world_create(NULL, NULL, &w, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_null(w);
    dsv4_comm_groups bad;
    memset(&bad, 0, sizeof bad);
    ck_assert_int_eq(dsv4_sim_world_create(&bad, NULL, &w, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.message, "world 0"));
    dsv4_sim_options opt;
    dsv4_sim_options_init(&opt);
    ck_assert_uint_eq(opt.struct_size, sizeof opt);
    ck_assert_int_eq(opt.timeout_ms, 5000);
    opt.timeout_ms = 0;
    ck_assert_int_eq(dsv4_sim_world_create(&g, &opt, &w, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.message, "timeout_ms 0"));
    opt.timeout_ms = 10;
    opt.struct_size = 0;
    ck_assert_int_eq(dsv4_sim_world_create(&g, &opt, &w, &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.message, "struct_size"));
    dsv4_sim_options_init(NULL);
    ck_assert_int_eq(dsv4_sim_world_create(&g, NULL, &w, &err), DSV4_OK);
    ck_assert_ptr_nonnull(dsv4_sim_world_comm(w, 63));
    ck_assert_ptr_null(dsv4_sim_world_comm(w, 64));
    ck_assert_ptr_null(dsv4_sim_world_comm(w, -1));
    ck_assert_ptr_null(dsv4_sim_world_comm(NULL, 0));
    ck_assert_int_eq(dsv4_comm_group_size(dsv4_sim_world_comm(w, 5), DSV4_GROUP_EP), 16);
    ck_assert_int_eq(dsv4_comm_group_size(dsv4_sim_world_comm(w, 5), DSV4_GROUP_DP), 8);
    ck_assert_int_eq(dsv4_comm_group_rank(dsv4_sim_world_comm(w, 5), DSV4_GROUP_DP), 0);
    ck_assert_int_eq(dsv4_comm_rank(NULL), -1);
    dsv4_sim_world_free(w);
    dsv4_sim_world_free(NULL);

    ck_assert_str_eq(dsv4_group_name(DSV4_GROUP_EP), "ep");
    ck_assert_str_eq(dsv4_group_name(DSV4_GROUP_COUNT), "?");
    ck_assert_str_eq(dsv4_coll_op_name(DSV4_COLL_ALL_TO_ALLV), "all_to_allv");
    ck_assert_str_eq(dsv4_coll_op_name((dsv4_coll_op)9), "?");
}
END_TEST

/* ---------------- trace ---------------- */

static const char long_tag[] = "chunk 0 dispatch, a tag longer than forty-seven characters";

static void trace_body(rank_ctx *ctx)
{
    dsv4_comm *c = ctx->c;
    float x[4] = {1, 2, 3, 4};
    float g[4 * 4];
    float s[8], rv[8];
    uint64_t two[4] = {2, 2, 2, 2};
    for (int i = 0; i < 8; i++)
        s[i] = (float)i;
    T_OK(ctx, dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, x, 4, "step 0 meta", &e_));
    T_OK(ctx, dsv4_comm_barrier(c, DSV4_GROUP_TP, "tp sync", &e_));
    T_OK(ctx, dsv4_comm_all_gather(c, DSV4_GROUP_EP, DSV4_DTYPE_F32, x, 2, g, NULL, &e_));
    T_OK(ctx, dsv4_comm_all_to_allv(c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, s, two, rv, two, long_tag, &e_));
    T_OK(ctx, dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_BF16, NULL, 0, "step 1 meta", &e_));
    T_OK(ctx, dsv4_comm_barrier(c, DSV4_GROUP_TP, "tp sync", &e_));
}

static uint64_t fnv_ref(const uint64_t *a, const uint64_t *b, int n)
{
    uint64_t h = 14695981039346656037ULL;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            uint64_t v = pass ? b[i] : a[i];
            unsigned char bytes[8];
            for (int k = 0; k < 8; k++)
                bytes[k] = (unsigned char)(v >> (8 * k));
            for (int k = 0; k < 8; k++) {
                h ^= bytes[k];
                h *= 1099511628211ULL;
            }
        }
    return h;
}

START_TEST(trace_records_every_collective)
{
    dsv4_sim_world *w = make_world(4, 2, 2, 2, 0);
    rank_ctx ctx[4];
    run_world(w, 4, trace_body, NULL, ctx);
    uint64_t two[4] = {2, 2, 2, 2};
    const struct {
        uint64_t seq;
        dsv4_coll_op op;
        dsv4_group group;
        dsv4_dtype dtype;
        uint64_t count;
        const char *tag;
    } want[] = {
        {0, DSV4_COLL_ALL_REDUCE, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, 4, "step 0 meta"},
        {0, DSV4_COLL_BARRIER, DSV4_GROUP_TP, DSV4_DTYPE_U8, 0, "tp sync"},
        {0, DSV4_COLL_ALL_GATHER, DSV4_GROUP_EP, DSV4_DTYPE_F32, 2, ""},
        {1, DSV4_COLL_ALL_TO_ALLV, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, 8, NULL},
        {2, DSV4_COLL_ALL_REDUCE, DSV4_GROUP_WORLD, DSV4_DTYPE_BF16, 0, "step 1 meta"},
        {1, DSV4_COLL_BARRIER, DSV4_GROUP_TP, DSV4_DTYPE_U8, 0, "tp sync"},
    };
    char trunc[DSV4_COMM_TAG_MAX];
    memcpy(trunc, long_tag, DSV4_COMM_TAG_MAX - 1);
    trunc[DSV4_COMM_TAG_MAX - 1] = '\0';
    ck_assert_uint_eq(strlen(trunc), 47);
    size_t n0;
    const dsv4_coll_record *t0 = dsv4_comm_trace(dsv4_sim_world_comm(w, 0), &n0);
    for (int r = 0; r < 4; r++) {
        size_t nt;
        const dsv4_coll_record *t = dsv4_comm_trace(dsv4_sim_world_comm(w, r), &nt);
        ck_assert_uint_eq(nt, 6);
        for (size_t i = 0; i < nt; i++) {
            ck_assert_uint_eq(t[i].seq, want[i].seq);
            ck_assert_int_eq(t[i].op, want[i].op);
            ck_assert_int_eq(t[i].group, want[i].group);
            ck_assert_int_eq(t[i].dtype, want[i].dtype);
            ck_assert_uint_eq(t[i].count, want[i].count);
            ck_assert_str_eq(t[i].tag, want[i].tag ? want[i].tag : trunc);
            ck_assert_uint_eq(t[i].counts_hash, want[i].op == DSV4_COLL_ALL_TO_ALLV ? fnv_ref(two, two, 4) : 0);
            /* identical across ranks */
            ck_assert_uint_eq(t[i].seq, t0[i].seq);
            ck_assert_int_eq(t[i].op, t0[i].op);
            ck_assert_uint_eq(t[i].counts_hash, t0[i].counts_hash);
            ck_assert_str_eq(t[i].tag, t0[i].tag);
        }
    }
    ck_assert_uint_ne(fnv_ref(two, two, 4), 0);
    size_t cnt = 99;
    ck_assert_ptr_null(dsv4_comm_trace(NULL, &cnt));
    ck_assert_uint_eq(cnt, 0);
    dsv4_sim_world_free(w);
}
END_TEST

/* ---------------- mismatches ---------------- */

static void asym_body(rank_ctx *ctx)
{
    float buf[4] = {0}, out[4];
    uint64_t ones[4] = {1, 1, 1, 1};
    double t = now_s();
    if (ctx->rank == 1)
        ctx->st = dsv4_comm_all_to_allv(ctx->c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, buf, ones, out, ones,
                                        "chunk 0 dispatch", &ctx->err);
    else
        ctx->st = dsv4_comm_all_reduce(ctx->c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, buf, 4, "step 2 meta", &ctx->err);
    ctx->elapsed = now_s() - t;
    /* Poisoned: later collectives, any group, fail at once. */
    t = now_s();
    ctx->st2 = dsv4_comm_barrier(ctx->c, DSV4_GROUP_TP, "after", &ctx->err2);
    ctx->elapsed2 = now_s() - t;
}

START_TEST(asymmetric_schedule_fails_everywhere)
{
    dsv4_sim_world *w = make_world(4, 2, 2, 4, 0);
    rank_ctx ctx[4];
    run_world(w, 4, asym_body, NULL, ctx);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(ctx[r].st, DSV4_ERR_COMM);
        ck_assert_int_eq(ctx[r].err.status, DSV4_ERR_COMM);
        ck_assert_str_eq(ctx[r].err.message,
                         "collective mismatch in group world: rank 0 issued all_reduce #0 (F32 x 4, 'step 2 meta') "
                         "but rank 1 issued all_to_allv #0 (F32 x 4, 'chunk 0 dispatch')");
        ck_assert_double_lt(ctx[r].elapsed, 2.0);
        ck_assert_int_eq(ctx[r].st2, DSV4_ERR_COMM);
        ck_assert_msg(starts_with(ctx[r].err2.message, "world poisoned by an earlier error: collective mismatch"),
                      "%s", ctx[r].err2.message);
        ck_assert_double_lt(ctx[r].elapsed2, 0.5);
    }
    dsv4_sim_world_free(w);
}
END_TEST

/* A rank skips a collective (a replayed graph without its barrier): sequence numbers disagree. */
static void skip_body(rank_ctx *ctx)
{
    float x = 1;
    if (ctx->rank != 3) {
        dsv4_error e;
        if (dsv4_comm_barrier(ctx->c, DSV4_GROUP_WORLD, "graph", &e) != DSV4_OK) {
            ctx->st = e.status;
            ctx->err = e;
            return;
        }
    }
    ctx->st = dsv4_comm_all_reduce(ctx->c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, &x, 1, "logits", &ctx->err);
}

START_TEST(skipped_collective_is_named)
{
    dsv4_sim_world *w = make_world(4, 4, 1, 1, 0);
    rank_ctx ctx[4];
    run_world(w, 4, skip_body, NULL, ctx);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(ctx[r].st, DSV4_ERR_COMM);
        ck_assert_str_eq(ctx[r].err.message, "collective mismatch in group world: rank 0 issued barrier #0 ('graph') "
                                             "but rank 3 issued all_reduce #0 (F32 x 1, 'logits')");
    }
    dsv4_sim_world_free(w);
}
END_TEST

static void count_mismatch_body(rank_ctx *ctx)
{
    atomic_int *done = ctx->arg;
    float x[5] = {1, 2, 3, 4, 5};
    /* The second ep group starts once the first has finished, so the first's result is deterministic. */
    while (ctx->rank >= 4 && atomic_load(done) < 4) {
        struct timespec d = {0, 1000000L};
        nanosleep(&d, NULL);
    }
    ctx->st = dsv4_comm_all_reduce(ctx->c, DSV4_GROUP_EP, DSV4_DTYPE_F32, x, ctx->rank == 6 ? 5 : 4, "router",
                                   &ctx->err);
    if (ctx->rank < 4)
        atomic_fetch_add(done, 1);
    ctx->st2 = dsv4_comm_barrier(ctx->c, DSV4_GROUP_WORLD, "after", &ctx->err2);
}

START_TEST(all_reduce_count_mismatch)
{
    /* ep groups {0..3} and {4..7}: the second has the mismatch; the first succeeds, then its ranks wait in a
       world barrier and are woken by the poison. */
    dsv4_sim_world *w = make_world(8, 8, 1, 4, 0);
    rank_ctx ctx[8];
    atomic_int done;
    atomic_init(&done, 0);
    run_world(w, 8, count_mismatch_body, &done, ctx);
    const char *msg = "collective mismatch in group ep: rank 4 (ep rank 0) issued all_reduce #0 (F32 x 4, 'router') "
                      "but rank 6 (ep rank 2) issued all_reduce #0 (F32 x 5, 'router')";
    char poisoned[1100];
    snprintf(poisoned, sizeof poisoned, "world poisoned by an earlier error: %s", msg);
    for (int r = 0; r < 8; r++) {
        if (r >= 4) {
            ck_assert_int_eq(ctx[r].st, DSV4_ERR_COMM);
            ck_assert_str_eq(ctx[r].err.message, msg);
        } else {
            ck_assert_int_eq(ctx[r].st, DSV4_OK);
        }
        ck_assert_int_eq(ctx[r].st2, DSV4_ERR_COMM);
        ck_assert_str_eq(ctx[r].err2.message, poisoned);
    }
    dsv4_sim_world_free(w);
}
END_TEST

static void a2a_mismatch_body(rank_ctx *ctx)
{
    int r = ctx->rank;
    uint64_t sc[4] = {1, 1, 1, 1}, rc[4] = {1, 1, 1, 1};
    if (r == 0)
        sc[2] = 5;
    if (r == 2)
        rc[0] = 4;
    int64_t send[8] = {0}, recv[8];
    for (int i = 0; i < 8; i++)
        recv[i] = -1;
    ctx->st = dsv4_comm_all_to_allv(ctx->c, DSV4_GROUP_WORLD, DSV4_DTYPE_I64, send, sc, recv, rc, "chunk 0 dispatch",
                                    &ctx->err);
    for (int i = 0; i < 8; i++)
        T_CHECK(ctx, recv[i] == -1, "data moved despite the mismatch");
}

START_TEST(all_to_allv_matrix_mismatch_names_the_pair)
{
    dsv4_sim_world *w = make_world(4, 4, 1, 1, 0);
    rank_ctx ctx[4];
    run_world(w, 4, a2a_mismatch_body, NULL, ctx);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(ctx[r].st, DSV4_ERR_COMM);
        ck_assert_msg(strstr(ctx[r].err.message, "rank 0 sends 5 to rank 2, rank 2 expects 4 from rank 0") != NULL,
                      "%s", ctx[r].err.message);
        ck_assert_ptr_nonnull(strstr(ctx[r].err.message, "all_to_allv #0"));
        ck_assert_str_eq(ctx[r].err.message, ctx[0].err.message);
    }
    dsv4_sim_world_free(w);
}
END_TEST

/* ---------------- deadlock reports ---------------- */

static void missing_body(rank_ctx *ctx)
{
    float x[2] = {1, 2}, g[8];
    T_OK(ctx, dsv4_comm_all_reduce(ctx->c, DSV4_GROUP_TP, DSV4_DTYPE_F32, x, 2, "warm", &e_));
    if (ctx->rank == 3)
        return; /* leaves without the all_gather */
    double t = now_s();
    ctx->st = dsv4_comm_all_gather(ctx->c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, x, 2, g, "step 1 meta", &ctx->err);
    ctx->elapsed = now_s() - t;
    t = now_s();
    ctx->st2 = dsv4_comm_all_reduce(ctx->c, DSV4_GROUP_TP, DSV4_DTYPE_F32, x, 2, "after", &ctx->err2);
    ctx->elapsed2 = now_s() - t;
}

START_TEST(missing_rank_deadlock_report)
{
    dsv4_sim_world *w = make_world(4, 2, 2, 4, 200);
    rank_ctx ctx[4];
    run_world(w, 4, missing_body, NULL, ctx);
    const char *want = "deadlock: after 200 ms in group world, ranks 0, 1, 2 wait in all_gather #0 (F32 x 2, "
                       "'step 1 meta'); rank 3 never arrived (its last collective: rank 3 all_reduce #0 'warm' in "
                       "group tp)";
    double longest = 0;
    for (int r = 0; r < 3; r++) {
        ck_assert_int_eq(ctx[r].st, DSV4_ERR_COMM);
        ck_assert_double_lt(ctx[r].elapsed, 2.0);
        if (ctx[r].elapsed > longest)
            longest = ctx[r].elapsed;
        ck_assert_msg(strstr(ctx[r].err.message, want) != NULL, "%s", ctx[r].err.message);
        ck_assert_int_eq(ctx[r].st2, DSV4_ERR_COMM);
        ck_assert_double_lt(ctx[r].elapsed2, 0.5);
        ck_assert_ptr_nonnull(strstr(ctx[r].err2.message, "world poisoned by an earlier error: deadlock"));
    }
    ck_assert_str_eq(ctx[0].err.message, want); /* rank 0 arrived, so it is in the report, not poisoned late */
    ck_assert_double_gt(longest, 0.15);
    dsv4_sim_world_free(w);
}
END_TEST

static void never_body(rank_ctx *ctx)
{
    if (ctx->rank != 0)
        return;
    int32_t v = 1;
    double t = now_s();
    ctx->st = dsv4_comm_all_reduce(ctx->c, DSV4_GROUP_TP, DSV4_DTYPE_I32, &v, 1, "x", &ctx->err);
    ctx->elapsed = now_s() - t;
}

START_TEST(never_called_rank_reports_none)
{
    dsv4_sim_world *w = make_world(4, 4, 1, 1, 100);
    rank_ctx ctx[4];
    run_world(w, 4, never_body, NULL, ctx);
    ck_assert_int_eq(ctx[0].st, DSV4_ERR_COMM);
    ck_assert_str_eq(ctx[0].err.message,
                     "deadlock: after 100 ms in group tp [ranks 0, 1, 2, 3], rank 0 waits in all_reduce #0 (I32 x 1, "
                     "'x'); ranks 1, 2, 3 never arrived (their last collective: rank 1 none, rank 2 none, rank 3 none)");
    ck_assert_double_lt(ctx[0].elapsed, 2.0);
    dsv4_sim_world_free(w);
}
END_TEST

/* Ranks 0 and 1 mismatch in tp after a delay; rank 2 already waits in a world barrier rank 3 never joins. */
static void wake_body(rank_ctx *ctx)
{
    int r = ctx->rank;
    double t = now_s();
    if (r == 3)
        return;
    if (r == 2) {
        ctx->st = dsv4_comm_barrier(ctx->c, DSV4_GROUP_WORLD, "w", &ctx->err);
    } else {
        struct timespec d = {0, 100 * 1000000L};
        nanosleep(&d, NULL);
        if (r == 0) {
            float x = 0;
            ctx->st = dsv4_comm_all_reduce(ctx->c, DSV4_GROUP_TP, DSV4_DTYPE_F32, &x, 1, "a", &ctx->err);
        } else {
            ctx->st = dsv4_comm_barrier(ctx->c, DSV4_GROUP_TP, "b", &ctx->err);
        }
    }
    ctx->elapsed = now_s() - t;
}

START_TEST(poison_wakes_waiters_in_other_groups)
{
    dsv4_sim_world *w = make_world(4, 2, 2, 4, 0); /* timeout 5 s: rank 2 must not wait for it */
    rank_ctx ctx[4];
    run_world(w, 4, wake_body, NULL, ctx);
    const char *mm = "collective mismatch in group tp: rank 0 (tp rank 0) issued all_reduce #0 (F32 x 1, 'a') but "
                     "rank 1 (tp rank 1) issued barrier #0 ('b')";
    ck_assert_int_eq(ctx[0].st, DSV4_ERR_COMM);
    ck_assert_int_eq(ctx[1].st, DSV4_ERR_COMM);
    ck_assert_str_eq(ctx[0].err.message, mm);
    ck_assert_str_eq(ctx[1].err.message, mm);
    ck_assert_int_eq(ctx[2].st, DSV4_ERR_COMM);
    ck_assert_msg(starts_with(ctx[2].err.message, "world poisoned by an earlier error: collective mismatch in group tp"),
                  "%s", ctx[2].err.message);
    ck_assert_double_lt(ctx[2].elapsed, 2.0);
    dsv4_sim_world_free(w);
}
END_TEST

/* ---------------- one rank, invalid arguments ---------------- */

START_TEST(single_rank_and_invalid_arguments)
{
    dsv4_sim_world *w = make_world(1, 1, 1, 1, 0);
    dsv4_comm *c = dsv4_sim_world_comm(w, 0);
    dsv4_error err;
    uint16_t b[3] = {dsv4_f32_to_bf16(1.5f), dsv4_f32_to_bf16(-2.0f), 0x7fc0};
    uint16_t b0[3];
    memcpy(b0, b, sizeof b);
    ck_assert_int_eq(dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_BF16, b, 3, "one", &err), DSV4_OK);
    ck_assert_mem_eq(b, b0, sizeof b);
    uint8_t s[3] = {1, 2, 3}, rcv[3] = {0};
    ck_assert_int_eq(dsv4_comm_all_gather(c, DSV4_GROUP_EP, DSV4_DTYPE_U8, s, 3, rcv, "g", &err), DSV4_OK);
    ck_assert_mem_eq(rcv, s, 3);
    uint64_t three = 3;
    memset(rcv, 0, 3);
    ck_assert_int_eq(dsv4_comm_all_to_allv(c, DSV4_GROUP_DP, DSV4_DTYPE_F8_E4M3, s, &three, rcv, &three, "a", &err),
                     DSV4_OK);
    ck_assert_mem_eq(rcv, s, 3);
    ck_assert_int_eq(dsv4_comm_barrier(c, DSV4_GROUP_TP, "b", &err), DSV4_OK);

    ck_assert_int_eq(dsv4_comm_barrier(NULL, DSV4_GROUP_TP, "b", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_comm_all_reduce(NULL, DSV4_GROUP_TP, DSV4_DTYPE_F32, b, 1, "b", NULL), DSV4_ERR_INVALID_ARG);
    /* NULL comm cannot poison anything: the world still works. */
    ck_assert_int_eq(dsv4_comm_barrier(c, DSV4_GROUP_WORLD, "b", &err), DSV4_OK);
    size_t nt;
    dsv4_comm_trace(c, &nt);
    ck_assert_uint_eq(nt, 5);

    /* A local argument error poisons the world (peers would otherwise wait for this rank). */
    ck_assert_int_eq(dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_F16, b, 1, "h", &err), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.message, "F16"));
    ck_assert_ptr_nonnull(strstr(err.message, "rank 0"));
    dsv4_comm_trace(c, &nt);
    ck_assert_uint_eq(nt, 5); /* not issued */
    ck_assert_int_eq(dsv4_comm_barrier(c, DSV4_GROUP_WORLD, "b", &err), DSV4_ERR_COMM);
    ck_assert_ptr_nonnull(strstr(err.message, "world poisoned by an earlier error: dsv4_comm_all_reduce: rank 0: "));
    dsv4_sim_world_free(w);

    w = make_world(2, 2, 1, 2, 0);
    c = dsv4_sim_world_comm(w, 1);
    ck_assert_int_eq(dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, NULL, 2, "n", &err),
                     DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.message, "buf is NULL"));
    ck_assert_int_eq(dsv4_comm_all_gather(c, DSV4_GROUP_WORLD, DSV4_DTYPE_COUNT, s, 1, rcv, "n", &err),
                     DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_comm_all_to_allv(c, DSV4_GROUP_WORLD, DSV4_DTYPE_U8, s, NULL, rcv, &three, "n", &err),
                     DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_comm_barrier(c, (dsv4_group)7, "n", &err), DSV4_ERR_INVALID_ARG);
    uint64_t huge[2] = {UINT64_MAX, 1};
    ck_assert_int_eq(dsv4_comm_all_to_allv(c, DSV4_GROUP_WORLD, DSV4_DTYPE_U8, s, huge, rcv, huge, "n", &err),
                     DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, b, UINT64_MAX / 2, "n", &err),
                     DSV4_ERR_INVALID_ARG);
    dsv4_sim_world_free(w);
}
END_TEST

/* ---------------- 64 ranks, mixed schedule ---------------- */

static void big_body(rank_ctx *ctx)
{
    int r = ctx->rank;
    dsv4_comm *c = ctx->c;
    int ep = dsv4_comm_group_size(c, DSV4_GROUP_EP), er = dsv4_comm_group_rank(c, DSV4_GROUP_EP);
    for (int it = 0; it < 10; it++) {
        int64_t v = r + it;
        T_OK(ctx, dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_I64, &v, 1, "w", &e_));
        T_CHECK(ctx, v == 64 * 63 / 2 + 64 * it, "world sum %lld", (long long)v);
        int32_t me = r, all[8];
        T_OK(ctx, dsv4_comm_all_gather(c, DSV4_GROUP_TP, DSV4_DTYPE_I32, &me, 1, all, "tp", &e_));
        for (int j = 0; j < 8; j++)
            T_CHECK(ctx, all[j] == r / 8 * 8 + j, "tp gather");
        uint64_t sc[16], rc[16];
        int32_t send[16 * 3], recv[16 * 3];
        int p = 0;
        for (int j = 0; j < ep; j++) {
            sc[j] = (uint64_t)((er + j + it) % 3);
            rc[j] = (uint64_t)((j + er + it) % 3);
            for (uint64_t k = 0; k < sc[j]; k++)
                send[p++] = r * 1000 + j * 10 + (int)k;
        }
        T_OK(ctx, dsv4_comm_all_to_allv(c, DSV4_GROUP_EP, DSV4_DTYPE_I32, send, sc, recv, rc, "ep", &e_));
        p = 0;
        for (int i = 0; i < ep; i++)
            for (uint64_t k = 0; k < rc[i]; k++, p++)
                T_CHECK(ctx, recv[p] == (r / ep * ep + i) * 1000 + er * 10 + (int)k, "ep a2a");
        T_OK(ctx, dsv4_comm_barrier(c, DSV4_GROUP_DP, "dp", &e_));
    }
}

START_TEST(sixty_four_ranks_mixed)
{
    dsv4_sim_world *w = make_world(64, 8, 8, 16, 0);
    rank_ctx *ctx = calloc(64, sizeof *ctx);
    run_world(w, 64, big_body, NULL, ctx);
    free(ctx);
    dsv4_sim_world_free(w);
}
END_TEST

Suite *comm_suite(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("sim");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, all_reduce_rank_order);
    tcase_add_test(tc, count_zero_is_a_collective);
    tcase_add_test(tc, all_gather_concatenates);
    tcase_add_test(tc, all_to_allv_uneven);
    tcase_add_test(tc, barrier_synchronizes);
    tcase_add_test(tc, groups_partition_the_world);
    tcase_add_test(tc, groups_init_colours_and_errors);
    tcase_add_test(tc, trace_records_every_collective);
    tcase_add_test(tc, asymmetric_schedule_fails_everywhere);
    tcase_add_test(tc, skipped_collective_is_named);
    tcase_add_test(tc, all_reduce_count_mismatch);
    tcase_add_test(tc, all_to_allv_matrix_mismatch_names_the_pair);
    tcase_add_test(tc, missing_rank_deadlock_report);
    tcase_add_test(tc, never_called_rank_reports_none);
    tcase_add_test(tc, poison_wakes_waiters_in_other_groups);
    tcase_add_test(tc, single_rank_and_invalid_arguments);
    tcase_add_test(tc, sixty_four_ranks_mixed);
    suite_add_tcase(s, tc);
    return s;
}
