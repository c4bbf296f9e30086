/*
 * k_gather8: a large group's activation codes and scales where the grouped FP8 GEMM reads them
 * (gather8.cuh).
 */
#include "fast/cuda/gather8.cuh"

namespace dsv4cuda {

namespace {

__global__ void __launch_bounds__(128) k_gather8(Gather8Args a)
{
    pdl_enter();
    Row8 r;
    if (!row8(a.sel, blockIdx.x, r) || !r.m)
        return;
    const int tok = r.slot >= 0 ? a.sel.slot_tok[r.slot] : r.idx;
    const int ng = a.H >> 7;
    if (r.slot >= 0) {
        const uint4 *src = (const uint4 *)(a.xq + (long long)tok * a.H);
        uint4 *dst = (uint4 *)(a.xp + r.row * a.H);
        for (int i = threadIdx.x; i < (a.H >> 4); i += blockDim.x)
            dst[i] = src[i];
    }
    float *s8 = a.xs8 + r.r0 * ng + r.idx;
    for (int kb = threadIdx.x; kb < ng; kb += blockDim.x)
        s8[(long long)kb * r.m] = a.xs[(long long)tok * ng + kb];
}

} // namespace

cudaError_t launch_gather8(const Gather8Args &a, unsigned rows, cudaStream_t s, bool pdl)
{
    if (!rows)
        return cudaSuccess;
    return launch_kernel(k_gather8, dim3(rows), 128, 0, s, pdl, a);
}

} // namespace dsv4cuda
