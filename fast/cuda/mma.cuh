/*
 * The fp8 tensor-core path's decode and tile kernels (fast/cuda): k_dec (groups of at most
 * FM_DEC_MAX rows) and k_tile (mid-size and, with params tile=mma, large groups). Their device
 * code, and the path's design, are in mma_parts.cuh. Included once, by cuda.cu, after kernels.cuh,
 * router.cuh, exact_gemm.cuh and swiglu_combine.cuh (and by mma_tileh.cuh and mma_group.cuh).
 */
#ifndef DSV4MOE_FAST_CUDA_MMA_CUH
#define DSV4MOE_FAST_CUDA_MMA_CUH

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/*
 * The decode regime for groups whose weights are in format FMT: grid (N / 16 / (8 / ks), slots),
 * slot y < dec_routed (the routed active list) or the shared expert (dec_shared, last slot).
 * FM_THREADS threads, dec_smem_bytes(FMT, ks, 2, SB) bytes of shared memory. EPI: EPI_COMBINE, the
 * down projection with the combine folded in (a.fc_cnt, fold_combine); EPI_QUANT, gate/up with the
 * quantization of h folded in (a.qf_cnt, fold_quant). SB: B from the block's slabs
 * (dec_stage_slab; launched only with ks 1 and EPI_NONE). MINB: the blocks per multiprocessor its
 * registers are bounded for, 3 (80 registers a thread, the default) or 2 (params dec_regs=128: no
 * spills; the same arithmetic). EF: the weights and scales loaded with the L2 evict-first policy
 * (params dec_l2=first; the same arithmetic).
 */
template <int FMT, int EPI, bool SB, int MINB = 3, bool EF = false>
__global__ void __launch_bounds__(FM_THREADS, MINB) k_dec(FastArgs a)
{
    pdl_enter();
    extern __shared__ __align__(16) uint8_t fsm[];
    FGrp g;
    const int y = blockIdx.y;
    if (y < a.act_max) {
        if (!dec_routed_group(a, y, g))
            return;
    } else {
        if (!dec_shared_runs(a, *a.ntok))
            return;
        fgrp_shared(a, g);
    }
    dec_group<FMT, EPI, SB, EF>(a, g, a.ks, (int)blockIdx.x, fsm);
}

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
