/*
 * Helpers shared by the benchmark programs (bench_cpu, bench_cuda); not part of the library.
 */
#ifndef DSV4MOE_BENCH_UTIL_H
#define DSV4MOE_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

#endif
