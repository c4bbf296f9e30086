/*
 * The AVX2 + FMA + F16C kernels: weight rows decoded 32 elements at a time into four 8-lane
 * fp32 vectors (fp4 by a byte shuffle table, fp8 e4m3 through fp16 bits and vcvtph2ps, bf16 by
 * a shift) and multiplied into X by FMA. Rows with k % 32 != 0 take the reference kernels.
 * Entries: dequant and dot (one weight row at a time against up to 4 activation rows), and the
 * fp4 / fp8 decode-dot behind dot_fp4_packed and dot_fp8, which the fused regime prefers:
 * register-blocked (tile2) for a few activation rows, blocked through L1 (dot_rows_blocked) for
 * more, at any group size (the table's dot_blocked). Loops over register arrays carry `#pragma GCC unroll`: without it
 * GCC kept the accumulators on the stack (a load and a store per FMA; measured 3.2x slower).
 */
#include "fast/cpu/kernels/kernels.h"
#include "fast/cpu/kernels/kutil.h"

#if CPU_X86
#include <immintrin.h>

enum { F_BF16 = 0, F_FP8 = 1, F_FP4 = 2 };

#define TGT __attribute__((target("avx2,fma,f16c")))
#define AINL __attribute__((always_inline)) inline

/* Decodes elements [32c, 32c + 32) of a row into w[0..3] (fp32, scaled). */
TGT static AINL void dec32(int fmt, const uint8_t *row, const uint8_t *scl, int sfp32, int64_t c, __m256 w[4])
{
    if (fmt == F_FP4) {
        const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        const __m128i m0f = _mm_set1_epi8(0x0F);
        __m128i bb = _mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c));
        __m128i lo = _mm_and_si128(bb, m0f), hi = _mm_and_si128(_mm_srli_epi16(bb, 4), m0f);
        __m128i vl = _mm_shuffle_epi8(lut, lo), vh = _mm_shuffle_epi8(lut, hi);
        __m128i e0 = _mm_unpacklo_epi8(vl, vh), e1 = _mm_unpackhi_epi8(vl, vh);
        __m256 sv = _mm256_set1_ps(ue8m0f(scl[c]) * 0.5f);
        w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), sv);
        w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), sv);
        w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), sv);
        w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), sv);
    } else if (fmt == F_FP8) {
        int64_t bk = c >> 2;
        float s = sfp32 ? ldf32(scl + 4 * bk) : ue8m0f(scl[bk]);
        __m256 sv = _mm256_set1_ps(s * 256.0f);
        /* the code sign-extended to 16 bits and shifted left by 7 has the sign in bits 14 and 15
           and the exponent and mantissa in bits 7-13: clearing bit 14 leaves the fp16 bits */
        const __m256i mfp16 = _mm256_set1_epi16((short)0xBF80);
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(row + 32 * c + 16 * h)));
            __m256i hf = _mm256_and_si256(_mm256_slli_epi16(v, 7), mfp16);
            w[2 * h] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(hf)), sv);
            w[2 * h + 1] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(hf, 1)), sv);
        }
    } else {
        for (int i = 0; i < 4; i++) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 64 * c + 16 * i)));
            w[i] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        }
    }
}

TGT static AINL float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* RB rows of X against one weight row; NA accumulators per row (4 for RB <= 2, else 2). */
TGT static AINL void dot_block(int fmt, int RB, const uint8_t *row, const uint8_t *scl, int sfp32, int64_t nc,
                               const float *X, int64_t ldx, float *out, int64_t ldo)
{
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++)
            acc[r][a] = _mm256_setzero_ps();
    for (int64_t c = 0; c < nc; c++) {
        __m256 w[4];
        dec32(fmt, row, scl, sfp32, c, w);
#pragma GCC unroll 4
        for (int r = 0; r < RB; r++) {
            const float *x = X + r * ldx + 32 * c;
            if (RB <= 2) {
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++)
                    acc[r][a] = _mm256_fmadd_ps(w[a], _mm256_loadu_ps(x + 8 * a), acc[r][a]);
            } else {
                acc[r][0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x), acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), acc[r][1]);
                acc[r][0] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), acc[r][1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++) {
        __m256 s = RB <= 2 ? _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]))
                           : _mm256_add_ps(acc[r][0], acc[r][1]);
        out[r * ldo] = hsum(s);
    }
}

