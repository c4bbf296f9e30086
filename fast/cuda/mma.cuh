/*
 * The fp8 tensor-core path's tile kernel (fast/cuda): k_tile (mid-size and, with params tile=mma,
 * large groups; the decode regime, k_dec, is dec.cu's). Its device code, and the path's design, are
 * in mma_parts.cuh. Included once, by cuda.cu, after kernels.cuh, router.cuh and
 * swiglu_combine.cuh (and by mma_group.cuh).
 */
#ifndef DSV4MOE_FAST_CUDA_MMA_CUH
#define DSV4MOE_FAST_CUDA_MMA_CUH

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/* grid (N / BM, the regime's tile capacity), C::THREADS threads, C::SMEM bytes of shared memory. */
template <class C, int WM, int WN, int WARPS_M, int MINB>
__global__ void __launch_bounds__(C::THREADS, MINB) k_tile(FastArgs a)
{
    extern __shared__ __align__(16) uint8_t fsm[];
    FGrp g;
    int r0;
    if (!tile_group(a, g, r0))
        return;
    long long *sRow = (long long *)(fsm + 3 * C::STAGE);
    tile_rows(g, r0, C::BN, sRow);
    __syncthreads();
    if (g.fmt == WF_FP4)
        tile_run<C, WF_FP4, WM, WN, WARPS_M>(a, g, r0, fsm, sRow);
    else
        tile_run<C, WF_FP8, WM, WN, WARPS_M>(a, g, r0, fsm, sRow);
}

} // namespace dsv4cuda

#endif
