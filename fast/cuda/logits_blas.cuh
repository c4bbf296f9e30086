/*
 * The router logits of large chunks on cuBLASLt (fast/cuda/logits_blas.cu; params logits=blas):
 * l = x . gate^T, a [Tc, H] x [H, E] bf16 GEMM with fp32 products and sums, fp32 out, at the bf16
 * tensor-core rate. The default (logits=tiles) runs the same GEMM on k_tiles, the exact path's
 * tensor-core kernel (tiles.cuh: mma.sync on 128x64 tiles, K blocks of 32), measured on the H100
 * at 85 us for T = 4096, where the GEMM's 8.6 GFLOP take 11 us at cuBLASLt's bf16 rate on that
 * card (814 TFLOP/s, docs/cuda-bench.md).
 *
 * Both sum the exact bf16 products in fp32 on the tensor cores, in their own fixed orders: the
 * logits differ in the last bits, and routing (SPEC.md sections 2-3) is judged by the reference's
 * ids as before. Run to run the same: the algorithm is a function of the shape (heuristic query
 * per call, no workspace, so no split of K and no reduction across blocks) and cuBLASLt's products
 * are deterministic on one device. No workspace also makes concurrent calls on several streams
 * (stage calls) safe. One matmul launch, captured in the backend's CUDA graphs like every kernel.
 *
 * Host C++ only (no device code): the file links cuBLASLt, which `make cuda` already links.
 */
#ifndef DSV4MOE_FAST_CUDA_LOGITS_BLAS_CUH
#define DSV4MOE_FAST_CUDA_LOGITS_BLAS_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace dsv4cuda {

struct LogitsBlas; /* opaque: the cuBLASLt handle, the operation and the gate's layout */

/* Creates the operation for a gate of E rows by H (bf16, row-major [E, H]) and checks that cuBLASLt
   has an algorithm for chunks of 1 and of max_rows rows. On failure returns a CUDA error
   (cudaErrorNotSupported where cuBLASLt refused) and writes the reason into why (why_len bytes,
   NUL-terminated). */
cudaError_t logits_blas_create(LogitsBlas **out, int E, int H, int max_rows, char *why, size_t why_len);

/* Enqueues logits[r, e] = sum_h x[r, h] gate[e, h] (fp32 [rows, E] row-major) for rows rows of x
   (bf16 [rows, H] row-major) on s. Rows past the chunk's live tokens are computed too and never
   read. Returns cudaSuccess, the launch's CUDA error, or cudaErrorNotSupported where cuBLASLt
   has no algorithm for the shape or refused the call (the logits are then not written: the caller
   must stop). */
cudaError_t logits_blas_enqueue(LogitsBlas *g, const uint16_t *x, const uint16_t *gate, float *logits, int rows,
                                cudaStream_t s);

void logits_blas_free(LogitsBlas *g); /* NULL: no-op */

} // namespace dsv4cuda

#endif
