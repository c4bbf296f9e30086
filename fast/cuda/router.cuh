/*
 * The CUDA backend's router and device-side grouping (fast/cuda): k_router (scores, top-K or
 * hash lookup, weights, act_quant of x; one block per token; its body route_block,
 * route_parts.cuh, is also k_router_count's, router_count.cu), k_count
 * (counts per expert, offsets, the active list and the exact path's tile schedule) and k_place
 * (the stable placement of the kept slots). Both paths route with k_router; k_count is the exact
 * path's grouping (the fp8 path's is k_count2, mma_group.cuh, which leaves large chunks'
 * placement to k_place). Included once, by cuda.cu, after kernels.cuh.
 */
#ifndef DSV4MOE_FAST_CUDA_ROUTER_CUH
#define DSV4MOE_FAST_CUDA_ROUTER_CUH

#include "fast/cuda/route_parts.cuh"

namespace dsv4cuda {

/* ---------------- router + activation quantization (one block per token) ---------------- */


/* One block per token. */
__global__ void k_router(RouterArgs a)
{
    pdl_enter();
    route_block(a, blockIdx.x);
}

/* ---------------- grouping on the device ---------------- */

/* Counts per expert, offsets (compact and 128-aligned), the active list and the tile schedule. */
__global__ void k_count(GroupArgs a)
{
    extern __shared__ int cnt[];
    const int E = a.E, n = *a.ntok * a.K;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int e = a.ids[i];
        if (e < 0 || e > E)
            atomicAdd(&a.stats[ST_BADID], 1ull);
        else if (e < E)
            atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int so = 0, po = 0, na = 0, nt = 0;
        for (int e = 0; e < E; e++) {
            int c = cnt[e];
            a.cnt[e] = c;
            a.slot_off[e] = so;
            a.pad_off[e] = po;
            if (c > 0)
                a.active[na++] = e;
            if (c > a.small)
                for (int r0 = 0; r0 < c; r0 += a.tile_m) {
                    a.tile_e[nt] = e;
                    a.tile_r0[nt] = r0;
                    nt++;
                }
            so += c;
            po += (c + 127) / 128 * 128;
        }
        a.slot_off[E] = so;
        if (po > a.rows) { /* cannot happen with the layout's bound; never write past it */
            atomicAdd(&a.stats[ST_BADID], 1ull);
            na = nt = so = 0;
            for (int e = 0; e < E; e++)
                a.cnt[e] = 0;
        }
        a.meta[0] = na;
        a.meta[1] = nt;
        a.meta[2] = so;
        a.stats[ST_ACTIVE] += (unsigned long long)na;
        a.stats[ST_EMPTY] += (unsigned long long)(E - na);
    }
}

/* Stable placement: block e writes its slots in slot order (tokens ascending). */
__global__ void k_place(GroupArgs a)
{
    pdl_enter();
    const int e = blockIdx.x;
    const int c = a.cnt[e];
    if (c == 0)
        return;
    const int n = *a.ntok * a.K, base = a.slot_off[e], pbase = a.pad_off[e];
    __shared__ int wtot[32];
    __shared__ int running;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (threadIdx.x == 0)
        running = 0;
    __syncthreads();
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        int i = c0 + threadIdx.x;
        bool f = i < n && a.ids[i] == e;
        unsigned m = __ballot_sync(0xFFFFFFFFu, f);
        if (lane == 0)
            wtot[warp] = __popc(m);
        __syncthreads();
        int woff = 0, tot = 0;
        for (int q = 0; q < nw; q++) {
            woff += q < warp ? wtot[q] : 0;
            tot += wtot[q];
        }
        if (f) {
            int pos = running + woff + __popc(m & ((1u << lane) - 1u));
            int q = base + pos;
            a.slot_tok[q] = i / a.K;
            a.slot_w[q] = a.w[i];
            a.slot_row[q] = pbase + pos;
            a.rowmap[i] = pbase + pos;
            if (a.slot_e)
                a.slot_e[q] = e;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            running += tot;
        __syncthreads();
    }
}

} // namespace dsv4cuda

#endif
