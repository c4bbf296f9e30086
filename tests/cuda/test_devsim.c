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
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "dsv4moe/backend.h"
#include "dsv4moe/comm_devsim.h"
#include "dsv4moe/dist.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "core/testctl.h"
#include "tests/testutil.h"
#include "tests/tp_cases.h"
#include "fast/cuda/cuda_entry.h"

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


/* ---------------- the cuda backend's stages on ranks of one GPU (fast/multirank) ---------------- */

/* Whether the cuda backend starts here (a device of sm 90). */
static int have_cuda_backend(void)
{
    dsv4_backend_info bi;
    dsv4_error e;
    return dsv4_backend_info_of(DSV4_BACKEND_CUDA, &bi, &e) == DSV4_OK && bi.available;
}

#define NEED_CUDA()                                                                                         \
    do {                                                                                                    \
        if (!have_cuda_backend()) {                                                                         \
            ck_assert_msg(!getenv("DSV4MOE_CUDA_REQUIRED"), "no cuda backend but DSV4MOE_CUDA_REQUIRED is set"); \
            fprintf(stderr, "%s: skipped (no cuda backend)\n", __func__);                                  \
            return;                                                                                         \
        }                                                                                                   \
    } while (0)

typedef struct {
    dsv4_config c;
    dsv4_checkpoint *ck;
    dsv4_st_file *in;
    const uint16_t *x;
    const int32_t *ids;
} dlayer;

#define POOL 1100

