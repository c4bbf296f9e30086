/*
 * The fp8 numerics mode's grouped GEMM (SPEC.md section 9, `gemm = fp8`), C++ only, private to
 * fast/cuda: CUTLASS 4.2's Hopper ptr-array grouped GEMM with FP8 block-scaled accumulation
 * (KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise: e4m3 x e4m3 wgmma, each 128 of K
 * promoted to fp32 and multiplied there by the activation's 1x128 and the weight's 128x128 or
 * 1x128 scale),
 * bf16 out. Only this file's .cu includes CUTLASS, so the rest of the backend compiles without it.
 *
 * One grouped GEMM covers the E routed experts and, as group E, the shared expert. Group sizes
 * never leave the device: fp8gemm_enqueue launches one small kernel that reads the per-expert
 * counts and writes the problem shapes, pointers, strides and scale layouts CUTLASS reads, then
 * the persistent GEMM kernel (grid = the device's multiprocessors); no host synchronisation, no
 * allocation, so both are captured in the backend's CUDA graphs like every other kernel.
 */
#ifndef DSV4MOE_CUDA_GEMM_FP8_H
#define DSV4MOE_CUDA_GEMM_FP8_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace dsv4cuda {

/*
 * One projection of one chunk. Rows of a group are contiguous: routed expert e's rows start at
 * pad_off[e] (128-aligned, cnt[e] rows), the shared expert's at sh_row0 (ntok rows). A group runs
 * here when ok[g] and it has more than min_rows rows; every other group gets M = 0 (the backend's
 * other kernels compute it).
 *
 *   A    e4m3 [rows, K] row-major (row r at A + r K)
 *   SFA  fp32 1x128 activation scales, per group "M-major": group g's scale of row i, K block kb at
 *        SFA + row0(g) (K / 128) + kb M(g) + i (CUTLASS's layout for ScaleGranularityM = 1)
 *   B    e4m3 weights [N, K] row-major per routed expert (expert e at B + e b_stride), Bsh the
 *        shared expert's; SFB / SFBsh fp32 weight scales, "N-major": with sfb_rows 1 (create),
 *        row n's of K block kb at SFB + e sfb_stride + kb N + n; with 128, block n / 128's at
 *        SFB + e sfb_stride + kb ceil(N / 128) + n / 128
 *   D    bf16 [rows, N] (row r at D + r N); Dsh the shared expert's rows (token t at Dsh + t Nsh)
 */
struct Fp8Proj {
    const int *cnt, *pad_off, *ntok;
    const uint8_t *ok; /* [E + 1] */
    int E, min_rows, has_shared;
    int N, K, Nsh, Ksh;
    long long sh_row0;
    const uint8_t *A, *Ash;
    const float *SFA, *SFAsh;
    const uint8_t *B, *Bsh;
    const float *SFB, *SFBsh;
    long long b_stride, sfb_stride; /* elements per routed expert */
    uint16_t *D, *Dsh;
};

struct Fp8Gemm; /* opaque: the CUTLASS operator, its argument arrays and workspace (device memory) */

/* Creates the operator for up to `groups` groups (E + 1) on the current device, for weight scales
   of sfb_rows (1 or 128) rows x 128 of K; allocates its argument arrays and workspace once.
   *bytes gets the device memory it took. */
cudaError_t fp8gemm_create(Fp8Gemm **out, int groups, int sfb_rows, size_t *bytes);
/* Enqueues the argument kernel and the grouped GEMM for p on stream s. */
cudaError_t fp8gemm_enqueue(Fp8Gemm *g, const Fp8Proj &p, cudaStream_t s);
void fp8gemm_free(Fp8Gemm *g); /* NULL: no-op */

} // namespace dsv4cuda

#endif
