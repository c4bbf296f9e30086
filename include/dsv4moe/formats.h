/*
 * dsv4moe: number formats shared by every backend (SPEC.md section 5).
 *
 * All conversions are pure integer/IEEE arithmetic, independent of the
 * floating-point environment's rounding mode, so the reference and every
 * fast path agree to the bit.
 */
#ifndef DSV4MOE_FORMATS_H
#define DSV4MOE_FORMATS_H

#include <stdint.h>
#include <stddef.h>
#include "dsv4moe/api.h"
#include "dsv4moe/status.h"
#include "dsv4moe/config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_E4M3_MAX 448.0f
#define DSV4_E2M1_MAX 6.0f
#define DSV4_AMAX_FLOOR 1e-4f   /* floor of amax in every quantizer */
#define DSV4_FP8_BLOCK 128      /* weight block edge, activation group size */
#define DSV4_FP4_GROUP 32       /* fp4 scale group along K */

/* ---- bf16: round to nearest even; NaN stays NaN (quiet, sign kept). ---- */
DSV4_API uint16_t dsv4_f32_to_bf16(float x);
DSV4_API float dsv4_bf16_to_f32(uint16_t b);
/* bf16(x) as a float: dsv4_bf16_to_f32(dsv4_f32_to_bf16(x)). */
DSV4_API float dsv4_round_bf16(float x);

/*
 * ---- fp8 e4m3fn: bias 7, max 448, no infinity, NaN = S.1111.111. ----
 * From fp32: round to nearest even, saturate to +-448 (+-Inf too);
 * NaN gives 0x7F with the sign bit of the input. Subnormals are exact.
 */
DSV4_API uint8_t dsv4_f32_to_e4m3(float x);
DSV4_API float dsv4_e4m3_to_f32(uint8_t code); /* 0x7F / 0xFF decode to NaN */

/*
 * ---- fp4 e2m1: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign. ----
 * From fp32: round to nearest, ties to even code; saturate to +-6 (+-Inf too).
 * e2m1 has no NaN: a NaN input gives +6 (0x7); quantizers reject NaN before
 * they get here. Packed storage: byte k/2, low nibble even k, high nibble odd k.
 */
DSV4_API uint8_t dsv4_f32_to_e2m1(float x); /* returns a nibble 0..15 */
DSV4_API float dsv4_e2m1_to_f32(uint8_t nibble); /* only the low 4 bits are used */

/* ---- ue8m0: one byte b, value 2^(b - 127); b = 255 is NaN. ---- */
DSV4_API float dsv4_ue8m0_to_f32(uint8_t b);
/*
 * The ue8m0 byte of the smallest power of two s with amax <= limit * s,
 * i.e. s = 2^ceil(log2(amax / limit)) computed exactly (no rounding of the
 * division). amax is floored at DSV4_AMAX_FLOOR; the result is clamped to
 * [0, 254] (+Inf amax gives 254). A NaN amax, or a limit that is not positive
 * and finite, gives 255 (NaN). limit is 448 for e4m3 and 6 for e2m1.
 */
DSV4_API uint8_t dsv4_ue8m0_scale_for(float amax, float limit);

/*
 * ---- Weight block quantizers (input fp32 [N, K], row-major). ----
 * fp8: blocks of 128x128 (edge blocks partial); per block amax
 * (floored at 1e-4), scale ue8m0 (s = 2^ceil(log2(amax/448))) or fp32
 * (s = amax / 448); q = e4m3(w / s). Scale grid [ceil(N/128), ceil(K/128)]:
 * `scales` is uint8_t[] for UE8M0 and float[] for FP32.
 * fp4: groups of 1x32 along K (K % 32 == 0 required); ue8m0 scale with limit 6;
 * q packed two per byte into [N, K/2]; scales uint8_t [N, K/32].
 * A non-finite weight gives DSV4_ERR_NUMERIC naming `name` and the element
 * [n, k]; outputs are then unspecified. `name` may be NULL.
 */
DSV4_API dsv4_status dsv4_quant_fp8_block(const float *w, int64_t n, int64_t k, dsv4_scale_format scale_format,
                                          uint8_t *q, void *scales, const char *name, dsv4_error *err);
DSV4_API dsv4_status dsv4_quant_fp4_block(const float *w, int64_t n, int64_t k, uint8_t *q, uint8_t *scales,
                                          const char *name, dsv4_error *err);

/* Dequantize rows [n0, n0 + rows) of a quantized [N, K] matrix into out[rows, K] (fp32). */
DSV4_API void dsv4_dequant_fp8_rows(const uint8_t *q, const void *scales, dsv4_scale_format scale_format, int64_t n,
                                    int64_t k, int64_t n0, int64_t rows, float *out);
DSV4_API void dsv4_dequant_fp4_rows(const uint8_t *q, const uint8_t *scales, int64_t n, int64_t k, int64_t n0,
                                    int64_t rows, float *out);
/* Dequantize rows of a bf16 [N, K] matrix. */
DSV4_API void dsv4_dequant_bf16_rows(const uint16_t *w, int64_t k, int64_t n0, int64_t rows, float *out);

