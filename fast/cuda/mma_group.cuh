/*
 * Grouping and quantization for the fp8 path (fast/cuda): k_count2 (counts, offsets, the active
 * list, the mid / big tile lists and, for small chunks, the placement, in one block; also run by
 * the last block of k_router_count, the router and grouping in one launch) and k_quant
 * (h of the routed kept slots and the shared expert's rows quantized per 128 features).
 * Included once, by cuda.cu.
 */
#ifndef DSV4MOE_FAST_CUDA_MMA_GROUP_CUH
#define DSV4MOE_FAST_CUDA_MMA_GROUP_CUH

#include "fast/cuda/mma_parts.cuh"

namespace dsv4cuda {

/* ---------------- grouping for the fp8 path ---------------- */

/*
 * Large chunks: k_count2's one block counted the ids itself (shared-memory atomics that collide on
 * the popular experts) and k_place's block per expert scanned every slot: 0.17 + 0.26 ms at
 * T = 16384 on the H200 (ncu, 2026-12-03). Here the slots are cut into slices of PLACE_SLICE, one
 * warp per slice: k_hist counts each slice per expert, k_count2 sums the slices in slice order
 * (an expert's total, and each slice's first rank in that expert), and k_place2 places each
 * slice's slots from there in slot order, so the placement is k_place's: tokens ascending per
 * expert, no atomics in any position.
 */
constexpr int PLACE_SLICE = 256;

/* The warps of a k_hist / k_place2 block: each keeps one count per expert in shared memory. */
__host__ __device__ constexpr int place_warps(int E) { return E <= 3072 ? 4 : 1; }

/* Slot i, the rank-th of expert e's slots in slot order, from the offsets k_count2 wrote. */
__device__ __forceinline__ void place_slot(const Group2Args &a, int i, int e, int rank)
{
    place_at(a, i, e, a.slot_off[e] + rank, a.pad_off[e] + rank, __ldcg(a.w + i));
}

/* A warp's slice of k_hist / k_place2: its slots [i0, end) and its E counters in shared memory. */
struct SliceWarp {
    int lane, sl, i0, end;
    int *cnt;
};

/* False when this warp's slice is past the chunk's slots (a whole warp: no other warp reads its counters).
   The first call of k_hist and k_place2, so it makes their pdl_enter() (kernels.cuh). */
__device__ __forceinline__ bool slice_warp(const Group2Args &a, int *smem, SliceWarp &w)
{
    pdl_enter();
    const int n = *a.ntok * a.K;
    w.lane = threadIdx.x & 31;
    w.sl = blockIdx.x * (int)(blockDim.x >> 5) + (int)(threadIdx.x >> 5);
    w.cnt = smem + (threadIdx.x >> 5) * a.E;
    w.i0 = w.sl * PLACE_SLICE;
    w.end = min(n, w.i0 + PLACE_SLICE);
    return w.i0 < n;
}

/* Slot i's expert (-1 past the slice or out of range: that key never matches a valid id) and the
   lanes of this warp holding the same one. */
__device__ __forceinline__ unsigned slot_peers(const Group2Args &a, int i, int end, int *e)
{
    *e = i < end ? a.ids[i] : -1;
    if (*e >= a.E)
        *e = -1;
    return __match_any_sync(0xFFFFFFFFu, *e);
}

__global__ void k_hist(Group2Args a)
{
    extern __shared__ int hcnt[];
    SliceWarp w;
    if (!slice_warp(a, hcnt, w))
        return;
    for (int e = w.lane; e < a.E; e += 32)
        w.cnt[e] = 0;
    __syncwarp();
    for (int i = w.i0 + w.lane; i - w.lane < w.end; i += 32) {
        if (i < w.end && (a.ids[i] < 0 || a.ids[i] > a.E))
            atomicAdd(&a.stats[ST_BADID], 1ull);
        int e;
        const unsigned peers = slot_peers(a, i, w.end, &e);
        if (e >= 0 && w.lane == __ffs(peers) - 1)
            w.cnt[e] += __popc(peers); /* one leader per expert in this step */
        __syncwarp();
    }
    for (int e = w.lane; e < a.E; e += 32)
        a.hist[(long long)w.sl * a.E + e] = w.cnt[e];
}

__global__ void k_place2(Group2Args a)
{
    extern __shared__ int hpos[];
    SliceWarp w;
    if (!slice_warp(a, hpos, w))
        return;
    int *pos = w.cnt;
    const int lane = w.lane, E = a.E, sl = w.sl, end = w.end;
    for (int e = lane; e < E; e += 32)
        pos[e] = a.hist[(long long)sl * E + e]; /* the slice's first rank per expert (k_count2) */
    __syncwarp();
    for (int i = w.i0 + lane; i - lane < end; i += 32) {
        int e;
        const unsigned peers = slot_peers(a, i, end, &e);
        const bool ok = e >= 0;
        const int rank = ok ? pos[e] + __popc(peers & ((1u << lane) - 1u)) : 0;
        __syncwarp(); /* every lane has read pos[e] before its leader moves it */
        if (ok) {
            if (lane == __ffs(peers) - 1)
                pos[e] += __popc(peers);
            place_slot(a, i, e, rank);
        }
        __syncwarp();
    }
}

/*
 * One block: counts, offsets, the active list and the mid / big tile lists (shared expert last);
 * with `place`, also the stable placement of k_place (slot q of expert e: its rank among the
 * chunk's slots of e in slot order).
 */
__device__ __forceinline__ void count2_block(const Group2Args &a)
{
    extern __shared__ int c2cnt[]; /* 2 E: the counts, then (placement) each expert's slot and row offsets */
    __shared__ int tmp[5][32];
    __shared__ int carry[5];
    __shared__ int s_ok;
    /* with a.place, the chunk's ids and weights, staged while counting: the placement reads them
       again, and a second round trip to L2 is one more latency on the one-block decode path */
    __shared__ int sid[1024];
    __shared__ float sw[1024];
    const int E = a.E, nt = *a.ntok, n = nt * a.K;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        c2cnt[e] = 0;
    if (threadIdx.x < 5)
        carry[threadIdx.x] = 0;
    __syncthreads();
    if (a.hist) {
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
            if (a.place) { /* n <= 1024 */
                sid[i] = e;
                sw[i] = __ldcg(a.w + i);
            }
            if (e < 0 || e > E)
                atomicAdd(&a.stats[ST_BADID], 1ull);
            else if (e < E)
                atomicAdd(&c2cnt[e], 1);
        }
    }
    __syncthreads();
    count2_offsets(a, c2cnt, tmp, carry, &s_ok, nt);
    if (!a.place)
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

__global__ void k_count2(Group2Args a)
{
    pdl_enter();
    count2_block(a);
}

/*
 * The router and, for a chunk whose slots k_count2 places itself (a.place), its grouping in one
 * launch (params route=fused, with k_logits_small before it): one block per token routes
 * it (route_block), takes a ticket, and the block that takes the last one does k_count2's work
 * over the chunk's ids. The sums and the placement are k_count2's (no atomics in either); the
 * ticket counts blocks only, and k_logits_small, launched before whenever this kernel is, zeroes
 * it (a caller-owned workspace carries other layers' bytes between calls). Saves the launch and
 * the ids' round trip between the two kernels of a decode step.
 */
__global__ void k_router_count(RouterArgs ra, Group2Args g, int *ticket)
{
    pdl_enter();
    route_block(ra, blockIdx.x);
    __shared__ int s_last;
    __syncthreads(); /* the block's ids, weights and kept count are written (thread 0 wrote them) */
    if (gridDim.x == 1) { /* a chunk of one token: nothing to wait for (saves the fences and the atomic's round trip) */
        count2_block(g);
        return;
    }
    if (threadIdx.x == 0) {
        __threadfence();
        s_last = atomicAdd(ticket, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    count2_block(g);
}

/* ---------------- quantization of h (routed kept slots, then the shared expert's rows) ---------------- */

struct QuantArgs {
    uint16_t *h;       /* bf16 [rows, I] */
    uint8_t *q;        /* codes [rows, I] */
    float *s;          /* [rows, I / 128] */
    const int32_t *slot_row;
    const int *meta, *ntok;
    long long sh_row0; /* first row of the shared expert's h */
    int I, qmode, slots, has_shared;
    int f16_codes;     /* also overwrite h in place with the codes as f16 in k_tileh's order (kernels.cuh) */
    int *zero;         /* nzero ints block 0 zeroes (the down projection's fold counts, mma_parts.cuh), or NULL */
    int nzero;
};

__global__ void k_quant(QuantArgs a)
{
    pdl_enter();
    if (a.zero && blockIdx.x == 0)
        for (int i = threadIdx.x; i < a.nzero; i += blockDim.x)
            a.zero[i] = 0;
    long long row;
    const int b = blockIdx.x;
    if (b < a.slots) {
        if (b >= a.meta[2])
            return;
        row = a.slot_row[b];
    } else {
        if (!a.has_shared || b - a.slots >= *a.ntok)
            return;
        row = a.sh_row0 + (b - a.slots);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, ng = a.I >> 7;
    uint16_t *hr = a.h + row * a.I;
    for (int gq = warp; gq < ng; gq += nw) {
        float v[4];
        bool ok[4];
        uint8_t c[4];
        const uint2 raw = *(const uint2 *)(hr + gq * 128 + lane * 4);
        v[0] = bf16f((uint16_t)raw.x), v[1] = bf16f((uint16_t)(raw.x >> 16));
        v[2] = bf16f((uint16_t)raw.y), v[3] = bf16f((uint16_t)(raw.y >> 16));
        ok[0] = ok[1] = ok[2] = ok[3] = true;
        const float s = quant_group4(v, ok, a.qmode, c); /* the whole group is read before anything is written */
        *(uint32_t *)(a.q + row * a.I + gq * 128 + lane * 4) =
            (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) | ((uint32_t)c[3] << 24);
        if (a.f16_codes)
            store_f16_codes((uint16_t *)hr, gq * 128 + lane * 4, c);
        if (lane == 0)
            a.s[row * ng + gq] = s;
    }
}

} // namespace dsv4cuda

#endif
