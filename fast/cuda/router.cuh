/*
 * The CUDA backend's router and device-side grouping (fast/cuda): k_router (scores, top-K or
 * hash lookup, weights, act_quant of x; one block per token; its body route_block is also
 * k_router_count's, mma_group.cuh), k_logits_small (the logits and act_quant of x of chunks of
 * up to 32 live tokens), k_count (counts per expert,
 * offsets, the active list and the exact path's tile schedule) and k_place (the stable placement
 * of the kept slots). Both paths route with k_router; k_count is the exact path's grouping (the
 * fp8 path's is k_count2, mma_group.cuh, which leaves large chunks' placement to k_place).
 * Included once, by cuda.cu, after kernels.cuh.
 */
#ifndef DSV4MOE_FAST_CUDA_ROUTER_CUH
#define DSV4MOE_FAST_CUDA_ROUTER_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

/* ---------------- router + activation quantization (one block per token) ---------------- */

__device__ __forceinline__ bool before_key(float ka, int ia, float kb, int ib) { return ka > kb || (ka == kb && ia < ib); }

/* Activation quantization of one 128-wide group of a token's x (SPEC.md 5), one warp: lane l holds
   elements k0 .. k0 + 3, k0 = 128 g + 4 l (ok: inside the row). The codes, the group's scale and,
   with x16, the codes as f16 in the f16 tile kernel's order. Shared by k_router and k_logits_small. */
__device__ __forceinline__ void quant_x_group(const float v[4], const bool ok[4], int qmode, int lane, uint8_t *xq_row,
                                              float *xs_at, uint16_t *x16_row, int k0)
{
    uint8_t c[4];
    float s = quant_group4(v, ok, qmode, c);
    if (ok[3]) {
        *(uint32_t *)(xq_row + k0) =
            (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) | ((uint32_t)c[3] << 24);
        if (x16_row)
            store_f16_codes(x16_row, k0, c);
    } else {
        for (int i = 0; i < 4; i++)
            if (ok[i])
                xq_row[k0 + i] = c[i];
    }
    if (lane == 0)
        *xs_at = s;
}

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
            lg[e] = a.score == 0 ? sqrtf(lg[e] > 20.0f ? lg[e] : log1pf(expf(lg[e])))
                                 : __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lg[e])));
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
            float mx = lg[0], sum = 0.0f;
            for (int e = 1; e < E; e++)
                mx = lg[e] > mx ? lg[e] : mx;
            for (int e = 0; e < E; e++) {
                lg[e] = expf(__fsub_rn(lg[e], mx));
                sum = __fadd_rn(sum, lg[e]);
            }
            for (int e = 0; e < E; e++)
                lg[e] = __fdiv_rn(lg[e], sum);
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
        if (warp == 0) { /* the table's K entries loaded at once by the warp, not one after another */
            const long long id = a.in_ids[t];
            const bool bad_id = id < 0 || id >= a.V;
            bool bad = bad_id;
            for (int k = lane; k < K && !bad_id; k += 32) {
                const int v = a.tid2eid[id * K + k];
                bad |= v < 0 || v >= E;
                idk[k] = v;
            }
            bad = __any_sync(0xFFFFFFFFu, bad);
            __syncwarp(); /* every lane's entry is in idk before any is replaced */
            for (int k = lane; k < K && bad; k += 32)
                idk[k] = k;
            if (bad && lane == 0) {
                atomicAdd(&a.stats[ST_BADIN], 1ull);
                atomicMax(&a.stats[ST_BADIN_AT], 0xFFFFFFFFull - (unsigned long long)(a.t0 + t));
            }
        }
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
            int n = 0;
            for (int e = 0; e < E; e++) {
                const float v = bk[e];
                if (n == K && !before_key(v, e, key[K - 1], idk[K - 1]))
                    continue;
                int pos = n < K ? n++ : K - 1;
                while (pos > 0 && before_key(v, e, key[pos - 1], idk[pos - 1])) {
                    key[pos] = key[pos - 1];
                    idk[pos] = idk[pos - 1];
                    pos--;
                }
                key[pos] = v;
                idk[pos] = e;
            }
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
            float *contrib = key; /* reuse */
            int order[64];
            int *ord = K <= 64 ? order : (int *)(xs); /* K > 64: x is no longer needed */
            for (int k = 0; k < K; k++) {
                contrib[k] = __fmul_rn(wk[k], nrm[k]);
                int pos = k;
                while (pos > 0 && before_key(contrib[k], idk[k], contrib[ord[pos - 1]], idk[ord[pos - 1]])) {
                    ord[pos] = ord[pos - 1];
                    pos--;
                }
                ord[pos] = k;
            }
            float total = 0.0f;
            for (int r = 0; r < K; r++)
                total = __fadd_rn(total, contrib[ord[r]]);
            float thr = __fmul_rn(a.top_p, total), cum = 0.0f;
            for (int r = 0; r < K; r++) {
                cum = __fadd_rn(cum, contrib[ord[r]]);
                if (cum >= thr) {
                    keep = r + 1;
                    break;
                }
            }
            if (keep < a.min_keep)
                keep = a.min_keep;
            float orig = 0.0f, kw = 0.0f;
            for (int k = 0; k < K; k++)
                orig = __fadd_rn(orig, wk[k]);
            for (int r = keep; r < K; r++) {
                idk[ord[r]] = E;
                wk[ord[r]] = 0.0f;
            }
            for (int k = 0; k < K; k++)
                kw = __fadd_rn(kw, wk[k]);
            if (a.renorm && keep < K && kw > 0.0f) {
                float sc = __fdiv_rn(orig, kw);
                for (int k = 0; k < K; k++)
                    wk[k] = __fmul_rn(wk[k], sc);
            }
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

