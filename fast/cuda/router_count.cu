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
   it fits; LEAN: count2_block's placed-chunk code only (params route_code=lean); dry: route_block's. */
template <bool WG, bool LEAN> __device__ __forceinline__ void group_chunk(const Group2Args &g, bool dry = false)
{
    if (!WG || !group_warp_fits(g, LEAN ? __ldcg(g.ntok) : *g.ntok)) /* LEAN: past L1 (route_block) */
        count2_block<LEAN>(g, dry);
    else if (threadIdx.x < 32)
        count2_warp(g, dry);
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
        group_chunk<WG, false>(g);
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
    group_chunk<WG, false>(g);
}

/*
 * k_router_count compiled for the decode configuration only (params route_code=lean: route_block's
 * and count2_block's LEAN code; the caller checked route_lean_fits), the same steps as k_router_count
 * with one grouping call site. WARM (route_code=warm): the same code run twice, a dry pass before
 * the programmatic wait, while k_logits_small (which with this code releases its dependents
 * before its own wait) and the x upload run, then the real pass. The block runs its code once per
 * step, and its time is mostly instruction fetch from L2 for each line of its path (docs/cuda.md,
 * "The block that routes"); the dry pass is that path on whatever the buffers hold, which brings
 * the lines into the multiprocessor's instruction caches, so the real pass runs from them. Both
 * passes are one copy of the code (a loop that is not unrolled). The dry pass counts no statistic,
 * takes no ticket and groups in every block; whatever it writes (ids, weights, the grouping),
 * each block's real pass writes again before its ticket, and nothing reads those before the last
 * ticket (the next kernels wait for this grid; dec_pf=early's blocks for the ticket).
 */
template <bool WG, bool WW, bool WARM>
__global__ void k_router_count_lean(RouterArgs ra, Group2Args g, int *ticket, int signal)
{
    __shared__ int s_last;
#pragma unroll 1
    for (int pass = WARM ? 0 : 1; pass < 2; pass++) {
        const bool dry = pass == 0;
        if (!dry)
            pdl_enter();
        route_block<WW, true>(ra, blockIdx.x, dry);
        __syncthreads(); /* the block's ids, weights and kept count are written (thread 0 wrote them) */
        bool group = true;
        if (!dry && gridDim.x > 1) {
            if (threadIdx.x == 0) {
                __threadfence();
                s_last = atomicAdd(ticket, 1) == (int)gridDim.x - 1;
            }
            __syncthreads();
            group = s_last;
            if (group)
                __threadfence();
        } else if (!dry && signal && threadIdx.x == 0) { /* params dec_pf=early, a chunk of one token */
            __threadfence();
            atomicAdd(ticket, 1);
        }
        if (group)
            group_chunk<WG, true>(g, dry);
        __syncthreads(); /* the dry pass's shared memory, before the real pass fills it again */
    }
}

typedef void (*router_count_kernel)(RouterArgs, Group2Args, int *, int);

router_count_kernel pick_full(bool wg, bool ww)
{
    return wg ? (ww ? k_router_count<true, true> : k_router_count<true, false>)
              : (ww ? k_router_count<false, true> : k_router_count<false, false>);
}

template <bool WARM> router_count_kernel pick_lean(bool wg, bool ww)
{
    return wg ? (ww ? k_router_count_lean<true, true, WARM> : k_router_count_lean<true, false, WARM>)
              : (ww ? k_router_count_lean<false, true, WARM> : k_router_count_lean<false, false, WARM>);
}

} // namespace

cudaError_t launch_router_count(const RouterArgs &ra, const Group2Args &g, int *ticket, unsigned blocks, size_t smem,
                                cudaStream_t s, bool pdl, bool ww, bool signal, int code)
{
    const bool wg = g.warp != 0;
    const router_count_kernel k = code == ROUTE_CODE_WARM   ? pick_lean<true>(wg, ww)
                                  : code == ROUTE_CODE_LEAN ? pick_lean<false>(wg, ww)
                                                            : pick_full(wg, ww);
    return launch_kernel(k, dim3(blocks), 256, smem, s, pdl, ra, g, ticket, signal ? 1 : 0);
}

} // namespace dsv4cuda
