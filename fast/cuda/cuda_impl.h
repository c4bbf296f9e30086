/*
 * What the CUDA backend's stages (stages.cu) use of the backend (cuda.cu). Private to fast/cuda,
 * C++ only. No kernels and no kernel argument types: kernels.cuh and mma_group.cuh define their
 * kernels once, in cuda.cu, so the stages reach them through the functions below.
 *
 * A stage call runs a chunk of the backend's own pipeline (the forward's kernels, docs/cuda.md)
 * in the backend's workspace, so each row is computed by the kernels, regimes and order of the
 * forward: route is the chunk's router; experts is a chunk whose rows are the given token-slots
 * (one kept slot per row, the others the sentinel E; the shared expert: every slot E) with the
 * router's ids and weights replaced by the slot list after the router ran (it still quantizes
 * the rows as the forward does); combine is the forward's k_combine over rows in the order given.
 */
#ifndef DSV4MOE_FAST_CUDA_IMPL_H
#define DSV4MOE_FAST_CUDA_IMPL_H

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "dsv4moe/backend.h"
#include "dsv4moe/config.h"
#include "dsv4moe/plan.h"
}

namespace dsv4cuda {

/* What a chunk's enqueue runs. */
enum ChunkMode {
    CHUNK_FULL = 0,  /* the forward: router, grouping, experts, combine */
    CHUNK_ROUTE = 1, /* the router only (ids, weights, kept; the act_quant of x) */
    CHUNK_SLOTS = 2  /* the forward with ids and weights taken from the pinned mirror after the router */
};

/* One stage call's chunk of tc rows in the workspace: the byte offsets of its buffers (the io
   range [0, io_end) is mirrored at the same offsets in pinned host memory, hio). */
struct StageChunk {
    int64_t tc = 0, n = 0, slots = 0; /* the layout's rows, the rows the call holds (tc but for a replay) */
    cudaGraphExec_t graph = nullptr;   /* a replayed experts call: its bucket's graph */
    int64_t kept_slots = -1; /* the slots its grouping places: -1 every slot (route, combine), else at most this many */
    cudaStream_t stream = nullptr;
    uint8_t *ws = nullptr, *hio = nullptr;
    uint64_t in_ids = 0, ntok = 0, stats = 0, x = 0, ids = 0, w = 0, kept = 0, io_end = 0;
    uint64_t rowmap = 0, o = 0, osh = 0; /* slot -> row of o; o bf16 [rows, H]; osh bf16 [tc, H] (0: none) */
    int64_t rows = 0;                    /* the rows of o */
    uint64_t total = 0;
};

/* The chunk of tc >= 1 rows laid out in impl's workspace (grown, with its mirror, when it does
   not fit: the single-rank composition; a rank of a sharded plan is sized for its stages at
   creation); counts its bytes into the backend's workspace peak; the mirror's head set (input ids
   0, the row count, counters 0: the caller writes the rest). An experts call while the step
   replays (stage_graphs) is laid out at the bucket of the graph that holds it (c->tc its rows,
   c->n = tc the call's, c->graph set) when there is one. kept: -1 for a chunk whose router's
   slots are grouped (route, combine); an experts call, whose slot list keeps one slot a row, the
   rows it keeps (0 for the shared expert's): its expert rows and tile lists are sized for those. */
dsv4_status stage_chunk(void *impl, int64_t tc, int64_t kept, StageChunk *c, dsv4_error *err);
/* The stage graphs of a rank that can replay (dsv4_backend_stages.graphs): capture, those missing
   of the experts calls at each of the plan's buckets (routed token-slots: the rows a step of that
   many tokens can send the rank; the shared expert: its tokens), in the layout of the bucket;
   replay, while true, an experts call of up to a bucket's rows launches that bucket's graph (with
   its row count in the head) instead of its kernels. held: the graphs captured. */
dsv4_status stage_graphs(void *impl, bool capture, bool replay, int64_t *held, dsv4_error *err);
/* What a stage chunk computed, for its counters. */
enum StageKind { STAGE_ROUTE, STAGE_ROUTED, STAGE_SHARED, STAGE_COMBINE };
/* After c's counters came back to the mirror (a copy of [stats, ...) and a wait): the errors the
   forward reports (bad input ids: DSV4_ERR_RANGE; bad expert ids: DSV4_ERR_INTERNAL), and the
   counters of what kind computed folded into the backend's stats. */
dsv4_status stage_done(void *impl, const StageChunk &c, StageKind kind, dsv4_error *err);
/* Enqueues c's kernels on its stream, or launches its graph (no host synchronisation). */
cudaError_t stage_enqueue(void *impl, const StageChunk &c, ChunkMode mode);
/* Enqueues the forward's combine over c: o rows by rowmap, ids and weights at c.ids / c.w, the
   shared rows at c.osh when with_shared; y into c.x. */
cudaError_t stage_combine(void *impl, const StageChunk &c, bool with_shared);
/* The backend's layer as its kernels run it (moe_inter_dim: the plan's inter count), its expert
   range and its range of the layer's moe_inter_dim (the weights bound at creation). */
const dsv4_config *stage_config(const void *impl);
void stage_experts(const void *impl, int64_t *first, int64_t *count);
void stage_inter(const void *impl, int64_t *first, int64_t *count);

/* The most rows of a stage chunk of a rank for chunks of tc tokens: the rows an experts call
   receives, ep tc min(K, E_local) (ep tc K on hash layers, where a row may repeat an expert), at
   least tc and at least ceil(E / K) (the experts call's padding) (stages.cu). */
int64_t stage_rows(const dsv4_config *cfg, const dsv4_topology *topo, int64_t tc);

} // namespace dsv4cuda

#endif
