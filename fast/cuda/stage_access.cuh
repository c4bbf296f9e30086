/*
 * Part of fast/cuda/cuda.cu's translation unit, included by it at its end (after the anonymous
 * namespace that holds the backend's state `CudaBe`); not a header of its own. What the stages
 * (stages.cu, through cuda_impl.h) may do with a created backend: a stage chunk's buffers, its
 * pipeline on the stream, its combine, the config and the expert range. Split out of cuda.cu to
 * keep files under 1000 lines; the code is unchanged.
 */
#ifndef DSV4MOE_CUDA_STAGE_ACCESS_CUH
#define DSV4MOE_CUDA_STAGE_ACCESS_CUH
/* ---------------- the stages' access (cuda_impl.h, stages.cu) ---------------- */

namespace dsv4cuda {

/* The stage graph replaying an experts call of n rows (shared: the shared expert's), the smallest
   captured bucket holding n, while the step replays; NULL: run eager. */
const Graph *stage_graph_for(const CudaBe *b, int64_t n, bool shared)
{
    if (!b->stage_replay)
        return nullptr;
    const Graph *best = nullptr;
    for (int i = 0; i < b->n_graphs; i++) {
        const Graph *g = &b->sgraph[shared ? 1 : 0][i];
        if (g->exec && g->bucket >= n && (!best || g->bucket < best->bucket))
            best = g;
    }
    return best;
}

dsv4_status stage_chunk(void *impl, int64_t n, int64_t kept, StageChunk *c, dsv4_error *err)
{
    CudaBe *b = (CudaBe *)impl;
    if (n < 1)
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, WHERE, "a stage chunk of %lld rows", (long long)n);
    /* a replayed experts call runs in its graph's layout (its bucket's rows; the kernels read the
       row count n from the head) */
    const Graph *gr = kept >= 0 ? stage_graph_for(b, n, kept == 0) : nullptr;
    const int64_t tc = gr ? gr->bucket : n;
    if (gr)
        kept = kept == 0 ? 0 : tc;
    const Layout L = layout_for(b, tc, kept);
    if (tc > b->stage_cap || L.total > b->ws_bytes) {
        /* Beyond the workspace: a rank of a sharded plan is sized for its stages at creation, so
           this is the single-rank composition (dsv4_dist_single_rank) running every rank's slots
           in one call. The workspace grows (graphs captured over the old one are dropped). */
        if (!b->own_ws)
            return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE,
                               "a stage chunk of %lld rows needs %llu bytes, above the caller's workspace of %llu",
                               (long long)tc, (unsigned long long)L.total, (unsigned long long)b->ws_bytes);
        CK(cudaStreamSynchronize(b->stream));
        for (int i = 0; i < b->n_graphs; i++) {
            Graph *gs[3] = {&b->graph[i], &b->sgraph[0][i], &b->sgraph[1][i]};
            for (Graph *g : gs)
                if (g->exec) {
                    cudaGraphExecDestroy(g->exec);
                    g->exec = nullptr;
                }
        }
        cudaFree(b->ws);
        cudaFreeHost(b->hbuf);
        b->ws = nullptr, b->hbuf = nullptr, b->ws_bytes = 0, b->stage_cap = 0;
        /* every later stage call of up to tc rows fits: route and combine chunks of full slots
           (up to the plan's chunk), experts calls of one kept slot a row */
        const uint64_t bytes = stage_ws(b, tc, kept < 0 && tc > b->chunk ? tc : b->chunk, false);
        CK(cudaMalloc((void **)&b->ws, bytes));
        b->ws_bytes = bytes;
        CK(cudaMallocHost((void **)&b->hbuf, (size_t)L.io_end));
        b->stage_cap = tc;
        b->stats.workspace_allocated = bytes;
    }
    c->tc = tc, c->n = n, c->slots = L.slots, c->kept_slots = kept, c->graph = gr ? gr->exec : nullptr;
    c->stream = b->stream, c->ws = b->ws, c->hio = b->hbuf;
    c->in_ids = L.in_ids, c->ntok = L.ntok, c->stats = L.stats, c->x = L.x, c->ids = L.ids, c->w = L.w;
    c->kept = L.kept, c->io_end = L.io_end, c->rowmap = L.rowmap, c->o = L.o, c->osh = L.osh, c->rows = L.rows;
    c->total = L.total;
    if (b->stats.workspace_peak < L.total)
        b->stats.workspace_peak = L.total;
    /* the mirror's head: no input ids (a caller's route writes its own), the row count, zeroed counters */
    memset(b->hbuf, 0, (size_t)L.x);
    const int ntok = (int)n;
    memcpy(b->hbuf + L.ntok, &ntok, 4);
    return DSV4_OK;
}

/* The layout rows of bucket i's stage graph: routed (k 0) the token-slots an experts call of a step
   of up to that many tokens can receive (stage_rows), shared (k 1) the tokens, at least the
   ceil(E / K) rows an experts call is padded to (stages.cu). */
int64_t sgraph_rows(const CudaBe *b, int k, int i)
{
    const int64_t tb = b->graph[i].bucket, K = b->cfg.n_activated, pad = (b->cfg.n_routed_experts + K - 1) / K;
    return k ? std::max(tb, pad) : stage_rows(&b->cfg, &b->topo, tb);
}

