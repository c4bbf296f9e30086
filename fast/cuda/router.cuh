/*
 * The CUDA backend's router and device-side grouping (fast/cuda): k_router (scores, top-K or
 * hash lookup, weights, act_quant of x; one block per token; its body route_block is also
 * k_router_count's, mma_group.cuh), k_logits_small (the logits and act_quant of x of chunks of
 * up to 32 live tokens; its body is route_parts.cuh's, shared with k_route_small), k_count
 * (counts per expert, offsets, the active list and the exact path's tile schedule) and k_place
 * (the stable placement of the kept slots). Both paths route with k_router; k_count is the exact
 * path's grouping (the fp8 path's is k_count2, mma_group.cuh, which leaves large chunks'
 * placement to k_place). Included once, by cuda.cu, after kernels.cuh.
 */
#ifndef DSV4MOE_FAST_CUDA_ROUTER_CUH
#define DSV4MOE_FAST_CUDA_ROUTER_CUH

#include "fast/cuda/route_parts.cuh"

namespace dsv4cuda {

/* ---------------- router + activation quantization (one block per token) ---------------- */


/*
 * Routes token t of the chunk with the whole block (blockDim.x threads, a multiple of 32; dynamic
 * shared memory (H + 2 E + 4 K) floats): quantizes its x when a.xq (else a.x is read only for the
 * predictor), reads its logits (a.lslices partial sums), scores, selects, weights and prunes, and
 * writes ids, w and kept. Returns at the same point on every thread of the block (the callers may
 * synchronize after it).
 */
__device__ __forceinline__ void route_block(const RouterArgs &a, int t)
{
    if (t >= *a.ntok)
        return;
    extern __shared__ float sm[];
    const int H = a.H, E = a.E, K = a.K;
    float *xs = sm;               /* H */
    float *lg = xs + H;           /* E: logits, then scores */
    float *key = lg + E;          /* K */
    float *wk = key + K;          /* K */
    float *nrm = wk + K;          /* K */
    int *idk = (int *)(nrm + K);  /* K */
    float *bk = nrm + 2 * K;      /* E: the selection keys, score + bias */
    __shared__ int s_finite;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const uint16_t *x = a.x + (long long)t * H;
    const bool small = a.small_max > 0 && *a.ntok <= a.small_max; /* k_logits_small's chunk */
    const int lslices = small ? 1 : a.lslices;
    uint8_t *const xq = small ? nullptr : a.xq;
    const bool need_x = xq || (a.top_p_on && !a.hash && a.predictor == 2);
    for (int i = tid * 8; need_x && i < H; i += blockDim.x * 8) { /* H % 8 == 0 */
        const uint4 v = __ldg((const uint4 *)(x + i));
        const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 8; q++)
            xs[i + q] = bf16f((uint16_t)(w4[q >> 1] >> (16 * (q & 1))));
    }
    __syncthreads();
    /* activation quantization of x (routed and shared share it) */
    if (xq) {
        int ng = (H + 127) / 128;
        for (int g = warp; g < ng; g += nw) {
            float v[4];
            bool ok[4];
            for (int i = 0; i < 4; i++) {
                int k = g * 128 + lane * 4 + i;
                ok[i] = k < H;
                v[i] = ok[i] ? xs[k] : 0.0f;
            }
            quant_x_group(v, ok, a.qmode, lane, xq + (long long)t * H, a.xs + (long long)t * ng + g,
                          a.x16 ? a.x16 + (long long)t * H : nullptr, g * 128 + lane * 4);
        }
    }
    /* logits (computed before by the GEMM kernels) */
    for (int e = tid; e < E; e += blockDim.x) {
        /* split-K partial sums, added in slice order; loaded 8 at a time so the loads overlap */
        const float *src = a.logits + (long long)t * E + e;
        float s = src[0];
        for (int z0 = 1; z0 < lslices; z0 += 8) {
            float v[8];
#pragma unroll
            for (int q = 0; q < 8; q++)
                v[q] = z0 + q < lslices ? __ldg(src + (z0 + q) * a.lslice_stride) : 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (z0 + q < lslices)
                    s = __fadd_rn(s, v[q]);
        }
        lg[e] = a.gate_bf16 ? rbf16(s) : s;
        if (!a.hash) /* the bias now, beside the logits: its load is not one more round trip later */
            bk[e] = a.bias ? __ldg(a.bias + e) : 0.0f;
    }
    __syncthreads();
    int fin = 1;
    for (int e = tid; e < E; e += blockDim.x)
        fin &= isfinite(lg[e]) ? 1 : 0;
    const int finite = __syncthreads_and(fin);
    /* elementwise scores in parallel (softmax needs the whole row: thread 0 below) */
    if (finite && a.score != 2) {
        for (int e = tid; e < E; e += blockDim.x)
            lg[e] = score_of(lg[e], a.score);
    }
    __syncthreads();
    if (tid == 0) {
        s_finite = finite;
        if (!finite) {
            atomicAdd(&a.stats[ST_NONFINITE], 1ull);
            for (int k = 0; k < K; k++) {
                a.ids[(long long)t * K + k] = k;
                a.w[(long long)t * K + k] = __fdiv_rn(a.route_scale, (float)K);
            }
            a.kept[t] = K;
        } else if (a.score == 2) {
            softmax_serial(lg, E);
        }
    }
    __syncthreads();
    if (!s_finite)
        return;
    /* the keys once into shared memory: the selection below reads each many times */
    if (!a.hash)
        for (int e = tid; e < E; e += blockDim.x)
            bk[e] = a.bias ? __fadd_rn(lg[e], bk[e]) : lg[e];
    __syncthreads();
    /* selection: the hash table (ids checked here too: the device-pointer forward has not seen them
       on the host), or the top K of score + bias by (value descending, id ascending) */
    if (a.hash) {
        if (warp == 0)
            hash_select_warp(a, t, lane, idk);
    } else if (warp == 0) {
        /* warp-parallel: K rounds of a warp argmax, each lane over its own experts e = lane + 32 i
           (a bit per expert marks the taken ones). A NaN key, or E > 1024, takes the serial
           insertion instead, whose order NaN keys make position-dependent. */
        bool nan = false;
        for (int e = lane; e < E; e += 32)
            nan |= bk[e] != bk[e];
        nan = __any_sync(0xFFFFFFFFu, nan) || E > 1024;
        if (!nan) {
            unsigned taken = 0;
            for (int k = 0; k < K; k++) {
                float bv = 0.0f;
                int be = -1;
                for (int e = lane, i = 0; e < E; e += 32, i++) {
                    if (taken >> i & 1u)
                        continue;
                    const float v = bk[e];
                    if (be < 0 || before_key(v, e, bv, be)) {
                        bv = v;
                        be = e;
                    }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
                    int oe = __shfl_xor_sync(0xFFFFFFFFu, be, o);
                    if (oe >= 0 && (be < 0 || before_key(ov, oe, bv, be))) {
                        bv = ov;
                        be = oe;
                    }
                }
                if (be >= 0 && (be & 31) == lane)
                    taken |= 1u << (be >> 5);
                if (lane == 0) {
                    key[k] = bv;
                    idk[k] = be;
                }
            }
        } else if (lane == 0) {
            topk_serial(bk, E, K, key, idk);
        }
    }
    __syncthreads();
    if (tid == 0) {
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            wk[k] = lg[idk[k]];
            sum = __fadd_rn(sum, wk[k]);
        }
        if (a.score != 2) {
            float den = __fadd_rn(sum, a.norm_eps);
            for (int k = 0; k < K; k++)
                wk[k] = __fdiv_rn(wk[k], den);
        }
        for (int k = 0; k < K; k++)
            wk[k] = __fmul_rn(wk[k], a.route_scale);
    }

    const bool topp = a.top_p_on && !a.hash;
    if (topp) {
        /* predictor norms, one warp per slot (4 interleaved partial sums like the CPU's loop) */
        for (int k = warp; k < K; k += nw) {
            int ex = idk[k];
            float v;
            if (a.predictor == 1) {
                v = a.pred_norm[ex];
            } else if (a.predictor == 2) {
                const float *pw = a.pred_w + (long long)ex * H;
                float s = 0.0f;
                for (int i = lane; i < H; i += 32)
                    s = __fadd_rn(s, __fmul_rn(pw[i], xs[i]));
                s = warp_sum(s);
                v = __fadd_rn(s, a.pred_b[ex]);
                v = v > 0.0f ? v : 0.0f;
            } else {
                v = 1.0f;
            }
            if (lane == 0)
                nrm[k] = v;
        }
    }
    __syncthreads();
    if (tid == 0) {
        int keep = K;
        if (topp) {
            /* contributions sorted descending (ties to the lower id), insertion as cpu.c */
            int order[64];
            int *ord = K <= 64 ? order : (int *)(xs); /* K > 64: x is no longer needed */
            keep = top_p_prune(a, key, ord, idk, wk, nrm); /* key: the contributions' scratch */
        }
        for (int k = 0; k < K; k++) {
            a.ids[(long long)t * K + k] = idk[k];
            a.w[(long long)t * K + k] = wk[k];
        }
        a.kept[t] = keep;
    }
}

