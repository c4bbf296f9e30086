/*
 * k_quant8 (fast/cuda/quant8.cu): after the gemm fp8 mode's gate/up, instead of k_quant: for rows
 * of a large fp8 group (rows8.cuh), the SwiGLU epilogue of SPEC.md section 4 on the GEMM's bf16 g
 * and u (clamp counted, silu, router weight before w2, bf16 h) and the e4m3 quantization of h, whose
 * scales are written twice (K-major as the other kernels read them, M-major for the down GEMM);
 * every other row (the decode and tile kernels wrote its bf16 h) is quantized as k_quant does, with
 * the f16 copies of its codes written over its h when f16_codes (k_tileh's down reads them).
 */
#ifndef DSV4MOE_CUDA_QUANT8_CUH
#define DSV4MOE_CUDA_QUANT8_CUH

#include "fast/cuda/rows8.cuh"

namespace dsv4cuda {

struct Quant8Args {
    Sel8 sel;
    uint16_t *h;          /* bf16 h [hrows, I] of the other kernels' rows */
    const uint16_t *gu8;  /* the fp8 GEMM's bf16 [g | u] [hrows, 2 I] */
    uint8_t *q;           /* codes [hrows, I] */
    float *s, *s8;        /* scales K-major [hrows, I / 128]; M-major, group base r0 I / 128 */
    const float *slot_w;
    unsigned long long *stats;
    int I, qmode, f16_codes, before, clamp_r, clamp_s;
    float L;
};

/* Enqueues k_quant8 on s over the chunk's rows (its kept slots, then Tc with a shared expert):
   eight warps a block, a warp a row at a time, at most 2048 blocks (a grid-stride loop); with
   skip_direct (params direct=q64) rows of routed groups of more than FM_MID_MAX rows are left to
   k_tile8's epilogue; lean (params quant8=lean, the default): the same outputs by fewer
   instructions a value (quant8.cu). Programmatic dependent launch when pdl. Returns the launch's
   error. */
cudaError_t launch_quant8(const Quant8Args &a, unsigned rows, bool skip_direct, bool lean, cudaStream_t s, bool pdl);

} // namespace dsv4cuda

#endif
