/*
 * Device parts of the fp8 path's grouping that more than one translation unit compiles (fast/cuda):
 * the grouping's arguments, the block scan, the offsets and tile lists from the counts, and a
 * slot's placement, and count2_block, one block's whole grouping (k_count2, mma_group.cuh;
 * k_router_count, router_count.cu; k_route_small, route_small.cu).
 * Inline functions and types only.
 */
#ifndef DSV4MOE_FAST_CUDA_GROUP_PARTS_CUH
#define DSV4MOE_FAST_CUDA_GROUP_PARTS_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

#define FM_DEC_MAX 16 /* groups of up to this many rows: k_dec */
#define FM_MID_MAX 64 /* up to this: 32-row tiles; above: 128-row tiles */

/* Exclusive scans of NV values per thread over the block at once (blockDim.x a multiple of 32, at
   most 1024): before[q] gets thread's prefix of v[q], total[q] the block's sum. One scan's three
   barriers for all NV (k_count2's five scans were fifteen barriers, on the decode step's one-block
   critical path). tmp: NV x 32 ints. */
template <int NV>
__device__ __forceinline__ void block_excl_scan(const int v[NV], int (*tmp)[32], int before[NV], int total[NV])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x[NV];
#pragma unroll
    for (int q = 0; q < NV; q++) {
        x[q] = v[q];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xFFFFFFFFu, x[q], o);
            if (lane >= o)
                x[q] += y;
        }
        if (lane == 31)
            tmp[q][warp] = x[q];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int q = 0; q < NV; q++) {
            int w = lane < nw ? tmp[q][lane] : 0;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(0xFFFFFFFFu, w, o);
                if (lane >= o)
                    w += y;
            }
            if (lane < nw)
                tmp[q][lane] = w;
        }
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < NV; q++) {
        before[q] = (warp ? tmp[q][warp - 1] : 0) + x[q] - v[q];
        total[q] = tmp[q][nw - 1];
    }
    __syncthreads();
}

/* block_excl_scan of one 64-bit value a thread (the same three barriers): its exclusive prefix,
   and the block's sum in *total. tmp: 2 x 32 ints (the warps' sums, low and high halves). */
__device__ __forceinline__ unsigned long long block_excl_scan_u64(unsigned long long v, int (*tmp)[32],
                                                                  unsigned long long *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned long long x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xFFFFFFFFu, x, o);
        if (lane >= o)
            x += y;
    }
    if (lane == 31)
        tmp[0][warp] = (int)(unsigned)x, tmp[1][warp] = (int)(unsigned)(x >> 32);
    __syncthreads();
    if (warp == 0) {
        unsigned long long w =
            lane < nw ? ((unsigned long long)(unsigned)tmp[1][lane] << 32) | (unsigned)tmp[0][lane] : 0ull;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long y = __shfl_up_sync(0xFFFFFFFFu, w, o);
            if (lane >= o)
                w += y;
        }
        if (lane < nw)
            tmp[0][lane] = (int)(unsigned)w, tmp[1][lane] = (int)(unsigned)(w >> 32);
    }
    __syncthreads();
    auto at = [&](int i) { return ((unsigned long long)(unsigned)tmp[1][i] << 32) | (unsigned)tmp[0][i]; };
    const unsigned long long before = (warp ? at(warp - 1) : 0ull) + x - v;
    *total = at(nw - 1);
    __syncthreads();
    return before;
}

/* count2_offsets' five values of an expert packed in one 64-bit word for block_excl_scan_u64
   (route_block's LEAN, a placed chunk: at most 1024 slots and 256 experts, so no field's block sum
   reaches the next field): count [0, 11), padded rows / 128 [11, 20), active [20, 29), mid tiles
   [29, 40), big tiles [40, 51). The same integers as block_excl_scan<5>'s. */
__device__ __forceinline__ unsigned long long pack5(const int v[5])
{
    return (unsigned long long)v[0] | (unsigned long long)(v[1] >> 7) << 11 | (unsigned long long)v[2] << 20 |
           (unsigned long long)v[3] << 29 | (unsigned long long)v[4] << 40;
}
__device__ __forceinline__ void unpack5(unsigned long long p, int v[5])
{
    v[0] = (int)(p & 0x7FFu);
    v[1] = (int)(p >> 11 & 0x1FFu) << 7;
    v[2] = (int)(p >> 20 & 0x1FFu);
    v[3] = (int)(p >> 29 & 0x7FFu);
    v[4] = (int)(p >> 40 & 0x7FFu);
}

