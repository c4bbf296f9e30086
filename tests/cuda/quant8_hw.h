/*
 * test_cuda's per-kernel test of k_quant8 (fast/cuda/quant8.cu, the gemm fp8 mode's SwiGLU and
 * quantization of h): the host half (test_cuda.c) makes a chunk's rows (kept slots placed per
 * expert, the shared expert's tokens after them), the GEMM's bf16 g and u and the other kernels'
 * bf16 h; the device half (quant8_hw.cu) runs the kernel once through its launcher on outputs
 * filled with 0xA5 bytes, and, for the expected values, the SwiGLU of every row on the device's own
 * arithmetic (kernels.cuh's swiglu_h: the host's expf is not the device's). Test code: linked into
 * build/cuda/test_cuda only.
 */
#ifndef DSV4MOE_TESTS_CUDA_QUANT8_HW_H
#define DSV4MOE_TESTS_CUDA_QUANT8_HW_H

#include <stdint.h>

typedef struct {
    int I, qmode, f16_codes;        /* features of h (a multiple of 128), dsv4_act_quant, f16 copies */
    int before, clamp_r, clamp_s;   /* router weight before w2; the clamp on routed / shared rows */
    float L;                        /* the clamp's limit (0: none) */
    int E, slots, kept, Tc, ntok;   /* experts; slots of the chunk, kept ones; tokens, live ones */
    int has_shared, min_rows, skip_direct; /* skip_direct: params direct=q64's launch */
    int lean;                       /* params quant8=lean's kernel */
    long long sh_row0, hrows;       /* the shared expert's first row; rows of h */
    const int32_t *slot_row, *slot_tok, *slot_e; /* [slots] */
    const int *cnt, *pad_off;       /* [E] */
    const uint8_t *ok;              /* [E + 1] */
    const float *slot_w;            /* [slots] */
    const uint16_t *gu8;            /* [hrows, 2 I]: g then u of each row */
    const uint16_t *h_in;           /* [hrows, I]: the other kernels' bf16 h */
} dsv4_test_q8_in;

#ifdef __cplusplus
extern "C" {
#endif
/* Runs k_quant8 on in: q [hrows, I] and s [hrows, I / 128] (K-major), s8 [hrows I / 128] (M-major
   per group), h [hrows, I] (h_in before the call) and the four clamp counters (routed g, u, shared
   g, u) after it; q, s and s8 start as 0xA5 bytes. h_ref [hrows, I]: every row's bf16 h from its g
   and u by swiglu_h (the clamp when that row's flag is set, times row_w[row] when it is not 1).
   0, or a CUDA error code. */
int dsv4_test_quant8(const dsv4_test_q8_in *in, const float *row_w, const uint8_t *row_clamp, uint8_t *q, float *s,
                     float *s8, uint16_t *h, uint16_t *h_ref, unsigned long long clamps[4]);
#ifdef __cplusplus
}
#endif

#endif
