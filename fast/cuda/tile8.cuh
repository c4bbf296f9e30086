/*
 * k_tile8 (fast/cuda/tile8.cu; device code in mma_tile8.cuh): with params direct= in the gemm fp8
 * mode, the tile groups (more than FM_DEC_MAX rows) of the routed fp4 experts on fp8 wgmma read
 * straight from the fragment-native fp4 weights (each code widened to its e4m3 form in registers,
 * exactly), instead of the grouped FP8 GEMM on the e4m3 copies: half the weight bytes, and the
 * SwiGLU epilogue of gate/up in the kernel (h leaves it as bf16; k_quant8 only quantizes it).
 * The shared expert stays on the grouped FP8 GEMM above fp8_cut rows; below, its mid-size tiles
 * run here on its fp8 codes. The creation turns it on only where every routed expert's groups
 * convert (read from their scales), so every fp4 group this kernel reads is exact in e4m3.
 */
#ifndef DSV4MOE_FAST_CUDA_TILE8_CUH
#define DSV4MOE_FAST_CUDA_TILE8_CUH

#include <stddef.h>

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/* The variants of params direct= (TILE8_OFF: not asked for): large groups on blocks of 128 weight
   rows x 128 or 64 tokens; q64: as b64, but gate/up on blocks of 256 rows (128 features of h: one
   128-group) that quantize h in their epilogue (its e4m3 codes and 1x128 scales, as k_quant8
   would from the bf16 h), so k_quant8 skips those rows and no bf16 h of theirs is written. */
enum { TILE8_OFF = 0, TILE8_B128 = 1, TILE8_B64 = 2, TILE8_Q64 = 3 };

/* Tokens per block of the large groups' tiles of variant v (the grouping's big_rows). */
int tile8_big_rows(int v);

/* Enqueues k_tile8 on s (plainly): the mid-size tile list (big false: 32-token tiles) or the large
   one (big true: variant v's tiles); grid (N / 128, the list's capacity), 256 threads (q64's gate/up:
   N / 256 blocks of 512). With q64's gate/up, a.qf_q, a.qf_s, a.qf_sh_row0 and a.qmode say where
   and how h is quantized. A launch error is left for the caller's cudaPeekAtLastError. */
void launch_tile8(bool big, int v, dim3 grid, cudaStream_t s, const FastArgs &a);

/* Sets every variant's dynamic shared-memory limit. */
cudaError_t tile8_attrs();

} // namespace dsv4cuda

#endif
