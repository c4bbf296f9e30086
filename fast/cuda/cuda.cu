/*
 * The CUDA production backend (fast/cuda): one rank, router local, every expert on this GPU.
 * SPEC.md sections 2-5 on an sm_90 device; docs/cuda.md is the design.
 *
 * Per chunk of at most dsv4_plan_chunk_tokens(plan) tokens, all on one stream and with no host
 * synchronisation between the kernels (group sizes stay on the device):
 *   logits     x . gate^T: k_logits_small up to 32 live tokens, else the two GEMM kernels below (fp32 out)
 *   k_router   scores, top-K / hash lookup, weights, norm top-p; act_quant of x
 *   k_count    per-expert counts, compact and 128-aligned offsets, active list, tile schedule
 *   k_place    stable permutation of the kept slots into their groups
 *   k_gemv / k_tiles   gate+up of the routed groups (decode regime / tensor-core regime)
 *   k_swiglu   bf16 g/u, SwiGLU clamp (counted), silu, router weight (before_w2), bf16 h, act_quant h
 *   k_gemv / k_tiles   down projection
 *   the shared expert through the same three steps over the chunk's rows
 *   k_combine  fp32 per token over kept slots in ascending expert id, + shared, bf16 out
 * Every kernel reads the token count from the device, so a graph captured at a bucket replays
 * any T up to it with the same per-row arithmetic as an eager step (bit-identical outputs).
 *
 * That is the exact path (gemv.cu, tiles.cu, router.cuh, swiglu_combine.cuh). Production formats (fp4 or fp8 experts with quantized
 * activations, dims multiples of 128) take the fp8 tensor-core path instead (mma_parts.cuh): weights
 * repacked at creation into the fragment-native layout (repack.c), k_count2 (+ placement for
 * small chunks, in the router's launch: k_router_count), the three GEMM regimes of each projection on forked streams (decode / 32-row /
 * 128-row tiles) with the shared expert as one more group, SwiGLU fused into the gate/up
 * epilogue, k_quant for h, and the same combine. DSV4MOE_CUDA_PATH=exact forces the exact path.
 */
#include <algorithm>
#include <cuda_runtime.h>
#include <math.h>
#include <new>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "dsv4moe/alloc.h"
#include "dsv4moe/backend.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/weights.h"
#include "fast/backend/backend_impl.h"
#include "fast/backend/params.h"
#include "fast/cuda/cuda_entry.h"
#include "core/err.h"
#include "core/parallel.h"
#include "fast/cuda/repack.h"
}

#include "fast/cuda/kernels.cuh"
#include "fast/cuda/router.cuh"
#include "fast/cuda/logits_small.cuh"
#include "fast/cuda/router_count.cuh"
#include "fast/cuda/gemv.cuh"
#include "fast/cuda/tiles.cuh"
#include "fast/cuda/swiglu_combine.cuh"
#include "fast/cuda/tile.cuh"
#include "fast/cuda/tileh.cuh"
#include "fast/cuda/tile8.cuh"
#include "fast/cuda/mma_group.cuh"
#include "fast/cuda/route_small.cuh"
#include "fast/cuda/dec.cuh"
#include "fast/cuda/dec_mix.cuh"
#include "fast/cuda/gather8.cuh"
#include "fast/cuda/quant8.cuh"
#include "fast/cuda/gemm_fp8.h"
#include "fast/cuda/logits_blas.cuh"
#include "fast/cuda/quant_x8.cuh"
#include "fast/cuda/router_warp.cuh"
#include "fast/cuda/cuda_impl.h"
#ifdef DSV4_FAULTS
extern "C" {
#include "core/testctl.h"
}
#endif

using namespace dsv4cuda;

#define WHERE "backend cuda"
#define CK(call)                                                                                              \
    do {                                                                                                      \
        cudaError_t ce_ = (call);                                                                             \
        if (ce_ != cudaSuccess)                                                                               \
            return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "%s failed: %s (%s)", #call, cudaGetErrorString(ce_), \
                               cudaGetErrorName(ce_));                                                        \
    } while (0)

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
uint64_t align256(uint64_t v) { return (v + 255) & ~(uint64_t)255; }

/* One projection of the routed experts (all E packed) or of the shared expert. */
struct DevMat {
    uint8_t *w = nullptr, *s = nullptr; /* indexed by expert id (upload.cuh's expert_base of mem_w / mem_s) */
    uint8_t *mem_w = nullptr, *mem_s = nullptr;
    long long w_stride = 0, s_stride = 0; /* bytes per expert */
    int n = 0, k = 0, fmt = 0, sfp32 = 0;
};

/* Byte offsets of one chunk's buffers inside the workspace (layout(Tc)). */
struct Layout {
    uint64_t logits, x, in_ids, ntok, xq, xs, ids, w, kept, cnt, slot_off, pad_off, active, meta, tile_e, tile_r0, slot_tok,
        slot_row, rowmap, slot_w, slot_e, stats, gu, hq, hs, o, osh, total, io_end;
    int64_t tc, slots, rows, tiles;
    int64_t cap_mid, cap_big; /* fp8 path: tile list capacities (32-row tiles, then large-group tiles) */
    uint64_t x16;             /* fp8 path with k_tileh: the x codes as f16 */
    uint64_t xp, xs8, gu8, hs8; /* gemm fp8: gathered x codes, their M-major scales, the GEMM's g|u, h's M-major scales */
    uint64_t hist, fcnt;        /* fast path: per-slice expert counts (k_hist, large chunks), fold counts (small) */
    int lslices;              /* the router logits' split-K slices */
};

struct Graph {
    int64_t bucket = 0;
    cudaGraphExec_t exec = nullptr;
};

