/*
 * k_logits_small: the small chunks' router logits (logits_small.cuh says what it computes).
 */
#include "fast/cuda/logits_small.cuh"

namespace dsv4cuda {

namespace {

/* The small chunks' router logits as their own launch (params route=fused); block 0 zeroes the
   fused router's ticket (its blocks wait for this kernel to finish: pdl_enter). TG, LOOP:
   logits_small_block's (params logits_tg, logits_loop). a.dep_first: the router may start before
   this kernel's wait (its real pass waits for this grid, which completes after that wait). */
template <int TG, bool LOOP>
__global__ void __launch_bounds__(256) k_logits_small(LogitsArgs a)
{
    if (a.dep_first)
        asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    pdl_enter();
    const int nt = *a.ntok;
    if (a.ticket && blockIdx.x == 0 && threadIdx.x == 0)
        *a.ticket = 0;
    if (nt > DSV4C_LOGITS_SMALL) /* the GEMM kernels' chunk (k_router reads their slices) */
        return;
    logits_small_block<TG, DSV4C_LOGITS_SMALL, LOOP>(a, nt);
}

} // namespace

cudaError_t launch_logits_small(const LogitsArgs &la, int tg, bool loop, unsigned blocks, cudaStream_t s, bool pdl)
{
    auto k = loop ? (tg == 4 ? k_logits_small<4, true> : k_logits_small<1, true>)
                  : (tg == 4 ? k_logits_small<4, false> : k_logits_small<1, false>);
    return launch_kernel(k, dim3(blocks), 256, 0, s, pdl, la);
}

} // namespace dsv4cuda
