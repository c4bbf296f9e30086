/*
 * The fp8 tensor-core path of the CUDA backend (fast/cuda): grouped GEMMs on mma.sync.m16n8k32
 * (e4m3 x e4m3, fp32 accumulate) over the fragment-native weights of fragment.h, for fp4 and fp8
 * experts with quantized activations. This header: the fp8 path's argument structs, fragment and
 * epilogue helpers, and the device code of the k_dec and k_tile regimes, inline functions and
 * types only, so any translation unit may include it; the kernels are k_dec (dec.cu), k_tile
 * (tile.cu), k_dec_mix (dec_mix.cu), k_tileh (tileh.cu), the grouping (k_count2) and the
 * quantization of h (k_quant) in mma_group.cuh.
 *
 * The weights are the 16-row A operand and the tokens the 8-column B operand ("swap AB"), so a
 * group of one token wastes nothing on weight traffic. Three regimes by a group's rows, chosen on
 * the device per group (the host only bounds them):
 *   k_dec    at most FM_DEC_MAX rows: weights streamed from global memory into registers (16-byte
 *            non-caching loads, the next 128-wide K block in flight during the math), the group's
 *            activations staged once in shared memory; the eight warps of a block split K when
 *            the plan's chunk is small, and their partial sums are added in a fixed order.
 *   k_tile   mid-size groups (and large ones under DSV4MOE_CUDA_TILE=mma): (BM features x BN
 *            tokens) tiles, weights and activations through a cp.async pipeline in shared
 *            memory; BN = 32 for mid-size groups, 128 above.
 *   k_tileh  large groups: exact f16 wgmma (m64nBNk16) with A = the fp4 / fp8 weights converted
 *            exactly to f16 in registers (fp4 scale folded in) and B = the activations' e4m3 codes
 *            as f16 in shared memory; each 128-wide K block's f32 sum is scaled into the f32
 *            accumulators in block order, as in k_tile. Variants (tokens per block, A decode
 *            pipelined or not, blocks per SM) are listed in tileh.cuh (tileh_big).
 * fp4: each k32 step's partial is multiplied by the row's power-of-two step scale in fp32, and
 * the 128-wide block's sum by the token's activation scale; fp8: the four steps accumulate on the
 * tensor cores, then one multiply by block scale x activation scale. The shared expert is one
 * more group of the same launches. Gate/up weights are interleaved per 8 rows, so each lane holds
 * the gate and up value of one feature: the SwiGLU clamp, silu, router weight and bf16 rounding
 * happen in the GEMM's epilogue (k_quant then quantizes h per 128 features, as the reference).
 */
#ifndef DSV4MOE_FAST_CUDA_MMA_PARTS_CUH
#define DSV4MOE_FAST_CUDA_MMA_PARTS_CUH

#include "fast/cuda/kernels.cuh"
#include "fast/cuda/combine_parts.cuh"
#include "fast/cuda/fragment.h"
#include "fast/cuda/group_parts.cuh"
#include "fast/cuda/bulk_copy.cuh"
#include "fast/cuda/dec_qin.cuh"

