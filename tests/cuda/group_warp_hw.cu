/*
 * Device half of test_cuda's group_warp_kernel test (group_warp_hw.h): the same chunk grouped by
 * count2_block and by count2_warp, each into buffers filled with the same bytes first. Test code:
 * linked into build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "fast/cuda/group_parts.cuh"
#include "tests/cuda/dev_arena.cuh"
#include "tests/cuda/group_warp_hw.h"

namespace {

/* One block of 256 threads: the block's grouping, or the first warp's (the rest return at once,
   as k_router_count's other warps do). */
__global__ void k_group_test(dsv4cuda::Group2Args a, int warp)
{
    if (!warp)
        dsv4cuda::count2_block(a);
    else if (threadIdx.x < 32)
        dsv4cuda::count2_warp(a);
}

} // namespace

extern "C" int dsv4_test_group_warp(const dsv4_test_group_in *in, dsv4_test_group_out *blk, dsv4_test_group_out *wrp)
{
    using namespace dsv4cuda;
    const int E = in->E, K = in->K, T = in->T, n = T * K;
    if (E < 1 || E > 256 || K < 1 || T < 1 || n > GROUP_WARP_SLOTS || in->cap_mid + in->cap_big > 128 ||
        in->nzero < 0 || in->nzero > 16 || ST_N > 16)
        return (int)cudaErrorInvalidValue;
    DevArena ar;
    int32_t *ids = ar.copy(in->ids, (size_t)n);
    float *w = ar.copy(in->w, (size_t)n);
    uint8_t *cut_ok = in->cut_ok ? ar.copy(in->cut_ok, (size_t)E + 1) : nullptr;
    int *ntok = ar.copy(&T, 1);
    dsv4_test_group_out *o = ar.get<dsv4_test_group_out>(1); /* every output in one struct */
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    Group2Args g;
    memset(&g, 0, sizeof g);
    g.ids = ids, g.w = w, g.ntok = ntok;
    g.cnt = o->cnt, g.slot_off = o->slot_off, g.pad_off = o->pad_off, g.active = o->active, g.meta = o->meta;
    g.tile_e = o->tile_e, g.tile_r0 = o->tile_r0, g.slot_tok = o->slot_tok, g.slot_row = o->slot_row;
    g.rowmap = o->rowmap, g.slot_e = o->slot_e, g.slot_w = o->slot_w, g.stats = o->stats;
    g.E = E, g.K = K, g.rows = in->rows, g.cap_mid = in->cap_mid, g.cap_big = in->cap_big;
    g.has_shared = in->has_shared, g.mid_rows = 32, g.big_rows = 128, g.place = 1;
    g.cut_ok = cut_ok, g.cut_rows = in->cut_rows;
    g.zero = in->nzero ? o->zero : nullptr, g.nzero = in->nzero;
    g.warp = 1;
    dsv4_test_group_out *res[2] = {blk, wrp};
    for (int warp = 0; warp < 2; warp++) {
        cudaError_t e;
        if ((e = cudaMemset(o, 0x5A, sizeof *o)) != cudaSuccess ||
            (e = cudaMemset(o->stats, 0, sizeof o->stats)) != cudaSuccess)
            return (int)e;
        k_group_test<<<1, 256, (size_t)2 * E * sizeof(int)>>>(g, warp);
        if ((e = cudaGetLastError()) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
            (e = dev_take(res[warp], o, 1)) != cudaSuccess)
            return (int)e;
        res[warp]->badid = res[warp]->stats[ST_BADID];
    }
    return 0;
}
