/*
 * The AVX-512 (F, BW, VL) kernels: register-blocked fp4 and fp8 decode-dot on fp32 activations,
 * and the SwiGLU epilogue row.
 */
#include "fast/cpu/kernels/kernels.h"
#include "fast/cpu/kernels/kutil.h"

#if CPU_X86
#include "fast/cpu/kernels/avx512_common.h"

/*
 * AVX-512 fp4 decode-dot: a 16-entry table permute turns nibble codes into fp32 directly
 * (vpermps uses the low 4 bits of each lane). The even elements of a 32-group come from the
 * low nibbles and the odd ones from the high nibbles, so X is given "split": within each
 * 32-block, elements 0, 2, .., 30 then 1, 3, .., 31 (pack_fp4_split below).
 */
static const float e2m1_table[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/*
 * Register-blocked AVX-512 decode-dot: NW weight rows x RB activation rows per pass. Each
 * 32-element chunk of the NW weight rows is decoded once into registers and used by all RB
 * activation rows, and each activation chunk is loaded once for all NW weight rows (the
 * earlier one-weight-row kernel re-read the activations from L2 for every weight row).
 * fp4: the ue8m0 scale is folded into the 16-entry table (exact: a power of two), then two
 * permutes give the even and odd elements. fp8: e4m3 -> fp16 bits (value * 2^-8) -> vcvtph2ps.
 */
TGT512 static AINL void dec_fp4_512(const uint8_t *row, const uint8_t *scl, int64_t c, __m512 tab, __m512 w[2])
{
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 16 * c)));
    __m512 ts = _mm512_mul_ps(tab, _mm512_set1_ps(dsv4_cpu_ue8m0_f32[scl[c]]));
    w[0] = _mm512_permutexvar_ps(v, ts);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), ts);
}

TGT512 static AINL void dec_fp8_512(const uint8_t *row, const uint8_t *scl, int sfp32, int64_t c, __m512 w[2])
{
    const __m512i mmag = _mm512_set1_epi16(0x3F80), msgn = _mm512_set1_epi16((short)0x8000);
    int64_t bk = c >> 2;
    __m512 sv = _mm512_set1_ps((sfp32 ? ldf32(scl + 4 * bk) : dsv4_cpu_ue8m0_f32[scl[bk]]) * 256.0f);
    __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(row + 32 * c)));
    __m512i h = _mm512_or_si512(_mm512_and_si512(_mm512_slli_epi16(v, 7), mmag),
                                _mm512_and_si512(_mm512_slli_epi16(v, 8), msgn));
    w[0] = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), sv);
    w[1] = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), sv);
}

/* C[q * ldc + w] = X[q, :] . W[r + w, :] for w < NW, q < RB (X split for fp4, natural for fp8). */
TGT512 static AINL void tile512(int fmt, int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t nc,
                                const float *X, int64_t ldx, float *C, int64_t ldc)
{
    const __m512 tab = _mm512_loadu_ps(e2m1_table);
    int sfp32 = m->scale_format == DSV4_SCALE_FP32;
    const uint8_t *row[8], *scl[8];
    __m512 acc[8][8];
    const int64_t pf = tile_init(NW, RB, m, r, row, scl, acc);
    for (int64_t c = 0; c < nc; c++) {
        __m512 wv[8][2];
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            if (fmt == F_FP4)
                dec_fp4_512(row[w], scl[w], c, tab, wv[w]);
            else {
                if (!(c & 1)) /* as tilebf4: the rows 8 blocks ahead into L2, one line per 64 bytes */
                    _mm_prefetch((const char *)(row[w] + 32 * c + pf), _MM_HINT_T1);
                dec_fp8_512(row[w], scl[w], sfp32, c, wv[w]);
            }
        }
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++) {
            __m512 x0 = _mm512_loadu_ps(X + q * ldx + 32 * c), x1 = _mm512_loadu_ps(X + q * ldx + 32 * c + 16);
#pragma GCC unroll 8
            for (int w = 0; w < NW; w++) {
                acc[w][q] = _mm512_fmadd_ps(wv[w][0], x0, acc[w][q]);
                acc[w][q] = _mm512_fmadd_ps(wv[w][1], x1, acc[w][q]);
            }
        }
    }
    store_acc(NW, RB, acc, C, ldc);
}

/* Weight rows [r0, r0 + nr) against n activation rows in blocks of at most 8; the weight-row
   block NW shrinks as RB grows so that the accumulators and decoded weights fit 32 registers. */
