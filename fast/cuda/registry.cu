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

/* Sharded plans: expert ranges (ep, dp) with every inter row; tp > 1 splits moe_inter_dim, which
   the cuda stages do not (fast/cuda/stages.cu). */
extern "C" bool dsv4_cuda_backend_supports(const dsv4_plan *plan, char *why, size_t n)
{
    const dsv4_config *cfg = dsv4_plan_config(plan);
    if (dsv4_plan_inter_count(plan) == cfg->moe_inter_dim)
        return true;
    if (why && n)
        snprintf(why, n, "tp %d splits moe_inter_dim (%lld of %lld rows): the cuda stages compute every inter row "
                 "of their experts (ep, dp); tp runs on the cpu and ref backends",
                 dsv4_plan_topology(plan)->tp, (long long)dsv4_plan_inter_count(plan),
                 (long long)cfg->moe_inter_dim);
    return false;
}
