/*
 * Device half of test_cuda's dec_mix_kernel test (dec_mix_hw.h): k_dec_mix, or k_dec with each of
 * its rings, through their launchers on the caller's small inputs, the outputs copied back. Test
 * code: linked into build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>

#include <algorithm>

#include "fast/cuda/dec.cuh"
#include "fast/cuda/dec_mix.cuh"
#include "tests/cuda/dec_mix_hw.h"
#include "tests/cuda/decmix_args.cuh"
#include "tests/cuda/dev_arena.cuh"

/* ring < 0: k_dec_mix; else k_dec with dec_ring `ring` (dsv4_test_dec). */
static int run_dec(const dsv4_test_decmix_in *in, int ring, uint16_t *out, uint16_t *out_sh)
{
    using namespace dsv4cuda;
    const int E = in->E, N = in->N, K = in->K, ng = K / 128;
    const int tiles16 = N / 16;
    if (E < 1 || E > 64 || N % 128 || K % 128 || in->ntok < 1 || in->ntok > FM_DEC_MAX)
        return (int)cudaErrorInvalidValue;
    /* the grouping's view of the routed experts: the active list in expert order, compact slots */
    int active[64], slot_off[65], meta[4] = {0, 0, 0, 0};
    slot_off[0] = 0;
    for (int e = 0; e < E; e++) {
        if (in->cnt[e] < 0 || in->cnt[e] > FM_DEC_MAX || in->pad_off[e] + in->cnt[e] > in->rows)
            return (int)cudaErrorInvalidValue;
        if (in->cnt[e] > 0)
            active[meta[0]++] = e;
        slot_off[e + 1] = slot_off[e] + in->cnt[e];
    }
    meta[2] = slot_off[E];
    DevArena ar;
    const uint8_t *w4 = ar.copy(in->w4, (size_t)in->w4_stride * E), *s4 = ar.copy(in->s4, (size_t)in->s4_stride * E);
    const uint8_t *w8 = ar.copy(in->w8, (size_t)in->w8_bytes);
    const float *s8 = ar.copy(in->s8, (size_t)in->s8_count);
    const uint8_t *A = ar.copy(in->A, (size_t)in->rows * K), *Ash = ar.copy(in->Ash, (size_t)in->ntok * K);
    const float *As = ar.copy(in->As, (size_t)in->rows * ng), *Assh = ar.copy(in->Assh, (size_t)in->ntok * ng);
    const int *cnt = ar.copy(in->cnt, (size_t)E), *pad = ar.copy(in->pad_off, (size_t)E);
    const int *act = ar.copy(active, (size_t)E), *soff = ar.copy(slot_off, (size_t)E + 1), *met = ar.copy(meta, 4);
    const int *ntok = ar.copy(&in->ntok, 1);
    const float *slot_w = ar.get<float>((size_t)slot_off[E] + 1);
    unsigned long long *stats = ar.get<unsigned long long>(ST_N);
    uint16_t *o = ar.copy(out, (size_t)in->rows * N), *osh = ar.copy(out_sh, (size_t)in->ntok * N);
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    FastArgs fa = decmix_args(in, w4, s4, w8, s8, A, As, Ash, Assh, 0);
    fa.out = o, fa.out_sh = osh, fa.slot_w = slot_w, fa.before = 0, fa.clamp_r = 0, fa.clamp_s = 0, fa.L = 0.0f;
    fa.stats = stats, fa.ntok = ntok, fa.cnt = cnt, fa.slot_off = soff, fa.pad_off = pad, fa.active = act;
    fa.meta = met, fa.tile_e = nullptr, fa.tile_r0 = nullptr, fa.meta_tiles = 0, fa.slot_tok = nullptr;
    fa.E = E, fa.act_max = E, fa.ks = in->ks, fa.ks_sh = in->ks_sh, fa.pf = 0;
    fa.fc_cnt = nullptr, fa.qf_cnt = nullptr, fa.qf_q = nullptr, fa.qf_s = nullptr, fa.qf_sh_row0 = 0, fa.qmode = 0;
    /* the launchers' grids and shared memory, as the pipeline's enqueue_dec_mix and launch_dec size them */
    const int gxr = tiles16 / (8 / in->ks), gxs = tiles16 / (8 / in->ks_sh);
    cudaError_t e;
    if (ring < 0) {
        const size_t smem = std::max(dec_smem_bytes(WF_FP4, in->ks, 2), dec_smem_bytes(WF_FP8, in->ks_sh, 2));
        if ((e = dec_mix_attrs((int)std::max(dec_smem_bytes(WF_FP4, 8, 2), dec_smem_bytes(WF_FP8, 8, 2)))) != cudaSuccess ||
            (e = launch_dec_mix(fa, EPI_NONE, 3, (unsigned)std::max(gxr, gxs), smem, 0, false)) != cudaSuccess)
            return (int)e;
    } else {
        const bool deep = ring != RING_STD;
        FastArgs fs = fa; /* the shared expert alone: no routed slot before it */
        fs.act_max = 0, fs.ks = in->ks_sh;
        fa.sh.w = nullptr; /* the routed launch: its E slots only */
        if ((e = dec_kernel_attrs((int)dec_smem_bytes(WF_FP4, 8, 2), (int)dec_smem_bytes(WF_FP8, 8, 2), false, false, ring,
                                  (int)dec_smem_bytes(WF_FP4, 8, 2, false, true),
                                  (int)dec_smem_bytes(WF_FP8, 8, 2, false, true))) != cudaSuccess ||
            (e = launch_dec_kernel(fa, WF_FP4, EPI_NONE, false, 3, ring, dim3((unsigned)gxr, (unsigned)E),
                                   dec_smem_bytes(WF_FP4, in->ks, 2, false, deep), 0, false)) != cudaSuccess ||
            (e = launch_dec_kernel(fs, WF_FP8, EPI_NONE, false, 3, ring, dim3((unsigned)gxs, 1u),
                                   dec_smem_bytes(WF_FP8, in->ks_sh, 2, false, deep), 0, false)) != cudaSuccess)
            return (int)e;
    }
    if ((e = cudaDeviceSynchronize()) != cudaSuccess)
        return (int)e;
    if ((e = dev_take(out, o, (size_t)in->rows * N)) != cudaSuccess ||
        (e = dev_take(out_sh, osh, (size_t)in->ntok * N)) != cudaSuccess)
        return (int)e;
    return 0;
}

extern "C" int dsv4_test_dec_mix(const dsv4_test_decmix_in *in, uint16_t *out, uint16_t *out_sh)
{
    return run_dec(in, -1, out, out_sh);
}

extern "C" int dsv4_test_dec(const dsv4_test_decmix_in *in, int ring, uint16_t *out, uint16_t *out_sh)
{
    if (ring < 0 || ring > 3)
        return (int)cudaErrorInvalidValue;
    return run_dec(in, ring, out, out_sh);
}
