/*
 * test_cuda's per-kernel tests of k_tile8 (fast/cuda/tile8.cu, params direct=): the host half
 * (test_cuda.c) makes fragment-native weights, activations and the expected values from the
 * library's host formats; the device half (tile8_hw.cu) runs tile8_frags (the weight conversion,
 * one warp a chunk, every lane's fragments copied back) or the whole kernel through its launcher.
 * Test code: linked into build/cuda/test_cuda only.
 */
#ifndef DSV4MOE_TESTS_CUDA_TILE8_HW_H
#define DSV4MOE_TESTS_CUDA_TILE8_HW_H

#include <stdint.h>

#include "tests/cuda/dec_mix_hw.h"

typedef struct {
    dsv4_test_decmix_in m; /* weights, groups (any row counts), activations; m.ks, m.ks_sh unused */
    int gu;                /* gate/up: the SwiGLU epilogue, h [*, N / 2] (weight row 16 t + i: gate
                              feature 8 t + i for i < 8, up feature 8 t + i - 8); else plain [*, N] */
    const float *slot_w;   /* gu: the router weights by compact slot (the groups in expert order) */
    int before;            /* gu: h times its slot's router weight */
    float L;               /* gu: the clamp limit (0: no clamp) */
    int qmode;             /* q64's gate/up: h quantized in the epilogue, 1 ue8m0 or 2 fp32 scales */
    const int32_t *slot_tok; /* routed row j of a group: A row slot_tok[its compact slot] (the gate/up's
                                gather); NULL: A row pad_off[e] + j */
} dsv4_test_tile8_in;

#ifdef __cplusplus
extern "C" {
#endif
/* n chunks of format fp4 (1) or fp8 (0): chunks [n][1024 or 2048], scales [n][64 or 8] bytes; af
   gets [n][32 lanes][4 steps][4 registers] words, w [n][32][2] the rows' weight scales. 0, or a
   CUDA error code. */
int dsv4_test_tile8_frags(int fp4, int n, const uint8_t *chunks, const uint8_t *scales, uint32_t *af, float *w);
/* k_tile8 once (plainly) on in: every group's rows, the shared expert's included, in tiles of 32
   rows (big 0: the mid-size kernel) or of variant v's (big 1; v 1 b128, 2 b64, 3 q64). out [rows,
   cols] and out_sh [ntok, cols] (cols N, or N / 2 with gu; bf16 bits) and, for q64's gate/up, hq
   [rows + ntok, N / 2] and hs [rows + ntok, N / 256] (the shared expert's rows after the routed
   ones) start as the caller's contents, so what the kernel does not write keeps them; clamps gets
   the routed g, u and shared g, u clamp counts. 0, or a CUDA error code. */
int dsv4_test_tile8_run(const dsv4_test_tile8_in *in, int big, int v, uint16_t *out, uint16_t *out_sh, uint8_t *hq,
                        float *hs, unsigned long long clamps[4]);
#ifdef __cplusplus
}
#endif

#endif
