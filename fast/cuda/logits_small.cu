/*
 * k_logits_small: the small chunks' router logits (logits_small.cuh says what it computes).
 */
#include "fast/cuda/logits_small.cuh"

namespace dsv4cuda {

namespace {

/* The small chunks' router logits as their own launch (params route=fused); block 0 zeroes the
   fused router's ticket (its blocks wait for this kernel to finish: pdl_enter). */
template <int TG>
__global__ void __launch_bounds__(256) k_logits_small(LogitsArgs a)
{
    pdl_enter();
    const int nt = *a.ntok;
    if (a.ticket && blockIdx.x == 0 && threadIdx.x == 0)
        *a.ticket = 0;
    if (nt > DSV4C_LOGITS_SMALL) /* the GEMM kernels' chunk (k_router reads their slices) */
        return;
    logits_small_block<TG, DSV4C_LOGITS_SMALL>(a, nt);
}

} // namespace

cudaError_t launch_logits_small(const LogitsArgs &la, int tg, unsigned blocks, cudaStream_t s, bool pdl)
{
    return launch_kernel(tg == 4 ? k_logits_small<4> : k_logits_small<1>, dim3(blocks), 256, 0, s, pdl, la);
}

} // namespace dsv4cuda
