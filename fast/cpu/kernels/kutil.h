/*
 * Scalar helpers of the CPU backend and its kernels (internal): bit casts, bf16 rounding and
 * the ue8m0 decode bit-identical to core/formats.c, a view's row and scale pointers, and the
 * fixed-order four-sum dot product the scalar paths share.
 */
#ifndef DSV4MOE_FAST_CPU_KUTIL_H
#define DSV4MOE_FAST_CPU_KUTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/bits.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/weights.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_X86 1
#else
#define CPU_X86 0
#endif

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static inline uint16_t tobf16(float x) { return dsv4_bf16_bits(x); }
static inline float rbf16(float x) { return dsv4_f32_from_bits((uint32_t)dsv4_bf16_bits(x) << 16); }
static inline float ue8m0f(uint8_t b)
{
    if (b == 255)
        return NAN;
    return dsv4_f32_from_bits(b ? (uint32_t)b << 23 : 0x00400000u);
}
static inline float ldf32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* Row r of a view: data and the scale pointer the decoders take. */
static inline const uint8_t *row_data(const dsv4_matrix_view *m, int64_t r) { return m->data + (uint64_t)r * m->row_bytes; }
static inline const uint8_t *row_scales(const dsv4_matrix_view *m, int64_t r)
{
    if (m->format == DSV4_FORMAT_FP4)
        return m->scales + r * (m->k / 32);
    if (m->format == DSV4_FORMAT_FP8)
        return m->scales + (r / 128) * cdiv(m->k, 128) * (m->scale_format == DSV4_SCALE_FP32 ? 4 : 1);
    return NULL;
}

/* a . b in fp32 over four fixed partial sums, ((s0 + s1) + (s2 + s3)): the scalar paths' one order. */
static inline float dot4(const float *a, const float *b, int64_t n)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/*
 * The blocking of the register-blocked kernels (avx2.c, avx512*.c): activation rows [0, n) in even
 * passes of at most 8 (9 rows run as 5 + 4, not 8 + 1); in a pass of RB rows, weight rows
 * [r0, r0 + nr) in tiles of NW<RB> rows (fewer as RB grows, so that the accumulators fit the
 * registers), the tail one row at a time: TILE(NW, RB, m, r, NC, Xq, ldx, Cq, ldc) with NW and RB
 * constants. Expects m, r0, nr, n, X (of type XT), ldx, C and ldc in scope.
 */
#define ROW_BLOCKS(XT, TILE, NC, NW1, NW2, NW3, NW4, NW5, NW6, NW7, NW8)                                          \
    for (int64_t q_ = 0; q_ < n;) {                                                                              \
        int rb_ = (int)cdiv(n - q_, cdiv(n - q_, 8));                                                            \
        const XT *Xq = X + q_ * ldx;                                                                             \
        float *Cq = C + q_ * ldc;                                                                                \
        int64_t j_ = 0;                                                                                          \
        switch (rb_) {                                                                                           \
        case 1: ROW_TILES(TILE, NC, NW1, 1); break;                                                              \
        case 2: ROW_TILES(TILE, NC, NW2, 2); break;                                                              \
        case 3: ROW_TILES(TILE, NC, NW3, 3); break;                                                              \
        case 4: ROW_TILES(TILE, NC, NW4, 4); break;                                                              \
        case 5: ROW_TILES(TILE, NC, NW5, 5); break;                                                              \
        case 6: ROW_TILES(TILE, NC, NW6, 6); break;                                                              \
        case 7: ROW_TILES(TILE, NC, NW7, 7); break;                                                              \
        default: ROW_TILES(TILE, NC, NW8, 8); break;                                                             \
        }                                                                                                        \
        q_ += rb_;                                                                                               \
    }
#define ROW_TILES(TILE, NC, NW_, RB_)                                                                            \
    do {                                                                                                         \
        for (; j_ + (NW_) <= nr; j_ += (NW_))                                                                    \
            TILE(NW_, RB_, m, r0 + j_, NC, Xq, ldx, Cq + j_, ldc);                                               \
        for (; j_ < nr; j_++)                                                                                    \
            TILE(1, RB_, m, r0 + j_, NC, Xq, ldx, Cq + j_, ldc);                                                 \
    } while (0)

/* A tile's row and scale pointers for weight rows r .. r + NW - 1 and its NW x RB accumulators
   set to ZERO (the register-blocked kernels' prologue, any vector width). */
#define TILE_INIT(NW, RB, m, r, row, scl, acc, ZERO)                                                             \
    _Pragma("GCC unroll 8") for (int w_ = 0; w_ < (NW); w_++)                                                    \
    {                                                                                                            \
        row[w_] = row_data(m, (r) + w_);                                                                         \
        scl[w_] = row_scales(m, (r) + w_);                                                                       \
        _Pragma("GCC unroll 8") for (int q_ = 0; q_ < (RB); q_++) acc[w_][q_] = (ZERO);                          \
    }

/* A dsv4_cpu_dot_fn entry (tmp unused) running IMPL(FMT, m, r0, nr, n, X, ldx, C, ldc). */
#define DOT_ENTRY(ATTR, NAME, IMPL, FMT)                                                                         \
    ATTR static void NAME(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X,          \
                          int64_t ldx, float *C, int64_t ldc, float *tmp)                                        \
    {                                                                                                            \
        (void)tmp;                                                                                               \
        IMPL(FMT, m, r0, nr, n, X, ldx, C, ldc);                                                                 \
    }

#endif