namespace dsv4cuda {

/* FM_DEC_MAX, FM_MID_MAX (group_parts.cuh): the group sizes of k_dec and the 32-row tiles */
/* gemm fp8: groups of more rows than this (of experts whose weights converted) run on the
   grouped FP8 GEMM; the smaller ones stay on k_dec and the 32-row tiles. FM_DEC_MAX .. FM_MID_MAX.
   32, measured on the H200 (2026-12-03, v4-flash fp4 routed / fp8 shared, bench_cuda --quick, device
   io): T 1024 2.98 -> 2.39 ms and T 4096 4.32 -> 3.72 ms against 64 (a 17..64-row group's f16 tile
   pass cost more than its 128-row FP8 tile); 16 is 0.1-0.15 ms faster still but puts more small
   groups on the FP8 sums: mini-fp8, T 100, 2.05 % of the outputs beyond atol = rtol = 0.035 (SPEC.md
   section 9 allows 2 %; 32: 1.76 %). dsv4_backend_options.params fp8_cut=N sets another. */
#ifndef DSV4C_FP8_CUT_ROWS
#define DSV4C_FP8_CUT_ROWS 32
#endif
static_assert(DSV4C_FP8_CUT_ROWS >= FM_DEC_MAX && DSV4C_FP8_CUT_ROWS <= FM_MID_MAX, "fp8 cut between the regimes");
/* k_dec splits K over 1, 2, 4 or 8 warps per 16-row tile until the launch has this many blocks per
   multiprocessor (launch_dec; 3 resident at most, __launch_bounds__ below). dec_fill=N sets another. */
#ifndef DSV4C_DEC_FILL
#define DSV4C_DEC_FILL 3
#endif
#define FM_THREADS 256
#define FM_LDA_PAD 16 /* staged activation rows 128 + 16 bytes apart: conflict-free 4-byte B loads */

/* One projection in the fragment-native layout: every routed expert (strided) or the shared one. */
struct FProj {
    const uint8_t *w = nullptr, *s = nullptr;
    long long w_stride = 0, s_stride = 0; /* bytes per expert */
    int fmt = 0;                          /* WF_FP4 or WF_FP8 */
};

struct FastArgs {
    FProj r, sh;     /* routed, shared (sh.w == NULL: no shared expert) */
    int N, K;        /* weight rows (gate/up: 2 I, interleaved), inner dimension (multiple of 128) */
    int gu;          /* gate/up with the SwiGLU epilogue (output h [*, N / 2]); else plain [*, N] */
    const uint8_t *A;   /* routed activation codes [*, K] */
    const float *As;    /* their scales [*, K / 128] */
    int gather;         /* routed row j of a group is A row slot_tok[slot0 + j]; else pad_off[e] + j */
    const uint8_t *Ash; /* the shared expert's activations, rows 0 .. ntok - 1 */
    const float *Assh;
    const uint16_t *A16, *Ash16; /* the same codes as f16 in k_tileh's K order (routed, shared) */
    uint16_t *out, *out_sh; /* bf16: routed by padded row, shared by token */
    const float *slot_w;
    int before, clamp_r, clamp_s;
    float L;
    unsigned long long *stats;
    const int *ntok, *cnt, *slot_off, *pad_off, *active, *meta;
    const int *tile_e, *tile_r0; /* this regime's tile list (tile_e == E: the shared expert) */
    int meta_tiles;              /* meta index of this regime's tile count */
    const int32_t *slot_tok;
    int E;
    int act_max; /* k_dec: grid.y slots below act_max are routed active groups, the next is the
                    shared expert (act_max 0 with one slot: the shared expert alone) */
    int ks;      /* k_dec: warps splitting K per 16-row tile (1, 2, 4 or 8) */
    int ks_sh;   /* k_dec_mix: the shared expert's group's (its routed groups take ks) */
    int pf;      /* k_dec_mix: each block's weight range into L2 first (params dec_pf=l2) */
    int *fc_cnt; /* down of a chunk whose groups all run in k_dec, combine folded in (cuda_kernels
                    combine=fold): per 16-row tile of o, the blocks that have written it (zeroed by
                    k_quant, or by the grouping with quant=fold or down); NULL: k_combine runs after */
    CombineArgs fc; /* that combine */
    int *qf_cnt;    /* gate/up of a chunk whose groups all run in k_dec, the quantization of h folded in
                       (params quant=fold): per group (routed expert e at e, the shared expert at E)
                       and 128-feature group of h, the blocks that have written it (zeroed by the
                       grouping, group_parts.cuh); NULL: k_quant runs after */
    uint8_t *qf_q;  /* then h's codes [rows, I] and scales [rows, I / 128], rows as h's */
    float *qf_s;
    long long qf_sh_row0; /* the shared expert's first row of h (its out_sh is h + qf_sh_row0 I) */
    int qmode;            /* the activation quantization (SPEC.md 5) */
    int qin; /* down of a chunk whose groups all run in k_dec (params quant=down): the most rows a group
                holds (at most FM_DEC_QIN_MAX; 0: off); A and Ash are bf16 h, each block quantizes
                its group's rows (dec_qin.cuh) into the shared memory after its partial sums */
    int early, early_need, early_K, early_blocks; /* params dec_pf=early (dec_early.cuh): 0 off, 1 gate/up, 2 down */
    const int *early_ticket, *early_ids; /* the router's ticket (early_need blocks take it), its ids */
};

/* One group as a block sees it. */
struct FGrp {
    const uint8_t *w, *s;
    int fmt;
    const uint8_t *A;
    const float *As;
    const int32_t *gat; /* gathered A rows, or NULL: rows arow0 + j */
    long long arow0;
    uint16_t *out;
    long long orow0;
    int n;
    int slot0; /* first compact slot; -1 for the shared expert */
    int e;     /* the expert: E for the shared one */
};

__device__ __forceinline__ void fgrp_routed(const FastArgs &a, int e, FGrp &g)
{
    g.w = a.r.w + (long long)e * a.r.w_stride;
    g.s = a.r.s + (long long)e * a.r.s_stride;
    g.fmt = a.r.fmt;
    g.A = a.A;
    g.As = a.As;
    g.slot0 = a.slot_off[e];
    g.gat = a.gather ? a.slot_tok + g.slot0 : nullptr;
    g.arow0 = a.pad_off[e];
    g.out = a.out;
    g.orow0 = a.pad_off[e];
    g.n = a.cnt[e];
    g.e = e;
}

__device__ __forceinline__ void fgrp_shared(const FastArgs &a, FGrp &g)
{
    g.w = a.sh.w;
    g.s = a.sh.s;
    g.fmt = a.sh.fmt;
    g.A = a.Ash;
    g.As = a.Assh;
    g.gat = nullptr;
    g.arow0 = 0;
    g.out = a.out_sh;
    g.orow0 = 0;
    g.n = *a.ntok;
    g.slot0 = -1;
    g.e = a.E;
}

/* Whether k_dec runs the shared expert's group for n live tokens (its blocks return otherwise). */
__device__ __forceinline__ bool dec_shared_runs(const FastArgs &a, int n) { return a.sh.w && n >= 1 && n <= FM_DEC_MAX; }

__device__ __forceinline__ long long fgrp_arow(const FGrp &g, int j) { return g.gat ? (long long)g.gat[j] : g.arow0 + j; }

__device__ __forceinline__ void mma_e4m3(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async8(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_u32(dst)), "l"(src)
                 : "memory");
}

__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/*
 * The epilogue of one (feature or row pair, token): gate/up: v0 = gate, v1 = up of feature
 * 8 mt + gid -> h = silu(min(g, L)) * clamp(u, -L, L) (times the router weight before w2),
 * bf16, as k_swiglu; plain: v0 row 16 mt + gid, v1 row 16 mt + gid + 8, bf16.
 */
__device__ __forceinline__ void fepi(const FastArgs &a, const FGrp &g, int mt, int gid, int j, float v0, float v1,
                                     unsigned &gc, unsigned &uc)
{
    const long long orow = g.orow0 + j;
    if (a.gu) {
        const int I = a.N >> 1, f = mt * 8 + gid;
        float h = swiglu_h(rbf16(v0), rbf16(v1), (g.slot0 < 0 ? a.clamp_s : a.clamp_r) && a.L > 0.0f, a.L, gc, uc);
        if (g.slot0 >= 0 && a.before)
            h = __fmul_rn(h, a.slot_w[g.slot0 + j]);
        g.out[orow * I + f] = f2bf16(h);
    } else {
        const int r = mt * 16 + gid;
        g.out[orow * a.N + r] = f2bf16(v0);
        g.out[orow * a.N + r + 8] = f2bf16(v1);
    }
}

__device__ __forceinline__ void fepi_stats(const FastArgs &a, const FGrp &g, unsigned gc, unsigned uc)
{
    unsigned long long g64 = warp_sum_u64(gc), u64 = warp_sum_u64(uc);
    if ((threadIdx.x & 31) == 0 && (g64 || u64)) {
        atomicAdd(&a.stats[g.slot0 < 0 ? ST_SG : ST_RG], g64);
        atomicAdd(&a.stats[g.slot0 < 0 ? ST_SU : ST_RU], u64);
    }
}

/* The A fragment of k32 step c from a lane's fp4 words (row half 0: w0, half 1: w1). */
__device__ __forceinline__ void frag_fp4(uint32_t w0, uint32_t w1, uint32_t &a0, uint32_t &a1, uint32_t &a2, uint32_t &a3)
{
    a0 = dsv4_fn_lo(w0);
    a1 = dsv4_fn_lo(w1);
    a2 = dsv4_fn_hi(w0);
    a3 = dsv4_fn_hi(w1);
}

