/*
 * The fp8 mode's grouped GEMM (gemm_fp8.h): one CUTLASS 4.2 configuration serves every projection
 * (gate/up and down of the routed experts and of the shared expert), since all of them are
 * e4m3 [M, K] x e4m3 [N, K]^T -> bf16 [M, N] with 1x128 scales on both operands.
 *
 * Why these choices:
 * - Weight scales per 128x128 block where the layer's weights convert that way exactly (every fp8
 *   checkpoint: its scales are 128x128 blocks; fp4 experts when each block's 512 ue8m0 bytes lie
 *   within the e4m3 window, formats.h), else one per row and 128 of K (the 1x128 conversion,
 *   which every fp4 group within its own four bytes' window takes): two instantiations, one chosen
 *   per layer at creation (gemm_fp8/rows.cu and gemm_fp8/blocks.cu, one translation unit each, over
 *   the template of gemm_fp8/op.cuh; this file only dispatches, without CUTLASS). The block scale
 *   is one value per tile, where a per-row scale is one
 *   product per accumulator at every 128-of-K promotion: measured on the H200 (2026-12-03, v4-flash
 *   T = 16384, ncu, one call) gate|up 4.71 -> 3.83 ms and down 2.59 -> 2.10 ms, the layer 10.13 ->
 *   8.88 ms. The products and sums are the same numbers in both (the codes of a row move by a power
 *   of two that its scale takes back), so the outputs are too.
 * - 128x128x128 tiles, cooperative schedule (two consumer warpgroups on one 128-row tile), a
 *   1x2 cluster (the two CTAs of a cluster share the A tile through TMA multicast): the
 *   configuration of CUTLASS's example 68 that measured 1124 TFLOP/s on these shapes on the H200.
 *   Measured against it in one call (2026-12-03, the whole layer at T = 16384, v4-flash): 128x256
 *   tiles 33.4 ms against 10.6 (two fp32 accumulator sets of a 64x256 warpgroup tile: spills are
 *   the likely cause, not checked), 2x1
 *   clusters (the weights multicast instead of the activations) 11.59, rasterized along N 10.55
 *   against 10.57 along M.
 * - Rasterized along M (below), persistent grid of the device's SM count, problem shapes read on the device only (host
 *   shapes NULL): the launch does not depend on the routing, so it is captured in a graph.
 */
#include "fast/cuda/gemm_fp8.h"

#include <new>

#include "fast/cuda/gemm_fp8/entries.h"

namespace dsv4cuda {

struct Fp8Gemm {
    void *rows = nullptr;   /* weight scales 1x128 (gemm_fp8/rows.cu) */
    void *blocks = nullptr; /* weight scales 128x128 (gemm_fp8/blocks.cu) */
};

cudaError_t fp8gemm_create(Fp8Gemm **out, int groups, int sfb_rows, size_t *bytes)
{
    *out = nullptr;
    if (bytes)
        *bytes = 0;
    if (sfb_rows != 1 && sfb_rows != 128)
        return cudaErrorInvalidValue;
    Fp8Gemm *g = new (std::nothrow) Fp8Gemm;
    if (!g)
        return cudaErrorMemoryAllocation;
    const cudaError_t ce = sfb_rows == 1 ? fp8op_create_rows(&g->rows, groups, bytes)
                                         : fp8op_create_blocks(&g->blocks, groups, bytes);
    if (ce != cudaSuccess) {
        delete g;
        return ce;
    }
    *out = g;
    return cudaSuccess;
}

cudaError_t fp8gemm_enqueue(Fp8Gemm *g, const Fp8Proj &p, cudaStream_t s)
{
    return g->rows ? fp8op_enqueue_rows(g->rows, p, s) : fp8op_enqueue_blocks(g->blocks, p, s);
}

void fp8gemm_free(Fp8Gemm *g)
{
    if (!g)
        return;
    fp8op_free_rows(g->rows);
    fp8op_free_blocks(g->blocks);
    delete g;
}

} // namespace dsv4cuda
