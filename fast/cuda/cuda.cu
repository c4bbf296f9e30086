/*
 * The CUDA production backend (fast/cuda): one rank, router local, every expert on this GPU.
 * SPEC.md sections 2-5 on an sm_90 device; docs/cuda.md is the design.
 *
 * Per chunk of at most dsv4_plan_chunk_tokens(plan) tokens, all on one stream and with no host
 * synchronisation between the kernels (group sizes stay on the device):
 *   logits     x . gate^T by the two GEMM kernels below (bf16 operands, fp32 out)
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
 * That is the exact path (exact_gemm.cuh, router.cuh, swiglu_combine.cuh). Production formats (fp4 or fp8 experts with quantized
 * activations, dims multiples of 128) take the fp8 tensor-core path instead (mma.cuh): weights
 * repacked at creation into the fragment-native layout (repack.c), k_count2 (+ placement for
 * small chunks), the three GEMM regimes of each projection on forked streams (decode / 32-row /
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
#include "../backend/backend_impl.h"
#include "err.h"
#include "parallel.h"
#include "repack.h"
}

#include "kernels.cuh"
#include "router.cuh"
#include "exact_gemm.cuh"
#include "swiglu_combine.cuh"
#include "mma.cuh"
#include "mma_tileh.cuh"
#include "mma_group.cuh"
#include "fp8path.cuh"
#include "gemm_fp8.h"
#include "cuda_impl.h"
#ifdef DSV4_FAULTS
extern "C" {
#include "testctl.h"
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
    uint8_t *w = nullptr, *s = nullptr;
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
    int lslices;              /* the router logits' split-K slices */
};

struct Graph {
    int64_t bucket = 0;
    cudaGraphExec_t exec = nullptr;
};

struct CudaBe {
    dsv4_config cfg;
    int64_t chunk = 0, max_tokens = 0;
    int64_t stage_cap = 0; /* the rows of a chunk the workspace and its mirror hold (stage chunks may grow them) */
    int64_t e_first = 0, e_count = 0; /* the plan's expert range (the stages check their rows against it) */
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
    dsv4_backend_stats stats;
    uint64_t device_used = 0;
    /* the fp8 tensor-core path (mma.cuh): fragment-native weights, gate/up interleaved */
    bool fast = false;
    bool tile16 = true; /* large groups on f16 wgmma (k_tileh); else mma.sync (k_tile): cuda_kernels tile=mma */
    int big_rows = 128; /* rows of a large group's tile: the k_tileh variant's tokens, or 128 (k_tile) */
    int big_var = 0, mid_var = 0; /* k_tileh variants (tileh_big, tileh_mid): cuda_kernels tileh= / mid= */
    int fp8_cut = DSV4C_FP8_CUT_ROWS; /* gemm fp8: groups above this many rows on the grouped FP8 GEMM */
    FProj fp[4];          /* routed gate/up, routed down, shared gate/up, shared down */
    uint8_t *fbuf[8] = {}; /* their allocations (data, scales) */
    cudaStream_t s2 = nullptr, s3 = nullptr, s4 = nullptr; /* forked regimes: 32-row, 128-row tiles, shared decode */
    /* gemm fp8 (SPEC.md section 9): large groups on the grouped FP8 GEMM over row-major e4m3 copies
       of the weights with 1x128 scales (N-major); experts whose fp4 scales cannot convert exactly
       (ok8[e] = 0) keep the exact kernels */
    bool fp8 = false;
    uint8_t *w8[4] = {};  /* routed gate|up [E][2I, H], routed down [E][H, I], shared gate|up, shared down */
    float *s8[4] = {};
    uint8_t *ok8 = nullptr; /* device [E + 1] */
    bool all_ok8 = true;
    Fp8Gemm *g8[2] = {};  /* gate/up, down */
    cudaEvent_t ev_fork = nullptr, ev_j2 = nullptr, ev_j3 = nullptr, ev_j4 = nullptr;
    int nsm = 132;
};

/* Split-K slices of the router logits for a chunk of tc tokens: enough blocks for the device. */
int logit_slices(const CudaBe *b, int64_t tc)
{
    const dsv4_config *c = &b->cfg;
    const int64_t kb = c->dim / 128, blocks = cdiv(tc, DSV4C_BM) * cdiv(c->n_routed_experts, DSV4C_BN);
    int s = 1;
    while (c->dim % 128 == 0 && kb % (2 * s) == 0 && blocks * 2 * s <= 2 * (int64_t)b->nsm)
        s *= 2;
    return s;
}

Layout layout_for(const CudaBe *b, int64_t tc)
{
    const dsv4_config *c = &b->cfg;
    int64_t H = c->dim, I = c->moe_inter_dim, E = c->n_routed_experts, K = c->n_activated;
    Layout L;
    memset(&L, 0, sizeof L);
    L.tc = tc;
    L.slots = tc * K;
    /* 128-aligned groups: each non-empty group pads at most 127 rows */
    L.rows = L.slots + 127 * (L.slots < E ? L.slots : E);
    /* A group holds at most Tc rows when no token sends two slots to one expert (top-K ids are
       distinct; a hash table may repeat one, checked at creation): the masked bound E align128(Tc). */
    if (!b->repeats && E * cdiv(tc, 128) * 128 < L.rows)
        L.rows = E * cdiv(tc, 128) * 128;
    if (L.rows < tc)
        L.rows = tc;
    const int64_t act = L.slots < E ? L.slots : E;
    if (b->fast) {
        /* 32-row tiles: at most 2 per group of 17..64 rows; 128-row tiles: ceil(n / 128) per larger
           group; the shared expert's after them */
        const int64_t g17 = L.slots / (FM_DEC_MAX + 1), g65 = L.slots / (FM_MID_MAX + 1);
        L.cap_mid = 2 * (g17 < E ? g17 : E) + 3;
        L.cap_big = L.slots / b->big_rows + (g65 < E ? g65 : E) + tc / b->big_rows + 3;
        L.tiles = L.cap_mid + L.cap_big;
    } else {
        /* tensor-core tiles: sum of ceil(n / BM) over the groups above the decode threshold */
        L.tiles = L.slots / DSV4C_BM + act + 1;
    }
    uint64_t off = 0;
    auto take = [&](uint64_t bytes) {
        uint64_t o = off;
        off += align256(bytes ? bytes : 1);
        return o;
    };
    int64_t ngh = cdiv(H, 128), ngi = cdiv(I, 128);
    /* [in_ids ntok stats x] travel host->device in one copy, [stats x/y ids w kept] back in one */
    L.in_ids = take((uint64_t)tc * 4);
    L.ntok = take(4);
    L.stats = take(ST_N * 8);
    L.x = take((uint64_t)(tc * H) * 2); /* also the bf16 output of the chunk */
    L.ids = take((uint64_t)L.slots * 4);
    L.w = take((uint64_t)L.slots * 4);
    L.kept = take((uint64_t)tc * 4);
    L.io_end = off;
    L.lslices = logit_slices(b, tc);
    L.logits = take((uint64_t)(L.lslices * tc * E) * 4);
    L.x16 = b->fast && b->tile16 ? take((uint64_t)(tc * H) * 2) : 0;
    L.xq = b->qx ? take((uint64_t)(tc * H)) : 0;
    L.xs = b->qx ? take((uint64_t)(tc * ngh) * 4) : 0;
    L.cnt = take((uint64_t)E * 4);
    L.slot_off = take((uint64_t)(E + 1) * 4);
    L.pad_off = take((uint64_t)E * 4);
    L.active = take((uint64_t)E * 4);
    L.meta = take(16);
    L.tile_e = take((uint64_t)L.tiles * 4);
    L.tile_r0 = take((uint64_t)L.tiles * 4);
    L.slot_tok = take((uint64_t)L.slots * 4);
    L.slot_row = take((uint64_t)L.slots * 4);
    L.rowmap = take((uint64_t)L.slots * 4);
    L.slot_w = take((uint64_t)L.slots * 4);
    L.slot_e = b->fp8 ? take((uint64_t)L.slots * 4) : 0;
    if (b->fast) {
        /* h bf16 from the gate/up epilogue, then its codes and scales; rows [rows, rows + Tc) are
           the shared expert's (it runs in the same launches as the routed groups) */
        const int64_t hrows = L.rows + (c->n_shared_experts > 0 ? tc : 0);
        L.gu = take((uint64_t)(hrows * I) * 2);
        L.hq = take((uint64_t)(hrows * I));
        L.hs = take((uint64_t)(hrows * ngi) * 4);
    } else {
        L.gu = take((uint64_t)(L.rows * 2 * I) * 2);
        bool hq = b->qh_routed || b->qh_shared, hb = !b->qh_routed || !b->qh_shared;
        /* h: codes + scales when a w2 is quantized; bf16 otherwise (the larger of the two if both occur) */
        uint64_t hbytes = (uint64_t)(L.rows * I) * (hb ? 2 : 1);
        L.hq = take(hbytes);
        L.hs = hq ? take((uint64_t)(L.rows * ngi) * 4) : 0;
    }
    if (b->fp8) {
        const int64_t hrows = L.rows + (c->n_shared_experts > 0 ? tc : 0);
        L.xp = take((uint64_t)(L.rows * H));
        L.xs8 = take((uint64_t)(hrows * ngh) * 4);
        L.gu8 = take((uint64_t)(hrows * 2 * I) * 2);
        L.hs8 = take((uint64_t)(hrows * ngi) * 4);
    }
    L.o = take((uint64_t)(L.rows * H) * 2);
    L.osh = c->n_shared_experts > 0 ? take((uint64_t)(tc * H) * 2) : 0;
    L.total = off;
    return L;
}

/* Which activations are quantized (SPEC.md 5: before fp8 and fp4 GEMMs when act_quant is not none). */
void set_modes(CudaBe *b)
{
    const dsv4_config *c = &b->cfg;
    bool aq = c->act_quant != DSV4_ACT_QUANT_NONE;
    b->routed_q = aq && c->routed_format != DSV4_FORMAT_BF16;
    b->shared_q = aq && c->n_shared_experts > 0 && c->shared_format != DSV4_FORMAT_BF16;
    b->qx = b->routed_q || b->shared_q;
    b->qh_routed = b->routed_q;
    b->qh_shared = b->shared_q || (c->n_shared_experts == 0 && b->routed_q);
}

template <typename T> T *at(const CudaBe *b, uint64_t off) { return (T *)(void *)(b->ws + off); }

