/*
 * The two configurations of the fp8 mode's grouped GEMM (fast/cuda/gemm_fp8.h), each in its own
 * translation unit: `rows` (weight scales 1x128, gemm_fp8/rows.cu) and `blocks` (128x128,
 * gemm_fp8/blocks.cu). The operator is opaque here (no CUTLASS type leaks out of those two files).
 */
#ifndef DSV4MOE_CUDA_GEMM_FP8_ENTRIES_H
#define DSV4MOE_CUDA_GEMM_FP8_ENTRIES_H

#include "fast/cuda/gemm_fp8.h"

namespace dsv4cuda {

cudaError_t fp8op_create_rows(void **out, int groups, size_t *bytes);
cudaError_t fp8op_enqueue_rows(void *op, const Fp8Proj &p, cudaStream_t s);
void fp8op_free_rows(void *op); /* NULL: no-op */

cudaError_t fp8op_create_blocks(void **out, int groups, size_t *bytes);
cudaError_t fp8op_enqueue_blocks(void *op, const Fp8Proj &p, cudaStream_t s);
void fp8op_free_blocks(void *op); /* NULL: no-op */

} // namespace dsv4cuda

#endif
