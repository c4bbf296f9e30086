/*
 * Device half of test_cuda's tile8_conversion and tile8_kernel tests (tile8_hw.h): tile8_frags on
 * the caller's chunks, one warp a chunk; k_tile8 through launch_tile8 on the caller's groups. Test
 * code: linked into build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>

#include <vector>

#include "fast/cuda/mma_tile8.cuh"
#include "fast/cuda/tile8.cuh"
#include "tests/cuda/decmix_args.cuh"
#include "tests/cuda/dev_arena.cuh"
#include "tests/cuda/tile8_hw.h"

namespace {

template <int FMT> __global__ void k_test_frags(const uint8_t *chunks, const uint8_t *scales, uint32_t *af, float *w)
{
    using namespace dsv4cuda;
    constexpr int CH = FMT == WF_FP4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK;
    constexpr int SCH = FMT == WF_FP4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    const int lane = threadIdx.x, i = blockIdx.x;
    uint32_t f[4][4];
    float w0, w1;
    tile8_frags<FMT>(chunks + (size_t)i * CH, scales + (size_t)i * SCH, lane, f, w0, w1);
    uint32_t *o = af + ((size_t)i * 32 + lane) * 16;
    for (int c = 0; c < 4; c++)
        for (int r = 0; r < 4; r++)
            o[4 * c + r] = f[c][r];
    w[((size_t)i * 32 + lane) * 2] = w0;
    w[((size_t)i * 32 + lane) * 2 + 1] = w1;
}

} // namespace

extern "C" int dsv4_test_tile8_frags(int fp4, int n, const uint8_t *chunks, const uint8_t *scales, uint32_t *af,
                                     float *w)
{
    if (n < 1)
        return (int)cudaErrorInvalidValue;
    const size_t ch = fp4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK, sch = fp4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    DevArena ar;
    const uint8_t *dc = ar.copy(chunks, (size_t)n * ch), *ds = ar.copy(scales, (size_t)n * sch);
    uint32_t *da = ar.get<uint32_t>((size_t)n * 32 * 16);
    float *dw = ar.get<float>((size_t)n * 32 * 2);
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    if (fp4)
        k_test_frags<dsv4cuda::WF_FP4><<<n, 32>>>(dc, ds, da, dw);
    else
        k_test_frags<dsv4cuda::WF_FP8><<<n, 32>>>(dc, ds, da, dw);
    cudaError_t e;
    if ((e = cudaPeekAtLastError()) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
        (e = dev_take(af, da, (size_t)n * 32 * 16)) != cudaSuccess || (e = dev_take(w, dw, (size_t)n * 32 * 2)) != cudaSuccess)
        return (int)e;
    return 0;
}

extern "C" int dsv4_test_tile8_run(const dsv4_test_tile8_in *in, int big, int v, uint16_t *out, uint16_t *out_sh,
                                   uint8_t *hq, float *hs, unsigned long long clamps[4])
{
    using namespace dsv4cuda;
    const dsv4_test_decmix_in *m = &in->m;
    const int E = m->E, N = m->N, K = m->K, ng = K / 128, I = N / 2, cols = in->gu ? I : N;
    if (E < 1 || E > 64 || N < 256 || N % 256 || K < 128 || K % 128 || m->ntok < 0 || v < TILE8_B128 || v > TILE8_Q64)
        return (int)cudaErrorInvalidValue;
    const bool q = big && v == TILE8_Q64 && in->gu;
    const int bn = big ? tile8_big_rows(v) : 32;
    /* the grouping's view: compact slots in expert order, the tile list (routed, then the shared) */
    std::vector<int> te, tr;
    int slot_off[65], meta[4] = {0, 0, 0, 0};
    slot_off[0] = 0;
    for (int e = 0; e < E; e++) {
        if (m->cnt[e] < 0 || m->pad_off[e] < 0 || m->pad_off[e] + m->cnt[e] > m->rows)
            return (int)cudaErrorInvalidValue;
        slot_off[e + 1] = slot_off[e] + m->cnt[e];
        for (int r0 = 0; r0 < m->cnt[e]; r0 += bn)
            te.push_back(e), tr.push_back(r0);
    }
    for (int r0 = 0; r0 < m->ntok; r0 += bn)
        te.push_back(E), tr.push_back(r0);
    meta[1] = (int)te.size();
    if (te.empty())
        return (int)cudaErrorInvalidValue;
    for (int i = 0; in->slot_tok && i < slot_off[E]; i++)
        if (in->slot_tok[i] < 0 || in->slot_tok[i] >= m->rows)
            return (int)cudaErrorInvalidValue;
    const size_t ntok = (size_t)m->ntok, hrows = (size_t)m->rows + ntok;
    DevArena ar;
    const uint8_t *w4 = ar.copy(m->w4, (size_t)m->w4_stride * E), *s4 = ar.copy(m->s4, (size_t)m->s4_stride * E);
    const uint8_t *w8 = ar.copy(m->w8, (size_t)m->w8_bytes);
    const float *s8 = ar.copy(m->s8, (size_t)m->s8_count);
    const uint8_t *A = ar.copy(m->A, (size_t)m->rows * K), *Ash = ntok ? ar.copy(m->Ash, ntok * K) : nullptr;
    const float *As = ar.copy(m->As, (size_t)m->rows * ng), *Assh = ntok ? ar.copy(m->Assh, ntok * ng) : nullptr;
    const int *cnt = ar.copy(m->cnt, (size_t)E), *pad = ar.copy(m->pad_off, (size_t)E);
    const int *soff = ar.copy(slot_off, (size_t)E + 1), *met = ar.copy(meta, 4), *nt = ar.copy(&m->ntok, 1);
    const int *tile_e = ar.copy(te.data(), te.size()), *tile_r0 = ar.copy(tr.data(), tr.size());
    const float *slot_w = in->slot_w && slot_off[E] ? ar.copy(in->slot_w, (size_t)slot_off[E]) : ar.get<float>(1);
    const int32_t *slot_tok = in->slot_tok && slot_off[E] ? ar.copy(in->slot_tok, (size_t)slot_off[E]) : nullptr;
    unsigned long long *stats = ar.get<unsigned long long>(ST_N);
    uint16_t *o = ar.copy(out, (size_t)m->rows * cols), *osh = ntok ? ar.copy(out_sh, ntok * cols) : nullptr;
    uint8_t *dq = q ? ar.copy(hq, hrows * I) : nullptr;
    float *ds = q ? ar.copy(hs, hrows * (I / 128)) : nullptr;
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    FastArgs fa = decmix_args(m, w4, s4, w8, s8, A, As, Ash, Assh, in->gu);
    fa.out = o, fa.out_sh = osh, fa.slot_w = slot_w, fa.before = in->before;
    fa.clamp_r = fa.clamp_s = in->L > 0.0f, fa.L = in->L;
    fa.stats = stats, fa.ntok = nt, fa.cnt = cnt, fa.slot_off = soff, fa.pad_off = pad, fa.meta = met;
    fa.tile_e = tile_e, fa.tile_r0 = tile_r0, fa.meta_tiles = 1, fa.E = E;
    fa.gather = slot_tok != nullptr, fa.slot_tok = slot_tok;
    fa.qf_q = dq, fa.qf_s = ds, fa.qf_sh_row0 = m->rows, fa.qmode = in->qmode;
    cudaError_t e;
    if ((e = tile8_attrs()) != cudaSuccess)
        return (int)e;
    launch_tile8(big != 0, v, dim3((unsigned)(N / 128), (unsigned)te.size()), 0, fa);
    unsigned long long st[ST_N];
    if ((e = cudaPeekAtLastError()) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
        (e = dev_take(out, o, (size_t)m->rows * cols)) != cudaSuccess || (e = dev_take(st, stats, ST_N)) != cudaSuccess)
        return (int)e;
    if (ntok && (e = dev_take(out_sh, osh, ntok * cols)) != cudaSuccess)
        return (int)e;
    if (q && ((e = dev_take(hq, dq, hrows * I)) != cudaSuccess || (e = dev_take(hs, ds, hrows * (I / 128))) != cudaSuccess))
        return (int)e;
    for (int i = 0; i < 4; i++)
        clamps[i] = st[ST_RG + i];
    return 0;
}
