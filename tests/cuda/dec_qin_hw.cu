/*
 * Device half of test_cuda's dec_qin_kernel test (dec_qin_hw.h): dec_quant_rows in one block of
 * k_dec's 256 threads, its shared-memory buffer copied out row by row. Test code: linked into
 * build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>

#include "fast/cuda/dec_qin.cuh"
#include "tests/cuda/dev_arena.cuh"
#include "tests/cuda/dec_qin_hw.h"

namespace {

__global__ void k_dec_qin_test(const uint16_t *h, int n, int K, int qmode, uint8_t *codes, float *scales)
{
    using namespace dsv4cuda;
    extern __shared__ __align__(16) uint8_t buf[];
    const size_t bytes = dec_qin_bytes(n, K);
    for (size_t i = threadIdx.x; i < bytes; i += blockDim.x)
        buf[i] = 0xA5;
    __syncthreads();
    dec_quant_rows(h, n, K, buf, qmode);
    __syncthreads();
    for (int i = threadIdx.x; i < n * K; i += blockDim.x)
        codes[i] = buf[(size_t)(i / K) * dec_qin_ld(K) + i % K];
    const float *sc = dec_qin_scales(buf, n, K);
    for (int i = threadIdx.x; i < n * (K / 128); i += blockDim.x)
        scales[i] = sc[i];
}

} // namespace

extern "C" int dsv4_test_dec_qin(const uint16_t *h, int n, int K, int qmode, uint8_t *codes, float *scales)
{
    using namespace dsv4cuda;
    if (n < 1 || n > FM_DEC_QIN_MAX || K < 128 || K % 128)
        return (int)cudaErrorInvalidValue;
    const size_t nk = (size_t)n * K, ns = (size_t)n * (K / 128);
    DevArena ar;
    const uint16_t *dh = ar.copy(h, nk);
    uint8_t *dc = ar.get<uint8_t>(nk);
    float *ds = ar.get<float>(ns);
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    const int smem = (int)dec_qin_bytes(n, K);
    cudaError_t e = cudaFuncSetAttribute(k_dec_qin_test, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess)
        return (int)e;
    k_dec_qin_test<<<1, 256, smem>>>(dh, n, K, qmode, dc, ds);
    if ((e = cudaPeekAtLastError()) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
        (e = dev_take(codes, (const uint8_t *)dc, nk)) != cudaSuccess ||
        (e = dev_take(scales, (const float *)ds, ns)) != cudaSuccess)
        return (int)e;
    return 0;
}
