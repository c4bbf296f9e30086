/*
 * Internal: the memory models the planner composes (docs/planner.md), not installed. The executor
 * layout model is the workspace of a production layout of the layer (permuted or masked rows,
 * the router's buffers, the dispatch): the planner's model for backends that bring none of their
 * own (ref) and the one the CUDA backend's layouts stay within on a single rank. The driver's
 * buffers are what the multi-rank driver (fast/multirank) holds next to a backend's stages on a rank
 * of several. Both are pure functions of the layer and the rank's shard (fast/plan/record.h).
 */
#ifndef DSV4MOE_FAST_PLAN_MEMORY_H
#define DSV4MOE_FAST_PLAN_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

#include "dsv4moe/config.h"
#include "fast/plan/record.h"

static inline uint64_t dsv4_sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static inline uint64_t dsv4_sat_mul(uint64_t a, uint64_t b) { return a && b > UINT64_MAX / a ? UINT64_MAX : a * b; }

/* Whether activations are quantized before the routed GEMMs (fp8/fp4 weights, act_quant set). */
bool dsv4_mem_acts_quantized(const dsv4_config *c);
/* Bytes of one executor row for `il` rows of moe_inter_dim in numerics mode `gemm`. */
uint64_t dsv4_mem_row_bytes(const dsv4_config *c, int64_t il, dsv4_gemm_mode gemm);
/* Tokens reaching the rank and token-slots for a chunk of tc tokens. */
void dsv4_mem_chunk_shape(const dsv4_config *c, const dsv4_shard *s, int64_t tc, uint64_t *tg, uint64_t *slots);
/* The executor layout model: one chunk of tc > 0 tokens with executor ex. */
uint64_t dsv4_mem_layout_bytes(const dsv4_config *c, const dsv4_shard *s, int64_t tc, dsv4_executor_kind ex);
/* The multi-rank driver's buffers for a chunk of tc tokens on a rank of a world > 1; device_rows:
   the backend keeps the rows on its device (the stages name a device). */
uint64_t dsv4_mem_driver_bytes(const dsv4_config *c, const dsv4_shard *s, int64_t tc, bool device_rows);

#endif
