/*
 * test_cuda's per-kernel test of k_quant_x8 (fast/cuda/quant_x8.cu, params gather=quant): the
 * host half (test_cuda.c) makes x and a chunk's grouping (ids, rows, counts, 128-aligned group
 * bases); the device half (quant_x8_hw.cu) runs the kernel once through its launcher on buffers
 * filled with 0xA5 bytes and copies every output back. Test code: linked into build/cuda/test_cuda
 * only.
 */
#ifndef DSV4MOE_TESTS_CUDA_QUANT_X8_HW_H
#define DSV4MOE_TESTS_CUDA_QUANT_X8_HW_H

#include <stdint.h>

typedef struct {
    int T, ntok, H, E, K, qmode;  /* rows of the chunk, live ones, features, experts, slots a token */
    int has_shared, min_rows, small_max, rows; /* rows: of the grouped layout (xp) */
    const uint16_t *x;            /* [T, H] bf16 */
    const int32_t *ids, *rowmap;  /* [T, K] */
    const int *cnt, *pad_off;     /* [E] */
    const uint8_t *ok;            /* [E + 1], or NULL: no gather */
    const uint8_t *xq_in;         /* [T, H]: x's codes before the call (k_logits_small's, when small_max) */
    const float *xs_in;           /* [T, ceil(H / 128)] */
} dsv4_test_qx8_in;

#ifdef __cplusplus
extern "C" {
#endif
/* Runs k_quant_x8 on in; xq [T, H], xs [T, ng], xp [rows, H], xs8 [(rows + T) ng]: the buffers
   after the call (xq, xs start as xq_in, xs_in; xp, xs8 as 0xA5 bytes). 0, or a CUDA error code. */
int dsv4_test_quant_x8(const dsv4_test_qx8_in *in, uint8_t *xq, float *xs, uint8_t *xp, float *xs8);
#ifdef __cplusplus
}
#endif

#endif
