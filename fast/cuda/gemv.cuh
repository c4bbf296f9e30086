/*
 * k_gemv (fast/cuda/gemv.cu): the exact path's decode regime, groups of up to DSV4C_SMALL_MAX rows
 * (exact_gemm.cuh holds the device code it shares with k_tiles).
 */
#ifndef DSV4MOE_FAST_CUDA_GEMV_CUH
#define DSV4MOE_FAST_CUDA_GEMV_CUH

#include <stddef.h>

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

/* Enqueues k_gemv on s (plainly): grid g (x: the active groups, y: N / DSV4C_GEMV_COLS),
   DSV4C_GEMV_THREADS threads, smem bytes of shared memory (the group's dequantized rows), for
   weights of format fmt (WF_BF16, WF_FP8 or WF_FP4) and activations quantized (aq 1) or not. A
   launch error is left for the caller's cudaPeekAtLastError. */
void launch_gemv(int fmt, int aq, dim3 g, size_t smem, cudaStream_t s, const GemmArgs &a);

/* Sets every k_gemv variant's dynamic shared-memory limit to smem bytes. */
cudaError_t gemv_attrs(size_t smem);

} // namespace dsv4cuda

#endif
