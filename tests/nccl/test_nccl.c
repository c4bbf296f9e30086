/*
 * tests/nccl/test_nccl: the NCCL communicator and EP dispatch/combine on one
 * GPU (a 1-rank world), plus the failure paths a single GPU can produce: a
 * 2-rank bootstrap whose rank 1 never joins, and a collective that cannot
 * complete (its stream is held by a host function) caught by the watchdog.
 *
 * Each test runs in its own child process (this binary with --one NAME) with
 * an alarm, so a hang is a FAIL line and never a stuck run, and a CUDA error
 * in one test cannot leak into the next. One line per test; exit 0 only if
 * every test passed.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "dsv4moe/comm.h"
#include "dsv4moe/comm_nccl.h"
#include "dsv4moe/formats.h"
#include "fast/comm/comm_impl.h"
#include "fast/comm/nccl/nccl_internal.h"

static char g_detail[2048];

#define FAILF(...)                                                                                                  \
    do {                                                                                                            \
        snprintf(g_detail, sizeof g_detail, __VA_ARGS__);                                                           \
        return 1;                                                                                                   \
    } while (0)
#define CHECK(cond, ...)                                                                                            \
    do {                                                                                                            \
        if (!(cond)) {                                                                                              \
            char _m[1500];                                                                                          \
            snprintf(_m, sizeof _m, __VA_ARGS__);                                                                   \
            FAILF("%s:%d: %s: %s", __FILE__, __LINE__, #cond, _m);                                                  \
        }                                                                                                           \
    } while (0)
#define CUDA_OK(call)                                                                                               \
    do {                                                                                                            \
        cudaError_t _e = (call);                                                                                    \
        if (_e != cudaSuccess)                                                                                      \
            FAILF("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(_e));                              \
    } while (0)
#define DS_OK(call)                                                                                                 \
    do {                                                                                                            \
        dsv4_error _er;                                                                                             \
        dsv4_error_clear(&_er);                                                                                     \
        dsv4_status _s = (call);                                                                                    \
        if (_s != DSV4_OK)                                                                                          \
            FAILF("%s:%d: %s: status %d: %s", __FILE__, __LINE__, #call, (int)_s, _er.message);                     \
    } while (0)
/* DS_OK with the error record named ER in scope: */
#define ER (&_er)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static void fill_random(void *p, size_t n)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)rnd();
}
static float rnd_float(void)
{
    return (float)((double)(rnd() % 2000001) / 1000.0 - 1000.0);
}

static int make_world(int world, const dsv4_nccl_options *opt, dsv4_comm **out)
{
    dsv4_comm_groups groups;
    dsv4_nccl_id id;
    DS_OK(dsv4_comm_groups_init(&groups, world, 1, world, world, ER));
    DS_OK(dsv4_nccl_unique_id(&id, ER));
    DS_OK(dsv4_nccl_comm_create(&groups, 0, &id, opt, out, ER));
    return 0;
}

/* ------------------------------------------------------------------ */

static int t_id(void)
{
    dsv4_nccl_id id, back;
    char hex[DSV4_NCCL_ID_HEX_LEN + 1];
    dsv4_error err;
    DS_OK(dsv4_nccl_unique_id(&id, ER));
    DS_OK(dsv4_nccl_id_to_hex(&id, hex, sizeof hex, ER));
    CHECK(strlen(hex) == DSV4_NCCL_ID_HEX_LEN, "hex length %zu", strlen(hex));
    DS_OK(dsv4_nccl_id_from_hex(hex, &back, ER));
    CHECK(memcmp(id.bytes, back.bytes, sizeof id.bytes) == 0, "hex round trip differs");
    char bad[DSV4_NCCL_ID_HEX_LEN + 8];
    memcpy(bad, hex, sizeof hex);
    bad[17] = 'g';
    CHECK(dsv4_nccl_id_from_hex(bad, &back, &err) == DSV4_ERR_FORMAT && strstr(err.message, "offset 17"),
          "bad digit: %s", err.message);
    CHECK(dsv4_nccl_id_from_hex("abc", &back, &err) == DSV4_ERR_FORMAT && strstr(err.message, "end of text"),
          "short: %s", err.message);
    snprintf(bad, sizeof bad, "%sx", hex);
    CHECK(dsv4_nccl_id_from_hex(bad, &back, &err) == DSV4_ERR_FORMAT && strstr(err.message, "text after"),
          "trailing: %s", err.message);
    char dir[] = "/tmp/dsv4nccl.XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    char path[128];
    snprintf(path, sizeof path, "%s/id", dir);
    DS_OK(dsv4_nccl_id_write_file(path, &id, ER));
    memset(&back, 0, sizeof back);
    DS_OK(dsv4_nccl_id_read_file(path, 100, &back, ER));
    CHECK(memcmp(id.bytes, back.bytes, sizeof id.bytes) == 0, "file round trip differs");
    remove(path);
    double t0 = now_ms();
    CHECK(dsv4_nccl_id_read_file(path, 300, &back, &err) == DSV4_ERR_COMM && strstr(err.message, "300 ms") &&
              strstr(err.message, path),
          "missing file: %s", err.message);
    double dt = now_ms() - t0;
    CHECK(dt >= 290 && dt < 2000, "missing file waited %.0f ms for a 300 ms timeout", dt);
    rmdir(dir);
    snprintf(g_detail, sizeof g_detail, "hex, file, missing file after %.0f ms", dt);
    return 0;
}

static void clear_env(void)
{
    static const char *v[] = {"DSV4_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID",
                              "DSV4_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS",
                              "DSV4_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                              "SLURM_LOCALID", "DSV4_NCCL_ID", "DSV4_NCCL_ID_FILE"};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        unsetenv(v[i]);
}

static int t_env(void)
{
    dsv4_nccl_env env;
    dsv4_error err;
    clear_env();
    CHECK(dsv4_nccl_env_read(&env, &err) == DSV4_ERR_CONFIG && strstr(err.message, "DSV4_RANK"), "none: %s",
          err.message);
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    DS_OK(dsv4_nccl_env_read(&env, ER));
    CHECK(env.rank == 3 && env.world == 8 && env.local_rank == 3 && !strcmp(env.rank_var, "OMPI_COMM_WORLD_RANK"),
          "ompi: %d %d %d %s", env.rank, env.world, env.local_rank, env.rank_var);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    DS_OK(dsv4_nccl_env_read(&env, ER));
    CHECK(env.rank == 1 && env.world == 2 && !strcmp(env.world_var, "WORLD_SIZE"), "torchrun first: %d %d %s",
          env.rank, env.world, env.world_var);
    clear_env();
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "4", 1);
    CHECK(dsv4_nccl_env_read(&env, &err) == DSV4_ERR_CONFIG && strstr(err.message, "SLURM_PROCID") &&
              strstr(err.message, "rank 5"),
          "rank >= world: %s", err.message);
    setenv("SLURM_PROCID", "x1", 1);
    CHECK(dsv4_nccl_env_read(&env, &err) == DSV4_ERR_CONFIG && strstr(err.message, "SLURM_PROCID") &&
              strstr(err.message, "'x1'"),
          "malformed: %s", err.message);
    clear_env();
    dsv4_comm_groups groups;
    dsv4_comm *c = NULL;
    DS_OK(dsv4_comm_groups_init(&groups, 1, 1, 1, 1, ER));
    setenv("DSV4_RANK", "0", 1);
    setenv("DSV4_WORLD_SIZE", "1", 1);
    CHECK(dsv4_nccl_comm_create_from_env(&groups, NULL, &c, &err) == DSV4_ERR_CONFIG &&
              strstr(err.message, "DSV4_NCCL_ID_FILE"),
          "no id: %s", err.message);
    /* The file bootstrap end to end: rank 0 writes the id and joins a world of one. */
    char dir[] = "/tmp/dsv4nccl.XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[128];
    snprintf(path, sizeof path, "%s/id", dir);
    setenv("DSV4_NCCL_ID_FILE", path, 1);
    DS_OK(dsv4_nccl_comm_create_from_env(&groups, NULL, &c, ER));
    CHECK(dsv4_comm_rank(c) == 0 && dsv4_comm_group_size(c, DSV4_GROUP_WORLD) == 1, "from_env comm");
    DS_OK(dsv4_comm_barrier(c, DSV4_GROUP_WORLD, "env", ER));
    dsv4_nccl_comm_free(c);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && sb.st_size == DSV4_NCCL_ID_HEX_LEN + 1, "id file size");
    remove(path);
    rmdir(dir);
    snprintf(g_detail, sizeof g_detail, "launcher variables, precedence, errors, DSV4_NCCL_ID_FILE bootstrap");
    return 0;
}

/* ------------------------------------------------------------------ */

static uint16_t bf16_round_trip(uint16_t b)
{
    return dsv4_f32_to_bf16(dsv4_bf16_to_f32(b));
}

