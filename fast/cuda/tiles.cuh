/*
 * k_tiles (fast/cuda/tiles.cu): the exact path's tensor-core regime, groups of more than `small`
 * rows in DSV4C_BM x DSV4C_BN tiles, and the router logits of chunks too large for
 * k_logits_small on both paths (exact_gemm.cuh holds the device code it shares with k_gemv).
 */
#ifndef DSV4MOE_FAST_CUDA_TILES_CUH
#define DSV4MOE_FAST_CUDA_TILES_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

/* Enqueues k_tiles on s: grid g, DSV4C_TILE_THREADS threads, static shared memory only, for
   weights of format fmt (WF_BF16, WF_FP8 or WF_FP4) and activations quantized (aq 1) or not; pdl:
   with programmatic dependent launch (the kernel waits in pdl_enter). Returns the launch's error,
   which is also the runtime's last error. */
cudaError_t launch_tiles(int fmt, int aq, dim3 g, cudaStream_t s, bool pdl, const GemmArgs &a);

} // namespace dsv4cuda

#endif
