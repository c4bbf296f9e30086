/*
 * test_cuda's per-kernel test of k_route_small (fast/cuda/route_small.cu): the host half
 * (test_cuda.c) builds the inputs and the expected routing and grouping, the device half
 * (route_small_hw.cu) runs the kernel once on them. Test code: linked into build/cuda/test_cuda only.
 */
#ifndef DSV4MOE_TESTS_CUDA_ROUTE_SMALL_HW_H
#define DSV4MOE_TESTS_CUDA_ROUTE_SMALL_HW_H

#include <stdint.h>

typedef struct {
    int E, K, H, T;      /* T: the chunk's live tokens and rows (at most 32) */
    int score;           /* 0 sqrt(softplus), 1 sigmoid */
    float route_scale, norm_eps;
    const uint16_t *x;    /* [T, H] bf16 */
    const uint16_t *gate; /* [E, H] bf16 */
    const float *bias;    /* [E] or NULL */
} dsv4_test_route_in;

typedef struct {
    float *logits;                  /* [T, E] */
    int32_t *ids, *kept;            /* [T, K], [T] */
    float *w;                       /* [T, K] */
    int *cnt, *slot_off, *pad_off;  /* [E], [E + 1], [E] */
    int *active, *meta;             /* [E], [4] */
    int *tile_e, *tile_r0;          /* [cap_mid + cap_big] */
    int32_t *slot_tok, *slot_row;   /* [T K] */
    int32_t *rowmap;                /* [T K] */
    float *slot_w;                  /* [T K] */
    unsigned long long ticket;      /* the chunk counter after the launch */
    int cap_mid, cap_big;           /* the tile lists' capacities (T K each) */
} dsv4_test_route_out;

#ifdef __cplusplus
extern "C" {
#endif
/* Runs k_route_small once (no PDL, one stream) on in; the out arrays are the caller's, sized as
   above. 0, or a CUDA error code. */
int dsv4_test_route_small(const dsv4_test_route_in *in, dsv4_test_route_out *out);
#ifdef __cplusplus
}
#endif

#endif
