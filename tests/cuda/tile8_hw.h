/*
 * test_cuda's per-kernel test of k_tile8's weight conversion (fast/cuda/mma_tile8.cuh, params
 * direct=): the host half (test_cuda.c) makes fragment-native weight chunks and their scales and
 * the expected e4m3 codes and scales from the library's host formats; the device half
 * (tile8_hw.cu) runs tile8_frags, one warp a chunk, and copies every lane's fragments back. Test
 * code: linked into build/cuda/test_cuda only.
 */
#ifndef DSV4MOE_TESTS_CUDA_TILE8_HW_H
#define DSV4MOE_TESTS_CUDA_TILE8_HW_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
/* n chunks of format fp4 (1) or fp8 (0): chunks [n][1024 or 2048], scales [n][64 or 8] bytes; af
   gets [n][32 lanes][4 steps][4 registers] words, w [n][32][2] the rows' weight scales. 0, or a
   CUDA error code. */
int dsv4_test_tile8_frags(int fp4, int n, const uint8_t *chunks, const uint8_t *scales, uint32_t *af, float *w);
#ifdef __cplusplus
}
#endif

#endif