struct CudaBe {
    dsv4_config cfg;  /* the layer as the kernels see it: moe_inter_dim is the plan's inter count (tp) */
    dsv4_config full; /* the plan's layer (the checkpoint's shapes) */
    int64_t chunk = 0, max_tokens = 0;
    int64_t stage_cap = 0; /* the rows of a chunk the workspace and its mirror hold (stage chunks may grow them) */
    int64_t e_first = 0, e_count = 0; /* the plan's expert range (the stages check their rows against it) */
    int64_t i_first = 0;              /* the plan's inter range starts here (cfg.moe_inter_dim rows of full's) */
    uint64_t weight_bytes = 0;        /* device bytes of the bound weights (router, the range's experts) */
    int small = 1;
    bool qx = false, qh_routed = false, qh_shared = false, routed_q = false, shared_q = false;
    bool repeats = false; /* a tid2eid row names one expert twice */
    cudaStream_t stream = nullptr;
    /* weights */
    DevMat rw[3], sw[3];
    uint16_t *gate16 = nullptr; /* the gate as bf16 [E, H] (its values are bf16): logits by the GEMM kernels */
    float *bias = nullptr, *pred_norm = nullptr, *pred_w = nullptr, *pred_b = nullptr;
    int32_t *tid2eid = nullptr;
    int32_t *host_tid2eid = nullptr; /* host copy for validating input ids */
    /* the workspace: the backend's own allocation, or the caller's (dsv4_backend_options.workspace) */
    uint8_t *ws = nullptr;
    uint64_t ws_bytes = 0;
    bool own_ws = true;
    /* the device error word and counters of enqueued calls: [ST_N], ST_BADIN_AT by max, the others
       summed; read and cleared by the poll (its own allocation: it outlives calls, unlike the
       workspace, which backends may share) */
    unsigned long long *ctl = nullptr;
    uint8_t *hbuf = nullptr; /* pinned mirror of the workspace's io range [0, io_end) */
    /* graphs */
    bool graphs = false;
    int n_graphs = 0;
    Graph graph[DSV4_MAX_BUCKETS];
    /* a rank's stage graphs (stage_access.cuh): the experts call of routed token-slots [0] and of
       the shared expert [1] at each token bucket of graph[] (bucket: the layout's rows) */
    Graph sgraph[2][DSV4_MAX_BUCKETS];
    bool stage_replay = false; /* the step replays: experts calls within a bucket launch sgraph */
    dsv4_topology topo;        /* the plan's (the rows a bucket's experts call can receive) */
    dsv4_backend_stats stats;
    uint64_t device_used = 0;
    /* the fp8 tensor-core path (mma_parts.cuh): fragment-native weights, gate/up interleaved */
    bool fast = false;
    bool tile16 = true; /* large groups on f16 wgmma (k_tileh); else mma.sync (k_tile): params tile=mma */
    int big_rows = 128; /* rows of a large group's tile: the k_tileh variant's tokens, or 128 (k_tile) */
    int big_var = 0, mid_var = 0; /* k_tileh variants (tileh_big, tileh_mid): params tileh= / mid= */
    int fp8_cut = DSV4C_FP8_CUT_ROWS; /* gemm fp8: groups above this many rows on the grouped FP8 GEMM */
    int dec_fill = DSV4C_DEC_FILL;    /* k_dec's K split: until its blocks reach this many per multiprocessor */
    bool pdl = true; /* the fp8 path's chain kernels with programmatic dependent launch (launch_pdl) */
    bool route_fused = true; /* small chunks: k_logits_small, and k_router_count on the fp8 path (route=) */
    bool route_one = false;  /* route=one: where k_router_count would run, k_route_small instead (one launch) */
    bool shared_dec_one = false; /* shared_dec=one: an fp8 shared expert's decode in the fp4 routed launch (k_dec_mix) */
    int dec_minb = 3; /* dec_regs=128: k_dec and k_dec_mix bounded for 2 blocks per multiprocessor (128 registers), not 3 */
    int dec_ring = 0; /* dec_ring=deep|bulk: k_dec's deep rings, or bulk copies into them (RING_*, mma_parts.cuh) */
    bool quant_fold = false; /* quant=fold: h quantized in gate/up's decode launch (fold_quant), not by k_quant */
    bool quant_auto = false; /* quant=auto: as quant_fold but for chunks of one row (those keep k_quant) */
    bool quant_down = false; /* quant=down: the down projection's k_dec quantizes h itself, no k_quant (dec_qin.cuh) */
    int qin_smem = 0;        /* quant=down: the shared-memory limit its k_dec variants were given (0: not set) */
    int route_code = 0;      /* route_code=lean|warm: k_router_count's decode-only variants (ROUTE_CODE_*) */
    bool dec_pf = false;     /* dec_pf=l2: each k_dec_mix block prefetches its weight range into L2 (dec_prefetch) */
    bool dec_early = false;  /* dec_pf=early: k_dec's first-wave routed blocks prefetch theirs during the routing chain (dec_early) */
    bool shared_early = false; /* shared_gu=early: the forked shared expert's gate/up decode after k_logits_small (ev_early) */
    bool dec_persist = false; /* dec_sched=persist: k_dec_mix on persistent blocks (k_dec_mix_persist) */
    bool combine_fold = true; /* chunks of decode-sized groups: the combine in the down launch (combine=) */
    bool dec_slab = false; /* dec_b=smem: k_dec's fp4 launches without a K split stage B in shared memory */
    int logits_tg = 4;     /* k_logits_small loads four tokens' x together (logits_tg=1: one) */
    bool logits_loop = true; /* k_logits_small's tokens in a loop, not unrolled (logits_loop=off: unrolled) */
    bool weights_warp = false; /* weights=warp: k_router_count's weights on the selecting warp */
    bool group_warp = false; /* group=warp: k_router_count's grouping by one warp where it fits (count2_warp) */
    LogitsBlas *lb = nullptr; /* the GEMM logits on cuBLASLt (NULL: on k_tiles, logits=tiles or no algorithm) */
    bool gather_quant = true; /* x quantized after the grouping and gathered there (k_quant_x8; gather=copy: not) */
    bool router_warp = true;  /* large chunks' router a warp a token (k_router_warp; router=block: k_router) */
    bool quant8_lean = true;   /* quant8=lean (the default): k_quant8's values by fewer instructions (quant8.cu) */
    FProj fp[4];          /* routed gate/up, routed down, shared gate/up, shared down */
    uint8_t *fbuf[8] = {}; /* their allocations (data, scales) */
    uint64_t fbuf_bytes[8] = {};
    cudaStream_t s2 = nullptr, s3 = nullptr, s4 = nullptr; /* forked regimes: 32-row, 128-row tiles, shared decode */
    /* gemm fp8 (SPEC.md section 9): large groups on the grouped FP8 GEMM over row-major e4m3 copies
       of the weights with 1x128 scales (N-major); ok8[e] = 0: expert e's groups are not the GEMM's
       (its fp4 scales cannot convert exactly: the exact kernels; or params direct=: k_tile8) */
    bool fp8 = false;
    uint8_t *w8[4] = {};  /* routed gate|up [E][2I, H], routed down [E][H, I], shared gate|up, shared down */
    float *s8[4] = {};     /* w8 / s8 indexed by expert id; their allocations: */
    uint8_t *w8mem[4] = {};
    float *s8mem[4] = {};
    uint8_t *ok8 = nullptr; /* device [E + 1] */
    int sfb_rows = 1;       /* rows per weight scale of the fp8 GEMM copies: 128 (blocks) or 1 */
    bool fp8_rows = false;  /* params fp8_scales=rows: 1 even where blocks convert */
    bool all_ok8 = true;
    /* params direct=: the routed fp4 experts' tile groups on k_tile8 (tile8.cuh) where every one of
       them converts (direct_on; their ok8 bytes 0, the grouped FP8 GEMM takes the shared expert alone) */
    int direct = 0;
    bool direct_on = false;
    Fp8Gemm *g8[2] = {};  /* gate/up, down */
    cudaEvent_t ev_fork = nullptr, ev_j2 = nullptr, ev_j3 = nullptr, ev_j4 = nullptr;
    cudaEvent_t ev_early = nullptr; /* shared_gu=early: recorded after k_logits_small, the shared gate/up's fork */
    int nsm = 132;
};

