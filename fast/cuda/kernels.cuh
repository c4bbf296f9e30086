/*
 * The CUDA backend's device code (fast/cuda): number formats bit-identical to core/formats.c,
 * the router, the device-side grouping, the two grouped-GEMM regimes, the SwiGLU epilogue and
 * the combine. Included once, by cuda.cu. docs/cuda.md describes the design.
 */
#ifndef DSV4MOE_FAST_CUDA_KERNELS_CUH
#define DSV4MOE_FAST_CUDA_KERNELS_CUH

#include <stdint.h>
#include <cuda_runtime.h>

namespace dsv4cuda {

enum { WF_BF16 = 0, WF_FP8 = 1, WF_FP4 = 2 };

/* Device counters, zeroed per forward, read back with the outputs. */
enum { ST_NONFINITE = 0, ST_RG, ST_RU, ST_SG, ST_SU, ST_ACTIVE, ST_EMPTY, ST_BADID, ST_BADIN, ST_BADIN_AT, ST_N };
/* ST_BADIN: hash-layer input ids (or their tid2eid entries) out of range, found on the device (the
   device-pointer forward; the host forward checks them before anything runs). The token is routed
   to experts 0 .. K-1 instead, and the forward returns an error. ST_BADIN_AT: 0xFFFFFFFF minus the
   smallest such token index of the chunk (atomicMax), so the error names the first one. */

#define DSV4C_SMALL_MAX 8 /* groups up to this many rows take the GEMV path */
#define DSV4C_BM 128 /* tensor-core tile: 128 rows (of one group) x 64 columns, K blocks of 32 */
#define DSV4C_BN 64
#define DSV4C_BK 32
#define DSV4C_TILE_THREADS 256
#define DSV4C_GEMV_THREADS 256
#define DSV4C_GEMV_COLS 32 /* output columns per GEMV block (4 per warp) */

/* ---------------- formats (the integer algorithms of core/formats.c) ---------------- */

__device__ __forceinline__ float bf16f(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ __forceinline__ uint16_t f2bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float rbf16(float x) { return bf16f(f2bf16(x)); }

/* e4m3fn code -> fp32 (0x7F / 0xFF: NaN with the sign), as e4m3_lut. */
__device__ __forceinline__ float e4m3f(uint32_t c)
{
    uint32_t s = (c & 0x80u) << 24, m = c & 0x7Fu;
    if (m == 0x7Fu)
        return __uint_as_float(s | 0x7FC00000u);
    if (m >= 8u)
        return __uint_as_float(s | ((((m >> 3) + 120u) << 23) | ((m & 7u) << 20)));
    return __uint_as_float(s | __float_as_uint((float)m * 0.001953125f)); /* m * 2^-9, exact */
}

__device__ __forceinline__ uint32_t e4m3_encode(float x)
{
    uint32_t u = __float_as_uint(x);
    uint32_t a = u & 0x7FFFFFFFu;
    uint32_t e = a >> 23;
    uint32_t normal = e >= 121u;
    uint32_t t = normal ? a - (120u << 23) : (a & 0x7FFFFFu) | 0x800000u;
    uint32_t sh = normal ? 20u : (141u - e > 31u ? 31u : 141u - e);
    uint32_t r = (t + (1u << (sh - 1u)) - 1u + ((t >> sh) & 1u)) >> sh;
    r = a >= 0x43E00000u ? 0x7Eu : r;
    r = a > 0x7F800000u ? 0x7Fu : r;
    return ((u >> 24) & 0x80u) | r;
}

__device__ __forceinline__ float e2m1f(uint32_t n)
{
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[n & 7u];
    return (n & 8u) ? -v : v;
}

__device__ __forceinline__ float ue8m0f(uint32_t b)
{
    if (b == 255u)
        return __uint_as_float(0x7FC00000u);
    return __uint_as_float(b ? b << 23 : 0x00400000u);
}

__device__ __forceinline__ float scale_inverse(uint32_t b)
{
    uint32_t e = 254u - b;
    return __uint_as_float(e ? e << 23 : 0x00400000u);
}

__device__ __forceinline__ int f32_split(uint32_t a, uint32_t *m)
{
    int e = (int)(a >> 23);
    uint32_t f = a & 0x7FFFFFu;
    if (e) {
        *m = f | 0x800000u;
        return e - 150;
    }
    e = -149;
    while (!(f & 0x800000u)) {
        f <<= 1;
        e--;
    }
    *m = f;
    return e;
}

/* dsv4_ue8m0_scale_for with limit 448 (amax already floored, finite or +Inf). */
__device__ __forceinline__ uint32_t ue8m0_scale_448(float amax)
{
    uint32_t ua = __float_as_uint(amax), ul = __float_as_uint(448.0f);
    if ((ua & 0x7FFFFFFFu) > 0x7F800000u)
        return 255u;
    if (ua == 0x7F800000u)
        return 254u;
    if (!(amax >= 1e-4f))
        ua = __float_as_uint(1e-4f);
    uint32_t ma, ml;
    int ea = f32_split(ua, &ma);
    int el = f32_split(ul, &ml);
    int k = ea - el + (ma > ml);
    int b = k + 127;
    return (uint32_t)(b < 0 ? 0 : b > 254 ? 254 : b);
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

__device__ __forceinline__ uint32_t warp_max_u(uint32_t v)
{
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t w = __shfl_xor_sync(0xFFFFFFFFu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/*
 * Quantizes one 128-group held 4 values per lane (lanes beyond the group's length pass
 * valid = 0): amax over the finite-or-Inf values (NaN ignored, as core/formats.c), scale by
 * `mode` (1 ue8m0, 2 fp32), codes as act_store writes them. Returns the scale.
 */
__device__ __forceinline__ float quant_group4(const float v[4], const bool valid[4], int mode, uint8_t code[4])
{
    uint32_t mb = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t a = __float_as_uint(v[i]) & 0x7FFFFFFFu;
        a = (!valid[i] || a > 0x7F800000u) ? 0u : a;
        mb = a > mb ? a : mb;
    }
    mb = warp_max_u(mb);
    float amax = __uint_as_float(mb);
    amax = amax < 1e-4f ? 1e-4f : amax;
    float s;
    if (mode == 1) {
        uint32_t b = ue8m0_scale_448(amax);
        s = ue8m0f(b);
        float inv = scale_inverse(b);
#pragma unroll
        for (int i = 0; i < 4; i++)
            code[i] = (uint8_t)e4m3_encode(__fmul_rn(v[i], inv));
    } else {
        s = __fdiv_rn(amax, 448.0f);
#pragma unroll
        for (int i = 0; i < 4; i++)
            code[i] = (uint8_t)e4m3_encode(__fdiv_rn(v[i], s));
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t sign = __float_as_uint(v[i]) & 0x80000000u;
        if ((code[i] & 0x7Fu) == 0x7Fu)
            code[i] = (uint8_t)((sign >> 24) | 0x7Fu);
    }
    return s;
}

/*
 * The f16 tile kernel (mma.cuh, k_tileh) reads activations as f16 copies of the e4m3 codes in a K
 * order that makes its register A fragments the fragment-native weights' runs: within each
 * 32-wide K step, physical element P = 16 s + 4 t + j (s, t, j < 2, 4, 4) sits at logical place
 * 16 s + 2 t + j for j < 2 and 16 s + 8 + 2 t + (j - 2) otherwise. Stores the 4 codes of physical
 * elements k0 .. k0 + 3 (k0 % 4 == 0) of a row.
 */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_codes)
{
    uint32_t r;
    asm("{\n.reg .b16 lo;\ncvt.u16.u32 lo, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(r) : "r"(two_codes));
    return r;
}

__device__ __forceinline__ void store_f16_codes(uint16_t *row, int k0, const uint8_t c[4])
{
    const int base = k0 & ~31, p = k0 & 31, s = p >> 4, t = (p >> 2) & 3;
    const uint32_t lo = e4m3x2_to_f16x2((uint32_t)c[0] | ((uint32_t)c[1] << 8));
    const uint32_t hi = e4m3x2_to_f16x2((uint32_t)c[2] | ((uint32_t)c[3] << 8));
    *(uint32_t *)(row + base + 16 * s + 2 * t) = lo;
    *(uint32_t *)(row + base + 16 * s + 8 + 2 * t) = hi;
}

/* ---------------- kernel arguments ---------------- */

struct RouterArgs {
    const uint16_t *x;      /* [Tc, H] bf16 */
    const int32_t *in_ids;  /* [Tc] (hash layers) */
    const int *ntok;
    const float *logits;    /* [Tc, E] fp32, x . gate^T by the GEMM kernels */
    const float *bias;      /* [E] or NULL */
    const int32_t *tid2eid; /* [V, K] or NULL */
    const float *pred_norm, *pred_w, *pred_b;
    int32_t *ids;           /* [Tc, K] */
    float *w;               /* [Tc, K] */
    int32_t *kept;          /* [Tc] */
    uint8_t *xq;            /* [Tc, H] codes or NULL */
    float *xs;              /* [Tc, ceil(H/128)] */
    uint16_t *x16;          /* [Tc, H] the codes as f16 in the f16 tile kernel's K order (f16_codes), or NULL */
    int lslices;            /* the logits arrive as lslices partial sums, lslice_stride floats apart */
    long long lslice_stride;
    unsigned long long *stats;
    long long t0; /* the chunk's first token (error messages) */
    int H, E, K, V, hash, score, gate_bf16, predictor, top_p_on, min_keep, renorm, qmode;
    float route_scale, norm_eps, top_p;
};

struct GroupArgs {
    const int32_t *ids;
    const float *w;
    const int *ntok;
    int *cnt, *slot_off, *pad_off, *active, *meta; /* meta: n_active, n_tiles, n_kept */
    int *tile_e, *tile_r0;
    int32_t *slot_tok, *slot_row, *rowmap;
    int32_t *slot_e; /* the expert of each kept slot (the fp8 path's kernels); NULL: not written */
    float *slot_w;
    unsigned long long *stats;
    int E, K, small, rows; /* rows: the padded rows the layout holds */
    int tile_m;            /* rows per tile of the tensor-core kernel (DSV4C_BM) */
};

/* One projection's weights on the device: w[0] for rows [0, n_split), w[1] for the rest. */
struct WeightDesc {
    const uint8_t *w[2];
    const uint8_t *s[2];
    long long w_stride, s_stride; /* bytes per expert */
    int n_split, N, K, fmt, sfp32;
};

struct GemmArgs {
    WeightDesc W;
    const void *A;          /* bf16 [rows, K] or codes [rows, K] */
    const float *As;        /* [rows, ceil(K/128)] (codes) */
    int aq;                 /* 1: A holds e4m3 codes + fp32 scales */
    int gather;             /* A row = slot_tok[...] (gate/up of routed groups) */
    uint16_t *out;          /* bf16 [rows, N] */
    float *outf;            /* fp32 [rows, N] instead (the router logits), or NULL */
    int shared;             /* one group of *ntok rows, rows identity */
    const int *ntok;
    const int *cnt, *slot_off, *pad_off, *active, *meta, *tile_e, *tile_r0;
    const int32_t *slot_tok;
    int small;
    int smem_rows;          /* GEMV: activation rows the launch's shared memory holds (<= small) */
    int kslice;             /* k_tiles: K per blockIdx.z slice (0: all of K); slice z writes outf + z * out_slice */
    long long out_slice;
};

struct SwigluArgs {
    const uint16_t *GU; /* [rows, 2I] */
    uint8_t *hq;        /* [rows, I] codes, or NULL */
    float *hs;          /* [rows, ceil(I/128)] */
    uint16_t *hb;       /* [rows, I] bf16 (unquantized) */
    const int *ntok, *meta;
    const int32_t *slot_row;
    const float *slot_w;
    unsigned long long *stats;
    int I, shared, clamp, before, qmode;
    float L;
};

struct CombineArgs {
    const uint16_t *O, *Osh; /* [rows, H], [Tc, H] or NULL */
    const int32_t *ids, *rowmap;
    const float *w;
    uint16_t *y;             /* [Tc, H] */
    const int *ntok;
    int H, E, K, after;
};

/* ---------------- router + activation quantization (one block per token) ---------------- */

__device__ __forceinline__ bool before_key(float ka, int ia, float kb, int ib) { return ka > kb || (ka == kb && ia < ib); }

__global__ void k_router(RouterArgs a)
{
    const int t = blockIdx.x;
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
    for (int i = tid * 8; i < H; i += blockDim.x * 8) { /* H % 8 == 0 */
        const uint4 v = __ldg((const uint4 *)(x + i));
        const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 8; q++)
            xs[i + q] = bf16f((uint16_t)(w4[q >> 1] >> (16 * (q & 1))));
    }
    __syncthreads();
    /* activation quantization of x (routed and shared share it) */
    if (a.xq) {
        int ng = (H + 127) / 128;
        for (int g = warp; g < ng; g += nw) {
            float v[4];
            bool ok[4];
            uint8_t c[4];
            for (int i = 0; i < 4; i++) {
                int k = g * 128 + lane * 4 + i;
                ok[i] = k < H;
                v[i] = ok[i] ? xs[k] : 0.0f;
            }
            float s = quant_group4(v, ok, a.qmode, c);
            const int k0 = g * 128 + lane * 4;
            if (ok[3]) {
                *(uint32_t *)(a.xq + (long long)t * H + k0) =
                    (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) | ((uint32_t)c[3] << 24);
                if (a.x16)
                    store_f16_codes(a.x16 + (long long)t * H, k0, c);
            } else {
                for (int i = 0; i < 4; i++)
                    if (ok[i])
                        a.xq[(long long)t * H + k0 + i] = c[i];
            }
            if (lane == 0)
                a.xs[(long long)t * ng + g] = s;
        }
    }
    /* logits (computed before by the GEMM kernels) */
    for (int e = tid; e < E; e += blockDim.x) {
        /* split-K partial sums, added in slice order; loaded 8 at a time so the loads overlap */
        const float *src = a.logits + (long long)t * E + e;
        float s = src[0];
        for (int z0 = 1; z0 < a.lslices; z0 += 8) {
            float v[8];
#pragma unroll
            for (int q = 0; q < 8; q++)
                v[q] = z0 + q < a.lslices ? __ldg(src + (z0 + q) * a.lslice_stride) : 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (z0 + q < a.lslices)
                    s = __fadd_rn(s, v[q]);
        }
        lg[e] = a.gate_bf16 ? rbf16(s) : s;
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
            bk[e] = a.bias ? __fadd_rn(lg[e], __ldg(a.bias + e)) : lg[e];
    __syncthreads();
    /* selection: the hash table (ids checked here too: the device-pointer forward has not seen them
       on the host), or the top K of score + bias by (value descending, id ascending) */
    if (a.hash) {
        if (tid == 0) {
            const long long id = a.in_ids[t];
            bool bad = id < 0 || id >= a.V;
            for (int k = 0; k < K && !bad; k++) {
                const int v = a.tid2eid[id * K + k];
                bad = v < 0 || v >= E;
            }
            for (int k = 0; k < K; k++)
                idk[k] = bad ? k : a.tid2eid[id * K + k];
            if (bad) {
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

/* ---------------- grouped GEMMs ---------------- */

/* The group a block works on: expert e, its n rows, its first padded row and first compact slot. */
struct Grp {
    int e, n, orow0, slot0;
};

/* The group of a GEMV block (x = active index), or n = 0 when the block has nothing to do. */
__device__ __forceinline__ Grp gemv_group(const GemmArgs &a)
{
    Grp g = {0, 0, 0, 0};
    if (a.shared) {
        int n = *a.ntok;
        if (n <= a.small)
            g.n = n;
        return g;
    }
    if ((int)blockIdx.x >= a.meta[0])
        return g;
    int e = a.active[blockIdx.x];
    int n = a.cnt[e];
    if (n > a.small)
        return g;
    g.e = e;
    g.n = n;
    g.orow0 = a.pad_off[e];
    g.slot0 = a.slot_off[e];
    return g;
}

__device__ __forceinline__ void store_out(const GemmArgs &a, long long row, int col, float v)
{
    if (a.outf)
        a.outf[row * a.W.N + col] = v;
    else
        a.out[row * a.W.N + col] = f2bf16(v);
}

__device__ __forceinline__ int a_row(const GemmArgs &a, const Grp &g, int j)
{
    return a.gather ? a.slot_tok[g.slot0 + j] : g.orow0 + j;
}

/* 16 bytes of a weight row -> fp32 values; returns the element count (32 fp4, 16 fp8, 8 bf16). */
template <int FMT>
__device__ __forceinline__ void decode16(uint4 q, float sc, float *v)
{
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    if (FMT == WF_FP4) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                uint32_t byte = (w[i] >> (8 * b)) & 0xFFu;
                v[8 * i + 2 * b] = __fmul_rn(e2m1f(byte & 0xFu), sc);
                v[8 * i + 2 * b + 1] = __fmul_rn(e2m1f(byte >> 4), sc);
            }
    } else if (FMT == WF_FP8) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int b = 0; b < 4; b++)
                v[4 * i + b] = __fmul_rn(e4m3f((w[i] >> (8 * b)) & 0xFFu), sc);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        }
    }
}

template <int FMT> struct FmtInfo;
template <> struct FmtInfo<WF_FP4> { enum { EPC = 32, RB_NUM = 1, RB_DEN = 2 }; };
template <> struct FmtInfo<WF_FP8> { enum { EPC = 16, RB_NUM = 1, RB_DEN = 1 }; };
template <> struct FmtInfo<WF_BF16> { enum { EPC = 8, RB_NUM = 2, RB_DEN = 1 }; };

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t bf16_bits_exact(float v) { return __float_as_uint(v) >> 16; }

/*
 * decode16 with the scale given raw (the ue8m0 byte, or an fp32 scale's bits): e2m1 nibbles times
 * 2^(s-127) are built directly in the exponent (exact, the same value as e2m1f(n) * ue8m0f(s))
 * for 2 <= s <= 252; other scales take the multiply.
 */
template <int FMT>
__device__ __forceinline__ void decode16_fast(uint4 q, uint32_t sraw, int sfp32, float *v)
{
    if (FMT == WF_FP4) {
        if (sraw >= 2u && sraw <= 252u) {
            const uint32_t base = (sraw - 1u) << 23;
            const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int h = 0; h < 8; h++) {
                    uint32_t nb = (w[i] >> (4 * h)) & 0xFu, m = nb & 7u, hi = m >> 1;
                    uint32_t bits = m ? base + (hi << 23) + ((m & 1u & (hi != 0u ? 1u : 0u)) << 22) : 0u;
                    v[8 * i + h] = __uint_as_float(bits | ((nb & 8u) << 28));
                }
        } else {
            decode16<WF_FP4>(q, ue8m0f(sraw), v);
        }
    } else if (FMT == WF_FP8) {
        decode16<WF_FP8>(q, sfp32 ? __uint_as_float(sraw) : ue8m0f(sraw), v);
    } else {
        decode16<WF_BF16>(q, 1.0f, v);
    }
}

/*
 * The decode regime: one block per (non-empty group of at most `small` rows, 32 output columns).
 * The group's rows are dequantized once into shared memory as fp32 (the values the reference's
 * GEMM sees; one float of padding per 32 keeps the lanes' chunks conflict-free). Each warp
 * streams whole weight rows with 16-byte coalesced loads, two output columns at a time with four
 * loads per column per lane in flight before decoding, so every touched weight byte is read once;
 * the two columns share every shared-memory read of the activations.
 */
template <int FMT, int AQ>
__global__ void __launch_bounds__(DSV4C_GEMV_THREADS) k_gemv(GemmArgs a)
{
    extern __shared__ float As[];
    const Grp g = gemv_group(a);
    if (g.n == 0)
        return;
    if (g.n > a.smem_rows)
        __trap(); /* cannot happen: the launch sized smem_rows from the chunk's bound on a group's rows */
    const int K = a.W.K, N = a.W.N, n = g.n;
    const int ngk = (K + 127) / 128;
    const int ldk = K + K / 32;
    for (int j = 0; j < n; j++) {
        long long r = a_row(a, g, j);
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            float v;
            if (AQ)
                v = __fmul_rn(e4m3f(((const uint8_t *)a.A)[r * K + k]), a.As[r * ngk + k / 128]);
            else
                v = bf16f(((const uint16_t *)a.A)[r * K + k]);
            As[j * ldk + k + (k >> 5)] = v;
        }
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long row_bytes = (long long)K * FmtInfo<FMT>::RB_NUM / FmtInfo<FMT>::RB_DEN;
    const int EPC = FmtInfo<FMT>::EPC;
    for (int cp = 0; cp < DSV4C_GEMV_COLS / 16; cp++) {
        const int col0 = blockIdx.y * DSV4C_GEMV_COLS + warp * (DSV4C_GEMV_COLS / 8) + cp * 2;
        if (col0 >= N)
            break;
        const bool two = col0 + 1 < N;
        const uint8_t *wrow[2], *srow[2];
        int rr[2];
#pragma unroll
        for (int c = 0; c < 2; c++) {
            int col = two || c == 0 ? col0 + c : col0;
            int which = col >= a.W.n_split;
            rr[c] = col - which * a.W.n_split;
            wrow[c] = a.W.w[which] + (long long)g.e * a.W.w_stride + (long long)rr[c] * row_bytes;
            srow[c] = a.W.s[which] + (long long)g.e * a.W.s_stride;
        }
        float acc[2][DSV4C_SMALL_MAX];
#pragma unroll
        for (int c = 0; c < 2; c++)
#pragma unroll
            for (int j = 0; j < DSV4C_SMALL_MAX; j++)
                acc[c][j] = 0.0f;
        for (long long ob = (long long)lane * 16; ob < row_bytes; ob += 512 * 4) {
            uint4 q[2][4];
            uint32_t sr[2][4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                long long off = ob + 512 * u;
                int k0 = (int)(off * FmtInfo<FMT>::RB_DEN / FmtInfo<FMT>::RB_NUM);
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    q[c][u] = make_uint4(0u, 0u, 0u, 0u);
                    sr[c][u] = 0u;
                    if (off < row_bytes) {
                        q[c][u] = __ldg((const uint4 *)(wrow[c] + off));
                        if (FMT == WF_FP4) {
                            sr[c][u] = srow[c][(long long)rr[c] * (K / 32) + k0 / 32];
                        } else if (FMT == WF_FP8) {
                            long long si = (long long)(rr[c] / 128) * ngk + k0 / 128;
                            sr[c][u] = a.W.sfp32 ? __float_as_uint(((const float *)srow[c])[si]) : srow[c][si];
                        }
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                long long off = ob + 512 * u;
                if (off >= row_bytes)
                    break;
                int k0 = (int)(off * FmtInfo<FMT>::RB_DEN / FmtInfo<FMT>::RB_NUM);
                float v0[32], v1[32];
                decode16_fast<FMT>(q[0][u], sr[0][u], a.W.sfp32, v0);
                decode16_fast<FMT>(q[1][u], sr[1][u], a.W.sfp32, v1);
#pragma unroll
                for (int j = 0; j < DSV4C_SMALL_MAX; j++) {
                    if (j < n) {
                        const float *x = As + j * ldk + k0 + (k0 >> 5);
                        float s0 = acc[0][j], s1 = acc[1][j];
#pragma unroll
                        for (int i = 0; i < EPC; i++) {
                            float xv = x[i];
                            s0 = fmaf(xv, v0[i], s0);
                            s1 = fmaf(xv, v1[i], s1);
                        }
                        acc[0][j] = s0;
                        acc[1][j] = s1;
                    }
                }
            }
        }
#pragma unroll
        for (int c = 0; c < 2; c++) {
            if (c == 1 && !two)
                break;
#pragma unroll
            for (int j = 0; j < DSV4C_SMALL_MAX; j++) {
                if (j < n) {
                    float sum = warp_sum(acc[c][j]);
                    if (lane == 0)
                        store_out(a, g.orow0 + j, col0 + c, sum);
                }
            }
        }
    }
}

/*
 * The tensor-core regime: one block per (128-row tile of a group of more than `small` rows, 64
 * output columns), 8 warps of 32x32. Operands are converted exactly to bf16 in shared memory
 * (e4m3 codes and e2m1 values times their power-of-two scale are bf16 values), multiplied on the
 * tensor cores (mma.sync m16n8k16, fp32 accumulation), and the fp32 activation scale and the fp8
 * weight block scale are applied per 128-group of K in fp32, so the result is the reference's
 * sum up to fp32 reassociation. The next K block's raw operands are loaded into registers while
 * the tensor cores work on the current one.
 */
template <int FMT, int AQ>
__global__ void __launch_bounds__(DSV4C_TILE_THREADS) k_tiles(GemmArgs a)
{
    __shared__ __align__(16) uint16_t sA[DSV4C_BM][DSV4C_BK + 8];
    __shared__ __align__(16) uint16_t sW[DSV4C_BN][DSV4C_BK + 8];
    __shared__ int s_arow[DSV4C_BM];
    Grp g = {0, 0, 0, 0};
    int m0;
    if (a.shared) {
        g.n = *a.ntok;
        m0 = blockIdx.x * DSV4C_BM;
        if (g.n <= a.small || m0 >= g.n)
            return;
    } else {
        if ((int)blockIdx.x >= a.meta[1])
            return;
        g.e = a.tile_e[blockIdx.x];
        m0 = a.tile_r0[blockIdx.x];
        g.n = a.cnt[g.e];
        g.orow0 = a.pad_off[g.e];
        g.slot0 = a.slot_off[g.e];
    }
    const int K = a.W.K, N = a.W.N, n0 = blockIdx.y * DSV4C_BN;
    const int ngk = (K + 127) / 128;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wr = (warp >> 1) * 32, wc = (warp & 1) * 32;
    const bool scaled = AQ || FMT == WF_FP8;
    if (tid < DSV4C_BM) {
        int j = m0 + tid;
        s_arow[tid] = j < g.n ? a_row(a, g, j) : -1;
    }
    __syncthreads();
    float acc[2][4][4], gacc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[mi][ni][q] = gacc[mi][ni][q] = 0.0f;
    const int lrow = tid >> 1, lhalf = tid & 1;
    const long long row_bytes = (long long)K * FmtInfo<FMT>::RB_NUM / FmtInfo<FMT>::RB_DEN;
    const bool wload = tid < 2 * DSV4C_BN;
    const int lcol = n0 + lrow;
    const uint8_t *wrow = NULL, *srow = NULL;
    int wr_r = 0;
    if (wload && lcol < N) {
        int which = lcol >= a.W.n_split;
        wr_r = lcol - which * a.W.n_split;
        wrow = a.W.w[which] + (long long)g.e * a.W.w_stride + (long long)wr_r * row_bytes;
        srow = a.W.s[which] + (long long)g.e * a.W.s_stride;
    }
    const int arow = s_arow[lrow];
    uint4 ra0 = make_uint4(0u, 0u, 0u, 0u), ra1 = ra0, rw0 = ra0, rw1 = ra0;
    uint32_t rsc = 0;
    auto load_raw = [&](int kb) {
        const int k = kb + lhalf * 16;
        if (arow >= 0) {
            if (AQ) {
                ra0 = *(const uint4 *)((const uint8_t *)a.A + (long long)arow * K + k);
            } else {
                const uint4 *p = (const uint4 *)((const uint16_t *)a.A + (long long)arow * K + k);
                ra0 = p[0];
                ra1 = p[1];
            }
        }
        if (wrow) {
            if (FMT == WF_FP4) {
                uint2 q = *(const uint2 *)(wrow + k / 2);
                rw0.x = q.x, rw0.y = q.y;
                rsc = srow[(long long)wr_r * (K / 32) + k / 32];
            } else if (FMT == WF_FP8) {
                rw0 = *(const uint4 *)(wrow + k);
            } else {
                const uint4 *p = (const uint4 *)(wrow + (long long)k * 2);
                rw0 = p[0];
                rw1 = p[1];
            }
        }
    };
    /* split K: this block's slice [k0, k1) (a multiple of 128), its own partial output */
    const int k0 = a.kslice ? (int)blockIdx.z * a.kslice : 0, k1 = a.kslice ? k0 + a.kslice : K;
    if (a.kslice)
        a.outf += (long long)blockIdx.z * a.out_slice;
    load_raw(k0);
    for (int kb = k0; kb < k1; kb += DSV4C_BK) {
        __syncthreads(); /* the previous block's fragments are read */
        {
            uint32_t pa[8];
            if (arow < 0) {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    pa[i] = 0u;
            } else if (AQ) {
                const uint32_t w4[4] = {ra0.x, ra0.y, ra0.z, ra0.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    uint32_t b0 = bf16_bits_exact(e4m3f(w4[i] & 0xFFu)), b1 = bf16_bits_exact(e4m3f((w4[i] >> 8) & 0xFFu));
                    uint32_t b2 = bf16_bits_exact(e4m3f((w4[i] >> 16) & 0xFFu)), b3 = bf16_bits_exact(e4m3f(w4[i] >> 24));
                    pa[2 * i] = b0 | (b1 << 16);
                    pa[2 * i + 1] = b2 | (b3 << 16);
                }
            } else {
                pa[0] = ra0.x, pa[1] = ra0.y, pa[2] = ra0.z, pa[3] = ra0.w;
                pa[4] = ra1.x, pa[5] = ra1.y, pa[6] = ra1.z, pa[7] = ra1.w;
            }
            uint4 *da = (uint4 *)&sA[lrow][lhalf * 16];
            da[0] = make_uint4(pa[0], pa[1], pa[2], pa[3]);
            da[1] = make_uint4(pa[4], pa[5], pa[6], pa[7]);
        }
        if (wload) {
            uint32_t pw[8];
            if (!wrow) {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    pw[i] = 0u;
            } else if (FMT == WF_FP4) {
                float sc = ue8m0f(rsc);
                const uint32_t w2[2] = {rw0.x, rw0.y};
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        uint32_t byte = (w2[i] >> (8 * b)) & 0xFFu;
                        uint32_t lo = bf16_bits_exact(__fmul_rn(e2m1f(byte & 0xFu), sc));
                        uint32_t hi = bf16_bits_exact(__fmul_rn(e2m1f(byte >> 4), sc));
                        pw[4 * i + b] = lo | (hi << 16);
                    }
            } else if (FMT == WF_FP8) {
                const uint32_t w4[4] = {rw0.x, rw0.y, rw0.z, rw0.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    uint32_t b0 = bf16_bits_exact(e4m3f(w4[i] & 0xFFu)), b1 = bf16_bits_exact(e4m3f((w4[i] >> 8) & 0xFFu));
                    uint32_t b2 = bf16_bits_exact(e4m3f((w4[i] >> 16) & 0xFFu)), b3 = bf16_bits_exact(e4m3f(w4[i] >> 24));
                    pw[2 * i] = b0 | (b1 << 16);
                    pw[2 * i + 1] = b2 | (b3 << 16);
                }
            } else {
                pw[0] = rw0.x, pw[1] = rw0.y, pw[2] = rw0.z, pw[3] = rw0.w;
                pw[4] = rw1.x, pw[5] = rw1.y, pw[6] = rw1.z, pw[7] = rw1.w;
            }
            uint4 *dw = (uint4 *)&sW[lrow][lhalf * 16];
            dw[0] = make_uint4(pw[0], pw[1], pw[2], pw[3]);
            dw[1] = make_uint4(pw[4], pw[5], pw[6], pw[7]);
        }
        __syncthreads();
        if (kb + DSV4C_BK < k1)
            load_raw(kb + DSV4C_BK); /* in flight during the mma below */
#pragma unroll
        for (int ks = 0; ks < DSV4C_BK; ks += 16) {
            uint32_t af[2][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                int r = wr + mi * 16 + gid;
                af[mi][0] = *(const uint32_t *)&sA[r][ks + 2 * tig];
                af[mi][1] = *(const uint32_t *)&sA[r + 8][ks + 2 * tig];
                af[mi][2] = *(const uint32_t *)&sA[r][ks + 2 * tig + 8];
                af[mi][3] = *(const uint32_t *)&sA[r + 8][ks + 2 * tig + 8];
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                int cidx = wc + ni * 8 + gid;
                bfr[ni][0] = *(const uint32_t *)&sW[cidx][ks + 2 * tig];
                bfr[ni][1] = *(const uint32_t *)&sW[cidx][ks + 2 * tig + 8];
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    mma16816(gacc[mi][ni], af[mi], bfr[ni]);
        }
        if (!scaled) {
            /* bf16 operands: the tensor cores' fp32 accumulation does not round to nearest at
               every add, so a K of 4096 summed in one MMA chain drifts enough to flip the bf16
               rounding of g and u for a few elements per thousand (a full v4-flash bf16 layer:
               bf16 ULP p99 2 against the reference's sums). Each K block of 32 is summed on the
               tensor cores and added to the running sum in IEEE fp32. */
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        acc[mi][ni][q] = __fadd_rn(acc[mi][ni][q], gacc[mi][ni][q]);
                        gacc[mi][ni][q] = 0.0f;
                    }
        } else if ((kb + DSV4C_BK) % 128 == 0 || kb + DSV4C_BK >= k1) {
            const int gk = kb / 128;
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    int rl = wr + mi * 16 + gid + half * 8;
                    int ar = s_arow[rl];
                    float sa = (AQ && ar >= 0) ? a.As[(long long)ar * ngk + gk] : 1.0f;
#pragma unroll
                    for (int ni = 0; ni < 4; ni++)
#pragma unroll
                        for (int q = 0; q < 2; q++) {
                            int col = n0 + wc + ni * 8 + 2 * tig + q;
                            float sw = 1.0f;
                            if (FMT == WF_FP8 && col < N) {
                                int which = col >= a.W.n_split;
                                int rrw = col - which * a.W.n_split;
                                const uint8_t *sp = a.W.s[which] + (long long)g.e * a.W.s_stride;
                                long long si = (long long)(rrw / 128) * ngk + gk;
                                sw = a.W.sfp32 ? ((const float *)sp)[si] : ue8m0f(sp[si]);
                            }
                            float &gv = gacc[mi][ni][half * 2 + q];
                            acc[mi][ni][half * 2 + q] = fmaf(gv, __fmul_rn(sa, sw), acc[mi][ni][half * 2 + q]);
                            gv = 0.0f;
                        }
                }
        }
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int rl = wr + mi * 16 + gid + half * 8;
            int j = m0 + rl;
            if (j >= g.n)
                continue;
            long long orow = g.orow0 + j;
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    int col = n0 + wc + ni * 8 + 2 * tig + q;
                    if (col < N)
                        store_out(a, orow, col, acc[mi][ni][half * 2 + q]);
                }
        }
}

