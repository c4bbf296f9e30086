/*
 * Device half of test_cuda's tile8_conversion test (tile8_hw.h): tile8_frags on the caller's
 * chunks, one warp a chunk. Test code: linked into build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>

#include "fast/cuda/mma_tile8.cuh"
#include "tests/cuda/dev_arena.cuh"
#include "tests/cuda/tile8_hw.h"

namespace {

template <int FMT> __global__ void k_test_frags(const uint8_t *chunks, const uint8_t *scales, uint32_t *af, float *w)
{
    using namespace dsv4cuda;
    constexpr int CH = FMT == WF_FP4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK;
    constexpr int SCH = FMT == WF_FP4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    const int lane = threadIdx.x, i = blockIdx.x;
    uint32_t f[4][4];
    float w0, w1;
    tile8_frags<FMT>(chunks + (size_t)i * CH, scales + (size_t)i * SCH, lane, f, w0, w1);
    uint32_t *o = af + ((size_t)i * 32 + lane) * 16;
    for (int c = 0; c < 4; c++)
        for (int r = 0; r < 4; r++)
            o[4 * c + r] = f[c][r];
    w[((size_t)i * 32 + lane) * 2] = w0;
    w[((size_t)i * 32 + lane) * 2 + 1] = w1;
}

} // namespace

extern "C" int dsv4_test_tile8_frags(int fp4, int n, const uint8_t *chunks, const uint8_t *scales, uint32_t *af,
                                     float *w)
{
    if (n < 1)
        return (int)cudaErrorInvalidValue;
    const size_t ch = fp4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK, sch = fp4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    DevArena ar;
    const uint8_t *dc = ar.copy(chunks, (size_t)n * ch), *ds = ar.copy(scales, (size_t)n * sch);
    uint32_t *da = ar.get<uint32_t>((size_t)n * 32 * 16);
    float *dw = ar.get<float>((size_t)n * 32 * 2);
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    if (fp4)
        k_test_frags<dsv4cuda::WF_FP4><<<n, 32>>>(dc, ds, da, dw);
    else
        k_test_frags<dsv4cuda::WF_FP8><<<n, 32>>>(dc, ds, da, dw);
    cudaError_t e;
    if ((e = cudaPeekAtLastError()) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
        (e = dev_take(af, da, (size_t)n * 32 * 16)) != cudaSuccess || (e = dev_take(w, dw, (size_t)n * 32 * 2)) != cudaSuccess)
        return (int)e;
    return 0;
}