TGT static AINL void dot_rows_fmt(int fmt, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n,
                                  const float *X, int64_t ldx, float *C, int64_t ldc)
{
    int64_t nc = m->k / 32;
    int sfp32 = m->scale_format == DSV4_SCALE_FP32;
    for (int64_t j = 0; j < nr; j++) {
        const uint8_t *row = row_data(m, r0 + j), *scl = row_scales(m, r0 + j);
        int64_t q = 0;
        for (; q + 4 <= n; q += 4)
            dot_block(fmt, 4, row, scl, sfp32, nc, X + q * ldx, ldx, C + q * ldc + j, ldc);
        for (; q + 2 <= n; q += 2)
            dot_block(fmt, 2, row, scl, sfp32, nc, X + q * ldx, ldx, C + q * ldc + j, ldc);
        if (q < n)
            dot_block(fmt, 1, row, scl, sfp32, nc, X + q * ldx, ldx, C + q * ldc + j, ldc);
    }
}

TGT static void dot_rows_simd(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X,
                              int64_t ldx, float *C, int64_t ldc)
{
    if (m->format == DSV4_FORMAT_FP4)
        dot_rows_fmt(F_FP4, m, r0, nr, n, X, ldx, C, ldc);
    else if (m->format == DSV4_FORMAT_FP8)
        dot_rows_fmt(F_FP8, m, r0, nr, n, X, ldx, C, ldc);
    else
        dot_rows_fmt(F_BF16, m, r0, nr, n, X, ldx, C, ldc);
}

TGT static AINL void dequant_fmt(int fmt, const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out)
{
    int64_t nc = m->k / 32, k = m->k;
    int sfp32 = m->scale_format == DSV4_SCALE_FP32;
    for (int64_t j = 0; j < nr; j++) {
        const uint8_t *row = row_data(m, r0 + j), *scl = row_scales(m, r0 + j);
        float *o = out + j * k;
        for (int64_t c = 0; c < nc; c++) {
            __m256 w[4];
            dec32(fmt, row, scl, sfp32, c, w);
#pragma GCC unroll 4
            for (int a = 0; a < 4; a++)
                _mm256_storeu_ps(o + 32 * c + 8 * a, w[a]);
        }
    }
}

TGT static void dequant_simd(const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out)
{
    if (m->format == DSV4_FORMAT_FP4)
        dequant_fmt(F_FP4, m, r0, nr, out);
    else if (m->format == DSV4_FORMAT_FP8)
        dequant_fmt(F_FP8, m, r0, nr, out);
    else
        dequant_fmt(F_BF16, m, r0, nr, out);
}

/*
 * Register-blocked decode-dot (the AVX2 counterpart of avx512.c's tile512): NW weight rows x RB
 * activation rows per pass, NW x RB <= 8 accumulators in registers. Each 32-element chunk of a
 * weight row is decoded once for all RB activation rows.
 *
 * fp4 (X packed by pack_fp4_avx2 below): the 16 code bytes of a chunk are broadcast to both
 * 128-bit lanes, lane 0 keeps the low nibbles (even elements), lane 1 the high ones (odd); two
 * vpshufb look up the high and low bytes of the scaled weights as bf16 in the tables of the
 * group's ue8m0 scale byte (e2m1_bf16_s: every e2m1 value times every power-of-two scale has at
 * most two significant bits, so its fp32 is exactly a bf16, zero, inf or NaN: the table gives
 * dsv4_matrix_dequant_rows's value with no multiply), and two byte unpacks make 16-bit bf16
 * words. A bf16 word is the top half of its fp32, so a dword shifted left by 16 is the even
 * word's fp32 and the dword ANDed with 0xFFFF0000 the odd word's: four fp32 vectors from 11
 * single-uop operations (no lane-crossing permute, fast on every AVX2 CPU).
 * fp8 (natural X): dec32's e4m3 -> fp16 -> fp32 decode, scaled.
 * Per activation row, acc += w x by four FMAs per chunk: the same operations in the same order
 * whatever the blocking, so a row's result does not depend on the other rows of its batch, and
 * the blocked kernel below gives the same bits.
 */
static uint8_t e2m1_bf16_s[256][32]; /* [scale byte]: 16 high bytes, then 16 low bytes (fill) */

/* The packed X layout of one 32-block: position 8 v + 4 L + j holds element 16 (v / 2) + 4 j +
   2 (v % 2) + L (v: decoded vector 0..3, L: 128-bit lane, j: dword in the lane). */
