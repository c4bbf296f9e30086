/*
 * The device code of the exact path's grouped GEMMs (fast/cuda): k_gemv (gemv.cu: groups of up to
 * DSV4C_SMALL_MAX rows, activations dequantized to fp32 in shared memory) and k_tiles (tiles.cu:
 * larger groups, DSV4C_BM x DSV4C_BN tiles, operands converted exactly to bf16, mma.sync m16n8k16;
 * also the router logits on both paths): the group lookup, the weight decoders, the output
 * store. Inline functions and types only.
 */
#ifndef DSV4MOE_FAST_CUDA_EXACT_GEMM_CUH
#define DSV4MOE_FAST_CUDA_EXACT_GEMM_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

/* A kernel of the exact path (k_gemv, k_tiles): one template per regime, instantiated for each
   weight format and activation quantization. */
typedef void (*exact_kernel)(GemmArgs);

/* The variant for weights fmt (WF_BF16, WF_FP8 or WF_FP4) and activations quantized (aq 1) or not,
   from a regime's six in that order. */
inline exact_kernel exact_variant(const exact_kernel (&k)[6], int fmt, int aq)
{
    const int i = fmt * 2 + aq;
    return k[i < 5 ? i : 5];
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
 * 2^(s-127) are built directly in the exponent (exact, the same value as e2m1f(n) * dsv4_ue8m0_decode(s))
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
            decode16<WF_FP4>(q, dsv4_ue8m0_decode(sraw), v);
        }
    } else if (FMT == WF_FP8) {
        decode16<WF_FP8>(q, sfp32 ? __uint_as_float(sraw) : dsv4_ue8m0_decode(sraw), v);
    } else {
        decode16<WF_BF16>(q, 1.0f, v);
    }
}


/* k_tiles' staging of one thread's 16 K elements (two uint4 of shared memory) as bf16 pairs, for
   the activations and the weights alike: zeros, 16 e4m3 codes widened exactly, or 16 bf16 as is. */
__device__ __forceinline__ void bf16x16_zero(uint32_t p[8])
{
#pragma unroll
    for (int i = 0; i < 8; i++)
        p[i] = 0u;
}

__device__ __forceinline__ void bf16x16_e4m3(const uint4 &r, uint32_t p[8])
{
    const uint32_t w4[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t b0 = bf16_bits_exact(e4m3f(w4[i] & 0xFFu)), b1 = bf16_bits_exact(e4m3f((w4[i] >> 8) & 0xFFu));
        uint32_t b2 = bf16_bits_exact(e4m3f((w4[i] >> 16) & 0xFFu)), b3 = bf16_bits_exact(e4m3f(w4[i] >> 24));
        p[2 * i] = b0 | (b1 << 16);
        p[2 * i + 1] = b2 | (b3 << 16);
    }
}

__device__ __forceinline__ void bf16x16_raw(const uint4 &r0, const uint4 &r1, uint32_t p[8])
{
    p[0] = r0.x, p[1] = r0.y, p[2] = r0.z, p[3] = r0.w;
    p[4] = r1.x, p[5] = r1.y, p[6] = r1.z, p[7] = r1.w;
}

__device__ __forceinline__ void bf16x16_put(uint4 *d, const uint32_t p[8])
{
    d[0] = make_uint4(p[0], p[1], p[2], p[3]);
    d[1] = make_uint4(p[4], p[5], p[6], p[7]);
}


} // namespace dsv4cuda

#endif
