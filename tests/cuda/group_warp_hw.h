/*
 * test_cuda's per-kernel test of count2_warp (fast/cuda/group_parts.cuh, params group=warp): the
 * host half (test_cuda.c) makes a chunk's slot ids and weights; the device half (group_warp_hw.cu)
 * groups them once with the block (count2_block, the default) and once with one warp, every output
 * buffer filled with the same bytes before each, and copies both results back. Test code: linked
 * into build/cuda/test_cuda only.
 */
#ifndef DSV4MOE_TESTS_CUDA_GROUP_WARP_HW_H
#define DSV4MOE_TESTS_CUDA_GROUP_WARP_HW_H

#include <stdint.h>

typedef struct {
    int E, K, T;           /* experts (at most 256), slots a token, tokens (T K at most 32) */
    const int32_t *ids;    /* [T K]: an expert, E (a pruned slot) or out of range (counted bad) */
    const float *w;        /* [T K] */
    const uint8_t *cut_ok; /* [E + 1] or NULL: groups past cut_rows of these experts go to the GEMM */
    int cut_rows, has_shared, rows, cap_mid, cap_big, nzero;
} dsv4_test_group_in;

/* One grouping's every output (int arrays as written, the rest the fill bytes 0x5A). */
typedef struct {
    int cnt[256], slot_off[257], pad_off[256], active[256], meta[4];
    int tile_e[128], tile_r0[128]; /* cap_mid + cap_big at most 128 */
    int32_t slot_tok[32], slot_row[32], rowmap[32], slot_e[32];
    float slot_w[32];
    int zero[16]; /* nzero at most 16 */
    unsigned long long stats[16];
    unsigned long long badid; /* stats' out-of-range count (the device half copies it here) */
} dsv4_test_group_out;

#ifdef __cplusplus
extern "C" {
#endif
/* Groups in by count2_block into blk and by count2_warp into wrp; 0, or a CUDA error code (an
   input past the sizes above: cudaErrorInvalidValue). */
int dsv4_test_group_warp(const dsv4_test_group_in *in, dsv4_test_group_out *blk, dsv4_test_group_out *wrp);
#ifdef __cplusplus
}
#endif

#endif