#include "fast/cuda/pipeline.cuh" /* layout, launchers, one chunk on the stream */

/* The device counters of a forward (ST_*, read back) into the backend's statistics. */
void add_counters(CudaBe *b, const unsigned long long *h)
{
    b->stats.launches += h[ST_ACTIVE];
    b->stats.empty_skips += h[ST_EMPTY];
    b->stats.nonfinite_rows += h[ST_NONFINITE];
    b->stats.routed_g_clamped += h[ST_RG];
    b->stats.routed_u_clamped += h[ST_RU];
    b->stats.shared_g_clamped += h[ST_SG];
    b->stats.shared_u_clamped += h[ST_SU];
}

dsv4_status sync_check(CudaBe *b, const char *what, dsv4_error *err)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return DSV4_OK;
}

/* The graph of the smallest bucket holding T, captured on first use (NULL: run eager). */
dsv4_status graph_for(CudaBe *b, int64_t T, Graph **out, dsv4_error *err)
{
    *out = nullptr;
    for (int i = 0; i < b->n_graphs; i++) {
        if (b->graph[i].bucket < T)
            continue;
        Graph *gr = &b->graph[i];
        if (!gr->exec) {
            Layout L = layout_for(b, gr->bucket);
            cudaGraph_t graph = nullptr;
            CK(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
            cudaError_t ee = enqueue_chunk(b, L, 0);
            cudaError_t e = cudaStreamEndCapture(b->stream, &graph);
            if (e == cudaSuccess)
                e = ee;
            if (e != cudaSuccess || cudaGetLastError() != cudaSuccess) {
                if (graph)
                    cudaGraphDestroy(graph);
                return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "graph capture at bucket %lld failed: %s",
                                   (long long)gr->bucket, cudaGetErrorString(e));
            }
            e = cudaGraphInstantiate(&gr->exec, graph, 0);
            cudaGraphDestroy(graph);
            if (e != cudaSuccess) {
                gr->exec = nullptr;
                return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "graph instantiation at bucket %lld failed: %s",
                                   (long long)gr->bucket, cudaGetErrorString(e));
            }
        }
        *out = gr;
        return DSV4_OK;
    }
    return DSV4_OK;
}

/* A forward of host tensors, staged through the pinned mirror of the workspace's io range. */
struct Io {
    const uint16_t *x;
    const int32_t *ids;
    const dsv4_forward_out *out;
};

dsv4_status run_forward(CudaBe *b, int64_t T, const Io &io, dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    const int64_t E = c->n_routed_experts, H = c->dim, K = c->n_activated;
    const bool hash = dsv4_config_is_hash_layer(c);
    dsv4_status st;
    Graph *gr = nullptr;
    if (b->graphs && T <= b->chunk && (st = graph_for(b, T, &gr, err)))
        return st;
    const Layout Lc = layout_for(b, gr ? gr->bucket : (T < b->chunk ? T : b->chunk));
    unsigned long long hs[ST_N];
    memset(hs, 0, sizeof hs);
    uint64_t shared_launches = 0;
    for (int64_t t0 = 0; t0 < T; t0 += b->chunk) {
        const int64_t Tc = T - t0 < b->chunk ? T - t0 : b->chunk;
        const Layout L = gr ? Lc : layout_for(b, Tc);
        int ntok = (int)Tc;
        uint8_t *hb = b->hbuf;
        memcpy(hb + L.ntok, &ntok, 4);
        memset(hb + L.stats, 0, ST_N * 8);
        const size_t xbytes = (size_t)(Tc * H) * 2;
        if (hash)
            memcpy(hb + L.in_ids, io.ids + t0, (size_t)Tc * 4);
        memcpy(hb + L.x, io.x + t0 * H, xbytes);
        CK(cudaMemcpyAsync(b->ws, hb, (size_t)(L.x + xbytes), cudaMemcpyHostToDevice, b->stream));
        if (gr)
            CK(cudaGraphLaunch(gr->exec, b->stream));
        else
            CK(enqueue_chunk(b, L, t0));
        CK(cudaGetLastError());
        const uint64_t back_end = L.kept + (uint64_t)Tc * 4;
        CK(cudaMemcpyAsync(hb + L.stats, b->ws + L.stats, (size_t)(back_end - L.stats), cudaMemcpyDeviceToHost,
                           b->stream));
        if ((st = sync_check(b, "cuda forward", err)))
            return st;
        {
            const dsv4_forward_out *o = io.out;
            memcpy(o->y + t0 * H, hb + L.x, xbytes);
            if (o->topk_ids)
                memcpy(o->topk_ids + t0 * K, hb + L.ids, (size_t)(Tc * K) * 4);
            if (o->topk_weights)
                memcpy(o->topk_weights + t0 * K, hb + L.w, (size_t)(Tc * K) * 4);
            if (o->kept_counts)
                memcpy(o->kept_counts + t0, hb + L.kept, (size_t)Tc * 4);
        }
        unsigned long long cs[ST_N];
        memcpy(cs, hb + L.stats, sizeof cs);
        for (int i = 0; i < ST_N; i++)
            hs[i] += cs[i];
        if (cs[ST_BADIN])
            return dsv4_seterr(err, DSV4_ERR_RANGE, "cuda forward",
                               "input_ids[%lld] is outside [0, %lld) or its tid2eid row names an expert outside [0, "
                               "%lld) (checked on the device; %llu such tokens in the chunk at token %lld)",
                               (long long)(0xFFFFFFFFull - cs[ST_BADIN_AT]), (long long)c->vocab_size, (long long)E,
                               cs[ST_BADIN], (long long)t0);
        if (cs[ST_BADID])
            return dsv4_seterr(err, DSV4_ERR_INTERNAL, "cuda forward",
                               "%llu slots of the chunk at token %lld hold an expert id outside [0, %lld] (E is the "
                               "sentinel)",
                               cs[ST_BADID], (long long)t0, (long long)E);
        shared_launches += c->n_shared_experts > 0;
        if (b->stats.workspace_peak < L.total)
            b->stats.workspace_peak = L.total;
    }
    b->stats.forwards++;
    b->stats.tokens += (uint64_t)T;
    add_counters(b, hs);
    b->stats.launches += shared_launches;
    if (gr)
        b->stats.graph_replays++;
    return DSV4_OK;
}

