/*
 * k_dec_mix: fp4 routed and fp8 shared decode GEMMs in one launch (dec_mix.cuh says what and why).
 */
#include "fast/cuda/dec_mix.cuh"

namespace dsv4cuda {

namespace {

/*
 * The routed groups in format FMT and the shared expert's group in another format FMS in one
 * launch (params shared_dec=one): slots y < act_max as k_dec<FMT> with K split a.ks, slot act_max
 * as k_dec<FMS> with a.ks_sh, each exactly as in its own launch (the same products and sums), grid
 * x the larger of the two splits' (a block past its group's tiles returns). One launch instead of
 * two on two streams with their fork and join. FM_THREADS threads, the larger of the two
 * dec_smem_bytes.
 */
template <int FMT, int FMS, int EPI, int MINB = 3>
__global__ void __launch_bounds__(FM_THREADS, MINB) k_dec_mix(FastArgs a)
{
    const int y = blockIdx.y, tiles16 = a.N / 16;
    if (a.pf && y >= a.act_max && (int)blockIdx.x < tiles16 / (8 / a.ks_sh) && threadIdx.x == 0)
        dec_prefetch(a.sh.w, a.sh.s, FMS, a.K, a.ks_sh); /* static weights: before the wait */
    pdl_enter();
    extern __shared__ __align__(16) uint8_t fsm[];
    FGrp g;
    if (y < a.act_max) {
        if ((int)blockIdx.x >= tiles16 / (8 / a.ks) || !dec_routed_group(a, y, g))
            return;
        if (a.pf && threadIdx.x == 0)
            dec_prefetch(g.w, g.s, FMT, a.K, a.ks);
        dec_group<FMT, EPI, false>(a, g, a.ks, fsm);
    } else {
        if (!dec_shared_runs(a, *a.ntok) || (int)blockIdx.x >= tiles16 / (8 / a.ks_sh))
            return;
        fgrp_shared(a, g);
        dec_group<FMS, EPI, false>(a, g, a.ks_sh, fsm);
    }
}

typedef void (*mix_kernel)(FastArgs);

template <int MB> mix_kernel pick(int epi)
{
    const mix_kernel k[3] = {k_dec_mix<WF_FP4, WF_FP8, EPI_NONE, MB>, k_dec_mix<WF_FP4, WF_FP8, EPI_COMBINE, MB>,
                             k_dec_mix<WF_FP4, WF_FP8, EPI_QUANT, MB>};
    return k[epi];
}

} // namespace

cudaError_t launch_dec_mix(const FastArgs &fa, int epi, int minb, unsigned gx, size_t smem, cudaStream_t s, bool pdl)
{
    return launch_kernel(minb == 2 ? pick<2>(epi) : pick<3>(epi), dim3(gx, (unsigned)fa.act_max + 1), FM_THREADS, smem,
                         s, pdl, fa);
}

cudaError_t dec_mix_attrs(int smem)
{
    cudaError_t ce = cudaSuccess;
    for (int epi = 0; epi < 3 && ce == cudaSuccess; epi++)
        for (int mb = 2; mb <= 3 && ce == cudaSuccess; mb++)
            ce = cudaFuncSetAttribute(mb == 2 ? pick<2>(epi) : pick<3>(epi), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem);
    return ce;
}

} // namespace dsv4cuda
