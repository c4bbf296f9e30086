/*
 * route_warp: one token's routing by one warp (SPEC.md sections 2-3), shared by k_route_small
 * (route_small.cu, params route=one) and k_router_warp (router_warp.cu, params router=warp).
 */
#ifndef DSV4MOE_FAST_CUDA_ROUTE_WARP_CUH
#define DSV4MOE_FAST_CUDA_ROUTE_WARP_CUH

#include "fast/cuda/route_parts.cuh"

namespace dsv4cuda {

constexpr int RW_KW = 32; /* the most slots a token has for route_warp: a lane each */
/* route_warp's shared memory for one token in 4-byte words: scores, keys (E each), K-wide scratch */
__host__ __device__ constexpr int route_warp_words(int E) { return 2 * E + 5 * RW_KW; }

/*
 * k_route_small's routing block runs this code once per step, on one multiprocessor, after the
 * step's weight stream has likely pushed it out of L2: its instruction lines come in cold, one
 * after another on the chain's critical path. So its loops are not unrolled (#pragma unroll 1):
 * fewer distinct lines for the same operations in the same order.
 *
 * Routes token t with one warp, as route_block (route_parts.cuh) does with a block, step for step:
 * the same operations in the same order on the same values, so the same ids, weights and kept
 * count. sc, bk: E floats each (scores, selection keys); kf: 3 x RW_KW floats; ki: 2 x RW_KW ints.
 * Writes ids, w and kept, and the slots' ids and weights into sid / sw for the grouping.
 */
__device__ __forceinline__ void route_warp(const RouterArgs &a, int t, float *sc, float *bk, float *kf, int *ki,
                                           int *sid, float *sw)
{
    constexpr unsigned FULL = 0xFFFFFFFFu;
    const int lane = threadIdx.x & 31, E = a.E, K = a.K, H = a.H;
    const long long s0 = (long long)t * K;
    int fin = 1;
    for (int e = lane; e < E; e += 32) {
        const float s = __ldcg(a.logits + (long long)t * E + e); /* L2: this launch's other blocks wrote them */
        const float l = a.gate_bf16 ? rbf16(s) : s;
        fin &= isfinite(l) ? 1 : 0;
        sc[e] = l;
        if (!a.hash)
            bk[e] = a.bias ? __ldg(a.bias + e) : 0.0f;
    }
    if (!__all_sync(FULL, fin)) {
        const float w = __fdiv_rn(a.route_scale, (float)K);
        if (lane < K) {
            a.ids[s0 + lane] = lane, a.w[s0 + lane] = w;
            sid[s0 + lane] = lane, sw[s0 + lane] = w;
        }
        if (lane == 0) {
            atomicAdd(&a.stats[ST_NONFINITE], 1ull);
            a.kept[t] = K;
        }
        return;
    }
    if (a.score != 2) {
#pragma unroll 1
        for (int e = lane; e < E; e += 32)
            sc[e] = score_of(sc[e], a.score);
    } else {
        __syncwarp();
        if (lane == 0)
            softmax_serial(sc, E);
    }
    __syncwarp();
    if (!a.hash) {
#pragma unroll 1
        for (int e = lane; e < E; e += 32)
            bk[e] = a.bias ? __fadd_rn(sc[e], bk[e]) : sc[e];
    }
    __syncwarp();
    float *key = kf, *wk = kf + RW_KW, *nrm = kf + 2 * RW_KW;
    int *idk = ki, *ord = ki + RW_KW;
    int my = 0; /* lane k < K: the token's k-th expert */
    if (a.hash) {
        hash_select_warp(a, t, lane, idk);
        __syncwarp();
        my = lane < K ? idk[lane] : 0;
    } else {
        bool nan = false;
#pragma unroll 1
        for (int e = lane; e < E; e += 32)
            nan |= bk[e] != bk[e];
        if (!__any_sync(FULL, nan)) {
            /* K rounds: the warp's largest key by one reduction, its lowest id among equals by a
               second; the winner's lane takes it and finds its own next best (one call site of
               lane_best, at the round's start: every lane in the first round, then the last
               winner's) */
            unsigned taken = 0u, bu = 0u;
            int be = -1;
            bool scan = true;
#pragma unroll 1
            for (int k = 0; k < K; k++) {
                if (scan)
                    lane_best(bk, E, lane, taken, bu, be);
                scan = false;
                const unsigned m = __reduce_max_sync(FULL, bu);
                const unsigned we = __reduce_min_sync(FULL, be >= 0 && bu == m ? (unsigned)be : 0xFFFFFFFFu);
                if (lane == k)
                    my = (int)we;
                if (we != 0xFFFFFFFFu && (int)(we & 31u) == lane) {
                    taken |= 1u << (we >> 5);
                    scan = true;
                }
            }
        } else {
            if (lane == 0)
                topk_serial(bk, E, K, key, idk);
            __syncwarp();
            my = lane < K ? idk[lane] : 0;
        }
    }
    /* the weights: lane k's score over the sequential sum of the K scores (every lane adds them in
       slot order: the reference's sum) */
    const float wv = lane < K ? sc[my] : 0.0f;
    float sum = 0.0f;
#pragma unroll 1
    for (int k = 0; k < K; k++)
        sum = __fadd_rn(sum, __shfl_sync(FULL, wv, k));
    float w = wv;
    if (a.score != 2)
        w = __fdiv_rn(w, __fadd_rn(sum, a.norm_eps));
    w = __fmul_rn(w, a.route_scale);
    int keep = K;
    if (a.top_p_on && !a.hash) {
        float v = 1.0f;
        if (a.predictor == 1) {
            v = lane < K ? a.pred_norm[my] : 0.0f;
        } else if (a.predictor == 2) {
            /* each slot's predictor dot product by the whole warp, lane 0's sum (route_block's) */
            const uint16_t *x = a.x + (long long)t * H;
            for (int k = 0; k < K; k++) {
                const int ex = __shfl_sync(FULL, my, k);
                const float *pw = a.pred_w + (long long)ex * H;
                float s = 0.0f;
                for (int i = lane; i < H; i += 32)
                    s = __fadd_rn(s, __fmul_rn(pw[i], bf16f(x[i])));
                s = __shfl_sync(FULL, warp_sum(s), 0);
                s = __fadd_rn(s, a.pred_b[ex]);
                if (lane == k)
                    v = s > 0.0f ? s : 0.0f;
            }
        }
        if (lane < K)
            idk[lane] = my, wk[lane] = w, nrm[lane] = v;
        __syncwarp();
        if (lane == 0)
            keep = top_p_prune(a, key, ord, idk, wk, nrm);
        __syncwarp();
        if (lane < K)
            my = idk[lane], w = wk[lane];
        keep = __shfl_sync(FULL, keep, 0);
    }
    if (lane < K) {
        a.ids[s0 + lane] = my, a.w[s0 + lane] = w;
        sid[s0 + lane] = my, sw[s0 + lane] = w;
    }
    if (lane == 0)
        a.kept[t] = keep;
}

} // namespace dsv4cuda

#endif
