/*
 * Device parts of the router kernels that more than one translation unit compiles (fast/cuda):
 * the order of selection keys, the activation quantization of one group of x, and the body of the
 * small chunks' router logits (k_logits_small, router.cuh; k_route_small, route_small.cu). Inline
 * functions and types only: a header with a kernel in it would define that kernel once per unit.
 */
#ifndef DSV4MOE_FAST_CUDA_ROUTE_PARTS_CUH
#define DSV4MOE_FAST_CUDA_ROUTE_PARTS_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

__device__ __forceinline__ bool before_key(float ka, int ia, float kb, int ib) { return ka > kb || (ka == kb && ia < ib); }

/* The elementwise score of a logit (SPEC.md 2.2): sqrt(softplus) (0) or the sigmoid (1). */
__device__ __forceinline__ float score_of(float l, int score)
{
    return score == 0 ? sqrtf(l > 20.0f ? l : log1pf(expf(l))) : __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-l)));
}

/* The softmax of E logits in place, one thread, in the reference's sequential order. */
__device__ __forceinline__ void softmax_serial(float *lg, int E)
{
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

/* The top K of E keys by (value descending, id ascending), one thread, by insertion: the order
   for keys with a NaN (which makes the result position-dependent, as the reference's loop). */
__device__ __forceinline__ void topk_serial(const float *bk, int E, int K, float *key, int *idk)
{
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

/* A hash layer's K experts of token t (tid2eid), by one warp, into idk[0 .. K): the table's entries
   loaded at once by the warp, not one after another. An input id outside [0, V) or an entry
   outside [0, E) routes the token to experts 0 .. K-1 and is counted (ST_BADIN, ST_BADIN_AT): the
   device-pointer forward has not seen the ids on the host. */
__device__ __forceinline__ void hash_select_warp(const RouterArgs &a, int t, int lane, int *idk)
{
    const int K = a.K, E = a.E;
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

/* Top-p pruning of one token's K slots (SPEC.md 2.4), one thread, as cpu.c: the contributions
   w * norm sorted descending (ties to the lower id) by insertion into ord, the kept prefix, the
   pruned slots' ids set to E and weights to 0, the renormalization. contrib: K floats of scratch.
   Returns the kept count. */
__device__ __forceinline__ int top_p_prune(const RouterArgs &a, float *contrib, int *ord, int *idk, float *wk,
                                           const float *nrm)
{
    const int K = a.K, E = a.E;
    int keep = K;
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
    return keep;
}

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
    int *ticket;          /* k_logits_small zeroes it for k_router_count (mma_group.cuh), or NULL */
    int qmode, H, E;
    int lblocks;          /* blocks per group of tokens: LS_EPB experts each */
    int tgroups;          /* groups of TPB tokens (logits_small_block): blocks [0, lblocks tgroups)
                             compute logits (expert pair b % lblocks, tokens TPB (b / lblocks) ..),
                             the rest quantize x; 1 with TPB = DSV4C_LOGITS_SMALL */
};

/*
 * Router logits of a chunk of nt <= DSV4C_LOGITS_SMALL live tokens (more: the GEMM kernels take
 * the chunk) as a GEMV, by this block of a grid of lblocks tgroups + the quantizing blocks (256
 * threads): a block takes two gate rows and up to TPB tokens, so each gate row is read once per
 * TPB tokens (the GEMM kernels' 128-token tiles and split-K slices took 7.6 us for one token on
 * the H200, ncu, against 2 MB of gate), LS_KQ warps a row, each lane a strided run of 8-element pieces summed in fp32 in k order,
 * then the lanes by a fixed butterfly and the warps in order: one deterministic fp32 sum (SPEC.md
 * 2.1 asks fp32 accumulation, no order), the same for a token whatever the chunk's padding and
 * TPB (a token's sum is its own, whichever block holds it). The
 * blocks past lblocks quantize x, one warp per (token, 128-group), which k_router then skips.
 * Every thread of a logits block returns at the same point; a quantizing warp may return early.
 */
template <int TG, int TPB> /* TG: tokens whose x a lane loads together, 1 (the default) or 4 (params
                               logits_tg=4); TPB: tokens a block sums, at most DSV4C_LOGITS_SMALL */
__device__ __forceinline__ void logits_small_block(const LogitsArgs &a, int nt)
{
    constexpr bool one = TPB == DSV4C_LOGITS_SMALL; /* one group of tokens: block b is expert pair b */
    const int H = a.H, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nlb = one ? a.lblocks : a.lblocks * a.tgroups;
    if ((int)blockIdx.x >= nlb) {
        const int ng = (H + 127) / 128, p = ((int)blockIdx.x - nlb) * 8 + warp, t = p / ng, g = p % ng;
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
    const int eb = one ? (int)blockIdx.x : (int)blockIdx.x % a.lblocks, tb0 = one ? 0 : (int)blockIdx.x / a.lblocks * TPB;
    const int nb = min(TPB, nt - tb0); /* this block's tokens tb0 .. tb0 + nb - 1 (none when nb <= 0) */
    const uint16_t *x = a.x + (long long)tb0 * H;
    float *logits = a.logits + (long long)tb0 * a.E;
    __shared__ float part[LS_EPB][LS_KQ][TPB];
    const int j = warp / LS_KQ, q = warp % LS_KQ, e = eb * LS_EPB + j;
    const int hq = (H / 8 + LS_KQ - 1) / LS_KQ * 8, k0 = q * hq, k1 = min(H, k0 + hq); /* H % 8 == 0 */
    float acc[TPB];
#pragma unroll
    for (int t = 0; t < TPB; t++)
        acc[t] = 0.0f;
    for (int kb = k0 + lane * 8; e < a.E && kb < k1; kb += 256 * LS_MAXC) {
        uint4 gv[LS_MAXC];
#pragma unroll
        for (int c = 0; c < LS_MAXC; c++) /* every piece in flight before the first use */
            gv[c] = kb + 256 * c < k1 ? __ldg((const uint4 *)(a.gate + (long long)e * H + kb + 256 * c)) : make_uint4(0, 0, 0, 0);
if constexpr (TG == 1) {
#pragma unroll
            for (int t = 0; t < TPB; t++) {
                if (t >= nb)
                    break;
#pragma unroll
                for (int c = 0; c < LS_MAXC; c++) {
                    if (kb + 256 * c >= k1)
                        break;
                    const uint4 xv = __ldg((const uint4 *)(x + (long long)t * H + kb + 256 * c));
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
            for (int t0 = 0; t0 < TPB; t0 += TG) {
                if (t0 >= nb)
                    break;
#pragma unroll
                for (int c = 0; c < LS_MAXC; c++) {
                    if (kb + 256 * c >= k1)
                        break;
                    uint4 xv[TG];
#pragma unroll
                    for (int u = 0; u < TG; u++)
                        xv[u] = __ldg((const uint4 *)(x + (long long)min(t0 + u, nb - 1) * H + kb + 256 * c));
                    const uint32_t gw[4] = {gv[c].x, gv[c].y, gv[c].z, gv[c].w};
#pragma unroll
                    for (int u = 0; u < TG; u++) {
                        if (t0 + u >= nb)
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
    for (int t = 0; t < TPB; t++) {
        if (t >= nb)
            break;
        float v = acc[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        if (lane == 0)
            part[j][q][t] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < LS_EPB * nb; i += blockDim.x) {
        const int jj = i / nb, t = i - jj * nb, ee = eb * LS_EPB + jj;
        if (ee >= a.E)
            continue;
        float s = part[jj][0][t];
        for (int qq = 1; qq < LS_KQ; qq++)
            s += part[jj][qq][t];
        logits[(long long)t * a.E + ee] = s;
    }
}

} // namespace dsv4cuda

#endif