struct Group2Args {
    const int32_t *ids;
    const float *w; /* router weights [Tc, K] (placement) */
    const int *ntok;
    int *cnt, *slot_off, *pad_off, *active, *meta; /* meta: n_active, n_mid_tiles, n_kept, n_big_tiles */
    int *tile_e, *tile_r0;                         /* mid tiles at [0, cap_mid), big at [cap_mid, ...) */
    int32_t *slot_tok, *slot_row, *rowmap; /* placement, when `place` (else k_place does it) */
    int32_t *slot_e;                       /* the expert of each kept slot, or NULL */
    float *slot_w;
    unsigned long long *stats;
    int E, K, rows, cap_mid, cap_big, has_shared;
    int mid_rows, big_rows; /* rows per tile of the two tile regimes */
    int place; /* the chunk has at most blockDim.x slots: place them here, tokens ascending per expert */
    const uint8_t *cut_ok; /* gemm fp8: [E + 1], groups of more than cut_rows rows of these experts run on
                              the grouped FP8 GEMM (gemm_fp8.h), not on a tile list; NULL otherwise */
    int cut_rows;          /* FM_DEC_MAX <= cut_rows <= FM_MID_MAX */
    int *hist; /* large chunks: [slices, E] each PLACE_SLICE-slot slice's count per expert (k_hist), which
                  k_count2 sums and turns into each slice's first rank per expert (k_place2); NULL:
                  k_count2 counts itself */
    int *zero; /* nzero ints the grouping zeroes (the decode kernels' fold counts, mma_parts.cuh, when
                  params quant=fold leaves k_quant out), or NULL */
    int nzero;
    int warp; /* params group=warp: k_router_count groups a placed chunk of at most 32 slots with one
                 warp (count2_warp), not the block (count2_block) */
};

/* Slot i (expert e, weight w) at its place: kept slot q and padded row `row` of the grouped layout. */
__device__ __forceinline__ void place_at(const Group2Args &a, int i, int e, int q, int row, float w)
{
    a.slot_tok[q] = i / a.K;
    a.slot_w[q] = w;
    a.slot_row[q] = row;
    a.rowmap[i] = row;
    if (a.slot_e)
        a.slot_e[q] = e;
}

/*
 * The grouping's last step, on one thread, from the chunk's totals (so valid slots, po padded rows,
 * na active experts, nm mid and nb big tiles of the routed experts): slot_off[E], the shared
 * expert's tiles, the layout's bounds (past them: a bad-id count and nothing active), meta and the
 * statistics. Returns the active experts (0: nothing to place).
 */
__device__ __forceinline__ int count2_finish(const Group2Args &a, int nt, int so, int po, int na, int nm, int nb,
                                             bool dry = false)
{
    const int E = a.E;
    a.slot_off[E] = so;
    if (a.has_shared && nt > FM_DEC_MAX) {
        const bool cut = a.cut_ok && a.cut_ok[E] && nt > a.cut_rows;
        const int mid = nt <= FM_MID_MAX && !cut ? (nt + a.mid_rows - 1) / a.mid_rows : 0;
        const int big = nt > FM_MID_MAX && !cut ? (nt + a.big_rows - 1) / a.big_rows : 0;
        for (int i = 0; i < mid && nm < a.cap_mid; i++, nm++) {
            a.tile_e[nm] = E;
            a.tile_r0[nm] = a.mid_rows * i;
        }
        for (int i = 0; i < big && nb < a.cap_big; i++, nb++) {
            a.tile_e[a.cap_mid + nb] = E;
            a.tile_r0[a.cap_mid + nb] = a.big_rows * i;
        }
    }
    if (po > a.rows || nm > a.cap_mid || nb > a.cap_big) {
        /* cannot happen with the layout's bounds; never read or write past them */
        if (!dry)
            atomicAdd(&a.stats[ST_BADID], 1ull);
        na = nm = nb = so = 0;
        for (int e = 0; e < E; e++)
            a.cnt[e] = 0;
    }
    a.meta[0] = na;
    a.meta[1] = nm;
    a.meta[2] = so;
    a.meta[3] = nb;
    /* integer adds that return nothing: no load-modify-store round trip on the chain */
    if (!dry) {
        atomicAdd(&a.stats[ST_ACTIVE], (unsigned long long)na);
        atomicAdd(&a.stats[ST_EMPTY], (unsigned long long)(E - na));
    }
    return na;
}

