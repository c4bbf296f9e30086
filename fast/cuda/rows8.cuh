/*
 * The rows of the `gemm = fp8` mode's kernels around the grouped FP8 GEMM (gemm_fp8.h): where a
 * block's or warp's row of a chunk sits, for k_gather8 (gather8.cu) and k_quant8 (quant8.cu). Device
 * code and types only.
 *
 * A chunk's rows: its kept slots (routed rows, slot order) then, with a shared expert, its Tc
 * tokens' shared rows. "Large fp8 group": more than min_rows rows (fp8_cut: the decode and 32-row
 * kernels keep the smaller ones) and an expert whose weights converted exactly (ok[e], repack at
 * creation); such a group's rows are contiguous from its base r0 and read by the GEMM as one
 * [M, K] matrix.
 */
#ifndef DSV4MOE_CUDA_ROWS8_CUH
#define DSV4MOE_CUDA_ROWS8_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

/* Where a block's row sits: its group's rows M (0 when the row is not in a large fp8 group),
   the group's first row r0 and the row's index in the group. */
struct Row8 {
    long long row;
    int m, idx, slot; /* slot: the kept slot (-1 for the shared expert's rows) */
    long long r0;
};

struct Sel8 {
    const int32_t *slot_row, *slot_tok, *slot_e;
    const int *cnt, *pad_off, *meta, *ntok;
    const uint8_t *ok; /* [E + 1] */
    long long sh_row0;
    int E, slots, has_shared, min_rows;
};

/* Block b of a grid of slots + Tc blocks: false when it has no row. */
__device__ __forceinline__ bool row8(const Sel8 &a, int b, Row8 &r)
{
    r.m = 0, r.idx = 0, r.r0 = 0;
    if (b < a.slots) {
        if (b >= a.meta[2])
            return false;
        r.slot = b;
        r.row = a.slot_row[b];
        /* the expert of kept slot b, written by the placement (one load, where a search over
           slot_off was eight dependent ones per row) */
        const int lo = a.slot_e[b];
        const int c = a.cnt[lo];
        if (a.ok[lo] && c > a.min_rows) {
            r.m = c;
            r.r0 = a.pad_off[lo];
            r.idx = (int)(r.row - r.r0);
        }
        return true;
    }
    const int t = b - a.slots, nt = *a.ntok;
    if (!a.has_shared || t >= nt)
        return false;
    r.slot = -1;
    r.row = a.sh_row0 + t;
    if (a.ok[a.E] && nt > a.min_rows) {
        r.m = nt;
        r.r0 = a.sh_row0;
        r.idx = t;
    }
    return true;
}

} // namespace dsv4cuda

#endif
