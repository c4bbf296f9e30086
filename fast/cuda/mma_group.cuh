/*
 * Grouping and quantization for the fp8 path (fast/cuda): k_count2 (counts, offsets, the active
 * list, the mid / big tile lists and, for small chunks, the placement, in one block: group_parts.cuh's
 * count2_block, also run by the last block of k_router_count, router_count.cu), k_hist and
 * k_place2 (large chunks' slices) and k_quant
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
/* PLACE_SLICE: group_parts.cuh (count2_block reads the slices' counts too) */

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

__global__ void k_count2(Group2Args a)
{
    pdl_enter();
    count2_block(a);
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