/* Whether some kernel of the chunk reads the activations' codes as f16 (k_tileh): not when gemm
   fp8 takes every large group and the mid-size groups stay on mma.sync. */
bool f16_codes_read(const CudaBe *b);

WeightDesc desc_routed_gu(const CudaBe *b)
{
    WeightDesc d;
    d.w[0] = b->rw[0].w, d.w[1] = b->rw[1].w;
    d.s[0] = b->rw[0].s, d.s[1] = b->rw[1].s;
    d.w_stride = b->rw[0].w_stride, d.s_stride = b->rw[0].s_stride;
    d.n_split = b->rw[0].n, d.N = 2 * b->rw[0].n, d.K = b->rw[0].k, d.fmt = b->rw[0].fmt, d.sfp32 = b->rw[0].sfp32;
    return d;
}

WeightDesc desc_one(const DevMat &m)
{
    WeightDesc d;
    d.w[0] = d.w[1] = m.w;
    d.s[0] = d.s[1] = m.s;
    d.w_stride = m.w_stride, d.s_stride = m.s_stride;
    d.n_split = m.n, d.N = m.n, d.K = m.k, d.fmt = m.fmt, d.sfp32 = m.sfp32;
    return d;
}

WeightDesc desc_shared_gu(const CudaBe *b)
{
    WeightDesc d = desc_one(b->sw[0]);
    d.w[1] = b->sw[1].w, d.s[1] = b->sw[1].s;
    d.N = 2 * b->sw[0].n;
    return d;
}

template <int F, int Q> void launch_gemv_t(dim3 g, size_t smem, cudaStream_t s, const GemmArgs &a)
{
    k_gemv<F, Q><<<g, DSV4C_GEMV_THREADS, smem, s>>>(a);
}
template <int F, int Q> void launch_tiles_t(dim3 g, cudaStream_t s, const GemmArgs &a)
{
    k_tiles<F, Q><<<g, DSV4C_TILE_THREADS, 0, s>>>(a);
}

void launch_gemv(int fmt, int aq, dim3 g, size_t smem, cudaStream_t s, const GemmArgs &a)
{
    switch (fmt * 2 + aq) {
    case 0: launch_gemv_t<WF_BF16, 0>(g, smem, s, a); break;
    case 1: launch_gemv_t<WF_BF16, 1>(g, smem, s, a); break;
    case 2: launch_gemv_t<WF_FP8, 0>(g, smem, s, a); break;
    case 3: launch_gemv_t<WF_FP8, 1>(g, smem, s, a); break;
    case 4: launch_gemv_t<WF_FP4, 0>(g, smem, s, a); break;
    default: launch_gemv_t<WF_FP4, 1>(g, smem, s, a); break;
    }
}

void launch_tiles(int fmt, int aq, dim3 g, cudaStream_t s, const GemmArgs &a)
{
    switch (fmt * 2 + aq) {
    case 0: launch_tiles_t<WF_BF16, 0>(g, s, a); break;
    case 1: launch_tiles_t<WF_BF16, 1>(g, s, a); break;
    case 2: launch_tiles_t<WF_FP8, 0>(g, s, a); break;
    case 3: launch_tiles_t<WF_FP8, 1>(g, s, a); break;
    case 4: launch_tiles_t<WF_FP4, 0>(g, s, a); break;
    default: launch_tiles_t<WF_FP4, 1>(g, s, a); break;
    }
}

/* The activation rows a GEMV launch keeps in shared memory: at most `small`, and at most the rows
   a group of the chunk can hold. Sizing by the chunk instead of by `small` is what lets several
   blocks share a multiprocessor in decode (T = 1: 17 KB instead of 135 KB, 8 blocks instead of 1). */
int gemv_rows(const CudaBe *b, int64_t bound) { return bound < b->small ? (int)(bound < 1 ? 1 : bound) : b->small; }
size_t gemv_smem(int rows, int k) { return (size_t)rows * (size_t)(k + k / 32) * 4; }

