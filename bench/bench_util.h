/*
 * Helpers shared by the benchmark programs (bench_cpu, bench_cuda, tile_fill); not part of the library.
 */
#ifndef DSV4MOE_BENCH_UTIL_H
#define DSV4MOE_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include "dsv4moe/gen.h"
#include "dsv4moe/weights.h"

/* Bytes one weight matrix occupies in the checkpoint: its rows plus its scales (fp4: one ue8m0
   byte per 32 values; fp8: one 128x128 block scale, ue8m0 or fp32). What a forward that touches
   the matrix must read at least once. */
static inline uint64_t bench_view_bytes(const dsv4_matrix_view *v)
{
    uint64_t b = v->row_bytes * (uint64_t)v->n;
    if (v->format == DSV4_FORMAT_FP4)
        b += (uint64_t)(v->n * (v->k / 32));
    else if (v->format == DSV4_FORMAT_FP8)
        b += (uint64_t)(((v->n + 127) / 128) * ((v->k + 127) / 128)) * (v->scale_format == DSV4_SCALE_FP32 ? 4 : 1);
    return b;
}

/* The cuda backend's kernel variants (dsv4_backend_options.params) from the environment the
   device scripts and tests set: DSV4MOE_CUDA_KERNELS (the list as is), then DSV4MOE_CUDA_PATH=exact,
   DSV4MOE_CUDA_TILE=mma, DSV4MOE_CUDA_TILEH=<variant>, DSV4MOE_CUDA_MID=<variant> appended. The
   library reads no environment; the programs pass what they read. buf gets "" when none is set. */
static inline const char *bench_cuda_kernels_env(char *buf, size_t n)
{
    static const char *const vars[][2] = {{"DSV4MOE_CUDA_KERNELS", ""}, {"DSV4MOE_CUDA_PATH", "path="},
                                          {"DSV4MOE_CUDA_TILE", "tile="}, {"DSV4MOE_CUDA_TILEH", "tileh="},
                                          {"DSV4MOE_CUDA_MID", "mid="}};
    size_t len = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i][0]);
        if (!v || !*v)
            continue;
        int w = snprintf(buf + len, n - len, "%s%s%s", len ? "," : "", vars[i][1], v);
        if (w < 0 || (size_t)w >= n - len)
            break; /* too long: the library refuses the truncated list by name */
        len += (size_t)w;
    }
    return buf;
}

static inline int bench_file_exists(const char *p)
{
    struct stat s;
    return stat(p, &s) == 0;
}

/* A benchmark's generated files under dir, made once and reused: the layer cfg->layer of the
   config (seed 1) at wp = dir/PREFIX_TAG_lLAYER.safetensors and `tokens` rows of input (seed 2) at
   ip = dir/PREFIX_TAG_inTOKENS.safetensors (n bytes each). The same names and seeds are the same
   files: tile_fill reads bench_cuda's ("cuda", "v4-flash"). 0, or 1 with the error on stderr after
   prog. */
static inline int bench_gen_files(const dsv4_config *cfg, const char *dir, const char *prefix, const char *tag,
                                  int64_t tokens, int threads, const char *prog, char *wp, char *ip, size_t n)
{
    dsv4_error e;
    snprintf(wp, n, "%s/%s_%s_l%lld.safetensors", dir, prefix, tag, (long long)cfg->layer);
    snprintf(ip, n, "%s/%s_%s_in%lld.safetensors", dir, prefix, tag, (long long)tokens);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.threads = threads;
    if (!bench_file_exists(wp)) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fprintf(stderr, "%s: generating %s (once) ...\n", prog, wp);
        if (dsv4_gen_weights(cfg, &o, wp, &e)) {
            fprintf(stderr, "%s: %s\n", prog, e.message);
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        fprintf(stderr, "%s: generated in %.1f s\n", prog,
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    }
    o.seed = 2;
    if (!bench_file_exists(ip) && dsv4_gen_input(cfg, &o, tokens, ip, &e)) {
        fprintf(stderr, "%s: %s\n", prog, e.message);
        return 1;
    }
    return 0;
}

#endif
