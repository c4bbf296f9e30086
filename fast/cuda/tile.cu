/*
 * k_tile: the fp8 path's tile kernel on mma.sync (tile.cuh says what it computes; mma_parts.cuh
 * holds its device code).
 */
#include "fast/cuda/tile.cuh"

namespace dsv4cuda {

namespace {

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

typedef void (*tile_kernel)(FastArgs);
const tile_kernel k_tile_mid = k_tile<TileMid, 2, 4, 4, 3>;
const tile_kernel k_tile_big = k_tile<TileBig, 4, 4, 2, 1>;

} // namespace

void launch_tile(bool big, dim3 grid, cudaStream_t s, const FastArgs &a)
{
    if (big)
        k_tile_big<<<grid, TileBig::THREADS, TileBig::SMEM, s>>>(a);
    else
        k_tile_mid<<<grid, TileMid::THREADS, TileMid::SMEM, s>>>(a);
}

cudaError_t tile_attrs()
{
    cudaError_t ce = cudaFuncSetAttribute(k_tile_mid, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TileMid::SMEM);
    return ce == cudaSuccess ? cudaFuncSetAttribute(k_tile_big, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)TileBig::SMEM)
                             : ce;
}

} // namespace dsv4cuda