template <int F, int Q> cudaError_t gemv_attr(size_t smem)
{
    return cudaFuncSetAttribute(k_gemv<F, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

typedef void (*fast_kernel)(FastArgs);
const fast_kernel k_tile_mid = k_tile<TileMid, 2, 4, 4, 3>;
const fast_kernel k_tile_big = k_tile<TileBig, 4, 4, 2, 1>;
struct TileHVar {
    const char *name;
    fast_kernel k;
    int bn;
    size_t smem;
};
/* large groups: tokens per block 64 or 128, A decode serial or pipelined under the wgmmas, blocks
   per SM (first: the default; docs/cuda.md has the measured comparison) */
const TileHVar tileh_big[] = {{"s128", k_tileh<128, false>, 128, TileH<128>::SMEM},
                              {"s64x2", k_tileh<64, false, 3, 2>, 64, TileH<64, 3>::SMEM},
                              {"p64", k_tileh<64, true>, 64, TileH<64>::SMEM},
                              {"s64", k_tileh<64, false>, 64, TileH<64>::SMEM},
                              {"p128", k_tileh<128, true>, 128, TileH<128>::SMEM}};
/* mid-size groups (32-token tiles): mma.sync (k_tile, bn 0) or k_tileh (first: default) */
const TileHVar tileh_mid[] = {{"mma", nullptr, 0, 0},
                              {"p32", k_tileh<32, true>, 32, TileH<32>::SMEM},
                              {"s32", k_tileh<32, false>, 32, TileH<32>::SMEM}};
constexpr int N_TILEH_BIG = sizeof tileh_big / sizeof tileh_big[0], N_TILEH_MID = sizeof tileh_mid / sizeof tileh_mid[0];

bool f16_codes_read(const CudaBe *b) { return b->tile16 && (!(b->fp8 && b->all_ok8) || tileh_mid[b->mid_var].k); }

/* The index of the variant named `name` (len bytes) in table v, -1 when there is none. */
int tileh_pick(const TileHVar *v, int n, const char *name, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(v[i].name) == len && !strncmp(name, v[i].name, len))
            return i;
    return -1;
}

cudaError_t tileh_attrs()
{
    cudaError_t ce = cudaSuccess;
    for (int i = 0; i < N_TILEH_BIG && ce == cudaSuccess; i++)
        ce = cudaFuncSetAttribute(tileh_big[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tileh_big[i].smem);
    for (int i = 0; i < N_TILEH_MID && ce == cudaSuccess; i++)
        if (tileh_mid[i].k)
            ce = cudaFuncSetAttribute(tileh_mid[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tileh_mid[i].smem);
    return ce;
}

/* Launches k_dec for format fmt over `groups` slots (routed active slots below fa.act_max, then
   the shared expert), splitting K over enough warps to give every multiprocessor a few blocks. */
void launch_dec(const CudaBe *b, int fmt, FastArgs fa, int groups, cudaStream_t s)
{
    const int tiles16 = fa.N / 16;
    int ks = 1;
    while (ks < 8 && (int64_t)(tiles16 / (8 / ks)) * groups < 3 * (int64_t)b->nsm)
        ks *= 2;
    fa.ks = ks;
    const dim3 grid((unsigned)(tiles16 / (8 / ks)), (unsigned)groups);
    if (fmt == WF_FP4)
        k_dec<WF_FP4><<<grid, FM_THREADS, dec_smem_bytes(WF_FP4, ks, 2), s>>>(fa);
    else
        k_dec<WF_FP8><<<grid, FM_THREADS, dec_smem_bytes(WF_FP8, ks, 2), s>>>(fa);
}

/*
 * The regimes of one projection: k_dec on the main stream (and, when the shared expert's format
 * differs from the routed experts', its own k_dec on a forked stream), the 32-row and 128-row
 * tile kernels on two more forked streams, all joined back before returning; each is launched
 * only when the chunk's bounds allow it a group. Every block reads its group from the device.
 * With p8 (gemm fp8), large groups of convertible experts run on the grouped FP8 GEMM on the
 * 128-row tiles' stream instead (k_count2 left them off the big tile list).
 */
cudaError_t launch_regimes(const CudaBe *b, const Layout &L, FastArgs fa, const Fp8Proj *p8 = nullptr,
                           Fp8Gemm *g8 = nullptr)
{
    const dsv4_config *c = &b->cfg;
    cudaStream_t s = b->stream;
    const bool shared = c->n_shared_experts > 0;
    const int64_t gmax = b->repeats ? L.slots : L.tc; /* the largest routed group the chunk can hold */
    const int64_t nmax = std::max(gmax, shared ? L.tc : (int64_t)0);
    const bool mid = nmax > FM_DEC_MAX, big = nmax > FM_MID_MAX;
    const bool split = shared && fa.sh.fmt != fa.r.fmt;
    const bool cut = p8 && nmax > p8->min_rows; /* a group can be on the grouped FP8 GEMM (s3) */
    cudaError_t e = cudaSuccess;
    if ((mid || big || split || cut) && (e = cudaEventRecord(b->ev_fork, s)) != cudaSuccess)
        return e;
    struct Side {
        bool on;
        cudaStream_t st;
        cudaEvent_t ev;
    } side[3] = {{split, b->s4, b->ev_j4}, {mid, b->s2, b->ev_j2}, {big || cut, b->s3, b->ev_j3}};
    for (const Side &sd : side)
        if (sd.on && (e = cudaStreamWaitEvent(sd.st, b->ev_fork, 0)) != cudaSuccess)
            return e;
    if (split) {
        launch_dec(b, fa.r.fmt, fa, fa.act_max, s); /* routed slots only */
        FastArgs sh = fa;
        sh.act_max = 0;
        launch_dec(b, fa.sh.fmt, sh, 1, b->s4);
    } else {
        launch_dec(b, fa.r.fmt, fa, fa.act_max + 1, s);
    }
    if (mid) {
        FastArgs m = fa;
        m.meta_tiles = 1;
        const dim3 grid((unsigned)(fa.N / 128), (unsigned)L.cap_mid);
        const TileHVar &v = tileh_mid[b->mid_var];
        if (b->tile16 && v.k)
            v.k<<<grid, 256, v.smem, b->s2>>>(m);
        else
            k_tile_mid<<<grid, TileMid::THREADS, TileMid::SMEM, b->s2>>>(m);
    }
    if (cut && (e = fp8gemm_enqueue(g8, *p8, b->s3)) != cudaSuccess)
        return e;
    if (big && !(p8 && b->all_ok8)) { /* gemm fp8: only experts whose weights did not convert have big tiles */
        FastArgs g = fa;
        g.meta_tiles = 3;
        g.tile_e += L.cap_mid;
        g.tile_r0 += L.cap_mid;
        const dim3 grid((unsigned)(fa.N / 128), (unsigned)L.cap_big);
        const TileHVar &v = tileh_big[b->big_var];
        if (b->tile16)
            v.k<<<grid, 256, v.smem, b->s3>>>(g);
        else
            k_tile_big<<<grid, TileBig::THREADS, TileBig::SMEM, b->s3>>>(g);
    }
    for (const Side &sd : side)
        if (sd.on && ((e = cudaEventRecord(sd.ev, sd.st)) != cudaSuccess || (e = cudaStreamWaitEvent(s, sd.ev, 0)) != cudaSuccess))
            return e;
    return cudaPeekAtLastError();
}

/* The fp8 path after the router: grouping, gate/up + SwiGLU, quantization of h, down, combine. */
cudaError_t enqueue_fast(const CudaBe *b, const Layout &L, const RouterArgs &ra, GroupArgs ga)
{
    const dsv4_config *c = &b->cfg;
    const int H = (int)c->dim, I = (int)c->moe_inter_dim, E = (int)c->n_routed_experts, K = (int)c->n_activated;
    cudaStream_t s = b->stream;
    const bool shared = c->n_shared_experts > 0;
    Group2Args g2;
    g2.ids = ra.ids, g2.w = ra.w, g2.ntok = ra.ntok;
    g2.cnt = ga.cnt, g2.slot_off = ga.slot_off, g2.pad_off = ga.pad_off, g2.active = ga.active, g2.meta = ga.meta;
    g2.tile_e = ga.tile_e, g2.tile_r0 = ga.tile_r0;
    g2.slot_tok = ga.slot_tok, g2.slot_row = ga.slot_row, g2.rowmap = ga.rowmap, g2.slot_w = ga.slot_w;
    g2.slot_e = ga.slot_e;
    g2.stats = ga.stats;
    g2.E = E, g2.K = K, g2.rows = (int)L.rows, g2.cap_mid = (int)L.cap_mid, g2.cap_big = (int)L.cap_big;
    g2.has_shared = shared;
    g2.mid_rows = 32, g2.big_rows = b->big_rows;
    g2.place = L.slots <= 1024;
    g2.cut_ok = b->fp8 ? b->ok8 : nullptr;
    g2.cut_rows = b->fp8_cut;
    /* one block: as many threads as experts (a warp multiple, at most 1024; the loops cover the rest) */
    k_count2<<<1, (unsigned)std::min<int64_t>(1024, std::max<int64_t>(64, cdiv(E, 32) * 32)), (size_t)E * 4, s>>>(g2);
    if (!g2.place)
        k_place<<<(unsigned)E, 256, 0, s>>>(ga);
    FastArgs fa = FastArgs();
    fa.ntok = ra.ntok, fa.cnt = ga.cnt, fa.slot_off = ga.slot_off, fa.pad_off = ga.pad_off, fa.active = ga.active;
    fa.meta = ga.meta, fa.tile_e = ga.tile_e, fa.tile_r0 = ga.tile_r0, fa.slot_tok = ga.slot_tok, fa.slot_w = ga.slot_w;
    fa.stats = ga.stats, fa.E = E, fa.act_max = (int)(L.slots < E ? L.slots : E);
    fa.before = c->weight_point == DSV4_WEIGHT_BEFORE_W2, fa.clamp_r = 1, fa.clamp_s = c->shared_clamp;
    fa.L = c->swiglu_limit;
#ifdef DSV4_FAULTS
    if (b->fp8)
        fa.clamp_r = !DSV4_TESTHOOK(DROP_ROUTED_CLAMP); /* test hook: the fp8 executor's routed experts lose the clamp */
#endif
    uint16_t *h16 = at<uint16_t>(b, L.gu);
    uint8_t *hq = at<uint8_t>(b, L.hq);
    float *hs = at<float>(b, L.hs);
    const int64_t ngi = I / 128;
    /* gate/up with the SwiGLU epilogue: h bf16 */
    FastArgs gu = fa;
    gu.r = b->fp[0], gu.sh = shared ? b->fp[2] : FProj();
    gu.N = 2 * I, gu.K = H, gu.gu = 1;
    gu.A = at<uint8_t>(b, L.xq), gu.As = at<float>(b, L.xs), gu.gather = 1;
    gu.Ash = gu.A, gu.Assh = gu.As;
    gu.A16 = gu.Ash16 = b->tile16 ? at<uint16_t>(b, L.x16) : nullptr;
    gu.out = h16, gu.out_sh = h16 + L.rows * I;
    /* gemm fp8: a group above fp8_cut rows can exist in this chunk */
    const bool fp8 = b->fp8 && std::max(b->repeats ? L.slots : L.tc, shared ? L.tc : (int64_t)0) > b->fp8_cut;
    Sel8 sel;
    sel.slot_row = ga.slot_row, sel.slot_tok = ga.slot_tok, sel.slot_e = ga.slot_e, sel.slot_off = ga.slot_off, sel.cnt = ga.cnt;
    sel.pad_off = ga.pad_off, sel.meta = ga.meta, sel.ntok = ra.ntok, sel.ok = b->ok8;
    sel.sh_row0 = L.rows, sel.E = E, sel.slots = (int)L.slots, sel.has_shared = shared, sel.min_rows = b->fp8_cut;
    const unsigned rows_grid = (unsigned)(L.slots + (shared ? L.tc : 0));
    const int64_t ngh = H / 128;
    Fp8Proj p8;
    memset(&p8, 0, sizeof p8);
    if (fp8) {
        Gather8Args g8a;
        g8a.sel = sel, g8a.xq = at<uint8_t>(b, L.xq), g8a.xs = at<float>(b, L.xs);
        g8a.xp = at<uint8_t>(b, L.xp), g8a.xs8 = at<float>(b, L.xs8), g8a.H = H;
        k_gather8<<<rows_grid, 128, 0, s>>>(g8a);
        p8.cnt = ga.cnt, p8.pad_off = ga.pad_off, p8.ntok = ra.ntok, p8.ok = b->ok8;
        p8.E = E, p8.min_rows = b->fp8_cut, p8.has_shared = shared, p8.sh_row0 = L.rows;
        p8.N = p8.Nsh = 2 * I, p8.K = p8.Ksh = H;
        p8.A = g8a.xp, p8.Ash = g8a.xq, p8.SFA = g8a.xs8, p8.SFAsh = g8a.xs8 + L.rows * ngh;
        p8.B = b->w8[0], p8.SFB = b->s8[0], p8.Bsh = b->w8[2], p8.SFBsh = b->s8[2];
        p8.b_stride = 2LL * I * H, p8.sfb_stride = 2LL * I * (H / 128);
        p8.D = at<uint16_t>(b, L.gu8), p8.Dsh = p8.D + L.rows * 2 * I;
    }
    cudaError_t e = launch_regimes(b, L, gu, fp8 ? &p8 : nullptr, b->g8[0]);
    if (e != cudaSuccess)
        return e;
    if (fp8) {
        Quant8Args q8;
        q8.sel = sel, q8.h = h16, q8.gu8 = at<uint16_t>(b, L.gu8), q8.q = hq, q8.s = hs, q8.s8 = at<float>(b, L.hs8);
        q8.slot_w = ga.slot_w, q8.stats = ga.stats, q8.I = I, q8.qmode = (int)c->act_quant, q8.f16_codes = f16_codes_read(b);
        q8.before = fa.before, q8.clamp_r = fa.clamp_r, q8.clamp_s = fa.clamp_s, q8.L = fa.L;
        k_quant8<<<std::min(rows_grid, K8_GRID), (unsigned)std::min<int64_t>(512, std::max<int64_t>(32, ngi * 32)), 0, s>>>(
            q8, (int)rows_grid);
        p8.N = p8.Nsh = H, p8.K = p8.Ksh = I;
        p8.A = hq, p8.Ash = hq + L.rows * I, p8.SFA = q8.s8, p8.SFAsh = q8.s8 + L.rows * ngi;
        p8.B = b->w8[1], p8.SFB = b->s8[1], p8.Bsh = b->w8[3], p8.SFBsh = b->s8[3];
        p8.b_stride = 1LL * H * I, p8.sfb_stride = 1LL * H * (I / 128);
        p8.D = at<uint16_t>(b, L.o), p8.Dsh = shared ? at<uint16_t>(b, L.osh) : nullptr;
    } else {
    QuantArgs qa;
    qa.h = h16, qa.q = hq, qa.s = hs, qa.slot_row = ga.slot_row, qa.meta = ga.meta, qa.ntok = ra.ntok;
    qa.sh_row0 = L.rows, qa.I = I, qa.qmode = (int)c->act_quant, qa.slots = (int)L.slots, qa.has_shared = shared;
    qa.f16_codes = b->tile16;
    k_quant<<<rows_grid, (unsigned)std::min<int64_t>(512, std::max<int64_t>(32, ngi * 32)), 0, s>>>(qa);
    }
    /* down */
    FastArgs dn = fa;
    dn.r = b->fp[1], dn.sh = shared ? b->fp[3] : FProj();
    dn.N = H, dn.K = I, dn.gu = 0;
    dn.A = hq, dn.As = hs, dn.gather = 0;
    dn.Ash = hq + L.rows * I, dn.Assh = hs + L.rows * ngi;
    dn.A16 = b->tile16 ? h16 : nullptr, dn.Ash16 = b->tile16 ? h16 + L.rows * I : nullptr;
    dn.out = at<uint16_t>(b, L.o), dn.out_sh = shared ? at<uint16_t>(b, L.osh) : nullptr;
    if ((e = launch_regimes(b, L, dn, fp8 ? &p8 : nullptr, b->g8[1])) != cudaSuccess)
        return e;
    CombineArgs ca;
    ca.O = dn.out;
    ca.Osh = dn.out_sh;
    ca.ids = ra.ids, ca.rowmap = ga.rowmap, ca.w = ra.w;
    ca.y = at<uint16_t>(b, L.x);
    ca.ntok = ra.ntok;
    ca.H = H, ca.E = E, ca.K = K, ca.after = c->weight_point == DSV4_WEIGHT_AFTER_W2;
    k_combine<<<dim3((unsigned)L.tc, (unsigned)cdiv(H, 8 * 256)), 256, (size_t)K * 16, s>>>(ca);
    return cudaPeekAtLastError();
}

/*
 * Enqueues the kernels of one chunk whose buffers follow layout L (grids sized by L.tc; the
 * kernels read the actual token count from the device). No host synchronisation. t0 is the
 * chunk's first token (only for error messages).
 */
cudaError_t enqueue_chunk(const CudaBe *b, const Layout &L, int64_t t0, ChunkMode mode = CHUNK_FULL)
{
    const dsv4_config *c = &b->cfg;
    const int H = (int)c->dim, I = (int)c->moe_inter_dim, E = (int)c->n_routed_experts, K = (int)c->n_activated;
    cudaStream_t s = b->stream;
    const int *ntok = at<int>(b, L.ntok);
    unsigned long long *stats = at<unsigned long long>(b, L.stats);
    /* router */
    RouterArgs ra;
    memset(&ra, 0, sizeof ra);
    ra.x = at<uint16_t>(b, L.x);
    ra.in_ids = at<int32_t>(b, L.in_ids);
    ra.ntok = ntok;
    ra.bias = b->bias, ra.tid2eid = b->tid2eid;
    ra.pred_norm = b->pred_norm, ra.pred_w = b->pred_w, ra.pred_b = b->pred_b;
    ra.ids = at<int32_t>(b, L.ids), ra.w = at<float>(b, L.w), ra.kept = at<int32_t>(b, L.kept);
    ra.xq = b->qx ? at<uint8_t>(b, L.xq) : nullptr;
    ra.xs = b->qx ? at<float>(b, L.xs) : nullptr;
    ra.x16 = b->fast && f16_codes_read(b) ? at<uint16_t>(b, L.x16) : nullptr;
    ra.stats = stats;
    ra.t0 = t0;
    ra.H = H, ra.E = E, ra.K = K, ra.V = (int)c->vocab_size;
    ra.hash = dsv4_config_is_hash_layer(c);
    ra.score = (int)c->score_func;
    ra.gate_bf16 = c->gate_logits == DSV4_GATE_LOGITS_BF16;
    ra.predictor = (int)c->top_p_predictor;
    ra.top_p_on = c->top_p < 1.0f;
    ra.min_keep = (int)c->top_p_min_keep;
    ra.renorm = c->top_p_renorm;
    ra.qmode = (int)c->act_quant;
    ra.route_scale = c->route_scale, ra.norm_eps = c->norm_eps, ra.top_p = c->top_p;
    {
        /* logits = x . gate^T by the GEMM kernels (bf16 operands, fp32 out), then the router reads them */
        GemmArgs lgA;
        memset(&lgA, 0, sizeof lgA);
        lgA.W.w[0] = lgA.W.w[1] = (const uint8_t *)b->gate16;
        lgA.W.s[0] = lgA.W.s[1] = nullptr;
        lgA.W.n_split = E, lgA.W.N = E, lgA.W.K = H, lgA.W.fmt = WF_BF16;
        lgA.A = ra.x;
        lgA.shared = 1;
        lgA.ntok = ntok;
        lgA.small = 0; /* every token count takes the tensor-core kernel, split over K when the chunk is small */
        lgA.outf = at<float>(b, L.logits);
        lgA.kslice = L.lslices > 1 ? H / L.lslices : 0;
        lgA.out_slice = L.tc * E;
        launch_tiles(WF_BF16, 0, dim3((unsigned)cdiv(L.tc, DSV4C_BM), (unsigned)cdiv(E, DSV4C_BN), (unsigned)L.lslices),
                     s, lgA);
        ra.logits = lgA.outf;
        ra.lslices = L.lslices;
        ra.lslice_stride = L.tc * E;
    }
    size_t rsm = (size_t)(H + 2 * E + 4 * K) * 4;
    k_router<<<(unsigned)L.tc, 256, rsm, s>>>(ra);
    if (mode == CHUNK_ROUTE) /* the route stage (stages.cu) */
        return cudaPeekAtLastError();
    if (mode == CHUNK_SLOTS) { /* the experts stage: its slot list replaces the router's choice */
        cudaError_t ce = cudaMemcpyAsync(ra.ids, b->hbuf + L.ids, (size_t)(L.w + (uint64_t)L.slots * 4 - L.ids),
                                         cudaMemcpyHostToDevice, s);
        if (ce != cudaSuccess)
            return ce;
    }
    /* grouping */
    GroupArgs ga;
    ga.ids = ra.ids, ga.w = ra.w, ga.ntok = ntok;
    ga.cnt = at<int>(b, L.cnt), ga.slot_off = at<int>(b, L.slot_off), ga.pad_off = at<int>(b, L.pad_off);
    ga.active = at<int>(b, L.active), ga.meta = at<int>(b, L.meta);
    ga.tile_e = at<int>(b, L.tile_e), ga.tile_r0 = at<int>(b, L.tile_r0);
    ga.slot_tok = at<int32_t>(b, L.slot_tok), ga.slot_row = at<int32_t>(b, L.slot_row);
    ga.rowmap = at<int32_t>(b, L.rowmap), ga.slot_w = at<float>(b, L.slot_w);
    ga.slot_e = b->fp8 ? at<int32_t>(b, L.slot_e) : nullptr;
    ga.stats = stats, ga.E = E, ga.K = K, ga.small = b->small, ga.rows = (int)L.rows, ga.tile_m = DSV4C_BM;
    if (b->fast)
        return enqueue_fast(b, L, ra, ga);
    k_count<<<1, 1024, (size_t)E * 4, s>>>(ga);
    k_place<<<(unsigned)E, 256, 0, s>>>(ga);

    GemmArgs g;
    memset(&g, 0, sizeof g);
    g.ntok = ntok, g.cnt = ga.cnt, g.slot_off = ga.slot_off, g.pad_off = ga.pad_off, g.active = ga.active;
    g.meta = ga.meta, g.tile_e = ga.tile_e, g.tile_r0 = ga.tile_r0, g.slot_tok = ga.slot_tok, g.small = b->small;
    /* a routed group holds at most Tc rows (top-K ids are distinct), or every slot when a hash
       table repeats an expert */
    g.smem_rows = gemv_rows(b, b->repeats ? L.slots : L.tc);
    const int64_t act_max = L.slots < E ? L.slots : E;
    const bool tiles_needed = L.slots > b->small;
    const unsigned tgrid = (unsigned)L.tiles;
    uint16_t *GU = at<uint16_t>(b, L.gu), *O = at<uint16_t>(b, L.o);
    /* routed gate/up */
    g.W = desc_routed_gu(b);
    g.aq = b->routed_q;
    g.A = b->routed_q ? (const void *)at<uint8_t>(b, L.xq) : (const void *)at<uint16_t>(b, L.x);
    g.As = b->routed_q ? at<float>(b, L.xs) : nullptr;
    g.gather = 1;
    g.out = GU;
    launch_gemv(g.W.fmt, g.aq, dim3((unsigned)act_max, (unsigned)cdiv(g.W.N, DSV4C_GEMV_COLS)),
                gemv_smem(g.smem_rows, g.W.K), s, g);
    if (tiles_needed)
        launch_tiles(g.W.fmt, g.aq, dim3(tgrid, (unsigned)cdiv(g.W.N, DSV4C_BN)), s, g);
    /* epilogue */
    SwigluArgs sa;
    memset(&sa, 0, sizeof sa);
    sa.GU = GU;
    sa.hq = b->qh_routed ? at<uint8_t>(b, L.hq) : nullptr;
    sa.hs = b->qh_routed ? at<float>(b, L.hs) : nullptr;
    sa.hb = at<uint16_t>(b, L.hq);
    sa.ntok = ntok, sa.meta = ga.meta, sa.slot_row = ga.slot_row, sa.slot_w = ga.slot_w, sa.stats = stats;
    sa.I = I, sa.shared = 0, sa.clamp = 1, sa.before = c->weight_point == DSV4_WEIGHT_BEFORE_W2;
    sa.qmode = (int)c->act_quant, sa.L = c->swiglu_limit;
    k_swiglu<<<(unsigned)L.slots, 128, 0, s>>>(sa);
    /* routed down */
    g.W = desc_one(b->rw[2]);
    g.aq = b->qh_routed;
    g.A = b->qh_routed ? (const void *)at<uint8_t>(b, L.hq) : (const void *)at<uint16_t>(b, L.hq);
    g.As = b->qh_routed ? at<float>(b, L.hs) : nullptr;
    g.gather = 0;
    g.out = O;
    launch_gemv(g.W.fmt, g.aq, dim3((unsigned)act_max, (unsigned)cdiv(g.W.N, DSV4C_GEMV_COLS)),
                gemv_smem(g.smem_rows, g.W.K), s, g);
    if (tiles_needed)
        launch_tiles(g.W.fmt, g.aq, dim3(tgrid, (unsigned)cdiv(g.W.N, DSV4C_BN)), s, g);
    /* shared expert: rows [0, Tc) of the gate/up and h buffers (free again), output into osh */
    if (c->n_shared_experts > 0) {
        GemmArgs h = g;
        h.shared = 1;
        h.gather = 0;
        h.W = desc_shared_gu(b);
        h.aq = b->shared_q;
        h.A = b->shared_q ? (const void *)at<uint8_t>(b, L.xq) : (const void *)at<uint16_t>(b, L.x);
        h.As = b->shared_q ? at<float>(b, L.xs) : nullptr;
        h.out = GU;
        h.smem_rows = gemv_rows(b, L.tc);
        bool sm_small = L.tc <= b->small;
        launch_gemv(h.W.fmt, h.aq, dim3(1, (unsigned)cdiv(h.W.N, DSV4C_GEMV_COLS)), gemv_smem(h.smem_rows, h.W.K), s, h);
        if (!sm_small)
            launch_tiles(h.W.fmt, h.aq, dim3((unsigned)cdiv(L.tc, DSV4C_BM), (unsigned)cdiv(h.W.N, DSV4C_BN)), s, h);
        SwigluArgs ss = sa;
        ss.shared = 1;
        ss.clamp = c->shared_clamp;
        ss.hq = b->qh_shared ? at<uint8_t>(b, L.hq) : nullptr;
        ss.hs = b->qh_shared ? at<float>(b, L.hs) : nullptr;
        k_swiglu<<<(unsigned)L.tc, 128, 0, s>>>(ss);
        h.W = desc_one(b->sw[2]);
        h.aq = b->qh_shared;
        h.A = b->qh_shared ? (const void *)at<uint8_t>(b, L.hq) : (const void *)at<uint16_t>(b, L.hq);
        h.As = b->qh_shared ? at<float>(b, L.hs) : nullptr;
        h.out = at<uint16_t>(b, L.osh);
        launch_gemv(h.W.fmt, h.aq, dim3(1, (unsigned)cdiv(h.W.N, DSV4C_GEMV_COLS)), gemv_smem(h.smem_rows, h.W.K), s, h);
        if (!sm_small)
            launch_tiles(h.W.fmt, h.aq, dim3((unsigned)cdiv(L.tc, DSV4C_BM), (unsigned)cdiv(h.W.N, DSV4C_BN)), s, h);
    }
    /* combine into the x buffer (x is no longer read) */
    CombineArgs ca;
    ca.O = O;
    ca.Osh = c->n_shared_experts > 0 ? at<uint16_t>(b, L.osh) : nullptr;
    ca.ids = ra.ids, ca.rowmap = ga.rowmap, ca.w = ra.w;
    ca.y = at<uint16_t>(b, L.x);
    ca.ntok = ntok;
    ca.H = H, ca.E = E, ca.K = K, ca.after = c->weight_point == DSV4_WEIGHT_AFTER_W2;
    k_combine<<<dim3((unsigned)L.tc, (unsigned)cdiv(H, 8 * 256)), 256, (size_t)K * 16, s>>>(ca);
    return cudaPeekAtLastError();
}

/* The rows a chunk of tc rows starting at row t0 of the call computes: tc, or the caller's
   device count less t0, clamped to [0, tc] (read on the device: a captured call reads it at replay). */
__device__ __forceinline__ int chunk_rows(const int32_t *valid, long long t0, int tc)
{
    if (!valid)
        return tc;
    const long long v = (long long)*valid - t0;
    return v < 0 ? 0 : v > tc ? tc : (int)v;
}

/* One chunk's transfers between the caller's device tensors and the workspace (dsv4_backend_enqueue). */
struct IoArgs {
    const int32_t *valid; /* the caller's valid row count, or NULL */
    long long t0;         /* the chunk's first row within the call */
    int tc, H, K, hash;
    const uint16_t *x;      /* the caller's x at row t0 */
    const int32_t *in_ids;  /* the caller's input ids at row t0 (hash layers) */
    uint16_t *y;            /* the caller's outputs at row t0 (ids, w, kept may be NULL) */
    int32_t *ids;
    float *w;
    int32_t *kept;
    uint16_t *ws_x;         /* the chunk's buffers in the workspace */
    int32_t *ws_in_ids, *ws_ntok, *ws_ids, *ws_kept;
    float *ws_w;
    unsigned long long *ws_stats, *ctl;
};

/* In: the token count (the row count, or the caller's valid rows), the chunk's counters zeroed,
   the live rows of x and of the input ids. One block per row. */
__global__ void k_io_in(IoArgs a)
{
    const int t = blockIdx.x, n = chunk_rows(a.valid, a.t0, a.tc);
    if (t == 0 && threadIdx.x == 0)
        *a.ws_ntok = n;
    if (t == 0 && threadIdx.x < ST_N)
        a.ws_stats[threadIdx.x] = 0;
    if (t >= n)
        return;
    const uint16_t *src = a.x + (size_t)t * a.H;
    uint16_t *dst = a.ws_x + (size_t)t * a.H;
    for (int i = threadIdx.x; i < a.H; i += blockDim.x)
        dst[i] = src[i];
    if (a.hash && threadIdx.x == 0)
        a.ws_in_ids[t] = a.in_ids[t];
}

/* Out: the live rows' outputs, zeros for the padding rows; block 0 latches the chunk's counters
   and input errors into the backend's error word. */
__global__ void k_io_out(IoArgs a)
{
    const int t = blockIdx.x, n = chunk_rows(a.valid, a.t0, a.tc);
    const bool live = t < n;
    const uint16_t *src = a.ws_x + (size_t)t * a.H;
    uint16_t *dst = a.y + (size_t)t * a.H;
    for (int i = threadIdx.x; i < a.H; i += blockDim.x)
        dst[i] = live ? src[i] : (uint16_t)0;
    for (int k = threadIdx.x; k < a.K; k += blockDim.x) {
        const size_t j = (size_t)t * a.K + k;
        if (a.ids)
            a.ids[j] = live ? a.ws_ids[j] : 0;
        if (a.w)
            a.w[j] = live ? a.ws_w[j] : 0.0f;
    }
    if (threadIdx.x == 0 && a.kept)
        a.kept[t] = live ? a.ws_kept[t] : 0;
    if (t == 0 && threadIdx.x < ST_N) {
        const unsigned long long v = a.ws_stats[threadIdx.x];
        if (v && threadIdx.x == ST_BADIN_AT)
            atomicMax(&a.ctl[ST_BADIN_AT], v);
        else if (v)
            atomicAdd(&a.ctl[threadIdx.x], v);
    }
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
    b->stats.launches += hs[ST_ACTIVE] + shared_launches;
    b->stats.empty_skips += hs[ST_EMPTY];
    b->stats.nonfinite_rows += hs[ST_NONFINITE];
    b->stats.routed_g_clamped += hs[ST_RG];
    b->stats.routed_u_clamped += hs[ST_RU];
    b->stats.shared_g_clamped += hs[ST_SG];
    b->stats.shared_u_clamped += hs[ST_SU];
    if (gr)
        b->stats.graph_replays++;
    return DSV4_OK;
}

dsv4_status cuda_forward(void *p, int64_t T, const uint16_t *x, const int32_t *in_ids, dsv4_forward_out *out,
                         dsv4_error *err)
{
    CudaBe *b = (CudaBe *)p;
    if (T == 0) {
        /* nothing to launch; the plan's metadata collective is the caller's (fast/dist) */
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
        k_io_out<<<(unsigned)Tc, 256, 0, s>>>(a);
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
    b->stats.launches += h[ST_ACTIVE];
    b->stats.empty_skips += h[ST_EMPTY];
    b->stats.nonfinite_rows += h[ST_NONFINITE];
    b->stats.routed_g_clamped += h[ST_RG];
    b->stats.routed_u_clamped += h[ST_RU];
    b->stats.shared_g_clamped += h[ST_SG];
    b->stats.shared_u_clamped += h[ST_SU];
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
    for (int i = 0; i < b->n_graphs; i++)
        if (b->graph[i].exec)
            cudaGraphExecDestroy(b->graph[i].exec);
    for (int i = 0; i < 3; i++) {
        cudaFree(b->rw[i].w), cudaFree(b->rw[i].s);
        cudaFree(b->sw[i].w), cudaFree(b->sw[i].s);
    }
    for (int i = 0; i < 8; i++)
        cudaFree(b->fbuf[i]);
    for (int i = 0; i < 4; i++)
        cudaFree(b->w8[i]), cudaFree(b->s8[i]);
    cudaFree(b->ok8);
    fp8gemm_free(b->g8[0]);
    fp8gemm_free(b->g8[1]);
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
    cudaEvent_t evs[4] = {b->ev_fork, b->ev_j2, b->ev_j3, b->ev_j4};
    for (cudaEvent_t ev : evs)
        if (ev)
            cudaEventDestroy(ev);
    delete b;
}

const dsv4_backend_vtable cuda_vtable = {"cuda",      cuda_forward,    cuda_stats,     cuda_free,
                                         cuda_forward_device, cuda_enqueue, cuda_poll_error};

/* Bytes of the data / scales of one [n, k] matrix in format fmt. */
void mat_bytes(int fmt, int sfp32, int64_t n, int64_t k, uint64_t *data, uint64_t *scales)
{
    if (fmt == DSV4_FORMAT_FP4) {
        *data = (uint64_t)(n * k / 2);
        *scales = (uint64_t)(n * (k / 32));
    } else if (fmt == DSV4_FORMAT_FP8) {
        *data = (uint64_t)(n * k);
        *scales = (uint64_t)(cdiv(n, 128) * cdiv(k, 128)) * (sfp32 ? 4 : 1);
    } else {
        *data = (uint64_t)(n * k) * 2;
        *scales = 0;
    }
}

/*
 * The view of one matrix in the wanted format: as stored, or (a bf16 stacked checkpoint under a
 * quantized config) quantized here on the host exactly as the reference does. *qbuf / *sbuf own
 * the quantized bytes (NULL when the view is used as stored).
 */
dsv4_status view_as(const dsv4_checkpoint *ck, const dsv4_config *c, int64_t e, int p, dsv4_matrix_view *v,
                    uint8_t **qbuf, uint8_t **sbuf, dsv4_error *err)
{
    *qbuf = *sbuf = nullptr;
    dsv4_status st = dsv4_weights_matrix(ck, c, e, (dsv4_proj)p, v, err);
    if (st)
        return st;
    dsv4_weight_format want = e == DSV4_SHARED_EXPERT ? c->shared_format : c->routed_format;
    if (v->format == want)
        return DSV4_OK;
    int64_t n = v->n, k = v->k;
    float *w = (float *)malloc((size_t)(n * k) * sizeof *w);
    if (!w)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, v->key, "out of memory quantizing at load");
    dsv4_matrix_dequant_rows(v, 0, n, w);
    uint64_t db, sb;
    int sfp32 = want == DSV4_FORMAT_FP8 && c->weight_scale == DSV4_SCALE_FP32;
    mat_bytes(want, sfp32, n, k, &db, &sb);
    *qbuf = (uint8_t *)malloc(db);
    *sbuf = (uint8_t *)malloc(sb ? sb : 1);
    if (!*qbuf || !*sbuf)
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, v->key, "out of memory quantizing at load");
    else if (want == DSV4_FORMAT_FP8)
        st = dsv4_quant_fp8_block(w, n, k, c->weight_scale, *qbuf, *sbuf, v->key, err);
    else
        st = dsv4_quant_fp4_block(w, n, k, *qbuf, *sbuf, v->key, err);
    free(w);
    if (st) {
        free(*qbuf), free(*sbuf);
        *qbuf = *sbuf = nullptr;
        return st;
    }
    v->format = want;
    v->scale_format = c->weight_scale;
    v->data = *qbuf;
    v->scales = *sbuf;
    v->row_bytes = want == DSV4_FORMAT_FP8 ? (uint64_t)k : (uint64_t)k / 2;
    return DSV4_OK;
}

/* Uploads projection p of experts [0, count) (count 1 and e = shared for the shared expert). */
dsv4_status upload(CudaBe *b, const dsv4_checkpoint *ck, bool shared, int p, DevMat *m, dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    int64_t count = shared ? 1 : c->n_routed_experts;
    for (int64_t e = 0; e < count; e++) {
        dsv4_matrix_view v;
        uint8_t *qb, *sb;
        dsv4_status st = view_as(ck, c, shared ? DSV4_SHARED_EXPERT : e, p, &v, &qb, &sb, err);
        if (st)
            return st;
        int sfp32 = v.format == DSV4_FORMAT_FP8 && v.scale_format == DSV4_SCALE_FP32;
        uint64_t db, sbytes;
        mat_bytes(v.format, sfp32, v.n, v.k, &db, &sbytes);
        if (e == 0) {
            m->n = (int)v.n, m->k = (int)v.k, m->fmt = (int)v.format, m->sfp32 = sfp32;
            m->w_stride = (long long)align256(db), m->s_stride = (long long)align256(sbytes);
            cudaError_t ce = cudaMalloc((void **)&m->w, (size_t)(m->w_stride * count));
            if (ce == cudaSuccess)
                ce = cudaMalloc((void **)&m->s, (size_t)(m->s_stride * count));
            if (ce != cudaSuccess) {
                free(qb), free(sb);
                return dsv4_seterr(err, DSV4_ERR_NOMEM, v.key, "cudaMalloc of %llu bytes of weights failed: %s",
                                   (unsigned long long)(m->w_stride * count), cudaGetErrorString(ce));
            }
        } else if ((int)v.format != m->fmt || sfp32 != m->sfp32 || v.n != m->n || v.k != m->k) {
            free(qb), free(sb);
            return dsv4_seterr(err, DSV4_ERR_SHAPE, v.key,
                               "format or shape differs from expert 0's (every routed expert must share them)");
        }
        uint64_t natural = v.format == DSV4_FORMAT_FP4 ? (uint64_t)v.k / 2
                           : v.format == DSV4_FORMAT_FP8 ? (uint64_t)v.k
                                                         : (uint64_t)v.k * 2;
        cudaError_t ce = cudaMemcpy2D(m->w + e * m->w_stride, natural, v.data, v.row_bytes, natural, (size_t)v.n,
                                      cudaMemcpyHostToDevice);
        if (ce == cudaSuccess && sbytes)
            ce = cudaMemcpy(m->s + e * m->s_stride, v.scales, sbytes, cudaMemcpyHostToDevice);
        free(qb), free(sb);
        if (ce != cudaSuccess)
            return dsv4_seterr(err, DSV4_ERR_DEVICE, v.key, "upload failed: %s", cudaGetErrorString(ce));
    }
    return DSV4_OK;
}

/* The kernel variants of dsv4_backend_options.cuda_kernels (backend.h); the defaults when empty. */
struct Kernels {
    bool exact_path = false, mma_tiles = false;
    int big_var = 0, mid_var = 0, fp8_cut = DSV4C_FP8_CUT_ROWS;
};

dsv4_status parse_kernels(const char *spec, Kernels *k, dsv4_error *err)
{
    *k = Kernels();
    for (const char *p = spec; p && *p;) {
        const char *end = strchr(p, ','), *eq = strchr(p, '=');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        if (!eq || eq >= p + n)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                               "cuda_kernels: '%.*s' is not key=value (keys: path, tile, tileh, mid, fp8_cut)", (int)n, p);
        const size_t kl = (size_t)(eq - p), vl = n - kl - 1;
        const char *v = eq + 1;
        auto is = [&](const char *key) { return kl == strlen(key) && !strncmp(p, key, kl); };
        auto val = [&](const char *s) { return vl == strlen(s) && !strncmp(v, s, vl); };
        bool ok = true;
        if (is("path"))
            ok = val("exact") || val("auto"), k->exact_path = val("exact");
        else if (is("tile"))
            ok = val("mma") || val("wgmma"), k->mma_tiles = val("mma");
        else if (is("tileh"))
            ok = (k->big_var = tileh_pick(tileh_big, N_TILEH_BIG, v, vl)) >= 0;
        else if (is("mid"))
            ok = (k->mid_var = tileh_pick(tileh_mid, N_TILEH_MID, v, vl)) >= 0;
        else if (is("fp8_cut")) {
            char buf[16] = {0};
            char *e = nullptr;
            memcpy(buf, v, vl < sizeof buf - 1 ? vl : sizeof buf - 1);
            const long c = strtol(buf, &e, 10);
            ok = vl > 0 && vl < sizeof buf && *e == 0 && c >= FM_DEC_MAX && c <= FM_MID_MAX;
            k->fp8_cut = (int)c;
        } else
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                               "cuda_kernels: unknown key '%.*s' (keys: path, tile, tileh, mid, fp8_cut)", (int)kl, p);
        if (!ok)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                               "cuda_kernels: '%.*s' is not a value of %.*s (path auto|exact, tile wgmma|mma, tileh "
                               "s128|s64x2|p64|s64|p128, mid mma|p32|s32, fp8_cut %d..%d)",
                               (int)vl, v, (int)kl, p, FM_DEC_MAX, FM_MID_MAX);
        p = end ? end + 1 : p + n;
    }
    return DSV4_OK;
}

