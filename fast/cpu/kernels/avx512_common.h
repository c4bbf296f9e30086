/*
 * What the AVX-512 kernel files share (internal to fast/cpu/kernels): target attributes, a
 * tile's row/scale pointers and accumulators, the bf16 kernels' activation-row blocking,
 * their 128-element dot step and the loop of their 128-block tiles. Only included under CPU_X86.
 */
#ifndef DSV4MOE_FAST_CPU_AVX512_COMMON_H
#define DSV4MOE_FAST_CPU_AVX512_COMMON_H

#include <immintrin.h>

#include "fast/cpu/kernels/kernels.h"
#include "fast/cpu/kernels/kutil.h"

enum { F_FP8 = 1, F_FP4 = 2 };

#define AINL __attribute__((always_inline)) inline
#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define TGTBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define TGTBF4 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,avx2,fma,f16c")))

/* A tile's row and scale pointers for weight rows r .. r + NW - 1, and zeroed accumulators;
   returns the prefetch distance in bytes: 8 tiles of NW rows ahead, into L2. */
TGT512 static AINL int64_t tile_init(int NW, int RB, const dsv4_matrix_view *m, int64_t r, const uint8_t *row[8],
                                     const uint8_t *scl[8], __m512 acc[8][8])
{
    TILE_INIT(NW, RB, m, r, row, scl, acc, _mm512_setzero_ps());
    return 8 * (int64_t)NW * (int64_t)m->row_bytes;
}


/* The bf16 kernels' blocking (kutil.h's ROW_BLOCKS): 8 weight rows per tile call up to 2
   activation rows, 4 up to 5, then 2, so that the accumulators fit the registers. */
#define BF16_ROW_BLOCKS(TILE, NC) ROW_BLOCKS(uint16_t, TILE, NC, 8, 8, 4, 4, 4, 2, 2, 2)

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

/* C[q * ldc + w] = the sum of acc[w][q]'s lanes (every AVX-512 tile's epilogue). */
TGT512 static AINL void store_acc(int NW, int RB, __m512 acc[8][8], float *C, int64_t ldc)
{
#pragma GCC unroll 8
    for (int w = 0; w < NW; w++)
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++)
            C[q * ldc + w] = _mm512_reduce_add_ps(acc[w][q]);
}

/* A 128-block kernel's decoder: the bb bytes at p (block c of a weight row whose scales start at
   scl) as the 4 bf16 vectors dot4_step takes (wv) and their scale per fp32 lane (sv); k holds the
   kernel's constants (tables, masks), loaded once before the tile's loop. */
typedef void tile128_decoder(const void *k, const uint8_t *p, const uint8_t *scl, int64_t c, __m512bh wv[4],
                             __m512 *sv);

/*
 * The loop tile8bf (avx512bf16.c) and tilebf4 (avx512vbmi.c) share, written once: C[q * ldc + w]
 * = weight row r + w (w < NW) . activation row q (q < RB) over n128 blocks of 128 elements, each
 * block bb bytes of a row, prefetched 8 tiles ahead into L2 (tile_init), decoded by dec and summed
 * by dot4_step. Always inlined with a constant dec that is itself always_inline, so the compiler
 * inlines the decoder into the loop (indirect inlining): the kernels' code is the one they had
 * with the loop written in each (objdump: no call in their hot loops).
 */
TGTBF static AINL void tile128_bf16(int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t n128, int64_t bb,
                                    tile128_decoder *dec, const void *k, const uint16_t *X, int64_t ldx, float *C,
                                    int64_t ldc)
{
    const uint8_t *row[8], *scl[8];
    __m512 acc[8][8];
    const int64_t pf = tile_init(NW, RB, m, r, row, scl, acc);
    for (int64_t c = 0; c < n128; c++) {
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            const uint8_t *p = row[w] + bb * c;
#pragma GCC unroll 4
            for (int64_t o = 0; o < bb; o += 64)
                _mm_prefetch((const char *)(p + pf + o), _MM_HINT_T1);
            __m512bh wv[4];
            __m512 sv;
            dec(k, p, scl[w], c, wv, &sv);
            dot4_step(RB, X, ldx, c, wv, sv, acc[w]);
        }
    }
    store_acc(NW, RB, acc, C, ldc);
}

#endif