/* One block per token. */
__global__ void k_router(RouterArgs a)
{
    pdl_enter();
    route_block(a, blockIdx.x);
}

/* The small chunks' router logits as their own launch (params route=fused); block 0 zeroes the
   fused router's ticket (its blocks wait for this kernel to finish: pdl_enter). */
template <int TG>
__global__ void __launch_bounds__(256) k_logits_small(LogitsArgs a)
{
    pdl_enter();
    const int nt = *a.ntok;
    if (a.ticket && blockIdx.x == 0 && threadIdx.x == 0)
        *a.ticket = 0;
    if (nt > DSV4C_LOGITS_SMALL) /* the GEMM kernels' chunk (k_router reads their slices) */
        return;
    logits_small_block<TG, DSV4C_LOGITS_SMALL>(a, nt);
}

/* ---------------- grouping on the device ---------------- */

/* Counts per expert, offsets (compact and 128-aligned), the active list and the tile schedule. */
__global__ void k_count(GroupArgs a)
{
    extern __shared__ int cnt[];
    const int E = a.E, n = *a.ntok * a.K;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int e = a.ids[i];
        if (e < 0 || e > E)
            atomicAdd(&a.stats[ST_BADID], 1ull);
        else if (e < E)
            atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int so = 0, po = 0, na = 0, nt = 0;
        for (int e = 0; e < E; e++) {
            int c = cnt[e];
            a.cnt[e] = c;
            a.slot_off[e] = so;
            a.pad_off[e] = po;
            if (c > 0)
                a.active[na++] = e;
            if (c > a.small)
                for (int r0 = 0; r0 < c; r0 += a.tile_m) {
                    a.tile_e[nt] = e;
                    a.tile_r0[nt] = r0;
                    nt++;
                }
            so += c;
            po += (c + 127) / 128 * 128;
        }
        a.slot_off[E] = so;
        if (po > a.rows) { /* cannot happen with the layout's bound; never write past it */
            atomicAdd(&a.stats[ST_BADID], 1ull);
            na = nt = so = 0;
            for (int e = 0; e < E; e++)
                a.cnt[e] = 0;
        }
        a.meta[0] = na;
        a.meta[1] = nt;
        a.meta[2] = so;
        a.stats[ST_ACTIVE] += (unsigned long long)na;
        a.stats[ST_EMPTY] += (unsigned long long)(E - na);
    }
}

