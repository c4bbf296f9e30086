/*
 * The device sim communicator (include/dsv4moe/comm_devsim.h) on the GPU (built by `make cuda`,
 * run by ci/cuda-test.sh on the device machine): ep = 2, 4 and 8 ranks as host threads, each
 * with its own stream, exchanging device buffers (all_to_allv with uneven and zero counts,
 * all_gather, all_reduce, barrier), identical traces on every rank; a rank that skips the step's
 * metadata collective (the review's replay-vs-eager deadlock) is reported on every rank, naming
 * it, within the timeout (a watchdog bounds the test). Without a GPU the tests are skipped
 * unless DSV4MOE_CUDA_REQUIRED=1.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "dsv4moe/comm_devsim.h"

static int have_gpu(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        return 0;
    }
    return 1;
}

#define NEED_GPU()                                                                                          \
    do {                                                                                                    \
        if (!have_gpu()) {                                                                                  \
            ck_assert_msg(!getenv("DSV4MOE_CUDA_REQUIRED"), "no GPU but DSV4MOE_CUDA_REQUIRED is set");     \
            fprintf(stderr, "%s: skipped (no GPU)\n", __func__);                                           \
            return;                                                                                         \
        }                                                                                                   \
    } while (0)

/* Elements rank r sends to rank j: uneven, and 0 for some pairs. */
static uint64_t cnt(int r, int j) { return (uint64_t)((r + 2 * j) % 3) * (uint64_t)(r + 1); }

typedef struct {
    dsv4_comm *comm;
    int rank, world, skip_meta;
    dsv4_status st;
    char msg[DSV4_ERROR_MESSAGE_MAX + 64];
} rank_job;