/* The kernel choice for large and mid-size groups. */
void set_kernels(CudaBe *b, const Kernels &k = Kernels())
{
    b->tile16 = !k.mma_tiles;
    b->big_var = k.big_var;
    b->mid_var = k.mid_var;
    b->fp8_cut = k.fp8_cut;
    b->big_rows = b->tile16 ? tileh_big[b->big_var].bn : 128;
}

/* Whether the config takes the fp8 tensor-core path (the weights are checked at upload too). */
bool want_fast(const dsv4_config *c, bool exact_path = false)
{
    if (exact_path)
        return false;
    bool rq = c->routed_format == DSV4_FORMAT_FP4 || c->routed_format == DSV4_FORMAT_FP8;
    bool sq = c->n_shared_experts == 0 || c->shared_format == DSV4_FORMAT_FP8;
    return c->act_quant != DSV4_ACT_QUANT_NONE && rq && sq && c->dim % 128 == 0 && c->moe_inter_dim % 128 == 0;
}

/* One batch of experts repacked on the host (in parallel over experts), then uploaded. */
struct RepackJob {
    const dsv4_checkpoint *ck;
    const dsv4_config *cfg;
    bool shared, gu;
    int64_t e0, n, k;
    uint64_t wbytes, sbytes;
    uint8_t *hw, *hs;
    dsv4_status *st;
    dsv4_error *errs;
    int *fmt;
    uint8_t *smin, *smax; /* fp4: per expert, the smallest and largest scale byte */
};