/*
 * From each expert's count in c2cnt[e] (the whole block, every thread; carry[0..4] zero): the
 * counts, the compact and 128-aligned offsets, the active list, the mid / big tile lists (the
 * shared expert's last, for a chunk of nt tokens) and meta; with a.place, c2cnt[e] and c2cnt[E + e]
 * become expert e's first slot and row. *s_ok: some expert is active (thread 0 writes it; the
 * caller synchronizes before reading it). dry: no statistic counted (route_block's dry pass). LEAN
 * (count2_block's): the five values scanned as one packed word (pack5), a placed chunk's bounds.
 */
template <bool LEAN = false>
__device__ __forceinline__ void count2_offsets(const Group2Args &a, int *c2cnt, int (*tmp)[32], int *carry, int *s_ok,
                                               int nt, bool dry = false)
{
    const int E = a.E;
    for (int i = threadIdx.x; i < a.nzero; i += blockDim.x)
        a.zero[i] = 0;
    for (int e0 = 0; e0 < E; e0 += blockDim.x) {
        const int e = e0 + threadIdx.x;
        const int c = e < E ? c2cnt[e] : 0;
        const int pad = (c + 127) / 128 * 128, act = c > 0;
        /* c first: the block's threads past E read no flag (cut_ok holds E + 1) */
        const bool cut = c > a.cut_rows && a.cut_ok && a.cut_ok[e];
        const int mid = c > FM_DEC_MAX && c <= FM_MID_MAX && !cut ? (c + a.mid_rows - 1) / a.mid_rows : 0;
        const int big = c > FM_MID_MAX && !cut ? (c + a.big_rows - 1) / a.big_rows : 0;
        const int v[5] = {c, pad, act, mid, big};
        int pre[5], tot[5];
        if constexpr (LEAN) {
            unsigned long long ptot;
            unpack5(block_excl_scan_u64(pack5(v), tmp, &ptot), pre);
            unpack5(ptot, tot);
        } else {
            block_excl_scan<5>(v, tmp, pre, tot);
        }
        const int so = pre[0] + carry[0], po = pre[1] + carry[1], ao = pre[2] + carry[2], mo = pre[3] + carry[3],
                  bo = pre[4] + carry[4];
        if (e < E) {
            if (a.place) {
                c2cnt[e] = so; /* this thread's expert: no other thread reads c2cnt[e] */
                c2cnt[E + e] = po;
            }
            a.cnt[e] = c;
            a.slot_off[e] = so;
            a.pad_off[e] = po;
            if (act)
                a.active[ao] = e;
            for (int i = 0; i < mid && mo + i < a.cap_mid; i++) {
                a.tile_e[mo + i] = e;
                a.tile_r0[mo + i] = a.mid_rows * i;
            }
            for (int i = 0; i < big && bo + i < a.cap_big; i++) {
                a.tile_e[a.cap_mid + bo + i] = e;
                a.tile_r0[a.cap_mid + bo + i] = a.big_rows * i;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
#pragma unroll
            for (int q = 0; q < 5; q++)
                carry[q] += tot[q];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *s_ok = count2_finish(a, nt, carry[0], carry[1], carry[2], carry[3], carry[4], dry) > 0;
}

/* The slice of slots one warp of the large chunks' grouping counts and places (mma_group.cuh:
   k_hist, k_count2, k_place2). */
constexpr int PLACE_SLICE = 256;

/*
 * One block: counts, offsets, the active list and the mid / big tile lists (shared expert last);
 * with `place`, also the stable placement of k_place (slot q of expert e: its rank among the
 * chunk's slots of e in slot order). LEAN (route_block's, params route_code=lean): a placed chunk
 * without slice counts (a.place, no a.hist), the other paths' code left out; dry: route_block's.
 */
template <bool LEAN = false> __device__ __forceinline__ void count2_block(const Group2Args &a, bool dry = false)
{
    extern __shared__ int c2cnt[]; /* 2 E: the counts, then (placement) each expert's slot and row offsets */
    __shared__ int tmp[5][32];
    __shared__ int carry[5];
    __shared__ int s_ok;
    /* with a.place, the chunk's ids and weights, staged while counting: the placement reads them
       again, and a second round trip to L2 is one more latency on the one-block decode path */
    __shared__ int sid[1024];
    __shared__ float sw[1024];
    /* LEAN: the token count past L1 (route_block's reason) */
    const int E = a.E, nt = LEAN ? __ldcg(a.ntok) : *a.ntok, n = nt * a.K;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        c2cnt[e] = 0;
    if (threadIdx.x < 5)
        carry[threadIdx.x] = 0;
    __syncthreads();
    const bool place = LEAN || a.place;
    if (!LEAN && a.hist) {
        /* k_hist's slices in slice order: the expert's total, and each slice's first rank in it */
        const int nsl = (n + PLACE_SLICE - 1) / PLACE_SLICE;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            /* eight slices' counts loaded before any is overwritten: one dependent round trip per
               eight slices, not per slice: 79 -> 33 us at T = 16384 (H200, ncu) */
            int run = 0;
            for (int s0 = 0; s0 < nsl; s0 += 8) {
                int v[8];
#pragma unroll
                for (int q = 0; q < 8; q++)
                    v[q] = s0 + q < nsl ? a.hist[(long long)(s0 + q) * E + e] : 0;
#pragma unroll
                for (int q = 0; q < 8; q++)
                    if (s0 + q < nsl) {
                        a.hist[(long long)(s0 + q) * E + e] = run;
                        run += v[q];
                    }
            }
            c2cnt[e] = run;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const int e = __ldcg(a.ids + i); /* L2: k_router_count's other blocks wrote them in this launch */
            if (place) { /* n <= 1024 */
                sid[i] = e;
                sw[i] = __ldcg(a.w + i);
            }
            if (e < 0 || e > E) {
                if (!dry)
                    atomicAdd(&a.stats[ST_BADID], 1ull);
            } else if (e < E) {
                atomicAdd(&c2cnt[e], 1);
            }
        }
    }
    __syncthreads();
    count2_offsets<LEAN>(a, c2cnt, tmp, carry, &s_ok, nt, dry);
    if (!place)
        return;
    __syncthreads(); /* s_ok, and the offsets in c2cnt */
    if (!s_ok)
        return;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int e = sid[i];
        if (e < 0 || e >= E)
            continue;
        int rank = 0;
        for (int j = 0; j < i; j++)
            rank += sid[j] == e;
        place_at(a, i, e, c2cnt[e] + rank, c2cnt[E + e] + rank, sw[i]);
    }
}

/* The slots count2_warp takes: one a lane. */
constexpr int GROUP_WARP_SLOTS = 32;

/*
 * count2_block's whole result for a placed chunk (a.place, no a.hist) of at most GROUP_WARP_SLOTS
 * slots and E <= 32 * GROUP_WARP_EPL experts (group_warp_fits), by one warp (lane 0..31 of the calling warp; the
 * other threads may have returned): the same counts, offsets, active list, tile lists, meta,
 * statistics and placement, the same values in the same places. Why: the routing block runs its
 * grouping once per step through instruction caches that hold none of it, so its time is the
 * number of distinct instructions on the path (docs/cuda.md); count2_block's five-value block scan
 * over all E experts is most of them. Here lane i holds slot i; each lane, for its experts e =
 * lane + 32 j, counts the slots below e, at e and the distinct experts below e by one pass over
 * the slots (shuffles), which gives every expert's count and offsets directly; a slot's rank among
 * its expert's slots is its position in its __match_any_sync group. With n <= 32 slots no expert
 * has more than 32 rows: no big tiles, at most one mid tile each.
 */
constexpr int GROUP_WARP_EPL = 8; /* experts a lane takes: E <= 256, three counters each in registers */
__device__ __forceinline__ bool group_warp_fits(const Group2Args &a, int nt)
{
    return a.warp && a.place && !a.hist && nt * a.K <= GROUP_WARP_SLOTS && a.E <= 32 * GROUP_WARP_EPL;
}
__device__ __forceinline__ void count2_warp(const Group2Args &a, bool dry = false)
{
    const unsigned FULL = 0xFFFFFFFFu;
    /* the token count past L1: route_code=warm's dry pass may have left an old line there */
    const int lane = threadIdx.x & 31, E = a.E, nt = __ldcg(a.ntok), n = nt * a.K;
    for (int i = lane; i < a.nzero; i += 32)
        a.zero[i] = 0;
    /* lane i: slot i (e == E: a pruned slot, placed nowhere; outside [0, E]: counted bad) */
    const int e = lane < n ? __ldcg(a.ids + lane) : -1;
    const float w = lane < n ? __ldcg(a.w + lane) : 0.0f;
    if (lane < n && (e < 0 || e > E) && !dry)
        atomicAdd(&a.stats[ST_BADID], 1ull);
    const bool valid = lane < n && e >= 0 && e < E;
    const unsigned grp = __match_any_sync(FULL, valid ? e : -1 - lane); /* invalid slots: alone */
    const int rank = __popc(grp & ((1u << lane) - 1u)); /* slots of e before this one */
    const int cnt = __popc(grp);
    const bool lead = valid && rank == 0; /* the first slot of its expert: carries the expert */
    /* the expert's group sizes: mid tiles where count2_offsets makes them (c <= 32 < FM_MID_MAX) */
    const bool cut = valid && cnt > a.cut_rows && a.cut_ok && a.cut_ok[e];
    const int mid = lead && cnt > FM_DEC_MAX && !cut ? (cnt + a.mid_rows - 1) / a.mid_rows : 0;
    /* per slot: the valid slots, distinct experts and mid tiles of the experts below its own */
    int s_lt = 0, a_lt = 0, m_lt = 0;
    /* per expert of this lane (e = lane + 32 j): the valid slots below it and at it, the distinct
       experts below it */
    int x_lt[GROUP_WARP_EPL], x_eq[GROUP_WARP_EPL], x_alt[GROUP_WARP_EPL];
    const int nj = (E + 31) / 32;
#pragma unroll
    for (int j = 0; j < GROUP_WARP_EPL; j++)
        x_lt[j] = 0, x_eq[j] = 0, x_alt[j] = 0;
#pragma unroll 1
    for (int q = 0; q < n; q++) {
        const int eq = __shfl_sync(FULL, valid ? e : -1, q);
        const int lq = __shfl_sync(FULL, lead ? 1 : 0, q), mq = __shfl_sync(FULL, mid, q);
        if (eq < 0)
            continue; /* the same on every lane */
        if (valid && eq < e) {
            s_lt++;
            a_lt += lq;
            m_lt += mq;
        }
#pragma unroll
        for (int j = 0; j < GROUP_WARP_EPL; j++) {
            if (j < nj) {
                const int x = lane + 32 * j;
                x_lt[j] += eq < x;
                x_eq[j] += eq == x;
                x_alt[j] += lq && eq < x;
            }
        }
    }
    /* every expert's count and offsets (count2_offsets' cnt, slot_off, pad_off: each group of at
       most 32 rows pads to 128) */
#pragma unroll
    for (int j = 0; j < GROUP_WARP_EPL; j++) {
        const int x = lane + 32 * j;
        if (j < nj && x < E) {
            a.cnt[x] = x_eq[j];
            a.slot_off[x] = x_lt[j];
            a.pad_off[x] = 128 * x_alt[j];
        }
    }
    if (lead) {
        a.active[a_lt] = e;
        for (int i = 0; i < mid && m_lt + i < a.cap_mid; i++) {
            a.tile_e[m_lt + i] = e;
            a.tile_r0[m_lt + i] = a.mid_rows * i;
        }
    }
    const int so = __reduce_add_sync(FULL, valid ? 1 : 0), na = __reduce_add_sync(FULL, lead ? 1 : 0);
    const int nm = __reduce_add_sync(FULL, mid);
    int nz = 0;
    __syncwarp(); /* every lane's cnt before lane 0 may zero them */
    if (lane == 0) /* count2_offsets' tail: the shared expert's tiles, the bounds, meta, statistics */
        nz = count2_finish(a, nt, so, 128 * na, na, nm, 0, dry);
    /* the placement: count2_block's, rank = the slots of e before this one; none when no expert is
       active or the bounds failed (count2_block returns before it then) */
    nz = __shfl_sync(FULL, nz, 0);
    if (nz > 0 && valid)
        place_at(a, lane, e, s_lt + rank, 128 * a_lt + rank, w);
}

} // namespace dsv4cuda

#endif
