/*
 * params dec_pf=early (fast/cuda): k_dec's routed blocks that are resident while the kernel before
 * them still runs ask for their weights into L2 before their programmatic wait (dec_early, which
 * dec.cu's k_dec calls first). Inline device code only.
 */
#ifndef DSV4MOE_FAST_CUDA_DEC_EARLY_CUH
#define DSV4MOE_FAST_CUDA_DEC_EARLY_CUH

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/* dec_early's bound on its polls of the router's ticket: about 200 us (the routing chain of a
   chunk it serves takes tens) */
#define DEC_EARLY_POLLS 256

/* A relaxed-order read of the router's ticket with acquire semantics at the GPU scope: the ids
   written before the ticket's increment (k_router_count's fence) are visible after it. */
__device__ __forceinline__ int ld_acquire_gpu(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/*
 * params dec_pf=early: a k_dec block of routed slot y at place bx brings the weights it is about
 * to stream into L2 while the kernel before it still runs, before its programmatic wait (k_dec's
 * blocks are scheduled once every block of that kernel has started, and wait in pdl_enter).
 * Gate/up (a.early 1) waits there on k_router_count, the decode step's routing chain: the block
 * polls the router's ticket (taken by each router block after its token's ids, behind a fence),
 * and a block that finds it incomplete at its first poll (it is resident before the routing ends:
 * the launch's first wave) takes slot y's expert as the grouping will name it, the y-th smallest
 * distinct kept id of the chunk (count2_offsets' active list), and asks for its tiles' weights and
 * scales (dec_prefetch); a later block, or one whose poll ran out (DEC_EARLY_POLLS), asks for
 * nothing. Down (a.early 2) waits on k_quant (with quant=fold on the gate/up launch, during its
 * last wave); the grouping is complete by then (the gate/up launch waited for the router), so a
 * block of the first wave (linear index below a.early_blocks) reads slot y's expert from it. L2
 * reads throughout (__ldcg): the values come from other kernels of the step. A hint: it changes
 * no value, and the DRAM reads it starts overlap latency-bound kernels. Every thread calls it; it
 * ends with a barrier, so the caller may reuse fsm (at least 4 (2 + 2 n) bytes; n = ntok early_K
 * <= blockDim.x, which the host ensures).
 */
template <int FMT> __device__ __forceinline__ void dec_early(const FastArgs &a, int y, int bx, uint8_t *fsm)
{
    int *s = (int *)fsm; /* [0] the block prefetches, [1] its expert, then the ids and their first-occurrence flags */
    const int tid = threadIdx.x;
    if (tid == 0) {
        int go = 0, e = -1;
        if (a.early == 2) {
            if ((int)(blockIdx.y * gridDim.x + blockIdx.x) < a.early_blocks && y < __ldcg(a.meta)) {
                e = __ldcg(a.active + y);
                go = __ldcg(a.cnt + e) <= FM_DEC_MAX;
            }
        } else {
            int seen = ld_acquire_gpu(a.early_ticket);
            go = seen < a.early_need;
            for (int i = 0; go && seen < a.early_need && i < DEC_EARLY_POLLS; i++) {
                __nanosleep(256);
                seen = ld_acquire_gpu(a.early_ticket);
            }
            go = go && seen >= a.early_need;
        }
        s[0] = go;
        s[1] = e;
    }
    __syncthreads();
    if (s[0] && a.early == 1) {
        const int n = min(__ldcg(a.ntok) * a.early_K, (int)blockDim.x);
        int *ids = s + 2, *first = ids + n;
        if (tid < n)
            ids[tid] = __ldcg(a.early_ids + tid);
        __syncthreads();
        int v = -1, f = 0;
        if (tid < n) {
            v = ids[tid];
            f = v >= 0 && v < a.E;
            for (int j = 0; j < tid && f; j++)
                f = ids[j] != v;
            first[tid] = f;
        }
        __syncthreads();
        if (f) {
            int rank = 0, rows = 0;
            for (int j = 0; j < n; j++) {
                rank += first[j] && ids[j] < v;
                rows += ids[j] == v;
            }
            if (rank == y && rows <= FM_DEC_MAX)
                s[1] = v;
        }
        __syncthreads();
    }
    if (tid == 0 && s[0] && s[1] >= 0)
        dec_prefetch(a.r.w + (long long)s[1] * a.r.w_stride, a.r.s + (long long)s[1] * a.r.s_stride, FMT, a.K, a.ks, bx);
    __syncthreads(); /* fsm is the caller's again */
}

} // namespace dsv4cuda

#endif
