/*
 * Device half of test_cuda's e4m3_hardware_encode test: the hardware e4m3 conversion the
 * quantizers use (e4m3x2_encode, fast/cuda/kernels.cuh) against dsv4_e4m3_bits (core/bits.h),
 * the integer algorithm core/formats.c runs, compiled for the device, for all 2^32 fp32 bit
 * patterns in both halves of the pair;
 * NaN inputs must give a NaN code (the callers set its sign). Every stride-th input's code (NaN
 * codes with the input's sign, as the callers leave them) is copied out so the test can hold it
 * against the host's dsv4_f32_to_e4m3 too. And of bf16_hardware_round: f2bf16_hw (the hardware
 * bf16 rounding with the host's NaN) against dsv4_bf16_bits likewise. Test code: linked into
 * build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "fast/cuda/kernels.cuh"
#include "tests/cuda/dev_arena.cuh"

namespace {

__global__ void k_e4m3_cmp(unsigned long long *bad, unsigned *first, uint8_t *sample, unsigned stride)
{
    const unsigned long long n = 1ull << 32;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const uint32_t u = (uint32_t)i;
        const float f = __uint_as_float(u);
        const uint32_t lo = dsv4cuda::e4m3x2_encode(f, 0.0f) & 0xFFu, hi = dsv4cuda::e4m3x2_encode(0.0f, f) >> 8;
        const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
        const uint32_t want = dsv4_e4m3_bits(f);
        const bool ok = nan ? (lo & 0x7Fu) == 0x7Fu && (hi & 0x7Fu) == 0x7Fu : lo == want && hi == want;
        if (!ok) {
            atomicAdd(bad, 1ull);
            atomicMin(first, u);
        }
        if (u % stride == 0)
            sample[u / stride] = (uint8_t)(nan ? ((u >> 24) & 0x80u) | 0x7Fu : lo);
    }
}

/* f2bf16_hw (kernels.cuh) against dsv4_bf16_bits for every fp32 bit pattern. */
__global__ void k_bf16_cmp(unsigned long long *bad, unsigned *first)
{
    const unsigned long long n = 1ull << 32;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const uint32_t u = (uint32_t)i;
        const float f = __uint_as_float(u);
        if (dsv4cuda::f2bf16_hw(f) != dsv4_bf16_bits(f)) {
            atomicAdd(bad, 1ull);
            atomicMin(first, u);
        }
    }
}

} // namespace

/* 0, or a CUDA error code. *bad: inputs whose bf16 bits differ; *first: the smallest such input's bits. */
extern "C" int dsv4_test_bf16_hw(unsigned long long *bad, unsigned *first)
{
    DevArena ar;
    unsigned long long *dbad = ar.get<unsigned long long>(1);
    unsigned *dfirst = ar.get<unsigned>(1);
    cudaError_t e = ar.err;
    if (e == cudaSuccess)
        e = cudaMemset(dfirst, 0xFF, sizeof *dfirst);
    if (e == cudaSuccess) {
        k_bf16_cmp<<<4096, 256>>>(dbad, dfirst);
        e = cudaDeviceSynchronize();
    }
    if (e == cudaSuccess)
        e = dev_take(bad, dbad, 1);
    if (e == cudaSuccess)
        e = dev_take(first, dfirst, 1);
    return (int)e;
}

/* 0, or a CUDA error code. *bad: inputs whose codes differ; *first: the smallest such input's bits. */
extern "C" int dsv4_test_e4m3_hw(unsigned long long *bad, unsigned *first, uint8_t *sample, unsigned stride,
                                 unsigned nsample)
{
    unsigned long long *dbad = nullptr;
    unsigned *dfirst = nullptr;
    uint8_t *dsample = nullptr;
    cudaError_t e = cudaMalloc((void **)&dbad, sizeof *dbad);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&dfirst, sizeof *dfirst);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&dsample, nsample);
    if (e == cudaSuccess)
        e = cudaMemset(dbad, 0, sizeof *dbad);
    if (e == cudaSuccess)
        e = cudaMemset(dfirst, 0xFF, sizeof *dfirst);
    if (e == cudaSuccess) {
        k_e4m3_cmp<<<4096, 256>>>(dbad, dfirst, dsample, stride);
        e = cudaDeviceSynchronize();
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(bad, dbad, sizeof *bad, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(first, dfirst, sizeof *first, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(sample, dsample, nsample, cudaMemcpyDeviceToHost);
    cudaFree(dbad), cudaFree(dfirst), cudaFree(dsample);
    return (int)e;
}