static void pack_fp4_avx2(const float *X, int64_t ldx, int64_t n, int64_t k, float *XP)
{
    for (int64_t q = 0; q < n; q++) {
        const float *x = X + q * ldx;
        float *o = XP + q * k;
        for (int64_t c = 0; c < k; c += 32)
            for (int v = 0; v < 4; v++)
                for (int L = 0; L < 2; L++)
                    for (int j = 0; j < 4; j++)
                        o[c + 8 * v + 4 * L + j] = x[c + 16 * (v / 2) + 4 * j + 2 * (v % 2) + L];
    }
}

/* The 32 weights of chunk c of one fp4 row (scale byte s), in the packed order. */
TGT static AINL void dec_fp4_packed(const uint8_t *row, int64_t c, uint8_t s, __m256 w[4])
{
    const __m256i thi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)e2m1_bf16_s[s]));
    const __m256i tlo =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(e2m1_bf16_s[s] + 16)));
    const __m256i m0f = _mm256_set1_epi8(0x0F), mhi = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c)));
    __m256i codes = _mm256_and_si256(_mm256_blend_epi32(v, _mm256_srli_epi16(v, 4), 0xF0), m0f);
    __m256i hi = _mm256_shuffle_epi8(thi, codes), lo = _mm256_shuffle_epi8(tlo, codes);
    __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
    w[0] = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
    w[1] = _mm256_castsi256_ps(_mm256_and_si256(a, mhi));
    w[2] = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
    w[3] = _mm256_castsi256_ps(_mm256_and_si256(b, mhi));
}

TGT static AINL void tile2(int fmt, int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t nc,
                           const float *X, int64_t ldx, float *C, int64_t ldc)
{
    int sfp32 = m->scale_format == DSV4_SCALE_FP32;
    const int64_t pf = 8 * (int64_t)NW * (int64_t)m->row_bytes; /* 8 tiles ahead, into L2 */
    const uint8_t *row[8], *scl[8];
    __m256 acc[8][8];
    TILE_INIT(NW, RB, m, r, row, scl, acc, _mm256_setzero_ps());
    for (int64_t c = 0; c < nc; c++) {
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            __m256 wv[4];
            if (fmt == F_FP4 ? !(c & 3) : !(c & 1)) /* one line per 64 bytes */
                _mm_prefetch((const char *)(row[w] + (fmt == F_FP4 ? 16 : 32) * c + pf), _MM_HINT_T1);
            if (fmt == F_FP4)
                dec_fp4_packed(row[w], c, scl[w][c], wv);
            else
                dec32(F_FP8, row[w], scl[w], sfp32, c, wv);
#pragma GCC unroll 8
            for (int q = 0; q < RB; q++) {
                const float *x = X + q * ldx + 32 * c;
                __m256 a = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(x), acc[w][q]);
                a = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(x + 8), a);
                a = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(x + 16), a);
                acc[w][q] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(x + 24), a);
            }
        }
    }
#pragma GCC unroll 8
    for (int w = 0; w < NW; w++)
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++)
            C[q * ldc + w] = hsum(acc[w][q]);
}

/* Weight rows [r0, r0 + nr) against n activation rows in even passes of at most 8 rows. */
TGT static AINL void dot_rows_tiled(int fmt, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n,
                                    const float *X, int64_t ldx, float *C, int64_t ldc)
{
    /* one activation row: 4 weight rows (8 would need 16 row and scale pointers: GPR spills) */
#define TILE2(NW_, RB_, ...) tile2(fmt, NW_, RB_, __VA_ARGS__)
    ROW_BLOCKS(float, TILE2, m->k / 32, 4, 4, 2, 2, 1, 1, 1, 1)
#undef TILE2
}

/*
 * The blocked decode-dot for larger groups (the GEMM of an expert group): BLIS's loop order with
 * the decoded weights as the packed operand. For each block of GB_NB weight rows and each
 * GB_KC-element slice of k, the rows' slice is decoded once (scaled fp32 in tile2's element
 * order: X packed by pack_fp4 for fp4, natural for fp8) into Wd (16 KiB, stays in L1); then every
 * activation row runs against it, GB_RB activation rows x 2 weight rows at a time (12
 * accumulators, 2 weight vectors and X: 15 of the 16 registers; 8 loads per 12 FMAs). The
 * accumulators wait in sp between slices, so each output is the same eight lane sums in k order,
 * then hsum, whatever the blocking: the same bits as tile2. Activation rows in chunks of at most
 * GB_QC. Wd and sp are on the stack (48 KiB).
 */