/* A layer of config c (its weights and an input pool of POOL tokens), files named by tag. */
static dlayer dist_layer_cfg(const dsv4_config *c, const char *tag)
{
    dlayer L;
    memset(&L, 0, sizeof L);
    dsv4_error e;
    L.c = *c;
    char w[512], in[512], name[128];
    snprintf(name, sizeof name, "devsim_dist_%s.safetensors", tag);
    tu_path(w, sizeof w, name);
    snprintf(name, sizeof name, "devsim_dist_%s_in.safetensors", tag);
    tu_path(in, sizeof in, name);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.seed = 5;
    o.threads = 8;
    ck_assert_msg(dsv4_gen_weights(&L.c, &o, w, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_gen_input(&L.c, &o, POOL, in, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_checkpoint_open(w, &L.ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_st_open(in, &L.in, &e) == DSV4_OK, "%s", e.message);
    L.x = dsv4_st_find(L.in, "x")->data;
    L.ids = dsv4_st_find(L.in, "input_ids")->data;
    return L;
}

static dlayer dist_layer(const char *preset, int64_t l, dsv4_gemm_mode gemm)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset(preset, &c, NULL), DSV4_OK);
    c.layer = l;
    c.gemm = gemm;
    char tag[96];
    snprintf(tag, sizeof tag, "%s_l%lld", preset, (long long)l);
    return dist_layer_cfg(&c, tag);
}

static void dist_layer_free(dlayer *L)
{
    dsv4_st_close(L->in);
    dsv4_checkpoint_close(L->ck);
}

static dsv4_topology cuda_topo(int world, int tp, int ep, int64_t max_tokens, int64_t chunk)
{
    dsv4_topology t;
    dsv4_topology_init(&t);
    t.world_size = world;
    t.tp = tp;
    t.dp = world / tp;
    t.ep = ep;
    t.max_tokens_per_rank = max_tokens;
    t.chunk_tokens = chunk;
    t.role = DSV4_ROLE_MIXED;
    t.backend = DSV4_BACKEND_CUDA;
    return t;
}

static dsv4_budget gpu_budget(void)
{
    dsv4_budget b;
    dsv4_budget_init(&b);
    b.device_bytes = 141ull << 30;
    return b;
}

/* Rank r's rows of a step: counts[r] tokens of the pool from offs[r]; y (and ids) allocated. */
static void dist_io(const dlayer *L, int world, const int64_t *counts, const int64_t *offs, dsv4_dist_rank *r,
                    uint16_t **y)
{
    int64_t H = L->c.dim;
    for (int i = 0; i < world; i++) {
        ck_assert(offs[i] + counts[i] <= POOL);
        y[i] = calloc((size_t)(counts[i] * H + 1), 2);
        r[i] = (dsv4_dist_rank){.tokens = counts[i], .x = L->x + offs[i] * H, .input_ids = L->ids + offs[i], .y = y[i]};
    }
}

/* The collectives of two ranks: the same (group, seq, op, dtype, tag) sequence. */
static int same_trace(const dsv4_dist_rank *a, const dsv4_dist_rank *b)
{
    if (a->trace_len != b->trace_len)
        return 0;
    for (size_t i = 0; i < a->trace_len; i++) {
        const dsv4_coll_record *x = &a->trace[i], *z = &b->trace[i];
        if (x->group != z->group || x->seq != z->seq || x->op != z->op || x->dtype != z->dtype || strcmp(x->tag, z->tag))
            return 0;
    }
    return 1;
}

/* The weights a cuda backend of one rank holding every expert and inter row binds: as allocated
   (its stats) and by its plan's model. */
static void one_rank_weights(const dlayer *L, uint64_t *bound, uint64_t *planned)
{
    dsv4_topology t = cuda_topo(1, 1, 1, 512, 0);
    dsv4_budget b = gpu_budget();
    dsv4_plan *p = NULL;
    dsv4_backend *be = NULL;
    dsv4_error e;
    ck_assert_msg(dsv4_plan_create(&L->c, &t, &b, &p, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_backend_create(p, L->ck, 1, &be, &e) == DSV4_OK, "%s", e.message);
    *bound = dsv4_backend_get_stats(be).weights_allocated;
    *planned = dsv4_plan_weight_bytes(p);
    dsv4_backend_free(be);
    dsv4_plan_free(p);
}

/*
 * ep 2, 4, 8 with the cuda backend on every rank: each rank's rows bit-identical to the cuda
 * stages on one rank holding every expert (dsv4_dist_single_rank: the same groups), identical
 * collective traces, each rank's measured peak (the driver's buffers and the backend's stage
 * chunks) within its plan, token counts with zeros and uneven chunks (rank 3 takes two). Each
 * rank binds only its experts: its weights within its plan's model, and only the experts'
 * share shrinks with ep (one rank's less ep 2's is twice ep 2's less ep 4's, and so on).
 */
static void ep_case(const char *preset, int64_t l, dsv4_gemm_mode gemm, const int64_t *counts, int64_t chunk)
{
    dlayer L = dist_layer(preset, l, gemm);
    int64_t H = L.c.dim;
    uint64_t wb[9] = {0}, w1p = 0;
    one_rank_weights(&L, &wb[1], &w1p);
    ck_assert_msg(wb[1] > 0 && wb[1] <= w1p, "one rank's weights %llu, model %llu", (unsigned long long)wb[1],
                  (unsigned long long)w1p);
    for (int ep = 2; ep <= 8; ep *= 2) {
        int64_t offs[8];
        for (int r = 0, o = 0; r < ep; o += (int)counts[r], r++)
            offs[r] = o;
        dsv4_dist_rank io[8], hio[8], one[8];
        uint16_t *y[8], *yh[8], *ys[8];
        dist_io(&L, ep, counts, offs, io, y);
        dist_io(&L, ep, counts, offs, hio, yh);
        dist_io(&L, ep, counts, offs, one, ys);
        dsv4_topology t = cuda_topo(ep, 1, ep, 512, chunk);
        dsv4_budget b = gpu_budget();
        dsv4_error e;
        double t0 = now();
        /* the rows as device buffers over the device sim (the default for cuda) */
        ck_assert_msg(dsv4_dist_forward(&L.c, L.ck, &t, &b, NULL, io, &e) == DSV4_OK, "%s ep %d: %s", preset, ep,
                      e.message);
        double t1 = now();
        /* the same step with the rows on the host over the sim communicator */
        dsv4_dist_options ho;
        dsv4_dist_options_init(&ho);
        ho.rows_on_host = 1;
        ck_assert_msg(dsv4_dist_forward(&L.c, L.ck, &t, &b, &ho, hio, &e) == DSV4_OK, "%s ep %d host rows: %s", preset,
                      ep, e.message);
        ck_assert_msg(dsv4_dist_single_rank(&L.c, L.ck, &t, &b, NULL, one, &e) == DSV4_OK, "%s ep %d single: %s",
                      preset, ep, e.message);
        int64_t maxT = 0;
        for (int r = 0; r < ep; r++)
            maxT = counts[r] > maxT ? counts[r] : maxT;
        for (int r = 0; r < ep; r++) {
            int64_t i = 0;
            while (i < counts[r] * H && y[r][i] == ys[r][i])
                i++;
            ck_assert_msg(i == counts[r] * H, "%s l%lld gemm %d ep %d rank %d: token %lld channel %lld 0x%04x vs 0x%04x",
                          preset, (long long)l, (int)gemm, ep, r, (long long)(i / H), (long long)(i % H),
                          i < counts[r] * H ? y[r][i] : 0, i < counts[r] * H ? ys[r][i] : 0);
            ck_assert_msg(memcmp(yh[r], ys[r], (size_t)(counts[r] * H) * 2) == 0, "%s ep %d rank %d: host rows differ",
                          preset, ep, r);
            ck_assert_msg(same_trace(&io[0], &io[r]), "%s ep %d: rank %d's collectives differ", preset, ep, r);
            ck_assert_msg(same_trace(&hio[r], &io[r]), "%s ep %d: rank %d's device and host traces differ", preset, ep, r);
            ck_assert_msg(hio[r].workspace_peak <= hio[r].workspace_planned, "%s ep %d rank %d host rows: peak %llu above "
                          "plan %llu", preset, ep, r, (unsigned long long)hio[r].workspace_peak,
                          (unsigned long long)hio[r].workspace_planned);
            ck_assert_int_eq(io[r].chunks, (maxT + chunk - 1) / chunk);
            ck_assert_msg(io[r].workspace_peak <= io[r].workspace_planned, "%s ep %d rank %d: peak %llu above plan %llu",
                          preset, ep, r, (unsigned long long)io[r].workspace_peak,
                          (unsigned long long)io[r].workspace_planned);
            if (counts[r] > 0)
                ck_assert_uint_gt(io[r].workspace_peak, (uint64_t)(counts[r] * H * 2));
            ck_assert_msg(io[r].weights_bound > 0 && io[r].weights_bound <= io[r].weights_planned,
                          "%s ep %d rank %d: weights %llu, model %llu", preset, ep, r,
                          (unsigned long long)io[r].weights_bound, (unsigned long long)io[r].weights_planned);
            ck_assert_uint_eq(io[r].weights_bound, io[0].weights_bound);
            ck_assert_uint_lt(io[r].weights_bound, wb[1]);
            printf("devsim_dist %s l%lld gemm %s ep %d rank %d T %lld: identical (device and host rows); planned %llu "
                   "peak %llu; weights %llu (model %llu, one rank %llu) (%.2f s)\n",
                   preset, (long long)l, dsv4_gemm_mode_name(gemm), ep, r, (long long)counts[r],
                   (unsigned long long)io[r].workspace_planned, (unsigned long long)io[r].workspace_peak,
                   (unsigned long long)io[r].weights_bound, (unsigned long long)io[r].weights_planned,
                   (unsigned long long)wb[1], t1 - t0);
        }
        wb[ep] = io[0].weights_bound;
        for (int r = 0; r < ep; r++) {
            dsv4_dist_rank_release(&io[r]);
            dsv4_dist_rank_release(&hio[r]);
            free(y[r]);
            free(yh[r]);
            free(ys[r]);
        }
    }
    /* the router and the shared expert on every rank, the routed experts split: halving the
       experts removes half of what is left of them */
    ck_assert_uint_eq(wb[1] - wb[2], 2 * (wb[2] - wb[4]));
    ck_assert_uint_eq(wb[2] - wb[4], 2 * (wb[4] - wb[8]));
    ck_assert_uint_gt(wb[4], wb[8]);
    dist_layer_free(&L);
}

/* gemm exact: the fp8 tensor-core path's exact products (fp4 / fp8 layers), hash, bf16, top-p, after_w2 */
static const struct {
    const char *preset;
    int64_t layer;
} exact_layers[] = {{"mini", 1}, {"mini", 0}, {"mini-fp8", 2}, {"mini-bf16", 3}, {"mini-topp", 1}};

START_TEST(cuda_ep_bit_identical_exact)
{
    NEED_CUDA();
    const int64_t counts[8] = {37, 0, 5, 130, 1, 0, 64, 9};
    ep_case(exact_layers[_i].preset, exact_layers[_i].layer, DSV4_GEMM_EXACT, counts, 128);
}
END_TEST

/* gemm fp8: the kernel of a group follows its row count (above the fp8 cut, 32 rows by default,
   the grouped FP8 GEMM), and the groups on a rank are the groups on one rank holding every expert,
   so the ranks stay bit-identical to the single-rank composition; a forward of one rank's tokens
   alone forms other groups and is not this. Counts large enough for groups above the cut. */
START_TEST(cuda_ep_bit_identical_fp8)
{
    NEED_CUDA();
    const int64_t counts[8] = {200, 0, 77, 300, 3, 0, 150, 31};
    ep_case(_i ? "mini-fp8" : "mini", 1, DSV4_GEMM_FP8, counts, 256);
}
END_TEST

/*
 * tp 2 on cuda: each rank binds its half of moe_inter_dim (gate/up rows, down columns sliced at
 * creation) and returns its partial down projections, which the driver all_reduces; both ranks
 * hold the same rows (device rows over the device sim, and host rows over sim, identical), within
 * tolerance of the cuda stages on one rank (the partials are rounded to bf16 by the kernels'
 * epilogue before the sum: not bit-identical). The layers of tests/tp_cases.h (test_dist.c's cpu
 * tp test): mini-bf16's 64-row shards on the exact kernels, mini with I = 256 on the fp8 path
 * (fp4 and fp8 weights) and on the exact kernels (fp4 without activation quantization).
 */
START_TEST(cuda_tp_within_tolerance)
{
    NEED_CUDA();
    dsv4_config c;
    ck_assert_int_eq(tp_case_config(_i, &c), DSV4_OK);
    char tag[32];
    snprintf(tag, sizeof tag, "cudatp%d", _i);
    dlayer L = dist_layer_cfg(&c, tag);
    const int64_t H = c.dim, n = 40, counts[2] = {40, 40}, offs[2] = {3, 3};
    dsv4_dist_rank io[2], hio[2], one[2];
    uint16_t *y[2], *yh[2], *ys[2];
    dist_io(&L, 2, counts, offs, io, y);
    dist_io(&L, 2, counts, offs, hio, yh);
    dist_io(&L, 2, counts, offs, one, ys);
    dsv4_topology t = cuda_topo(2, 2, 1, 64, 0);
    dsv4_budget b = gpu_budget();
    dsv4_error e;
    ck_assert_msg(dsv4_dist_forward(&L.c, L.ck, &t, &b, NULL, io, &e) == DSV4_OK, "case %d: %s", _i, e.message);
    dsv4_dist_options ho;
    dsv4_dist_options_init(&ho);
    ho.rows_on_host = 1;
    ck_assert_msg(dsv4_dist_forward(&L.c, L.ck, &t, &b, &ho, hio, &e) == DSV4_OK, "case %d host rows: %s", _i,
                  e.message);
    ck_assert_msg(dsv4_dist_single_rank(&L.c, L.ck, &t, &b, NULL, one, &e) == DSV4_OK, "case %d single: %s", _i,
                  e.message);
    double rms = 0;
    for (int64_t i = 0; i < n * H; i++) {
        const float a = dsv4_bf16_to_f32(ys[0][i]);
        rms += (double)a * a;
    }
    const float tol = 0.035f + 0.1f * (float)sqrt(rms / (double)(n * H)); /* the runner's fp8/fp4 bound */
    int64_t close = 0, same = 0;
    float worst = 0;
    for (int64_t i = 0; i < n * H; i++) {
        ck_assert_msg(y[0][i] == y[1][i] && y[0][i] == yh[0][i] && yh[0][i] == yh[1][i],
                      "case %d: the tp ranks' rows differ at %lld", _i, (long long)i);
        const float d = fabsf(dsv4_bf16_to_f32(y[0][i]) - dsv4_bf16_to_f32(ys[0][i]));
        close += d <= tol;
        same += y[0][i] == ys[0][i];
        worst = d > worst ? d : worst;
    }
    ck_assert_msg(close == n * H, "case %d: %lld of %lld within %g of one rank (worst %g)", _i, (long long)close,
                  (long long)(n * H), (double)tol, (double)worst);
    ck_assert_msg(same > n * H / 2, "case %d: only %lld of %lld bit-identical to one rank", _i, (long long)same,
                  (long long)(n * H));
    uint64_t w1 = 0, w1p = 0;
    one_rank_weights(&L, &w1, &w1p);
    for (int r = 0; r < 2; r++) {
        ck_assert(same_trace(&io[0], &io[r]) && same_trace(&hio[r], &io[r]));
        ck_assert_msg(io[r].workspace_peak <= io[r].workspace_planned, "case %d rank %d: peak %llu above plan %llu", _i,
                      r, (unsigned long long)io[r].workspace_peak, (unsigned long long)io[r].workspace_planned);
        ck_assert_msg(io[r].weights_bound > 0 && io[r].weights_bound <= io[r].weights_planned && io[r].weights_bound < w1,
                      "case %d rank %d: weights %llu, model %llu, one rank %llu", _i, r,
                      (unsigned long long)io[r].weights_bound, (unsigned long long)io[r].weights_planned,
                      (unsigned long long)w1);
        printf("devsim_dist tp case %d rank %d: %lld of %lld bit-identical to one rank, worst %g (tol %g); planned %llu "
               "peak %llu; weights %llu (model %llu, one rank %llu)\n",
               _i, r, (long long)same, (long long)(n * H), (double)worst, (double)tol,
               (unsigned long long)io[r].workspace_planned, (unsigned long long)io[r].workspace_peak,
               (unsigned long long)io[r].weights_bound, (unsigned long long)io[r].weights_planned,
               (unsigned long long)w1);
    }
    for (int r = 0; r < 2; r++) {
        dsv4_dist_rank_release(&io[r]);
        dsv4_dist_rank_release(&hio[r]);
        dsv4_dist_rank_release(&one[r]);
        free(y[r]);
        free(yh[r]);
        free(ys[r]);
    }
    dist_layer_free(&L);
}
END_TEST

/* ep 4 decode ranks with graphs on, buckets 8..64 (the chunk: 64 tokens). */
static dsv4_topology graph_topo(void)
{
    dsv4_topology t = cuda_topo(4, 1, 4, 64, 0);
    t.role = DSV4_ROLE_DECODE;
    t.cuda_graph = true;
    t.n_buckets = 4;
    const int64_t bk[4] = {8, 16, 32, 64};
    memcpy(t.buckets, bk, sizeof bk);
    return t;
}

/* The review's deadlock on the cuda backend over the device sim: ranks 0 and 2 may replay a graph,
   1 and 3 may not; in the fault build the test hook skip_metadata_collective makes rank 0 skip the
   step's metadata collective (as the
   defective engine's replaying ranks do). Every rank returns DSV4_ERR_COMM within the timeout and
   a report names rank 0; without the fault the step runs eager everywhere and succeeds. */
START_TEST(cuda_mixed_replay_deadlock_reported)
{
    NEED_CUDA();
    dlayer L = dist_layer("mini", 1, DSV4_GEMM_EXACT);
    const int64_t counts[4] = {4, 9, 0, 2}, offs[4] = {0, 4, 13, 13};
#ifdef DSV4_FAULTS
    const int runs = 2; /* the fault build: clean, then with the hook */
#else
    const int runs = 1; /* the release build has no hook: the clean half */
#endif
    for (int fault = 0; fault < runs; fault++) {
        dsv4_dist_rank io[4];
        uint16_t *y[4];
        dist_io(&L, 4, counts, offs, io, y);
        for (int r = 0; r < 4; r++)
            io[r].can_replay = r % 2 == 0;
        dsv4_topology t = graph_topo();
        dsv4_budget b = gpu_budget();
        dsv4_dist_options o;
        dsv4_dist_options_init(&o);
        o.timeout_ms = 500;
        dsv4_error e;
#ifdef DSV4_FAULTS
        if (fault) /* rank 0 skips the step's metadata collective (core/testctl.h) */
            ck_assert_int_eq(dsv4_test_control(DSV4_TESTCTRL_HOOK_SET, (int)DSV4_HOOK_SKIP_METADATA_COLLECTIVE,
                                               (uint64_t)1 << 0),
                             0);
#endif
        double t0 = now();
        dsv4_status st = dsv4_dist_forward(&L.c, L.ck, &t, &b, &o, io, &e);
        double dt = now() - t0;
#ifdef DSV4_FAULTS
        dsv4_test_control(DSV4_TESTCTRL_RESET);
#endif
        if (!fault) {
            ck_assert_msg(st == DSV4_OK, "%s", e.message);
            for (int r = 0; r < 4; r++) {
                ck_assert_msg(!io[r].replayed, "rank %d replayed in a mixed step", r);
                /* the ranks that could replay hold real captured graphs; the step ran eager */
                ck_assert_msg((io[r].graphs_held > 0) == (r % 2 == 0), "rank %d holds %lld graphs", r,
                              (long long)io[r].graphs_held);
                ck_assert_uint_eq(io[r].graph_replays, 0);
            }
        } else {
            ck_assert_int_eq(st, DSV4_ERR_COMM);
            ck_assert_msg(dt < 20.0, "the deadlock took %.1f s to report", dt);
            int named = 0;
            for (int r = 0; r < 4; r++) {
                ck_assert_msg(io[r].status == DSV4_ERR_COMM, "rank %d: status %d (%s)", r, (int)io[r].status,
                              io[r].error.message);
                named |= strstr(io[r].error.message, "rank 0") != NULL;
            }
            ck_assert_msg(named, "no report names rank 0: %s", io[1].error.message);
            printf("devsim_dist deadlock reported in %.2f s: %s\n", dt, io[1].error.message);
        }
        for (int r = 0; r < 4; r++) {
            dsv4_dist_rank_release(&io[r]);
            free(y[r]);
        }
    }
    dist_layer_free(&L);
}
END_TEST

/*
 * A step every rank can replay (graphs on, decode, T within the buckets): each rank captured its
 * stage graphs before the step (the experts calls of routed token-slots and of the shared expert
 * at every bucket) and runs its experts calls as graph replays; the rows are bit-identical to the
 * same step run eager (no rank can replay), with the same collectives. Exact products (mini),
 * gemm fp8 with groups above the fp8 cut, and mini-fp8 (routed and shared experts in one format,
 * so the shared expert shares the decode launch's K split) with fewer than E / K tokens a rank.
 */
START_TEST(cuda_ep_graph_replay_bit_identical)
{
    NEED_CUDA();
    dlayer L = dist_layer(_i == 2 ? "mini-fp8" : "mini", _i == 2 ? 2 : 1, _i == 1 ? DSV4_GEMM_FP8 : DSV4_GEMM_EXACT);
    const int64_t H = L.c.dim;
    const int64_t counts[3][4] = {{4, 9, 0, 2}, {64, 50, 0, 64}, {1, 2, 0, 3}}, *cn = counts[_i];
    int64_t offs[4];
    for (int r = 0, o = 0; r < 4; o += (int)cn[r], r++)
        offs[r] = o;
    dsv4_dist_rank g[4], ea[4];
    uint16_t *yg[4], *ye[4];
    dist_io(&L, 4, cn, offs, g, yg);
    dist_io(&L, 4, cn, offs, ea, ye);
    for (int r = 0; r < 4; r++)
        g[r].can_replay = true;
    dsv4_topology t = graph_topo();
    dsv4_budget b = gpu_budget();
    dsv4_error e;
    double t0 = now();
    ck_assert_msg(dsv4_dist_forward(&L.c, L.ck, &t, &b, NULL, g, &e) == DSV4_OK, "case %d replay: %s", _i, e.message);
    double t1 = now();
    ck_assert_msg(dsv4_dist_forward(&L.c, L.ck, &t, &b, NULL, ea, &e) == DSV4_OK, "case %d eager: %s", _i, e.message);
    for (int r = 0; r < 4; r++) {
        ck_assert_msg(g[r].replayed && !ea[r].replayed, "case %d rank %d: replayed %d / %d", _i, r, (int)g[r].replayed,
                      (int)ea[r].replayed);
        ck_assert_msg(g[r].graphs_held > 0 && ea[r].graphs_held == 0, "case %d rank %d: graphs %lld / %lld", _i, r,
                      (long long)g[r].graphs_held, (long long)ea[r].graphs_held);
        if (cn[r] > 0) /* at least its shared expert's call */
            ck_assert_uint_gt(g[r].graph_replays, 0);
        ck_assert_uint_eq(ea[r].graph_replays, 0);
        int64_t i = 0;
        while (i < cn[r] * H && yg[r][i] == ye[r][i])
            i++;
        ck_assert_msg(i == cn[r] * H, "case %d rank %d: replay differs from eager at token %lld channel %lld: 0x%04x vs 0x%04x",
                      _i, r, (long long)(i / H), (long long)(i % H), i < cn[r] * H ? yg[r][i] : 0,
                      i < cn[r] * H ? ye[r][i] : 0);
        ck_assert(same_trace(&g[r], &ea[r]) && same_trace(&g[0], &g[r]));
        ck_assert_msg(g[r].workspace_peak <= g[r].workspace_planned, "case %d rank %d: peak %llu above plan %llu", _i, r,
                      (unsigned long long)g[r].workspace_peak, (unsigned long long)g[r].workspace_planned);
        printf("devsim_dist graphs case %d rank %d T %lld: %lld graphs held, %llu replays, identical to eager; planned "
               "%llu peak %llu (%.2f s)\n",
               _i, r, (long long)cn[r], (long long)g[r].graphs_held, (unsigned long long)g[r].graph_replays,
               (unsigned long long)g[r].workspace_planned, (unsigned long long)g[r].workspace_peak, t1 - t0);
    }
    for (int r = 0; r < 4; r++) {
        dsv4_dist_rank_release(&g[r]);
        dsv4_dist_rank_release(&ea[r]);
        free(yg[r]);
        free(ye[r]);
    }
    dist_layer_free(&L);
}
END_TEST

/* fast/cuda/cuda.cu: one chunk's layout (no device needed); the registration's rank memory model
   and supports are in cuda/cuda_entry.h */
uint64_t dsv4_cuda_chunk_workspace_bytes(const dsv4_config *cfg, int64_t tc);
uint64_t dsv4_cuda_stage_chunk_bytes(const dsv4_config *cfg, int64_t tc, int64_t kept, int64_t experts);

/* Without a device: the registry lists cuda's stages; a rank of an ep plan is planned with the
   stages' memory model (at least every stage chunk: route and combine of its tokens, experts over
   the rows it can receive; within twice the planner's executor model; plus the driver's buffers); the registry's supports takes tp 2 and 4 and refuses a tp whose shard is not a
   multiple of 32 rows, naming tp. The weight model: a rank of ep 2 / 4 / 8 binds the router and
   the shared expert and its share of the routed experts (only that share shrinks), a tp rank its
   share of every expert's inter rows; the plan's explanation says so. */
START_TEST(cuda_rank_model_host)
{
    dsv4_error e;
    dsv4_backend_info bi;
    ck_assert_int_eq(dsv4_backend_info_of(DSV4_BACKEND_CUDA, &bi, &e), DSV4_OK);
    ck_assert(bi.built);
    ck_assert(bi.sharded);
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset("mini", &c, &e), DSV4_OK);
    c.layer = 1;
    dsv4_budget b = gpu_budget();
    uint64_t prev = 0;
    for (int64_t T = 1; T <= 256; T *= 4) {
        dsv4_topology t = cuda_topo(4, 1, 4, 512, 128);
        dsv4_plan *p = NULL;
        ck_assert_msg(dsv4_plan_create(&c, &t, &b, &p, &e) == DSV4_OK, "%s", e.message);
        char why[200] = "";
        ck_assert_msg(dsv4_cuda_backend_supports(&c, dsv4_plan_shard(p), why, sizeof why), "%s", why);
        const int64_t tc = T < 128 ? T : 128, El = c.n_routed_experts / 4;
        const int64_t rows = 4 * tc * (El < c.n_activated ? El : c.n_activated);
        const uint64_t model = dsv4_cuda_stage_workspace_bytes(&c, &t, tc);
        /* a bound of every stage chunk: experts calls up to those rows (one kept slot a row), route
           and combine chunks up to tc tokens (the layouts are not monotone: the router logits'
           split-K slices shrink as a chunk grows) */
        for (int64_t m = 1; m <= rows; m += T < 64 ? 1 : 7)
            ck_assert_msg(model >= dsv4_cuda_stage_chunk_bytes(&c, m, m, El), "T %lld: %lld rows need %llu > %llu",
                          (long long)T, (long long)m, (unsigned long long)dsv4_cuda_stage_chunk_bytes(&c, m, m, El),
                          (unsigned long long)model);
        for (int64_t m = 1; m <= tc; m++)
            ck_assert_uint_ge(model, dsv4_cuda_stage_chunk_bytes(&c, m, -1, El));
        ck_assert_uint_ge(model, prev);
        prev = model;
        ck_assert_uint_gt(dsv4_plan_workspace_bytes(p, T, false), model);
        /* against the planner's executor model of the same rank (a backend without its own, ref) */
        dsv4_topology tr = t;
        tr.backend = DSV4_BACKEND_REF;
        dsv4_plan *pr = NULL;
        ck_assert_msg(dsv4_plan_create(&c, &tr, &b, &pr, &e) == DSV4_OK, "%s", e.message);
        const uint64_t ex = dsv4_plan_workspace_bytes(pr, T, false);
        printf("cuda rank model mini ep 4 T %lld: %llu bytes, executor model %llu (%.2fx)\n", (long long)T,
               (unsigned long long)model, (unsigned long long)ex, (double)model / (double)ex);
        /* the experts call's chunk is sized for one kept slot a row in the rank's groups (it was
           3.7x the executor model with K slots a row in all E groups) */
        ck_assert_uint_le(model, 2 * ex);
        dsv4_plan_free(pr);
        dsv4_plan_free(p);
    }
    ck_assert_uint_eq(dsv4_cuda_stage_workspace_bytes(&c, NULL, 0), 0);
    for (int q = 0; q < 2; q++) { /* the weights of ep ranks: mini (fp4, the fp8 path), mini-fp8 (gemm fp8 copies) */
        ck_assert_int_eq(dsv4_config_preset(q ? "mini-fp8" : "mini", &c, &e), DSV4_OK);
        c.layer = q ? 2 : 1;
        uint64_t w[9] = {0};
        for (int ep = 1; ep <= 8; ep *= 2) {
            dsv4_topology t = cuda_topo(ep, 1, ep, 512, 128);
            t.rank = ep - 1;
            dsv4_plan *p = NULL;
            ck_assert_msg(dsv4_plan_create(&c, &t, &b, &p, &e) == DSV4_OK, "%s", e.message);
            w[ep] = dsv4_plan_weight_bytes(p);
            ck_assert_msg(strstr(dsv4_plan_explain(p), "weights: ") != NULL, "%s", dsv4_plan_explain(p));
            dsv4_plan_free(p);
        }
        ck_assert_uint_gt(w[8], (uint64_t)(c.n_routed_experts * c.dim * 2)); /* the gate at least */
        ck_assert_uint_eq(w[1] - w[2], 2 * (w[2] - w[4]));
        ck_assert_uint_eq(w[2] - w[4], 2 * (w[4] - w[8]));
        ck_assert_uint_gt(w[4], w[8]);
    }
    ck_assert_int_eq(dsv4_config_preset("mini-bf16", &c, &e), DSV4_OK); /* I 128: tp 2 / 4 shards of 64 / 32 rows */
    c.layer = 1;
    uint64_t wt[9] = {0};
    for (int tp = 1; tp <= 8; tp *= 2) {
        dsv4_topology t2 = cuda_topo(tp, tp, 1, 64, 0);
        t2.rank = tp - 1;
        dsv4_plan *p2 = NULL;
        ck_assert_msg(dsv4_plan_create(&c, &t2, &b, &p2, &e) == DSV4_OK, "%s", e.message);
        char why[200] = "";
        ck_assert_int_eq(dsv4_cuda_backend_supports(&c, dsv4_plan_shard(p2), why, sizeof why), tp <= 4);
        if (tp == 8)
            ck_assert_msg(strstr(why, "tp 8") != NULL, "%s", why);
        else
            ck_assert_uint_gt(dsv4_cuda_stage_workspace_bytes(&c, &t2, 64), 0);
        wt[tp] = dsv4_plan_weight_bytes(p2);
        dsv4_plan_free(p2);
    }
    ck_assert_uint_eq(wt[1] - wt[2], 2 * (wt[2] - wt[4])); /* bf16 shards: every expert's bytes halve */
    ck_assert_uint_gt(wt[2], wt[4]);
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
    TCase *dc = tcase_create("dist");
    tcase_set_timeout(dc, 300);
    tcase_add_loop_test(dc, cuda_ep_bit_identical_exact, 0, 5);
    tcase_add_loop_test(dc, cuda_ep_bit_identical_fp8, 0, 2);
    tcase_add_loop_test(dc, cuda_tp_within_tolerance, 0, N_TP_CASES);
    tcase_add_test(dc, cuda_rank_model_host);
    tcase_add_test(dc, cuda_mixed_replay_deadlock_reported);
    tcase_add_loop_test(dc, cuda_ep_graph_replay_bit_identical, 0, 3);
    suite_add_tcase(s, dc);
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
