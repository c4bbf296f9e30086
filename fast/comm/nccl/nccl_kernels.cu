/*
 * Device kernels of the NCCL communicator: the exact (ascending rank) sum
 * behind all_reduce, and EP routing, packing and unpacking of token-slots.
 * Plain CUDA, no library; launched on the caller's stream, so capturable.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/bits.h"
#include "dsv4moe/dtype.h"
#include "fast/comm/nccl/nccl_internal.h"

namespace {

__device__ inline float bf16_to_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

/* The rounding of core/formats.c dsv4_f32_to_bf16 (core/bits.h: one copy for host and device). */
__device__ inline uint16_t f32_to_bf16(float x) { return dsv4_bf16_bits(x); }

/* Integer adds wrap (unsigned types); floating adds are rounded one by one, never contracted, in the sim's order. */
__device__ inline uint32_t add_rn(uint32_t a, uint32_t b) { return a + b; }
__device__ inline unsigned long long add_rn(unsigned long long a, unsigned long long b) { return a + b; }
__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }

template <typename T>
__global__ void sum_kernel(const T *g, T *out, int n, uint64_t count)
{
    for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < count; e += (uint64_t)gridDim.x * blockDim.x) {
        T acc = g[e];
        for (int r = 1; r < n; r++)
            acc = add_rn(acc, g[(uint64_t)r * count + e]);
        out[e] = acc;
    }
}

__global__ void sum_bf16_kernel(const uint16_t *g, uint16_t *out, int n, uint64_t count)
{
    for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < count; e += (uint64_t)gridDim.x * blockDim.x) {
        float acc = bf16_to_f32(g[e]);
        for (int r = 1; r < n; r++)
            acc = __fadd_rn(acc, bf16_to_f32(g[(uint64_t)r * count + e]));
        out[e] = f32_to_bf16(acc);
    }
}

unsigned grid_for(uint64_t count, unsigned block)
{
    uint64_t g = (count + block - 1) / block;
    return (unsigned)(g > 4096 ? 4096 : (g ? g : 1));
}

#define ROUTE_THREADS 1024
#define ROUTE_MAX_EP DSV4_COMM_MAX_RANKS

__device__ inline int dest_of(int32_t id, const int *begin, int ep)
{
    if (id < begin[0] || id >= begin[ep])
        return -1;
    int lo = 0, hi = ep - 1; /* the last d with begin[d] <= id */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (begin[mid] <= id)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/*
 * Thread i owns the contiguous slots [i * per, (i + 1) * per), so scanning the per-thread counts in thread order
 * keeps (t, k) ascending inside every destination. The scans are serial in thread 0: at most 64 x 1024 adds,
 * microseconds, and one block needs no inter-block synchronisation.
 */
__global__ void __launch_bounds__(ROUTE_THREADS) route_kernel(const int32_t *ids, int64_t slots, const int *begin_g, int ep, int64_t cap, int32_t *pos,
                             int64_t *counts, int32_t *overflow)
{
    __shared__ int begin[ROUTE_MAX_EP + 1];
    __shared__ int64_t sh[ROUTE_THREADS];
    __shared__ int64_t total[ROUTE_MAX_EP];
    __shared__ int64_t off[ROUTE_MAX_EP];
    int tid = threadIdx.x;
    for (int d = tid; d <= ep; d += blockDim.x)
        begin[d] = begin_g[d];
    __syncthreads();
    int64_t per = (slots + blockDim.x - 1) / blockDim.x;
    int64_t lo = tid * per, hi = lo + per < slots ? lo + per : slots;
    int64_t base[ROUTE_MAX_EP];
    for (int d = 0; d < ep; d++) {
        int64_t c = 0;
        for (int64_t s = lo; s < hi; s++)
            c += dest_of(ids[s], begin, ep) == d;
        sh[tid] = c;
        __syncthreads();
        if (tid == 0) {
            int64_t run = 0;
            for (int i = 0; i < (int)blockDim.x; i++) {
                int64_t v = sh[i];
                sh[i] = run;
                run += v;
            }
            total[d] = run;
        }
        __syncthreads();
        base[d] = sh[tid];
        __syncthreads();
    }
    if (tid == 0) {
        int64_t run = 0, dropped = 0;
        for (int d = 0; d < ep; d++) {
            off[d] = cap ? d * cap : run;
            run += total[d];
            int64_t kept = cap && total[d] > cap ? cap : total[d];
            dropped += total[d] - kept;
            counts[d] = kept;
        }
        if (dropped)
            atomicAdd(overflow, (int32_t)(dropped > 0x7fffffff ? 0x7fffffff : dropped));
    }
    __syncthreads();
    for (int64_t s = lo; s < hi; s++) {
        int d = dest_of(ids[s], begin, ep);
        int32_t p = -1;
        if (d >= 0) {
            int64_t i = base[d]++;
            if (!cap || i < cap)
                p = (int32_t)(off[d] + i);
        }
        pos[s] = p;
    }
}

__global__ void pack_kernel(int64_t slots, int k, const int32_t *pos, const uint4 *x, size_t row_vecs,
                            const int32_t *ids, const float *w, uint4 *rows, int32_t *rids, float *rw)
{
    for (int64_t s = blockIdx.x; s < slots; s += gridDim.x) {
        int32_t p = pos[s];
        if (p < 0)
            continue;
        const uint4 *src = x + (size_t)(s / k) * row_vecs;
        uint4 *dst = rows + (size_t)p * row_vecs;
        for (size_t v = threadIdx.x; v < row_vecs; v += blockDim.x)
            dst[v] = src[v];
        if (threadIdx.x == 0) {
            rids[p] = ids[s];
            rw[p] = w[s];
        }
    }
}

__global__ void unpack_kernel(int64_t slots, const int32_t *pos, const uint4 *back, size_t row_vecs, uint4 *out)
{
    for (int64_t s = blockIdx.x; s < slots; s += gridDim.x) {
        int32_t p = pos[s];
        if (p < 0)
            continue;
        const uint4 *src = back + (size_t)p * row_vecs;
        uint4 *dst = out + (size_t)s * row_vecs;
        for (size_t v = threadIdx.x; v < row_vecs; v += blockDim.x)
            dst[v] = src[v];
    }
}

unsigned row_grid(int64_t slots)
{
    return (unsigned)(slots > 65535 ? 65535 : (slots ? slots : 1));
}

} // namespace

