/*
 * k_logits_small (fast/cuda/logits_small.cu): the router logits of a chunk of up to
 * DSV4C_LOGITS_SMALL live tokens as a GEMV over the whole GPU, and the activation quantization of
 * x in its blocks past the logits (route_parts.cuh holds the body, shared with k_route_small).
 */
#ifndef DSV4MOE_FAST_CUDA_LOGITS_SMALL_CUH
#define DSV4MOE_FAST_CUDA_LOGITS_SMALL_CUH

#include "fast/cuda/route_parts.cuh"

namespace dsv4cuda {

/* Enqueues k_logits_small on s: `blocks` blocks of 256 threads (la.lblocks for the logits, then
   the quantizing ones); tg: tokens whose x a lane loads together, 1 or 4 (params logits_tg); loop:
   the tokens in a loop, not unrolled (the default; params logits_loop=off unrolls it; the same
   logits); pdl: with programmatic dependent launch. Block 0 zeroes la.ticket when set (the fused
   router's). Returns the launch's error, which is also the runtime's last error. */
cudaError_t launch_logits_small(const LogitsArgs &la, int tg, bool loop, unsigned blocks, cudaStream_t s, bool pdl);

} // namespace dsv4cuda

#endif
