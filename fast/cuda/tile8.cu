/*
 * k_tile8: the gemm fp8 mode's tile groups on fp8 wgmma from the fragment-native weights
 * (tile8.cuh says when it runs; mma_tile8.cuh holds its device code and its arithmetic).
 */
#include "fast/cuda/tile8.cuh"

#include "fast/cuda/mma_tile8.cuh"

namespace dsv4cuda {

namespace {

/* grid (N / 128, the regime's tile capacity), 256 threads, Tile8<BN, ST>::SMEM bytes of shared memory. */
template <int BN, int ST, bool PIPE, int MINB>
__global__ void __launch_bounds__(256, MINB) k_tile8(FastArgs a)
{
    typedef Tile8<BN, ST> C;
    extern __shared__ __align__(16) uint8_t fsm[];
    FGrp g;
    int r0;
    if (!tile_group(a, g, r0))
        return;
    long long *sRow = (long long *)(fsm + C::STAGES * C::STAGE);
    tile_rows(g, r0, C::BN, sRow);
    __syncthreads();
    if (g.fmt == WF_FP4)
        tile8_run<BN, ST, WF_FP4, PIPE>(a, g, r0, fsm, sRow);
    else
        tile8_run<BN, ST, WF_FP8, PIPE>(a, g, r0, fsm, sRow);
}

typedef void (*tile8_kernel)(FastArgs);
struct Var {
    tile8_kernel k;
    int bn;
    size_t smem;
};
/* mid-size groups, then the large groups' variants by TILE8_* (b128: one block a multiprocessor,
   its next K block converted under the wgmmas; b64: two blocks a multiprocessor, 3 stages) */
const Var mid = {k_tile8<32, 4, true, 2>, 32, Tile8<32, 4>::SMEM};
const Var big[3] = {{nullptr, 0, 0},
                    {k_tile8<128, 4, true, 1>, 128, Tile8<128, 4>::SMEM},
                    {k_tile8<64, 3, true, 2>, 64, Tile8<64, 3>::SMEM}};

} // namespace

int tile8_big_rows(int v) { return v == TILE8_B64 ? 64 : 128; }

void launch_tile8(bool is_big, int v, dim3 grid, cudaStream_t s, const FastArgs &a)
{
    const Var &k = is_big ? big[v == TILE8_B64 ? TILE8_B64 : TILE8_B128] : mid;
    k.k<<<grid, 256, k.smem, s>>>(a);
}

cudaError_t tile8_attrs()
{
    cudaError_t ce = cudaFuncSetAttribute(mid.k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mid.smem);
    for (int i = 1; i < 3 && ce == cudaSuccess; i++)
        ce = cudaFuncSetAttribute(big[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)big[i].smem);
    return ce;
}

} // namespace dsv4cuda
