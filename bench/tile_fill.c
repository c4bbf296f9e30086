/*
 * tile_fill: how full the grouped FP8 GEMM's row tiles are on the routing that bench_cuda's
 * prefill rows run (v4-flash layer 5, the same generated weights and input files, the first T
 * tokens of the input). Routing is the reference's (dsv4_ref_stage_route), which the CUDA backend
 * reproduces exactly (SPEC.md section 9), so this runs on any machine.
 *
 * Per T: the routed groups of more than `cut` rows (the backend's fp8_cut, default 32) run on the
 * grouped GEMM, one 128-row tile list per group (gemm_fp8.cu), with the shared expert's T rows as
 * one more group; smaller groups run on the decode and 32-row kernels. For the GEMM's groups: rows,
 * 128-row tiles and their fill (rows / (tiles x 128): the share of the tiles' MMA work that is
 * real), and the same for 64-row tiles. The GEMM's tensor-core work is proportional to the tiles,
 * so 1 - fill is the share of it spent on padding.
 *
 * usage: tile_fill [--dir DIR] [--tokens LIST] [--tmax N] [--cut N] [--threads N]
 *   --dir     where bench_cuda keeps its files (default out/bench, its default; generated if missing)
 *   --tokens  T values (default 1024,4096,16384); --tmax the input file's tokens (default 16384,
 *             bench_cuda's name for the same file)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/config.h"
#include "dsv4moe/ref.h"
#include "dsv4moe/safetensors.h"
#include "bench/bench_util.h"

#define MAX_T 16

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

typedef struct {
    int64_t groups, rows, t128, t64, small_groups, small_rows, largest;
} fill_row;

/* The fill of the first T tokens' routing (ids [T, K], E the pruned id). */
static fill_row fill_of(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t cut, int shared)
{
    fill_row r;
    memset(&r, 0, sizeof r);
    int64_t *cnt = calloc((size_t)E, sizeof *cnt);
    if (!cnt)
        return r;
    for (int64_t i = 0; i < T * K; i++)
        if (ids[i] >= 0 && ids[i] < E)
            cnt[ids[i]]++;
    for (int64_t e = 0; e <= E; e++) {
        const int64_t c = e < E ? cnt[e] : (shared ? T : 0);
        if (c == 0)
            continue;
        if (c <= cut) {
            r.small_groups++, r.small_rows += c;
            continue;
        }
        const int64_t a = cdiv(c, 128) * 128, b = cdiv(c, 64) * 64;
        r.groups++, r.rows += c, r.t128 += a / 128, r.t64 += b / 64;
        r.largest = c > r.largest ? c : r.largest;
    }
    free(cnt);
    return r;
}

int main(int argc, char **argv)
{
    const char *dir = "out/bench", *list = "1024,4096,16384";
    int64_t tmax = 16384, cut = 32;
    int threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v && !strcmp(a, "--dir"))
            dir = v, i++;
        else if (v && !strcmp(a, "--tokens"))
            list = v, i++;
        else if (v && !strcmp(a, "--tmax"))
            tmax = atoll(v), i++;
        else if (v && !strcmp(a, "--cut"))
            cut = atoll(v), i++;
        else if (v && !strcmp(a, "--threads"))
            threads = atoi(v), i++;
        else {
            fprintf(stderr, "usage: tile_fill [--dir DIR] [--tokens LIST] [--tmax N] [--cut N] [--threads N]\n");
            return 2;
        }
    }
    int64_t Ts[MAX_T];
    int nT = 0;
    for (const char *p = list; *p && nT < MAX_T;) {
        char *end = NULL;
        const long long t = strtoll(p, &end, 10);
        if (end == p || t < 1 || t > tmax) {
            fprintf(stderr, "tile_fill: --tokens %s: each T in [1, --tmax %lld]\n", list, (long long)tmax);
            return 2;
        }
        Ts[nT++] = t;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "tile_fill: --tokens %s: a comma-separated list of integers\n", list);
            return 2;
        }
    }
    if (nT == 0 || cut < 0 || threads < 1) {
        fprintf(stderr, "tile_fill: no T, or --cut < 0, or --threads < 1\n");
        return 2;
    }
    dsv4_error e;
    dsv4_config cfg;
    if (dsv4_config_preset("v4-flash", &cfg, &e)) {
        fprintf(stderr, "tile_fill: %s\n", e.message);
        return 1;
    }
    cfg.layer = cfg.n_layers > 5 ? 5 : cfg.n_layers - 1; /* bench_cuda's layer */
    char wp[1024], ip[1024];
    if (bench_gen_files(&cfg, dir, "cuda", "v4-flash", tmax, threads, "tile_fill", wp, ip, sizeof wp))
        return 1; /* bench_cuda's files */
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    dsv4_ref *ref = NULL;
    if (dsv4_checkpoint_open(wp, &ck, &e) || dsv4_st_open(ip, &in, &e) || dsv4_ref_create(&cfg, ck, threads, &ref, &e)) {
        fprintf(stderr, "tile_fill: %s\n", e.message);
        dsv4_st_close(in);
        dsv4_checkpoint_close(ck);
        return 1;
    }
    int64_t T = 0;
    for (int i = 0; i < nT; i++)
        T = Ts[i] > T ? Ts[i] : T;
    const int64_t K = cfg.n_activated, E = cfg.n_routed_experts;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));
    float *w = malloc(sizeof(float) * (size_t)(T * K));
    const dsv4_tensor_info *x = dsv4_st_find(in, "x"), *tid = dsv4_st_find(in, "input_ids");
    int rc = 0;
    if (!ids || !w || !x || !tid ||
        dsv4_ref_stage_route(ref, T, x->data, tid->data, ids, w, NULL, NULL, &e)) {
        fprintf(stderr, "tile_fill: %s\n", ids && w && x && tid ? e.message : "out of memory, or no x / input_ids");
        rc = 1;
    } else {
        printf("tile_fill: v4-flash layer %lld (E %lld, K %lld, shared %lld), the reference's routing of %s's first T "
               "tokens; groups of more than %lld rows on the grouped GEMM (the shared expert's T rows one of them)\n",
               (long long)cfg.layer, (long long)E, (long long)K, (long long)cfg.n_shared_experts, ip, (long long)cut);
        printf("| T | GEMM groups | rows | largest | 128-row tiles | fill | 64-row tiles | fill | groups <= %lld rows "
               "(their rows) |\n|---|---|---|---|---|---|---|---|---|\n",
               (long long)cut);
        for (int i = 0; i < nT; i++) {
            const fill_row r = fill_of(ids, Ts[i], K, E, cut, cfg.n_shared_experts > 0);
            printf("| %lld | %lld | %lld | %lld | %lld | %.1f %% | %lld | %.1f %% | %lld (%lld) |\n", (long long)Ts[i],
                   (long long)r.groups, (long long)r.rows, (long long)r.largest, (long long)r.t128,
                   r.t128 ? 100.0 * (double)r.rows / (double)(r.t128 * 128) : 0.0, (long long)r.t64,
                   r.t64 ? 100.0 * (double)r.rows / (double)(r.t64 * 64) : 0.0, (long long)r.small_groups,
                   (long long)r.small_rows);
        }
    }
    free(ids);
    free(w);
    dsv4_ref_free(ref);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
    return rc;
}
