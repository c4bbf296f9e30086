/*
 * dsv4moe: the production planner.
 *
 * dsv4_plan_create() picks the execution strategy of one rank for a layer
 * config, a topology and a memory budget, or refuses at creation with a
 * message naming the settings that conflict and what would work. A plan that
 * exists can run every step the topology allows: its workspace is bounded for
 * every T up to max_tokens_per_rank (long prompts are chunked), and its steps
 * are symmetric across ranks by construction (see docs/planner.md).
 *
 * The planner knows no kernels: it reasons about layouts, collectives and
 * bytes. Backends execute the plan.
 */
#ifndef DSV4MOE_PLAN_H
#define DSV4MOE_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/config.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_role {
    DSV4_ROLE_PREFILL = 0,
    DSV4_ROLE_DECODE = 1,
    DSV4_ROLE_MIXED = 2 /* prefill and decode on one instance (PD fusion) */
} dsv4_role;

typedef enum dsv4_backend_kind {
    DSV4_BACKEND_REF = 0, /* the reference, for the simulated distributed driver */
    DSV4_BACKEND_CPU = 1,
    DSV4_BACKEND_CUDA = 2
} dsv4_backend_kind;

/* What the topology asks for; AUTO lets the planner choose. */
typedef enum dsv4_dispatch_req {
    DSV4_DISPATCH_AUTO = 0,
    DSV4_DISPATCH_ALL_GATHER = 1,  /* data-parallel all-gather of tokens */
    DSV4_DISPATCH_ALL_TO_ALL = 2,  /* expert-parallel all-to-all, normal mode */
    DSV4_DISPATCH_LOW_LATENCY = 3  /* expert-parallel all-to-all, low-latency (decode only) */
} dsv4_dispatch_req;

typedef enum dsv4_executor_req {
    DSV4_EXECUTOR_AUTO = 0,
    DSV4_EXECUTOR_CONTIGUOUS = 1, /* token-slots permuted into per-expert groups aligned to 128 rows */
    DSV4_EXECUTOR_MASKED = 2,     /* [E_local, align(T, 128)] with per-expert counts: static shapes */
    DSV4_EXECUTOR_PER_TOKEN = 3   /* one token-slot at a time (decode, tiny T) */
} dsv4_executor_req;

#define DSV4_MAX_BUCKETS 16

typedef struct dsv4_topology {
    uint32_t struct_size;          /* sizeof(dsv4_topology), set by init */
    int world_size, tp, dp, ep, rank;
    dsv4_role role;
    dsv4_backend_kind backend;
    int sm;                        /* 90, 100, 103 or 120 (CUDA backend) */
    bool cuda_graph;
    int n_buckets;                 /* capture buckets, tokens per rank, ascending */
    int64_t buckets[DSV4_MAX_BUCKETS];
    int64_t max_tokens_per_rank;
    int64_t chunk_tokens;          /* 0: the planner chooses */
    int host_threads;              /* CPU backend workers (their scratch is workspace); the backend
                                      uses at most this many; 0 counts as 1 */
    dsv4_dispatch_req dispatch;
    dsv4_executor_req executor;
} dsv4_topology;

/* One rank, prefill role, ref backend, sm 90, graphs off,
   max 4096 tokens, planner-chosen chunking and strategies. NULL is a no-op. */
DSV4_API void dsv4_topology_init(dsv4_topology *topo);

typedef struct dsv4_budget {
    uint32_t struct_size;  /* sizeof(dsv4_budget), set by init */
    uint64_t device_bytes; /* memory of the device (or of the host, CPU backend) */
    uint64_t reserve_mb;   /* the runtime reserve asked for; the reserve is
                              max(reserve_mb MiB, 2 GiB, 5 % of device_bytes), as rtp-llm computes it */
    uint64_t taken_bytes;  /* already used by weights, KV cache, ... */
} dsv4_budget;

/* 80 GiB device, reserve_mb 1024, nothing taken. NULL is a no-op. */
DSV4_API void dsv4_budget_init(dsv4_budget *budget);
/* Bytes the layer may use for its workspace: device - taken - reserve (0 if negative), with
   reserve = max(reserve_mb MiB, 2 GiB, device_bytes / 20). 0 for NULL. */
DSV4_API uint64_t dsv4_budget_available(const dsv4_budget *budget);

typedef enum dsv4_router_kind {
    DSV4_ROUTER_LOCAL = 0,         /* every expert on this rank */
    DSV4_ROUTER_EP_ALL_TO_ALL = 1, /* token-slots to the ranks holding their experts, and back */
    DSV4_ROUTER_EP_LOW_LATENCY = 2,
    DSV4_ROUTER_DP_ALL_GATHER = 3  /* tokens of all dp ranks gathered, experts sharded by tp */
} dsv4_router_kind;

