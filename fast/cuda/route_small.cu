/*
 * k_route_small: the router and grouping of a chunk of at most DSV4C_LOGITS_SMALL tokens in one
 * launch (route_small.cuh says what it computes and why; params route=one).
 */
#include "fast/cuda/route_small.cuh"
#include "fast/cuda/route_warp.cuh"

namespace dsv4cuda {

namespace {

constexpr unsigned FULL = 0xFFFFFFFFu;
constexpr int RS_WARPS = RS_THREADS / 32;
constexpr int RS_KW = RW_KW; /* the most slots a token has here: a lane each */
/* Tokens a logits block sums (logits_small_block's TPB): a chunk of 32 spreads over four times the
   blocks of k_logits_small (each with a quarter of its dependent x loads), the gate rows read once
   per eight tokens (the others from L2). */
constexpr int RS_TPB = 8;

/* The routing block's shared memory in 4-byte words: a region each routing warp uses for its token
   (scores, keys, then K-wide scratch) and the grouping reuses for the per-piece counts; the
   expert offsets; the chunk's ids, weights and in-piece ranks. */
__host__ __device__ constexpr int warp_words(int E) { return route_warp_words(E); }
__host__ __device__ constexpr int region_words(int E, int ncap)
{
    return RS_WARPS * warp_words(E) > (ncap + 31) / 32 * E ? RS_WARPS * warp_words(E) : (ncap + 31) / 32 * E;
}
__host__ __device__ constexpr int smem_words(int E, int ncap) { return region_words(E, ncap) + 2 * E + 3 * ncap; }

/*
 * The last block: routes the chunk's nt tokens (warp w: tokens w, w + 8, ...), then groups its
 * n = nt K slots as count2_block (group_parts.cuh) with a.place: the same counts, offsets, tile lists
 * and placement (expert e's slots in slot order), the ranks by 32-slot pieces.
 */
__device__ __forceinline__ void route_and_group(const RouteSmallArgs &a, int nt)
{
    extern __shared__ int rs_sm[];
    __shared__ int tmp[5][32];
    __shared__ int carry[5];
    __shared__ int s_ok;
    const Group2Args &g = a.g;
    const int E = g.E, K = g.K, n = nt * K, nch = (n + 31) / 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int *region = rs_sm;
    int *c2cnt = region + region_words(E, a.ncap); /* 2 E */
    int *sid = c2cnt + 2 * E;
    float *sw = (float *)(sid + a.ncap);
    int *srank = (int *)(sw + a.ncap);
    {
        float *wb = (float *)region + warp * warp_words(E);
        for (int t = warp; t < nt; t += RS_WARPS)
            route_warp(a.ra, t, wb, wb + E, wb + 2 * E, (int *)(wb + 2 * E + 3 * RS_KW), sid, sw);
    }
    __syncthreads(); /* every token routed: the region is free */
    int *ccnt = region; /* [nch][E]: piece j's count of expert e, then e's slots before piece j */
#pragma unroll 1
    for (int i = tid; i < nch * E; i += RS_THREADS)
        ccnt[i] = 0;
    if (tid < 5)
        carry[tid] = 0;
    __syncthreads();
#pragma unroll 1
    for (int j = warp; j < nch; j += RS_WARPS) {
        const int i = j * 32 + lane;
        int e = i < n ? sid[i] : -1;
        if (i < n && (e < 0 || e > E))
            atomicAdd(&g.stats[ST_BADID], 1ull);
        if (e >= E)
            e = -1; /* a pruned slot (E), or out of range: no expert's */
        const unsigned peers = __match_any_sync(FULL, e);
        if (e >= 0 && lane == __ffs(peers) - 1)
            ccnt[j * E + e] = __popc(peers);
        if (i < n)
            srank[i] = __popc(peers & ((1u << lane) - 1u));
    }
    __syncthreads();
#pragma unroll 1
    for (int e = tid; e < E; e += RS_THREADS) {
        int run = 0;
#pragma unroll 1
        for (int j = 0; j < nch; j++) {
            const int v = ccnt[j * E + e];
            ccnt[j * E + e] = run;
            run += v;
        }
        c2cnt[e] = run;
    }
    __syncthreads();
    count2_offsets(g, c2cnt, tmp, carry, &s_ok, nt);
    __syncthreads(); /* s_ok, and the offsets in c2cnt */
    if (!s_ok)
        return;
#pragma unroll 1
    for (int i = tid; i < n; i += RS_THREADS) {
        const int e = sid[i];
        if (e < 0 || e >= E)
            continue;
        const int rank = ccnt[(i >> 5) * E + e] + srank[i];
        place_at(g, i, e, c2cnt[e] + rank, c2cnt[E + e] + rank, sw[i]);
    }
}

template <int TG>
__global__ void __launch_bounds__(RS_THREADS) k_route_small(RouteSmallArgs a)
{
    if ((int)blockIdx.x < a.la.lblocks) {
        /* this block's gate rows into L2 before the wait for the previous kernel: weights, which no
           kernel writes, so their DRAM reads overlap that kernel's tail (a launch with PDL starts
           early) instead of following it */
        const int e0 = (int)blockIdx.x * LS_EPB, ne = min(LS_EPB, a.la.E - e0);
        const char *g = (const char *)(a.la.gate + (long long)e0 * a.la.H);
        for (long long o = (long long)threadIdx.x * 128; o < (long long)ne * a.la.H * 2; o += RS_THREADS * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(g + o));
    }
    pdl_enter();
    const int nt = *a.la.ntok;
    if (nt > DSV4C_LOGITS_SMALL) /* cannot happen: the launcher's chunk holds at most that many rows */
        return;
    logits_small_block<TG, RS_TPB>(a.la, nt);
    const int nlb = a.la.lblocks * a.la.tgroups;
    if ((int)blockIdx.x >= nlb)
        return;
    unsigned long long *ticket = a.ra.stats + ST_TICKET;
    __shared__ int s_last;
    __syncthreads(); /* the block's logits are written */
    if (threadIdx.x == 0) {
        __threadfence();
        s_last = atomicAdd(ticket, 1ull) == (unsigned long long)(nlb - 1);
    }
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    if (threadIdx.x == 0)
        *ticket = 0ull; /* every block has taken its ticket */
    route_and_group(a, nt);
}

} // namespace

bool route_small_fits(int E, int K, int tc)
{
    return K >= 1 && K <= RS_KW && E >= 1 && E <= 1024 && tc >= 1 && tc <= DSV4C_LOGITS_SMALL &&
           route_small_smem(E, K, tc) + 4096 <= 48 * 1024; /* 4096: the static scratch, with room */
}

size_t route_small_smem(int E, int K, int tc) { return (size_t)smem_words(E, tc * K) * 4; }

cudaError_t launch_route_small(RouteSmallArgs a, int qblocks, int tg, cudaStream_t s, bool pdl)
{
    const int tc = a.ncap / a.g.K;
    const size_t smem = route_small_smem(a.g.E, a.g.K, tc);
    a.la.tgroups = (tc + RS_TPB - 1) / RS_TPB;
    const unsigned grid = (unsigned)(a.la.lblocks * a.la.tgroups + qblocks);
    return launch_kernel(tg == 4 ? k_route_small<4> : k_route_small<1>, dim3(grid), RS_THREADS, smem, s, pdl, a);
}

} // namespace dsv4cuda