/* Stable placement: block e writes its slots in slot order (tokens ascending). */
__global__ void k_place(GroupArgs a)
{
    pdl_enter();
    const int e = blockIdx.x;
    const int c = a.cnt[e];
    if (c == 0)
        return;
    const int n = *a.ntok * a.K, base = a.slot_off[e], pbase = a.pad_off[e];
    __shared__ int wtot[32];
    __shared__ int running;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (threadIdx.x == 0)
        running = 0;
    __syncthreads();
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        int i = c0 + threadIdx.x;
        bool f = i < n && a.ids[i] == e;
        unsigned m = __ballot_sync(0xFFFFFFFFu, f);
        if (lane == 0)
            wtot[warp] = __popc(m);
        __syncthreads();
        int woff = 0, tot = 0;
        for (int q = 0; q < nw; q++) {
            woff += q < warp ? wtot[q] : 0;
            tot += wtot[q];
        }
        if (f) {
            int pos = running + woff + __popc(m & ((1u << lane) - 1u));
            int q = base + pos;
            a.slot_tok[q] = i / a.K;
            a.slot_w[q] = a.w[i];
            a.slot_row[q] = pbase + pos;
            a.rowmap[i] = pbase + pos;
            if (a.slot_e)
                a.slot_e[q] = e;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            running += tot;
        __syncthreads();
    }
}

} // namespace dsv4cuda

#endif
