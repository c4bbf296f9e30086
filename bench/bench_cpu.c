/*
 * make bench (cpu): the CPU backend against the reference through the backend
 * interface, for T in {1, 16, 256, 4096} on the mini preset and on v4-flash
 * (fp4 routed, fp8 shared, all 256 experts). Measured in the same run:
 * OpenBLAS sgemm (4096^3, the backend's threads) for the achieved GFLOP/s,
 * and a 2-thread read stream and memcpy for the effective bandwidth of the
 * touched expert weights at small T. Prints a table and writes JSON (argv[1]).
 *
 * The reference is slow on v4-flash: T = 4096 is not run; its time is
 * extrapolated linearly from measured runs at 128 and 256 tokens
 * (t(T) = a + b T: the per-expert dequantization is the constant part), and the
 * output says so. Weights are generated once into argv[2] and reused.
 *
 * DSV4MOE_CPU_KERNELS=<table> (auto, ref, avx2, avx512, avx512-bf16, avx512-vbmi) runs the cpu
 * backend on that kernel table (its parameter kernels=NAME, dsv4_backend_options.params); the table that ran is printed
 * and written to the JSON ("kernels"). On an AVX-512 machine, avx2 runs the kernels an
 * AVX2-only server would, at this machine's memory bandwidth and clock.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#ifdef I
#undef I
#endif

#include "dsv4moe/backend.h"
#include "dsv4moe_harness/compare.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe/weights.h"
#include "bench/bench_util.h"
#include "fast/cpu/kernels/kernels.h" /* the kernel tables its parameter names (not installed) */
#include "core/parallel.h"

void openblas_set_num_threads(int num_threads);

#define THREADS 2

static dsv4_cpu_kernels kernels = DSV4_CPU_KERNELS_AUTO; /* DSV4MOE_CPU_KERNELS */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


typedef struct {
    const uint64_t *p;
    int64_t n;
} read_job;

static _Atomic uint64_t sink; /* keeps the read stream from being optimized away */

static void read_range(void *ctx, int64_t b, int64_t e)
{
    read_job *j = ctx;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t i = b; i + 4 <= e; i += 4) {
        s0 += j->p[i];
        s1 += j->p[i + 1];
        s2 += j->p[i + 2];
        s3 += j->p[i + 3];
    }
    atomic_fetch_add(&sink, s0 + s1 + s2 + s3);
}

typedef struct {
    const char *preset;
    int64_t layer;
    dsv4_config cfg;
    dsv4_checkpoint *ck;
    dsv4_st_file *in;
    uint64_t expert_bytes[1024]; /* per routed expert, w1 + w3 + w2 with scales */
    uint64_t shared_bytes;
} layer_data;

static int open_layer(layer_data *L, const char *dir, int64_t tmax)
{
    dsv4_error e;
    if (dsv4_config_preset(L->preset, &L->cfg, &e)) {
        fprintf(stderr, "%s\n", e.message);
        return 1;
    }
    L->cfg.layer = L->layer;
    char wp[1024], ip[1024];
    if (bench_gen_files(&L->cfg, dir, "cpu", L->preset, tmax, THREADS, "bench_cpu", wp, ip, sizeof wp))
        return 1;
    if (dsv4_checkpoint_open(wp, &L->ck, &e) || dsv4_st_open(ip, &L->in, &e)) {
        fprintf(stderr, "%s\n", e.message);
        return 1;
    }
    for (int64_t x = 0; x < L->cfg.n_routed_experts && x < 1024; x++) {
        L->expert_bytes[x] = 0;
        for (int p = 0; p < 3; p++) {
            dsv4_matrix_view v;
            if (dsv4_weights_matrix(L->ck, &L->cfg, x, (dsv4_proj)p, &v, &e) == DSV4_OK)
                L->expert_bytes[x] += bench_view_bytes(&v);
        }
    }
    L->shared_bytes = 0;
    for (int p = 0; p < 3 && L->cfg.n_shared_experts; p++) {
        dsv4_matrix_view v;
        if (dsv4_weights_matrix(L->ck, &L->cfg, DSV4_SHARED_EXPERT, (dsv4_proj)p, &v, &e) == DSV4_OK)
            L->shared_bytes += bench_view_bytes(&v);
    }
    return 0;
}

