/*
 * k_tileh: the fp8 path's large-group kernel on exact f16 wgmma (tileh.cuh says what it computes and
 * lists the variants; mma_tileh.cuh holds its device code).
 */
#include "fast/cuda/mma_tileh.cuh"

namespace dsv4cuda {

namespace {

/* grid (N / 128, the regime's tile capacity), 256 threads, TileH<BN>::SMEM bytes of shared memory. */
template <int BN, bool PIPE, int ST = 4, int MINB = (BN == 32 ? 2 : 1)>
__global__ void __launch_bounds__(256, MINB) k_tileh(FastArgs a)
{
    typedef TileH<BN, ST> C;
    extern __shared__ __align__(16) uint8_t fsm[];
    FGrp g;
    int r0;
    if (!tile_group(a, g, r0))
        return;
    const uint16_t *A16 = g.slot0 < 0 ? a.Ash16 : a.A16; /* slot0 -1: the shared expert */
    long long *sRow = (long long *)(fsm + C::STAGES * C::STAGE);
    tile_rows(g, r0, C::BN, sRow);
    __syncthreads();
    if (g.fmt == WF_FP4)
        tileh_run<C::BN, WF_FP4, PIPE, ST>(a, g, A16, r0, fsm, sRow);
    else
        tileh_run<C::BN, WF_FP8, PIPE, ST>(a, g, A16, r0, fsm, sRow);
}

} // namespace

extern const TileHVar tileh_big[N_TILEH_BIG] = {{"s128", k_tileh<128, false>, 128, TileH<128>::SMEM},
                                               {"s64x2", k_tileh<64, false, 3, 2>, 64, TileH<64, 3>::SMEM},
                                               {"p64", k_tileh<64, true>, 64, TileH<64>::SMEM},
                                               {"s64", k_tileh<64, false>, 64, TileH<64>::SMEM},
                                               {"p128", k_tileh<128, true>, 128, TileH<128>::SMEM}};
extern const TileHVar tileh_mid[N_TILEH_MID] = {{"mma", nullptr, 0, 0},
                                               {"p32", k_tileh<32, true>, 32, TileH<32>::SMEM},
                                               {"s32", k_tileh<32, false>, 32, TileH<32>::SMEM}};

} // namespace dsv4cuda