dsv4_status cuda_forward(void *p, int64_t T, const uint16_t *x, const int32_t *in_ids, dsv4_forward_out *out,
                         dsv4_error *err)
{
    CudaBe *b = (CudaBe *)p;
    if (T == 0) {
        /* nothing to launch; the plan's metadata collective is the caller's (fast/multirank) */
        b->stats.forwards++;
        return DSV4_OK;
    }
    dsv4_status st = dsv4_router_check_input_ids(&b->cfg, b->host_tid2eid, T, in_ids, "cuda forward", err);
    if (st)
        return st;
    Io io = {x, in_ids, out};
    return run_forward(b, T, io, err);
}

/*
 * dsv4_backend_enqueue on stream s: per chunk k_io_in, the chunk's kernels (or, with own_graphs,
 * the backend's bucket graph, which only the synchronous path on the backend's own stream
 * replays), k_io_out. Launches only: no host wait, no allocation, no host read of the device.
 */
dsv4_status enqueue_forward(CudaBe *b, cudaStream_t s, bool own_graphs, int64_t T, const int32_t *valid,
                            const uint16_t *x, const int32_t *in_ids, const dsv4_forward_out *out, dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    const int64_t H = c->dim, K = c->n_activated;
    if (T == 0) {
        b->stats.forwards++;
        return DSV4_OK;
    }
    dsv4_status st;
    Graph *gr = nullptr;
    if (own_graphs && b->graphs && T <= b->chunk && (st = graph_for(b, T, &gr, err)))
        return st;
    const Layout Lc = layout_for(b, gr ? gr->bucket : (T < b->chunk ? T : b->chunk));
    const cudaStream_t own = b->stream;
    b->stream = s; /* the chunk's kernels (and their forks) run on the caller's stream */
    cudaError_t e = cudaSuccess;
    uint64_t shared_launches = 0;
    for (int64_t t0 = 0; t0 < T && e == cudaSuccess; t0 += b->chunk) {
        const int64_t Tc = T - t0 < b->chunk ? T - t0 : b->chunk;
        const Layout L = gr ? Lc : layout_for(b, Tc);
        IoArgs a;
        memset(&a, 0, sizeof a);
        a.valid = valid, a.t0 = t0, a.tc = (int)Tc, a.H = (int)H, a.K = (int)K, a.hash = dsv4_config_is_hash_layer(c);
        a.x = x + t0 * H, a.in_ids = in_ids ? in_ids + t0 : nullptr;
        a.y = out->y + t0 * H;
        a.ids = out->topk_ids ? out->topk_ids + t0 * K : nullptr;
        a.w = out->topk_weights ? out->topk_weights + t0 * K : nullptr;
        a.kept = out->kept_counts ? out->kept_counts + t0 : nullptr;
        a.ws_x = at<uint16_t>(b, L.x), a.ws_in_ids = at<int32_t>(b, L.in_ids), a.ws_ntok = at<int32_t>(b, L.ntok);
        a.ws_ids = at<int32_t>(b, L.ids), a.ws_kept = at<int32_t>(b, L.kept), a.ws_w = at<float>(b, L.w);
        a.ws_stats = at<unsigned long long>(b, L.stats), a.ctl = b->ctl;
        k_io_in<<<(unsigned)Tc, 256, 0, s>>>(a);
        if ((e = cudaPeekAtLastError()) != cudaSuccess)
            break;
        e = gr ? cudaGraphLaunch(gr->exec, s) : enqueue_chunk(b, L, t0);
        if (e != cudaSuccess)
            break;
        launch_pdl(b, k_io_out, dim3((unsigned)Tc), 256, 0, s, a);
        e = cudaPeekAtLastError();
        shared_launches += c->n_shared_experts > 0;
        if (b->stats.workspace_peak < L.total)
            b->stats.workspace_peak = L.total;
    }
    b->stream = own;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "enqueue of a %lld-token forward failed: %s (%s)", (long long)T,
                           cudaGetErrorString(e), cudaGetErrorName(e));
    }
    b->stats.forwards++;
    b->stats.tokens += (uint64_t)T;
    b->stats.launches += shared_launches;
    if (gr)
        b->stats.graph_replays++;
    return DSV4_OK;
}

