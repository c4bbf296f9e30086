/*
 * Internal: the CUDA backend's entry points that its registration (fast/cuda/reg.c) lists, in C
 * (not installed). Defined in cuda.cu, registry.cu and stages.cu, which a library built with
 * `make cuda` holds; reg.c compiles in every build and names them only there.
 */
#ifndef DSV4MOE_FAST_CUDA_ENTRY_H
#define DSV4MOE_FAST_CUDA_ENTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fast/backend/backend_impl.h"
#include "fast/plan/record.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates an instance of the plan (cuda.cu). */
dsv4_status dsv4_cuda_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ck,
                                     const dsv4_backend_options *opt, void **impl, const dsv4_backend_vtable **vt,
                                     dsv4_error *err);
/* Whether this machine has a device (registry.cu). */
bool dsv4_cuda_backend_available(char *why, size_t n);
/* Whether the kernels run the shard: an inter range of a multiple of 32 rows (registry.cu). */
bool dsv4_cuda_backend_supports(const dsv4_config *cfg, const dsv4_shard *shard, char *why, size_t n);
/* The device workspace of a backend of the plan for calls of up to max_tokens tokens (cuda.cu). */
uint64_t dsv4_cuda_device_workspace(const dsv4_plan *plan, int64_t max_tokens);
/* The workspace of the largest stage chunk of `tokens` tokens of a rank of a world > 1 (cuda.cu). */
uint64_t dsv4_cuda_stage_workspace_bytes(const dsv4_config *cfg, const dsv4_topology *topo, int64_t tokens);
/* The device bytes of the weights a backend of the shard binds (cuda.cu, upload.cuh). */
uint64_t dsv4_cuda_weight_bytes(const dsv4_config *cfg, const dsv4_shard *shard);
/* The stages of a rank of a sharded plan (stages.cu). */
extern const dsv4_backend_stages dsv4_cuda_backend_stages;

#ifdef __cplusplus
}
#endif
#endif