TGT512 static AINL void dot_rows_512(int fmt, const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n,
                                     const float *X, int64_t ldx, float *C, int64_t ldc)
{
#define TILE512(NW_, RB_, ...) tile512(fmt, NW_, RB_, __VA_ARGS__)
    ROW_BLOCKS(float, TILE512, m->k / 32, 8, 4, 4, 4, 2, 2, 2, 2)
#undef TILE512
}

/* The split layout: within each 32-block, the even elements then the odd ones. */
static void pack_fp4_split(const float *X, int64_t ldx, int64_t n, int64_t k, float *XS)
{
    for (int64_t q = 0; q < n; q++) {
        const float *x = X + q * ldx;
        float *o = XS + q * k;
        for (int64_t c = 0; c < k; c += 32)
            for (int i = 0; i < 16; i++) {
                o[c + i] = x[c + 2 * i];
                o[c + 16 + i] = x[c + 2 * i + 1];
            }
    }
}

DOT_ENTRY(TGT512, dot_rows_fp4_512, dot_rows_512, F_FP4)
DOT_ENTRY(TGT512, dot_rows_fp8_512, dot_rows_512, F_FP8)

/*
 * The SwiGLU epilogue of one row on AVX-512 (16 lanes, the tail masked): the same operations
 * in the same order as the scalar loop in epilogue() (fast/cpu/ffn.c), with expf replaced by exp512 below and
 * bf16 rounding done on the integer bits exactly as rbf16 (vcvtneps2bf16 would flush
 * denormals). exp512: Cody-Waite reduction by ln 2, a degree-7 Taylor polynomial on
 * [-ln2/2, ln2/2] (truncation < 1e-8 relative), vscalefps for 2^n (overflow to inf,
 * underflow to 0); NaN propagates. It is within 1-2 ulp of libm's expf, so h can differ from
 * the scalar path in the last bf16 bit where v sits at a rounding boundary (the tests bound
 * the ULP distance to the reference).
 */
TGT512 static AINL __m512 rbf16_512(__m512 x)
{
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF);
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    __m512i qn = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_mask_blend_epi32(nan, r, qn), hi));
}

TGT512 static AINL __m512 exp512(__m512 x)
{
    /* min/max with x second: a NaN x comes out as NaN */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

TGT512 static void swiglu_row_512(const float *gr, const float *ur, float *h, int64_t I, bool clamp, float L,
                                  bool mulw, float w, uint64_t *gc, uint64_t *uc)
{
    const __m512 Lv = _mm512_set1_ps(L), nL = _mm512_set1_ps(-L), one = _mm512_set1_ps(1.0f);
    const __m512 wv = _mm512_set1_ps(w);
    uint64_t g_hits = 0, u_hits = 0;
    for (int64_t i = 0; i < I; i += 16) {
        __mmask16 m = I - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (I - i)) - 1u);
        __m512 g = rbf16_512(_mm512_maskz_loadu_ps(m, gr + i)), u = rbf16_512(_mm512_maskz_loadu_ps(m, ur + i));
        if (clamp) {
            __mmask16 mg = _mm512_mask_cmp_ps_mask(m, g, Lv, _CMP_GT_OQ);
            __mmask16 mu = _mm512_mask_cmp_ps_mask(m, u, Lv, _CMP_GT_OQ);
            __mmask16 ml = _mm512_mask_cmp_ps_mask(m, u, nL, _CMP_LT_OQ);
            g = _mm512_mask_blend_ps(mg, g, Lv);
            u = _mm512_mask_blend_ps(ml, _mm512_mask_blend_ps(mu, u, Lv), nL);
            g_hits += (uint64_t)__builtin_popcount(mg);
            u_hits += (uint64_t)__builtin_popcount((unsigned)(mu | ml));
        }
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        __m512 v = _mm512_mul_ps(s, u);
        if (mulw)
            v = _mm512_mul_ps(v, wv);
        _mm512_mask_storeu_ps(h + i, m, rbf16_512(v));
    }
    *gc += g_hits;
    *uc += u_hits;
}

void dsv4_cpu_kernels_fill_avx512(dsv4_cpu_kernels_table *t)
{
    t->dot_fp4_packed = dot_rows_fp4_512;
    t->pack_fp4 = pack_fp4_split;
    t->dot_fp8 = dot_rows_fp8_512;
    t->dot_blocked = false; /* tile512 at any size: dequantize + sgemm above 16 rows */
    t->swiglu_row = swiglu_row_512;
}
#else
void dsv4_cpu_kernels_fill_avx512(dsv4_cpu_kernels_table *t) { (void)t; }
#endif
