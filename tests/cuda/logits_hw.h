/*
 * test_cuda's per-kernel tests of the router logits: k_logits_small (fast/cuda/logits_small.cu)
 * and the cuBLASLt GEMM (fast/cuda/logits_blas.cu). The host half (test_cuda.c) makes x and the
 * gate; the device half (logits_hw.cu) runs each through its launcher (k_logits_small once per
 * variant: params logits_tg 1 / 4, logits_loop off / on) on the same inputs and copies the logits
 * back. Test code: linked into build/cuda/test_cuda only.
 */
#ifndef DSV4MOE_TESTS_CUDA_LOGITS_HW_H
#define DSV4MOE_TESTS_CUDA_LOGITS_HW_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
/* The logits of T tokens (1 to 32) x [T, H] bf16 against gate [E, H] bf16 (H a multiple of 8), each
   of the four variants: out[v] [T, E] fp32 for v = tg4 + 2 loop (tg4: logits_tg=4, loop:
   logits_loop=on; a loop variant where it does not reach H, logits_loop_fits, is the unrolled
   kernel, as the pipeline chooses). *fits: logits_loop_fits(H). 0, or a CUDA error code. */
int dsv4_test_logits_small(int T, int E, int H, const uint16_t *x, const uint16_t *gate, float *out[4], int *fits);
/* The cuBLASLt logits (params logits=blas, fast/cuda/logits_blas.cuh) of T tokens (1 or more): the
   operation created for chunks of up to T rows, enqueued twice on the same inputs, out and again
   [T, E] fp32; *refused: the CUDA error the launcher returns for 0 rows (cudaErrorInvalidValue
   expected). 0, or a CUDA error code (why: the creation's reason, why_len bytes). */
int dsv4_test_logits_blas(int T, int E, int H, const uint16_t *x, const uint16_t *gate, float *out, float *again,
                          int *refused, char *why, int why_len);
#ifdef __cplusplus
}
#endif

#endif