void repack_range(void *ctx, int64_t begin, int64_t end)
{
    RepackJob *j = (RepackJob *)ctx;
    for (int64_t i = begin; i < end; i++) {
        const int64_t e = j->shared ? DSV4_SHARED_EXPERT : j->e0 + i;
        dsv4_matrix_view v[2];
        uint8_t *qb[2] = {nullptr, nullptr}, *sb[2] = {nullptr, nullptr};
        const int nv = j->gu ? 2 : 1;
        dsv4_status st = DSV4_OK;
        for (int m = 0; m < nv && !st; m++)
            st = view_as(j->ck, j->cfg, e, j->gu ? (m ? DSV4_PROJ_W3 : DSV4_PROJ_W1) : DSV4_PROJ_W2, &v[m], &qb[m], &sb[m],
                         &j->errs[i]);
        if (!st) {
            dsv4_fn_src src[2];
            for (int m = 0; m < nv; m++) {
                src[m].data = v[m].data, src[m].row_bytes = v[m].row_bytes, src[m].scales = v[m].scales;
                src[m].sfp32 = v[m].format == DSV4_FORMAT_FP8 && v[m].scale_format == DSV4_SCALE_FP32;
            }
            j->fmt[i] = (int)v[0].format;
            uint8_t *dw = j->hw + (uint64_t)i * j->wbytes, *ds = j->hs + (uint64_t)i * j->sbytes;
            if (v[0].n != j->n || v[0].k != j->k || (nv == 2 && (v[1].n != v[0].n || v[1].k != v[0].k ||
                                                                                v[1].format != v[0].format))) {
                st = dsv4_seterr(&j->errs[i], DSV4_ERR_SHAPE, v[0].key, "shape or format differs from the config's");
            } else if (v[0].format == DSV4_FORMAT_FP4) {
                int which = 0;
                int64_t row = 0, grp = 0;
                if (dsv4_fn_repack_fp4(&src[0], nv == 2 ? &src[1] : nullptr, j->n, j->k, dw, ds, &which, &row, &grp,
                                       &j->smin[i], &j->smax[i]))
                    st = dsv4_seterr(&j->errs[i], DSV4_ERR_UNSUPPORTED, v[which].key,
                                     "scale byte of row %lld, group %lld is above %d: the fp8 tensor-core path cannot "
                                     "hold it exactly",
                                     (long long)row, (long long)grp, DSV4_FN_FP4_SCALE_MAX);
            } else if (v[0].format == DSV4_FORMAT_FP8) {
                dsv4_fn_repack_fp8(&src[0], nv == 2 ? &src[1] : nullptr, j->n, j->k, dw, (float *)(void *)ds);
            } else {
                st = dsv4_seterr(&j->errs[i], DSV4_ERR_UNSUPPORTED, v[0].key, "bf16 weights take the exact path");
            }
        }
        for (int m = 0; m < 2; m++)
            free(qb[m]), free(sb[m]);
        j->st[i] = st;
    }
}

