/*
 * The reference's dot products: one at a time (dsv4_ref_dot), and the same sums for 8 tokens
 * and 4 weight rows at once (dsv4_ref_dot_tile), which the experts use. Both give the same
 * bits: a tile lane performs exactly dsv4_ref_dot's operations on its (token, row) pair, in
 * the same order. The tile only changes which of those independent operations run side by
 * side and how often a weight row is read from memory.
 */
#include <string.h>

#include "ref/ref_internal.h"

float dsv4_ref_dot(const float *a, const float *b, int64_t n)
{
    /* Four partial sums over i mod 4, combined pairwise: a fixed order that
       hides the add latency. Products of floats are exact in double, so the
       only rounding is that of the sums, far below fp32's. */
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)a[i] * (double)b[i];
        s1 += (double)a[i + 1] * (double)b[i + 1];
        s2 += (double)a[i + 2] * (double)b[i + 2];
        s3 += (double)a[i + 3] * (double)b[i + 3];
    }
    for (; i < n; i++)
        s0 += (double)a[i] * (double)b[i];
    return (float)((s0 + s1) + (s2 + s3));
}

void dsv4_ref_block_tokens(const float *x, int64_t n, int64_t k, int64_t t0, double *xt)
{
    for (int64_t t = 0; t < DSV4_REF_TB; t++) {
        const float *row = t0 + t < n ? x + (t0 + t) * k : NULL;
        for (int64_t i = 0; i < k; i++)
            xt[i * DSV4_REF_TB + t] = row ? (double)row[i] : 0.0;
    }
}

/* A GCC/Clang generic vector: lane t holds token t's partial sum. Element-wise double
   multiply and add are IEEE operations, so the lanes round exactly as dsv4_ref_dot's scalars
   on every instruction set; -ffp-contract=off (the reference's flags) keeps them unfused. */
typedef double ref_lanes __attribute__((vector_size(DSV4_REF_TB * sizeof(double))));

/* The tile's body, inlined into a copy per instruction set below. */
static inline __attribute__((always_inline)) void tile(const double *xt, const float *const w[DSV4_REF_NR], int64_t n,
                                                       float out[DSV4_REF_NR * DSV4_REF_TB])
{
    /* acc[r][c]: partial sum c (elements i = c mod 4) of weight row r, for the 8 tokens. */
    ref_lanes acc[DSV4_REF_NR][4];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    /* Unrolled so that the 16 accumulators stay in registers. */
    for (; i + 4 <= n; i += 4)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            ref_lanes x;
            memcpy(&x, xt + (i + c) * DSV4_REF_TB, sizeof x);
#pragma GCC unroll 4
            for (int r = 0; r < DSV4_REF_NR; r++)
                acc[r][c] += x * (double)w[r][i + c];
        }
    for (; i < n; i++) {
        ref_lanes x;
        memcpy(&x, xt + i * DSV4_REF_TB, sizeof x);
#pragma GCC unroll 4
        for (int r = 0; r < DSV4_REF_NR; r++)
            acc[r][0] += x * (double)w[r][i];
    }
    for (int r = 0; r < DSV4_REF_NR; r++) {
        ref_lanes s = (acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]);
        for (int t = 0; t < DSV4_REF_TB; t++)
            out[r * DSV4_REF_TB + t] = (float)s[t];
    }
}

/* On x86-64 the same body is also compiled for AVX-512 and AVX2, and the processor picks one at
   each call; the results cannot differ, only the speed (valgrind, which hides AVX-512, gets the
   AVX2 copy). Plain functions rather than target_clones, whose ifunc GCC would export past
   -fvisibility=hidden. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("arch=x86-64-v4"))) static void tile_v4(const double *xt, const float *const w[DSV4_REF_NR],
                                                              int64_t n, float out[DSV4_REF_NR * DSV4_REF_TB])
{
    tile(xt, w, n, out);
}

__attribute__((target("arch=x86-64-v3"))) static void tile_v3(const double *xt, const float *const w[DSV4_REF_NR],
                                                              int64_t n, float out[DSV4_REF_NR * DSV4_REF_TB])
{
    tile(xt, w, n, out);
}
#endif

void dsv4_ref_dot_tile(const double *xt, const float *const w[DSV4_REF_NR], int64_t n,
                       float out[DSV4_REF_NR * DSV4_REF_TB])
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("x86-64-v4"))
        tile_v4(xt, w, n, out);
    else if (__builtin_cpu_supports("x86-64-v3"))
        tile_v3(xt, w, n, out);
    else
#endif
        tile(xt, w, n, out);
}
