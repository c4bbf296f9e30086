/* The CUDA backend's entry points for its registration (fast/cuda/reg.c): whether this
   machine has a device the backend runs on. Kept apart from cuda.cu. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "fast/cuda/cuda_entry.h"

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

/* Sharded plans: expert ranges (ep, dp) and inter ranges (tp), the latter as long as the kernels
   can run a layer of that many inter rows (a multiple of 32; the planner already splits at whole
   scale blocks: 128 for fp8 weights or quantized activations, 32 for fp4). */
extern "C" bool dsv4_cuda_backend_supports(const dsv4_config *cfg, const dsv4_shard *shard, char *why, size_t n)
{
    const int64_t ni = shard->i_count;
    if (ni == cfg->moe_inter_dim || ni % 32 == 0)
        return true;
    if (why && n)
        snprintf(why, n, "tp %d leaves %lld of moe_inter_dim %lld rows a rank, not a multiple of 32 for the cuda "
                 "kernels; a tp with moe_inter_dim / tp a multiple of 32 works",
                 shard->tp, (long long)ni, (long long)cfg->moe_inter_dim);
    return false;
}
