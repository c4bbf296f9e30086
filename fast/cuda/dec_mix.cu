/*
 * k_dec_mix: fp4 routed and fp8 shared decode GEMMs in one launch (dec_mix.cuh says what and why).
 */
#include "fast/cuda/dec_mix.cuh"

namespace dsv4cuda {

namespace {

/* The units of a decode launch of routed groups (format FMT, split a.ks) and the shared expert's
   group (FMS, a.ks_sh): unit u < act_max gxr is routed slot u / gxr at place u % gxr along N, the
   gxs after it the shared expert's places. */
struct MixUnits {
    int gxr, gxs, ur, n;
};

__device__ __forceinline__ MixUnits mix_units(const FastArgs &a)
{
    MixUnits m;
    const int tiles16 = a.N / 16;
    m.gxr = tiles16 / (8 / a.ks);
    m.gxs = tiles16 / (8 / a.ks_sh);
    m.ur = a.act_max * m.gxr;
    m.n = m.ur + m.gxs;
    return m;
}

/* Runs unit u (after the programmatic wait); pf: its weights asked into L2 first; QI: params
   quant=down (dec_qin.cuh). False when the unit has no work (an inactive slot, a group past the
   decode regime, no shared expert here). */
template <int FMT, int FMS, int EPI, bool QI>
__device__ __forceinline__ bool mix_unit(const FastArgs &a, const MixUnits &m, int u, bool pf, uint8_t *fsm)
{
    FGrp g;
    if (u < m.ur) {
        const int bx = u % m.gxr;
        if (!dec_routed_group(a, u / m.gxr, g))
            return false;
        if (pf && threadIdx.x == 0)
            dec_prefetch(g.w, g.s, FMT, a.K, a.ks, bx);
        dec_group<FMT, EPI, false, RING_STD, QI>(a, g, a.ks, bx, fsm);
        return true;
    }
    if (!dec_shared_runs(a, *a.ntok))
        return false;
    fgrp_shared(a, g);
    dec_group<FMS, EPI, false, RING_STD, QI>(a, g, a.ks_sh, u - m.ur, fsm);
    return true;
}

/* The weights unit u will read into L2 (routed: only once its group is known, after the wait). */
template <int FMT, int FMS>
__device__ __forceinline__ void mix_unit_prefetch(const FastArgs &a, const MixUnits &m, int u)
{
    FGrp g;
    if (u < m.ur) {
        if (dec_routed_group(a, u / m.gxr, g))
            dec_prefetch(g.w, g.s, FMT, a.K, a.ks, u % m.gxr);
    } else if (a.sh.w) {
        dec_prefetch(a.sh.w, a.sh.s, FMS, a.K, a.ks_sh, u - m.ur);
    }
}

/*
 * The routed groups in format FMT and the shared expert's group in another format FMS in one
 * launch (params shared_dec=one): slots y < act_max as k_dec<FMT> with K split a.ks, slot act_max
 * as k_dec<FMS> with a.ks_sh, each exactly as in its own launch (the same products and sums), grid
 * (the larger of the two splits' places, act_max + 1): block (x, y) is unit y gxr + x, or the
 * shared unit x, and a block past its group's places returns. One launch instead of two on two
 * streams with their fork and join. FM_THREADS threads, the larger of the two dec_smem_bytes (with
 * QI, params quant=down, and dec_qin_bytes more).
 */
template <int FMT, int FMS, int EPI, int MINB = 3, bool QI = false>
__global__ void __launch_bounds__(FM_THREADS, MINB) k_dec_mix(FastArgs a)
{
    const MixUnits m = mix_units(a);
    const int y = blockIdx.y, x = blockIdx.x;
    const bool sh = y >= a.act_max;
    if (a.pf && sh && x < m.gxs && threadIdx.x == 0)
        dec_prefetch(a.sh.w, a.sh.s, FMS, a.K, a.ks_sh, x); /* static weights: before the wait */
    pdl_enter();
    extern __shared__ __align__(16) uint8_t fsm[];
    if (x >= (sh ? m.gxs : m.gxr))
        return;
    (void)mix_unit<FMT, FMS, EPI, QI>(a, m, sh ? m.ur + x : y * m.gxr + x, a.pf && !sh, fsm);
}

/*
 * The same units with persistent blocks (params dec_sched=persist): a grid of at most the
 * resident blocks, each taking units x, x + gridDim.x, ... in order, the same computation per
 * unit; with dec_pf=l2 a block asks for its next unit's weights into L2 before computing this
 * one, so the weight stream does not stop between a block's units. The shared expert's units come
 * after every routed one.
 */
template <int FMT, int FMS, int EPI, int MINB = 3, bool QI = false>
__global__ void __launch_bounds__(FM_THREADS, MINB) k_dec_mix_persist(FastArgs a)
{
    const MixUnits m = mix_units(a);
    pdl_enter();
    extern __shared__ __align__(16) uint8_t fsm[];
    const int stride = (int)gridDim.x;
    if (a.pf && threadIdx.x == 0 && (int)blockIdx.x < m.n)
        mix_unit_prefetch<FMT, FMS>(a, m, blockIdx.x);
    for (int u = blockIdx.x; u < m.n; u += stride) {
        if (a.pf && threadIdx.x == 0 && u + stride < m.n)
            mix_unit_prefetch<FMT, FMS>(a, m, u + stride);
        if (mix_unit<FMT, FMS, EPI, QI>(a, m, u, false, fsm))
            __syncthreads(); /* every warp is done with the ring, the partial sums and (QI) the rows */
    }
}

typedef void (*mix_kernel)(FastArgs);

template <int MB> mix_kernel pick(int epi, bool persist)
{
    const mix_kernel k[2][3] = {{k_dec_mix<WF_FP4, WF_FP8, EPI_NONE, MB>, k_dec_mix<WF_FP4, WF_FP8, EPI_COMBINE, MB>,
                                 k_dec_mix<WF_FP4, WF_FP8, EPI_QUANT, MB>},
                                {k_dec_mix_persist<WF_FP4, WF_FP8, EPI_NONE, MB>,
                                 k_dec_mix_persist<WF_FP4, WF_FP8, EPI_COMBINE, MB>,
                                 k_dec_mix_persist<WF_FP4, WF_FP8, EPI_QUANT, MB>}};
    return k[persist][epi];
}

/* With params quant=down (QI): the down projection's, epilogue epi EPI_NONE or EPI_COMBINE. */
template <int MB> mix_kernel pick_qi(int epi, bool persist)
{
    const mix_kernel k[2][2] = {{k_dec_mix<WF_FP4, WF_FP8, EPI_NONE, MB, true>,
                                 k_dec_mix<WF_FP4, WF_FP8, EPI_COMBINE, MB, true>},
                                {k_dec_mix_persist<WF_FP4, WF_FP8, EPI_NONE, MB, true>,
                                 k_dec_mix_persist<WF_FP4, WF_FP8, EPI_COMBINE, MB, true>}};
    return k[persist][epi == EPI_COMBINE ? 1 : 0];
}

mix_kernel pick_any(const FastArgs &fa, int epi, int minb, bool persist)
{
    if (fa.qin && epi != EPI_QUANT)
        return minb == 2 ? pick_qi<2>(epi, persist) : pick_qi<3>(epi, persist);
    return minb == 2 ? pick<2>(epi, persist) : pick<3>(epi, persist);
}

} // namespace

cudaError_t launch_dec_mix(const FastArgs &fa, int epi, int minb, unsigned gx, size_t smem, cudaStream_t s, bool pdl)
{
    return launch_kernel(pick_any(fa, epi, minb, false), dim3(gx, (unsigned)fa.act_max + 1), FM_THREADS, smem, s, pdl,
                         fa);
}

cudaError_t launch_dec_mix_persist(const FastArgs &fa, int epi, int minb, unsigned blocks, size_t smem, cudaStream_t s,
                                   bool pdl)
{
    return launch_kernel(pick_any(fa, epi, minb, true), dim3(blocks), FM_THREADS, smem, s, pdl, fa);
}

cudaError_t dec_mix_attrs(int smem, int qsmem)
{
    cudaError_t ce = cudaSuccess;
    for (int epi = 0; epi < 3 && ce == cudaSuccess; epi++)
        for (int mb = 2; mb <= 3 && ce == cudaSuccess; mb++)
            for (int p = 0; p < 2 && ce == cudaSuccess; p++)
                ce = cudaFuncSetAttribute(mb == 2 ? pick<2>(epi, p) : pick<3>(epi, p),
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    for (int i = 0; i < 8 && qsmem > 0 && ce == cudaSuccess; i++) /* params quant=down */
        ce = cudaFuncSetAttribute(i & 4 ? pick_qi<2>(i & 1 ? EPI_COMBINE : EPI_NONE, (i & 2) != 0)
                                        : pick_qi<3>(i & 1 ? EPI_COMBINE : EPI_NONE, (i & 2) != 0),
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, qsmem);
    return ce;
}

} // namespace dsv4cuda
