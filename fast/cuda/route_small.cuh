/*
 * The one-launch router of small chunks (fast/cuda/route_small.cu): the router logits, top-K,
 * weights, top-p and the fp8 path's grouping and placement of a chunk of at most
 * DSV4C_LOGITS_SMALL tokens in one kernel, k_route_small (params route=one).
 *
 * Its logits blocks are k_logits_small's with eight tokens a block instead of 32 (route_parts.cuh:
 * a token's sums are the same whichever block holds it, so the same bits); each
 * takes a ticket when its logits are written, and the block that takes the last one routes every
 * token of the chunk, one warp a token (no block-wide barrier between a token's steps, no
 * single-thread section on the default path: the top-K by two warp reductions a round, the
 * weights by K lanes, the reference's sequential sums kept by shuffles), then groups the chunk's
 * slots: ranks within 32-slot pieces by __match_any_sync, each expert's count and first rank per
 * piece by one pass over the pieces, and k_count2's offsets and tile lists (group_parts.cuh). So
 * routing and grouping equal k_router_count's bit for bit, with one launch and one dependent wait
 * fewer than k_logits_small + k_router_count, and without their one-block chain.
 *
 * Its logits blocks prefetch their gate rows into L2 before waiting for the previous kernel (PDL).
 * The ticket is the chunk's counter ST_TICKET (kernels.cuh): zeroed with the other counters before
 * the chunk (the host copy or k_io_in), set back to 0 by the last block.
 */
#ifndef DSV4MOE_FAST_CUDA_ROUTE_SMALL_CUH
#define DSV4MOE_FAST_CUDA_ROUTE_SMALL_CUH

#include <stddef.h>

#include "fast/cuda/group_parts.cuh"
#include "fast/cuda/route_parts.cuh"

namespace dsv4cuda {

#define RS_THREADS 256 /* a k_route_small block: k_logits_small's 8 warps; the routing block's 8 tokens at once */

struct RouteSmallArgs {
    LogitsArgs la; /* the logits and x's quantization (la.ticket unused, la.tgroups the launcher's) */
    RouterArgs ra; /* ra.logits: la.logits (one slice); ra.xq NULL (la quantizes) */
    Group2Args g;  /* g.place set, g.hist NULL */
    int ncap;      /* the chunk's slot capacity (tc * K): the shared-memory layout's */
};

/* Whether a layer and chunk capacity fit k_route_small: K <= 32 (a lane a slot), E <= 1024 (a bit
   per expert in a lane's word), tc <= DSV4C_LOGITS_SMALL, and its shared memory within the default
   48 KB. */
bool route_small_fits(int E, int K, int tc);

/* Dynamic shared memory of a k_route_small launch, bytes. */
size_t route_small_smem(int E, int K, int tc);

/* Enqueues k_route_small on s: the logits blocks (la.lblocks per group of eight of the chunk's
   ncap / K rows; la.tgroups is set here) and qblocks quantizing blocks (one warp per token and
   128-group of x); tg: params logits_tg, 1 or 4; pdl: with programmatic dependent launch. Returns
   the launch's error. */
cudaError_t launch_route_small(RouteSmallArgs a, int qblocks, int tg, cudaStream_t s, bool pdl);

} // namespace dsv4cuda

#endif
