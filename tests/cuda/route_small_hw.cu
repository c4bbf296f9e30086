/*
 * Device half of test_cuda's route_small_kernel test (route_small_hw.h): k_route_small through its
 * launcher on the caller's small inputs, every output copied back. Test code: linked into
 * build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "fast/cuda/route_small.cuh"
#include "tests/cuda/dev_arena.cuh"
#include "tests/cuda/route_small_hw.h"

extern "C" int dsv4_test_route_small(const dsv4_test_route_in *in, dsv4_test_route_out *out)
{
    using namespace dsv4cuda;
    const int E = in->E, K = in->K, H = in->H, T = in->T, n = T * K;
    if (!route_small_fits(E, K, T))
        return (int)cudaErrorInvalidValue;
    DevArena ar;
    uint16_t *x = ar.get<uint16_t>((size_t)T * H), *gate = ar.get<uint16_t>((size_t)E * H);
    float *bias = in->bias ? ar.get<float>(E) : nullptr, *logits = ar.get<float>((size_t)T * E);
    int *ntok = ar.get<int>(1);
    unsigned long long *stats = ar.get<unsigned long long>(ST_N);
    int32_t *ids = ar.get<int32_t>(n), *kept = ar.get<int32_t>(T);
    float *w = ar.get<float>(n), *slot_w = ar.get<float>(n);
    int *cnt = ar.get<int>(E), *slot_off = ar.get<int>(E + 1), *pad_off = ar.get<int>(E), *active = ar.get<int>(E);
    int *meta = ar.get<int>(8), *tile_e = ar.get<int>(2 * n), *tile_r0 = ar.get<int>(2 * n);
    int32_t *slot_tok = ar.get<int32_t>(n), *slot_row = ar.get<int32_t>(n), *rowmap = ar.get<int32_t>(n);
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    cudaError_t e;
    if ((e = dev_put(x, in->x, (size_t)T * H)) != cudaSuccess ||
        (e = dev_put(gate, in->gate, (size_t)E * H)) != cudaSuccess ||
        (bias && (e = dev_put(bias, in->bias, (size_t)E)) != cudaSuccess) || (e = dev_put(ntok, &T, 1)) != cudaSuccess)
        return (int)e;
    RouteSmallArgs rs;
    memset(&rs, 0, sizeof rs);
    rs.la.x = x, rs.la.gate = gate, rs.la.ntok = ntok, rs.la.logits = logits;
    rs.la.H = H, rs.la.E = E, rs.la.lblocks = (E + LS_EPB - 1) / LS_EPB;
    RouterArgs &ra = rs.ra;
    ra.x = x, ra.ntok = ntok, ra.logits = logits, ra.bias = bias, ra.ids = ids, ra.w = w, ra.kept = kept;
    ra.lslices = 1, ra.small_max = DSV4C_LOGITS_SMALL, ra.lslice_stride = (long long)T * E, ra.stats = stats;
    ra.H = H, ra.E = E, ra.K = K, ra.V = 1, ra.score = in->score;
    ra.route_scale = in->route_scale, ra.norm_eps = in->norm_eps, ra.top_p = 1.0f;
    Group2Args &g = rs.g;
    g.ids = ids, g.w = w, g.ntok = ntok, g.cnt = cnt, g.slot_off = slot_off, g.pad_off = pad_off, g.active = active;
    g.meta = meta, g.tile_e = tile_e, g.tile_r0 = tile_r0, g.slot_tok = slot_tok, g.slot_row = slot_row;
    g.rowmap = rowmap, g.slot_w = slot_w, g.stats = stats;
    g.E = E, g.K = K, g.rows = (n < E ? n : E) * 128, g.cap_mid = n, g.cap_big = n;
    g.mid_rows = 32, g.big_rows = 128, g.place = 1, g.cut_rows = FM_MID_MAX;
    rs.ncap = n;
    if ((e = launch_route_small(rs, 0, 1, 0, false)) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess)
        return (int)e;
    unsigned long long st[ST_N];
    if ((e = dev_take(out->logits, logits, (size_t)T * E)) != cudaSuccess ||
        (e = dev_take(out->ids, ids, n)) != cudaSuccess || (e = dev_take(out->w, w, n)) != cudaSuccess ||
        (e = dev_take(out->kept, kept, T)) != cudaSuccess || (e = dev_take(out->cnt, cnt, E)) != cudaSuccess ||
        (e = dev_take(out->slot_off, slot_off, E + 1)) != cudaSuccess ||
        (e = dev_take(out->pad_off, pad_off, E)) != cudaSuccess ||
        (e = dev_take(out->active, active, E)) != cudaSuccess || (e = dev_take(out->meta, meta, 4)) != cudaSuccess ||
        (e = dev_take(out->tile_e, tile_e, 2 * n)) != cudaSuccess ||
        (e = dev_take(out->tile_r0, tile_r0, 2 * n)) != cudaSuccess ||
        (e = dev_take(out->slot_tok, slot_tok, n)) != cudaSuccess ||
        (e = dev_take(out->slot_row, slot_row, n)) != cudaSuccess ||
        (e = dev_take(out->rowmap, rowmap, n)) != cudaSuccess ||
        (e = dev_take(out->slot_w, slot_w, n)) != cudaSuccess || (e = dev_take(st, stats, ST_N)) != cudaSuccess)
        return (int)e;
    out->ticket = st[ST_TICKET];
    out->cap_mid = n, out->cap_big = n;
    return 0;
}
