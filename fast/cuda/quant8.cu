/*
 * k_quant8: the SwiGLU and the quantization of h after the gemm fp8 mode's gate/up (quant8.cuh).
 */
#include "fast/cuda/quant8.cuh"

#include <algorithm>

#include "fast/cuda/group_parts.cuh"

namespace dsv4cuda {

namespace {

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

/* quant_groupn<8, 16> (kernels.cuh) for a lane whose eight values are all in the 128-group or all
   out of it (valid), with the same amax, scale and codes, for params quant8=lean (the default):
   the codes come packed (value i's in byte i % 4 of q's word i / 4), and the sign of a NaN code
   (quant_groupn's last loop) is set only in a lane that holds an Inf or a NaN, the only values
   whose code can be 0x7F (a NaN in; Inf / Inf against an fp32 scale of Inf). */
__device__ __forceinline__ float quant8_lean(const float v[8], bool valid, int mode, uint2 &q)
{
    uint32_t mb = 0;
    bool special = false;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t a = __float_as_uint(v[i]) & 0x7FFFFFFFu;
        special |= a >= 0x7F800000u;
        a = (!valid || a > 0x7F800000u) ? 0u : a;
        mb = a > mb ? a : mb;
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
        const uint32_t w = __shfl_xor_sync(0xFFFFFFFFu, mb, o);
        mb = w > mb ? w : mb;
    }
    float amax = __uint_as_float(mb);
    amax = amax < 1e-4f ? 1e-4f : amax;
    float s;
    uint32_t c2[4];
    if (mode == 1) {
        const uint32_t b = ue8m0_scale_448(amax);
        s = dsv4_ue8m0_decode(b);
        const float inv = dsv4_ue8m0_inverse(b);
#pragma unroll
        for (int p = 0; p < 4; p++)
            c2[p] = e4m3x2_encode(__fmul_rn(v[2 * p], inv), __fmul_rn(v[2 * p + 1], inv));
    } else {
        s = __fdiv_rn(amax, 448.0f);
#pragma unroll
        for (int p = 0; p < 4; p++)
            c2[p] = e4m3x2_encode(__fdiv_rn(v[2 * p], s), __fdiv_rn(v[2 * p + 1], s));
    }
    if (special) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int p = i >> 1, sh = 8 * (i & 1);
            if (((c2[p] >> sh) & 0x7Fu) == 0x7Fu) {
                const uint32_t sign = (__float_as_uint(v[i]) >> 24) & 0x80u;
                c2[p] = (c2[p] & ~(0xFFu << sh)) | ((sign | 0x7Fu) << sh);
            }
        }
    }
    q.x = c2[0] | (c2[1] << 16);
    q.y = c2[2] | (c2[3] << 16);
    return s;
}

/* SKIP (params direct=q64): rows of routed groups of more than FM_MID_MAX rows are left alone:
   k_tile8's gate/up quantized them in its epilogue. LEAN (params quant8=lean, the default;
   quant8=std takes the former instructions): the same values by fewer instructions a value: h's
   bf16 rounding by the hardware conversion (f2bf16_hw) and the codes by quant8_lean. */
template <bool SKIP, bool LEAN>
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
                uint8_t c[8];
                const uint32_t gw[4] = {g4[j].x, g4[j].y, g4[j].z, g4[j].w};
                const uint32_t uw[4] = {u4[j].x, u4[j].y, u4[j].z, u4[j].w};
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float gv = in ? bf16f((uint16_t)(gw[i >> 1] >> (16 * (i & 1)))) : 0.0f;
                    if (r.m && in) {
                        /* SPEC.md section 4 on bf16 g, u: clamp, silu in fp32, router weight before w2, bf16 h */
                        float hv = swiglu_h(gv, bf16f((uint16_t)(uw[i >> 1] >> (16 * (i & 1)))), clamp, a.L, gc, uc);
                        if (w != 1.0f)
                            hv = __fmul_rn(hv, w);
                        v[i] = LEAN ? bf16f(f2bf16_hw(hv)) : rbf16(hv);
                    } else {
                        v[i] = gv; /* the other kernels' bf16 h (or 0 beyond the row) */
                    }
                }
                uint2 q;
                float s;
                if constexpr (LEAN) {
                    s = quant8_lean(v, in, a.qmode, q);
                    if (!in)
                        continue;
                    if (!r.m && a.f16_codes)
                        for (int i = 0; i < 8; i++)
                            c[i] = (uint8_t)((i < 4 ? q.x : q.y) >> (8 * (i & 3)));
                } else {
                    bool ok[8];
                    for (int i = 0; i < 8; i++)
                        ok[i] = in;
                    s = quant_groupn<8, 16>(v, ok, a.qmode, c);
                    if (!in)
                        continue;
                    q.x = (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) | ((uint32_t)c[3] << 24);
                    q.y = (uint32_t)c[4] | ((uint32_t)c[5] << 8) | ((uint32_t)c[6] << 16) | ((uint32_t)c[7] << 24);
                }
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

} // namespace

cudaError_t launch_quant8(const Quant8Args &a, unsigned rows, bool skip_direct, bool lean, cudaStream_t s, bool pdl)
{
    if (!rows)
        return cudaSuccess;
    const dim3 grid(std::min((rows + K8_WARPS - 1) / K8_WARPS, K8_GRID));
    const unsigned th = K8_WARPS * 32;
    const int n = (int)rows;
    if (lean)
        return skip_direct ? launch_kernel(k_quant8<true, true>, grid, th, 0, s, pdl, a, n)
                           : launch_kernel(k_quant8<false, true>, grid, th, 0, s, pdl, a, n);
    return skip_direct ? launch_kernel(k_quant8<true, false>, grid, th, 0, s, pdl, a, n)
                       : launch_kernel(k_quant8<false, false>, grid, th, 0, s, pdl, a, n);
}

} // namespace dsv4cuda