__device__ __forceinline__ uint32_t u4_at(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

__device__ __forceinline__ float fp4_step_scale(uint32_t bytes, int c)
{
    return __uint_as_float(dsv4_fn_fp4_scale_bits(bytes, c));
}

/* The weight-block times activation scale of one (row half, token) pair; fp4's block scale is
   in the steps already. */
template <int FMT> __device__ __forceinline__ float block_scale(float w, float x)
{
    if constexpr (FMT == WF_FP8)
        return __fmul_rn(w, x);
    else
        return x;
}

/* ---------------- decode regime ---------------- */

#define FM_DEC_RING_FP4 4 /* k128 blocks per warp in its cp.async ring */
#define FM_DEC_RING_FP8 3
/* params dec_ring=deep (k_dec only): rings of this many k128 blocks, about 7 KB of a warp's
   weights in flight instead of 3 (fp4) or 4 (fp8), so a launch whose K is not split (each warp
   streams all of its tile's K blocks) keeps enough bytes in flight to cover DRAM latency: 80 KB
   (fp4) or 72 KB (fp8) of rings a block, two blocks a multiprocessor (k_dec bounded for two).
   dec_ring=bulk: the same rings, each stage's weights one bulk asynchronous copy (cp.async.bulk,
   the copy engine's: one instruction of lane 0 where the lanes issued 2 or 4 16-byte copies each)
   completing on the stage's mbarrier; the scale bytes stay per-lane copies. dec_ring=bulk_ef: those
   copies marked evict-first in L2 (an L2 cache-hint policy), so a step's weights, read once, leave
   the rest of L2 (activations, the workspace, the kernels' code) where it is. */
#define FM_DEC_RING_FP4_DEEP 8
#define FM_DEC_RING_FP8_DEEP 4
enum { RING_STD = 0, RING_DEEP = 1, RING_BULK = 2, RING_BULK_EF = 3 }; /* params dec_ring std|deep|bulk|bulk_ef */

template <int FMT, int RG = RING_STD> struct DecCfg { /* RG: the rings, RING_* */
    enum {
        CH = FMT == WF_FP4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK,
        SCH = FMT == WF_FP4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK,
        NV = FMT == WF_FP4 ? 2 : 4,      /* 16-byte pieces a lane owns per chunk */
        STG = NV * 512 + 256,            /* one ring stage: the chunk, then every lane's 8 scale bytes */
        DEPTH = FMT == WF_FP4 ? (RG != RING_STD ? FM_DEC_RING_FP4_DEEP : FM_DEC_RING_FP4)
                              : (RG != RING_STD ? FM_DEC_RING_FP8_DEEP : FM_DEC_RING_FP8),
        RING = 8 * DEPTH * STG           /* per block (8 warps) */
    };
};

/*
 * B staged in shared memory (params dec_b=smem; fp4 launches whose K is not split, ks 1,
 * other than the folded down projection, pipeline.cuh launch_dec): all eight warps of a block read the same activation rows at the same K block,
 * and from L1 each 4-byte B load of a warp touches one 128-byte line per token row (up to eight
 * per instruction, four instructions per k32 step and token tile), the same lines for every
 * warp. The block copies each FM_DEC_SLAB K blocks of the group's rows once (cp.async, in the
 * commit group of a ring stage), double-buffered, one barrier per slab; rows FM_DEC_SLAB_LD bytes
 * apart so a warp's reads hit 32 different banks. The products and their order are unchanged.
 * Not the default yet: measured faster at T = 256 and slower at T = 8 (docs/cuda.md, "B rows in
 * shared memory").
 */
#define FM_DEC_SLAB 4
#define FM_DEC_SLAB_LD (FM_DEC_SLAB * 128 + 16)
#define FM_DEC_SLAB_BYTES (FM_DEC_MAX * FM_DEC_SLAB_LD)
#define FM_DEC_SLABS_BYTES (2 * FM_DEC_SLAB_BYTES)

/* The block's copy of slab sl (K blocks FM_DEC_SLAB sl ..) of the group's rows into its buffer. */
__device__ __forceinline__ void dec_stage_slab(const FGrp &g, int K, int sl, uint8_t *slabs)
{
    const int KB = K >> 7, kb0 = sl * FM_DEC_SLAB, nb = min(FM_DEC_SLAB, KB - kb0);
    if (nb <= 0)
        return;
    uint8_t *dst = slabs + (sl & 1) * FM_DEC_SLAB_BYTES;
    constexpr int PR = FM_DEC_SLAB * 8; /* 16-byte pieces per slab row */
    for (int p = threadIdx.x; p < g.n * PR; p += blockDim.x) {
        const int r = p / PR, q = p % PR;
        if (q < nb * 8)
            cp_async16(dst + r * FM_DEC_SLAB_LD + q * 16, g.A + fgrp_arow(g, r) * K + (size_t)kb0 * 128 + q * 16, true);
    }
}

/* Bytes of k_dec<FMT>'s dynamic shared memory: the warps' rings (deep: dec_ring=deep's or bulk's,
   the same size), then the K-split partial sums or (sb) the B slabs; with params quant=down the
   quantized rows follow (dec_qin_bytes, at this offset). */
__host__ __device__ constexpr size_t dec_smem_bytes(int fmt, int ks, int nt, bool sb = false, bool deep = false)
{
    return (fmt == WF_FP4 ? (deep ? (size_t)DecCfg<WF_FP4, RING_DEEP>::RING : (size_t)DecCfg<WF_FP4>::RING)
                          : (deep ? (size_t)DecCfg<WF_FP8, RING_DEEP>::RING : (size_t)DecCfg<WF_FP8>::RING)) +
           (sb ? (size_t)FM_DEC_SLABS_BYTES : ks > 1 ? (size_t)FM_THREADS * (size_t)nt * 16 : 0);
}

/*
 * One warp: 16-row tile mt over its K blocks kb = ks, ks + KS, ..., for NT token tiles of 8.
 * Weights (and the lane's scale bytes) stream through the warp's cp.async ring, DEPTH - 1
 * blocks ahead; each lane copies and later reads only its own bytes, so no barrier is needed.
 * The group's activations (a few rows) are read through L1, or with SB (KS 1, every warp of the
 * block here) from the block's slabs, or with QI (params quant=down: g.A is bf16 h, rows g.arow0 ..)
 * from the buffer `slabs` the block quantizes them into (dec_qin.cuh) once the warps' first ring
 * stages are in flight. Returns the fp32 sums.
 */
template <int FMT, int NT, bool SB, int RING = RING_STD, bool QI = false>
__device__ __forceinline__ void dec_warp(const FGrp &g, int mt, int ks, int KS, int K, uint8_t *ring, uint8_t *slabs,
                                         float acc[NT][4], int qmode = 0)
{
    typedef DecCfg<FMT, RING> D;
    constexpr bool BULK = RING == RING_BULK || RING == RING_BULK_EF, EF = RING == RING_BULK_EF;
    static_assert(!(BULK && SB), "the bulk rings without B slabs");
    static_assert(!(QI && (SB || RING != RING_STD)), "quant=down on the standard rings without slabs");
    const int KB = K >> 7;
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const uint8_t *wt = g.w + (size_t)mt * KB * D::CH + lane * 16;
    const uint8_t *st = g.s + (size_t)mt * KB * D::SCH + (FMT == WF_FP4 ? gid * 8 : 0);
    /* this lane's B rows (tokens gid + 8 j) and scale rows (tokens 2 tig + {0, 1} + 8 j), at K
       block ks. A lane past the group's rows reads its last row instead: an mma column depends
       only on its own B column and the epilogue never stores columns past g.n, so the loads need
       no branch (a divergent one per k32 step cost more than the loads). */
    const uint8_t *brow[NT];
    const float *srow[NT][2];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int tb = min(8 * j + gid, g.n - 1);
        if constexpr (SB)
            brow[j] = slabs + tb * FM_DEC_SLAB_LD + 4 * tig; /* + the slab buffer and K block, per step */
        else if constexpr (QI)
            brow[j] = slabs + (size_t)tb * dec_qin_ld(K) + (size_t)ks * 128 + 4 * tig;
        else
            brow[j] = g.A + fgrp_arow(g, tb) * K + (size_t)ks * 128 + 4 * tig;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int tq = min(8 * j + 2 * tig + q, g.n - 1);
            if constexpr (QI)
                srow[j][q] = dec_qin_scales(slabs, g.n, K) + tq * KB + ks;
            else
                srow[j][q] = g.As + fgrp_arow(g, tq) * KB + ks;
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[j][i] = 0.0f;
    const int nkb = ks < KB ? (KB - ks + KS - 1) / KS : 0;
    const size_t bstep = (size_t)KS * 128; /* the pointers advance: each load takes an immediate offset */
    /* BULK: the warp's stage barriers, one arrival each (lane 0's), initialised once per call, and
       its tile's weights, each stage's chunk copied whole */
    uint64_t *bar = nullptr, pol = 0;
    const uint8_t *const wtile = wt - lane * 16;
    if constexpr (EF)
        pol = l2_evict_first();
    if constexpr (BULK) {
        __shared__ uint64_t s_bar[(FM_THREADS / 32) * D::DEPTH];
        bar = s_bar + (threadIdx.x >> 5) * D::DEPTH;
        if (lane == 0) {
            for (int d = 0; d < D::DEPTH; d++)
                mbar_init(bar + d, 1);
            mbar_init_fence();
        }
        __syncwarp();
    }
    auto issue = [&](int i) {
        if constexpr (BULK) {
            /* the stage refilled here was read by every lane one step ago: all of them are past
               it before lane 0 hands it to the copy engine (and its reads before the async write) */
            __syncwarp();
            if (i < nkb) {
                const int kb = ks + i * KS, d = i % D::DEPTH;
                uint8_t *stg = ring + d * D::STG;
                if (lane == 0) {
                    fence_async_smem();
                    mbar_expect_tx(bar + d, D::NV * 512);
                    if constexpr (EF)
                        bulk_g2s_hint(stg, wtile + (size_t)kb * D::CH, D::NV * 512, bar + d, pol);
                    else
                        bulk_g2s(stg, wtile + (size_t)kb * D::CH, D::NV * 512, bar + d);
                }
                cp_async8(stg + D::NV * 512 + lane * 8, st + (size_t)kb * D::SCH);
            }
        } else if (i < nkb) {
            const int kb = ks + i * KS;
            uint8_t *stg = ring + (i % D::DEPTH) * D::STG;
#pragma unroll
            for (int p = 0; p < D::NV; p++)
                cp_async16(stg + p * 512 + lane * 16, wt + (size_t)kb * D::CH + p * 512, true);
            cp_async8(stg + D::NV * 512 + lane * 8, st + (size_t)kb * D::SCH);
        }
        if constexpr (SB) {
            /* at a slab's first step, the next slab rides with the stage issued there (DEPTH - 1
               ahead, at most FM_DEC_SLAB): the wait before the next slab's first step covers it */
            static_assert(D::DEPTH - 1 <= FM_DEC_SLAB, "the next slab lands before it is read");
            const int it = i - (D::DEPTH - 1);
            if (it >= 0 && it % FM_DEC_SLAB == 0)
                dec_stage_slab(g, K, it / FM_DEC_SLAB + 1, slabs);
        }
        cp_async_commit();
    };
    if constexpr (SB)
        dec_stage_slab(g, K, 0, slabs); /* in stage 0's group */
#pragma unroll
    for (int i = 0; i < D::DEPTH - 1; i++)
        issue(i);
    if constexpr (QI) { /* the weights' first stages are on their way; every warp of the block is here */
        dec_quant_rows((const uint16_t *)g.A + g.arow0 * K, g.n, K, slabs, qmode);
        __syncthreads();
    }
    for (int i = 0; i < nkb; i++) {
        cp_async_wait<D::DEPTH - 2>();
        if constexpr (BULK) /* the stage's weights (the scale bytes: the wait above) */
            mbar_wait(bar + i % D::DEPTH, (unsigned)(i / D::DEPTH) & 1u);
        const uint8_t *bb[NT]; /* this step's B rows */
#pragma unroll
        for (int j = 0; j < NT; j++)
            bb[j] = brow[j];
        if constexpr (SB) {
            if (i % FM_DEC_SLAB == 0)
                __syncthreads(); /* the slab is the whole block's, and every warp is done with the one before */
#pragma unroll
            for (int j = 0; j < NT; j++)
                bb[j] += ((i / FM_DEC_SLAB) & 1) * FM_DEC_SLAB_BYTES + (i % FM_DEC_SLAB) * 128;
        }
        const uint8_t *stg = ring + (i % D::DEPTH) * D::STG;
        uint4 wv[D::NV];
#pragma unroll
        for (int p = 0; p < D::NV; p++)
            wv[p] = *(const uint4 *)(stg + p * 512 + lane * 16);
        const uint2 sv = *(const uint2 *)(stg + D::NV * 512 + lane * 8);
        issue(i + D::DEPTH - 1);
        float blk[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                blk[j][q] = 0.0f;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t a0, a1, a2, a3;
            if constexpr (FMT == WF_FP4) {
                frag_fp4(u4_at(wv[0], c), u4_at(wv[1], c), a0, a1, a2, a3);
            } else {
                const uint4 h0 = wv[c >> 1], h1 = wv[2 + (c >> 1)];
                a0 = (c & 1) ? h0.z : h0.x;
                a2 = (c & 1) ? h0.w : h0.y;
                a1 = (c & 1) ? h1.z : h1.x;
                a3 = (c & 1) ? h1.w : h1.y;
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                uint32_t b0, b1;
                if constexpr (SB || QI) {
                    b0 = *(const uint32_t *)(bb[j] + c * 32);
                    b1 = *(const uint32_t *)(bb[j] + c * 32 + 16);
                } else {
                    b0 = __ldg((const uint32_t *)(bb[j] + c * 32));
                    b1 = __ldg((const uint32_t *)(bb[j] + c * 32 + 16));
                }
                mma_e4m3(FMT == WF_FP4 ? t : blk[j], a0, a1, a2, a3, b0, b1);
                if constexpr (FMT == WF_FP4) {
                    const float s0 = fp4_step_scale(sv.x, c), s1 = fp4_step_scale(sv.y, c);
                    blk[j][0] = fmaf(t[0], s0, blk[j][0]);
                    blk[j][1] = fmaf(t[1], s0, blk[j][1]);
                    blk[j][2] = fmaf(t[2], s1, blk[j][2]);
                    blk[j][3] = fmaf(t[3], s1, blk[j][3]);
                }
            }
        }
        float w0 = 1.0f, w1 = 1.0f;
        if constexpr (FMT == WF_FP8) {
            w0 = __uint_as_float(sv.x);
            w1 = __uint_as_float(sv.y);
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const float x0 = QI ? *srow[j][0] : __ldg(srow[j][0]), x1 = QI ? *srow[j][1] : __ldg(srow[j][1]);
            acc[j][0] = fmaf(blk[j][0], block_scale<FMT>(w0, x0), acc[j][0]);
            acc[j][1] = fmaf(blk[j][1], block_scale<FMT>(w0, x1), acc[j][1]);
            acc[j][2] = fmaf(blk[j][2], block_scale<FMT>(w1, x0), acc[j][2]);
            acc[j][3] = fmaf(blk[j][3], block_scale<FMT>(w1, x1), acc[j][3]);
            if constexpr (!SB)
                brow[j] += bstep;
            srow[j][0] += KS;
            srow[j][1] += KS;
        }
    }
    cp_async_wait<0>();
}

#define FC_KMAX 16 /* the folded combine sorts a token's slots (in the ring, below): K up to this */
static_assert(2 * FM_DEC_MAX * 4 * FC_KMAX * 4 <= (int)DecCfg<WF_FP4>::RING &&
                  2 * FM_DEC_MAX * 4 * FC_KMAX * 4 <= (int)DecCfg<WF_FP8>::RING,
              "the folded combine's slot lists fit the decode ring");

/*
 * The combine folded into the down projection (a.fc_cnt): a k_dec block that has written its
 * tiles of o (mt0 .. mt0 + tiles - 1, 16 rows of H each) counts itself on each tile; the block
 * that brings a tile's count to the number of groups writing it (the chunk's active routed groups,
 * every one in k_dec, and the shared expert, whose k_dec may be another launch on another stream
 * with another K split) sums that tile's 16 columns of y for every token, as k_combine would
 * (combine_cols, the same order and roundings), reading o through L2 after a fence. The counts
 * order nothing but the last writer: no sum depends on timing.
 */
static __device__ __noinline__ void fold_combine(const CombineArgs c, int *cnt, int need, int nt, int mt0,
                                                int tiles, uint8_t *ring)
{
    __shared__ int s_last[8];
    __threadfence(); /* this thread's rows of o, before the block counts itself */
    __syncthreads();
    if ((int)threadIdx.x < tiles)
        s_last[threadIdx.x] = atomicAdd(cnt + mt0 + threadIdx.x, 1) == need - 1;
    __syncthreads();
    for (int i = 0; i < tiles; i++) {
        if (!s_last[i])
            continue;
        __threadfence();
        for (int w = threadIdx.x; w < 2 * nt; w += blockDim.x) {
            const int t = w >> 1, col = (mt0 + i) * 16 + (w & 1) * 8;
            /* the thread's slot lists in the block's ring, free since the barrier above */
            int *sid = (int *)ring + threadIdx.x * 4 * FC_KMAX, *srow = sid + FC_KMAX, *rows = srow + FC_KMAX,
                *slot = rows + FC_KMAX;
            for (int k = 0; k < c.K; k++) {
                sid[k] = c.ids[(long long)t * c.K + k];
                srow[k] = sid[k] < c.E ? c.rowmap[(long long)t * c.K + k] : 0;
            }
            combine_cols<true>(c, t, col, rows, slot, combine_order(c, sid, srow, rows, slot));
        }
    }
}

/* What a decode block does after its tiles' epilogue: nothing, the folded combine (the down
   projection, fold_combine), or the folded quantization of h (gate/up, fold_quant). */
enum { EPI_NONE = 0, EPI_COMBINE = 1, EPI_QUANT = 2 };

/*
 * The quantization of h folded into gate/up (a.qf_cnt): a k_dec block that has written its tiles of
 * h (8 features each, all of one 128-feature group) counts itself on that group's count cnt; the
 * block that brings it to `need` (the 2 KS blocks writing those features) quantizes the n rows'
 * 128 features (h rows hrow0 .., codes and scales rows crow0 .., all pointers at the feature
 * group's first column) as k_quant does: one warp a row, quant_group4 on the values read through
 * L2 after a fence, so the same codes and scales. The counts order nothing but the last writer.
 */
static __device__ __noinline__ void fold_quant(int *cnt, int need, const uint16_t *h, long long hrow0,
                                              uint8_t *codes, float *scales, long long crow0, int n, int I, int qmode)
{
    __shared__ int s_last;
    __threadfence(); /* this thread's h, before the block counts itself */
    __syncthreads();
    if (threadIdx.x == 0)
        s_last = atomicAdd(cnt, 1) == need - 1;
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ng = I >> 7;
    for (int j = warp; j < n; j += (int)(blockDim.x >> 5)) {
        const uint2 raw = __ldcg((const uint2 *)(h + (hrow0 + j) * I + lane * 4));
        float v[4];
        const bool ok[4] = {true, true, true, true};
        uint8_t c[4];
        v[0] = bf16f((uint16_t)raw.x), v[1] = bf16f((uint16_t)(raw.x >> 16));
        v[2] = bf16f((uint16_t)raw.y), v[3] = bf16f((uint16_t)(raw.y >> 16));
        const float sc = quant_group4(v, ok, qmode, c);
        *(uint32_t *)(codes + (crow0 + j) * I + lane * 4) =
            (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) | ((uint32_t)c[3] << 24);
        if (lane == 0)
            scales[(crow0 + j) * ng] = sc;
    }
}

template <int FMT, int NT, int EPI, bool SB, int RING = RING_STD, bool QI = false>
__device__ __forceinline__ void dec_block(const FastArgs &a, const FGrp &g, int KS, int bx, uint8_t *ring, float *sRed)
{
    typedef DecCfg<FMT, RING> D;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int mt = bx * (8 / KS) + warp / KS, ks = warp % KS; /* bx: the block's place along N */
    float acc[NT][4];
    /* the slabs sit where a K split's partial sums would (SB: no split) */
    /* QI: the quantized rows after the rings and the partial sums (dec_smem_bytes) */
    uint8_t *const slabs = QI ? ring + dec_smem_bytes(FMT, KS, 2) : (uint8_t *)sRed;
    dec_warp<FMT, NT, SB, RING, QI>(g, mt, ks, KS, a.K, ring + (size_t)warp * D::DEPTH * D::STG, slabs, acc, a.qmode);
    if (KS > 1) {
        float *mine = sRed + ((size_t)warp * 32 + lane) * (NT * 4);
        if (ks > 0) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    mine[j * 4 + i] = acc[j][i];
        }
        __syncthreads();
        if (ks == 0) {
            for (int q = 1; q < KS; q++) { /* fixed order: the sums do not depend on timing */
                const float *o = mine + (size_t)q * 32 * (NT * 4);
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc[j][i] += o[j * 4 + i];
            }
        }
    }
    if (ks == 0) {
        unsigned gc = 0, uc = 0;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int t0 = 8 * j + 2 * tig;
            if (t0 < g.n)
                fepi(a, g, mt, gid, t0, acc[j][0], acc[j][2], gc, uc);
            if (t0 + 1 < g.n)
                fepi(a, g, mt, gid, t0 + 1, acc[j][1], acc[j][3], gc, uc);
        }
        if (a.gu)
            fepi_stats(a, g, gc, uc);
    }
    if constexpr (EPI == EPI_COMBINE) { /* a kernel of its own and a call: k_dec's main loop keeps its registers */
        const int nt = *a.ntok, need = a.meta[0] + (dec_shared_runs(a, nt) ? 1 : 0);
        fold_combine(a.fc, a.fc_cnt, need, nt, bx * (8 / KS), 8 / KS, ring);
    }
    if constexpr (EPI == EPI_QUANT) { /* the 16 tiles of a 128-feature group are 2 KS blocks' */
        const int I = a.N >> 1, q = bx * (8 / KS) / 16;
        fold_quant(a.qf_cnt + (long long)g.e * (I >> 7) + q, 2 * KS, g.out + q * 128, g.orow0, a.qf_q + q * 128,
                   a.qf_s + q, (g.slot0 < 0 ? a.qf_sh_row0 : 0) + g.orow0, g.n, I, a.qmode);
    }
}

