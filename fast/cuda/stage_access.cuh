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

dsv4_status stage_chunk(void *impl, int64_t tc, StageChunk *c, dsv4_error *err)
{
    CudaBe *b = (CudaBe *)impl;
    if (tc < 1)
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, WHERE, "a stage chunk of %lld rows", (long long)tc);
    const Layout L = layout_for(b, tc);
    if (tc > b->stage_cap || L.total > b->ws_bytes) {
        /* Beyond the workspace: a rank of a sharded plan is sized for its stages at creation, so
           this is the single-rank composition (dsv4_dist_single_rank) running every rank's slots
           in one call. The workspace grows (graphs captured over the old one are dropped). */
        if (!b->own_ws)
            return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE,
                               "a stage chunk of %lld rows needs %llu bytes, above the caller's workspace of %llu",
                               (long long)tc, (unsigned long long)L.total, (unsigned long long)b->ws_bytes);
        CK(cudaStreamSynchronize(b->stream));
        for (int i = 0; i < b->n_graphs; i++)
            if (b->graph[i].exec) {
                cudaGraphExecDestroy(b->graph[i].exec);
                b->graph[i].exec = nullptr;
            }
        cudaFree(b->ws);
        cudaFreeHost(b->hbuf);
        b->ws = nullptr, b->hbuf = nullptr, b->ws_bytes = 0, b->stage_cap = 0;
        const uint64_t bytes = max_layout(b, tc);
        CK(cudaMalloc((void **)&b->ws, bytes));
        b->ws_bytes = bytes;
        CK(cudaMallocHost((void **)&b->hbuf, (size_t)L.io_end));
        b->stage_cap = tc;
        b->stats.workspace_allocated = bytes;
    }
    c->tc = tc, c->slots = L.slots, c->stream = b->stream, c->ws = b->ws, c->hio = b->hbuf;
    c->in_ids = L.in_ids, c->ntok = L.ntok, c->stats = L.stats, c->x = L.x, c->ids = L.ids, c->w = L.w;
    c->kept = L.kept, c->io_end = L.io_end, c->rowmap = L.rowmap, c->o = L.o, c->osh = L.osh, c->total = L.total;
    if (b->stats.workspace_peak < L.total)
        b->stats.workspace_peak = L.total;
    /* the mirror's head: no input ids (a caller's route writes its own), the row count, zeroed counters */
    memset(b->hbuf, 0, (size_t)L.x);
    const int ntok = (int)tc;
    memcpy(b->hbuf + L.ntok, &ntok, 4);
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
    return enqueue_chunk(b, layout_for(b, c.tc), 0, mode);
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
    k_combine<<<dim3((unsigned)c.tc, (unsigned)cdiv(cf->dim, 8 * 256)), 256, (size_t)cf->n_activated * 16, b->stream>>>(ca);
    return cudaPeekAtLastError();
}

const dsv4_config *stage_config(const void *impl) { return &((const CudaBe *)impl)->cfg; }

void stage_experts(const void *impl, int64_t *first, int64_t *count)
{
    *first = ((const CudaBe *)impl)->e_first;
    *count = ((const CudaBe *)impl)->e_count;
}

} // namespace dsv4cuda

#endif