typedef enum dsv4_executor_kind {
    DSV4_EXEC_CONTIGUOUS = 0,
    DSV4_EXEC_MASKED = 1,
    DSV4_EXEC_PER_TOKEN = 2
} dsv4_executor_kind;

DSV4_API const char *dsv4_router_kind_name(dsv4_router_kind k);
DSV4_API const char *dsv4_executor_kind_name(dsv4_executor_kind k);
DSV4_API const char *dsv4_role_name(dsv4_role r);
DSV4_API const char *dsv4_backend_kind_name(dsv4_backend_kind b);

typedef struct dsv4_plan dsv4_plan;

/*
 * Plans rank topo->rank. Validates cfg first. Refusals are DSV4_ERR_REFUSED
 * (or DSV4_ERR_CONFIG for the config itself) with a message that names the
 * conflicting settings by their field names and says what would work.
 */
DSV4_API dsv4_status dsv4_plan_create(const dsv4_config *cfg, const dsv4_topology *topo, const dsv4_budget *budget,
                                      dsv4_plan **out, dsv4_error *err);
/* NULL is a no-op. */
DSV4_API void dsv4_plan_free(dsv4_plan *plan);

DSV4_API const dsv4_config *dsv4_plan_config(const dsv4_plan *plan);
DSV4_API const dsv4_topology *dsv4_plan_topology(const dsv4_plan *plan);
DSV4_API dsv4_router_kind dsv4_plan_router(const dsv4_plan *plan);
/* The executor of a step whose largest rank holds `tokens`: the graph executor when graph_replay
   and the step can replay, else the eager one (a step that cannot replay runs eager). */
DSV4_API dsv4_executor_kind dsv4_plan_executor(const dsv4_plan *plan, int64_t tokens, bool graph_replay);
/* Tokens per chunk (a multiple of 128, or max_tokens_per_rank when smaller). */
DSV4_API int64_t dsv4_plan_chunk_tokens(const dsv4_plan *plan);
/* The numerics mode the fast path runs (SPEC.md section 9): the config's gemm, with auto resolved
   to fp8 on backend cuda for fp8/fp4 weights with quantized activations and dims multiples of
   128, exact otherwise. gemm fp8 on any other backend or format is refused at creation. */
DSV4_API dsv4_gemm_mode dsv4_plan_gemm(const dsv4_plan *plan);
/* Chunks of a step whose largest rank holds `max_tokens` (0 for 0 tokens). */
DSV4_API int64_t dsv4_plan_chunks(const dsv4_plan *plan, int64_t max_tokens);
/* This rank's experts: [first, first + count). */
DSV4_API int64_t dsv4_plan_expert_first(const dsv4_plan *plan);
DSV4_API int64_t dsv4_plan_expert_count(const dsv4_plan *plan);
/* This rank's share of moe_inter_dim under tp: [first, first + count). */
DSV4_API int64_t dsv4_plan_inter_first(const dsv4_plan *plan);
DSV4_API int64_t dsv4_plan_inter_count(const dsv4_plan *plan);
/* Whether a step with `max_tokens` (the world's largest) may replay a graph: a bucket holds it. */
DSV4_API bool dsv4_plan_can_replay(const dsv4_plan *plan, int64_t max_tokens);

/* Workspace bytes of a step whose largest rank holds `tokens` (chunked as planned): eager, the
   chunk workspace at min(tokens, chunk); replayed, the graph executor's at the smallest bucket
   holding `tokens`. Both include the step's metadata collective (64 bytes per world rank, the
   whole workspace of a 0-token step). The memory model is in docs/planner.md. */
DSV4_API uint64_t dsv4_plan_workspace_bytes(const dsv4_plan *plan, int64_t tokens, bool graph_replay);
/* The maximum over every T in [0, max_tokens_per_rank] and both step kinds; within the budget. */
DSV4_API uint64_t dsv4_plan_workspace_max(const dsv4_plan *plan);
DSV4_API uint64_t dsv4_plan_budget_available(const dsv4_plan *plan);
/* Device bytes of the weights a backend of this plan binds on this rank: the router's tensors and
   the rank's shard of the experts (its range under ep, its rows of moe_inter_dim under tp), by the
   backend's model (cuda: dsv4_backend_stats.weights_allocated stays within it). 0 for a backend
   that reads the checkpoint in host memory (ref, cpu) or that this build lacks. Not part of the
   workspace or of the budget's available bytes: the caller counts them in taken_bytes. */
DSV4_API uint64_t dsv4_plan_weight_bytes(const dsv4_plan *plan);

/* A readable explanation of every choice, one per line (owned by the plan). */
DSV4_API const char *dsv4_plan_explain(const dsv4_plan *plan);

#ifdef __cplusplus
}
#endif
#endif
