/*
 * The AVX512-VBMI kernel: the grouped-scale fp4 bf16 decode-dot for k % 128 == 0.
 */
#include "fast/cpu/kernels/kernels.h"
#include "fast/cpu/kernels/kutil.h"

#if CPU_X86
#include "fast/cpu/kernels/avx512_common.h"

/*
 * tilebf4: the fp4 bf16 kernel where k % 128 == 0 and the CPU has AVX512-VBMI (every group
 * size; tilebf, in avx512bf16.c, stays for the other cases and the avx512-bf16 table). 64 bytes (128 weights, four
 * ue8m0 groups) of a weight row per step: two masked byte permutes widen the bytes to 16-bit
 * lanes so that each 32-bit lane of the products holds one group (lanes 0-3 group 0, .., 12-15
 * group 3); the four vdpbf16ps of the step then sum into one vector, scaled once by the four
 * groups' scales, built from the 4 scale bytes by one byte permute and a shift (ue8m0 b is the
 * fp32 with exponent field b: exact for 1 <= b <= 254; a block of rows with a scale byte 0 or
 * 255 takes the table instead). Per 128 weights: 2 byte permutes, 2 shifts, 4 word permutes,
 * 4 dot products, 3 scale ops and 1 FMA, against about 24 ops in tilebf (from L2, one core:
 * 17.4 -> 22.3 GB/s of fp4 bytes). The rows of a block are contiguous, so the same offset 8
 * blocks ahead is prefetched into L2 (from DRAM, one core: 12.8 -> 15.5 GB/s; into L1 or 2
 * blocks ahead: 12.1). X layout in each 128-block: four runs of 32 (half h = 0, 1; parity 0,
 * 1): word p of a run holds element 32 (p / 8) + 2 (8 h + p % 8) + parity (bf16_rows).
 */
static uint8_t k4_idx1[64], k4_idx2[64], k4_sidx[64]; /* filled with the table */

TGTBF4 static bool scales_plain(const uint8_t *s, int64_t n)
{
    __mmask64 bad = 0;
    for (int64_t i = 0; i < n; i += 64) {
        __mmask64 in = n - i >= 64 ? ~0ull : (1ull << (n - i)) - 1u;
        __m512i v = _mm512_mask_loadu_epi8(_mm512_set1_epi8(1), in, (const void *)(s + i));
        bad |= _mm512_cmpeq_epi8_mask(v, _mm512_setzero_si512()) | _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(-1));
    }
    return bad == 0;
}

/* tilebf4's constants and decoder for tile128_bf16 (avx512_common.h): 64 bytes, four scale bytes. */
typedef struct {
    __m512i tab, i1, i2, si;
    bool plain;
} tilebf4_k;

TGTBF4 static AINL void dec128_fp4(const void *kv, const uint8_t *p, const uint8_t *scl, int64_t c, __m512bh wv[4],
                                   __m512 *sv)
{
    const tilebf4_k *k = kv;
    const __mmask64 even = 0x5555555555555555ull, top = 0x8888888888888888ull;
    __m512i b = _mm512_loadu_si512((const void *)p);
    __m512i z1 = _mm512_maskz_permutexvar_epi8(even, k->i1, b), z2 = _mm512_maskz_permutexvar_epi8(even, k->i2, b);
    wv[0] = (__m512bh)_mm512_permutexvar_epi16(z1, k->tab);
    wv[1] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(z1, 4), k->tab);
    wv[2] = (__m512bh)_mm512_permutexvar_epi16(z2, k->tab);
    wv[3] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(z2, 4), k->tab);
    const uint8_t *s = scl + 4 * c;
    if (k->plain) {
        uint32_t s4;
        memcpy(&s4, s, 4);
        *sv = _mm512_castsi512_ps(
            _mm512_srli_epi32(_mm512_maskz_permutexvar_epi8(top, k->si, _mm512_set1_epi32((int)s4)), 1));
    } else
        *sv = _mm512_permutexvar_ps(_mm512_srli_epi32(k->si, 24),
                                    _mm512_castps128_ps512(_mm_setr_ps(dsv4_cpu_ue8m0_f32[s[0]], dsv4_cpu_ue8m0_f32[s[1]],
                                                                       dsv4_cpu_ue8m0_f32[s[2]], dsv4_cpu_ue8m0_f32[s[3]])));
}

TGTBF4 static AINL void tilebf4(int NW, int RB, bool plain, const dsv4_matrix_view *m, int64_t r, int64_t n128,
                               const uint16_t *X, int64_t ldx, float *C, int64_t ldc)
{
    const tilebf4_k k = {_mm512_loadu_si512((const void *)dsv4_cpu_e2m1_bf16),
                         _mm512_loadu_si512((const void *)k4_idx1), _mm512_loadu_si512((const void *)k4_idx2),
                         _mm512_loadu_si512((const void *)k4_sidx), plain};
    tile128_bf16(NW, RB, m, r, n128, 64, dec128_fp4, &k, X, ldx, C, ldc);
}

/* NW rows from r: the plain-scale variant when every scale byte of the rows is in [1, 254]. */
TGTBF4 static AINL void tilebf4_any(int NW, int RB, const dsv4_matrix_view *m, int64_t r, int64_t n128,
                                   const uint16_t *X, int64_t ldx, float *C, int64_t ldc)
{
    if (scales_plain(row_scales(m, r), (int64_t)NW * 4 * n128))
        tilebf4(NW, RB, true, m, r, n128, X, ldx, C, ldc);
    else
        tilebf4(NW, RB, false, m, r, n128, X, ldx, C, ldc);
}

/* Weight rows [r0, r0 + nr) on tilebf4, activation rows in even blocks of at most 8. */
TGTBF4 static void dot_rows_fp4_k4(const dsv4_matrix_view *m, int64_t r0, int64_t nr, int64_t n, const uint16_t *X,
                                   int64_t ldx, float *C, int64_t ldc)
{
    BF16_ROW_BLOCKS(tilebf4_any, m->k / 128)
}

void dsv4_cpu_kernels_fill_avx512vbmi(dsv4_cpu_kernels_table *t)
{
    for (int p = 0; p < 32; p++) { /* tilebf4: word p <- byte 16 (p / 8) + p % 8 (+ 8), group p / 8 */
        k4_idx1[2 * p] = (uint8_t)(16 * (p / 8) + p % 8);
        k4_idx2[2 * p] = (uint8_t)(16 * (p / 8) + p % 8 + 8);
        k4_idx1[2 * p + 1] = k4_idx2[2 * p + 1] = 0;
    }
    for (int l = 0; l < 16; l++) /* fp32 lane l <- scale byte l / 4 in its top byte */
        for (int i = 0; i < 4; i++)
            k4_sidx[4 * l + i] = (uint8_t)(i == 3 ? l / 4 : 0);
    t->dot_fp4_bf16_k128 = dot_rows_fp4_k4;
}
#else
void dsv4_cpu_kernels_fill_avx512vbmi(dsv4_cpu_kernels_table *t) { (void)t; }
#endif
