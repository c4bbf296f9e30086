/*
 * k_router_count (fast/cuda/router_count.cu): the fp8 path's router and, for a chunk whose slots
 * one block places (at most 1024), its grouping in the same launch (route_parts.cuh's route_block,
 * group_parts.cuh's count2_block).
 */
#ifndef DSV4MOE_FAST_CUDA_ROUTER_COUNT_CUH
#define DSV4MOE_FAST_CUDA_ROUTER_COUNT_CUH

#include <stddef.h>

#include "fast/cuda/group_parts.cuh"
#include "fast/cuda/route_parts.cuh"

namespace dsv4cuda {

/* Enqueues k_router_count on s: one block of 256 threads per token of the chunk (blocks), smem
   bytes of dynamic shared memory (the router's (H + 2 E + 4 K) floats, at least count2_block's
   2 E ints); ticket: the chunk's block counter, zeroed before (k_logits_small); pdl: with
   programmatic dependent launch; ww: the weights on the selecting warp (params weights=warp,
   route_block); signal: a chunk of one token takes the ticket too, after its ids (params
   dec_pf=early: k_dec's gate/up blocks poll it, dec_early; a larger chunk's blocks always take
   it); code: params route_code (ROUTE_CODE_*): the whole kernel, the one compiled for the decode
   configuration only (lean), or that one with a dry pass before the programmatic wait (warm; the
   k_logits_small before it then releases its dependents before its own wait, LogitsArgs.dep_first);
   lean and warm where route_lean_fits. Returns the launch's error, which is also the runtime's last
   error. */
enum { ROUTE_CODE_FULL = 0, ROUTE_CODE_LEAN = 1, ROUTE_CODE_WARM = 2 };
cudaError_t launch_router_count(const RouterArgs &ra, const Group2Args &g, int *ticket, unsigned blocks, size_t smem,
                                cudaStream_t s, bool pdl, bool ww, bool signal, int code = ROUTE_CODE_FULL);

/* Whether route_block<LEAN> and count2_block<LEAN> (params route_code=lean) route and group a chunk
   of at most tc rows whose logits k_logits_small computes (params route=fused: tc at most
   DSV4C_LOGITS_SMALL, its logits one slice, x quantized there): no hash table, no top-p, scores
   other than the softmax (score 2), at most 256 experts, a placed chunk without slice counts. */
inline bool route_lean_fits(const RouterArgs &ra, const Group2Args &g, long long tc)
{
    return tc <= DSV4C_LOGITS_SMALL && !ra.hash && !ra.top_p_on && ra.score != 2 && ra.E <= 256 && g.place && !g.hist;
}

} // namespace dsv4cuda

#endif
