/*
 * k_router_warp: the router of large chunks, one warp a token (router_warp.cuh says why and what
 * it keeps).
 */
#include "fast/cuda/router_warp.cuh"

#include <algorithm>

#include "fast/cuda/route_warp.cuh"

namespace dsv4cuda {

namespace {

constexpr int RW_WARPS = 8;
constexpr size_t RW_SMEM = 48 * 1024;

int warps_of(int E) { return (int)std::min<size_t>(RW_WARPS, RW_SMEM / ((size_t)route_warp_words(E) * 4)); }

/* Warp w of block b: token b W + w (W: the launch's warps a block), in its own scratch. */
__global__ void __launch_bounds__(RW_WARPS * 32) k_router_warp(RouterArgs a)
{
    pdl_enter();
    extern __shared__ float rw_sm[];
    const int warp = threadIdx.x >> 5, t = blockIdx.x * (blockDim.x >> 5) + warp;
    if (t >= *a.ntok) /* the whole warp */
        return;
    float *wb = rw_sm + warp * route_warp_words(a.E);
    route_warp(a, t, wb, wb + a.E, wb + 2 * a.E, (int *)(wb + 2 * a.E + 3 * RW_KW), a.ids, a.w);
}

} // namespace

bool router_warp_fits(int E, int K) { return K >= 1 && K <= RW_KW && E >= 1 && warps_of(E) >= 1; }

cudaError_t launch_router_warp(const RouterArgs &ra, unsigned tc, cudaStream_t s, bool pdl)
{
    const int w = warps_of(ra.E);
    const size_t smem = (size_t)w * route_warp_words(ra.E) * 4;
    return launch_kernel(k_router_warp, dim3((tc + (unsigned)w - 1) / (unsigned)w), (unsigned)(w * 32), smem, s, pdl, ra);
}

} // namespace dsv4cuda