enum { GB_NB = 16, GB_KC = 256, GB_QC = 64, GB_RB = 6 };

/* Weight rows r .. r + nb - 1, elements [k0, k0 + kc), into Wd (rows GB_KC apart), scaled. */
TGT static AINL void gb_decode(int fmt, const dsv4_matrix_view *m, int64_t r, int nb, int64_t k0, int64_t kc,
                               float *Wd)
{
    int sfp32 = m->scale_format == DSV4_SCALE_FP32;
    int64_t bpe = fmt == F_FP4 ? 16 : 32; /* bytes per 32 elements */
    for (int w = 0; w < nb; w++) {
        const uint8_t *row = row_data(m, r + w), *scl = row_scales(m, r + w);
        float *o = Wd + w * GB_KC;
        for (int64_t i = 0; i < bpe * (kc / 32); i += 64) {
            /* the row's next slice into L1, this slice of the next block's row into L2 (a
               prefetch past the matrix does not fault) */
            _mm_prefetch((const char *)(row + bpe * ((k0 + kc) / 32) + i), _MM_HINT_T0);
            _mm_prefetch((const char *)(row + (int64_t)nb * (int64_t)m->row_bytes + bpe * (k0 / 32) + i), _MM_HINT_T1);
        }
        for (int64_t c = k0 / 32; c < (k0 + kc) / 32; c++, o += 32) {
            __m256 wv[4];
            if (fmt == F_FP4)
                dec_fp4_packed(row, c, scl[c], wv);
            else
                dec32(F_FP8, row, scl, sfp32, c, wv);
#pragma GCC unroll 4
            for (int a = 0; a < 4; a++)
                _mm256_store_ps(o + 8 * a, wv[a]);
        }
    }
}

/* NW (1, 2) decoded rows at Wd against RB activation rows of X over one slice of kc elements;
   the accumulators come from and go to sp (NW x GB_QC vectors, row w at sp + w * GB_QC), or
   start at zero (first) and end in C (last). */
TGT static AINL void gb_tile(int NW, int RB, const float *Wd, int64_t kc, const float *X, int64_t ldx, __m256 *sp,
                             bool first, bool last, float *C, int64_t ldc)
{
    __m256 acc[2][GB_RB];
#pragma GCC unroll 2
    for (int w = 0; w < NW; w++)
#pragma GCC unroll 6
        for (int q = 0; q < RB; q++)
            acc[w][q] = first ? _mm256_setzero_ps() : sp[w * GB_QC + q];
    for (int64_t i = 0; i < kc; i += 8) {
        __m256 w0 = _mm256_load_ps(Wd + i), w1 = NW > 1 ? _mm256_load_ps(Wd + GB_KC + i) : w0;
#pragma GCC unroll 6
        for (int q = 0; q < RB; q++) {
            __m256 x = _mm256_loadu_ps(X + q * ldx + i);
            __asm__("" : "+x"(x)); /* one load of x for both weight rows, not one per FMA */
            acc[0][q] = _mm256_fmadd_ps(w0, x, acc[0][q]);
            if (NW > 1)
                acc[1][q] = _mm256_fmadd_ps(w1, x, acc[1][q]);
        }
    }
#pragma GCC unroll 2
    for (int w = 0; w < NW; w++)
#pragma GCC unroll 6
        for (int q = 0; q < RB; q++) {
            if (last)
                C[q * ldc + w] = hsum(acc[w][q]);
            else
                sp[w * GB_QC + q] = acc[w][q];
        }
}

/* Activation rows [0, nq) (nq <= GB_QC) in even blocks of at most GB_RB against the nb decoded
   rows. */
TGT static AINL void gb_rows(int nb, const float *Wd, int64_t kc, const float *X, int64_t ldx, __m256 *sp, bool first,
                             bool last, float *C, int64_t ldc, int64_t nq)
{
    for (int64_t q = 0; q < nq;) {
        int rb = (int)cdiv(nq - q, cdiv(nq - q, GB_RB)); /* even blocks: 32 rows as 6 6 5 5 5 5 */
        for (int j = 0; j < nb; j += 2) {
            const float *Wj = Wd + j * GB_KC, *Xq = X + q * ldx;
            __m256 *s = sp + j * GB_QC + q;
            float *Cq = C + q * ldc + j;
#define GB_CASE(RB_)                                                                                                 case RB_:                                                                                                            if (nb - j >= 2)                                                                                                     gb_tile(2, RB_, Wj, kc, Xq, ldx, s, first, last, Cq, ldc);                                                   else                                                                                                                 gb_tile(1, RB_, Wj, kc, Xq, ldx, s, first, last, Cq, ldc);                                                   break;
            switch (rb) {
                GB_CASE(1)
                GB_CASE(2)
                GB_CASE(3)
                GB_CASE(4)
                GB_CASE(5)
                default: GB_CASE(6)
            }
#undef GB_CASE
        }
        q += rb;
    }
}