/*
 * Uploads projection `gu` (gate/up interleaved) or down of the routed experts or the shared one
 * into the fragment-native layout (fp[slot], buffers fbuf[2 slot], fbuf[2 slot + 1]).
 * DSV4_ERR_UNSUPPORTED: the weights cannot take the fp8 path (the caller falls back).
 */
dsv4_status upload_fast(CudaBe *b, const dsv4_checkpoint *ck, bool shared, bool gu, int threads, int slot,
                        dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    const int64_t count = shared ? 1 : c->n_routed_experts;
    const int64_t n = gu ? c->moe_inter_dim : c->dim, k = gu ? c->dim : c->moe_inter_dim;
    const int fmt = shared ? c->shared_format : c->routed_format;
    uint64_t wbytes, sbytes;
    dsv4_fn_sizes(fmt == DSV4_FORMAT_FP4, n, k, gu, &wbytes, &sbytes);
    const uint64_t ws = align256(wbytes), ss = align256(sbytes);
    cudaError_t ce = cudaMalloc((void **)&b->fbuf[2 * slot], (size_t)(ws * count));
    if (ce == cudaSuccess)
        ce = cudaMalloc((void **)&b->fbuf[2 * slot + 1], (size_t)(ss * count));
    if (ce != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "cudaMalloc of %llu bytes of weights failed: %s",
                           (unsigned long long)(ws * count), cudaGetErrorString(ce));
    FProj &f = b->fp[slot];
    f.w = b->fbuf[2 * slot], f.s = b->fbuf[2 * slot + 1], f.w_stride = (long long)ws, f.s_stride = (long long)ss;
    f.fmt = fmt == DSV4_FORMAT_FP4 ? WF_FP4 : WF_FP8;
    const int64_t batch = std::min<int64_t>(count, 16);
    uint8_t *hw = (uint8_t *)malloc((size_t)(wbytes * batch)), *hsb = (uint8_t *)malloc((size_t)(sbytes * batch));
    dsv4_status *sts = (dsv4_status *)calloc((size_t)batch, sizeof *sts);
    dsv4_error *errs = (dsv4_error *)calloc((size_t)batch, sizeof *errs);
    int *fmts = (int *)calloc((size_t)batch, sizeof *fmts);
    uint8_t *smin = (uint8_t *)calloc((size_t)batch, 1), *smax = (uint8_t *)calloc((size_t)batch, 1);
    dsv4_status st = DSV4_OK;
    if (!hw || !hsb || !sts || !errs || !fmts || !smin || !smax)
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory repacking weights");
    for (int64_t e0 = 0; e0 < count && !st; e0 += batch) {
        RepackJob j;
        j.ck = ck, j.cfg = c, j.shared = shared, j.gu = gu, j.e0 = e0, j.n = n, j.k = k;
        j.wbytes = wbytes, j.sbytes = sbytes, j.hw = hw, j.hs = hsb, j.st = sts, j.errs = errs, j.fmt = fmts;
        j.smin = smin, j.smax = smax;
        const int64_t m = std::min(batch, count - e0);
        dsv4_parallel_for(threads, m, 1, repack_range, &j);
        for (int64_t i = 0; i < m && !st; i++) {
            if (sts[i]) {
                st = sts[i];
                if (err)
                    *err = errs[i];
            } else if (fmts[i] != fmt) {
                st = dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE, "expert %lld is stored in another format",
                                 (long long)(e0 + i));
            } else if (fmt == DSV4_FORMAT_FP4 && (smin[i] < DSV4_FH_SCALE_LO || smax[i] > DSV4_FH_SCALE_HI)) {
                b->tile16 = false; /* its values would not all be f16 values: large groups take mma.sync */
                b->big_rows = 128;
            }
        }
        for (int64_t i = 0; i < m && !st; i++) {
            ce = cudaMemcpy(b->fbuf[2 * slot] + (e0 + i) * ws, hw + i * wbytes, (size_t)wbytes, cudaMemcpyHostToDevice);
            if (ce == cudaSuccess)
                ce = cudaMemcpy(b->fbuf[2 * slot + 1] + (e0 + i) * ss, hsb + i * sbytes, (size_t)sbytes,
                                cudaMemcpyHostToDevice);
            if (ce != cudaSuccess)
                st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "weight upload failed: %s", cudaGetErrorString(ce));
        }
    }
    free(hw), free(hsb), free(sts), free(errs), free(fmts), free(smin), free(smax);
    return st;
}