/*
 * Waits for s (NULL: the device), then reads and clears the error word, folds its counters into
 * the stats and reports: bad input ids (DSV4_ERR_RANGE), bad expert ids (DSV4_ERR_INTERNAL), and,
 * when numeric (the public poll), non-finite rows (DSV4_ERR_NUMERIC; the synchronous calls only
 * count them, as the reference does).
 */
dsv4_status poll_ctl(CudaBe *b, cudaStream_t s, bool wait_device, bool numeric, const char *what,
                     dsv4_device_errors *out, dsv4_error *err)
{
    cudaError_t e = wait_device ? cudaDeviceSynchronize() : cudaStreamSynchronize(s);
    unsigned long long h[ST_N];
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(h, b->ctl, sizeof h, cudaMemcpyDeviceToHost, b->stream);
    if (e == cudaSuccess)
        e = cudaMemsetAsync(b->ctl, 0, sizeof h, b->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    add_counters(b, h);
    const long long first = h[ST_BADIN] ? (long long)(0xFFFFFFFFull - h[ST_BADIN_AT]) : -1;
    if (out) {
        out->bad_input_ids = h[ST_BADIN];
        out->first_bad_input = first;
        out->nonfinite_rows = h[ST_NONFINITE];
        out->bad_expert_ids = h[ST_BADID];
    }
    const dsv4_config *c = &b->cfg;
    if (h[ST_BADIN])
        return dsv4_seterr(err, DSV4_ERR_RANGE, what,
                           "input_ids[%lld] is outside [0, %lld) or its tid2eid row names an expert outside [0, %lld) "
                           "(checked on the device; %llu such rows, routed to experts 0 .. K-1)",
                           first, (long long)c->vocab_size, (long long)c->n_routed_experts, h[ST_BADIN]);
    if (h[ST_BADID])
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, what, "%llu slots held an expert id outside [0, %lld] (E is the sentinel)",
                           h[ST_BADID], (long long)c->n_routed_experts);
    if (numeric && h[ST_NONFINITE])
        return dsv4_seterr(err, DSV4_ERR_NUMERIC, what,
                           "%llu router rows had a non-finite logit or score: routed by SPEC.md's fallback (ids 0 .. "
                           "K-1, weights route_scale / K), as the reference does",
                           h[ST_NONFINITE]);
    return DSV4_OK;
}

dsv4_status cuda_enqueue(void *p, void *stream, int64_t T, const int32_t *valid, const void *x, const int32_t *in_ids,
                         const dsv4_forward_out *out, dsv4_error *err)
{
    CudaBe *b = (CudaBe *)p;
    if (T > 0 && dsv4_config_is_hash_layer(&b->cfg) && !in_ids)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cuda enqueue",
                           "layer %lld is a hash layer: input_ids are required", (long long)b->cfg.layer);
    return enqueue_forward(b, (cudaStream_t)stream, false, T, valid, (const uint16_t *)x, in_ids, out, err);
}

dsv4_status cuda_poll_error(void *p, void *stream, dsv4_device_errors *out, dsv4_error *err)
{
    CudaBe *b = (CudaBe *)p;
    return poll_ctl(b, (cudaStream_t)stream, stream == nullptr, true, "cuda poll_error", out, err);
}

/* Synchronous: the enqueue on the backend's own stream (its graphs), the wait, the poll. */
dsv4_status cuda_forward_device(void *p, int64_t T, const void *x, const int32_t *in_ids, const dsv4_forward_out *out,
                                dsv4_error *err)
{
    CudaBe *b = (CudaBe *)p;
    if (T > 0 && dsv4_config_is_hash_layer(&b->cfg) && !in_ids)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cuda forward_device",
                           "layer %lld is a hash layer: input_ids are required", (long long)b->cfg.layer);
    dsv4_status st = enqueue_forward(b, b->stream, true, T, nullptr, (const uint16_t *)x, in_ids, out, err);
    if (st || T == 0)
        return st;
    return poll_ctl(b, b->stream, false, false, "cuda forward_device", nullptr, err);
}

dsv4_backend_stats cuda_stats(const void *p)
{
    const CudaBe *b = (const CudaBe *)p;
    return b->stats;
}

void cuda_free(void *p)
{
    CudaBe *b = (CudaBe *)p;
    if (!b)
        return;
    for (int i = 0; i < b->n_graphs; i++) {
        if (b->graph[i].exec)
            cudaGraphExecDestroy(b->graph[i].exec);
        for (int k = 0; k < 2; k++)
            if (b->sgraph[k][i].exec)
                cudaGraphExecDestroy(b->sgraph[k][i].exec);
    }
    for (int i = 0; i < 3; i++) {
        cudaFree(b->rw[i].mem_w), cudaFree(b->rw[i].mem_s);
        cudaFree(b->sw[i].mem_w), cudaFree(b->sw[i].mem_s);
    }
    for (int i = 0; i < 8; i++)
        cudaFree(b->fbuf[i]);
    for (int i = 0; i < 4; i++)
        cudaFree(b->w8mem[i]), cudaFree(b->s8mem[i]);
    cudaFree(b->ok8);
    fp8gemm_free(b->g8[0]);
    fp8gemm_free(b->g8[1]);
    logits_blas_free(b->lb);
    cudaFree(b->gate16), cudaFree(b->bias), cudaFree(b->tid2eid);
    cudaFree(b->pred_norm), cudaFree(b->pred_w), cudaFree(b->pred_b);
    if (b->own_ws)
        cudaFree(b->ws);
    cudaFree(b->ctl);
    if (b->hbuf)
        cudaFreeHost(b->hbuf);
    free(b->host_tid2eid);
    cudaStream_t streams[4] = {b->stream, b->s2, b->s3, b->s4};
    for (cudaStream_t st : streams)
        if (st)
            cudaStreamDestroy(st);
    cudaEvent_t evs[5] = {b->ev_fork, b->ev_j2, b->ev_j3, b->ev_j4, b->ev_early};
    for (cudaEvent_t ev : evs)
        if (ev)
            cudaEventDestroy(ev);
    delete b;
}

const dsv4_backend_vtable cuda_vtable = {"cuda",      cuda_forward,    cuda_stats,     cuda_free,
                                         cuda_forward_device, cuda_enqueue, cuda_poll_error};

#include "fast/cuda/upload.cuh" /* the weights at creation, the kernel variants */

} // namespace