/* ---------------- SwiGLU clamp + router weight + quantization of h ---------------- */

__global__ void k_swiglu(SwigluArgs a)
{
    const int q = blockIdx.x;
    int row;
    float w = 1.0f;
    if (a.shared) {
        if (q >= *a.ntok)
            return;
        row = q;
    } else {
        if (q >= a.meta[2])
            return;
        row = a.slot_row[q];
        w = a.slot_w[q];
    }
    const int I = a.I, ng = (I + 127) / 128;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const uint16_t *gr = a.GU + (long long)row * 2 * I, *ur = gr + I;
    const bool mulw = !a.shared && a.before;
    const bool clamp = a.clamp && a.L > 0.0f;
    unsigned long long gc = 0, uc = 0;
    for (int gq = warp; gq < ng; gq += nw) {
        float v[4];
        bool ok[4];
        for (int i = 0; i < 4; i++) {
            int k = gq * 128 + lane * 4 + i;
            ok[i] = k < I;
            v[i] = 0.0f;
            if (ok[i]) {
                float gv = bf16f(gr[k]), uv = bf16f(ur[k]);
                if (clamp) {
                    if (gv > a.L) {
                        gv = a.L;
                        gc++;
                    }
                    if (uv > a.L || uv < -a.L) {
                        uv = uv > a.L ? a.L : -a.L;
                        uc++;
                    }
                }
                float h = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), uv);
                if (mulw)
                    h = __fmul_rn(h, w);
                v[i] = rbf16(h);
            }
        }
        if (a.hq) {
            uint8_t c[4];
            float s = quant_group4(v, ok, a.qmode, c);
            for (int i = 0; i < 4; i++) {
                int k = gq * 128 + lane * 4 + i;
                if (ok[i])
                    a.hq[(long long)row * I + k] = c[i];
            }
            if (lane == 0)
                a.hs[(long long)row * ng + gq] = s;
        } else {
            for (int i = 0; i < 4; i++) {
                int k = gq * 128 + lane * 4 + i;
                if (ok[i])
                    a.hb[(long long)row * I + k] = f2bf16(v[i]);
            }
        }
    }
    gc = warp_sum_u64(gc);
    uc = warp_sum_u64(uc);
    if (lane == 0 && (gc || uc)) {
        atomicAdd(&a.stats[a.shared ? ST_SG : ST_RG], gc);
        atomicAdd(&a.stats[a.shared ? ST_SU : ST_RU], uc);
    }
}