/* gemm fp8: one batch of experts' row-major e4m3 copies (gate|up stacked, or down) with 1x128 scales. */
struct Fp8Job {
    const dsv4_checkpoint *ck;
    const dsv4_config *cfg;
    bool shared, gu;
    int64_t e0, n, k; /* rows of one projection, inner dimension */
    uint8_t *hw;      /* [batch][rows, k] */
    float *hs;        /* [batch][k / 128][rows] */
    uint8_t *ok;      /* [batch]: every 128-group converted exactly */
    dsv4_status *st;
    dsv4_error *errs;
};

void fp8_range(void *ctx, int64_t begin, int64_t end)
{
    Fp8Job *j = (Fp8Job *)ctx;
    const int nv = j->gu ? 2 : 1;
    const int64_t rows = nv * j->n, ng = j->k / 128;
    for (int64_t i = begin; i < end; i++) {
        const int64_t e = j->shared ? DSV4_SHARED_EXPERT : j->e0 + i;
        uint8_t *dw = j->hw + (uint64_t)(i * rows * j->k);
        float *ds = j->hs + (uint64_t)(i * rows * ng);
        dsv4_status st = DSV4_OK;
        j->ok[i] = 1;
        for (int m = 0; m < nv && !st; m++) {
            dsv4_matrix_view v;
            uint8_t *qb = nullptr, *sb = nullptr;
            st = view_as(j->ck, j->cfg, e, j->gu ? (m ? DSV4_PROJ_W3 : DSV4_PROJ_W1) : DSV4_PROJ_W2, &v, &qb, &sb,
                         &j->errs[i]);
            if (!st && (v.n != j->n || v.k != j->k))
                st = dsv4_seterr(&j->errs[i], DSV4_ERR_SHAPE, v.key, "shape differs from the config's");
            else if (!st && v.format == DSV4_FORMAT_FP4) {
                if (dsv4_fp4_to_e4m3_128(v.data, v.row_bytes, v.scales, j->n, j->k, dw + (uint64_t)(m * j->n * j->k),
                                         (uint64_t)j->k, ds + m * j->n, rows, 1, nullptr, nullptr))
                    j->ok[i] = 0;
            } else if (!st && v.format == DSV4_FORMAT_FP8) {
                dsv4_fp8_to_e4m3_128(v.data, v.row_bytes, v.scales, v.scale_format, j->n, j->k,
                                     dw + (uint64_t)(m * j->n * j->k), (uint64_t)j->k, ds + m * j->n, rows, 1);
            } else if (!st) {
                st = dsv4_seterr(&j->errs[i], DSV4_ERR_UNSUPPORTED, v.key, "bf16 weights have no fp8 GEMM");
            }
            free(qb), free(sb);
        }
        j->st[i] = st;
    }
}

/* gemm fp8: projection `gu` (gate|up) or down of the routed experts (slot 0 / 1) or the shared one
   (2 / 3) as row-major e4m3 with N-major 1x128 scales (gemm_fp8.h); ok[e] &= converted exactly. */
dsv4_status upload_fp8(CudaBe *b, const dsv4_checkpoint *ck, bool shared, bool gu, int threads, int slot,
                       uint8_t *ok, dsv4_error *err)
{
    const dsv4_config *c = &b->cfg;
    const int64_t count = shared ? 1 : c->n_routed_experts;
    const int64_t n = gu ? c->moe_inter_dim : c->dim, k = gu ? c->dim : c->moe_inter_dim, rows = (gu ? 2 : 1) * n;
    const uint64_t wbytes = (uint64_t)(rows * k), sbytes = (uint64_t)(rows * (k / 128)) * 4;
    cudaError_t ce = cudaMalloc((void **)&b->w8[slot], (size_t)(wbytes * count));
    if (ce == cudaSuccess)
        ce = cudaMalloc((void **)&b->s8[slot], (size_t)(sbytes * count));
    if (ce != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "cudaMalloc of %llu bytes of fp8 GEMM weights failed: %s",
                           (unsigned long long)(wbytes * count), cudaGetErrorString(ce));
    const int64_t batch = std::min<int64_t>(count, 16);
    uint8_t *hw = (uint8_t *)malloc((size_t)(wbytes * batch));
    float *hsb = (float *)malloc((size_t)(sbytes * batch));
    dsv4_status *sts = (dsv4_status *)calloc((size_t)batch, sizeof *sts);
    dsv4_error *errs = (dsv4_error *)calloc((size_t)batch, sizeof *errs);
    uint8_t *oks = (uint8_t *)calloc((size_t)batch, 1);
    dsv4_status st = DSV4_OK;
    if (!hw || !hsb || !sts || !errs || !oks)
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory converting weights for the fp8 GEMM");
    for (int64_t e0 = 0; e0 < count && !st; e0 += batch) {
        Fp8Job j;
        j.ck = ck, j.cfg = c, j.shared = shared, j.gu = gu, j.e0 = e0, j.n = n, j.k = k;
        j.hw = hw, j.hs = hsb, j.ok = oks, j.st = sts, j.errs = errs;
        const int64_t m = std::min(batch, count - e0);
        dsv4_parallel_for(threads, m, 1, fp8_range, &j);
        for (int64_t i = 0; i < m && !st; i++) {
            if (sts[i]) {
                st = sts[i];
                if (err)
                    *err = errs[i];
            }
            ok[e0 + i] &= oks[i];
        }
        if (!st && ((ce = cudaMemcpy(b->w8[slot] + e0 * wbytes, hw, (size_t)(wbytes * m), cudaMemcpyHostToDevice)) !=
                        cudaSuccess ||
                    (ce = cudaMemcpy((uint8_t *)b->s8[slot] + e0 * sbytes, hsb, (size_t)(sbytes * m),
                                     cudaMemcpyHostToDevice)) != cudaSuccess))
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "fp8 GEMM weight upload failed: %s", cudaGetErrorString(ce));
    }
    free(hw), free(hsb), free(sts), free(errs), free(oks);
    return st;
}

dsv4_status upload_f32(const float *src, size_t n, float **dst, const char *what, dsv4_error *err)
{
    *dst = nullptr;
    if (!src)
        return DSV4_OK;
    cudaError_t ce = cudaMalloc((void **)dst, n * sizeof(float));
    if (ce == cudaSuccess)
        ce = cudaMemcpy(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice);
    if (ce != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "upload of %s failed: %s", what, cudaGetErrorString(ce));
    return DSV4_OK;
}

} // namespace

/* The workspace bytes of a chunk of tc tokens (no device needed; the tests hold it against the plan). */
extern "C" uint64_t dsv4_cuda_chunk_workspace_bytes(const dsv4_config *cfg, int64_t tc);
extern "C" uint64_t dsv4_cuda_chunk_workspace_bytes(const dsv4_config *cfg, int64_t tc)
{
    CudaBe *b = new (std::nothrow) CudaBe();
    if (!b)
        return 0;
    b->cfg = *cfg;
    set_modes(b);
    b->fast = want_fast(cfg);
    b->fp8 = b->fast && cfg->gemm != DSV4_GEMM_EXACT;
    set_kernels(b);
    uint64_t v = layout_for(b, tc).total;
    delete b;
    return v;
}

