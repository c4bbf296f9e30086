/*
 * Helpers shared by the benchmark programs (bench_cpu, bench_cuda); not part of the library.
 */
#ifndef DSV4MOE_BENCH_UTIL_H
#define DSV4MOE_BENCH_UTIL_H

#include <stdint.h>
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

#endif
