/*
 * The plan as a record (fast/plan/record.h): the names of its kinds, the initial topology and
 * budget, and the accessors of dsv4moe/plan.h that read what the planner (planner.c) stored.
 * Depends on core/ only.
 */
#include <stdlib.h>
#include <string.h>

#include "fast/plan/record.h"

#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

const char *dsv4_router_kind_name(dsv4_router_kind k)
{
    switch (k) {
    case DSV4_ROUTER_LOCAL: return "local";
    case DSV4_ROUTER_EP_ALL_TO_ALL: return "ep_all_to_all";
    case DSV4_ROUTER_EP_LOW_LATENCY: return "ep_low_latency";
    case DSV4_ROUTER_DP_ALL_GATHER: return "dp_all_gather";
    }
    return "unknown";
}

const char *dsv4_executor_kind_name(dsv4_executor_kind k)
{
    switch (k) {
    case DSV4_EXEC_CONTIGUOUS: return "contiguous";
    case DSV4_EXEC_MASKED: return "masked";
    case DSV4_EXEC_PER_TOKEN: return "per_token";
    }
    return "unknown";
}

const char *dsv4_role_name(dsv4_role r)
{
    switch (r) {
    case DSV4_ROLE_PREFILL: return "prefill";
    case DSV4_ROLE_DECODE: return "decode";
    case DSV4_ROLE_MIXED: return "mixed";
    }
    return "unknown";
}

void dsv4_topology_init(dsv4_topology *topo)
{
    if (!topo)
        return;
    memset(topo, 0, sizeof *topo);
    topo->struct_size = (uint32_t)sizeof *topo;
    topo->world_size = topo->tp = topo->dp = topo->ep = 1;
    topo->rank = 0;
    topo->role = DSV4_ROLE_PREFILL;
    topo->backend = DSV4_BACKEND_REF;
    topo->sm = 90;
    topo->cuda_graph = false;
    topo->n_buckets = 0;
    topo->max_tokens_per_rank = 4096;
    topo->chunk_tokens = 0;
    topo->host_threads = 2;
    topo->dispatch = DSV4_DISPATCH_AUTO;
    topo->executor = DSV4_EXECUTOR_AUTO;
}

void dsv4_budget_init(dsv4_budget *budget)
{
    if (!budget)
        return;
    memset(budget, 0, sizeof *budget);
    budget->struct_size = (uint32_t)sizeof *budget;
    budget->device_bytes = 80 * GIB;
    budget->reserve_mb = 1024;
    budget->taken_bytes = 0;
}

uint64_t dsv4_budget_reserve(const dsv4_budget *b)
{
    uint64_t r = b->reserve_mb > UINT64_MAX / MIB ? UINT64_MAX : b->reserve_mb * MIB;
    if (r < 2 * GIB)
        r = 2 * GIB;
    uint64_t pct = b->device_bytes / 20;
    return pct > r ? pct : r;
}

uint64_t dsv4_budget_available(const dsv4_budget *budget)
{
    if (!budget)
        return 0;
    uint64_t r = dsv4_budget_reserve(budget);
    uint64_t used = budget->taken_bytes > UINT64_MAX - r ? UINT64_MAX : budget->taken_bytes + r;
    return budget->device_bytes > used ? budget->device_bytes - used : 0;
}

void dsv4_plan_free(dsv4_plan *plan)
{
    if (!plan)
        return;
    free(plan->explain.s);
    free(plan);
}

const dsv4_config *dsv4_plan_config(const dsv4_plan *plan) { return plan ? &plan->cfg : NULL; }
const dsv4_topology *dsv4_plan_topology(const dsv4_plan *plan) { return plan ? &plan->topo : NULL; }
const dsv4_shard *dsv4_plan_shard(const dsv4_plan *plan) { return plan ? &plan->shard : NULL; }
dsv4_router_kind dsv4_plan_router(const dsv4_plan *plan) { return plan ? plan->shard.router : DSV4_ROUTER_LOCAL; }
dsv4_gemm_mode dsv4_plan_gemm(const dsv4_plan *plan) { return plan ? plan->shard.gemm : DSV4_GEMM_EXACT; }
int64_t dsv4_plan_chunk_tokens(const dsv4_plan *plan) { return plan ? plan->chunk : 0; }
int64_t dsv4_plan_expert_first(const dsv4_plan *plan) { return plan ? plan->shard.e_first : 0; }
int64_t dsv4_plan_expert_count(const dsv4_plan *plan) { return plan ? plan->shard.e_count : 0; }
int64_t dsv4_plan_inter_first(const dsv4_plan *plan) { return plan ? plan->shard.i_first : 0; }
int64_t dsv4_plan_inter_count(const dsv4_plan *plan) { return plan ? plan->shard.i_count : 0; }
uint64_t dsv4_plan_budget_available(const dsv4_plan *plan) { return plan ? plan->available : 0; }
uint64_t dsv4_plan_workspace_max(const dsv4_plan *plan) { return plan ? plan->workspace_max : 0; }
uint64_t dsv4_plan_weight_bytes(const dsv4_plan *plan) { return plan ? plan->weight_bytes : 0; }
const char *dsv4_plan_explain(const dsv4_plan *plan) { return plan && plan->explain.s ? plan->explain.s : ""; }

int64_t dsv4_plan_chunks(const dsv4_plan *plan, int64_t max_tokens)
{
    if (!plan || max_tokens <= 0)
        return 0;
    return (max_tokens - 1) / plan->chunk + 1;
}

int64_t dsv4_plan_largest_bucket(const dsv4_plan *p)
{
    return p->topo.cuda_graph && p->topo.n_buckets > 0 ? p->topo.buckets[p->topo.n_buckets - 1] : 0;
}

int64_t dsv4_plan_bucket_for(const dsv4_plan *p, int64_t tokens)
{
    for (int i = 0; p->topo.cuda_graph && i < p->topo.n_buckets; i++)
        if (p->topo.buckets[i] >= tokens)
            return p->topo.buckets[i];
    return dsv4_plan_largest_bucket(p);
}

bool dsv4_plan_can_replay(const dsv4_plan *plan, int64_t max_tokens)
{
    return plan && plan->topo.cuda_graph && max_tokens >= 0 && max_tokens <= dsv4_plan_largest_bucket(plan);
}

dsv4_executor_kind dsv4_plan_eager_exec_at(const dsv4_plan *p, int64_t tokens)
{
    if (p->eager_masked && tokens <= p->masked_limit)
        return DSV4_EXEC_MASKED;
    return p->eager_exec;
}

dsv4_executor_kind dsv4_plan_executor(const dsv4_plan *plan, int64_t tokens, bool graph_replay)
{
    if (!plan)
        return DSV4_EXEC_CONTIGUOUS;
    if (graph_replay && dsv4_plan_can_replay(plan, tokens))
        return plan->graph_exec;
    return dsv4_plan_eager_exec_at(plan, tokens);
}