/* The largest workspace of chunks of 1 .. n tokens under b's modes (chunks of fewer tokens than the
   workspace's run in it too, and a layout is not monotone in the token count everywhere: the
   router's split-K slices shrink as the chunk grows). */
static uint64_t max_layout(const CudaBe *b, int64_t n)
{
    uint64_t m = 0;
    for (int64_t t = 1; t <= n; t++) {
        const uint64_t v = layout_for(b, t).total;
        m = v > m ? v : m;
    }
    return m;
}

/* An upper bound of max_layout(b, n) in one layout: only the router logits' split-K slices make a
   layout shrink as the chunk grows, so the layout of n with the largest logits buffer of 1 .. n.
   The slices follow the chunk's 128-row blocks, so the largest buffer is at a block's last row. */
static uint64_t layout_bound(const CudaBe *b, int64_t n)
{
    const uint64_t E4 = (uint64_t)b->cfg.n_routed_experts * 4;
    uint64_t lg = 0;
    for (int64_t t = std::min<int64_t>(DSV4C_BM, n);; t = std::min<int64_t>(t + DSV4C_BM, n)) {
        const uint64_t v = align256((uint64_t)logit_slices(b, t) * (uint64_t)t * E4);
        lg = v > lg ? v : lg;
        if (t >= n)
            break;
    }
    const Layout L = layout_for(b, n);
    return L.total - align256((uint64_t)L.lslices * (uint64_t)n * E4) + lg;
}

/* The largest layout of chunks of 1 .. n tokens over what creation decides from the checkpoint,
   each way: the fp8 path or its fallback, a hash table that repeats an expert, the large groups'
   kernel; gemm fp8 off (0), on (1) or either (2). 0 when out of memory. */
static uint64_t layouts_max(const dsv4_config *cfg, int fp8, int64_t n, bool bound)
{
    CudaBe *b = new (std::nothrow) CudaBe();
    if (!b)
        return 0;
    b->cfg = *cfg;
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
                    /* every kernel variant creation may be given (cuda_kernels): the large groups'
                       tile width sets the tile list's capacity */
                    b->fast = f == 1;
                    b->repeats = rep == 1;
                    Kernels kv;
                    kv.mma_tiles = t16 == N_TILEH_BIG;
                    kv.big_var = t16 < N_TILEH_BIG ? t16 : 0;
                    set_kernels(b, kv);
                    b->fp8 = b->fast && g8 == 1;
                    const uint64_t v = bound ? layout_bound(b, n) : max_layout(b, n);
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

extern "C" dsv4_status dsv4_cuda_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ck,
                                                const dsv4_backend_options *opt, void **impl,
                                                const dsv4_backend_vtable **vt, dsv4_error *err)
{
    const int threads = opt->threads;
    const dsv4_config *cfg = dsv4_plan_config(plan);
    const dsv4_topology *topo = dsv4_plan_topology(plan);
    /* A rank of a sharded plan runs the stages (stages.cu) through fast/dist: expert ranges (ep), not
       inter ranges (tp), and in a workspace of its own (stage chunks outgrow the forward's). */
    const bool sharded = dsv4_plan_router(plan) != DSV4_ROUTER_LOCAL ||
                         dsv4_plan_expert_count(plan) != cfg->n_routed_experts;
    if (dsv4_plan_inter_count(plan) != cfg->moe_inter_dim)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE,
                           "the plan splits moe_inter_dim (inter %lld of %lld, tp %d): the cuda stages compute "
                           "every inter row of their experts (ep, dp); tp runs on the cpu and ref backends",
                           (long long)dsv4_plan_inter_count(plan), (long long)cfg->moe_inter_dim, topo->tp);
    if (sharded && opt->workspace)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE,
                           "a rank of a sharded plan runs its stages in the backend's own workspace, not a caller's");
    if (topo->sm != 90)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE, "sm %d: this build's kernels are for sm 90 (Hopper)",
                           topo->sm);
    dsv4_status st = dsv4_config_validate(cfg, err);
    if (st)
        return st;
    Kernels kv;
    if ((st = parse_kernels(opt->cuda_kernels, &kv, err)) != DSV4_OK)
        return st;
    if (cfg->dim % 32 || cfg->moe_inter_dim % 32)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, WHERE,
                           "dim %lld and moe_inter_dim %lld must be multiples of 32 for the cuda kernels",
                           (long long)cfg->dim, (long long)cfg->moe_inter_dim);
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
    b->cfg = *cfg;
    const dsv4_config *c = &b->cfg;
    b->chunk = dsv4_plan_chunk_tokens(plan);
    b->max_tokens = topo->max_tokens_per_rank;
    b->e_first = dsv4_plan_expert_first(plan);
    b->e_count = dsv4_plan_expert_count(plan);
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
        (ce = gemv_attr<WF_BF16, 0>(gsm)) != cudaSuccess || (ce = gemv_attr<WF_BF16, 1>(gsm)) != cudaSuccess ||
        (ce = gemv_attr<WF_FP8, 0>(gsm)) != cudaSuccess || (ce = gemv_attr<WF_FP8, 1>(gsm)) != cudaSuccess ||
        (ce = gemv_attr<WF_FP4, 0>(gsm)) != cudaSuccess || (ce = gemv_attr<WF_FP4, 1>(gsm)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&b->s2, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&b->s3, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&b->s4, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&b->ev_j4, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&b->ev_fork, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&b->ev_j2, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&b->ev_j3, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaDeviceGetAttribute(&b->nsm, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
        (ce = cudaFuncSetAttribute(k_dec<WF_FP4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)dec_smem_bytes(WF_FP4, 8, 2))) != cudaSuccess ||
        (ce = cudaFuncSetAttribute(k_dec<WF_FP8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)dec_smem_bytes(WF_FP8, 8, 2))) != cudaSuccess ||
        (ce = tileh_attrs()) != cudaSuccess ||
        (ce = cudaFuncSetAttribute(k_tile_mid, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TileMid::SMEM)) !=
            cudaSuccess ||
        (ce = cudaFuncSetAttribute(k_tile_big, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TileBig::SMEM)) !=
            cudaSuccess) {
        st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "device setup failed: %s", cudaGetErrorString(ce));
        goto fail;
    }
    if ((st = dsv4_router_tensors_load(ck, c, NULL, &rt, err)))
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
        free(g16);
        if (ce != cudaSuccess) {
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "upload of the gate failed: %s", cudaGetErrorString(ce));
            goto fail_rt;
        }
    }
    if ((st = upload_f32(rt.bias, (size_t)E, &b->bias, "bias", err)) ||
        (st = upload_f32(rt.pred_norm, (size_t)E, &b->pred_norm, "norm predictor", err)) ||
        (st = upload_f32(rt.pred_w, (size_t)(E * H), &b->pred_w, "norm predictor weight", err)) ||
        (st = upload_f32(rt.pred_b, (size_t)E, &b->pred_b, "norm predictor bias", err)))
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
    }
    dsv4_router_tensors_release(&rt, NULL);
    b->fast = want_fast(c, kv.exact_path);
    set_kernels(b, kv);
    if (b->fast) {
        /* the fp8 path: fragment-native weights; a scale the path cannot hold exactly falls back */
        for (int slot = 0; slot < 4 && !st; slot++)
            if (slot < 2 || c->n_shared_experts > 0)
                st = upload_fast(b, ck, slot >= 2, slot % 2 == 0, threads < 1 ? 1 : threads, slot, err);
        if (st == DSV4_ERR_UNSUPPORTED) {
            for (int i = 0; i < 8; i++) {
                cudaFree(b->fbuf[i]);
                b->fbuf[i] = nullptr;
            }
            b->fast = false;
            st = DSV4_OK;
        }
        if (st)
            goto fail;
    }
    if (b->fast && dsv4_plan_gemm(plan) == DSV4_GEMM_FP8) {
        /* gemm fp8: row-major e4m3 copies of every projection for the grouped FP8 GEMM */
        const int64_t ng = E + 1;
        uint8_t *ok = (uint8_t *)malloc((size_t)ng);
        if (!ok) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, WHERE, "out of memory");
            goto fail;
        }
        memset(ok, 1, (size_t)ng);
        ok[E] = c->n_shared_experts > 0;
        for (int slot = 0; slot < 4 && !st; slot++)
            if (slot < 2 || c->n_shared_experts > 0)
                st = upload_fp8(b, ck, slot >= 2, slot % 2 == 0, threads < 1 ? 1 : threads, slot,
                                slot >= 2 ? ok + E : ok, err);
        uint64_t exact = 0;
        for (int64_t e = 0; e < E; e++)
            exact += !ok[e];
        b->all_ok8 = exact == 0 && (c->n_shared_experts == 0 || ok[E]);
        b->stats.fp8_exact_experts = exact + (c->n_shared_experts > 0 && !ok[E]);
        size_t gb[2] = {0, 0};
        if (!st && ((ce = cudaMalloc((void **)&b->ok8, (size_t)ng)) != cudaSuccess ||
                    (ce = cudaMemcpy(b->ok8, ok, (size_t)ng, cudaMemcpyHostToDevice)) != cudaSuccess ||
                    (ce = fp8gemm_create(&b->g8[0], (int)ng, &gb[0])) != cudaSuccess ||
                    (ce = fp8gemm_create(&b->g8[1], (int)ng, &gb[1])) != cudaSuccess))
            st = dsv4_seterr(err, DSV4_ERR_DEVICE, WHERE, "fp8 GEMM setup failed: %s", cudaGetErrorString(ce));
        free(ok);
        if (st)
            goto fail;
        b->fp8 = true;
        b->stats.gemm_fp8 = 1;
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
        b->ws_bytes = sharded ? max_layout(b, ws_rows) : L.total;
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

/* The registry's memory model of a rank of a sharded cuda plan (world > 1): the workspace of its
   largest stage chunk, over the layouts creation may pick (gemm fp8 either way: the model gets
   the layer and topology, not the plan's resolved mode). A single rank keeps the planner's
   executor model (docs/planner.md). */
extern "C" uint64_t dsv4_cuda_stage_workspace_bytes(const dsv4_config *cfg, const dsv4_topology *topo, int64_t tokens)
{
    if (tokens < 1)
        return 0;
    return layouts_max(cfg, 2, stage_rows(cfg, topo, tokens), true);
}
