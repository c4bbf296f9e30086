/*
 * k_dec_mix (fast/cuda/dec_mix.cu, params shared_dec=one): the decode GEMMs of fp4 routed experts
 * and an fp8 shared expert in one launch, each group's block as k_dec's (mma_parts.cuh) with the
 * K split its own launch would have, so the same sums as the two launches on two streams.
 */
#ifndef DSV4MOE_FAST_CUDA_DEC_MIX_CUH
#define DSV4MOE_FAST_CUDA_DEC_MIX_CUH

#include <stddef.h>

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/* Enqueues k_dec_mix on s: grid (gx, fa.act_max + 1) of FM_THREADS threads (slots below act_max:
   the routed groups, split fa.ks; the last: the shared expert, split fa.ks_sh), smem bytes of
   shared memory, epilogue epi (EPI_*), registers bounded for minb (2 or 3) blocks per
   multiprocessor; pdl: with programmatic dependent launch. fa.qin (params quant=down, epi EPI_NONE
   or EPI_COMBINE): the variant whose blocks quantize their group's bf16 h rows (dec_qin.cuh), smem
   dec_qin_bytes(fa.qin, fa.K) more. Returns the launch's error. */
cudaError_t launch_dec_mix(const FastArgs &fa, int epi, int minb, unsigned gx, size_t smem, cudaStream_t s, bool pdl);

/* The same units on `blocks` persistent blocks (params dec_sched=persist; at most the resident
   blocks, each taking every blocks-th unit). */
cudaError_t launch_dec_mix_persist(const FastArgs &fa, int epi, int minb, unsigned blocks, size_t smem, cudaStream_t s,
                                   bool pdl);

/* Sets every k_dec_mix variant's dynamic shared-memory limit to smem bytes, and params quant=down's
   to qsmem when qsmem > 0. */
cudaError_t dec_mix_attrs(int smem, int qsmem = 0);

} // namespace dsv4cuda

#endif
