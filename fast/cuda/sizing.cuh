/*
 * Part of fast/cuda/cuda.cu's translation unit, included by it after the anonymous namespace that
 * holds the backend's state `CudaBe` (and its layouts, pipeline.cuh; its kernel variants,
 * upload.cuh); not a header of its own. The workspace's sizes without a device: a chunk's bytes,
 * the largest layout over every variant creation may pick, a rank's stage calls, and the plan's
 * device workspace (dsv4_cuda_device_workspace). Split out of cuda.cu to keep files under 1000
 * lines; the code is unchanged.
 */
#ifndef DSV4MOE_CUDA_SIZING_CUH
#define DSV4MOE_CUDA_SIZING_CUH
/* The workspace bytes of a chunk of tc tokens (no device needed; the tests hold it against the
   plan), and of a stage chunk on a backend of `experts` experts: kept -1 (route, combine), or the
   slots an experts call keeps (layout_for). */
static uint64_t chunk_bytes(const dsv4_config *cfg, int64_t tc, int64_t kept, int64_t experts)
{
    CudaBe *b = new (std::nothrow) CudaBe();
    if (!b)
        return 0;
    b->cfg = *cfg;
    b->e_count = experts;
    set_modes(b);
    b->fast = want_fast(cfg);
    b->fp8 = b->fast && cfg->gemm != DSV4_GEMM_EXACT;
    set_kernels(b);
    uint64_t v = layout_for(b, tc, kept).total;
    delete b;
    return v;
}

extern "C" uint64_t dsv4_cuda_chunk_workspace_bytes(const dsv4_config *cfg, int64_t tc);
extern "C" uint64_t dsv4_cuda_chunk_workspace_bytes(const dsv4_config *cfg, int64_t tc)
{
    return chunk_bytes(cfg, tc, -1, cfg->n_routed_experts);
}
extern "C" uint64_t dsv4_cuda_stage_chunk_bytes(const dsv4_config *cfg, int64_t tc, int64_t kept, int64_t experts);
extern "C" uint64_t dsv4_cuda_stage_chunk_bytes(const dsv4_config *cfg, int64_t tc, int64_t kept, int64_t experts)
{
    return chunk_bytes(cfg, tc, kept, experts);
}

/* The largest workspace of chunks of 1 .. n tokens under b's modes (chunks of fewer tokens than the
   workspace's run in it too, and a layout is not monotone in the token count everywhere: the
   router's split-K slices shrink as the chunk grows); slot_rows: chunks of token-slots, one kept
   slot a row (a stage's experts call, cuda_impl.h). */
static uint64_t max_layout(const CudaBe *b, int64_t n, bool slot_rows = false)
{
    uint64_t m = 0;
    for (int64_t t = 1; t <= n; t++) {
        const uint64_t v = layout_for(b, t, slot_rows ? t : -1).total;
        m = v > m ? v : m;
    }
    return m;
}

/* An upper bound of max_layout(b, n) in one layout: only the router logits' split-K slices make a
   layout shrink as the chunk grows, so the layout of n with the largest logits buffer of 1 .. n.
   The slices follow the chunk's 128-row blocks, so the largest buffer is at a block's last row. */
static uint64_t layout_bound(const CudaBe *b, int64_t n, bool slot_rows = false)
{
    const uint64_t E4 = (uint64_t)b->cfg.n_routed_experts * 4;
    uint64_t lg = 0;
    for (int64_t t = std::min<int64_t>(DSV4C_BM, n);; t = std::min<int64_t>(t + DSV4C_BM, n)) {
        const uint64_t v = align256((uint64_t)logit_slices(b, t) * (uint64_t)t * E4);
        lg = v > lg ? v : lg;
        if (t >= n)
            break;
    }
    const Layout L = layout_for(b, n, slot_rows ? n : -1);
    return L.total - align256((uint64_t)L.lslices * (uint64_t)n * E4) + lg;
}

/* The workspace of a rank's stage calls (cuda_impl.h): route and combine over chunks of up to
   `chunk` tokens (every slot of a row), experts over up to `rows` token-slots (one kept slot a
   row); the exact maximum, or (bound) its one-layout upper bound. */
static uint64_t stage_ws(const CudaBe *b, int64_t rows, int64_t chunk, bool bound)
{
    const uint64_t a = bound ? layout_bound(b, chunk) : max_layout(b, chunk);
    const uint64_t s = bound ? layout_bound(b, rows, true) : max_layout(b, rows, true);
    return a > s ? a : s;
}

/* The largest layout of chunks of 1 .. n tokens over what creation decides from the checkpoint,
   each way: the fp8 path or its fallback, a hash table that repeats an expert, the large groups'
   kernel; gemm fp8 off (0), on (1) or either (2); with stage_rows > 0 the stage calls' workspace
   (stage_ws) of chunks of n tokens on a backend of e_count experts (0: all). 0 when out of memory. */
static uint64_t layouts_max(const dsv4_config *cfg, int fp8, int64_t n, bool bound, int64_t stage_rows = 0,
                            int64_t e_count = 0)
{
    CudaBe *b = new (std::nothrow) CudaBe();
    if (!b)
        return 0;
    b->cfg = *cfg;
    b->e_count = e_count; /* the experts a rank's calls group (0: all) */
    set_modes(b);
    int dev = 0, nsm = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        nsm > 0)
        b->nsm = nsm;
    else
        (void)cudaGetLastError(); /* no device here: the H100/H200 count the struct holds */
    uint64_t best = 0;
    const bool fast = want_fast(cfg);
    for (int f = 0; f <= (fast ? 1 : 0); f++)
        for (int rep = 0; rep < 2; rep++)
            for (int t16 = 0; t16 < 1 + N_TILEH_BIG; t16++)
                for (int g8 = fp8 == 1 ? 1 : 0; g8 <= (fp8 == 0 ? 0 : 1); g8++) {
                    /* every kernel variant creation may be given (params): the large groups'
                       tile width sets the tile list's capacity */
                    b->fast = f == 1;
                    b->repeats = rep == 1;
                    Kernels kv;
                    kv.mma_tiles = t16 == N_TILEH_BIG;
                    kv.big_var = t16 < N_TILEH_BIG ? t16 : 0;
                    kv.quant_fold = true; /* params quant=fold's counts only add to the layout */
                    set_kernels(b, kv);
                    b->fp8 = b->fast && g8 == 1;
                    const uint64_t v = stage_rows > 0 ? stage_ws(b, stage_rows, n, bound)
                                       : bound      ? layout_bound(b, n)
                                                    : max_layout(b, n);
                    best = v > best ? v : best;
                }
    delete b;
    return best;
}

extern "C" uint64_t dsv4_cuda_device_workspace(const dsv4_plan *plan, int64_t max_tokens)
{
    const dsv4_config *cfg = dsv4_plan_config(plan);
    const dsv4_topology *topo = dsv4_plan_topology(plan);
    int64_t chunk = dsv4_plan_chunk_tokens(plan);
    if (chunk < 1)
        chunk = topo->max_tokens_per_rank > 0 ? topo->max_tokens_per_rank : 128;
    const int64_t n = max_tokens < chunk ? max_tokens : chunk;
    return layouts_max(cfg, dsv4_plan_gemm(plan) == DSV4_GEMM_FP8 ? 1 : 0, n, false);
}

#endif