/*
 * params dec_pf=l2 (k_dec_mix): the weights and scales that the block at place bx reads (tiles 8/KS x ..
 * of one group, all of K: one contiguous range each in the fragment-native layout) brought into L2
 * by the copy engine at once (cp.async.bulk.prefetch, one thread), so the block's DRAM reads are
 * all in flight from its start rather than its warps' few ring stages at a time. A hint: it
 * changes no value. Only the 16-byte-aligned inside of each range is asked for.
 */
__device__ __forceinline__ void prefetch_l2_range(const uint8_t *p, long long bytes)
{
    const uintptr_t a = ((uintptr_t)p + 15) & ~(uintptr_t)15, e = ((uintptr_t)p + (uintptr_t)bytes) & ~(uintptr_t)15;
    for (uintptr_t q = a; q < e; q += 65536) {
        const unsigned n = (unsigned)(e - q < 65536 ? e - q : 65536);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(q), "r"(n) : "memory");
    }
}

__device__ __forceinline__ void dec_prefetch(const uint8_t *w, const uint8_t *s, int fmt, int K, int KS, int bx)
{
    const long long KB = K >> 7, mt0 = (long long)bx * (8 / KS), tiles = 8 / KS;
    const long long ch = fmt == WF_FP4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK;
    const long long sch = fmt == WF_FP4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    prefetch_l2_range(w + mt0 * KB * ch, tiles * KB * ch);
    prefetch_l2_range(s + mt0 * KB * sch, tiles * KB * sch);
}

