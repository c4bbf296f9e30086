/*
 * k_gather8 (fast/cuda/gather8.cu): before the gemm fp8 mode's gate/up, each large group's
 * activation codes into contiguous rows (the grouped GEMM reads a group as one [M, H] matrix) and
 * their 1x128 scales in the GEMM's M-major layout (gemm_fp8.h); the shared expert reads x's codes in
 * place and needs only the scales. params gather=quant does the same in k_quant_x8 (quant_x8.cuh).
 */
#ifndef DSV4MOE_CUDA_GATHER8_CUH
#define DSV4MOE_CUDA_GATHER8_CUH

#include "fast/cuda/rows8.cuh"

namespace dsv4cuda {

struct Gather8Args {
    Sel8 sel;
    const uint8_t *xq; /* x codes [Tc, H] */
    const float *xs;   /* [Tc, H / 128] */
    uint8_t *xp;       /* [rows, H]: routed rows of large fp8 groups */
    float *xs8;        /* M-major scales, group base r0 H / 128 */
    int H;
};

/* Enqueues k_gather8 on s: one block of 128 threads per row of the chunk (rows: its kept slots,
   then Tc with a shared expert; rows outside a large group return), with programmatic dependent
   launch when pdl. Returns the launch's error. */
cudaError_t launch_gather8(const Gather8Args &a, unsigned rows, cudaStream_t s, bool pdl);

} // namespace dsv4cuda

#endif
