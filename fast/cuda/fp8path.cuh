/*
 * The `gemm = fp8` mode's own kernels around the grouped FP8 GEMM (gemm_fp8.h), included by
 * cuda.cu after the other kernel headers (kernels.cuh ... mma_group.cuh, whose k_quant it
 * follows):
 *
 *   k_gather8  before gate/up: each large group's activation codes into contiguous rows (the
 *              GEMM reads a group as one [M, H] matrix) and their scales in the GEMM's M-major
 *              layout; the shared expert reads x's codes in place and needs only the scales.
 *   k_quant8   after gate/up, instead of k_quant: for rows of a large fp8 group, the SwiGLU
 *              epilogue of SPEC.md section 4 on the GEMM's bf16 g and u (clamp counted, silu,
 *              router weight before w2, bf16 h) and the e4m3 quantization of h, whose scales
 *              are written twice (K-major as the other kernels read them, M-major for the down
 *              GEMM); every other row is k_quant's work, unchanged.
 *
 * "Large fp8 group": more than FM_MID_MAX rows (the decode and 32-row kernels keep the smaller
 * ones) and an expert whose weights converted exactly (ok[e], repack at creation).
 */
#ifndef DSV4MOE_CUDA_FP8PATH_CUH
#define DSV4MOE_CUDA_FP8PATH_CUH