/* Slot y of a decode launch's routed groups into g: false when the chunk has no such active
   group or it has more rows than the decode regime takes (its block returns). */
__device__ __forceinline__ bool dec_routed_group(const FastArgs &a, int y, FGrp &g)
{
    if (y >= a.meta[0])
        return false;
    const int e = a.active[y];
    if (a.cnt[e] > FM_DEC_MAX)
        return false;
    fgrp_routed(a, e, g);
    return true;
}

/* One decode block's group (format FMT, K split KS) at place bx along N: one or two 8-token
   tiles by its rows; RING: the rings of params dec_ring (RING_*); QI: params quant=down (dec_warp). */
template <int FMT, int EPI, bool SB, int RING = RING_STD, bool QI = false>
__device__ __forceinline__ void dec_group(const FastArgs &a, const FGrp &g, int KS, int bx, uint8_t *fsm)
{
    float *sRed = (float *)(fsm + DecCfg<FMT, RING>::RING);
    if (g.n <= 8)
        dec_block<FMT, 1, EPI, SB, RING, QI>(a, g, KS, bx, fsm, sRed);
    else
        dec_block<FMT, 2, EPI, SB, RING, QI>(a, g, KS, bx, fsm, sRed);
}




/* ---------------- decode regime on wgmma (sm_90a) ---------------- */

