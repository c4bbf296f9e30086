/*
 * k_tile (fast/cuda/tile.cu): the fp8 path's mid-size groups (17 to 64 rows, 32-token tiles) and,
 * with params tile=mma, its large groups (128-token tiles) on mma.sync e4m3 (mma_parts.cuh holds
 * the device code and the path's design).
 */
#ifndef DSV4MOE_FAST_CUDA_TILE_CUH
#define DSV4MOE_FAST_CUDA_TILE_CUH

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/* Enqueues k_tile on s (plainly): the 128 x 32 tiles of the mid-size tile list (big false) or the
   128 x 128 tiles of the large one (big true); grid (N / 128, the list's capacity), with the
   tile shape's threads and shared memory. A launch error is left for the caller's
   cudaPeekAtLastError. */
void launch_tile(bool big, dim3 grid, cudaStream_t s, const FastArgs &a);

/* Sets both tile shapes' dynamic shared-memory limit. */
cudaError_t tile_attrs();

} // namespace dsv4cuda

#endif