#define CK_CUDA(call)                                                                                       \
    do {                                                                                                    \
        cudaError_t e_ = (call);                                                                            \
        if (e_ != cudaSuccess) {                                                                            \
            j->st = DSV4_ERR_DEVICE;                                                                        \
            snprintf(j->msg, sizeof j->msg, "%s: %s", #call, cudaGetErrorString(e_));                       \
            goto out;                                                                                       \
        }                                                                                                   \
    } while (0)

static void job_fail(rank_job *j, const char *what, long long a, long long b)
{
    if (j->st == DSV4_OK) {
        j->st = DSV4_ERR_INTERNAL;
        snprintf(j->msg, sizeof j->msg, "rank %d: %s (%lld vs %lld)", j->rank, what, a, b);
    }
}

/* One step as the distributed driver issues it: the metadata all_gather, one chunk's dispatch
   (all_to_allv), a tp-style all_reduce and a barrier, on device buffers and the rank's stream. */
static void *rank_main(void *p)
{
    rank_job *j = p;
    int P = j->world, r = j->rank;
    cudaStream_t s = NULL;
    int32_t *dsend = NULL, *drecv = NULL;
    int64_t *dmeta = NULL;
    float *dsum = NULL;
    int32_t *hsend = NULL, *hrecv = NULL;
    dsv4_error e;
    uint64_t sc[DSV4_COMM_MAX_RANKS], rc[DSV4_COMM_MAX_RANKS], ns = 0, nr = 0;
    for (int q = 0; q < P; q++) {
        sc[q] = cnt(r, q);
        rc[q] = cnt(q, r);
        ns += sc[q];
        nr += rc[q];
    }
    CK_CUDA(cudaSetDevice(0));
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if ((j->st = dsv4_devsim_set_stream(j->comm, s, &e))) {
        snprintf(j->msg, sizeof j->msg, "%s", e.message);
        goto out;
    }
    hsend = calloc(ns + 1, sizeof *hsend);
    hrecv = calloc(nr + 1, sizeof *hrecv);
    if (!hsend || !hrecv) {
        job_fail(j, "out of memory", 0, 0);
        goto out;
    }
    CK_CUDA(cudaMalloc((void **)&dsend, (ns + 1) * sizeof *dsend));
    CK_CUDA(cudaMalloc((void **)&drecv, (nr + 1) * sizeof *drecv));
    CK_CUDA(cudaMalloc((void **)&dmeta, (size_t)(2 * P) * sizeof *dmeta));
    CK_CUDA(cudaMalloc((void **)&dsum, 5 * sizeof *dsum));
    /* metadata: (T, can replay) of this rank, into its block of the gathered array */
    int64_t meta[2] = {10 + r, r % 2};
    CK_CUDA(cudaMemcpyAsync(dmeta + 2 * r, meta, sizeof meta, cudaMemcpyHostToDevice, s));
    if (!j->skip_meta) {
        if ((j->st = dsv4_comm_all_gather(j->comm, DSV4_GROUP_WORLD, DSV4_DTYPE_I64, dmeta + 2 * r, 2, dmeta,
                                          "step meta", &e))) {
            snprintf(j->msg, sizeof j->msg, "%s", e.message);
            goto out;
        }
        int64_t all[2 * DSV4_COMM_MAX_RANKS];
        CK_CUDA(cudaMemcpy(all, dmeta, (size_t)(2 * P) * sizeof *all, cudaMemcpyDeviceToHost));
        for (int q = 0; q < P; q++)
            if (all[2 * q] != 10 + q || all[2 * q + 1] != q % 2)
                job_fail(j, "gathered metadata", (long long)all[2 * q], 10 + q);
    }
    /* dispatch: value (r, q, i) encoded as r * 1000000 + q * 1000 + i */
    for (int q = 0, o = 0; q < P; q++)
        for (uint64_t i = 0; i < sc[q]; i++)
            hsend[o++] = r * 1000000 + q * 1000 + (int32_t)i;
    CK_CUDA(cudaMemcpyAsync(dsend, hsend, ns * sizeof *hsend, cudaMemcpyHostToDevice, s));
    if ((j->st = dsv4_comm_all_to_allv(j->comm, DSV4_GROUP_EP, DSV4_DTYPE_I32, dsend, sc, drecv, rc,
                                       "dispatch rows", &e))) {
        snprintf(j->msg, sizeof j->msg, "%s", e.message);
        goto out;
    }
    CK_CUDA(cudaMemcpy(hrecv, drecv, nr * sizeof *hrecv, cudaMemcpyDeviceToHost));
    for (int q = 0, o = 0; q < P; q++)
        for (uint64_t i = 0; i < rc[q]; i++, o++)
            if (hrecv[o] != q * 1000000 + r * 1000 + (int32_t)i)
                job_fail(j, "received element", hrecv[o], q * 1000000 + r * 1000 + (int32_t)i);
    float v[5];
    for (int i = 0; i < 5; i++)
        v[i] = (float)(r + 1) * (float)(i + 1);
    CK_CUDA(cudaMemcpyAsync(dsum, v, sizeof v, cudaMemcpyHostToDevice, s));
    if ((j->st = dsv4_comm_all_reduce(j->comm, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, dsum, 5, "tp reduce", &e)) ||
        (j->st = dsv4_comm_barrier(j->comm, DSV4_GROUP_WORLD, "end", &e))) {
        snprintf(j->msg, sizeof j->msg, "%s", e.message);
        goto out;
    }
    CK_CUDA(cudaMemcpy(v, dsum, sizeof v, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 5; i++)
        if (v[i] != (float)(P * (P + 1) / 2) * (float)(i + 1))
            job_fail(j, "all_reduce sum", (long long)v[i], (long long)(P * (P + 1) / 2 * (i + 1)));
out:
    cudaFree(dsend);
    cudaFree(drecv);
    cudaFree(dmeta);
    cudaFree(dsum);
    if (s)
        cudaStreamDestroy(s);
    free(hsend);
    free(hrecv);
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs one step on P ranks; skip: the rank that skips the metadata collective (-1 none). */
static void run_world(int P, int skip, int timeout_ms, rank_job *jobs, dsv4_devsim_world **wout)
{
    dsv4_comm_groups g;
    dsv4_error e;
    ck_assert_msg(dsv4_comm_groups_init(&g, P, 1, P, P, &e) == DSV4_OK, "%s", e.message);
    dsv4_devsim_options o;
    dsv4_devsim_options_init(&o);
    o.timeout_ms = timeout_ms;
    dsv4_devsim_world *w = NULL;
    ck_assert_msg(dsv4_devsim_world_create(&g, &o, &w, &e) == DSV4_OK, "%s", e.message);
    pthread_t th[DSV4_COMM_MAX_RANKS];
    for (int r = 0; r < P; r++) {
        jobs[r] = (rank_job){dsv4_devsim_world_comm(w, r), r, P, r == skip, DSV4_OK, ""};
        ck_assert_int_eq(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < P; r++)
        pthread_join(th[r], NULL);
    *wout = w;
}

START_TEST(ep_ranks_exchange_device_buffers)
{
    NEED_GPU();
    for (int P = 2; P <= 8; P *= 2) {
        rank_job jobs[8];
        dsv4_devsim_world *w;
        run_world(P, -1, 5000, jobs, &w);
        for (int r = 0; r < P; r++)
            ck_assert_msg(jobs[r].st == DSV4_OK, "ep %d rank %d: %s", P, r, jobs[r].msg);
        /* identical fingerprint traces: op, group, dtype, sequence, tag on every rank */
        size_t n0 = 0;
        const dsv4_coll_record *t0 = dsv4_comm_trace(dsv4_devsim_world_comm(w, 0), &n0);
        ck_assert_uint_eq(n0, 4);
        for (int r = 1; r < P; r++) {
            size_t n = 0;
            const dsv4_coll_record *t = dsv4_comm_trace(dsv4_devsim_world_comm(w, r), &n);
            ck_assert_uint_eq(n, n0);
            for (size_t i = 0; i < n; i++)
                ck_assert(t[i].op == t0[i].op && t[i].group == t0[i].group && t[i].dtype == t0[i].dtype &&
                          t[i].seq == t0[i].seq && strcmp(t[i].tag, t0[i].tag) == 0);
        }
        dsv4_devsim_world_free(w);
    }
}
END_TEST

/* The review's deadlock: rank 1 replays a graph and skips the step's metadata collective while the
   others run eager. Every rank gets DSV4_ERR_COMM, a report names rank 1, nothing hangs. */
START_TEST(skipped_meta_reported_not_hung)
{
    NEED_GPU();
    for (int P = 2; P <= 8; P *= 2) {
        rank_job jobs[8];
        dsv4_devsim_world *w;
        double t0 = now();
        run_world(P, 1, 500, jobs, &w);
        double dt = now() - t0;
        ck_assert_msg(dt < 10.0, "ep %d took %.1f s", P, dt);
        int named = 0;
        for (int r = 0; r < P; r++) {
            ck_assert_msg(jobs[r].st == DSV4_ERR_COMM, "ep %d rank %d: status %d (%s)", P, r, (int)jobs[r].st,
                          jobs[r].msg);
            named |= strstr(jobs[r].msg, "rank 1") != NULL;
        }
        ck_assert_msg(named, "ep %d: no report names rank 1: %s", P, jobs[0].msg);
        dsv4_devsim_world_free(w);
    }
}
END_TEST

START_TEST(arguments)
{
    dsv4_error e;
    dsv4_devsim_options o;
    dsv4_devsim_options_init(&o);
    ck_assert_int_eq(o.timeout_ms, 5000);
    dsv4_devsim_options_init(NULL);
    dsv4_devsim_world *w = NULL;
    ck_assert_int_eq(dsv4_devsim_world_create(NULL, &o, &w, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_devsim_set_stream(NULL, NULL, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_null(dsv4_devsim_world_comm(NULL, 0));
    dsv4_devsim_world_free(NULL);
    /* a sim endpoint is not a devsim one */
    dsv4_comm_groups g;
    ck_assert_int_eq(dsv4_comm_groups_init(&g, 2, 1, 2, 2, &e), DSV4_OK);
    dsv4_sim_world *sw = NULL;
    ck_assert_int_eq(dsv4_sim_world_create(&g, NULL, &sw, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_devsim_set_stream(dsv4_sim_world_comm(sw, 0), NULL, &e), DSV4_ERR_INVALID_ARG);
    dsv4_sim_world_free(sw);
}
END_TEST

static Suite *devsim_suite(void)
{
    Suite *s = suite_create("devsim");
    TCase *tc = tcase_create("devsim");
    tcase_set_timeout(tc, 120); /* the watchdog: a hang fails the test instead of the run */
    tcase_add_test(tc, arguments);
    tcase_add_test(tc, ep_ranks_exchange_device_buffers);
    tcase_add_test(tc, skipped_meta_reported_not_hung);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(devsim_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
