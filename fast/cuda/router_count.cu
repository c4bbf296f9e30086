/*
 * k_router_count: the router and the grouping of a small chunk in one launch (router_count.cuh
 * says what it computes).
 */
#include "fast/cuda/router_count.cuh"

namespace dsv4cuda {

namespace {

/*
 * The router and, for a chunk whose slots k_count2 places itself (a.place), its grouping in one
 * launch (params route=fused, with k_logits_small before it): one block per token routes
 * it (route_block), takes a ticket, and the block that takes the last one does k_count2's work
 * over the chunk's ids. The sums and the placement are k_count2's (no atomics in either); the
 * ticket counts blocks only, and k_logits_small, launched before whenever this kernel is, zeroes
 * it (a caller-owned workspace carries other layers' bytes between calls). Saves the launch and
 * the ids' round trip between the two kernels of a decode step.
 */
/* The chunk's grouping by the whole block, or with WG (params group=warp) by its first warp where
   it fits. */
template <bool WG> __device__ __forceinline__ void group_chunk(const Group2Args &g)
{
    if (!WG || !group_warp_fits(g, *g.ntok))
        count2_block(g);
    else if (threadIdx.x < 32)
        count2_warp(g);
}

/* WG: params group=warp, WW: weights=warp, each a kernel of its own, so the default's code is the
   same without them. */
template <bool WG, bool WW> __global__ void k_router_count(RouterArgs ra, Group2Args g, int *ticket, int signal)
{
    pdl_enter();
    route_block<WW>(ra, blockIdx.x);
    __shared__ int s_last;
    __syncthreads(); /* the block's ids, weights and kept count are written (thread 0 wrote them) */
    if (gridDim.x == 1) { /* a chunk of one token: nothing to wait for (saves the fences and the atomic's round trip) */
        if (signal && threadIdx.x == 0) { /* params dec_pf=early: the ticket tells the gate/up launch the ids are out */
            __threadfence();
            atomicAdd(ticket, 1);
        }
        group_chunk<WG>(g);
        return;
    }
    if (threadIdx.x == 0) {
        __threadfence();
        s_last = atomicAdd(ticket, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    group_chunk<WG>(g);
}

} // namespace

cudaError_t launch_router_count(const RouterArgs &ra, const Group2Args &g, int *ticket, unsigned blocks, size_t smem,
                                cudaStream_t s, bool pdl, bool ww, bool signal)
{
    auto k = g.warp ? (ww ? k_router_count<true, true> : k_router_count<true, false>)
                    : (ww ? k_router_count<false, true> : k_router_count<false, false>);
    return launch_kernel(k, dim3(blocks), 256, smem, s, pdl, ra, g, ticket, signal ? 1 : 0);
}

} // namespace dsv4cuda
