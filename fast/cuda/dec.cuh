/*
 * k_dec (fast/cuda/dec.cu): the fp8 path's decode regime, groups of at most FM_DEC_MAX rows, the
 * weights streamed through each warp's cp.async ring and the K split's partial sums added in a
 * fixed order (mma_parts.cuh holds its device code and the path's design).
 */
#ifndef DSV4MOE_FAST_CUDA_DEC_CUH
#define DSV4MOE_FAST_CUDA_DEC_CUH

#include <stddef.h>

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/* Enqueues k_dec on s: grid (N / 16 / (8 / fa.ks), slots: the routed active slots below fa.act_max,
   then the shared expert) of FM_THREADS threads and smem bytes of shared memory (dec_smem_bytes),
   for weights of format fmt (WF_FP4 or WF_FP8); epilogue epi (EPI_*); sb: B from the block's slabs
   (only with fa.ks 1; ignored for fp8 and the folded epilogues); registers bounded for minb (2 or 3) blocks per
   multiprocessor; ring: the rings of params dec_ring (RING_STD, or RING_DEEP / RING_BULK: then
   two blocks per multiprocessor, no slabs, and smem dec_smem_bytes(.., deep)); pdl: with
   programmatic dependent launch. fa.qin (params quant=down, epi EPI_NONE or EPI_COMBINE, the
   standard rings): the variant that quantizes the group's bf16 h rows itself, smem
   dec_smem_bytes(fmt, fa.ks, 2) + dec_qin_bytes(rows, fa.K) (no slabs). Returns the launch's error,
   which is also the runtime's last error. */
cudaError_t launch_dec_kernel(const FastArgs &fa, int fmt, int epi, bool sb, int minb, int ring, dim3 grid,
                              size_t smem, cudaStream_t s, bool pdl);

/* Sets the dynamic shared-memory limit of k_dec's variants to m4 bytes (fp4) and m8 (fp8): those of
   params dec_regs=128 (minb2) and quant=fold (qfold) only when chosen; the variants of dec_ring
   (ring RING_DEEP or RING_BULK) to d4 and d8 when chosen; those of params quant=down to q4 and q8
   when q4 > 0. */
cudaError_t dec_kernel_attrs(int m4, int m8, bool minb2, bool qfold, int ring, int d4, int d8, int q4 = 0, int q8 = 0);

} // namespace dsv4cuda

#endif
