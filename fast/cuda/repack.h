/*
 * Host repacking of expert weights into the fragment-native layout of fast/cuda/fragment.h
 * (internal to the CUDA backend; plain C so that the CPU suite tests it, tests/test_repack.c).
 *
 * A matrix [n, k] (row r at data + r * row_bytes) is cut into 16-row tiles and 128-wide K
 * blocks; chunk (t, kb) lives at (t * (k / 128) + kb) * CHUNK. Two row orders:
 *   plain        (b == NULL): tile t holds rows 16 t .. 16 t + 15 of a (row half h: 16 t + 8 h + gid);
 *   interleaved  (b != NULL): tile t holds rows 8 t .. 8 t + 7 of a in half 0 and the same rows
 *                of b in half 1, so the gate and up rows of one feature meet in one lane.
 * Requires k % 128 == 0 and n % 16 == 0 (plain) or n % 8 == 0 (interleaved).
 */
#ifndef DSV4MOE_FAST_CUDA_REPACK_H
#define DSV4MOE_FAST_CUDA_REPACK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_fn_src {
    const uint8_t *data;   /* row r at data + r * row_bytes */
    uint64_t row_bytes;
    const uint8_t *scales; /* fp4: ue8m0 [n, k/32]; fp8: [ceil(n/128), ceil(k/128)] ue8m0 bytes or fp32 */
    int sfp32;             /* fp8: scales are fp32 */
} dsv4_fn_src;

/* Tiles of an [n, k] matrix in the given order (interleaved: 2n rows in n / 8 tiles). */
int64_t dsv4_fn_tiles(int64_t n, int interleaved);
/* Bytes of the repacked data and scales (fp4: fmt_fp4 != 0; else fp8). */
void dsv4_fn_sizes(int fmt_fp4, int64_t n, int64_t k, int interleaved, uint64_t *data, uint64_t *scales);

/*
 * fp4 (packed e2m1 + 1x32 ue8m0). Returns 0, or 1 when a scale byte is above
 * DSV4_FN_FP4_SCALE_MAX (the fast path cannot take it exactly): *bad_which (0 a, 1 b),
 * *bad_row and *bad_group name the first one; dst is then incomplete. *smin / *smax (may be
 * NULL) receive the smallest and largest scale byte.
 */
int dsv4_fn_repack_fp4(const dsv4_fn_src *a, const dsv4_fn_src *b, int64_t n, int64_t k, uint8_t *dst,
                       uint8_t *dst_scales, int *bad_which, int64_t *bad_row, int64_t *bad_group, uint8_t *smin,
                       uint8_t *smax);
/* fp8 (e4m3 + 128x128 block scales, ue8m0 widened exactly to fp32: 0 -> 2^-127, 255 -> NaN). */
void dsv4_fn_repack_fp8(const dsv4_fn_src *a, const dsv4_fn_src *b, int64_t n, int64_t k, uint8_t *dst,
                        float *dst_scales);

#ifdef __cplusplus
}
#endif
#endif
