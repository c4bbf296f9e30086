/*
 * k_dec: the fp8 path's decode GEMMs (dec.cuh says what it computes; mma_parts.cuh holds the
 * device code it shares with k_dec_mix).
 */
#include "fast/cuda/dec.cuh"
#include "fast/cuda/dec_early.cuh"

namespace dsv4cuda {

namespace {

/*
 * The decode regime for groups whose weights are in format FMT: block (x, y) takes place x along
 * N of slot y, a routed active group (y < act_max) or the shared expert (the last slot).
 * EPI: EPI_COMBINE, the down projection with the combine folded in (a.fc_cnt, fold_combine);
 * EPI_QUANT, gate/up with the quantization of h folded in (a.qf_cnt, fold_quant). SB: B from the
 * block's slabs (dec_stage_slab). MINB: the blocks per multiprocessor its registers are bounded
 * for, 3 (80 registers a thread, the default) or 2 (params dec_regs=128: no spills; the same
 * arithmetic). RING: the rings of params dec_ring (RING_DEEP, RING_BULK only with MINB 2: two
 * blocks' rings fill a multiprocessor's shared memory; the same arithmetic). QI: params quant=down,
 * the down projection's blocks quantize their group's h rows (a.qin; dec_qin.cuh).
 */
template <int FMT, int EPI, bool SB, int MINB = 3, int RING = RING_STD, bool QI = false>
__global__ void __launch_bounds__(FM_THREADS, MINB) k_dec(FastArgs a)
{
    extern __shared__ __align__(16) uint8_t fsm[];
    const int y = blockIdx.y;
    if (a.early && y < a.act_max) /* params dec_pf=early: a prefetch before the programmatic wait */
        dec_early<FMT>(a, y, (int)blockIdx.x, fsm);
    pdl_enter();
    FGrp g;
    if (y < a.act_max) {
        if (!dec_routed_group(a, y, g))
            return;
    } else {
        if (!dec_shared_runs(a, *a.ntok))
            return;
        fgrp_shared(a, g);
    }
    dec_group<FMT, EPI, SB, RING, QI>(a, g, a.ks, (int)blockIdx.x, fsm);
}

typedef void (*dec_kernel_t)(FastArgs);

/* k_dec for format fmt, epilogue epi, B slabs or not (EPI_NONE only), registers bounded for MB
   blocks per multiprocessor. */
template <int MB> dec_kernel_t dec_kernel(int fmt, int epi, bool sb)
{
    if (fmt == WF_FP4) {
        const dec_kernel_t k[3] = {sb ? k_dec<WF_FP4, EPI_NONE, true, MB> : k_dec<WF_FP4, EPI_NONE, false, MB>,
                                   k_dec<WF_FP4, EPI_COMBINE, false, MB>, k_dec<WF_FP4, EPI_QUANT, false, MB>};
        return k[epi];
    }
    const dec_kernel_t k[3] = {k_dec<WF_FP8, EPI_NONE, false, MB>, k_dec<WF_FP8, EPI_COMBINE, false, MB>,
                               k_dec<WF_FP8, EPI_QUANT, false, MB>};
    return k[epi];
}

/* k_dec with the deep rings (dec_ring=deep, R = RING_DEEP) or the bulk ones (RING_BULK, RING_BULK_EF) for format fmt
   and epilogue epi: no B slabs, two blocks per multiprocessor. */
template <int R> dec_kernel_t ring_kernel(int fmt, int epi)
{
    const dec_kernel_t k[2][3] = {{k_dec<WF_FP4, EPI_NONE, false, 2, R>, k_dec<WF_FP4, EPI_COMBINE, false, 2, R>,
                                   k_dec<WF_FP4, EPI_QUANT, false, 2, R>},
                                  {k_dec<WF_FP8, EPI_NONE, false, 2, R>, k_dec<WF_FP8, EPI_COMBINE, false, 2, R>,
                                   k_dec<WF_FP8, EPI_QUANT, false, 2, R>}};
    return k[fmt == WF_FP4 ? 0 : 1][epi];
}

/* ring_kernel for the rings `ring` (RING_DEEP, RING_BULK or RING_BULK_EF) */
dec_kernel_t ring_kernel_of(int ring, int fmt, int epi)
{
    return ring == RING_DEEP   ? ring_kernel<RING_DEEP>(fmt, epi)
           : ring == RING_BULK ? ring_kernel<RING_BULK>(fmt, epi)
                               : ring_kernel<RING_BULK_EF>(fmt, epi);
}

/* k_dec with params quant=down (QI) for format fmt, epilogue epi (EPI_NONE or EPI_COMBINE: the down
   projection), registers bounded for minb blocks per multiprocessor; the standard rings, no slabs. */
dec_kernel_t qin_kernel(int fmt, int epi, int minb)
{
    const dec_kernel_t k[2][2][2] = {
        {{k_dec<WF_FP4, EPI_NONE, false, 3, RING_STD, true>, k_dec<WF_FP4, EPI_COMBINE, false, 3, RING_STD, true>},
         {k_dec<WF_FP4, EPI_NONE, false, 2, RING_STD, true>, k_dec<WF_FP4, EPI_COMBINE, false, 2, RING_STD, true>}},
        {{k_dec<WF_FP8, EPI_NONE, false, 3, RING_STD, true>, k_dec<WF_FP8, EPI_COMBINE, false, 3, RING_STD, true>},
         {k_dec<WF_FP8, EPI_NONE, false, 2, RING_STD, true>, k_dec<WF_FP8, EPI_COMBINE, false, 2, RING_STD, true>}}};
    return k[fmt == WF_FP4 ? 0 : 1][minb == 2 ? 1 : 0][epi == EPI_COMBINE ? 1 : 0];
}

dec_kernel_t pick(int fmt, int epi, bool sb, int minb, int ring, bool qi)
{
    if (qi)
        return qin_kernel(fmt, epi, minb);
    if (ring != RING_STD)
        return ring_kernel_of(ring, fmt, epi);
    return minb == 2 ? dec_kernel<2>(fmt, epi, sb) : dec_kernel<3>(fmt, epi, sb);
}

} // namespace

cudaError_t launch_dec_kernel(const FastArgs &fa, int fmt, int epi, bool sb, int minb, int ring, dim3 grid,
                              size_t smem, cudaStream_t s, bool pdl)
{
    const bool qi = fa.qin && ring == RING_STD && epi != EPI_QUANT;
    return launch_kernel(pick(fmt, epi, sb && ring == RING_STD && !qi, minb, ring, qi), grid, FM_THREADS, smem, s, pdl,
                         fa);
}

cudaError_t dec_kernel_attrs(int m4, int m8, bool minb2, bool qfold, int ring, int d4, int d8, int q4, int q8)
{
    cudaError_t ce = cudaSuccess;
    auto set = [&](dec_kernel_t k, int smem) {
        if (ce == cudaSuccess)
            ce = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    };
    for (int mb = 3; mb >= 2; mb--) {
        if (mb == 2 && !minb2)
            break;
        for (int epi = 0; epi < 3; epi++) {
            if (epi == EPI_QUANT && !qfold)
                continue;
            set(mb == 2 ? dec_kernel<2>(WF_FP4, epi, false) : dec_kernel<3>(WF_FP4, epi, false), m4);
            set(mb == 2 ? dec_kernel<2>(WF_FP8, epi, false) : dec_kernel<3>(WF_FP8, epi, false), m8);
        }
        set(mb == 2 ? dec_kernel<2>(WF_FP4, EPI_NONE, true) : dec_kernel<3>(WF_FP4, EPI_NONE, true), m4);
    }
    for (int epi = 0; epi < 3 && ring != RING_STD; epi++) {
        if (epi == EPI_QUANT && !qfold)
            continue;
        set(ring_kernel_of(ring, WF_FP4, epi), d4);
        set(ring_kernel_of(ring, WF_FP8, epi), d8);
    }
    for (int i = 0; i < 8 && q4 > 0; i++) /* params quant=down */
        set(qin_kernel(i & 1 ? WF_FP8 : WF_FP4, i & 2 ? EPI_COMBINE : EPI_NONE, i & 4 ? 2 : 3), i & 1 ? q8 : q4);
    return ce;
}

} // namespace dsv4cuda
