/*
 * The AVX512-BF16 kernels: fp4 and fp8 decode-dot on activations that are exactly bf16.
 */
#include "fast/cpu/kernels/kernels.h"
#include "fast/cpu/kernels/kutil.h"

#if CPU_X86
#include "fast/cpu/kernels/avx512_common.h"

/*
 * fp4 decode-dot on AVX512-BF16 (vdpbf16ps), for activations that are exactly bf16 (the
 * act_quant outputs e4m3 x 2^k, and bf16 inputs: checked element by element when X is
 * converted, else the fp32 kernel runs). Per 64 elements (32 bytes) of a weight row: one
 * zero-extension to 16-bit lanes, two 32-entry word permutes give the unscaled e2m1 values
 * as bf16 (the even elements from the low nibbles, the odd ones from the high nibbles), two
 * vdpbf16ps (exact products, fp32 sums) and one FMA by the two groups' ue8m0 scales (lanes
 * 0-7 hold elements 0-31, lanes 8-15 elements 32-63). About 4 vector ops per 32 weights
 * against 7 in the fp32 kernel of avx512.c. X is given permuted: within each 64-block, the even
 * elements then the odd ones (bf16_rows in fast/cpu/ffn.c).
 */
TGTBF static AINL void tilebf(int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t n64, const uint16_t *X,
                              int64_t ldx, float *C, int64_t ldc)
{
    const __m512i tab = _mm512_loadu_si512((const void *)dsv4_cpu_e2m1_bf16);
    const uint8_t *row[8], *scl[8];
    __m512 acc[8][8];
    tile_init(NW, RB, m, r, row, scl, acc);
    for (int64_t c = 0; c < n64; c++) {
#pragma GCC unroll 8
        for (int w = 0; w < NW; w++) {
            __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(row[w] + 32 * c)));
            __m512bh we = (__m512bh)_mm512_permutexvar_epi16(v, tab);
            __m512bh wo = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), tab);
            __m512 sv = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(dsv4_cpu_ue8m0_f32[scl[w][2 * c]])),
                                                            _mm256_castps_pd(_mm256_set1_ps(dsv4_cpu_ue8m0_f32[scl[w][2 * c + 1]])), 1));
#pragma GCC unroll 8
            for (int q = 0; q < RB; q++) {
                const uint16_t *x = X + q * ldx + 64 * c;
                __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(), we, (__m512bh)_mm512_loadu_si512((const void *)x));
                t = _mm512_dpbf16_ps(t, wo, (__m512bh)_mm512_loadu_si512((const void *)(x + 32)));
                acc[w][q] = _mm512_fmadd_ps(t, sv, acc[w][q]);
            }
        }
    }
    store_acc(NW, RB, acc, C, ldc);
}

TGTBF static void dot_rows_fp4_bf16(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                                    int64_t ldx, float *C, int64_t ldc)
{
    BF16_ROW_BLOCKS(tilebf, m->k / 64)
}

/*
 * fp8 (e4m3) decode-dot on AVX512-BF16 for k % 128 == 0 and activations that are exactly bf16
 * (natural order, bf16_natural in fast/cpu/ffn.c). e4m3 -> bf16 is exact (3 mantissa bits): for a normal
 * code the bf16 bits are ((c & 0x7F) << 4) + (120 << 7) (exponent bias 7 -> 127), the 7
 * subnormal codes (exponent 0: m 2^-9, normal in bf16) come from a table by a masked word
 * permute, and the sign bit is moved to bit 15. 7 vector ops per 32 weights, one vdpbf16ps
 * (exact products, fp32 sums), and one FMA by the block scale per 128 weights, against about
 * 12 ops per 32 in the fp32 kernel (dec_fp8_512). As that kernel, 0x7F / 0xFF decode as 480
 * (the fp16 path gives the same). Rows are prefetched 8 blocks ahead into L2 as in tilebf4.
 */
static uint16_t e4m3_sub_bf16[32]; /* entry m < 8: bf16 of m 2^-9 (filled with the table) */

TGTBF static AINL __m512bh dec_fp8_bf16(const uint8_t *p, __m512i sub)
{
    __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)p));
    __m512i a = _mm512_add_epi16(_mm512_and_si512(_mm512_slli_epi16(v, 4), _mm512_set1_epi16(0x07F0)),
                                 _mm512_set1_epi16(0x3C00));
    a = _mm512_mask_permutexvar_epi16(a, _mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x78)), v, sub);
    return (__m512bh)_mm512_ternarylogic_epi32(a, _mm512_slli_epi16(v, 8), _mm512_set1_epi16((short)0x8000), 0xF8);
}

/* tile8bf's constants and decoder for tile128_bf16 (avx512_common.h): 4 x 32 codes, one block scale. */
typedef struct {
    __m512i sub;
    int sfp32;
} tile8bf_k;

TGTBF static AINL void dec128_fp8(const void *kv, const uint8_t *p, const uint8_t *scl, int64_t c, __m512bh wv[4],
                                  __m512 *sv)
{
    const tile8bf_k *k = kv;
    wv[0] = dec_fp8_bf16(p, k->sub);
    wv[1] = dec_fp8_bf16(p + 32, k->sub);
    wv[2] = dec_fp8_bf16(p + 64, k->sub);
    wv[3] = dec_fp8_bf16(p + 96, k->sub);
    *sv = _mm512_set1_ps(k->sfp32 ? ldf32(scl + 4 * c) : dsv4_cpu_ue8m0_f32[scl[c]]);
}

TGTBF static AINL void tile8bf(int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t n128,
                               const uint16_t *X, int64_t ldx, float *C, int64_t ldc)
{
    const tile8bf_k k = {_mm512_loadu_si512((const void *)e4m3_sub_bf16), m->scale_format == DSV4_SCALE_FP32};
    tile128_bf16(NW, RB, m, r, n128, 128, dec128_fp8, &k, X, ldx, C, ldc);
}

TGTBF static void dot_rows_fp8_bf16(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                                    int64_t ldx, float *C, int64_t ldc)
{
    BF16_ROW_BLOCKS(tile8bf, m->k / 128)
}

void dsv4_cpu_kernels_fill_avx512bf16(dsv4_cpu_kernels_table *t)
{
    for (int i = 0; i < 8; i++) /* e4m3 subnormals i 2^-9 as bf16 (normal there) */
        e4m3_sub_bf16[i] = (uint16_t)(dsv4_f32_bits(ldexpf((float)i, -9)) >> 16);
    t->dot_fp4_bf16 = dot_rows_fp4_bf16;
    t->dot_fp8_bf16 = dot_rows_fp8_bf16;
}
#else
void dsv4_cpu_kernels_fill_avx512bf16(dsv4_cpu_kernels_table *t) { (void)t; }
#endif
