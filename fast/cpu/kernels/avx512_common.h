/*
 * What the AVX-512 kernel files share (internal to fast/cpu/kernels): target attributes, a
 * tile's row/scale pointers and accumulators, the bf16 kernels' activation-row blocking and
 * their 128-element dot step. Only included under CPU_X86.
 */
#ifndef DSV4MOE_FAST_CPU_AVX512_COMMON_H
#define DSV4MOE_FAST_CPU_AVX512_COMMON_H

#include <immintrin.h>

#include "kernels.h"
#include "kutil.h"

enum { F_FP8 = 1, F_FP4 = 2 };

#define AINL __attribute__((always_inline)) inline
#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define TGTBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define TGTBF4 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,avx2,fma,f16c")))

/* A tile's row and scale pointers for weight rows r .. r + NW - 1, and zeroed accumulators. */
TGT512 static AINL void tile_init(int NW, int RB, const dsv4_matrix_view *m, int64_t r, const uint8_t *row[8],
                                  const uint8_t *scl[8], __m512 acc[8][8])
{
#pragma GCC unroll 8
    for (int w = 0; w < NW; w++) {
        row[w] = row_data(m, r + w);
        scl[w] = row_scales(m, r + w);
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++)
            acc[w][q] = _mm512_setzero_ps();
    }
}


/*
 * The activation-row blocking of the bf16 kernels: rows in even passes of at most 8 (9 rows
 * run as 5 + 4, not 8 + 1), NW weight rows per tile call, fewer as RB grows so that the
 * accumulators fit the registers. TILE(NW, RB, m, r, nc, X, ldx, C, ldc); NC: its step count.
 */
#define BF16_ROW_BLOCKS(TILE, NC)                                                                                \
    for (int64_t q = 0; q < n;) {                                                                                \
        int64_t passes = cdiv(n - q, 8);                                                                         \
        int rb = (int)cdiv(n - q, passes);                                                                       \
        const uint16_t *Xq = X + q * ldx;                                                                        \
        float *Cq = C + q * ldc;                                                                                 \
        int64_t j = 0;                                                                                           \
        switch (rb) {                                                                                            \
        case 1: BF16_TILES(TILE, NC, 8, 1); break;                                                               \
        case 2: BF16_TILES(TILE, NC, 8, 2); break;                                                               \
        case 3: BF16_TILES(TILE, NC, 4, 3); break;                                                               \
        case 4: BF16_TILES(TILE, NC, 4, 4); break;                                                               \
        case 5: BF16_TILES(TILE, NC, 4, 5); break;                                                               \
        case 6: BF16_TILES(TILE, NC, 2, 6); break;                                                               \
        case 7: BF16_TILES(TILE, NC, 2, 7); break;                                                               \
        default: BF16_TILES(TILE, NC, 2, 8); break;                                                              \
        }                                                                                                        \
        q += rb;                                                                                                 \
    }
#define BF16_TILES(TILE, NC, NW_, RB_)                                                                           \
    do {                                                                                                         \
        for (; j + (NW_) <= nr; j += (NW_))                                                                      \
            TILE(NW_, RB_, m, r0 + j, NC, Xq, ldx, Cq + j, ldc);                                                 \
        for (; j < nr; j++)                                                                                      \
            TILE(1, RB_, m, r0 + j, NC, Xq, ldx, Cq + j, ldc);                                                   \
    } while (0)

/* The step tilebf4 and tile8bf share: acc[q] += sv * (X[q]'s 128-block c . wv[0..3]), q < RB. */
TGTBF static AINL void dot4_step(int RB, const uint16_t *X, int64_t ldx, int64_t c, const __m512bh wv[4], __m512 sv,
                                 __m512 *acc)
{
#pragma GCC unroll 8
    for (int q = 0; q < RB; q++) {
        const uint16_t *x = X + q * ldx + 128 * c;
        __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), wv[0], (__m512bh)_mm512_loadu_si512((const void *)x));
        t = _mm512_dpbf16_ps(t, wv[1], (__m512bh)_mm512_loadu_si512((const void *)(x + 32)));
        t = _mm512_dpbf16_ps(t, wv[2], (__m512bh)_mm512_loadu_si512((const void *)(x + 64)));
        t = _mm512_dpbf16_ps(t, wv[3], (__m512bh)_mm512_loadu_si512((const void *)(x + 96)));
        acc[q] = _mm512_fmadd_ps(t, sv, acc[q]);
    }
}

/* C[q * ldc + w] = the sum of acc[w][q]'s lanes. */
TGTBF static AINL void store_acc(int NW, int RB, __m512 acc[8][8], float *C, int64_t ldc)
{
#pragma GCC unroll 8
    for (int w = 0; w < NW; w++)
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++)
            C[q * ldc + w] = _mm512_reduce_add_ps(acc[w][q]);
}

#endif