namespace dsv4cuda {

/* Where a block's row sits: its group's rows M (0 when the row is not in a large fp8 group),
   the group's first row r0 and the row's index in the group. */
struct Row8 {
    long long row;
    int m, idx, slot; /* slot: the kept slot (-1 for the shared expert's rows) */
    long long r0;
};

struct Sel8 {
    const int32_t *slot_row, *slot_tok, *slot_e;
    const int *cnt, *pad_off, *meta, *ntok;
    const uint8_t *ok; /* [E + 1] */
    long long sh_row0;
    int E, slots, has_shared, min_rows;
};

/* Block b of a grid of slots + Tc blocks: false when it has no row. */
__device__ __forceinline__ bool row8(const Sel8 &a, int b, Row8 &r)
{
    r.m = 0, r.idx = 0, r.r0 = 0;
    if (b < a.slots) {
        if (b >= a.meta[2])
            return false;
        r.slot = b;
        r.row = a.slot_row[b];
        /* the expert of kept slot b, written by the placement (one load, where a search over
           slot_off was eight dependent ones per row) */
        const int lo = a.slot_e[b];
        const int c = a.cnt[lo];
        if (a.ok[lo] && c > a.min_rows) {
            r.m = c;
            r.r0 = a.pad_off[lo];
            r.idx = (int)(r.row - r.r0);
        }
        return true;
    }
    const int t = b - a.slots, nt = *a.ntok;
    if (!a.has_shared || t >= nt)
        return false;
    r.slot = -1;
    r.row = a.sh_row0 + t;
    if (a.ok[a.E] && nt > a.min_rows) {
        r.m = nt;
        r.r0 = a.sh_row0;
        r.idx = t;
    }
    return true;
}

struct Gather8Args {
    Sel8 sel;
    const uint8_t *xq; /* x codes [Tc, H] */
    const float *xs;   /* [Tc, H / 128] */
    uint8_t *xp;       /* [rows, H]: routed rows of large fp8 groups */
    float *xs8;        /* M-major scales, group base r0 H / 128 */
    int H;
};

__global__ void k_gather8(Gather8Args a)
{
    pdl_enter();
    Row8 r;
    if (!row8(a.sel, blockIdx.x, r) || !r.m)
        return;
    const int tok = r.slot >= 0 ? a.sel.slot_tok[r.slot] : r.idx;
    const int ng = a.H >> 7;
    if (r.slot >= 0) {
        const uint4 *src = (const uint4 *)(a.xq + (long long)tok * a.H);
        uint4 *dst = (uint4 *)(a.xp + r.row * a.H);
        for (int i = threadIdx.x; i < (a.H >> 4); i += blockDim.x)
            dst[i] = src[i];
    }
    float *s8 = a.xs8 + r.r0 * ng + r.idx;
    for (int kb = threadIdx.x; kb < ng; kb += blockDim.x)
        s8[(long long)kb * r.m] = a.xs[(long long)tok * ng + kb];
}

struct Quant8Args {
    Sel8 sel;
    uint16_t *h;          /* bf16 h [hrows, I] of the other kernels' rows */
    const uint16_t *gu8;  /* the fp8 GEMM's bf16 [g | u] [hrows, 2 I] */
    uint8_t *q;           /* codes [hrows, I] */
    float *s, *s8;        /* scales K-major [hrows, I / 128]; M-major, group base r0 I / 128 */
    const float *slot_w;
    unsigned long long *stats;
    int I, qmode, f16_codes, before, clamp_r, clamp_s;
    float L;
};

/* The block's four clamp counts (routed g, routed u, shared g, shared u; each thread's own) into
   the statistics: one atomic per counter and block. */
__device__ __forceinline__ void flush_clamp_counts(const unsigned long long cnt[4], unsigned long long *stats)
{
    const int lane = threadIdx.x & 31;
    __shared__ unsigned long long bc[4];
    if (threadIdx.x < 4)
        bc[threadIdx.x] = 0;
    __syncthreads();
    for (int i = 0; i < 4; i++) {
        const unsigned long long v = warp_sum_u64(cnt[i]);
        if (lane == 0 && v)
            atomicAdd(&bc[i], v);
    }
    __syncthreads();
    static_assert(ST_RU == ST_RG + 1 && ST_SG == ST_RG + 2 && ST_SU == ST_RG + 3, "counter order");
    if (threadIdx.x < 4 && bc[threadIdx.x])
        atomicAdd(&stats[ST_RG + threadIdx.x], bc[threadIdx.x]);
}

/* Rows by warps: a lane holds 8 consecutive values (16-byte loads of g and u), a half warp one
   128-group, and a warp loads four such 256-wide chunks before it computes any (8 KiB of its row in
   flight); a grid-stride loop (K8_GRID blocks at most) keeps the clamp counters in registers over
   all of a warp's rows and flushes them once per block. Measured on the H200 (2026-12-03, v4-flash,
   T = 16384, ncu): a block of 16 warps per row, one 128-group per warp, took 1.35 ms, this 1.04
   (the layer 10.82 -> 10.55 ms in one call); both issue-bound (SM 70 %, DRAM 19-24 %): the
   SwiGLU's division and exp and the e4m3 encoding per element, not the 1.2 GB it moves. */
constexpr unsigned K8_GRID = 2048;
constexpr int K8_WARPS = 8, K8_BATCH = 4;

/* SKIP (params direct=q64): rows of routed groups of more than FM_MID_MAX rows are left alone:
   k_tile8's gate/up quantized them in its epilogue. */
template <bool SKIP = false>
__global__ void __launch_bounds__(K8_WARPS * 32) k_quant8(Quant8Args a, int nrows)
{
    pdl_enter();
    const int lane = threadIdx.x & 31, ng = a.I >> 7, nch = (a.I + 255) >> 8;
    const int half = lane >> 4, hl = lane & 15;
    unsigned long long cnt[4] = {0, 0, 0, 0};
    for (int b = blockIdx.x * K8_WARPS + (threadIdx.x >> 5); b < nrows; b += gridDim.x * K8_WARPS) {
        Row8 r;
        if (!row8(a.sel, b, r))
            continue;
        if constexpr (SKIP) {
            if (!r.m && r.slot >= 0 && a.sel.cnt[a.sel.slot_e[r.slot]] > FM_MID_MAX)
                continue;
        }
        const bool shared = r.slot < 0;
        const bool clamp = (shared ? a.clamp_s : a.clamp_r) && a.L > 0.0f;
        const float w = !shared && a.before ? a.slot_w[r.slot] : 1.0f;
        uint16_t *hr = a.h + r.row * a.I;
        const uint16_t *gr = a.gu8 + r.row * 2 * a.I, *ur = gr + a.I;
        unsigned gc = 0, uc = 0;
        for (int c0 = 0; c0 < nch; c0 += K8_BATCH) {
            uint4 g4[K8_BATCH], u4[K8_BATCH];
#pragma unroll
            for (int j = 0; j < K8_BATCH; j++) {
                const int k0 = (c0 + j) * 256 + lane * 8;
                g4[j] = u4[j] = make_uint4(0, 0, 0, 0);
                if (c0 + j < nch && k0 < a.I) {
                    if (r.m) {
                        g4[j] = *(const uint4 *)(gr + k0);
                        u4[j] = *(const uint4 *)(ur + k0);
                    } else {
                        g4[j] = *(const uint4 *)(hr + k0);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < K8_BATCH; j++) {
                const int gq = (c0 + j) * 2 + half, k0 = gq * 128 + hl * 8;
                if (c0 + j >= nch) /* the whole warp: c0 + j is the same in every lane */
                    break;
                const bool in = gq < ng;
                float v[8];
                bool ok[8];
                uint8_t c[8];
                const uint32_t gw[4] = {g4[j].x, g4[j].y, g4[j].z, g4[j].w};
                const uint32_t uw[4] = {u4[j].x, u4[j].y, u4[j].z, u4[j].w};
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    ok[i] = in;
                    const float gv = in ? bf16f((uint16_t)(gw[i >> 1] >> (16 * (i & 1)))) : 0.0f;
                    if (r.m && in) {
                        /* SPEC.md section 4 on bf16 g, u: clamp, silu in fp32, router weight before w2, bf16 h */
                        float hv = swiglu_h(gv, bf16f((uint16_t)(uw[i >> 1] >> (16 * (i & 1)))), clamp, a.L, gc, uc);
                        if (w != 1.0f)
                            hv = __fmul_rn(hv, w);
                        v[i] = rbf16(hv);
                    } else {
                        v[i] = gv; /* the other kernels' bf16 h (or 0 beyond the row) */
                    }
                }
                const float s = quant_groupn<8, 16>(v, ok, a.qmode, c);
                if (!in)
                    continue;
                uint2 q;
                q.x = (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) | ((uint32_t)c[3] << 24);
                q.y = (uint32_t)c[4] | ((uint32_t)c[5] << 8) | ((uint32_t)c[6] << 16) | ((uint32_t)c[7] << 24);
                *(uint2 *)(a.q + r.row * a.I + k0) = q;
                if (!r.m && a.f16_codes) {
                    store_f16_codes(hr, k0, c);
                    store_f16_codes(hr, k0 + 4, c + 4);
                }
                if (hl == 0) {
                    a.s[r.row * ng + gq] = s;
                    if (r.m)
                        a.s8[r.r0 * ng + (long long)gq * r.m + r.idx] = s;
                }
            }
        }
        cnt[shared ? 2 : 0] += gc;
        cnt[shared ? 3 : 1] += uc;
    }
    flush_clamp_counts(cnt, a.stats);
}

} // namespace dsv4cuda

#endif