/*
 * The shared-memory matrix descriptor of a K-major operand without swizzle: core matrices of
 * 8 rows x 16 bytes (128 contiguous bytes), lbo = byte distance between core matrices along K,
 * sbo = along N.
 */
__device__ __forceinline__ uint64_t wg_desc(const void *smem, uint32_t lbo, uint32_t sbo)
{
    const uint64_t a = smem_u32(smem);
    return ((a & 0x3FFFFull) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}


/* ---------------- tile regime ---------------- */

/* The group of a tile kernel's block (k_tile, k_tileh): false when blockIdx.y is past the regime's
   tile count; else the routed or shared group and the tile's first row r0. */
__device__ __forceinline__ bool tile_group(const FastArgs &a, FGrp &g, int &r0)
{
    const int t = blockIdx.y;
    if (t >= a.meta[a.meta_tiles])
        return false;
    const int e = a.tile_e[t];
    r0 = a.tile_r0[t];
    if (e >= a.E)
        fgrp_shared(a, g);
    else
        fgrp_routed(a, e, g);
    return true;
}

/* The tile's bn activation rows (gathered; -1 past the group) into sRow. */
__device__ __forceinline__ void tile_rows(const FGrp &g, int r0, int bn, long long *sRow)
{
    for (int r = threadIdx.x; r < bn; r += blockDim.x)
        sRow[r] = r0 + r < g.n ? fgrp_arow(g, r0 + r) : -1;
}

template <int WM, int WN, int WARPS_M, int WARPS_N, int STAGES> struct TileCfg {
    enum {
        MTB = WM * WARPS_M,       /* 16-row tiles per block */
        BM = 16 * MTB,
        BN = 8 * WN * WARPS_N,
        THREADS = 32 * WARPS_M * WARPS_N,
        W_BYTES = MTB * DSV4_FN_FP8_CHUNK, /* room for the larger (fp8) chunk */
        WS_BYTES = MTB * DSV4_FN_FP4_SCHUNK,
        A_LD = 128 + FM_LDA_PAD,
        A_BYTES = BN * A_LD,
        AS_BYTES = BN * 4,
        STAGE = W_BYTES + WS_BYTES + A_BYTES + AS_BYTES,
        SMEM = STAGES * STAGE + BN * 8 /* the gathered A rows */
    };
};

typedef TileCfg<2, 4, 4, 1, 3> TileMid; /* 128 x 32, 4 warps */
typedef TileCfg<4, 4, 2, 4, 3> TileBig; /* 128 x 128, 8 warps */

template <class C, int FMT>
__device__ __forceinline__ void tile_load(const FGrp &g, int mt0, int kb, int KB, int K, uint8_t *stage,
                                          const long long *sRow)
{
    constexpr int CH = FMT == WF_FP4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK;
    constexpr int SCH = FMT == WF_FP4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    uint8_t *sW = stage, *sWS = stage + C::W_BYTES, *sA = sWS + C::WS_BYTES;
    float *sAS = (float *)(sA + C::A_BYTES);
    const int tid = threadIdx.x;
    for (int i = tid; i < C::MTB * (CH / 16); i += C::THREADS) {
        const int q = i / (CH / 16), off = (i - q * (CH / 16)) * 16;
        cp_async16(sW + q * CH + off, g.w + ((size_t)(mt0 + q) * KB + kb) * CH + off, true);
    }
    if constexpr (FMT == WF_FP4) {
        for (int i = tid; i < C::MTB * (SCH / 16); i += C::THREADS) {
            const int q = i / (SCH / 16), off = (i - q * (SCH / 16)) * 16;
            cp_async16(sWS + q * SCH + off, g.s + ((size_t)(mt0 + q) * KB + kb) * SCH + off, true);
        }
    } else {
        for (int i = tid; i < C::MTB; i += C::THREADS)
            cp_async8(sWS + i * SCH, g.s + ((size_t)(mt0 + i) * KB + kb) * SCH);
    }
    for (int i = tid; i < C::BN * 8; i += C::THREADS) {
        const int r = i >> 3, off = (i & 7) * 16;
        const long long ar = sRow[r];
        cp_async16(sA + r * C::A_LD + off, ar >= 0 ? g.A + ar * K + kb * 128 + off : g.A, ar >= 0);
    }
    for (int r = tid; r < C::BN; r += C::THREADS) {
        const long long ar = sRow[r];
        cp_async4(sAS + r, ar >= 0 ? g.As + ar * KB + kb : g.As, ar >= 0);
    }
}

/* Zeroes a warp's WM x WN fragments of four fp32 accumulators. */
template <int WM, int WN>
__device__ __forceinline__ void zero_frags(float (&f)[WM][WN][4])
{
#pragma unroll
    for (int mi = 0; mi < WM; mi++)
#pragma unroll
        for (int ni = 0; ni < WN; ni++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                f[mi][ni][i] = 0.0f;
}

/* A warp's B fragments of k32 step c for its WN 8-token column tiles, from the staged rows. */
template <class C, int WN> __device__ __forceinline__ void tile_bfrag(const uint8_t *arow, int c, uint2 (&bv)[WN])
{
#pragma unroll
    for (int ni = 0; ni < WN; ni++) {
        const uint8_t *bp = arow + (size_t)(ni * 8) * C::A_LD + c * 32;
        bv[ni] = make_uint2(*(const uint32_t *)bp, *(const uint32_t *)(bp + 16));
    }
}

template <class C, int FMT, int WM, int WN>
__device__ __forceinline__ void tile_stage(const uint8_t *stage, int wm, int wn, float acc[WM][WN][4])
{
    constexpr int CH = FMT == WF_FP4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK;
    constexpr int SCH = FMT == WF_FP4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const uint8_t *sW = stage, *sWS = stage + C::W_BYTES, *sA = sWS + C::WS_BYTES;
    const float *sAS = (const float *)(sA + C::A_BYTES);
    const uint8_t *arow = sA + (size_t)(wn * WN * 8 + gid) * C::A_LD + 4 * tig;
    float blk[WM][WN][4];
    zero_frags(blk);
    if constexpr (FMT == WF_FP4) {
        uint4 w[WM][2];
        uint2 sc[WM];
#pragma unroll
        for (int mi = 0; mi < WM; mi++) {
            const uint8_t *ck = sW + (wm * WM + mi) * CH + lane * 16;
            w[mi][0] = *(const uint4 *)ck;
            w[mi][1] = *(const uint4 *)(ck + 512);
            sc[mi] = *(const uint2 *)(sWS + (wm * WM + mi) * SCH + gid * 8);
        }
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint2 bv[WN];
            tile_bfrag<C, WN>(arow, c, bv);
#pragma unroll
            for (int mi = 0; mi < WM; mi++) {
                uint32_t a0, a1, a2, a3;
                frag_fp4(u4_at(w[mi][0], c), u4_at(w[mi][1], c), a0, a1, a2, a3);
                const float s0 = fp4_step_scale(sc[mi].x, c), s1 = fp4_step_scale(sc[mi].y, c);
#pragma unroll
                for (int ni = 0; ni < WN; ni++) {
                    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_e4m3(t, a0, a1, a2, a3, bv[ni].x, bv[ni].y);
                    blk[mi][ni][0] = fmaf(t[0], s0, blk[mi][ni][0]);
                    blk[mi][ni][1] = fmaf(t[1], s0, blk[mi][ni][1]);
                    blk[mi][ni][2] = fmaf(t[2], s1, blk[mi][ni][2]);
                    blk[mi][ni][3] = fmaf(t[3], s1, blk[mi][ni][3]);
                }
            }
        }
    } else {
#pragma unroll
        for (int qh = 0; qh < 2; qh++) {
            uint4 w[WM][2];
#pragma unroll
            for (int mi = 0; mi < WM; mi++) {
                const uint8_t *ck = sW + (wm * WM + mi) * CH + lane * 16;
                w[mi][0] = *(const uint4 *)(ck + qh * 512);
                w[mi][1] = *(const uint4 *)(ck + (2 + qh) * 512);
            }
#pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                const int c = 2 * qh + cc;
                uint2 bv[WN];
                tile_bfrag<C, WN>(arow, c, bv);
#pragma unroll
                for (int mi = 0; mi < WM; mi++) {
                    const uint32_t a0 = cc ? w[mi][0].z : w[mi][0].x, a2 = cc ? w[mi][0].w : w[mi][0].y;
                    const uint32_t a1 = cc ? w[mi][1].z : w[mi][1].x, a3 = cc ? w[mi][1].w : w[mi][1].y;
#pragma unroll
                    for (int ni = 0; ni < WN; ni++)
                        mma_e4m3(blk[mi][ni], a0, a1, a2, a3, bv[ni].x, bv[ni].y);
                }
            }
        }
    }
    float x[WN][2];
#pragma unroll
    for (int ni = 0; ni < WN; ni++) {
        x[ni][0] = sAS[wn * WN * 8 + ni * 8 + 2 * tig];
        x[ni][1] = sAS[wn * WN * 8 + ni * 8 + 2 * tig + 1];
    }
#pragma unroll
    for (int mi = 0; mi < WM; mi++) {
        float w0 = 1.0f, w1 = 1.0f;
        if (FMT == WF_FP8) {
            const float *fs = (const float *)(sWS + (wm * WM + mi) * SCH);
            w0 = fs[0];
            w1 = fs[1];
        }
#pragma unroll
        for (int ni = 0; ni < WN; ni++) {
            acc[mi][ni][0] = fmaf(blk[mi][ni][0], block_scale<FMT>(w0, x[ni][0]), acc[mi][ni][0]);
            acc[mi][ni][1] = fmaf(blk[mi][ni][1], block_scale<FMT>(w0, x[ni][1]), acc[mi][ni][1]);
            acc[mi][ni][2] = fmaf(blk[mi][ni][2], block_scale<FMT>(w1, x[ni][0]), acc[mi][ni][2]);
            acc[mi][ni][3] = fmaf(blk[mi][ni][3], block_scale<FMT>(w1, x[ni][1]), acc[mi][ni][3]);
        }
    }
}

