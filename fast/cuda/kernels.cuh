/*
 * The CUDA backend's device code, common part (fast/cuda): the format codes and device counters,
 * the tile constants, number formats bit-identical to core/formats.c (and the activation
 * quantization and f16-code helpers both paths use), and the kernel argument structs. The
 * kernels are in the headers cuda.cu includes after this one, in this order: router.cuh (k_router,
 * k_count, k_place), swiglu_combine.cuh (k_swiglu, k_combine), then the fp8 path's
 * mma_group.cuh; the exact path's k_gemv and k_tiles, and the fp8 path's k_dec, k_tile, k_tileh,
 * k_logits_small, k_router_count, k_route_small, k_dec_mix, k_gather8 and k_quant8, are
 * translation units of their own (gemv.cu, tiles.cu, dec.cu, tile.cu, tileh.cu, logits_small.cu,
 * router_count.cu, route_small.cu, dec_mix.cu, gather8.cu, quant8.cu, each with a launcher
 * header). Inline functions and types only, so every unit may include it (the kernels' device
 * code shared between units is in the *_parts.cuh headers and exact_gemm.cuh, likewise).
 * docs/cuda.md describes the design.
 */
#ifndef DSV4MOE_FAST_CUDA_KERNELS_CUH
#define DSV4MOE_FAST_CUDA_KERNELS_CUH

#include <stdint.h>
#include <cuda_runtime.h>

#include "core/bits.h"

namespace dsv4cuda {

enum { WF_BF16 = 0, WF_FP8 = 1, WF_FP4 = 2 };

/* Device counters, zeroed per forward, read back with the outputs. */
enum { ST_NONFINITE = 0, ST_RG, ST_RU, ST_SG, ST_SU, ST_ACTIVE, ST_EMPTY, ST_BADID, ST_BADIN, ST_BADIN_AT, ST_TICKET, ST_N };
/* ST_BADIN: hash-layer input ids (or their tid2eid entries) out of range, found on the device (the
   device-pointer forward; the host forward checks them before anything runs). The token is routed
   to experts 0 .. K-1 instead, and the forward returns an error. ST_BADIN_AT: 0xFFFFFFFF minus the
   smallest such token index of the chunk (atomicMax), so the error names the first one. ST_TICKET:
   k_route_small's block ticket (route_small.cu), zeroed with the others before the chunk and back
   to 0 when that launch ends, so it reads 0 wherever the counters are summed. */

#define DSV4C_SMALL_MAX 8 /* groups up to this many rows take the GEMV path */
#define DSV4C_BM 128 /* tensor-core tile: 128 rows (of one group) x 64 columns, K blocks of 32 */
#define DSV4C_BN 64
#define DSV4C_BK 32
#define DSV4C_TILE_THREADS 256
#define DSV4C_GEMV_THREADS 256
#define DSV4C_GEMV_COLS 32 /* output columns per GEMV block (4 per warp) */

/* ---------------- programmatic dependent launch (sm_90) ---------------- */

/*
 * The first statement of every kernel the fp8 path may launch with the programmatic-dependent-
 * launch attribute (launch_pdl, pipeline.cuh). Such a kernel can be scheduled while its
 * predecessor on the stream still runs, which hides the launch gap between the short kernels of
 * a decode step; griddepcontrol.wait then holds it until every predecessor grid has completed and
 * its writes are visible. The wait comes first, in every block and before any early return: a
 * kernel that completed without waiting would let its own dependents run ahead of its
 * predecessors. launch_dependents then lets the next PDL kernel be scheduled as soon as every
 * block of this one has started (never earlier, so the next one's waiting blocks never take a
 * multiprocessor a block of this one still needs). Both are no-ops in a kernel launched plainly.
 * Only work that reads nothing an earlier kernel writes (a prefetch of weights) may precede it,
 * or work that orders its reads itself (dec_early.cuh polls the router's ticket with acquire loads).
 */
__device__ __forceinline__ void pdl_enter()
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/*
 * Launches k on stream s, with the programmatic-dependent-launch attribute when pdl: the kernel may
 * be scheduled while the one before it on s runs, and waits in pdl_enter(), which k must call
 * first. Returns the launch's error (cudaLaunchKernelEx's; <<< >>>'s from cudaPeekAtLastError).
 */
template <typename... P, typename... A>
inline cudaError_t launch_kernel(void (*k)(P...), dim3 grid, unsigned threads, size_t smem, cudaStream_t s, bool pdl,
                                 A... args)
{
    if (!pdl) {
        k<<<grid, threads, smem, s>>>(args...);
        return cudaPeekAtLastError();
    }
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = dim3(threads), cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = at, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, k, args...);
}

/* ---------------- formats (the integer algorithms of core/formats.c) ---------------- */

