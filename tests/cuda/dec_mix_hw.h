/*
 * test_cuda's per-kernel test of k_dec_mix (fast/cuda/dec_mix.cu): the host half (test_cuda.c)
 * builds fp4 routed experts, an fp8 shared expert and their activations, repacks the weights into
 * the fragment-native layout and computes the expected products; the device half (dec_mix_hw.cu)
 * runs the kernel once on them. Test code: linked into build/cuda/test_cuda only.
 */
#ifndef DSV4MOE_TESTS_CUDA_DEC_MIX_HW_H
#define DSV4MOE_TESTS_CUDA_DEC_MIX_HW_H

#include <stdint.h>

typedef struct {
    int E, N, K;                /* routed experts, weight rows (N / 16 a multiple of 8), inner (a multiple of 128) */
    int ks, ks_sh;              /* the routed and shared groups' K splits (1, 2, 4 or 8) */
    const uint8_t *w4, *s4;     /* routed fp4, fragment-native: expert e at e w4_stride, e s4_stride */
    uint64_t w4_stride, s4_stride;
    const uint8_t *w8;          /* the shared expert, fp8 fragment-native (w8_bytes), its fp32 block scales */
    const float *s8;            /* (s8_count) */
    uint64_t w8_bytes, s8_count;
    const int *cnt, *pad_off;   /* [E]: each routed expert's rows (0 to 16) and first A and output row */
    int rows;                   /* A and output rows in all (every pad_off[e] + cnt[e] at most this) */
    const uint8_t *A;           /* [rows, K] e4m3 codes */
    const float *As;            /* [rows, K / 128] */
    int ntok;                   /* the shared expert's rows (1 to 16) */
    const uint8_t *Ash;         /* [ntok, K] */
    const float *Assh;          /* [ntok, K / 128] */
} dsv4_test_decmix_in;

#ifdef __cplusplus
extern "C" {
#endif
/* Runs k_dec_mix once (plain projection, no epilogue, no PDL) on in. out [rows, N] and out_sh
   [ntok, N] (bf16 bits) start as the caller's contents, so rows no group writes keep them. 0, or a
   CUDA error code. */
int dsv4_test_dec_mix(const dsv4_test_decmix_in *in, uint16_t *out, uint16_t *out_sh);
/* The same through k_dec's own launches (fast/cuda/dec.cu): the fp4 routed groups in one launch
   (K split in->ks), the fp8 shared expert in another (in->ks_sh), with the rings of params dec_ring
   `ring` (0 std, 1 deep, 2 bulk, 3 bulk_ef). 0, or a CUDA error code. */
int dsv4_test_dec(const dsv4_test_decmix_in *in, int ring, uint16_t *out, uint16_t *out_sh);
#ifdef __cplusplus
}
#endif

#endif
