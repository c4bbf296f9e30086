/*
 * k_quant_x8 (fast/cuda/quant_x8.cu; params gather=quant): a large chunk's activation
 * quantization of x (SPEC.md section 5: e4m3 codes, one scale per 128 features) and the gather of
 * its codes into the grouped FP8 GEMM's rows in one pass, each token quantized once and its codes
 * written to every row that reads them.
 *
 * By default (gather=copy) the router quantizes x (route_block: codes [Tc, H] and scales) and,
 * after the grouping, k_gather8 (gather8.cuh) copies each large group's rows of codes into
 * contiguous rows and its scales into the GEMM's M-major layout: it reads the codes again, once
 * per kept slot (Tc K H bytes: 100 MB at T = 4096 on v4-flash). Here the router only routes, and
 * one block per token, after the grouping, quantizes x from bf16 with the router's arithmetic
 * (quant_group4 on the same values) and writes the codes and scales where the router wrote them
 * (x's own rows, which the shared expert's GEMM, the decode kernels and the tile kernels read, and
 * their f16 copies for k_tileh) and where k_gather8 wrote them: the same bytes, so the same outputs
 * bit for bit. A chunk whose x k_logits_small quantized (at most small_max live tokens) is only
 * gathered, from its codes.
 */
#ifndef DSV4MOE_FAST_CUDA_QUANT_X8_CUH
#define DSV4MOE_FAST_CUDA_QUANT_X8_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

struct QuantX8Args {
    const uint16_t *x;            /* [Tc, H] bf16 */
    const int *ntok;              /* live tokens (device) */
    const int32_t *ids, *rowmap;  /* [Tc, K]: each slot's expert (E: pruned) and its row of the grouped layout */
    const int *cnt, *pad_off;     /* [E]: the grouping's rows per expert and each group's first row */
    const uint8_t *ok;            /* [E + 1]: experts whose weights the FP8 GEMM holds; NULL: no gather */
    uint8_t *xq;                  /* x's codes [Tc, H] */
    float *xs;                    /* x's scales [Tc, ceil(H / 128)] */
    uint16_t *x16;                /* the codes as f16 in k_tileh's order (store_f16_codes), or NULL */
    uint8_t *xp;                  /* [rows, H]: the codes of each large routed group's rows */
    float *xs8;                   /* the GEMM's M-major scales: group base r0 H / 128 (gemm_fp8.h) */
    long long sh_row0;            /* the shared expert's first row (its scales at sh_row0 H / 128) */
    int H, E, K, qmode;           /* qmode: dsv4_act_quant (1 ue8m0, 2 fp32) */
    int has_shared, min_rows;     /* groups of more than min_rows rows of ok experts are gathered */
    int small_max;                /* > 0: a chunk of at most this many live tokens has x quantized already */
};

/* Enqueues k_quant_x8 on s: one block per row of the chunk (tokens: its Tc; rows past the live
   tokens return), with programmatic dependent launch when pdl. Gathers only where a.ok is set and
   H is a multiple of 128 (the GEMM's K). Returns the launch's error. */
cudaError_t launch_quant_x8(const QuantX8Args &a, unsigned tokens, cudaStream_t s, bool pdl);

} // namespace dsv4cuda

#endif