/* All dtypes through all_gather (also in place) and all_to_allv, the five reducible ones through all_reduce,
   zero counts, barrier, each group; checks the data against the host and the trace. */
static int run_collectives(dsv4_comm *c, bool native)
{
    enum { N = 1000 };
    unsigned char host[N * 8], back[N * 8];
    void *d_a, *d_b;
    CUDA_OK(cudaMalloc(&d_a, sizeof host));
    CUDA_OK(cudaMalloc(&d_b, sizeof host));
    size_t before;
    dsv4_comm_trace(c, &before);
    int issued = 0;
    for (int dt = 0; dt < DSV4_DTYPE_COUNT; dt++) {
        size_t dsz = dsv4_dtype_size((dsv4_dtype)dt);
        dsv4_group g = (dsv4_group)(dt % DSV4_GROUP_COUNT);
        fill_random(host, N * dsz);
        CUDA_OK(cudaMemcpy(d_a, host, N * dsz, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(d_b, 0, N * dsz));
        DS_OK(dsv4_comm_all_gather(c, g, (dsv4_dtype)dt, d_a, N, d_b, "gather", ER));
        CUDA_OK(cudaMemcpy(back, d_b, N * dsz, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(back, host, N * dsz), "all_gather %s differs", dsv4_dtype_name((dsv4_dtype)dt));
        DS_OK(dsv4_comm_all_gather(c, g, (dsv4_dtype)dt, d_b, N, d_b, "gather in place", ER));
        CUDA_OK(cudaMemcpy(back, d_b, N * dsz, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(back, host, N * dsz), "in-place all_gather %s differs", dsv4_dtype_name((dsv4_dtype)dt));
        uint64_t sc = 777, rc = 777;
        CUDA_OK(cudaMemset(d_b, 0, N * dsz));
        DS_OK(dsv4_comm_all_to_allv(c, g, (dsv4_dtype)dt, d_a, &sc, d_b, &rc, "a2a", ER));
        CUDA_OK(cudaMemcpy(back, d_b, N * dsz, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(back, host, 777 * dsz), "all_to_allv %s differs", dsv4_dtype_name((dsv4_dtype)dt));
        issued += 3;
        if (!dsv4_comm_reducible((dsv4_dtype)dt))
            continue;
        /* Finite values for the float types so that x + nothing is x; a NaN payload for bf16's rounding rule. */
        if (dt == DSV4_DTYPE_F32)
            for (int i = 0; i < N; i++) {
                float f = rnd_float();
                memcpy(host + 4 * i, &f, 4);
            }
        if (dt == DSV4_DTYPE_F64)
            for (int i = 0; i < N; i++) {
                double f = rnd_float();
                memcpy(host + 8 * i, &f, 8);
            }
        if (dt == DSV4_DTYPE_BF16) {
            uint16_t snan = 0x7f81;
            memcpy(host, &snan, 2);
        }
        CUDA_OK(cudaMemcpy(d_a, host, N * dsz, cudaMemcpyHostToDevice));
        DS_OK(dsv4_comm_all_reduce(c, g, (dsv4_dtype)dt, d_a, N, "reduce", ER));
        CUDA_OK(cudaMemcpy(back, d_a, N * dsz, cudaMemcpyDeviceToHost));
        issued++;
        if (dt == DSV4_DTYPE_BF16 && !native) {
            for (int i = 0; i < N; i++) {
                uint16_t x, y;
                memcpy(&x, host + 2 * i, 2);
                memcpy(&y, back + 2 * i, 2);
                CHECK(y == bf16_round_trip(x), "bf16 all_reduce element %d: 0x%04x -> 0x%04x, expected 0x%04x", i, x,
                      y, bf16_round_trip(x));
            }
        } else if (dt == DSV4_DTYPE_BF16) {
            for (int i = 1; i < N; i++) /* NCCL may or may not quiet the NaN: compare the rest */
                CHECK(!memcmp(back + 2 * i, host + 2 * i, 2), "native bf16 all_reduce element %d", i);
        } else {
            CHECK(!memcmp(back, host, N * dsz), "all_reduce %s differs", dsv4_dtype_name((dsv4_dtype)dt));
        }
    }
    /* Zero counts: NULL buffers are allowed and nothing moves. */
    uint64_t z = 0;
    DS_OK(dsv4_comm_all_to_allv(c, DSV4_GROUP_EP, DSV4_DTYPE_F32, NULL, &z, NULL, &z, "a2a zero", ER));
    DS_OK(dsv4_comm_all_gather(c, DSV4_GROUP_TP, DSV4_DTYPE_BF16, NULL, 0, NULL, "gather zero", ER));
    DS_OK(dsv4_comm_all_reduce(c, DSV4_GROUP_DP, DSV4_DTYPE_F32, NULL, 0, "reduce zero", ER));
    DS_OK(dsv4_comm_barrier(c, DSV4_GROUP_WORLD, "barrier", ER));
    issued += 4;
    size_t len;
    const dsv4_coll_record *tr = dsv4_comm_trace(c, &len);
    CHECK(len == before + (size_t)issued, "trace %zu records, expected %zu", len, before + (size_t)issued);
    const dsv4_coll_record *last = &tr[len - 1];
    CHECK(last->op == DSV4_COLL_BARRIER && !strcmp(last->tag, "barrier"), "last record %s '%s'",
          dsv4_coll_op_name(last->op), last->tag);
    CHECK(tr[len - 4].op == DSV4_COLL_ALL_TO_ALLV && tr[len - 4].count == 0 &&
              tr[len - 4].counts_hash == dsv4_comm_counts_hash(&z, &z, 1),
          "zero all_to_allv record");
    /* Sequence numbers count per group. */
    uint64_t seq[DSV4_GROUP_COUNT] = {0};
    for (size_t i = 0; i < len; i++) {
        CHECK(tr[i].seq == seq[tr[i].group], "record %zu seq %llu, expected %llu", i, (unsigned long long)tr[i].seq,
              (unsigned long long)seq[tr[i].group]);
        seq[tr[i].group]++;
    }
    cudaFree(d_a);
    cudaFree(d_b);
    return 0;
}

static int t_collectives(void)
{
    dsv4_comm *c;
    if (make_world(1, NULL, &c))
        return 1;
    for (int g = 0; g < DSV4_GROUP_COUNT; g++)
        CHECK(dsv4_comm_group_size(c, (dsv4_group)g) == 1 && dsv4_comm_group_rank(c, (dsv4_group)g) == 0, "group %d",
              g);
    if (run_collectives(c, false))
        return 1;
    /* A local argument error poisons the endpoint: the next collective fails at once, naming the cause. */
    dsv4_error err;
    CHECK(dsv4_comm_all_gather(c, DSV4_GROUP_EP, DSV4_DTYPE_F32, NULL, 4, NULL, "bad", &err) == DSV4_ERR_INVALID_ARG,
          "NULL send: %s", err.message);
    double t0 = now_ms();
    CHECK(dsv4_comm_barrier(c, DSV4_GROUP_WORLD, "after", &err) == DSV4_ERR_COMM &&
              strstr(err.message, "aborted by an earlier error") && strstr(err.message, "send is NULL"),
          "poisoned: %s", err.message);
    CHECK(now_ms() - t0 < 100, "the poisoned barrier took %.0f ms", now_ms() - t0);
    dsv4_nccl_comm_free(c);

    dsv4_nccl_options o;
    dsv4_nccl_options_init(&o);
    o.native_reduce = true;
    if (make_world(1, &o, &c))
        return 1;
    if (run_collectives(c, true))
        return 1;
    dsv4_nccl_comm_free(c);
    snprintf(g_detail, sizeof g_detail, "16 dtypes x (all_gather, in place, all_to_allv), 5 x all_reduce exact and "
             "native, zero counts, barrier, 4 groups, trace, poisoning");
    return 0;
}

/* The ascending-rank sum kernel with n = 4 emulated ranks, bit for bit against the host. */
static int t_sum_kernel(void)
{
    enum { R = 4, N = 5000 };
    static unsigned char g[R * N * 8], out[N * 8];
    void *d_g, *d_o;
    CUDA_OK(cudaMalloc(&d_g, sizeof g));
    CUDA_OK(cudaMalloc(&d_o, sizeof out));
    const int types[] = {DSV4_DTYPE_BF16, DSV4_DTYPE_F32, DSV4_DTYPE_F64, DSV4_DTYPE_I32, DSV4_DTYPE_I64};
    for (int ti = 0; ti < 5; ti++) {
        int dt = types[ti];
        size_t dsz = dsv4_dtype_size((dsv4_dtype)dt);
        fill_random(g, R * N * dsz);
        if (dt == DSV4_DTYPE_F32)
            for (int i = 0; i < R * N; i++) {
                float f = rnd_float() * (i % 7 == 0 ? 1e-6f : 1.0f);
                memcpy(g + 4 * i, &f, 4);
            }
        if (dt == DSV4_DTYPE_F64)
            for (int i = 0; i < R * N; i++) {
                double f = rnd_float() * (i % 7 == 0 ? 1e-9 : 1.0);
                memcpy(g + 8 * i, &f, 8);
            }
        CUDA_OK(cudaMemcpy(d_g, g, R * N * dsz, cudaMemcpyHostToDevice));
        CHECK(dsv4_nccl_k_sum(dt, d_g, d_o, R, N, NULL) == 0, "launch");
        CUDA_OK(cudaMemcpy(out, d_o, N * dsz, cudaMemcpyDeviceToHost));
        for (int e = 0; e < N; e++) {
            bool ok = true;
            if (dt == DSV4_DTYPE_BF16) {
                const uint16_t *x = (const uint16_t *)g;
                float acc = dsv4_bf16_to_f32(x[e]);
                for (int r = 1; r < R; r++)
                    acc += dsv4_bf16_to_f32(x[r * N + e]);
                uint16_t y, want = dsv4_f32_to_bf16(acc);
                memcpy(&y, out + 2 * e, 2);
                /* NaN payloads differ between x86 and the GPU (canonical NaN): NaN-ness must agree. */
                bool yn = (y & 0x7fff) > 0x7f80, wn = (want & 0x7fff) > 0x7f80;
                ok = (yn && wn) || y == want;
            } else if (dt == DSV4_DTYPE_F32) {
                const float *x = (const float *)g;
                float acc = x[e];
                for (int r = 1; r < R; r++)
                    acc += x[r * N + e];
                ok = !memcmp(&acc, out + 4 * e, 4);
            } else if (dt == DSV4_DTYPE_F64) {
                const double *x = (const double *)g;
                double acc = x[e];
                for (int r = 1; r < R; r++)
                    acc += x[r * N + e];
                ok = !memcmp(&acc, out + 8 * e, 8);
            } else if (dt == DSV4_DTYPE_I32) {
                const uint32_t *x = (const uint32_t *)g;
                uint32_t acc = x[e];
                for (int r = 1; r < R; r++)
                    acc += x[r * N + e];
                ok = !memcmp(&acc, out + 4 * e, 4);
            } else {
                const uint64_t *x = (const uint64_t *)g;
                uint64_t acc = x[e];
                for (int r = 1; r < R; r++)
                    acc += x[r * N + e];
                ok = !memcmp(&acc, out + 8 * e, 8);
            }
            CHECK(ok, "%s element %d differs from the host's ascending sum", dsv4_dtype_name((dsv4_dtype)dt), e);
        }
    }
    cudaFree(d_g);
    cudaFree(d_o);
    snprintf(g_detail, sizeof g_detail, "4 ranks x 5000 elements, bf16 (random bits, NaN, Inf), f32, f64, i32, i64 "
             "bit-identical to the host");
    return 0;
}

/* ------------------------------------------------------------------ */

static int t_graph(void)
{
    enum { N = 4096, A2A = 300 };
    dsv4_comm *c;
    if (make_world(1, NULL, &c))
        return 1;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DS_OK(dsv4_nccl_set_stream(c, s, ER));
    DS_OK(dsv4_nccl_reserve(c, N * 4, ER));
    float *d_a;
    uint16_t *d_b, *d_c;
    int32_t *d_d, *d_e;
    CUDA_OK(cudaMalloc((void **)&d_a, N * 4));
    CUDA_OK(cudaMalloc((void **)&d_b, N * 2));
    CUDA_OK(cudaMalloc((void **)&d_c, N * 2));
    CUDA_OK(cudaMalloc((void **)&d_d, N * 4));
    CUDA_OK(cudaMalloc((void **)&d_e, N * 4));
    uint64_t sc = A2A, rc = A2A;
    static float ha[N], ra[N];
    static uint16_t hb[N], rb[N];
    static int32_t hd[N], rd[N];
    dsv4_error err;
    for (int pass = 0; pass < 2; pass++) { /* 0: eager warm-up, 1: capture */
        cudaGraph_t graph = NULL;
        if (pass == 1)
            CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        dsv4_status st = dsv4_comm_all_reduce(c, DSV4_GROUP_TP, DSV4_DTYPE_F32, d_a, N, "g reduce", &err);
        if (st == DSV4_OK)
            st = dsv4_comm_all_gather(c, DSV4_GROUP_EP, DSV4_DTYPE_BF16, d_b, N, d_c, "g gather", &err);
        if (st == DSV4_OK)
            st = dsv4_comm_all_to_allv(c, DSV4_GROUP_EP, DSV4_DTYPE_I32, d_d, &sc, d_e, &rc, "g a2a", &err);
        if (st == DSV4_OK)
            st = dsv4_comm_barrier(c, DSV4_GROUP_WORLD, "g barrier", &err);
        if (pass == 1) {
            cudaError_t ce = cudaStreamEndCapture(s, &graph);
            CHECK(st == DSV4_OK, "capture: %s", err.message);
            CUDA_OK(ce);
            cudaGraphExec_t exec;
            CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
            size_t nodes = 0;
            CUDA_OK(cudaGraphGetNodes(graph, NULL, &nodes));
            CHECK(nodes >= 4, "graph has %zu nodes", nodes);
            for (int rep = 0; rep < 3; rep++) {
                for (int i = 0; i < N; i++) {
                    ha[i] = rnd_float();
                    hb[i] = (uint16_t)rnd();
                    hd[i] = (int32_t)rnd();
                }
                CUDA_OK(cudaMemcpy(d_a, ha, sizeof ha, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_b, hb, sizeof hb, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_d, hd, sizeof hd, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemset(d_c, 0, N * 2));
                CUDA_OK(cudaMemset(d_e, 0, N * 4));
                CUDA_OK(cudaGraphLaunch(exec, s));
                DS_OK(dsv4_nccl_sync(c, "replay", ER));
                CUDA_OK(cudaMemcpy(ra, d_a, sizeof ra, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(rb, d_c, sizeof rb, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(rd, d_e, sizeof rd, cudaMemcpyDeviceToHost));
                CHECK(!memcmp(ra, ha, sizeof ha), "replay %d all_reduce", rep);
                CHECK(!memcmp(rb, hb, sizeof hb), "replay %d all_gather", rep);
                CHECK(!memcmp(rd, hd, A2A * 4), "replay %d all_to_allv", rep);
                CHECK(rd[A2A] == 0, "replay %d all_to_allv wrote past its count", rep);
            }
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        } else {
            CHECK(st == DSV4_OK, "eager: %s", err.message);
        }
    }
    size_t len;
    dsv4_comm_trace(c, &len);
    CHECK(len == 8, "trace %zu: 4 eager + 4 captured records (replays run no host code)", len);
    /* Too-small scratch during capture is refused naming dsv4_nccl_reserve (and aborts, as any local error). */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    dsv4_status st = dsv4_comm_all_reduce(c, DSV4_GROUP_TP, DSV4_DTYPE_F32, d_a, 2 * N, "too big", &err);
    cudaGraph_t junk = NULL;
    cudaStreamEndCapture(s, &junk);
    if (junk)
        cudaGraphDestroy(junk);
    CHECK(st == DSV4_ERR_COMM && strstr(err.message, "dsv4_nccl_reserve"), "capture overflow: %s", err.message);
    dsv4_nccl_comm_free(c);
    cudaStreamDestroy(s);
    cudaFree(d_a);
    cudaFree(d_b);
    cudaFree(d_c);
    cudaFree(d_d);
    cudaFree(d_e);
    snprintf(g_detail, sizeof g_detail, "captured all_reduce + all_gather + all_to_allv + barrier, 3 replays "
             "checked, scratch refusal under capture");
    return 0;
}

static int t_fingerprint(void)
{
    dsv4_nccl_options o;
    dsv4_nccl_options_init(&o);
    o.fingerprint = true;
    dsv4_comm *c;
    if (make_world(1, &o, &c))
        return 1;
    if (run_collectives(c, false))
        return 1;
    dsv4_nccl_comm_free(c);
    /* The comparison itself, on fingerprints of two ranks as the all_gather would deliver them. */
    enum { W = DSV4_NCCL_FP_WORDS(2) };
    uint64_t words[2 * W];
    int members[2] = {4, 5};
    char msg[1024];
    dsv4_coll_record a = {0}, b = {0};
    a.seq = b.seq = 3;
    a.op = DSV4_COLL_ALL_REDUCE;
    b.op = DSV4_COLL_ALL_GATHER;
    a.group = b.group = DSV4_GROUP_EP;
    a.dtype = b.dtype = DSV4_DTYPE_F32;
    a.count = b.count = 8;
    strcpy(a.tag, "step 2 meta");
    strcpy(b.tag, "chunk 0 counts");
    dsv4_nccl_fp_encode(&a, NULL, NULL, 2, words);
    dsv4_nccl_fp_encode(&b, NULL, NULL, 2, words + W);
    CHECK(dsv4_nccl_fp_compare(words, 2, DSV4_GROUP_EP, members, msg, sizeof msg) == 1, "op mismatch not found");
    CHECK(strstr(msg, "rank 4 (ep rank 0) issued all_reduce #3 (F32 x 8, 'step 2 meta') but rank 5 (ep rank 1) "
                      "issued all_gather #3 (F32 x 8, 'chunk 0 counts')"),
          "message: %s", msg);
    dsv4_nccl_fp_encode(&a, NULL, NULL, 2, words + W);
    CHECK(dsv4_nccl_fp_compare(words, 2, DSV4_GROUP_EP, members, msg, sizeof msg) == 0, "equal records mismatch");
    b = a;
    b.seq = 4;
    dsv4_nccl_fp_encode(&b, NULL, NULL, 2, words + W);
    CHECK(dsv4_nccl_fp_compare(words, 2, DSV4_GROUP_EP, members, msg, sizeof msg) == 1 && strstr(msg, "#4"),
          "seq: %s", msg);
    b = a;
    b.count = 9;
    dsv4_nccl_fp_encode(&b, NULL, NULL, 2, words + W);
    CHECK(dsv4_nccl_fp_compare(words, 2, DSV4_GROUP_EP, members, msg, sizeof msg) == 1 && strstr(msg, "x 9"),
          "count: %s", msg);
    a.op = b.op = DSV4_COLL_ALL_TO_ALLV;
    a.count = b.count = 7;
    strcpy(a.tag, "chunk 1 dispatch");
    strcpy(b.tag, "chunk 1 dispatch");
    uint64_t s0[2] = {2, 5}, r0[2] = {2, 3}, s1[2] = {3, 1}, r1[2] = {4, 1}; /* rank 0 sends 5, rank 1 expects 4 */
    dsv4_nccl_fp_encode(&a, s0, r0, 2, words);
    dsv4_nccl_fp_encode(&b, s1, r1, 2, words + W);
    CHECK(dsv4_nccl_fp_compare(words, 2, DSV4_GROUP_EP, members, msg, sizeof msg) == 1, "counts mismatch not found");
    CHECK(strstr(msg, "all_to_allv #3 (F32, 'chunk 1 dispatch'): rank 4 (ep rank 0) sends 5 to rank 5 (ep rank 1), "
                      "rank 5 (ep rank 1) expects 4 from rank 4 (ep rank 0)"),
          "message: %s", msg);
    r1[0] = 5;
    dsv4_nccl_fp_encode(&b, s1, r1, 2, words + W);
    CHECK(dsv4_nccl_fp_compare(words, 2, DSV4_GROUP_EP, members, msg, sizeof msg) == 0, "matching counts: %s", msg);
    snprintf(g_detail, sizeof g_detail, "every collective with the exchange on; op, seq, count and count-matrix "
             "mismatches named with both ranks");
    return 0;
}

/* ------------------------------------------------------------------ */

enum { EP_E = 16, EP_K = 4, EP_ROW = 64, EP_OUT = 32 };

/* Host topk: distinct experts per token, about one slot in five pruned (id = E). */
static void make_topk(int64_t t, int32_t *ids, float *w)
{
    for (int64_t i = 0; i < t; i++) {
        int used[EP_E] = {0};
        for (int k = 0; k < EP_K; k++) {
            int e;
            do
                e = (int)(rnd() % EP_E);
            while (used[e]);
            used[e] = 1;
            ids[i * EP_K + k] = rnd() % 5 == 0 ? EP_E : e;
            w[i * EP_K + k] = rnd_float();
        }
    }
}

/* Runs one dispatch + combine on 1 rank and checks both against the host. */
static int ep_round(dsv4_comm *c, dsv4_nccl_ep *ep, bool padded, int64_t t, int64_t max_t, cudaGraphExec_t exec,
                    void *d_x, int32_t *d_ids, float *d_w, void *d_eo, void *d_out, dsv4_nccl_ep_recv *rv)
{
    static unsigned char x[256 * EP_ROW], out[256 * EP_K * EP_OUT], rows[256 * EP_K * EP_ROW], eo[256 * EP_K * EP_OUT];
    static int32_t ids[256 * EP_K], rid[256 * EP_K];
    static float w[256 * EP_K], rw[256 * EP_K];
    fill_random(x, (size_t)t * EP_ROW);
    make_topk(t, ids, w);
    CUDA_OK(cudaMemcpy(d_x, x, (size_t)t * EP_ROW + 16, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_ids, ids, (size_t)t * EP_K * 4 + 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_w, w, (size_t)t * EP_K * 4 + 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_out, 0xab, (size_t)max_t * EP_K * EP_OUT));
    int64_t valid = 0;
    for (int64_t s = 0; s < t * EP_K; s++)
        valid += ids[s] < EP_E;
    /* Expert output row r: every byte (r * 7 + 1) mod 256, so each slot's row names its received index. */
    int64_t rows_n = padded ? max_t * EP_K : valid; /* padded: ep x cap rows, cap = max_t x min(K, E) */
    for (int64_t r = 0; r < rows_n; r++)
        memset(eo + r * EP_OUT, (int)((r * 7 + 1) & 0xff), EP_OUT);
    CUDA_OK(cudaMemcpy(d_eo, eo, (size_t)rows_n * EP_OUT + 16, cudaMemcpyHostToDevice));
    if (exec) {
        CUDA_OK(cudaGraphLaunch(exec, (cudaStream_t)dsv4_nccl_stream(c)));
        DS_OK(dsv4_nccl_sync(c, "ep replay", ER));
    } else {
        DS_OK(dsv4_nccl_ep_dispatch(ep, t, t ? d_x : NULL, t ? d_ids : NULL, t ? d_w : NULL, "chunk 0", rv, ER));
        DS_OK(dsv4_nccl_ep_combine(ep, rows_n ? d_eo : NULL, t ? d_out : NULL, "chunk 0", ER));
        DS_OK(dsv4_nccl_sync(c, "ep round", ER));
    }
    int64_t cm;
    CUDA_OK(cudaMemcpy(&cm, rv->count_matrix, 8, cudaMemcpyDeviceToHost));
    CHECK(cm == valid, "count matrix %lld, expected %lld valid slots", (long long)cm, (long long)valid);
    if (!padded)
        CHECK(rv->slots == valid && rv->recv_count[0] == valid, "recv slots %lld, expected %lld",
              (long long)rv->slots, (long long)valid);
    else
        CHECK(rv->cap_per_peer == max_t * EP_K && rv->slots == max_t * EP_K, "padded cap %lld slots %lld",
              (long long)rv->cap_per_peer, (long long)rv->slots);
    int64_t nr = padded ? rv->slots : valid;
    if (nr) {
        CUDA_OK(cudaMemcpy(rows, rv->rows, (size_t)nr * EP_ROW, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(rid, rv->expert_ids, (size_t)nr * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(rw, rv->weights, (size_t)nr * 4, cudaMemcpyDeviceToHost));
    }
    if (t)
        CUDA_OK(cudaMemcpy(out, d_out, (size_t)t * EP_K * EP_OUT, cudaMemcpyDeviceToHost));
    int64_t r = 0;
    for (int64_t s = 0; s < t * EP_K; s++) {
        unsigned char expect[EP_OUT];
        if (ids[s] >= EP_E) {
            memset(expect, 0xab, EP_OUT);
            CHECK(!memcmp(out + s * EP_OUT, expect, EP_OUT), "pruned slot %lld was written", (long long)s);
            continue;
        }
        CHECK(!memcmp(rows + r * EP_ROW, x + (s / EP_K) * EP_ROW, EP_ROW), "received row %lld is not token %lld",
              (long long)r, (long long)(s / EP_K));
        CHECK(rid[r] == ids[s] && !memcmp(&rw[r], &w[s], 4), "received id/weight %lld: %d %g, expected %d %g",
              (long long)r, rid[r], rw[r], ids[s], w[s]);
        memset(expect, (int)((r * 7 + 1) & 0xff), EP_OUT);
        CHECK(!memcmp(out + s * EP_OUT, expect, EP_OUT), "combined slot %lld did not get expert row %lld",
              (long long)s, (long long)r);
        r++;
    }
    if (padded)
        for (int64_t q = valid; q < nr; q++)
            CHECK(rid[q] == -1, "padding row %lld has expert id %d, expected -1", (long long)q, rid[q]);
    return 0;
}

static int t_ep(void)
{
    dsv4_comm *c;
    if (make_world(1, NULL, &c))
        return 1;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DS_OK(dsv4_nccl_set_stream(c, s, ER));
    int begin[2] = {0, EP_E};
    const int64_t max_t = 100;
    void *d_x, *d_eo, *d_out;
    int32_t *d_ids;
    float *d_w;
    CUDA_OK(cudaMalloc(&d_x, 256 * EP_ROW));
    CUDA_OK(cudaMalloc((void **)&d_ids, 256 * EP_K * 4));
    CUDA_OK(cudaMalloc((void **)&d_w, 256 * EP_K * 4));
    CUDA_OK(cudaMalloc(&d_eo, 256 * EP_K * EP_OUT));
    CUDA_OK(cudaMalloc(&d_out, 256 * EP_K * EP_OUT));
    int rounds = 0;
    for (int padded = 0; padded < 2; padded++) {
        dsv4_nccl_ep_config cfg;
        dsv4_nccl_ep_config_init(&cfg);
        cfg.n_experts = EP_E;
        cfg.topk = EP_K;
        cfg.expert_begin = begin;
        cfg.max_tokens = max_t;
        cfg.row_bytes_in = EP_ROW;
        cfg.row_bytes_out = EP_OUT;
        cfg.padded = padded;
        dsv4_nccl_ep *ep;
        DS_OK(dsv4_nccl_ep_create(c, &cfg, &ep, ER));
        dsv4_nccl_ep_recv rv;
        memset(&rv, 0, sizeof rv);
        const int64_t ts[] = {37, 0, 1, 100};
        for (int i = 0; i < 4; i++, rounds++)
            if (ep_round(c, ep, padded, ts[i], max_t, NULL, d_x, d_ids, d_w, d_eo, d_out, &rv)) {
                char m[2048];
                snprintf(m, sizeof m, "%s mode T=%lld: %.1900s", padded ? "padded" : "eager", (long long)ts[i], g_detail);
                FAILF("%s", m);
            }
        if (padded) {
            /* Capture dispatch + combine at the bucket (max_t tokens; padding tokens carry pruned ids), replay. */
            CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            dsv4_error err;
            dsv4_status st = dsv4_nccl_ep_dispatch(ep, max_t, d_x, d_ids, d_w, "graph", &rv, &err);
            if (st == DSV4_OK)
                st = dsv4_nccl_ep_combine(ep, d_eo, d_out, "graph", &err);
            cudaGraph_t graph = NULL;
            cudaError_t ce = cudaStreamEndCapture(s, &graph);
            CHECK(st == DSV4_OK, "capture: %s", err.message);
            CUDA_OK(ce);
            cudaGraphExec_t exec;
            CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
            for (int rep = 0; rep < 3; rep++, rounds++)
                if (ep_round(c, ep, true, max_t, max_t, exec, d_x, d_ids, d_w, d_eo, d_out, &rv)) {
                    char m[2048];
                    snprintf(m, sizeof m, "graph replay %d: %.1900s", rep, g_detail);
                    FAILF("%s", m);
                }
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }
        /* Argument errors: tokens beyond max_tokens is refused (and aborts the endpoint, so it goes last). */
        if (padded) {
            dsv4_error err;
            CHECK(dsv4_nccl_ep_dispatch(ep, max_t + 1, d_x, d_ids, d_w, "big", &rv, &err) == DSV4_ERR_INVALID_ARG &&
                      strstr(err.message, "max_tokens"),
                  "tokens > max: %s", err.message);
        }
        dsv4_nccl_ep_free(ep);
    }
    /* Bad configs. */
    dsv4_nccl_ep_config cfg;
    dsv4_nccl_ep_config_init(&cfg);
    cfg.n_experts = EP_E;
    cfg.topk = EP_K;
    int bad_begin[2] = {0, EP_E - 1};
    cfg.expert_begin = bad_begin;
    cfg.max_tokens = 4;
    cfg.row_bytes_in = 64;
    cfg.row_bytes_out = 48;
    dsv4_nccl_ep *ep = NULL;
    dsv4_error err;
    CHECK(dsv4_nccl_ep_create(c, &cfg, &ep, &err) == DSV4_ERR_INVALID_ARG && strstr(err.message, "expert_begin"),
          "bad ranges: %s", err.message);
    cfg.expert_begin = begin;
    cfg.row_bytes_out = 40;
    CHECK(dsv4_nccl_ep_create(c, &cfg, &ep, &err) == DSV4_ERR_INVALID_ARG && strstr(err.message, "multiples of 16"),
          "bad row: %s", err.message);
    dsv4_nccl_comm_free(c);
    cudaStreamDestroy(s);
    cudaFree(d_x);
    cudaFree(d_ids);
    cudaFree(d_w);
    cudaFree(d_eo);
    cudaFree(d_out);
    snprintf(g_detail, sizeof g_detail, "%d dispatch+combine rounds (eager and padded, T = 37, 0, 1, 100, 3 graph "
             "replays), rows, ids, weights, padding ids, pruned slots untouched, config errors", rounds);
    return 0;
}

/* ------------------------------------------------------------------ */

static int t_bootstrap_timeout(void)
{
    CUDA_OK(cudaFree(0));
    dsv4_comm_groups groups;
    dsv4_nccl_id id;
    DS_OK(dsv4_comm_groups_init(&groups, 2, 1, 2, 2, ER));
    DS_OK(dsv4_nccl_unique_id(&id, ER));
    dsv4_comm *warm;
    if (make_world(1, NULL, &warm)) /* NCCL's and CUDA's once-per-process threads exist from here on */
        return 1;
    dsv4_nccl_comm_free(warm);
    int before = thread_count();
    dsv4_nccl_options o;
    dsv4_nccl_options_init(&o);
    o.init_timeout_ms = 3000;
    dsv4_comm *c = NULL;
    dsv4_error err;
    double t0 = now_ms();
    dsv4_status st = dsv4_nccl_comm_create(&groups, 0, &id, &o, &c, &err);
    double dt = now_ms() - t0;
    CHECK(st == DSV4_ERR_COMM && c == NULL, "status %d: %s", (int)st, err.message);
    CHECK(strstr(err.message, "nccl rank 0") && strstr(err.message, "ncclCommInitRankConfig") &&
              strstr(err.message, "world of 2") && strstr(err.message, "3000 ms"),
          "message: %s", err.message);
    CHECK(dt >= 2900 && dt < 3000 + 2500, "failed after %.0f ms for a 3000 ms bootstrap timeout", dt);
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int after = thread_count();
    CHECK(after <= before, "threads: %d before create, %d after the failed create", before, after);
    snprintf(g_detail, sizeof g_detail, "rank 1 never joined: DSV4_ERR_COMM after %.0f ms (timeout 3000), threads "
             "%d -> %d; message: %s", dt, before, after, err.message);
    return 0;
}

static atomic_int g_release;

static void CUDART_CB hold_stream(void *arg)
{
    int cap_ms = *(int *)arg;
    double t0 = now_ms();
    while (!atomic_load(&g_release) && now_ms() - t0 < cap_ms) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static int t_watchdog(void)
{
    CUDA_OK(cudaFree(0));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    static int zero = 0, hold = 2500; /* the host function gives the stream back after 2.5 s by itself */
    CUDA_OK(cudaLaunchHostFunc(s, hold_stream, &zero)); /* CUDA's callback thread exists from here on */
    CUDA_OK(cudaStreamSynchronize(s));
    dsv4_comm *warm;
    if (make_world(1, NULL, &warm))
        return 1;
    dsv4_nccl_comm_free(warm);
    int before = thread_count();
    dsv4_nccl_options o;
    dsv4_nccl_options_init(&o);
    o.timeout_ms = 1500;
    dsv4_comm *c;
    if (make_world(1, &o, &c))
        return 1;
    DS_OK(dsv4_nccl_set_stream(c, s, ER));
    float *d;
    CUDA_OK(cudaMalloc((void **)&d, 64 * 4));
    DS_OK(dsv4_comm_all_gather(c, DSV4_GROUP_EP, DSV4_DTYPE_F32, d, 16, d + 16, "warm", ER));
    /* The stream is held by a host function: the collective cannot complete, as with a peer that never comes. */
    atomic_store(&g_release, 0);
    CUDA_OK(cudaLaunchHostFunc(s, hold_stream, &hold));
    dsv4_error err;
    double t0 = now_ms();
    dsv4_status st = dsv4_comm_all_gather(c, DSV4_GROUP_EP, DSV4_DTYPE_F32, d, 16, d + 16, "stuck step 7", &err);
    double dt = now_ms() - t0;
    atomic_store(&g_release, 1);
    CHECK(st == DSV4_ERR_COMM, "status %d: %s", (int)st, err.message);
    CHECK(strstr(err.message, "nccl rank 0") && strstr(err.message, "all_gather #1 (F32 x 16, 'stuck step 7')") &&
              strstr(err.message, "group ep") && strstr(err.message, "1500 ms") && strstr(err.message, "aborted"),
          "message: %s", err.message);
    /* The watchdog fires at the timeout; ncclCommAbort then tears down NCCL's proxy and may wait for
       the stream (a host function cannot be preempted): on the H200 it returned 2.9 s after the stream
       was given back. The rule is bounded, not instant. */
    CHECK(dt >= 1450 && dt < 1500 + 12000, "returned after %.0f ms for a 1500 ms timeout", dt);
    t0 = now_ms();
    CHECK(dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, d, 4, "later", &err) == DSV4_ERR_COMM &&
              strstr(err.message, "aborted by an earlier error") && strstr(err.message, "stuck step 7"),
          "later: %s", err.message);
    CHECK(now_ms() - t0 < 100, "the poisoned collective took %.0f ms", now_ms() - t0);
    /* The held host function returns; what NCCL left queued runs against an aborted communicator. Bounded. */
    double d0 = now_ms();
    cudaError_t q;
    while ((q = cudaStreamQuery(s)) == cudaErrorNotReady && now_ms() - d0 < 10000) {
        struct timespec p = {0, 1000 * 1000};
        nanosleep(&p, NULL);
    }
    cudaGetLastError();
    char drained[96];
    snprintf(drained, sizeof drained, "stream %s after %.0f ms more (%s)", q == cudaErrorNotReady ? "still busy" :
             "drained", now_ms() - d0, cudaGetErrorString(q));
    dsv4_nccl_comm_free(c);
    cudaFree(d);
    cudaStreamDestroy(s);
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int after = thread_count();
    CHECK(after <= before, "threads: %d before create, %d after free", before, after);
    snprintf(g_detail, sizeof g_detail, "DSV4_ERR_COMM after %.0f ms (timeout 1500), later collective refused at once, "
             "%s, threads %d -> %d; message: %.900s", dt, drained, before, after, err.message);
    return 0;
}

/* ------------------------------------------------------------------ */
/*
 * --world: one rank of a real world (any launcher: DSV4_RANK / RANK / OMPI_... / SLURM_..., and
 * DSV4_NCCL_ID_FILE or DSV4_NCCL_ID; tests/nccl/run_world.sh N starts N on one host). Every rank
 * computes every rank's inputs from (rank, index), so each checks its results against the host:
 * exact all_reduce (ascending rank) bits, all_to_allv with zero counts, EP dispatch + combine eager
 * and padded with a 0-token rank, the per-rank trace identity (an all_gather of trace hashes), and
 * the bandwidth of dispatch + combine for 4096 tokens x 8192-byte rows against a plain all_to_allv
 * of the same bytes. --world-missing R: rank R joins but never issues a collective; every other rank
 * must fail its barrier within the timeout.
 */

static uint32_t h32(uint32_t a, uint32_t b, uint32_t c)
{
    uint64_t x = ((uint64_t)a * 0x9E3779B1u) ^ ((uint64_t)b * 0x85EBCA77u) ^ ((uint64_t)c * 0xC2B2AE3Du);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 32;
    return (uint32_t)x;
}

static int g_rank = -1;

#define WLINE(ok, ...)                                                                                              \
    do {                                                                                                            \
        printf("rank %d: %s ", g_rank, (ok) ? "PASS" : "FAIL");                                                     \
        printf(__VA_ARGS__);                                                                                        \
        printf("\n");                                                                                               \
        fflush(stdout);                                                                                             \
        if (!(ok))                                                                                                  \
            fails++;                                                                                                \
    } while (0)

enum { WE_PER = 8, WK = 4, WROW = 64, WMAXT = 128 };

static int64_t w_tokens(int r) { return r == 1 ? 0 : 50 + 13 * r; }
static int32_t w_id(int r, int64_t t, int k, int n_experts)
{
    if (h32((uint32_t)r, (uint32_t)t, 1000u + (uint32_t)k) % 7 == 0)
        return n_experts; /* pruned */
    /* distinct per token: a rotation by k of a per-token start */
    return (int32_t)((h32((uint32_t)r, (uint32_t)t, 7u) + (uint32_t)k * (uint32_t)(n_experts / WK)) % (uint32_t)n_experts);
}
static float w_weight(int r, int64_t t, int k) { return (float)(h32((uint32_t)r, (uint32_t)t, 2000u + (uint32_t)k) % 1000) / 1000.0f; }
static unsigned char w_byte(int r, int64_t t, int b) { return (unsigned char)h32((uint32_t)r + 77u, (uint32_t)t, (uint32_t)b); }

static int world_ep_round(dsv4_comm *c, bool padded, int W, int me, int *fails_out)
{
    int fails = 0;
    int E = WE_PER * W;
    int begin[DSV4_COMM_MAX_RANKS + 1];
    for (int d = 0; d <= W; d++)
        begin[d] = d * WE_PER;
    dsv4_nccl_ep_config cfg;
    dsv4_nccl_ep_config_init(&cfg);
    cfg.n_experts = E;
    cfg.topk = WK;
    cfg.expert_begin = begin;
    cfg.max_tokens = WMAXT;
    cfg.row_bytes_in = WROW;
    cfg.row_bytes_out = WROW;
    cfg.padded = padded;
    dsv4_nccl_ep *ep;
    dsv4_error err;
    if (dsv4_nccl_ep_create(c, &cfg, &ep, &err) != DSV4_OK) {
        WLINE(0, "ep create: %s", err.message);
        *fails_out += fails;
        return 1;
    }
    int64_t T = w_tokens(me);
    static unsigned char x[WMAXT * WROW], out[WMAXT * WK * WROW];
    static int32_t ids[WMAXT * WK];
    static float wts[WMAXT * WK];
    for (int64_t t = 0; t < T; t++) {
        for (int b = 0; b < WROW; b++)
            x[t * WROW + b] = w_byte(me, t, b);
        for (int k = 0; k < WK; k++) {
            ids[t * WK + k] = w_id(me, t, k, E);
            wts[t * WK + k] = w_weight(me, t, k);
        }
    }
    void *d_x, *d_out;
    int32_t *d_ids;
    float *d_w;
    cudaMalloc(&d_x, sizeof x);
    cudaMalloc(&d_out, sizeof out);
    cudaMalloc((void **)&d_ids, sizeof ids);
    cudaMalloc((void **)&d_w, sizeof wts);
    cudaMemcpy(d_x, x, sizeof x, cudaMemcpyHostToDevice);
    cudaMemcpy(d_ids, ids, sizeof ids, cudaMemcpyHostToDevice);
    cudaMemcpy(d_w, wts, sizeof wts, cudaMemcpyHostToDevice);
    cudaMemset(d_out, 0xab, sizeof out);
    dsv4_nccl_ep_recv rv;
    dsv4_status st = dsv4_nccl_ep_dispatch(ep, T, d_x, d_ids, d_w, padded ? "w padded" : "w eager", &rv, &err);
    if (st == DSV4_OK)
        st = dsv4_nccl_ep_combine(ep, rv.rows, d_out, NULL, &err);
    if (st == DSV4_OK)
        st = dsv4_nccl_sync(c, "world ep", &err);
    if (st != DSV4_OK) {
        WLINE(0, "ep %s: %s", padded ? "padded" : "eager", err.message);
    } else {
        /* Expected receive: sources ascending, each source's slots to me in (t, k) order. */
        size_t nrows = (size_t)rv.slots;
        unsigned char *rows = malloc(nrows * WROW + 1);
        int32_t *rid = malloc(nrows * 4 + 4);
        float *rw = malloc(nrows * 4 + 4);
        cudaMemcpy(rows, rv.rows, nrows * WROW, cudaMemcpyDeviceToHost);
        cudaMemcpy(rid, rv.expert_ids, nrows * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(rw, rv.weights, nrows * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost);
        int bad = 0;
        int64_t got_total = 0;
        for (int s = 0; s < W && !bad; s++) {
            int64_t r = rv.recv_offset[s], n = 0;
            for (int64_t t = 0; t < w_tokens(s) && !bad; t++)
                for (int k = 0; k < WK && !bad; k++) {
                    int32_t id = w_id(s, t, k, E);
                    if (id >= E || id / WE_PER != me)
                        continue;
                    for (int b = 0; b < WROW; b++)
                        if (rows[(r + n) * WROW + b] != w_byte(s, t, b))
                            bad = 1;
                    float wv = w_weight(s, t, k);
                    if (rid[r + n] != id || memcmp(&rw[r + n], &wv, 4))
                        bad = 2;
                    if (bad)
                        WLINE(0, "ep %s: row %lld from rank %d (token %lld slot %d) differs (%s)",
                              padded ? "padded" : "eager", (long long)(r + n), s, (long long)t, k,
                              bad == 1 ? "row bytes" : "id or weight");
                    n++;
                }
            got_total += n;
            if (!bad && !padded && n != rv.recv_count[s]) {
                WLINE(0, "ep eager: %lld rows from rank %d, expected %lld", (long long)rv.recv_count[s], s,
                      (long long)n);
                bad = 3;
            }
            if (!bad && padded && n < rv.cap_per_peer && rid[r + n] != -1) {
                WLINE(0, "ep padded: the padding row after %lld rows from rank %d has id %d", (long long)n, s,
                      rid[r + n]);
                bad = 4;
            }
        }
        for (int64_t sl = 0; sl < T * WK && !bad; sl++) {
            unsigned char e[WROW];
            if (ids[sl] >= E)
                memset(e, 0xab, WROW);
            else
                memcpy(e, x + (sl / WK) * WROW, WROW);
            if (memcmp(out + sl * WROW, e, WROW)) {
                WLINE(0, "ep %s combine: slot %lld did not come back", padded ? "padded" : "eager", (long long)sl);
                bad = 5;
            }
        }
        if (!bad)
            WLINE(1, "ep %s dispatch+combine: %lld tokens sent, %lld slots received from %d ranks, combine round trip",
                  padded ? "padded" : "eager", (long long)T, (long long)got_total, W);
        free(rows);
        free(rid);
        free(rw);
    }
    dsv4_nccl_ep_free(ep);
    cudaFree(d_x);
    cudaFree(d_out);
    cudaFree(d_ids);
    cudaFree(d_w);
    *fails_out += fails;
    return st != DSV4_OK;
}

/*
 * 4096 tokens x hidden 4096 (bf16 rows of 8192 bytes), K = 8 of 256 experts over the ep group: the best of 10
 * dispatch + combine against a plain all_to_allv of the same bytes there and back. On one rank both are
 * device-local copies, not a fabric figure. 0 on success with the line in `line`.
 */
static int bandwidth_run(dsv4_comm *c, char *line, size_t cap)
{
    enum { T = 4096, K = 8, ROW = 8192, IT = 10 };
    const int E = 256, W = dsv4_comm_group_size(c, DSV4_GROUP_EP), me = dsv4_comm_rank(c);
    int begin[DSV4_COMM_MAX_RANKS + 1];
    for (int d = 0; d <= W; d++)
        begin[d] = d * E / W;
    dsv4_nccl_ep_config cfg;
    dsv4_nccl_ep_config_init(&cfg);
    cfg.n_experts = E;
    cfg.topk = K;
    cfg.expert_begin = begin;
    cfg.max_tokens = T;
    cfg.row_bytes_in = ROW;
    cfg.row_bytes_out = ROW;
    dsv4_nccl_ep *ep;
    dsv4_error err;
    if (dsv4_nccl_ep_create(c, &cfg, &ep, &err) != DSV4_OK) {
        snprintf(line, cap, "bandwidth ep create: %s", err.message);
        return 1;
    }
    static int32_t ids[T * K];
    static float w[T * K];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) { /* K distinct experts per token, spread over every rank */
            ids[t * K + k] = (int32_t)((h32((uint32_t)me, (uint32_t)t, 9u) + (uint32_t)k * (E / K)) % (uint32_t)E);
            w[t * K + k] = 0.125f;
        }
    void *d_x, *d_out, *d_a, *d_b;
    int32_t *d_ids;
    float *d_w;
    size_t slot_bytes = (size_t)T * K * ROW;
    cudaMalloc(&d_x, (size_t)T * ROW);
    cudaMalloc(&d_out, slot_bytes);
    cudaMalloc(&d_a, slot_bytes);
    cudaMalloc(&d_b, slot_bytes);
    cudaMalloc((void **)&d_ids, sizeof ids);
    cudaMalloc((void **)&d_w, sizeof w);
    cudaMemcpy(d_ids, ids, sizeof ids, cudaMemcpyHostToDevice);
    cudaMemcpy(d_w, w, sizeof w, cudaMemcpyHostToDevice);
    uint64_t per[DSV4_COMM_MAX_RANKS];
    for (int j = 0; j < W; j++)
        per[j] = slot_bytes / (size_t)W / 16 * 16;
    double best_ep = 1e30, best_a2a = 1e30;
    dsv4_nccl_ep_recv rv;
    dsv4_status st = DSV4_OK;
    for (int it = 0; it < IT + 2 && st == DSV4_OK; it++) {
        double t0 = now_ms();
        st = dsv4_nccl_ep_dispatch(ep, T, d_x, d_ids, d_w, "bw", &rv, &err);
        if (st == DSV4_OK)
            st = dsv4_nccl_ep_combine(ep, rv.rows, d_out, "bw", &err);
        if (st == DSV4_OK)
            st = dsv4_comm_barrier(c, DSV4_GROUP_EP, "bw end", &err);
        double dt = now_ms() - t0;
        if (it >= 2 && dt < best_ep)
            best_ep = dt;
        if (st != DSV4_OK)
            break;
        t0 = now_ms();
        st = dsv4_comm_all_to_allv(c, DSV4_GROUP_EP, DSV4_DTYPE_U8, d_a, per, d_b, per, "plain", &err);
        if (st == DSV4_OK)
            st = dsv4_comm_all_to_allv(c, DSV4_GROUP_EP, DSV4_DTYPE_U8, d_b, per, d_a, per, "plain back", &err);
        if (st == DSV4_OK)
            st = dsv4_comm_barrier(c, DSV4_GROUP_EP, "plain end", &err);
        dt = now_ms() - t0;
        if (it >= 2 && dt < best_a2a)
            best_a2a = dt;
    }
    if (st != DSV4_OK)
        snprintf(line, cap, "bandwidth: %s", err.message);
    else if (rv.slots != (int64_t)T * K / W && W == 1)
        snprintf(line, cap, "bandwidth: %lld slots received, expected %d", (long long)rv.slots, T * K);
    else /* every slot is valid: each rank sends T*K rows and gets as many back */
        snprintf(line, cap, "ep=%d: dispatch+combine of %d tokens x %d slots x %d B: %.3f ms = %.1f GB/s per rank "
                 "(rows sent + rows received back / time); plain all_to_allv of the same bytes there and back: "
                 "%.3f ms = %.1f GB/s%s; DeepEP's published intranode figure: ~153 GB/s on H800",
                 W, T, K, ROW, best_ep, 2.0 * T * K * ROW / best_ep / 1e6, best_a2a,
                 2.0 * (double)per[0] * W / best_a2a / 1e6,
                 W == 1 ? " (one rank: device-local copies, not a fabric figure)" : "");
    dsv4_nccl_ep_free(ep);
    cudaFree(d_x);
    cudaFree(d_out);
    cudaFree(d_a);
    cudaFree(d_b);
    cudaFree(d_ids);
    cudaFree(d_w);
    return st != DSV4_OK;
}

static int t_bandwidth(void)
{
    dsv4_comm *c;
    if (make_world(1, NULL, &c))
        return 1;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DS_OK(dsv4_nccl_set_stream(c, s, ER));
    int rc = bandwidth_run(c, g_detail, sizeof g_detail);
    dsv4_nccl_comm_free(c);
    cudaStreamDestroy(s);
    return rc;
}

static int world_main(int missing)
{
    int fails = 0;
    dsv4_nccl_env env;
    dsv4_error err;
    if (dsv4_nccl_env_read(&env, &err) != DSV4_OK) {
        printf("FAIL world: %s\n", err.message);
        return 1;
    }
    g_rank = env.rank;
    int W = env.world;
    dsv4_comm_groups groups;
    dsv4_comm_groups_init(&groups, W, 1, W, W, NULL);
    dsv4_nccl_options o;
    dsv4_nccl_options_init(&o);
    o.timeout_ms = missing >= 0 ? 5000 : 60000;
    o.init_timeout_ms = 60000;
    o.fingerprint = true;
    dsv4_comm *c;
    if (dsv4_nccl_comm_create_from_env(&groups, &o, &c, &err) != DSV4_OK) {
        WLINE(0, "create: %s", err.message);
        return 1;
    }
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    dsv4_nccl_set_stream(c, s, NULL);
    if (missing >= 0) {
        if (env.rank == missing) {
            struct timespec ts = {9, 0};
            nanosleep(&ts, NULL); /* joined, but never arrives */
            WLINE(1, "missing rank: stayed away for 9 s");
        } else {
            double t0 = now_ms();
            dsv4_status st = dsv4_comm_barrier(c, DSV4_GROUP_WORLD, "step 0 meta", &err);
            double dt = now_ms() - t0;
            WLINE(st == DSV4_ERR_COMM && dt < 5000 + 3000 && strstr(err.message, "step 0 meta"),
                  "missing rank %d: status %d after %.0f ms (timeout 5000): %s", missing, (int)st, dt, err.message);
        }
        dsv4_nccl_comm_free(c);
        cudaStreamDestroy(s);
        return fails ? 1 : 0;
    }
    /* exact all_reduce, F32 and BF16, against the host's ascending sum */
    enum { N = 1000 };
    static float hf[N], ef[N];
    static uint16_t hb[N], eb[N];
    for (int e = 0; e < N; e++) {
        float acc = 0;
        for (int r = 0; r < W; r++) {
            float v = (float)((int)(h32((uint32_t)r, (uint32_t)e, 5u) % 20001) - 10000) / 3.0f;
            if (r == env.rank)
                hf[e] = v;
            acc = r ? acc + v : v;
        }
        ef[e] = acc;
        float accb = 0;
        for (int r = 0; r < W; r++) {
            uint16_t v = dsv4_f32_to_bf16((float)((int)(h32((uint32_t)r, (uint32_t)e, 6u) % 20001) - 10000) / 7.0f);
            if (r == env.rank)
                hb[e] = v;
            accb = r ? accb + dsv4_bf16_to_f32(v) : dsv4_bf16_to_f32(v);
        }
        eb[e] = dsv4_f32_to_bf16(accb);
    }
    void *d;
    cudaMalloc(&d, 64 * 1024);
    cudaMemcpy(d, hf, sizeof hf, cudaMemcpyHostToDevice);
    dsv4_status st = dsv4_comm_all_reduce(c, DSV4_GROUP_WORLD, DSV4_DTYPE_F32, d, N, "w reduce f32", &err);
    cudaMemcpy(hf, d, sizeof hf, cudaMemcpyDeviceToHost);
    WLINE(st == DSV4_OK && !memcmp(hf, ef, sizeof hf), "all_reduce F32 x %d over %d ranks: %s", N, W,
          st == DSV4_OK ? (memcmp(hf, ef, sizeof hf) ? "bits differ from the ascending sum" : "ascending-sum bits")
                        : err.message);
    cudaMemcpy(d, hb, sizeof hb, cudaMemcpyHostToDevice);
    st = dsv4_comm_all_reduce(c, DSV4_GROUP_EP, DSV4_DTYPE_BF16, d, N, "w reduce bf16", &err);
    cudaMemcpy(hb, d, sizeof hb, cudaMemcpyDeviceToHost);
    WLINE(st == DSV4_OK && !memcmp(hb, eb, sizeof hb), "all_reduce BF16 x %d over %d ranks: %s", N, W,
          st == DSV4_OK ? (memcmp(hb, eb, sizeof hb) ? "bits differ from the ascending fp32 sum" : "ascending-sum bits")
                        : err.message);
    /* all_to_allv with zero counts: c(i, j) = ((7i + 3j) mod 4) * 50 int32, element (i << 20 | j << 10 | idx) */
    uint64_t sc[DSV4_COMM_MAX_RANKS], rc[DSV4_COMM_MAX_RANKS];
    static int32_t sendb[DSV4_COMM_MAX_RANKS * 150], recvb[DSV4_COMM_MAX_RANKS * 150];
    size_t so = 0, ro = 0;
    for (int j = 0; j < W; j++) {
        sc[j] = (uint64_t)(((7 * env.rank + 3 * j) % 4) * 50);
        rc[j] = (uint64_t)(((7 * j + 3 * env.rank) % 4) * 50);
        for (uint64_t i = 0; i < sc[j]; i++)
            sendb[so++] = (env.rank << 20) | (j << 10) | (int)i;
        ro += rc[j];
    }
    void *d2;
    cudaMalloc(&d2, sizeof recvb + 16);
    cudaMemcpy(d, sendb, so * 4 + 4, cudaMemcpyHostToDevice);
    st = dsv4_comm_all_to_allv(c, DSV4_GROUP_EP, DSV4_DTYPE_I32, d, sc, d2, rc, "w a2a", &err);
    cudaMemcpy(recvb, d2, ro * 4 + 4, cudaMemcpyDeviceToHost);
    int bad = 0;
    ro = 0;
    for (int i = 0; i < W && st == DSV4_OK; i++)
        for (uint64_t k = 0; k < rc[i]; k++)
            bad += recvb[ro++] != ((i << 20) | (env.rank << 10) | (int)k);
    WLINE(st == DSV4_OK && !bad, "all_to_allv with zero counts: %s", st == DSV4_OK ? (bad ? "data differs" : "data ok")
                                                                            : err.message);
    cudaFree(d);
    cudaFree(d2);
    world_ep_round(c, false, W, dsv4_comm_group_rank(c, DSV4_GROUP_EP), &fails);
    world_ep_round(c, true, W, dsv4_comm_group_rank(c, DSV4_GROUP_EP), &fails);
    char bw[1024];
    int bw_rc = bandwidth_run(c, bw, sizeof bw);
    WLINE(!bw_rc, "bandwidth %s", bw);
    /* Per-rank trace identity: FNV of (seq, op, group, dtype, tag) of every record, all_gathered. */
    size_t len;
    const dsv4_coll_record *tr = dsv4_comm_trace(c, &len);
    uint64_t hsh = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        uint64_t v[4] = {tr[i].seq, (uint64_t)tr[i].op, (uint64_t)tr[i].group, (uint64_t)tr[i].dtype};
        const unsigned char *p = (const unsigned char *)v;
        for (size_t b = 0; b < sizeof v; b++)
            hsh = (hsh ^ p[b]) * 0x100000001b3ULL;
        for (const char *q = tr[i].tag; *q; q++)
            hsh = (hsh ^ (unsigned char)*q) * 0x100000001b3ULL;
    }
    uint64_t *dh, all[DSV4_COMM_MAX_RANKS];
    cudaMalloc((void **)&dh, 8 * DSV4_COMM_MAX_RANKS);
    cudaMemcpy(dh + env.rank, &hsh, 8, cudaMemcpyHostToDevice);
    st = dsv4_comm_all_gather(c, DSV4_GROUP_WORLD, DSV4_DTYPE_U64, dh + env.rank, 1, dh, "trace hash", &err);
    cudaMemcpy(all, dh, 8 * (size_t)W, cudaMemcpyDeviceToHost);
    int same = st == DSV4_OK;
    for (int r = 0; r < W && same; r++)
        same = all[r] == hsh;
    WLINE(same, "trace identity: %zu records, hash %016llx %s", len, (unsigned long long)hsh,
          st != DSV4_OK ? err.message : same ? "on every rank" : "differs between ranks");
    cudaFree(dh);
    dsv4_nccl_comm_free(c);
    cudaStreamDestroy(s);
    printf("rank %d: %s world of %d (%d failed)\n", env.rank, fails ? "FAIL" : "PASS", W, fails);
    return fails ? 1 : 0;
}
/* ------------------------------------------------------------------ */

typedef struct test_case {
    const char *name;
    int (*fn)(void);
    int alarm_s;
} test_case;

static const test_case TESTS[] = {
    {"id", t_id, 60},
    {"env", t_env, 60},
    {"collectives", t_collectives, 120},
    {"sum_kernel", t_sum_kernel, 60},
    {"graph", t_graph, 120},
    {"fingerprint", t_fingerprint, 120},
    {"ep_dispatch_combine", t_ep, 120},
    {"bandwidth", t_bandwidth, 120},
    {"bootstrap_timeout", t_bootstrap_timeout, 60},
    {"watchdog", t_watchdog, 60},
};
#define NTESTS (sizeof TESTS / sizeof *TESTS)

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--world"))
        return world_main(-1);
    if (argc == 3 && !strcmp(argv[1], "--world-missing"))
        return world_main(atoi(argv[2]));
    if (argc == 3 && !strcmp(argv[1], "--one")) {
        for (size_t i = 0; i < NTESTS; i++)
            if (!strcmp(argv[2], TESTS[i].name)) {
                alarm((unsigned)TESTS[i].alarm_s);
                int rc = TESTS[i].fn();
                printf("%s %s: %s\n", rc ? "FAIL" : "PASS", TESTS[i].name, g_detail);
                fflush(stdout);
                return rc;
            }
        fprintf(stderr, "unknown test %s\n", argv[2]);
        return 2;
    }
    int failed = 0, ran = 0;
    for (size_t i = 0; i < NTESTS; i++) {
        if (argc == 2 && strcmp(argv[1], TESTS[i].name))
            continue;
        ran++;
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            execl("/proc/self/exe", argv[0], "--one", TESTS[i].name, (char *)NULL);
            _exit(127);
        }
        int status = 0;
        double t0 = now_ms();
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        if (WIFSIGNALED(status)) {
            printf("FAIL %s: killed by signal %d after %.0f ms (%s)\n", TESTS[i].name, WTERMSIG(status),
                   now_ms() - t0, WTERMSIG(status) == SIGALRM ? "hung past its alarm" : "crashed");
            failed++;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed++;
        }
    }
    printf("%s: %d of %d tests failed\n", failed || !ran ? "FAIL" : "PASS", failed, ran);
    if (!ran)
        return 1;
    return failed ? 1 : 0;
}