/* ---------------- router logits of small chunks ---------------- */

#define DSV4C_LOGITS_SMALL 32 /* chunks of up to this many tokens: k_logits_small (params route=fused) */
#define LS_EPB 2              /* experts per block */
#define LS_KQ 4               /* warps splitting H per expert */
#define LS_MAXC 8             /* 16-byte gate pieces a lane holds at once */

struct LogitsArgs {
    const uint16_t *x;    /* [tc, H] bf16 */
    const uint16_t *gate; /* [E, H] bf16 */
    const int *ntok;
    float *logits;        /* [tc, E] fp32, one slice */
    uint8_t *xq;          /* x's codes [tc, H], or NULL: no quantization here */
    float *xs;            /* [tc, ceil(H / 128)] */
    uint16_t *x16;        /* the codes as f16 (f16_codes), or NULL */
    int *ticket;          /* zeroed here for k_router_count (mma_group.cuh), or NULL */
    int qmode, H, E, lblocks; /* blocks [0, lblocks) compute logits, the rest quantize x */
};

/*
 * Router logits of a chunk of at most DSV4C_LOGITS_SMALL live tokens (*ntok; more: nothing here,
 * the GEMM kernels take the chunk) as a GEMV: each gate row is read once (the GEMM kernels'
 * 128-token tiles and split-K slices took 7.6 us for one token on the H200, ncu, against 2 MB of
 * gate), LS_KQ warps a row, each lane a strided run of 8-element pieces summed in fp32 in k order,
 * then the lanes by a fixed butterfly and the warps in order: one deterministic fp32 sum (SPEC.md
 * 2.1 asks fp32 accumulation, no order), the same for a token whatever the chunk's padding. The
 * blocks past lblocks quantize x, one warp per (token, 128-group), which k_router then skips.
 * Block 0 zeroes the fused router's ticket (its blocks wait for this kernel to finish: pdl_enter).
 */
