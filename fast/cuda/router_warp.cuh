/*
 * k_router_warp (fast/cuda/router_warp.cu; params router=warp): the router of large chunks, one
 * warp a token (route_warp, route_warp.cuh) where the default k_router spends a block of 256
 * threads on each (route_block: barriers between a token's steps, a single thread for the weights
 * and top-p; 74 us at T = 4096 on the H100). The same operations in the same order on the same
 * values, so the same ids, weights and kept counts (route_warp's contract, verified for
 * k_route_small against k_router_count). It does not quantize x: with router=warp, k_quant_x8 does
 * after the grouping (params gather=quant, implied). It reads the logits as one slice (L.lslices 1
 * or logits=blas), and needs K <= 32 (a lane a slot).
 */
#ifndef DSV4MOE_FAST_CUDA_ROUTER_WARP_CUH
#define DSV4MOE_FAST_CUDA_ROUTER_WARP_CUH

#include "fast/cuda/route_parts.cuh"

namespace dsv4cuda {

/* Whether a layer fits k_router_warp: K <= 32 and at least one warp's scratch in 48 KB. */
bool router_warp_fits(int E, int K);

/* Enqueues k_router_warp on s for a chunk of tc rows (rows past *ra.ntok return): as many warps a
   block as fit 48 KB of scratch (8 at most), one token each; ra.logits one slice [tc, E]. Writes
   ra.ids, ra.w, ra.kept and the non-finite count. Returns the launch's error. */
cudaError_t launch_router_warp(const RouterArgs &ra, unsigned tc, cudaStream_t s, bool pdl);

} // namespace dsv4cuda

#endif
