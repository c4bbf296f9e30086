/*
 * The FastArgs (fast/cuda/mma_parts.cuh) of a per-kernel test's operands (dsv4_test_decmix_in,
 * dec_mix_hw.h) once on the device: the fp4 routed experts, the fp8 shared expert, the
 * projection's shape and the activations read in place (no gather). The caller sets the rest.
 * Test code: linked into build/cuda/test_cuda only (dec_mix_hw.cu, tile8_hw.cu).
 */
#ifndef DSV4MOE_TESTS_CUDA_DECMIX_ARGS_CUH
#define DSV4MOE_TESTS_CUDA_DECMIX_ARGS_CUH

#include "fast/cuda/mma_parts.cuh"
#include "tests/cuda/dec_mix_hw.h"

static inline dsv4cuda::FastArgs decmix_args(const dsv4_test_decmix_in *in, const uint8_t *w4, const uint8_t *s4,
                                             const uint8_t *w8, const float *s8, const uint8_t *A, const float *As,
                                             const uint8_t *Ash, const float *Assh, int gu)
{
    using namespace dsv4cuda;
    FastArgs fa = FastArgs();
    fa.r.w = w4, fa.r.s = s4, fa.r.w_stride = (long long)in->w4_stride, fa.r.s_stride = (long long)in->s4_stride;
    fa.r.fmt = WF_FP4;
    fa.sh.w = w8, fa.sh.s = (const uint8_t *)s8, fa.sh.fmt = WF_FP8;
    fa.N = in->N, fa.K = in->K, fa.gu = gu;
    fa.A = A, fa.As = As, fa.gather = 0, fa.Ash = Ash, fa.Assh = Assh;
    return fa;
}

#endif
