/*
 * The CUDA backend's registration (fast/backend/backend_reg.h). Every build describes the
 * backend, so that the planner plans cuda ranks anywhere (its capabilities: gemm fp8, graphs, rows
 * on the device, sharded ranks; the architectures it runs and which executors replay in a captured
 * graph on each); a library built with `make cuda` (DSV4_WITH_CUDA) also holds it: creation, the
 * device query, its memory and weight models and its stages.
 */
#include "fast/backend/backend_reg.h"
#include "fast/plan/memory.h"
#include "fast/cuda/cuda_entry.h"

/* Graph capture per architecture: masked validated under capture on sm 90; per_token graph-safe
   with ep 1 on sm 100 and 103 (nothing validated with ep > 1), on sm 120 with any ep. */
static const dsv4_backend_sm CUDA_SMS[] = {
    {.sm = 90, .masked_graph = true},
    {.sm = 100, .per_token_graph = true},
    {.sm = 103, .per_token_graph = true},
    {.sm = 120, .per_token_graph = true, .per_token_graph_ep = true},
};

#ifdef DSV4_WITH_CUDA
/* One rank: the executor layout model, which the CUDA layouts stay within (tests/cuda holds them
   together); a rank of several: its largest stage chunk's layouts. */
static uint64_t cuda_workspace(const dsv4_config *cfg, const dsv4_shard *sh, int64_t tokens, dsv4_executor_kind ex)
{
    if (sh->world <= 1)
        return dsv4_mem_layout_bytes(cfg, sh, tokens, ex);
    dsv4_topology t;
    dsv4_topology_init(&t);
    t.world_size = sh->world, t.tp = sh->tp, t.dp = sh->dp, t.ep = sh->ep, t.rank = sh->rank;
    return dsv4_cuda_stage_workspace_bytes(cfg, &t, tokens);
}
#endif

const dsv4_backend_reg *dsv4_cuda_backend_reg(void)
{
    static const dsv4_backend_reg reg = {
        .name = "cuda",
        .kind = DSV4_BACKEND_CUDA,
        .caps = {.gemm_fp8 = true, .graphs = true, .device_rows = true, .sharding = true, .sms = CUDA_SMS,
                 .n_sms = (int)(sizeof CUDA_SMS / sizeof CUDA_SMS[0])},
#ifdef DSV4_WITH_CUDA
        .available = dsv4_cuda_backend_available,
        .workspace_bytes = cuda_workspace,
        .weight_bytes = dsv4_cuda_weight_bytes,
        .supports = dsv4_cuda_backend_supports,
        .create = dsv4_cuda_backend_create,
        .stages = &dsv4_cuda_backend_stages,
        .device_workspace = dsv4_cuda_device_workspace,
#endif
        .params = "path, tile, tileh, mid, fp8_cut, fp8_scales, dec_fill, pdl, route, combine, dec_b",
    };
    return &reg;
}