template <int TG> /* tokens whose x a lane loads together: 1 (the default), 4 (params logits_tg=4) */
__global__ void __launch_bounds__(256) k_logits_small(LogitsArgs a)
{
    pdl_enter();
    const int nt = *a.ntok, H = a.H, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (a.ticket && blockIdx.x == 0 && threadIdx.x == 0)
        *a.ticket = 0;
    if (nt > DSV4C_LOGITS_SMALL) /* the GEMM kernels' chunk (k_router reads their slices) */
        return;
    if ((int)blockIdx.x >= a.lblocks) {
        const int ng = (H + 127) / 128, p = ((int)blockIdx.x - a.lblocks) * 8 + warp, t = p / ng, g = p % ng;
        if (t >= nt)
            return;
        float v[4];
        bool ok[4];
        for (int i = 0; i < 4; i++) {
            const int k = g * 128 + lane * 4 + i;
            ok[i] = k < H;
            v[i] = ok[i] ? bf16f(a.x[(long long)t * H + k]) : 0.0f;
        }
        quant_x_group(v, ok, a.qmode, lane, a.xq + (long long)t * H, a.xs + (long long)t * ng + g,
                      a.x16 ? a.x16 + (long long)t * H : nullptr, g * 128 + lane * 4);
        return;
    }
    __shared__ float part[LS_EPB][LS_KQ][DSV4C_LOGITS_SMALL];
    const int j = warp / LS_KQ, q = warp % LS_KQ, e = (int)blockIdx.x * LS_EPB + j;
    const int hq = (H / 8 + LS_KQ - 1) / LS_KQ * 8, k0 = q * hq, k1 = min(H, k0 + hq); /* H % 8 == 0 */
    float acc[DSV4C_LOGITS_SMALL];
#pragma unroll
    for (int t = 0; t < DSV4C_LOGITS_SMALL; t++)
        acc[t] = 0.0f;
    for (int kb = k0 + lane * 8; e < a.E && kb < k1; kb += 256 * LS_MAXC) {
        uint4 gv[LS_MAXC];
#pragma unroll
        for (int c = 0; c < LS_MAXC; c++) /* every piece in flight before the first use */
            gv[c] = kb + 256 * c < k1 ? __ldg((const uint4 *)(a.gate + (long long)e * H + kb + 256 * c)) : make_uint4(0, 0, 0, 0);
if constexpr (TG == 1) {
#pragma unroll
            for (int t = 0; t < DSV4C_LOGITS_SMALL; t++) {
                if (t >= nt)
                    break;
#pragma unroll
                for (int c = 0; c < LS_MAXC; c++) {
                    if (kb + 256 * c >= k1)
                        break;
                    const uint4 xv = __ldg((const uint4 *)(a.x + (long long)t * H + kb + 256 * c));
                    const uint32_t gw[4] = {gv[c].x, gv[c].y, gv[c].z, gv[c].w}, xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        acc[t] = fmaf(bf16f((uint16_t)(xw[i] & 0xFFFFu)), bf16f((uint16_t)(gw[i] & 0xFFFFu)), acc[t]);
                        acc[t] = fmaf(bf16f((uint16_t)(xw[i] >> 16)), bf16f((uint16_t)(gw[i] >> 16)), acc[t]);
                    }
                }
            }
        } else {
            /* TG tokens at a time, their x pieces loaded together before any is used (a row past
               the live tokens reads the last live one and is not summed): one load latency per
               group and piece, not per token and piece. Each token's sum keeps TG == 1's order
               (piece, then element), so the logits are the same bits. */
#pragma unroll
            for (int t0 = 0; t0 < DSV4C_LOGITS_SMALL; t0 += TG) {
                if (t0 >= nt)
                    break;
#pragma unroll
                for (int c = 0; c < LS_MAXC; c++) {
                    if (kb + 256 * c >= k1)
                        break;
                    uint4 xv[TG];
#pragma unroll
                    for (int u = 0; u < TG; u++)
                        xv[u] = __ldg((const uint4 *)(a.x + (long long)min(t0 + u, nt - 1) * H + kb + 256 * c));
                    const uint32_t gw[4] = {gv[c].x, gv[c].y, gv[c].z, gv[c].w};
#pragma unroll
                    for (int u = 0; u < TG; u++) {
                        if (t0 + u >= nt)
                            break;
                        const uint32_t xw[4] = {xv[u].x, xv[u].y, xv[u].z, xv[u].w};
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            acc[t0 + u] = fmaf(bf16f((uint16_t)(xw[i] & 0xFFFFu)), bf16f((uint16_t)(gw[i] & 0xFFFFu)),
                                               acc[t0 + u]);
                            acc[t0 + u] = fmaf(bf16f((uint16_t)(xw[i] >> 16)), bf16f((uint16_t)(gw[i] >> 16)), acc[t0 + u]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < DSV4C_LOGITS_SMALL; t++) {
        if (t >= nt)
            break;
        float v = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        if (lane == 0)
            part[j][q][t] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < LS_EPB * nt; i += blockDim.x) {
        const int jj = i / nt, t = i - jj * nt, ee = (int)blockIdx.x * LS_EPB + jj;
        if (ee >= a.E)
            continue;
        float s = part[jj][0][t];
        for (int qq = 1; qq < LS_KQ; qq++)
            s += part[jj][qq][t];
        a.logits[(long long)t * a.E + ee] = s;
    }
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