__device__ __forceinline__ float bf16f(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ __forceinline__ uint16_t f2bf16(float x) { return dsv4_bf16_bits(x); }

__device__ __forceinline__ float rbf16(float x) { return bf16f(f2bf16(x)); }

/* dsv4_bf16_bits by the hardware conversion (cvt.rn.bf16.f32: to nearest even, subnormals kept),
   a NaN as the host writes it (its top bits, quiet): the same bits for all 2^32 inputs (test_cuda's
   bf16_hardware_round compares the two on the device). One conversion and a select where the
   integer algorithm is five operations and a select. */
__device__ __forceinline__ uint16_t f2bf16_hw(float x)
{
    uint16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    const uint32_t u = __float_as_uint(x);
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)((u >> 16) | 0x0040u) : r;
}

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

/* Two values to e4m3 codes by the hardware conversion (cvt.rn.satfinite.e4m3x2.f32: ties to even,
   beyond 448 saturated), lo in bits 0-7: the codes of core/bits.h's dsv4_e4m3_bits (the host's
   algorithm) for every input but NaN, whose sign the callers set (tests/cuda/e4m3_hw.cu compares
   the two over all 2^32 inputs on the device). One instruction per pair where the integer
   algorithm is about 15 operations per value (measured: no difference in k_quant8's time, which
   the SwiGLU's division and exp bound). */
__device__ __forceinline__ uint32_t e4m3x2_encode(float lo, float hi)
{
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float e2m1f(uint32_t n)
{
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[n & 7u];
    return (n & 8u) ? -v : v;
}

/* ue8m0 decode, its reciprocal and the scale's exponent: core/bits.h's, the host's own copy
   (dsv4_ue8m0_decode, dsv4_ue8m0_inverse, dsv4_ue8m0_exponent). */

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
    return dsv4_ue8m0_exponent(ua, ul);
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/* SPEC.md section 4, steps 3-4, on bf16 g and u: the SwiGLU clamp when `clamp` (the upper side of
   g, both sides of u; each clamped value counted in gc / uc), then h = silu(g) * u in fp32. The one
   copy every executor's epilogue uses (k_swiglu, the fragment path's fepi, k_quant8). */
template <typename C>
__device__ __forceinline__ float swiglu_h(float gv, float uv, bool clamp, float L, C &gc, C &uc)
{
    if (clamp) {
        if (gv > L) {
            gv = L;
            gc++;
        }
        if (uv > L || uv < -L) {
            uv = uv > L ? L : -L;
            uc++;
        }
    }
    return __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), uv);
}

/*
 * Quantizes one 128-group held NV values per lane over W lanes (W a power of two <= 32, the
 * group in lanes aligned to W; values beyond the group's length pass valid = 0): amax over the
 * finite-or-Inf values (NaN ignored, as core/formats.c), scale by `mode` (1 ue8m0, 2 fp32),
 * codes as act_store writes them. Returns the scale. The amax is a maximum, so the order of the
 * reduction does not matter: every layout gives the same codes.
 */
template <int NV, int W>
__device__ __forceinline__ float quant_groupn(const float v[NV], const bool valid[NV], int mode, uint8_t code[NV])
{
    static_assert(NV % 2 == 0, "codes are encoded in pairs");
    uint32_t mb = 0;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        uint32_t a = __float_as_uint(v[i]) & 0x7FFFFFFFu;
        a = (!valid[i] || a > 0x7F800000u) ? 0u : a;
        mb = a > mb ? a : mb;
    }
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
        const uint32_t w = __shfl_xor_sync(0xFFFFFFFFu, mb, o);
        mb = w > mb ? w : mb;
    }
    float amax = __uint_as_float(mb);
    amax = amax < 1e-4f ? 1e-4f : amax;
    float s;
    if (mode == 1) {
        uint32_t b = ue8m0_scale_448(amax);
        s = dsv4_ue8m0_decode(b);
        float inv = dsv4_ue8m0_inverse(b);
#pragma unroll
        for (int i = 0; i < NV; i += 2) {
            const uint32_t c2 = e4m3x2_encode(__fmul_rn(v[i], inv), __fmul_rn(v[i + 1], inv));
            code[i] = (uint8_t)c2, code[i + 1] = (uint8_t)(c2 >> 8);
        }
    } else {
        s = __fdiv_rn(amax, 448.0f);
#pragma unroll
        for (int i = 0; i < NV; i += 2) {
            const uint32_t c2 = e4m3x2_encode(__fdiv_rn(v[i], s), __fdiv_rn(v[i + 1], s));
            code[i] = (uint8_t)c2, code[i + 1] = (uint8_t)(c2 >> 8);
        }
    }
#pragma unroll
    for (int i = 0; i < NV; i++) {
        uint32_t sign = __float_as_uint(v[i]) & 0x80000000u;
        if ((code[i] & 0x7Fu) == 0x7Fu)
            code[i] = (uint8_t)((sign >> 24) | 0x7Fu);
    }
    return s;
}

__device__ __forceinline__ float quant_group4(const float v[4], const bool valid[4], int mode, uint8_t code[4])
{
    return quant_groupn<4, 32>(v, valid, mode, code);
}

/*
 * The f16 tile kernel (tileh.cu, k_tileh) reads activations as f16 copies of the e4m3 codes in a K
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
    int small_max;          /* > 0: chunks of at most this many live tokens have one slice, and x quantized
                               already (k_logits_small) */
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

} // namespace dsv4cuda

#endif
