/* The CUDA backend's entry points for the registry (fast/backend/registry.c): whether this
   machine has a device the backend runs on. Kept apart from cuda.cu. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "../backend/backend_impl.h"

extern "C" bool dsv4_cuda_backend_available(char *why, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        if (why && n)
            snprintf(why, n, "backend cuda: no CUDA device on this machine (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        (void)cudaGetLastError(); /* clear the sticky error of a failed query */
        return false;
    }
    return true;
}