dsv4_status stage_graphs(void *impl, bool capture, bool replay, int64_t *held, dsv4_error *err)
{
    CudaBe *b = (CudaBe *)impl;
    b->stage_replay = replay && b->graphs;
    int64_t n = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < b->n_graphs; i++) {
            Graph *g = &b->sgraph[k][i];
            const int64_t R = sgraph_rows(b, k, i);
            const Layout L = layout_for(b, R, k ? 0 : R);
            if (!g->exec && capture && (k == 0 || b->cfg.n_shared_experts > 0) && R <= b->stage_cap &&
                L.total <= b->ws_bytes) {
                /* the chunk after its head and rows are in place: nothing of a call's data is
                   captured (the slot list comes from the pinned mirror inside the graph) */
                cudaGraph_t graph = nullptr;
                CK(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
                cudaError_t ee = enqueue_chunk(b, L, 0, CHUNK_SLOTS);
                cudaError_t e = cudaStreamEndCapture(b->stream, &graph);
                if (e == cudaSuccess)
                    e = ee;
                if (e == cudaSuccess)
                    e = cudaGraphInstantiate(&g->exec, graph, 0);
                if (graph)
                    cudaGraphDestroy(graph);
                if (e != cudaSuccess || cudaGetLastError() != cudaSuccess) {
                    g->exec = nullptr;
                    return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE,
                                       "stage graph capture (%s experts, %lld rows) failed: %s",
                                       k ? "shared" : "routed", (long long)R, cudaGetErrorString(e));
                }
                g->bucket = R;
            }
            n += g->exec != nullptr;
        }
    *held = n;
    return DSV4_OK;
}

dsv4_status stage_done(void *impl, const StageChunk &c, StageKind kind, dsv4_error *err)
{
    CudaBe *b = (CudaBe *)impl;
    unsigned long long cs[ST_N];
    memcpy(cs, c.hio + c.stats, sizeof cs);
    if (cs[ST_BADIN])
        return dsv4_seterr(err, DSV4_ERR_RANGE, "cuda route",
                           "input_ids[%lld] is outside [0, %lld) or its tid2eid row names an expert outside [0, %lld) "
                           "(checked on the device)",
                           (long long)(0xFFFFFFFFull - cs[ST_BADIN_AT]), (long long)b->cfg.vocab_size,
                           (long long)b->cfg.n_routed_experts);
    if (cs[ST_BADID])
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, WHERE, "%llu slots of a stage chunk hold an expert id outside [0, %lld]",
                           cs[ST_BADID], (long long)b->cfg.n_routed_experts);
    dsv4_backend_stats *st = &b->stats;
    if (kind == STAGE_ROUTE) {
        st->nonfinite_rows += cs[ST_NONFINITE];
        st->forwards++;
        st->tokens += (uint64_t)c.tc;
    } else if (kind == STAGE_ROUTED) {
        st->launches += cs[ST_ACTIVE];
        st->empty_skips += cs[ST_EMPTY];
        st->routed_g_clamped += cs[ST_RG];
        st->routed_u_clamped += cs[ST_RU];
    } else if (kind == STAGE_SHARED) {
        st->launches++;
        st->shared_g_clamped += cs[ST_SG];
        st->shared_u_clamped += cs[ST_SU];
    }
    return DSV4_OK;
}

cudaError_t stage_enqueue(void *impl, const StageChunk &c, ChunkMode mode)
{
    CudaBe *b = (CudaBe *)impl;
    if (c.graph) {
        b->stats.graph_replays++;
        return cudaGraphLaunch(c.graph, b->stream);
    }
    return enqueue_chunk(b, layout_for(b, c.tc, c.kept_slots), 0, mode);
}

cudaError_t stage_combine(void *impl, const StageChunk &c, bool with_shared)
{
    const CudaBe *b = (const CudaBe *)impl;
    const dsv4_config *cf = &b->cfg;
    CombineArgs ca;
    ca.O = at<uint16_t>(b, c.o);
    ca.Osh = with_shared && c.osh ? at<uint16_t>(b, c.osh) : nullptr;
    ca.ids = at<int32_t>(b, c.ids), ca.rowmap = at<int32_t>(b, c.rowmap), ca.w = at<float>(b, c.w);
    ca.y = at<uint16_t>(b, c.x);
    ca.ntok = at<int>(b, c.ntok);
    ca.H = (int)cf->dim, ca.E = (int)cf->n_routed_experts, ca.K = (int)cf->n_activated;
    ca.after = cf->weight_point == DSV4_WEIGHT_AFTER_W2;
    launch_combine(b, ca, c.tc, b->stream);
    return cudaPeekAtLastError();
}

const dsv4_config *stage_config(const void *impl) { return &((const CudaBe *)impl)->cfg; }

void stage_experts(const void *impl, int64_t *first, int64_t *count)
{
    *first = ((const CudaBe *)impl)->e_first;
    *count = ((const CudaBe *)impl)->e_count;
}

void stage_inter(const void *impl, int64_t *first, int64_t *count)
{
    *first = ((const CudaBe *)impl)->i_first;
    *count = ((const CudaBe *)impl)->cfg.moe_inter_dim;
}

} // namespace dsv4cuda

#endif
