/*
 * k_tile8: the gemm fp8 mode's tile groups on fp8 wgmma from the fragment-native weights
 * (tile8.cuh says when it runs; mma_tile8.cuh holds its device code and its arithmetic).
 */
#include "fast/cuda/tile8.cuh"

#include "fast/cuda/mma_tile8.cuh"

namespace dsv4cuda {

namespace {

/* grid (N / (16 MT), the regime's tile capacity), 32 MT threads, Tile8<BN, ST, MT>::SMEM bytes of
   shared memory. QF: gate/up with the quantization of h fused (MT 16). */
template <int BN, int ST, int MT, bool QF, int MINB>
__global__ void __launch_bounds__(32 * MT, MINB) k_tile8(FastArgs a)
{
    typedef Tile8<BN, ST, MT> C;
    extern __shared__ __align__(16) uint8_t fsm[];
    FGrp g;
    int r0;
    if (!tile_group(a, g, r0))
        return;
    long long *sRow = (long long *)(fsm + C::STAGES * C::STAGE);
    tile_rows(g, r0, C::BN, sRow);
    __syncthreads();
    if (g.fmt == WF_FP4)
        tile8_run<BN, ST, MT, WF_FP4, QF>(a, g, r0, fsm, sRow);
    else
        tile8_run<BN, ST, MT, WF_FP8, QF>(a, g, r0, fsm, sRow);
}

typedef void (*tile8_kernel)(FastArgs);
struct Var {
    tile8_kernel k;
    int bn, threads;
    size_t smem;
};
/* mid-size groups, then the large groups' variants by TILE8_* (b128: one block a multiprocessor;
   b64: two, 3 stages; q64's down projection is b64's), then q64's gate/up (256 rows, the
   quantization of h fused) */
const Var mid = {k_tile8<32, 4, 8, false, 2>, 32, 256, Tile8<32, 4>::SMEM};
const Var big[3] = {{nullptr, 0, 0, 0},
                    {k_tile8<128, 4, 8, false, 1>, 128, 256, Tile8<128, 4>::SMEM},
                    {k_tile8<64, 3, 8, false, 2>, 64, 256, Tile8<64, 3>::SMEM}};
const Var gu_q = {k_tile8<64, 3, 16, true, 1>, 64, 512, Tile8<64, 3, 16>::SMEM_QF};

} // namespace

int tile8_big_rows(int v) { return v == TILE8_B128 ? 128 : 64; }

void launch_tile8(bool is_big, int v, dim3 grid, cudaStream_t s, const FastArgs &a)
{
    if (is_big && v == TILE8_Q64 && a.gu) {
        grid.x = (unsigned)(a.N / 256);
        gu_q.k<<<grid, gu_q.threads, gu_q.smem, s>>>(a);
        return;
    }
    const Var &k = is_big ? big[v == TILE8_B128 ? TILE8_B128 : TILE8_B64] : mid;
    k.k<<<grid, k.threads, k.smem, s>>>(a);
}

cudaError_t tile8_attrs()
{
    cudaError_t ce = cudaFuncSetAttribute(mid.k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mid.smem);
    for (int i = 1; i < 3 && ce == cudaSuccess; i++)
        ce = cudaFuncSetAttribute(big[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)big[i].smem);
    if (ce == cudaSuccess)
        ce = cudaFuncSetAttribute(gu_q.k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gu_q.smem);
    return ce;
}

} // namespace dsv4cuda
