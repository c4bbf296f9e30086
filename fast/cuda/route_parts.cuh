/*
 * Device parts of the router kernels that more than one translation unit compiles (fast/cuda):
 * the order of selection keys, the activation quantization of one group of x, the body of the
 * small chunks' router logits (k_logits_small, logits_small.cu; k_route_small, route_small.cu) and
 * a block's routing of one token, route_block (k_router, router.cuh; k_router_count,
 * router_count.cu). Inline
 * functions and types only: a header with a kernel in it would define that kernel once per unit.
 */
#ifndef DSV4MOE_FAST_CUDA_ROUTE_PARTS_CUH
#define DSV4MOE_FAST_CUDA_ROUTE_PARTS_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

__device__ __forceinline__ bool before_key(float ka, int ia, float kb, int ib) { return ka > kb || (ka == kb && ia < ib); }

/* An order-preserving unsigned key of a non-NaN float (-0 as +0, as the float comparison has it):
   a larger key is a larger value; every value's key is above 0, which marks "no candidate". */
__device__ __forceinline__ unsigned ord_key(float v)
{
    const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Lane's best untaken expert among e = lane + 32 i (bit i of taken): the largest key, the lowest id
   on ties; bu 0 and be -1 when it has none. */
__device__ __forceinline__ void lane_best(const float *bk, int E, int lane, unsigned taken, unsigned &bu, int &be)
{
    bu = 0u;
    be = -1;
#pragma unroll 1
    for (int e = lane, i = 0; e < E; e += 32, i++) {
        const unsigned u = ord_key(bk[e]);
        if (!(taken >> i & 1u) && u > bu) {
            bu = u;
            be = e;
        }
    }
}

/* lane_best over the lane's keys in registers: ku[i] = ord_key of expert lane + 32 i, 0 past E. */
template <int N>
__device__ __forceinline__ void lane_best_reg(const unsigned (&ku)[N], int lane, unsigned taken, unsigned &bu, int &be)
{
    bu = 0u;
    be = -1;
#pragma unroll
    for (int i = 0; i < N; i++)
        if (!(taken >> i & 1u) && ku[i] > bu) {
            bu = ku[i];
            be = lane + 32 * i;
        }
}

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

/* topk_serial as a call: route_block<LEAN>'s only rare path that stays, kept out of its code's line */
static __device__ __noinline__ void topk_serial_cold(const float *bk, int E, int K, float *key, int *idk)
{
    topk_serial(bk, E, K, key, idk);
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
/* A logits warp's share of H: its quarter (LS_KQ), in whole 8-element pieces (H % 8 == 0) */
__host__ __device__ constexpr int logits_share(int H) { return (H / 8 + LS_KQ - 1) / LS_KQ * 8; }
/* logits_tokens_loop's reach (logits_loop, the default): that share in one pass of LS_MAXC pieces a lane */
__host__ __device__ constexpr bool logits_loop_fits(int H) { return logits_share(H) <= 256 * LS_MAXC; }

struct LogitsArgs {
    const uint16_t *x;    /* [tc, H] bf16 */
    const uint16_t *gate; /* [E, H] bf16 */
    const int *ntok;
    float *logits;        /* [tc, E] fp32, one slice */
    uint8_t *xq;          /* x's codes [tc, H], or NULL: no quantization here */
    float *xs;            /* [tc, ceil(H / 128)] */
    uint16_t *x16;        /* the codes as f16 (f16_codes), or NULL */
    int *ticket;          /* k_logits_small zeroes it for k_router_count (router_count.cu), or NULL */
    int dep_first;        /* params route_code=warm: the dependents released before the programmatic wait,
                             so k_router_count's dry pass overlaps this kernel's wait too */
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
/* acc plus the eight bf16 products of x and g (16 bytes each), element by element in k order: one
   lane's piece of a logit. */
__device__ __forceinline__ float dot8_bf16(const uint4 &x, const uint4 &g, float acc)
{
    const uint32_t xw[4] = {x.x, x.y, x.z, x.w}, gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        acc = fmaf(bf16f((uint16_t)(xw[i] & 0xFFFFu)), bf16f((uint16_t)(gw[i] & 0xFFFFu)), acc);
        acc = fmaf(bf16f((uint16_t)(xw[i] >> 16)), bf16f((uint16_t)(gw[i] >> 16)), acc);
    }
    return acc;
}

/*
 * LOOP (the default; params logits_loop=off clears it): the tokens in a loop the compiler does not
 * unroll, each group of
 * TG tokens summed to the end and reduced before the next, instead of every token's sum held in
 * registers through a fully unrolled token loop. The unrolled loop is 128 KB of SASS (8016
 * instructions for TPB 32), which each warp runs once per launch through instruction caches that
 * hold none of it; the loop's body is TG tokens' worth. A token's sum keeps its order (its pieces
 * in the order of the c loop, then the butterfly), so the same logits bit for bit. Only where
 * a warp's share of H takes one pass of the unrolled kb loop (logits_loop_fits: H up to 8192,
 * every DeepSeek-V4 width), so the gate pieces stay in registers across the tokens; a wider layer
 * keeps the unrolled loop (the host decides, pipeline.cuh).
 */
template <int TG>
__device__ __forceinline__ void logits_tokens_loop(const LogitsArgs &a, const uint16_t *x, int e, int k0, int k1,
                                                   int nb, float *part_t)
{
    const int H = a.H, lane = threadIdx.x & 31;
    const int kb = k0 + lane * 8;
    const bool on = e < a.E && kb < k1; /* the unrolled loop's one pass */
    uint4 gv[LS_MAXC];
#pragma unroll
    for (int c = 0; c < LS_MAXC; c++)
        gv[c] = on && kb + 256 * c < k1 ? __ldg((const uint4 *)(a.gate + (long long)e * H + kb + 256 * c))
                                        : make_uint4(0, 0, 0, 0);
#pragma unroll 1
    for (int t0 = 0; t0 < nb; t0 += TG) {
        float acc[TG];
#pragma unroll
        for (int u = 0; u < TG; u++)
            acc[u] = 0.0f;
#pragma unroll
        for (int c = 0; c < LS_MAXC; c++) {
            if (!on || kb + 256 * c >= k1)
                break;
            uint4 xv[TG];
#pragma unroll
            for (int u = 0; u < TG; u++)
                xv[u] = __ldg((const uint4 *)(x + (long long)min(t0 + u, nb - 1) * H + kb + 256 * c));
#pragma unroll
            for (int u = 0; u < TG; u++)
                acc[u] = dot8_bf16(xv[u], gv[c], acc[u]);
        }
#pragma unroll
        for (int u = 0; u < TG; u++) {
            float v = acc[u];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
            if (lane == 0 && t0 + u < nb)
                part_t[t0 + u] = v;
        }
    }
}

/* A logits block's last step: each of its experts' logits of its nb tokens, the LS_KQ warps' partial
   sums in warp order. */
template <int TPB>
__device__ __forceinline__ void logits_small_sum(const LogitsArgs &a, int eb, int nb, const float (&part)[LS_EPB][LS_KQ][TPB],
                                                 float *logits)
{
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

template <int TG, int TPB, bool LOOP = false> /* TG: tokens whose x a lane loads together, 4 (the
                               default) or 1 (params logits_tg=1); TPB: tokens a block sums, at most
                               DSV4C_LOGITS_SMALL; LOOP: logits_loop, the default (logits_tokens_loop) */
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
    const int hq = logits_share(H), k0 = q * hq, k1 = min(H, k0 + hq);
    if constexpr (LOOP) {
        logits_tokens_loop<TG>(a, x, e, k0, k1, nb, &part[j][q][0]);
    } else { /* logits_loop=off, or H past the loop's reach: every token's sum in registers through a
                fully unrolled token loop */
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
                        acc[t] = dot8_bf16(__ldg((const uint4 *)(x + (long long)t * H + kb + 256 * c)), gv[c], acc[t]);
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
#pragma unroll
                        for (int u = 0; u < TG; u++) {
                            if (t0 + u >= nb)
                                break;
                            acc[t0 + u] = dot8_bf16(xv[u], gv[c], acc[t0 + u]);
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
    }
    __syncthreads();
    logits_small_sum<TPB>(a, eb, nb, part, logits);
}

/*
 * Routes token t of the chunk with the whole block (blockDim.x threads, a multiple of 32; dynamic
 * shared memory (H + 2 E + 4 K) floats): quantizes its x when a.xq (else a.x is read only for the
 * predictor), reads its logits (a.lslices partial sums), scores, selects, weights and prunes, and
 * writes ids, w and kept. Returns at the same point on every thread of the block (the callers may
 * synchronize after it).
 *
 * LEAN (params route_code=lean, k_router_count): compiled for the decode configuration only, which
 * the caller has checked (route_lean_fits): a chunk of k_logits_small (its logits one slice, x
 * quantized there), no hash table, no top-p, scores other than the softmax, E <= 256. The code of
 * every other configuration is left out, the same operations in the same order for this one: the
 * block runs its code once per step through instruction caches that hold none of it, so its time
 * is the number of distinct instructions on its path (docs/cuda.md). dry (params route_code=warm,
 * before the programmatic wait): the same path on whatever the buffers hold, to bring its code
 * into the multiprocessor's instruction caches; it counts no statistic, and what it writes the
 * real pass writes again. LEAN reads the other kernels' outputs past L1 (the dry pass's loads may
 * have left old lines there).
 */
template <bool WW = false, bool LEAN = false> /* WW: params weights=warp (the weights on warp 0, below) */
__device__ __forceinline__ void route_block(const RouterArgs &a, int t, bool dry = false)
{
    /* LEAN: what the kernels before this one wrote (the token count, the logits) is read past L1 (L2
       only): route_code=warm's dry pass may have brought its old lines into L1 before the wait */
    if (t >= (LEAN ? __ldcg(a.ntok) : *a.ntok))
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
    const bool small = LEAN || (a.small_max > 0 && *a.ntok <= a.small_max); /* k_logits_small's chunk */
    const int lslices = small ? 1 : a.lslices;
    uint8_t *const xq = small ? nullptr : a.xq;
    const bool need_x = !LEAN && (xq || (a.top_p_on && !a.hash && a.predictor == 2));
    const bool hash = !LEAN && a.hash, softmax = !LEAN && a.score == 2;
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
        float s = LEAN ? __ldcg(src) : src[0];
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
        if (!hash) /* the bias now, beside the logits: its load is not one more round trip later */
            bk[e] = a.bias ? __ldg(a.bias + e) : 0.0f;
    }
    __syncthreads();
    int fin = 1;
    for (int e = tid; e < E; e += blockDim.x)
        fin &= isfinite(lg[e]) ? 1 : 0;
    const int finite = __syncthreads_and(fin);
    /* elementwise scores in parallel (softmax needs the whole row: thread 0 below) */
    if (finite && !softmax) {
        for (int e = tid; e < E; e += blockDim.x)
            lg[e] = score_of(lg[e], a.score);
    }
    __syncthreads();
    if (tid == 0) {
        s_finite = finite;
        if (!finite) {
            if (!dry)
                atomicAdd(&a.stats[ST_NONFINITE], 1ull);
            for (int k = 0; k < K; k++) {
                a.ids[(long long)t * K + k] = k;
                a.w[(long long)t * K + k] = __fdiv_rn(a.route_scale, (float)K);
            }
            a.kept[t] = K;
        } else if (softmax) {
            softmax_serial(lg, E);
        }
    }
    __syncthreads();
    if (!s_finite)
        return;
    /* the keys once into shared memory: the selection below reads each many times */
    if (!hash)
        for (int e = tid; e < E; e += blockDim.x)
            bk[e] = a.bias ? __fadd_rn(lg[e], bk[e]) : lg[e];
    __syncthreads();
    /* selection: the hash table (ids checked here too: the device-pointer forward has not seen them
       on the host), or the top K of score + bias by (value descending, id ascending) */
    if (hash) {
        if (warp == 0)
            hash_select_warp(a, t, lane, idk);
    } else if (warp == 0) {
        /* K rounds of two warp reductions: the largest order-preserving key (__reduce_max_sync),
           then the lowest id holding it (__reduce_min_sync); the winner's lane takes it and rescans
           its own experts e = lane + 32 i (a bit per expert marks the taken ones; one call site of
           lane_best, at the round's start). Two single-instruction reductions a round instead of a
           five-step shuffle tree of key and id: this warp selects while the block's other warps wait
           at the barrier below. A NaN key, or E > 1024, takes the serial insertion instead, whose
           order NaN keys make position-dependent. */
        bool nan = false;
        for (int e = lane; e < E; e += 32)
            nan |= bk[e] != bk[e];
        nan = __any_sync(0xFFFFFFFFu, nan) || (!LEAN && E > 1024);
        if (!nan) {
            unsigned taken = 0u, bu = 0u;
            int be = -1;
            bool scan = true;
            unsigned ku[8]; /* E <= 256: the lane's keys in registers, so a rescan reads no memory */
#pragma unroll
            for (int i = 0; i < 8; i++)
                ku[i] = E <= 256 && lane + 32 * i < E ? ord_key(bk[lane + 32 * i]) : 0u;
#pragma unroll 1
            for (int k = 0; k < K; k++) {
                if (scan && (LEAN || E <= 256))
                    lane_best_reg(ku, lane, taken, bu, be);
                else if (!LEAN && scan)
                    lane_best(bk, E, lane, taken, bu, be);
                scan = false;
                const unsigned m = __reduce_max_sync(0xFFFFFFFFu, bu);
                const unsigned we = __reduce_min_sync(0xFFFFFFFFu, be >= 0 && bu == m ? (unsigned)be : 0xFFFFFFFFu);
                const bool any = we != 0xFFFFFFFFu;
                if (lane == 0) {
                    key[k] = any ? bk[we] : 0.0f;
                    idk[k] = any ? (int)we : -1;
                }
                if (any && (int)(we & 31u) == lane) {
                    taken |= 1u << (we >> 5);
                    scan = true;
                }
            }
        } else if (lane == 0) {
            if constexpr (LEAN)
                topk_serial_cold(bk, E, K, key, idk); /* out of the path's line */
            else
                topk_serial(bk, E, K, key, idk);
        }
    }
    if constexpr (WW) {
        /* params weights=warp: lane k's score over the sequential sum of the K scores (every lane
           adds them in slot order by shuffles: thread 0's sum below, the reference's), on warp 0
           right after its selection, so no thread computes them alone after the barrier (a
           serial loop of K divisions; k_route_small's route_warp does the same) */
        if (warp == 0 && K <= 32) {
            __syncwarp(); /* idk: written by lane 0 or the warp */
            const float v = lane < K ? lg[idk[lane]] : 0.0f;
            float sum = 0.0f;
#pragma unroll 1
            for (int k = 0; k < K; k++)
                sum = __fadd_rn(sum, __shfl_sync(0xFFFFFFFFu, v, k));
            float w = v;
            if (!softmax)
                w = __fdiv_rn(w, __fadd_rn(sum, a.norm_eps));
            w = __fmul_rn(w, a.route_scale);
            if (lane < K)
                wk[lane] = w;
        }
    }
    __syncthreads();
    if (tid == 0 && (!WW || K > 32)) {
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            wk[k] = lg[idk[k]];
            sum = __fadd_rn(sum, wk[k]);
        }
        if (!softmax) {
            float den = __fadd_rn(sum, a.norm_eps);
            for (int k = 0; k < K; k++)
                wk[k] = __fdiv_rn(wk[k], den);
        }
        for (int k = 0; k < K; k++)
            wk[k] = __fmul_rn(wk[k], a.route_scale);
    }

    const bool topp = !LEAN && a.top_p_on && !a.hash;
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

} // namespace dsv4cuda

#endif