/* ---------------- combine: fp32 per token in ascending expert id, then the shared expert ---------------- */

/*
 * grid (Tc, ceil(H / (8 * blockDim.x))): each thread sums 8 columns (16-byte loads of the
 * experts' bf16 rows) over the token's kept slots in ascending expert id (equal ids in slot
 * order), in fp32, then adds the shared expert's bf16 row and rounds to bf16 (H % 8 == 0).
 */
__global__ void k_combine(CombineArgs a)
{
    const int t = blockIdx.x;
    if (t >= *a.ntok)
        return;
    extern __shared__ int srt[]; /* [K] rows, [K] slot index in ascending expert order, [K] ids, [K] rows by slot */
    __shared__ int s_n;
    const int K = a.K, E = a.E, H = a.H;
    int *rows = srt, *slot = srt + K, *sid = srt + 2 * K, *srow = srt + 3 * K;
    for (int k = threadIdx.x; k < K; k += blockDim.x) { /* one parallel load of the token's slots */
        sid[k] = a.ids[(long long)t * K + k];
        srow[k] = sid[k] < E ? a.rowmap[(long long)t * K + k] : 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0;
        for (int k = 0; k < K; k++) {
            int e = sid[k];
            if (e >= E)
                continue;
            int pos = n++;
            /* ascending expert id; equal ids keep slot order */
            while (pos > 0 && sid[slot[pos - 1]] > e) {
                rows[pos] = rows[pos - 1];
                slot[pos] = slot[pos - 1];
                pos--;
            }
            rows[pos] = srow[k];
            slot[pos] = k;
        }
        s_n = n;
    }
    __syncthreads();
    const int n = s_n;
    const int col = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (col >= H)
        return;
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        y[i] = 0.0f;
    for (int j = 0; j < n; j++) {
        const uint4 v = __ldg((const uint4 *)(a.O + (long long)rows[j] * H + col));
        const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
        const float wj = a.after ? a.w[(long long)t * K + slot[j]] : 1.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float o = bf16f((uint16_t)(w4[i >> 1] >> (16 * (i & 1))));
            y[i] = a.after ? __fadd_rn(y[i], __fmul_rn(wj, o)) : __fadd_rn(y[i], o);
        }
    }
    if (a.Osh) {
        const uint4 v = __ldg((const uint4 *)(a.Osh + (long long)t * H + col));
        const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 8; i++)
            y[i] = __fadd_rn(y[i], bf16f((uint16_t)(w4[i >> 1] >> (16 * (i & 1)))));
    }
    uint32_t o4[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        o4[i] = (uint32_t)f2bf16(y[2 * i]) | ((uint32_t)f2bf16(y[2 * i + 1]) << 16);
    *(uint4 *)(a.y + (long long)t * H + col) = make_uint4(o4[0], o4[1], o4[2], o4[3]);
}

} // namespace dsv4cuda

#endif
