/*
 * Device buffers for test_cuda's per-kernel tests (route_small_hw.cu, dec_mix_hw.cu): an arena of
 * allocations freed together, and the copies in and out. Test code: linked into build/cuda/test_cuda
 * only.
 */
#ifndef DSV4MOE_TESTS_CUDA_DEV_ARENA_CUH
#define DSV4MOE_TESTS_CUDA_DEV_ARENA_CUH

#include <cuda_runtime.h>
#include <stddef.h>

/* Up to 32 device allocations, each 16 bytes longer than asked; the first error stops the rest
   (err) and every pointer after it is NULL. */
struct DevArena {
    void *p[32];
    int n = 0;
    cudaError_t err = cudaSuccess;
    /* count elements of T, zeroed */
    template <class T> T *get(size_t count)
    {
        void *q = nullptr;
        if (err == cudaSuccess && n < 32 && (err = cudaMalloc(&q, count * sizeof(T) + 16)) == cudaSuccess) {
            p[n++] = q;
            err = cudaMemset(q, 0, count * sizeof(T) + 16);
        }
        return err == cudaSuccess ? (T *)q : nullptr;
    }
    /* count elements of T, a copy of host's */
    template <class T> T *copy(const T *host, size_t count)
    {
        T *q = get<T>(count);
        if (q && (err = cudaMemcpy(q, host, count * sizeof(T), cudaMemcpyHostToDevice)) != cudaSuccess)
            return nullptr;
        return q;
    }
    ~DevArena()
    {
        for (int i = 0; i < n; i++)
            cudaFree(p[i]);
    }
};

template <class T> cudaError_t dev_put(T *dev, const T *host, size_t count)
{
    return cudaMemcpy(dev, host, count * sizeof(T), cudaMemcpyHostToDevice);
}

template <class T> cudaError_t dev_take(T *host, const T *dev, size_t count)
{
    return cudaMemcpy(host, dev, count * sizeof(T), cudaMemcpyDeviceToHost);
}

#endif