#include "fast/cuda/sizing.cuh" /* the workspace's sizes: chunks, layouts, the plan's device workspace */

extern "C" dsv4_status dsv4_cuda_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ck,
                                                const dsv4_backend_options *opt, void **impl,
                                                const dsv4_backend_vtable **vt, dsv4_error *err)
{
    const int threads = opt->threads;
    const dsv4_config *cfg = dsv4_plan_config(plan);
    const dsv4_topology *topo = dsv4_plan_topology(plan);
    /* A rank of a sharded plan runs the stages (stages.cu) through fast/multirank, in a workspace of its
       own (stage chunks outgrow the forward's), and binds only its shard: the weights of its expert
       range (ep) and of its inter range (tp: gate/up rows and down columns sliced at upload, the
       kernels running a layer of moe_inter_dim = the plan's inter count). */
    const int64_t inter = dsv4_plan_inter_count(plan);
    const bool sharded = dsv4_plan_shard(plan)->sharded;
    if (sharded && opt->workspace)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE,
                           "a rank of a sharded plan runs its stages in the backend's own workspace, not a caller's");
    if (topo->sm != 90)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE, "sm %d: this build's kernels are for sm 90 (Hopper)",
                           topo->sm);
    dsv4_status st; /* the config was validated by the planner */
    Kernels kv;
    if ((st = parse_kernels(opt->params, &kv, err)) != DSV4_OK)
        return st;
    if (cfg->dim % 32 || inter % 32)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE,
                           "dim %lld and moe_inter_dim %lld%s must be multiples of 32 for the cuda kernels",
                           (long long)cfg->dim, (long long)inter, inter != cfg->moe_inter_dim ? " (the tp shard's)" : "");
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev < 1)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "no CUDA device: %s",
                           ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    int dev = 0, major = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 9)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "device %d has compute capability %d.x; sm 90 is required",
                           dev, major);
    CudaBe *b = new (std::nothrow) CudaBe();
    if (!b)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory");
    memset(&b->stats, 0, sizeof b->stats);
    b->full = *cfg;
    b->cfg = *cfg;
    b->cfg.moe_inter_dim = inter;
    const dsv4_config *c = &b->cfg;
    b->chunk = dsv4_plan_chunk_tokens(plan);
    b->max_tokens = topo->max_tokens_per_rank;
    b->e_first = dsv4_plan_expert_first(plan);
    b->e_count = dsv4_plan_expert_count(plan);
    b->i_first = dsv4_plan_inter_first(plan);
    b->topo = *topo;
    if (b->chunk < 1)
        b->chunk = b->max_tokens > 0 ? b->max_tokens : 128;
    set_modes(b);
    int64_t kmax = c->dim > c->moe_inter_dim ? c->dim : c->moe_inter_dim;
    b->small = (int)(196608 / (4 * (kmax + kmax / 32)));
    b->small = b->small > DSV4C_SMALL_MAX ? DSV4C_SMALL_MAX : b->small < 1 ? 1 : b->small;
    size_t free0 = 0, free1 = 0, total = 0;
    dsv4_router_tensors rt;
    memset(&rt, 0, sizeof rt);
    int64_t E = c->n_routed_experts, H = c->dim, V = c->vocab_size, K = c->n_activated;
    size_t gsm = (size_t)b->small * (kmax + kmax / 32) * 4;
    if ((ce = cudaMemGetInfo(&free0, &total)) != cudaSuccess || (ce = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = gemv_attrs(gsm)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&b->s2, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&b->s3, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&b->s4, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&b->ev_j4, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&b->ev_fork, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&b->ev_j2, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&b->ev_j3, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&b->ev_early, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaDeviceGetAttribute(&b->nsm, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
        (ce = dec_attrs(b, kv.dec_minb == 2, kv.quant_fold, kv.shared_dec_one, kv.dec_ring, kv.quant_down)) != cudaSuccess ||
        (ce = tileh_attrs()) != cudaSuccess ||
        (ce = tile_attrs()) != cudaSuccess || (ce = tile8_attrs()) != cudaSuccess) {
        st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "device setup failed: %s", cudaGetErrorString(ce));
        goto fail;
    }
    if ((st = dsv4_router_tensors_load(ck, &b->full, NULL, &rt, err)))
        goto fail;
    {
        uint16_t *g16 = (uint16_t *)malloc((size_t)(E * H) * 2);
        if (!g16) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory");
            goto fail_rt;
        }
        for (int64_t i = 0; i < E * H; i++) {
            uint32_t u;
            memcpy(&u, &rt.gate[i], 4);
            g16[i] = (uint16_t)(u >> 16); /* the gate's values are bf16: exact */
        }
        ce = cudaMalloc((void **)&b->gate16, (size_t)(E * H) * 2);
        if (ce == cudaSuccess)
            ce = cudaMemcpy(b->gate16, g16, (size_t)(E * H) * 2, cudaMemcpyHostToDevice);
        b->weight_bytes += (uint64_t)(E * H) * 2;
        free(g16);
        if (ce != cudaSuccess) {
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "upload of the gate failed: %s", cudaGetErrorString(ce));
            goto fail_rt;
        }
    }
    if (kv.logits_blas) {
        /* logits=blas (the default): the operation is checked here for chunks of 1 .. chunk rows
           (the route stage's chunks are no larger); a layer cuBLASLt has no algorithm for takes
           k_tiles unless logits=blas was named */
        char why[256];
        ce = logits_blas_create(&b->lb, (int)E, (int)H, (int)b->chunk, why, sizeof why);
        if (ce == cudaErrorNotSupported && !kv.logits_asked) {
            b->lb = nullptr;
            ce = cudaSuccess;
        }
        if (ce != cudaSuccess) {
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "params logits=blas: %s", why);
            goto fail_rt;
        }
    }
    if ((st = upload_f32(b, rt.bias, (size_t)E, &b->bias, "bias", err)) ||
        (st = upload_f32(b, rt.pred_norm, (size_t)E, &b->pred_norm, "norm predictor", err)) ||
        (st = upload_f32(b, rt.pred_w, (size_t)(E * H), &b->pred_w, "norm predictor weight", err)) ||
        (st = upload_f32(b, rt.pred_b, (size_t)E, &b->pred_b, "norm predictor bias", err)))
        goto fail_rt;
    if (rt.tid2eid) {
        size_t nb = (size_t)(V * K) * 4;
        b->host_tid2eid = (int32_t *)malloc(nb);
        if (!b->host_tid2eid) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory");
            goto fail_rt;
        }
        memcpy(b->host_tid2eid, rt.tid2eid, nb);
        for (int64_t v = 0; v < V && !b->repeats; v++)
            for (int64_t i = 0; i < K && !b->repeats; i++)
                for (int64_t j = i + 1; j < K; j++)
                    if (rt.tid2eid[v * K + i] == rt.tid2eid[v * K + j]) {
                        b->repeats = true;
                        break;
                    }
        if ((ce = cudaMalloc((void **)&b->tid2eid, nb)) != cudaSuccess ||
            (ce = cudaMemcpy(b->tid2eid, rt.tid2eid, nb, cudaMemcpyHostToDevice)) != cudaSuccess) {
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "upload of tid2eid failed: %s", cudaGetErrorString(ce));
            goto fail_rt;
        }
        b->weight_bytes += nb;
    }
    dsv4_router_tensors_release(&rt, NULL);
    b->fast = want_fast(c, kv.exact_path);
    set_kernels(b, kv);
    if (b->fast) { /* a shard takes the kernels its whole layer's scales allow (upload.cuh) */
        bool unsupported, no_f16;
        if ((st = layer_fp4_scales(b, ck, &unsupported, &no_f16, err)))
            goto fail;
        b->fast = !unsupported;
        if (no_f16)
            b->tile16 = false, b->big_rows = 128;
    }
    if (b->fast) {
        /* the fp8 path: fragment-native weights; a scale the path cannot hold exactly falls back */
        for (int slot = 0; slot < 4 && !st; slot++)
            if (slot < 2 || c->n_shared_experts > 0)
                st = upload_fast(b, ck, slot >= 2, slot % 2 == 0, threads < 1 ? 1 : threads, slot, err);
        if (st == DSV4_ERR_UNSUPPORTED) {
            for (int i = 0; i < 8; i++) {
                cudaFree(b->fbuf[i]);
                b->fbuf[i] = nullptr;
                b->weight_bytes -= b->fbuf_bytes[i];
                b->fbuf_bytes[i] = 0;
            }
            b->fast = false;
            st = DSV4_OK;
        }
        if (st)
            goto fail;
    }
    if (b->fast && dsv4_plan_gemm(plan) == DSV4_GEMM_FP8) {
        /* gemm fp8: row-major e4m3 copies of every projection for the grouped FP8 GEMM; with params
           direct= on a layer whose routed experts all convert (k_tile8 reads their fp4 weights),
           of the shared expert's only */
        const int64_t ng = E + 1;
        bool direct = false;
        if (b->direct && c->routed_format == DSV4_FORMAT_FP4 &&
            (st = routed_convert_rows(b, ck, threads < 1 ? 1 : threads, &direct, err)))
            goto fail;
        uint8_t *ok = (uint8_t *)malloc((size_t)ng);
        if (!ok) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory");
            goto fail;
        }
        /* weight scales per 128x128 block (gemm_fp8.cu: the faster kernel) unless a block would send
           to the exact kernels an expert whose 1x128 groups all convert: then per row, as before */
        b->sfb_rows = !b->fp8_rows && c->dim % 128 == 0 && c->moe_inter_dim % 128 == 0 ? 128 : 1;
        const uint64_t wb0 = b->weight_bytes;
        for (int pass = 0; pass < 2 && !st; pass++) {
            int64_t lost = 0;
            memset(ok, 1, (size_t)ng);
            ok[E] = c->n_shared_experts > 0;
            for (int slot = direct ? 2 : 0; slot < 4 && !st; slot++)
                if (slot < 2 || c->n_shared_experts > 0)
                    st = upload_fp8(b, ck, slot >= 2, slot % 2 == 0, threads < 1 ? 1 : threads, slot,
                                    slot >= 2 ? ok + E : ok, &lost, err);
            if (st || !lost || b->sfb_rows == 1)
                break;
            for (int i = 0; i < 4; i++) {
                cudaFree(b->w8mem[i]), cudaFree(b->s8mem[i]);
                b->w8mem[i] = nullptr, b->s8mem[i] = nullptr, b->w8[i] = nullptr, b->s8[i] = nullptr;
            }
            b->weight_bytes = wb0;
            b->sfb_rows = 1;
        }
        uint64_t exact = 0;
        for (int64_t e = 0; e < E; e++)
            exact += !ok[e];
        b->all_ok8 = exact == 0 && (c->n_shared_experts == 0 || ok[E]);
        b->stats.fp8_exact_experts = exact + (c->n_shared_experts > 0 && !ok[E]);
        b->stats.fp8_scale_rows = (uint64_t)b->sfb_rows;
        if (direct) /* no copies of theirs: the routed experts' groups are k_tile8's */
            memset(ok, 0, (size_t)E);
        size_t gb[2] = {0, 0};
        b->weight_bytes += (uint64_t)ng;
        if (!st && ((ce = cudaMalloc((void **)&b->ok8, (size_t)ng)) != cudaSuccess ||
                    (ce = cudaMemcpy(b->ok8, ok, (size_t)ng, cudaMemcpyHostToDevice)) != cudaSuccess ||
                    (ce = fp8gemm_create(&b->g8[0], (int)ng, b->sfb_rows, &gb[0])) != cudaSuccess ||
                    (ce = fp8gemm_create(&b->g8[1], (int)ng, b->sfb_rows, &gb[1])) != cudaSuccess))
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "fp8 GEMM setup failed: %s", cudaGetErrorString(ce));
        free(ok);
        if (st)
            goto fail;
        b->fp8 = true;
        b->stats.gemm_fp8 = 1;
        if (direct) {
            b->direct_on = true;
            b->big_rows = tile8_big_rows(b->direct);
            b->stats.fp8_direct = 1;
        }
    }
    if (!b->fast) {
        for (int p = 0; p < 3; p++)
            if ((st = upload(b, ck, false, p, &b->rw[p], err)))
                goto fail;
        if (c->n_shared_experts > 0)
            for (int p = 0; p < 3; p++)
                if ((st = upload(b, ck, true, p, &b->sw[p], err)))
                    goto fail;
    }
    if ((ce = cudaMalloc((void **)&b->ctl, ST_N * 8)) != cudaSuccess || (ce = cudaMemset(b->ctl, 0, ST_N * 8)) != cudaSuccess) {
        st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "allocation of the device error word failed: %s",
                         cudaGetErrorString(ce));
        goto fail;
    }
    if (opt->workspace) {
        /* the caller's workspace: chunks of the most tokens whose layouts (and every smaller
           chunk's) fit in it */
        int64_t fit = 0;
        uint64_t m = 0;
        for (int64_t t = 1; t <= b->chunk; t++) {
            const uint64_t v = layout_for(b, t).total;
            m = v > m ? v : m;
            if (m > opt->workspace_bytes)
                break;
            fit = t;
        }
        if (fit < 1) {
            st = dsv4_seterr(err, DSV4_ERR_INVALID_ARG, WHERE,
                             "the caller workspace of %llu bytes is below the %llu bytes of a 1-token chunk "
                             "(dsv4_backend_workspace_size)",
                             (unsigned long long)opt->workspace_bytes, (unsigned long long)layout_for(b, 1).total);
            goto fail;
        }
        b->chunk = fit;
        b->stage_cap = fit;
        b->own_ws = false;
        b->ws = (uint8_t *)opt->workspace;
        b->ws_bytes = opt->workspace_bytes;
        Layout L = layout_for(b, b->chunk);
        if ((ce = cudaMallocHost((void **)&b->hbuf, (size_t)L.io_end)) != cudaSuccess ||
            (ce = cudaMemGetInfo(&free1, &total)) != cudaSuccess) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "the %llu-byte staging buffer: %s",
                             (unsigned long long)L.io_end, cudaGetErrorString(ce));
            goto fail;
        }
        memset(b->hbuf, 0, (size_t)L.io_end);
    } else {
        /* the workspace: one allocation, the layout of a full chunk (every bucket is within a chunk);
           on a rank of a sharded plan, of the largest stage chunk (stage_rows) */
        const int64_t ws_rows = sharded ? stage_rows(c, topo, b->chunk) : b->chunk;
        Layout L = layout_for(b, ws_rows);
        b->ws_bytes = sharded ? stage_ws(b, ws_rows, b->chunk, false) : L.total;
        b->stage_cap = ws_rows;
        uint64_t avail = dsv4_plan_budget_available(plan);
        if (b->ws_bytes > avail) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE,
                             "the workspace of a %lld-token chunk needs %llu bytes but the plan's budget leaves %llu",
                             (long long)b->chunk, (unsigned long long)b->ws_bytes, (unsigned long long)avail);
            goto fail;
        }
        if ((ce = cudaMalloc((void **)&b->ws, b->ws_bytes)) != cudaSuccess) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "cudaMalloc of the %llu-byte workspace failed: %s",
                             (unsigned long long)b->ws_bytes, cudaGetErrorString(ce));
            goto fail;
        }
        if ((ce = cudaMallocHost((void **)&b->hbuf, (size_t)L.io_end)) != cudaSuccess) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "cudaMallocHost of the %llu-byte staging buffer failed: %s",
                             (unsigned long long)L.io_end, cudaGetErrorString(ce));
            goto fail;
        }
        memset(b->hbuf, 0, (size_t)L.io_end);
        if ((ce = cudaMemset(b->ws, 0, b->ws_bytes)) != cudaSuccess || (ce = cudaDeviceSynchronize()) != cudaSuccess ||
            (ce = cudaMemGetInfo(&free1, &total)) != cudaSuccess) {
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "workspace setup failed: %s", cudaGetErrorString(ce));
            goto fail;
        }
    }
    b->device_used = free0 > free1 ? (uint64_t)(free0 - free1) : 0;
    b->stats.workspace_planned = dsv4_plan_workspace_max(plan);
    b->stats.device_allocated = b->device_used;
    b->stats.weights_allocated = b->weight_bytes;
    b->stats.workspace_allocated = b->own_ws ? b->ws_bytes : 0;
    b->graphs = topo->cuda_graph;
    if (b->graphs) {
        for (int i = 0; i < topo->n_buckets && i < DSV4_MAX_BUCKETS; i++)
            if (topo->buckets[i] <= b->chunk)
                b->graph[b->n_graphs++].bucket = topo->buckets[i];
    }
    *impl = b;
    *vt = &cuda_vtable;
    return DSV4_OK;