static dsv4_backend *make_backend(const layer_data *L, dsv4_backend_kind kind, dsv4_plan **plan)
{
    dsv4_topology topo;
    dsv4_topology_init(&topo);
    topo.backend = kind;
    topo.max_tokens_per_rank = 4096;
    dsv4_budget bud;
    dsv4_budget_init(&bud);
    bud.device_bytes = 16ull << 30; /* a host of this class */
    dsv4_error e;
    dsv4_backend *b = NULL;
    dsv4_backend_options bo;
    dsv4_backend_options_init(&bo);
    bo.threads = THREADS;
    char params[48];
    snprintf(params, sizeof params, "kernels=%s", dsv4_cpu_kernels_name(kernels));
    bo.params = params;
    if (dsv4_plan_create(&L->cfg, &topo, &bud, plan, &e) || dsv4_backend_create_with(*plan, L->ck, &bo, &b, &e)) {
        fprintf(stderr, "bench_cpu: %s\n", e.message);
        return NULL;
    }
    return b;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Best time of `reps` forwards (after one warm-up when warm); *median (if not NULL) their median. */
static double time_forward(dsv4_backend *b, const layer_data *L, int64_t T, int reps, int warm, uint16_t *y,
                           int32_t *ids, double *median)
{
    double ts[64];
    const uint16_t *x = dsv4_st_find(L->in, "x")->data;
    const int32_t *in_ids = dsv4_st_find(L->in, "input_ids")->data;
    dsv4_forward_out o = {y, ids, NULL, NULL};
    dsv4_error e;
    if (warm && dsv4_backend_forward(b, T, x, in_ids, &o, &e)) {
        fprintf(stderr, "bench_cpu: %s\n", e.message);
        return NAN;
    }
    double best = 1e30, bestcpu = 1e30;
    for (int r = 0; r < reps; r++) {
        struct timespec c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        double t0 = now();
        if (dsv4_backend_forward(b, T, x, in_ids, &o, &e)) {
            fprintf(stderr, "bench_cpu: %s\n", e.message);
            return NAN;
        }
        double dt = now() - t0;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        double dc = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
        best = dt < best ? dt : best;
        bestcpu = dc < bestcpu ? dc : bestcpu;
        if (r < 64)
            ts[r] = dt;
    }
    int nt = reps < 64 ? reps : 64;
    qsort(ts, (size_t)nt, sizeof *ts, cmp_double);
    if (median)
        *median = ts[nt / 2];
    if (getenv("DSV4MOE_BENCH_CPUTIME")) /* development: CPU seconds, less sensitive to a shared machine */
        fprintf(stderr, "  T=%lld: best wall %.3f ms (median %.3f), best process CPU %.3f ms\n", (long long)T,
                best * 1e3, ts[nt / 2] * 1e3, bestcpu * 1e3);
    return best;
}

int main(int argc, char **argv)
{
    const char *json = argc > 1 ? argv[1] : "out/bench/cpu.json";
    const char *dir = argc > 2 ? argv[2] : "out/bench";
    const char *kname = getenv("DSV4MOE_CPU_KERNELS");
    dsv4_error ke;
    if (kname && *kname && dsv4_cpu_kernels_from_name(kname, &kernels, &ke)) {
        fprintf(stderr, "bench_cpu: DSV4MOE_CPU_KERNELS: %s\n", ke.message);
        return 2;
    }
    if (!dsv4_cpu_kernels_available(kernels)) {
        fprintf(stderr, "bench_cpu: this CPU does not run the %s kernel table\n", dsv4_cpu_kernels_name(kernels));
        return 2;
    }
    dsv4_cpu_kernels kres = kernels; /* the level AUTO resolves to: the best available */
    for (int l = DSV4_CPU_KERNELS_AVX512_VBMI; kres == DSV4_CPU_KERNELS_AUTO; l--)
        if (dsv4_cpu_kernels_available((dsv4_cpu_kernels)l))
            kres = (dsv4_cpu_kernels)l;
    /* ---- machine rates measured in this run ---- */
    const int N = 4096;
    float *A = malloc((size_t)N * N * sizeof *A), *B = malloc((size_t)N * N * sizeof *B),
          *C = malloc((size_t)N * N * sizeof *C);
    if (!A || !B || !C)
        return 1;
    for (size_t i = 0; i < (size_t)N * N; i++) {
        A[i] = (float)(i % 17) * 0.01f;
        B[i] = (float)(i % 13) * 0.01f;
    }
    openblas_set_num_threads(THREADS);
    double t_sg = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, N, N, 1.0f, A, N, B, N, 0.0f, C, N);
        double dt = now() - t0;
        t_sg = dt < t_sg ? dt : t_sg;
    }
    double sgemm_gflops = 2.0 * N * (double)N * N / t_sg / 1e9;
    size_t nb = (size_t)N * N * sizeof(float) * 3; /* 192 MiB: A, B, C as one region */
    char *big = malloc(nb), *big2 = malloc(nb);
    if (!big || !big2)
        return 1;
    memset(big, 1, nb);
    memset(big2, 2, nb);
    /* Best of STREAM_REPS: on a shared 2-core machine one time slice lost to another process
       halves a single pass; the worst pass is reported too. */
    enum { STREAM_REPS = 7 };
    double t_cp = 1e30, t_rd = 1e30, t_rd_worst = 0;
    for (int r = 0; r < STREAM_REPS; r++) {
        double t0 = now();
        memcpy(big2, big, nb);
        double dt = now() - t0;
        t_cp = dt < t_cp ? dt : t_cp;
        read_job rj = {(const uint64_t *)(const void *)big, (int64_t)(nb / 8)};
        t0 = now();
        dsv4_parallel_for(THREADS, rj.n, 4096, read_range, &rj);
        dt = now() - t0;
        t_rd = dt < t_rd ? dt : t_rd;
        t_rd_worst = dt > t_rd_worst ? dt : t_rd_worst;
    }
    double memcpy_gbs = (double)nb / t_cp / 1e9; /* bytes copied per second */
    double read_gbs = (double)nb / t_rd / 1e9;   /* bytes read per second, 2 threads */
    free(big);
    free(big2);
    free(A);
    free(B);
    free(C);
    double read_worst_gbs = (double)nb / t_rd_worst / 1e9;
    printf("bench_cpu: %d threads; sgemm 4096^3 %.1f GFLOP/s; memcpy %.2f GB/s (bytes copied); read stream %.2f GB/s "
           "(best of %d; worst %.2f)\n",
           THREADS, sgemm_gflops, memcpy_gbs, read_gbs, (int)STREAM_REPS, read_worst_gbs);

    FILE *jf = fopen(json, "w");
    if (!jf) {
        fprintf(stderr, "bench_cpu: cannot write %s\n", json);
        return 1;
    }
    fprintf(jf, "{\n  \"kernels\": \"%s\",\n", dsv4_cpu_kernels_name(kres));
    fprintf(jf, "{\n  \"threads\": %d,\n  \"sgemm_gflops\": %.2f,\n  \"memcpy_gbs\": %.3f,\n  \"read_gbs\": %.3f,\n"
                "  \"read_reps\": %d,\n  \"read_worst_gbs\": %.3f,\n  \"runs\": [\n",
            THREADS, sgemm_gflops, memcpy_gbs, read_gbs, (int)STREAM_REPS, read_worst_gbs);
    printf("%-9s %5s %12s %10s %9s %9s %8s %9s %10s %9s %8s %10s\n", "preset", "T", "ref ms", "cpu ms", "ratio",
           "GFLOP/s", "%sgemm", "touch MB", "stream ms", "x stream", "diff", "ulp p99");
    const char *presets[2] = {"mini", "v4-flash"};
    const int64_t Ts[4] = {1, 16, 256, 4096};
    int first = 1;
    const char *only = getenv("DSV4MOE_BENCH_ONLY"); /* development: one preset */
    for (int pi = 0; pi < 2; pi++) {
        if (only && strcmp(only, presets[pi]))
            continue;
        layer_data L;
        memset(&L, 0, sizeof L);
        L.preset = presets[pi];
        L.layer = pi == 0 ? 1 : 5;
        if (open_layer(&L, dir, 4096))
            return 1;
        const dsv4_config *c = &L.cfg;
        int64_t H = c->dim, I = c->moe_inter_dim, K = c->n_activated, E = c->n_routed_experts;
        bool flash = pi == 1;
        dsv4_plan *pr = NULL, *pc = NULL;
        dsv4_backend *bref = make_backend(&L, DSV4_BACKEND_REF, &pr), *bcpu = make_backend(&L, DSV4_BACKEND_CPU, &pc);
        if (!bref || !bcpu)
            return 1;
        if (pi == 0 || only)
            printf("bench_cpu: cpu kernel table %s%s\n", dsv4_backend_kernels(bcpu),
                   kernels == DSV4_CPU_KERNELS_AUTO ? " (auto: the best this CPU runs)" : " (DSV4MOE_CPU_KERNELS)");
        uint16_t *yr = malloc((size_t)(4096 * H) * 2), *yc = malloc((size_t)(4096 * H) * 2);
        int32_t *ids = malloc((size_t)(4096 * K) * 4), *ids_r = malloc((size_t)(4096 * K) * 4);
        /* flash: the reference at 128 and 256 tokens gives the line for 4096 */
        double ref128 = NAN, ref256 = NAN;
        for (int ti = 0; ti < 4; ti++) {
            int64_t T = Ts[ti];
            const char *tl = getenv("DSV4MOE_BENCH_T"); /* development: a comma list of T */
            if (tl) {
                char key[32];
                snprintf(key, sizeof key, ",%lld,", (long long)T);
                char buf[128];
                snprintf(buf, sizeof buf, ",%s,", tl);
                if (!strstr(buf, key))
                    continue;
            }
            double tref;
            const char *how = "measured";
            if (getenv("DSV4MOE_BENCH_NO_REF")) { /* development: cpu only */
                tref = NAN;
                how = "not run";
            } else if (flash && T == 4096) {
                if (isnan(ref128))
                    ref128 = time_forward(bref, &L, 128, 1, 0, yr, ids_r, NULL);
                double slope = (ref256 - ref128) / 128.0;
                tref = ref256 + slope * (4096 - 256);
                how = "extrapolated linearly from measured T=128 and T=256 runs";
            } else {
                tref = time_forward(bref, &L, T, flash || T >= 256 ? 1 : 3, 0, yr, ids_r, NULL);
                if (flash && T == 256)
                    ref256 = tref;
            }
            int reps = T == 1 ? 50 : T <= 16 ? 20 : T <= 256 ? 5 : 2;
            double tmed = NAN;
            double tcpu = time_forward(bcpu, &L, T, reps, 1, yc, ids, &tmed);
            /* work: the kept slots and the shared rows, three GEMMs each, plus the router */
            int64_t kept = 0;
            unsigned char touched[1024] = {0};
            for (int64_t i = 0; i < T * K; i++)
                if (ids[i] >= 0 && ids[i] < E) {
                    kept++;
                    touched[ids[i]] = 1;
                }
            double flops = 2.0 * 3.0 * (double)H * (double)I * (double)(kept + T * c->n_shared_experts) +
                           2.0 * (double)T * (double)E * (double)H;
            double gflops = flops / tcpu / 1e9;
            uint64_t tb = L.shared_bytes + (uint64_t)E * (uint64_t)H * 2; /* shared expert and the gate */
            for (int64_t x = 0; x < E; x++)
                tb += touched[x] ? L.expert_bytes[x] : 0;
            double t_stream = (double)tb / (read_gbs * 1e9);
            dsv4_compare_metrics m;
            memset(&m, 0, sizeof m);
            bool have_cmp = !(flash && T == 4096);
            if (have_cmp)
                dsv4_compare_bf16(yc, yr, T * H, &m);
            printf("%-9s %5lld %12.2f %10.3f %8.1fx %9.1f %7.1f%% %9.1f %10.3f %8.2fx %8.1e %10u%s\n", L.preset,
                   (long long)T, tref * 1e3, tcpu * 1e3, tref / tcpu, gflops, 100.0 * gflops / sgemm_gflops,
                   (double)tb / 1e6, t_stream * 1e3, tcpu / t_stream, have_cmp ? m.deepgemm_diff : NAN,
                   have_cmp ? m.ulp_p99 : 0u, strcmp(how, "measured") ? "  (ref extrapolated)" : "");
            fprintf(jf,
                    "%s    {\"preset\": \"%s\", \"layer\": %lld, \"tokens\": %lld, \"ref_ms\": %.3f, \"ref_time\": \"%s\", "
                    "\"cpu_ms\": %.4f, \"cpu_median_ms\": %.4f, \"cpu_reps\": %d, \"speedup\": %.2f, \"gflops\": %.2f, \"share_of_sgemm\": %.4f, "
                    "\"touched_weight_bytes\": %llu, \"stream_ms\": %.4f, \"cpu_over_stream\": %.3f, "
                    "\"effective_gbs\": %.3f, \"share_of_read_stream\": %.4f, \"share_of_memcpy\": %.4f, "
                    "\"compared\": %s, \"deepgemm_diff\": %.3g, \"ulp_p99\": %u, \"max_abs\": %.4g}",
                    first ? "" : ",\n", L.preset, (long long)L.layer, (long long)T, tref * 1e3, how, tcpu * 1e3,
                    tmed * 1e3, reps, tref / tcpu, gflops, gflops / sgemm_gflops, (unsigned long long)tb, t_stream * 1e3,
                    tcpu / t_stream, (double)tb / tcpu / 1e9, (double)tb / tcpu / 1e9 / read_gbs,
                    (double)tb / tcpu / 1e9 / memcpy_gbs, have_cmp ? "true" : "false",
                    have_cmp ? m.deepgemm_diff : 0.0, have_cmp ? m.ulp_p99 : 0u, have_cmp ? m.max_abs : 0.0);
            first = 0;
            fflush(stdout);
        }
        dsv4_backend_stats s = dsv4_backend_get_stats(bcpu);
        printf("%-9s cpu workspace peak %.1f MiB (plan's model %.1f MiB)\n", L.preset,
               (double)s.workspace_peak / 1048576.0, (double)s.workspace_planned / 1048576.0);
        free(yr);
        free(yc);
        free(ids);
        free(ids_r);
        dsv4_backend_free(bref);
        dsv4_backend_free(bcpu);
        dsv4_plan_free(pr);
        dsv4_plan_free(pc);
        dsv4_st_close(L.in);
        dsv4_checkpoint_close(L.ck);
    }
    fprintf(jf, "\n  ]\n}\n");
    fclose(jf);
    printf("ratio = ref / cpu; GFLOP/s counts 2 H I per GEMM row of the kept slots and shared rows (3 GEMMs) and the "
           "router; touch MB = touched routed experts + shared expert + gate; x stream = cpu time / (touch bytes / read "
           "stream). v4-flash T=4096: ref extrapolated (see ref_time in the JSON), not compared.\n");
    printf("bench_cpu: wrote %s\n", json);
    return 0;
}
