/*
 * The parts the two wgmma tile kernels share (k_tileh: mma_tileh.cuh; k_tile8: mma_tile8.cuh): a
 * stage's weight chunks, the per-K-block promotion of a warpgroup's partial and the epilogue, over
 * mma_parts.cuh's fragment-native layout and fepi. Inline device functions only.
 */
#ifndef DSV4MOE_FAST_CUDA_WG_TILE_CUH
#define DSV4MOE_FAST_CUDA_WG_TILE_CUH

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/* The cp.async copies of K block kb of a block's MT weight chunks (16-row tiles mt0 .. mt0 + MT - 1)
   into sW and of their scales into sWS, by THR threads (the wgmma tile kernels, k_tileh and k_tile8:
   128 rows and 256 threads, or k_tile8's 256 rows and 512). */
template <int FMT, int MT = 8, int THR = 256>
__device__ __forceinline__ void wg_tile_load_w(const FGrp &g, int mt0, int kb, int KB, uint8_t *sW, uint8_t *sWS)
{
    constexpr int CH = FMT == WF_FP4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK;
    constexpr int SCH = FMT == WF_FP4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    const int tid = threadIdx.x;
    for (int i = tid; i < MT * (CH / 16); i += THR) {
        const int q = i / (CH / 16), off = (i - q * (CH / 16)) * 16;
        cp_async16(sW + q * CH + off, g.w + ((size_t)(mt0 + q) * KB + kb) * CH + off, true);
    }
    if constexpr (FMT == WF_FP4) {
        for (int i = tid; i < MT * (SCH / 16); i += THR) {
            const int q = i / (SCH / 16), off = (i - q * (SCH / 16)) * 16;
            cp_async16(sWS + q * SCH + off, g.s + ((size_t)(mt0 + q) * KB + kb) * SCH + off, true);
        }
    } else {
        for (int i = tid; i < MT; i += THR)
            cp_async8(sWS + i * SCH, g.s + ((size_t)(mt0 + i) * KB + kb) * SCH);
    }
}

/* A warpgroup's per-K-block promotion: its partial d (wgmma's m64nBN accumulator layout: rows gid
   and gid + 8, tokens 8 j + 2 tig and 8 j + 2 tig + 1) into acc, times block_scale<FMT> of the
   rows' weight scales w0 / w1 and the tokens' activation scales sAS. */
template <int BN, int FMT>
__device__ __forceinline__ void wg_tile_promote(const float *sAS, float w0, float w1, const float *d, float *acc)
{
    const int tig = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const float x0 = sAS[8 * j + 2 * tig], x1 = sAS[8 * j + 2 * tig + 1];
        acc[4 * j + 0] = fmaf(d[4 * j + 0], block_scale<FMT>(w0, x0), acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(d[4 * j + 1], block_scale<FMT>(w0, x1), acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(d[4 * j + 2], block_scale<FMT>(w1, x0), acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(d[4 * j + 3], block_scale<FMT>(w1, x1), acc[4 * j + 3]);
    }
}

/* A wgmma tile kernel's epilogue (tile mt, the block's first token r0; the lane's gid = lane / 4 and
   tig = lane % 4): fepi for each of the thread's accumulators within the group, then the gate/up
   clamp counts. */
template <int BN>
__device__ __forceinline__ void wg_tile_epilogue(const FastArgs &a, const FGrp &g, int r0, int mt, int gid, int tig,
                                                 const float *acc)
{
    unsigned gc = 0, uc = 0;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const int t0 = r0 + 8 * j + 2 * tig;
        if (t0 < g.n)
            fepi(a, g, mt, gid, t0, acc[4 * j + 0], acc[4 * j + 2], gc, uc);
        if (t0 + 1 < g.n)
            fepi(a, g, mt, gid, t0 + 1, acc[4 * j + 1], acc[4 * j + 3], gc, uc);
    }
    if (a.gu)
        fepi_stats(a, g, gc, uc);
}

} // namespace dsv4cuda

#endif
