/*
 * dsv4moe: the backend interface. A backend executes a plan on one rank:
 * created from a config, a checkpoint and the plan (which decides the
 * layout; the backend only executes it), it runs forwards, reports its
 * workspace and statistics, and is freed. Implementations: "ref" (the
 * deterministic reference), "cpu" (OpenBLAS) and, in a library built with
 * DSV4_WITH_CUDA (`make cuda`: build/cuda/libdsv4moe.a), "cuda" (one sm_90 GPU,
 * docs/cuda.md). A build without CUDA answers DSV4_ERR_UNSUPPORTED for cuda.
 */
#ifndef DSV4MOE_BACKEND_H
#define DSV4MOE_BACKEND_H

#include <stdbool.h>
#include <stdint.h>
#include "config.h"
#include "plan.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_backend dsv4_backend;

/* Outputs of one forward; the caller owns the buffers. y is required, the others may be NULL. */
typedef struct dsv4_forward_out {
    uint16_t *y;          /* bf16 [T, H] */
    int32_t *topk_ids;    /* [T, K] after pruning (pruned slots E) */
    float *topk_weights;  /* [T, K] after pruning (pruned slots 0) */
    int32_t *kept_counts; /* [T] */
} dsv4_forward_out;

typedef struct dsv4_backend_stats {
    uint64_t forwards;
    uint64_t tokens;
    uint64_t launches;          /* expert GEMM groups executed */
    uint64_t empty_skips;       /* experts or chunks with 0 rows that launched nothing */
    uint64_t nonfinite_rows;
    uint64_t routed_g_clamped, routed_u_clamped, shared_g_clamped, shared_u_clamped;
    uint64_t workspace_peak;    /* measured through the accounting allocator */
    uint64_t workspace_planned; /* dsv4_plan_workspace_max of the plan */
    /* Added for the cuda backend (0 elsewhere): */
    uint64_t graph_replays;       /* forwards that replayed a captured CUDA graph */
    uint64_t workspace_allocated; /* bytes of the one workspace allocated at creation */
    uint64_t device_allocated;    /* device memory taken at creation (weights + workspace),
                                     measured with cudaMemGetInfo before and after */
    uint64_t gemm_fp8;            /* 1 when large expert groups run on FP8 tensor cores (gemm fp8,
                                     SPEC.md section 9), 0 for the exact mode and for ref and cpu */
    uint64_t fp8_exact_experts;   /* gemm fp8: experts (the shared one included) kept on the exact
                                     kernels because an fp4 128-group's scales could not convert to
                                     e4m3 exactly (include/dsv4moe/formats.h, DSV4_FP4_TO_FP8_SPREAD) */
} dsv4_backend_stats;

/*
 * Creates the backend named by plan's topology (ref, cpu or cuda). The config must
 * be the plan's; the checkpoint must outlive the backend (cuda copies the weights to
 * the device at creation). threads >= 1. cuda: topology.cuda_graph on captures one
 * graph per bucket on first use and replays it for every T up to that bucket
 * (bit-identical to an eager forward); creating two plans (graph on and off) gives both.
 */
dsv4_status dsv4_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ckpt, int threads,
                                dsv4_backend **out, dsv4_error *err);
/* Whether this build holds the backend (cuda only in a CUDA build), and the list as text. */
bool dsv4_backend_available(dsv4_backend_kind kind);
const char *dsv4_backends_available(void);

/* NULL is a no-op. */
void dsv4_backend_free(dsv4_backend *backend);
const char *dsv4_backend_name(const dsv4_backend *backend);
/* One forward of T tokens on this rank (T >= 0, at most the plan's max_tokens_per_rank). */
dsv4_status dsv4_backend_forward(dsv4_backend *backend, int64_t tokens, const uint16_t *x, const int32_t *input_ids,
                                 dsv4_forward_out *out, dsv4_error *err);
dsv4_backend_stats dsv4_backend_get_stats(const dsv4_backend *backend);

/*
 * One forward on device-resident tensors, as a serving engine holds them (cuda backend only;
 * ref and cpu answer DSV4_ERR_UNSUPPORTED). x is bf16 [T, H], input_ids int32 [T] (hash layers;
 * may be NULL otherwise), and out's pointers (y required, the others optional, as in
 * dsv4_forward_out) are all device memory of the backend's GPU; nothing travels through the
 * host but a few counters. Synchronous: it returns when the outputs are written. Hash-layer ids
 * are checked on the device: an id outside [0, vocab_size) or a tid2eid entry outside [0, E)
 * gives DSV4_ERR_RANGE naming the first such token, and the outputs are then unspecified.
 */
dsv4_status dsv4_backend_forward_device(dsv4_backend *backend, int64_t tokens, const void *x, const int32_t *input_ids,
                                        const dsv4_forward_out *out, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