/*
 * ---- Weights for FP8 tensor cores with 1x128 scales (SPEC.md section 9, `gemm = fp8`) ----
 * Both write e4m3 codes dst [n, k] (row r at dst + r * dst_row_bytes) and one fp32 scale per row
 * and 128 of K, row r's scale of K block kb at dst_scales[kb * s_kb + r * s_row]; k % 128 == 0.
 *
 * fp8 (e4m3 codes with 128x128 block scales, ue8m0 or fp32): the codes unchanged, each row's scale
 * the scale of its block. Always exact.
 *
 * fp4 (packed e2m1 with 1x32 ue8m0 scales): a 128-group's four scale bytes s0..s3 become one scale
 * 2^(max s - 133) and each e2m1 value v of sub-group j the e4m3 code of v 2^(sj - max s + 6).
 * e2m1 magnitudes are {0.5, 1, 1.5, 2, 3, 4, 6}: times 2^d they are e4m3 values exactly for
 * d in [-8, 6] (6 * 2^6 = 384 <= 448; 0.5 * 2^-8 = 2^-9, e4m3's smallest subnormal, and
 * 1.5 * 2^-8 = 3 * 2^-9 still fits its 3-bit subnormal mantissa). So a group converts exactly
 * iff max s - min s <= DSV4_FP4_TO_FP8_SPREAD (14) and no byte is 255 (NaN). Returns the number of
 * groups that do not (their codes are written as 0 and their scale as NaN); *first_row and
 * *first_group (may be NULL) name the first such group.
 */
#define DSV4_FP4_TO_FP8_SPREAD 14
DSV4_API void dsv4_fp8_to_e4m3_128(const uint8_t *q, uint64_t row_bytes, const void *scales,
                                   dsv4_scale_format scale_format, int64_t n, int64_t k, uint8_t *dst,
                                   uint64_t dst_row_bytes, float *dst_scales, int64_t s_kb, int64_t s_row);
/* The number of 128-groups of fp4 scales [n, k / 32] that dsv4_fp4_to_e4m3_128 cannot convert
   exactly (what `dsv4moe inspect` reports; an expert with any runs on the exact kernels). */
DSV4_API int64_t dsv4_fp4_scales_beyond_e4m3(const uint8_t *scales, int64_t n, int64_t k);
DSV4_API int64_t dsv4_fp4_to_e4m3_128(const uint8_t *q, uint64_t row_bytes, const uint8_t *scales, int64_t n, int64_t k,
                                      uint8_t *dst, uint64_t dst_row_bytes, float *dst_scales, int64_t s_kb,
                                      int64_t s_row, int64_t *first_row, int64_t *first_group);
/*
 * The same two conversions with one scale per block of block_rows rows (a power of two, 1 or up
 * to 128) and 128 of K: block (r / block_rows, kb)'s scale at dst_scales[kb * s_kb + (r /
 * block_rows) * s_row]. fp8: exact for any block_rows dividing 128 (the source blocks). fp4: a
 * block converts exactly iff its block_rows x 4 scale bytes obey the rule above together (spread
 * at most DSV4_FP4_TO_FP8_SPREAD, none 255); the count and *first_row / *first_group name blocks
 * (first_row the block's first row). The codes differ from block_rows 1's by a power of two per
 * row, compensated exactly by the scale, so every product code x scale is the same value.
 */
DSV4_API void dsv4_fp8_to_e4m3_blocks(const uint8_t *q, uint64_t row_bytes, const void *scales,
                                      dsv4_scale_format scale_format, int64_t n, int64_t k, int64_t block_rows,
                                      uint8_t *dst, uint64_t dst_row_bytes, float *dst_scales, int64_t s_kb,
                                      int64_t s_row);
DSV4_API int64_t dsv4_fp4_to_e4m3_blocks(const uint8_t *q, uint64_t row_bytes, const uint8_t *scales, int64_t n,
                                         int64_t k, int64_t block_rows, uint8_t *dst, uint64_t dst_row_bytes,
                                         float *dst_scales, int64_t s_kb, int64_t s_row, int64_t *first_row,
                                         int64_t *first_group);

/*
 * ---- Activation quantizer: one row of K values, groups of 128 along K ----
 * (the last group may be partial). amax = max(max|x|, 1e-4) per group;
 * UE8M0: s = 2^ceil(log2(amax/448)); FP32: s = amax / 448;
 * q = e4m3(clamp(x / s, -448, 448)); out[i] = e4m3_to_f32(q) * s, the value
 * the GEMM sees. NONE copies x. `codes` (K bytes) and `scales`
 * (ceil(K/128) floats) may be NULL when the caller only needs `out`.
 * x and out may alias. NaN inputs propagate as NaN.
 */
DSV4_API void dsv4_act_quant_row(const float *x, int64_t k, dsv4_act_quant mode, float *out, uint8_t *codes,
                                 float *scales);

#ifdef __cplusplus
}
#endif
#endif