extern "C" int dsv4_nccl_k_sum(int dtype, const void *gathered, void *out, int n, uint64_t count, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    const unsigned b = 256;
    unsigned g = grid_for(count, b);
    switch (dtype) {
    case DSV4_DTYPE_BF16:
        sum_bf16_kernel<<<g, b, 0, st>>>((const uint16_t *)gathered, (uint16_t *)out, n, count);
        break;
    case DSV4_DTYPE_F32:
        sum_kernel<float><<<g, b, 0, st>>>((const float *)gathered, (float *)out, n, count);
        break;
    case DSV4_DTYPE_F64:
        sum_kernel<double><<<g, b, 0, st>>>((const double *)gathered, (double *)out, n, count);
        break;
    case DSV4_DTYPE_I32: /* unsigned: wrapping, as the sim */
        sum_kernel<uint32_t><<<g, b, 0, st>>>((const uint32_t *)gathered, (uint32_t *)out, n, count);
        break;
    case DSV4_DTYPE_I64:
        sum_kernel<unsigned long long><<<g, b, 0, st>>>((const unsigned long long *)gathered,
                                                       (unsigned long long *)out, n, count);
        break;
    default:
        return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

extern "C" int dsv4_nccl_k_route(const int32_t *ids, int64_t slots, const int *begin, int ep, int64_t cap,
                                 int32_t *pos, int64_t *counts, int32_t *overflow, void *stream)
{
    if (ep < 1 || ep > ROUTE_MAX_EP)
        return (int)cudaErrorInvalidValue;
    route_kernel<<<1, ROUTE_THREADS, 0, (cudaStream_t)stream>>>(ids, slots, begin, ep, cap, pos, counts, overflow);
    return (int)cudaGetLastError();
}

extern "C" int dsv4_nccl_k_pack(int64_t slots, int k, const int32_t *pos, const void *x, size_t row_bytes,
                                const int32_t *ids, const float *w, void *rows, int32_t *rids, float *rw,
                                void *stream)
{
    if (slots <= 0)
        return 0;
    pack_kernel<<<row_grid(slots), 256, 0, (cudaStream_t)stream>>>(slots, k, pos, (const uint4 *)x, row_bytes / 16,
                                                                   ids, w, (uint4 *)rows, rids, rw);
    return (int)cudaGetLastError();
}

extern "C" int dsv4_nccl_k_unpack(int64_t slots, const int32_t *pos, const void *back, size_t row_bytes, void *out,
                                  void *stream)
{
    if (slots <= 0)
        return 0;
    unpack_kernel<<<row_grid(slots), 256, 0, (cudaStream_t)stream>>>(slots, pos, (const uint4 *)back,
                                                                     row_bytes / 16, (uint4 *)out);
    return (int)cudaGetLastError();
}