TGT static AINL void dot_rows_blocked(int fmt, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n,
                                      const float *X, int64_t ldx, float *C, int64_t ldc)
{
    _Alignas(32) float Wd[GB_NB * GB_KC];
    _Alignas(32) __m256 sp[GB_NB * GB_QC];
    int64_t k = m->k;
    int64_t nchunk = cdiv(n, GB_QC), qc = cdiv(n, nchunk); /* even activation-row chunks */
    for (int64_t q0 = 0; q0 < n; q0 += qc) {
        int64_t nq = n - q0 < qc ? n - q0 : qc;
        for (int64_t j = 0; j < nr; j += GB_NB) {
            int nb = nr - j < GB_NB ? (int)(nr - j) : GB_NB;
            for (int64_t k0 = 0; k0 < k; k0 += GB_KC) {
                int64_t kc = k - k0 < GB_KC ? k - k0 : GB_KC;
                gb_decode(fmt, m, r0 + j, nb, k0, kc, Wd);
                gb_rows(nb, Wd, kc, X + q0 * ldx + k0, ldx, sp, k0 == 0, k0 + kc >= k, C + q0 * ldc + j, ldc, nq);
            }
        }
    }
}

/* Up to 4 activation rows (fp4; 5 for fp8, whose decode costs more): tile2 (each weight chunk
   decoded once into registers); more: the blocked kernel above. One core, 2048 x 4096 weights
   from L3: fp4 at 3-4 rows 63-67 GFLOP/s on tile2 against 52-63 blocked, at 5-8 rows 68-77
   blocked; fp8 at 3-5 rows 40-55 on tile2 against 38-54 blocked, at 6-8 rows 55-64 either way. */
TGT static AINL void dot_rows_avx2(int fmt, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n,
                                   const float *X, int64_t ldx, float *C, int64_t ldc)
{
    if (n > (fmt == F_FP4 ? 4 : 5))
        dot_rows_blocked(fmt, m, r0, nr, n, X, ldx, C, ldc);
    else
        dot_rows_tiled(fmt, m, r0, nr, n, X, ldx, C, ldc);
}

DOT_ENTRY(TGT, dot_fp4_packed_avx2, dot_rows_avx2, F_FP4)
DOT_ENTRY(TGT, dot_fp8_avx2, dot_rows_avx2, F_FP8)

TGT static void dot_avx2(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const float *X, int64_t ldx,
                         float *C, int64_t ldc, float *tmp)
{
    if (m->k % 32)
        dsv4_cpu_ref_dot(m, r0, nr, n, X, ldx, C, ldc, tmp);
    else
        dot_rows_simd(m, r0, nr, n, X, ldx, C, ldc);
}

TGT static void dequant_avx2(const dsv4_matrix_view *m, int64_t r0, int64_t nr, float *out)
{
    if (m->k % 32)
        dsv4_matrix_dequant_rows(m, r0, nr, out);
    else
        dequant_simd(m, r0, nr, out);
}

void dsv4_cpu_kernels_fill_avx2(dsv4_cpu_kernels_table *t)
{
    for (int sb = 0; sb < 256; sb++) /* bf16 of e2m1 code i times scale byte sb, exact (above) */
        for (int i = 0; i < 16; i++) {
            uint32_t u = dsv4_f32_bits(dsv4_f32_from_bits((uint32_t)dsv4_cpu_e2m1_bf16[i] << 16) * dsv4_cpu_ue8m0_f32[sb]);
            e2m1_bf16_s[sb][i] = (uint8_t)(u >> 24);
            e2m1_bf16_s[sb][16 + i] = (uint8_t)(u >> 16);
        }
    t->dequant = dequant_avx2;
    t->dot = dot_avx2;
    t->dot_fp4_packed = dot_fp4_packed_avx2;
    t->pack_fp4 = pack_fp4_avx2;
    t->dot_fp8 = dot_fp8_avx2;
    t->dot_blocked = true;
}
#else
void dsv4_cpu_kernels_fill_avx2(dsv4_cpu_kernels_table *t) { (void)t; }
#endif
