/*
 * dsv4moe: the distributed driver. Runs one step of the layer over ranks
 * simulated as threads of one process (the `sim` communicator; for the cuda
 * backend the device sim, comm_devsim.h, with the rows as device buffers),
 * each rank composing the stages of its plan's backend, following each
 * rank's plan:
 *
 *   1. one fixed-size metadata all_gather over the world, issued by every
 *      rank in eager and graph steps alike: it agrees on the step's max T
 *      and whether it replays a graph (only if every rank can);
 *   2. the same number of chunks on every rank (dsv4_plan_chunks of the max
 *      T); each chunk issues its collectives even when the rank has 0 rows,
 *      and a 0-row chunk computes nothing;
 *   3. ep > 1: token-slots go to the ranks holding their experts and the
 *      expert outputs come back through all_to_allv (counts, rows, expert
 *      ids, weights; outputs); the home rank accumulates them in ascending
 *      expert id, so the result is bit-identical to the single-rank
 *      reference;
 *   4. tp > 1: each rank computes its share of moe_inter_dim for every
 *      token-slot, and one all_reduce per chunk sums the partial down
 *      projections (ascending rank order, identical on every rank) before
 *      they are rounded and combined. TP ranks hold the same tokens.
 */
#ifndef DSV4MOE_DIST_H
#define DSV4MOE_DIST_H

#include <stdbool.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/comm.h"
#include "dsv4moe/config.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_dist_rank {
    /* inputs */
    int64_t tokens;
    const uint16_t *x;          /* bf16 [tokens, H] */
    const int32_t *input_ids;   /* [tokens]; required on hash layers */
    bool can_replay;            /* this rank could replay a captured graph this step */
    /* outputs (caller's buffers; ids and weights may be NULL) */
    uint16_t *y;                /* bf16 [tokens, H] */
    int32_t *topk_ids;          /* [tokens, K], pruned slots E */
    float *topk_weights;        /* [tokens, K] */
    /* filled by the driver */
    bool replayed;              /* the step ran as a graph replay */
    int64_t graphs_held;        /* CUDA graphs the rank's backend holds (cuda: captured when the rank can replay) */
    uint64_t graph_replays;     /* stage calls the rank's backend ran as graph replays (cuda, a replayed step) */
    int64_t step_max_tokens;    /* the world's largest T this step */
    int64_t chunks;
    uint64_t workspace_planned; /* the plan's workspace for this step (dsv4_plan_workspace_bytes) */
    uint64_t workspace_peak;    /* the driver's buffers at their peak (through the accounting allocator,
                                   and its device buffers where the rows are on a device)
                                   plus the backend's measured workspace peak (the cpu backend
                                   measures all of its workspace; the reference's own buffers and
                                   fp32 copies of weights are not counted) */
    uint64_t weights_planned;   /* the device bytes of the weights the rank's backend binds by the plan's
                                   model (dsv4_plan_weight_bytes; 0 for ref and cpu) */
    uint64_t weights_bound;     /* what the rank's backend allocated for them (its stats' weights_allocated) */
    dsv4_status status;         /* this rank's result */
    dsv4_error error;
    dsv4_coll_record *trace;    /* this rank's collectives (free with dsv4_dist_rank_release) */
    size_t trace_len;
} dsv4_dist_rank;

typedef struct dsv4_dist_options {
    uint32_t struct_size;       /* sizeof(dsv4_dist_options), set by init */
    int timeout_ms;             /* the communicator's deadlock timeout */
    /*
     * The backend whose stages compute on every rank: -1 (the default) the plan's own. Another
     * dsv4_backend_kind stands in where this library or machine lacks the plan's backend (a cuda
     * plan's step in a build without CUDA): the step's protocol (metadata, replay decision,
     * chunk count) is still the plan's; the stand-in computes eagerly and its workspace is
     * measured against the stand-in's own plan of the same topology (graphs off).
     */
    int compute_backend;
    /*
     * A backend whose rows live on a device (cuda) runs the step with its rows as device buffers
     * over its device communicator (the device sim: ranks as threads sharing the GPU): the token
     * rows, the dispatched rows, the expert outputs and the metadata collective. 1 keeps them on
     * the host over the `sim` communicator (the same collectives and tags, for comparisons);
     * 0 (the default) the device.
     */
    int rows_on_host;
    /* Every rank's backend's own parameters (dsv4_backend_options.params; NULL, the default: its
       defaults). Not given to a compute_backend standing in for the plan's. */
    const char *backend_params;
} dsv4_dist_options;

/* timeout 5000 ms, the plan's backend. NULL is a no-op. */
DSV4_API void dsv4_dist_options_init(dsv4_dist_options *opt);

/*
 * Plans every rank of `topo` (topo->rank is ignored) and runs one step.
 * Returns the first failing rank's status (with its error), DSV4_OK when all
 * succeeded; every rank's own status, error and trace are in ranks[].
 * A refused plan is returned before any thread starts.
 */
DSV4_API dsv4_status dsv4_dist_forward(const dsv4_config *cfg, const dsv4_checkpoint *ckpt, const dsv4_topology *topo,
                                       const dsv4_budget *budget, const dsv4_dist_options *opt, dsv4_dist_rank *ranks,
                                       dsv4_error *err);

/*
 * The single-rank counterpart of a step, for checks: the computing backend (opt->compute_backend,
 * or the plan's, with opt->backend_params as the ranks take them; a stand-in takes none) on one
 * rank holding the whole layer runs the same stages over the same work the ranks of `topo` do,
 * chunk by chunk (the plan's chunk size): each rank's chunk routed and its shared expert computed
 * as that rank computes them, each expert's group formed from every rank's
 * slots of the chunk in rank order (ep > 1; else each rank's own groups), each token's outputs
 * combined in ascending expert id. Writes ranks[r].y (and topk_ids / topk_weights when set); no
 * communicator. A correct step with tp = 1 is bit-identical to it on every rank. A backend's
 * GEMMs may differ by row count (the cpu backend's fused kernels up to 16 rows, tiles above), so
 * a forward over the union of the ranks' tokens is not this: the shared expert of a rank with few
 * tokens would run in another regime than over the union.
 */
DSV4_API dsv4_status dsv4_dist_single_rank(const dsv4_config *cfg, const dsv4_checkpoint *ckpt,
                                           const dsv4_topology *topo, const dsv4_budget *budget,
                                           const dsv4_dist_options *opt, dsv4_dist_rank *ranks, dsv4_error *err);

/* Frees a rank's trace. NULL is a no-op. */
DSV4_API void dsv4_dist_rank_release(dsv4_dist_rank *rank);

#ifdef __cplusplus
}
#endif
#endif