template <class C, int FMT, int WM, int WN, int WARPS_M>
__device__ __forceinline__ void tile_run(const FastArgs &a, const FGrp &g, int r0, uint8_t *smem, const long long *sRow)
{
    const int K = a.K, KB = K >> 7;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    const int mt0 = blockIdx.x * C::MTB;
    float acc[WM][WN][4];
    zero_frags(acc);
#pragma unroll
    for (int s = 0; s < 2; s++) { /* STAGES - 1 = 2 blocks in flight */
        if (s < KB)
            tile_load<C, FMT>(g, mt0, s, KB, K, smem + s * C::STAGE, sRow);
        cp_async_commit();
    }
    for (int kb = 0; kb < KB; kb++) {
        cp_async_wait<1>();
        __syncthreads(); /* stage kb landed for everyone; stage kb - 1 is no longer read */
        const int kn = kb + 2;
        if (kn < KB)
            tile_load<C, FMT>(g, mt0, kn, KB, K, smem + (kn % 3) * C::STAGE, sRow);
        cp_async_commit();
        tile_stage<C, FMT, WM, WN>(smem + (kb % 3) * C::STAGE, wm, wn, acc);
    }
    cp_async_wait<0>();
    unsigned gc = 0, uc = 0;
#pragma unroll
    for (int mi = 0; mi < WM; mi++) {
        const int mt = mt0 + wm * WM + mi;
#pragma unroll
        for (int ni = 0; ni < WN; ni++) {
            const int t0 = r0 + wn * WN * 8 + ni * 8 + 2 * tig;
            if (t0 < g.n)
                fepi(a, g, mt, gid, t0, acc[mi][ni][0], acc[mi][ni][2], gc, uc);
            if (t0 + 1 < g.n)
                fepi(a, g, mt, gid, t0 + 1, acc[mi][ni][1], acc[mi][ni][3], gc, uc);
        }
    }
    if (a.gu)
        fepi_stats(a, g, gc, uc);
}


} // namespace dsv4cuda

#endif
