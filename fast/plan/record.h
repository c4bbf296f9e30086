/*
 * Internal: the plan as a record (not installed). A dsv4_plan holds every figure the planner
 * (fast/plan/planner.c) computed for one rank: the topology it was asked for, the rank's shard
 * (its experts, its rows of moe_inter_dim, whether the layer is sharded), the strategies, the
 * chunk, the resolved numerics mode, the largest workspace and the weight bytes. Backends, the
 * multi-rank driver and the harness read these figures (the public accessors of
 * dsv4moe/plan.h, or dsv4_plan_shard here) and never recompute them. This file and record.c
 * depend on core/ only.
 */
#ifndef DSV4MOE_FAST_PLAN_RECORD_H
#define DSV4MOE_FAST_PLAN_RECORD_H

#include <stdbool.h>
#include <stdint.h>

#include "dsv4moe/plan.h"
#include "core/strbuf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one rank holds and how it computes: the part of a plan a backend's memory and weight
   models read (fast/backend/backend_reg.h). */
typedef struct dsv4_shard {
    int world, tp, dp, ep, rank;
    int host_threads;        /* the topology's, 0 counting as 1 */
    dsv4_router_kind router; /* how tokens reach the rank's experts */
    int64_t e_first, e_count; /* the rank's routed experts */
    int64_t i_first, i_count; /* the rank's rows of moe_inter_dim */
    dsv4_gemm_mode gemm;      /* exact or fp8 (resolved) */
    bool sharded;             /* experts or inter rows split over ranks, or a router other than local */
} dsv4_shard;

struct dsv4_plan {
    dsv4_config cfg;
    dsv4_topology topo;
    dsv4_budget budget;
    uint64_t available;             /* dsv4_budget_available(&budget) */
    dsv4_shard shard;
    dsv4_executor_kind eager_exec;  /* eager steps (beyond the masked limit when masked is requested) */
    bool eager_masked;              /* explicit masked: eager steps with T <= masked_limit use masked */
    int64_t masked_limit;
    dsv4_executor_kind graph_exec;  /* graph replays (cuda_graph only) */
    int64_t chunk;
    uint64_t workspace_max;         /* over every step the plan allows */
    uint64_t weight_bytes;          /* the backend's weight model for the shard */
    /* The memory model the planner composed for this plan's backend (planner.c), kept so that the
       workspace of any step can be answered: the backend's registration, opaque here. */
    const void *backend_reg;
    dsv4_strbuf explain; /* dsv4_plan_explain's text, a line an explainf */
};

/* The runtime reserve, as rtp-llm computes it: max(reserve_mb MiB, 2 GiB, 5 % of the device). */
uint64_t dsv4_budget_reserve(const dsv4_budget *budget);

/* The rank's shard; NULL for NULL. */
const dsv4_shard *dsv4_plan_shard(const dsv4_plan *plan);

/* The smallest of the capture buckets holding `tokens` (the largest when none does); 0 without
   graphs. */
int64_t dsv4_plan_bucket_for(const dsv4_plan *plan, int64_t tokens);
/* The largest capture bucket, 0 without graphs. */
int64_t dsv4_plan_largest_bucket(const dsv4_plan *plan);
/* The eager executor of a step whose largest rank holds `tokens`. */
dsv4_executor_kind dsv4_plan_eager_exec_at(const dsv4_plan *plan, int64_t tokens);

#ifdef __cplusplus
}
#endif
#endif