fail_rt:
    dsv4_router_tensors_release(&rt, NULL);
fail:
    cuda_free(b);
    return st;
}

#include "fast/cuda/stage_access.cuh" /* the stages' access to a created backend (cuda_impl.h) */

/* The registration's memory model of a rank of a sharded cuda plan (world > 1): the workspace of its
   largest stage chunk, over the layouts creation may pick (gemm fp8 either way: the model gets
   the layer and topology, not the plan's resolved mode). A single rank keeps the planner's
   executor model (docs/planner.md). */
extern "C" uint64_t dsv4_cuda_stage_workspace_bytes(const dsv4_config *cfg, const dsv4_topology *topo, int64_t tokens)
{
    if (tokens < 1 || !topo || topo->tp < 1)
        return 0;
    dsv4_config lc = *cfg; /* the kernels' layer: the tp shard of moe_inter_dim */
    lc.moe_inter_dim /= topo->tp;
    return layouts_max(&lc, 2, tokens, true, stage_rows(&lc, topo, tokens),
                       topo->ep > 1 ? cfg->n_routed_experts / topo->ep : 0);
}

/* The registration's weight model: the device bytes a backend of the shard binds (upload.cuh). */
extern "C" uint64_t dsv4_cuda_weight_bytes(const dsv4_config *cfg, const dsv4_shard *shard)
{
    const Shard sh{cfg, shard->e_first, shard->e_count, shard->i_first, shard->i_count};
    return shard_weight_bytes(sh, shard->gemm == DSV4_GEMM_FP8);
}
