/*
 * The device code of k_tile8 (tile8.cu; tile8.cuh says when it runs): the gemm fp8 mode's tile
 * groups on fp8 wgmma straight from the fragment-native weights, no e4m3 copy read. Inline
 * functions and types only; included by tile8.cu and by the device test of its conversion
 * (tests/cuda/tile8_hw.cu).
 *
 * What it computes (SPEC.md section 9, gemm = fp8): per 128-wide K block, wgmma.m64nNk32 e4m3 x
 * e4m3 with fp32 accumulators (Hopper's fp8 accumulation, as the grouped FP8 GEMM's) over four k32
 * steps, then the block's partial times (weight scale x activation scale) added in fp32: the
 * CUTLASS FP8 blockwise scheme, with the weights as the A operand in registers and the tokens as N.
 *
 * fp4 weights enter as the e4m3 codes of the per-row 1x128 conversion of
 * dsv4_fp4_to_e4m3_blocks (block_rows 1): a row's four step-scale bytes s0..s3 of a K block give
 * one scale 2^(max s - 133) and each e2m1 value v of step j the code of v 2^(sj - max s + 6), exact
 * for a spread max s - min s <= DSV4_FP4_TO_FP8_SPREAD (the creation runs this path only when
 * every routed expert's groups convert, upload.cuh's routed_convert_rows). In registers: the fragment's bytes are the e4m3
 * codes of v 2^-6 (fragment.h); two of them widen to f16x2 (exact), one f16 multiply by
 * 2^(sj - max s + 12) (an f16 normal for a spread of at most 14; the product exact, e2m1 having 2
 * significant bits), and the hardware conversion back to e4m3 (exact: the value is an e4m3 value).
 * fp8 weights (the shared expert's mid-size groups) are their codes with their 128x128 block
 * scales, as k_tileh reads them.
 */
#ifndef DSV4MOE_FAST_CUDA_MMA_TILE8_CUH
#define DSV4MOE_FAST_CUDA_MMA_TILE8_CUH

#include "fast/cuda/mma_parts.cuh"
#include "fast/cuda/wg_tile.cuh"

namespace dsv4cuda {

/* D (BN / 2 floats) (+)= A (e4m3 registers) x B (BN tokens of e4m3 codes, shared memory). */
template <int BN>
__device__ __forceinline__ void wg_mma_e4m3(float *d, const uint32_t *a, uint64_t bd, int acc)
{
    if constexpr (BN == 32) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                       "+f"(d[15])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(acc));
    } else if constexpr (BN == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,"
                     "%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                       "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                       "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(acc));
    } else {
        static_assert(BN == 128, "tokens per block: 32, 64 or 128");
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,"
                     "%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,"
                     "%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                       "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                       "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                       "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                       "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                       "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                       "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                       "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(acc));
    }
}

/* f16x2 -> two e4m3 codes (the low half in bits 0-7), ties to even, saturated: exact here. */
__device__ __forceinline__ uint32_t f16x2_to_e4m3x2(uint32_t h2)
{
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;\n" : "=h"(r) : "r"(h2));
    return r;
}

/* Four e4m3 codes (bytes of w) times the f16x2 power of two f2, as e4m3 codes. */
__device__ __forceinline__ uint32_t e4m3x4_scaled(uint32_t w, uint32_t f2)
{
    uint32_t lo, hi;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(lo) : "r"(e4m3x2_to_f16x2(w)), "r"(f2));
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(hi) : "r"(e4m3x2_to_f16x2(w >> 16)), "r"(f2));
    return f16x2_to_e4m3x2(lo) | (f16x2_to_e4m3x2(hi) << 16);
}

/* The largest of w's four bytes. */
__device__ __forceinline__ uint32_t max_byte4(uint32_t w)
{
    const uint32_t t = __vmaxu4(w, w >> 16);
    return __vmaxu4(t, t >> 8) & 0xFFu;
}

/* fp32 2^e for e in [-149, 127] (subnormal below -126). */
__device__ __forceinline__ float exp2_int(int e)
{
    return e >= -126 ? __uint_as_float((uint32_t)(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

/* f16x2 of 2^(byte c of `bytes` - m + 12): step c's factor for a row whose largest stored byte is m. */
__device__ __forceinline__ uint32_t t8_factor2(uint32_t bytes, int c, uint32_t m)
{
    const uint32_t h = (((bytes >> (8 * c)) & 0xFFu) + 27u - m) << 10;
    return h | (h << 16);
}

/*
 * One lane's A fragments of one (16-row tile, 128-wide K block) chunk as e4m3 codes (af[step][4]:
 * the register order of wgmma's A, fragment.h) and its two rows' weight scales (row gid: w0,
 * row gid + 8: w1). chunk: the tile's weight chunk; sc: its scale chunk (fp4: 64 bytes, fp8: 8).
 */
template <int FMT>
__device__ __forceinline__ void tile8_frags(const uint8_t *chunk, const uint8_t *sc, int lane, uint32_t af[4][4],
                                            float &w0, float &w1)
{
    if constexpr (FMT == WF_FP4) {
        const uint4 v0 = *(const uint4 *)(chunk + lane * 16), v1 = *(const uint4 *)(chunk + 512 + lane * 16);
        const uint2 s = *(const uint2 *)(sc + (lane >> 2) * 8); /* [gid][h][c]: .x row gid, .y row gid + 8 */
        const uint32_t m0 = max_byte4(s.x), m1 = max_byte4(s.y);
        /* the stored byte is s + 6: 2^(max s - 133) = 2^(m - 139) */
        w0 = exp2_int((int)m0 - 139);
        w1 = exp2_int((int)m1 - 139);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const uint32_t f0 = t8_factor2(s.x, c, m0), f1 = t8_factor2(s.y, c, m1);
            const uint32_t x0 = u4_at(v0, c), x1 = u4_at(v1, c);
            af[c][0] = e4m3x4_scaled(dsv4_fn_lo(x0), f0);
            af[c][1] = e4m3x4_scaled(dsv4_fn_lo(x1), f1);
            af[c][2] = e4m3x4_scaled(dsv4_fn_hi(x0), f0);
            af[c][3] = e4m3x4_scaled(dsv4_fn_hi(x1), f1);
        }
    } else {
        uint4 pl[4];
#pragma unroll
        for (int p = 0; p < 4; p++)
            pl[p] = *(const uint4 *)(chunk + p * 512 + lane * 16);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const uint4 h0 = pl[c >> 1], h1 = pl[2 + (c >> 1)];
            af[c][0] = (c & 1) ? h0.z : h0.x;
            af[c][2] = (c & 1) ? h0.w : h0.y;
            af[c][1] = (c & 1) ? h1.z : h1.x;
            af[c][3] = (c & 1) ? h1.w : h1.y;
        }
        const float *fs = (const float *)sc;
        w0 = fs[0];
        w1 = fs[1];
    }
}

/*
 * k_tile8's shared memory: 128 features (two warpgroups of 64) x BN tokens of one group per
 * block, 256 threads; per 128-wide K block a cp.async stage holds the 8 weight chunks (room for
 * fp8's), their scales, the BN activation rows' e4m3 codes as K-major core matrices per k32 step
 * ([step][kc][token group][8][16 B]) and the activation scales.
 */
template <int BN_, int ST_, int MT_ = 8> struct Tile8 {
    enum {
        BN = BN_,
        MT = MT_,           /* 16-row tiles a block: 8 (128 rows, two warpgroups) or 16 (256, four) */
        THREADS = 32 * MT_, /* a warp a tile */
        W_BYTES = MT * DSV4_FN_FP8_CHUNK,
        WS_BYTES = MT * DSV4_FN_FP4_SCHUNK,
        B_STEP = BN * 32,
        B_BYTES = 4 * B_STEP,
        AS_BYTES = BN * 4,
        STAGE = W_BYTES + WS_BYTES + B_BYTES + AS_BYTES,
        STAGES = ST_,
        SMEM = STAGES * STAGE + BN * 8,
        SMEM_QF = SMEM + MT * BN * 4 /* with the fused quantization's per-warp maxima after it */
    };
};

template <int BN, int ST, int MT, int FMT>
__device__ __forceinline__ void tile8_load(const FGrp &g, int mt0, int kb, int KB, int K, uint8_t *stage,
                                           const long long *sRow)
{
    typedef Tile8<BN, ST, MT> C;
    uint8_t *sW = stage, *sWS = stage + C::W_BYTES, *sB = sWS + C::WS_BYTES;
    float *sAS = (float *)(sB + C::B_BYTES);
    const int tid = threadIdx.x;
    wg_tile_load_w<FMT, MT, C::THREADS>(g, mt0, kb, KB, sW, sWS);
    /* piece q (16 codes) of row r: step q / 2, core matrix kc = q % 2; 8 consecutive threads take
       one row's 128 bytes */
    for (int i = tid; i < BN * 8; i += C::THREADS) {
        const int r = i >> 3, q = i & 7;
        const long long ar = sRow[r];
        uint8_t *dst = sB + (q >> 1) * C::B_STEP + (q & 1) * (BN * 16) + (r >> 3) * 128 + (r & 7) * 16;
        cp_async16(dst, ar >= 0 ? (const void *)(g.A + ar * K + kb * 128 + q * 16) : (const void *)g.A, ar >= 0);
    }
    for (int r = tid; r < BN; r += C::THREADS) {
        const long long ar = sRow[r];
        cp_async4(sAS + r, ar >= 0 ? g.As + ar * KB + kb : g.As, ar >= 0);
    }
}

/* Issues (and commits, without waiting) this warpgroup's four wgmmas of one K block into d. */
template <int BN, int ST, int MT>
__device__ __forceinline__ void tile8_mma(const uint8_t *stage, uint32_t af[4][4], float *d)
{
    typedef Tile8<BN, ST, MT> C;
    const uint64_t bd0 = wg_desc(stage + C::W_BYTES + C::WS_BYTES, BN * 16, 128);
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
        d[i] = 0.0f;
    wg_fence();
#pragma unroll
    for (int c = 0; c < 4; c++)
        wg_mma_e4m3<BN>(d, af[c], bd0 + (uint64_t)((c * C::B_STEP) >> 4), c > 0);
    wg_commit();
}

/* The block's partial d into the fp32 accumulators: times (row's weight scale x token's scale). */
template <int BN, int ST, int MT>
__device__ __forceinline__ void tile8_promote(const uint8_t *stage, float w0, float w1, const float *d, float *acc)
{
    typedef Tile8<BN, ST, MT> C;
    wg_tile_promote<BN, WF_FP8>((const float *)(stage + C::W_BYTES + C::WS_BYTES + C::B_BYTES), w0, w1, d, acc);
}

/* A stage's fragments of this warp's tile. */
template <int BN, int ST, int MT, int FMT>
__device__ __forceinline__ void tile8_decode(const uint8_t *stage, int tile, uint32_t af[4][4], float &w0, float &w1)
{
    typedef Tile8<BN, ST, MT> C;
    constexpr int CH = FMT == WF_FP4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK;
    constexpr int SCH = FMT == WF_FP4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    tile8_frags<FMT>(stage + tile * CH, stage + C::W_BYTES + tile * SCH, threadIdx.x & 31, af, w0, w1);
}

/*
 * One K block of the pipelined loop: the block's load of stage kb + STAGES - 1, this warpgroup's
 * four wgmmas on stage kb (fragments already in cur, scales cw), and, while they run, the wait for
 * stage kb + 1 and the conversion of its fragments into nxt / nw; then the block's partial is
 * scaled into acc. Two barriers: stage kb + 1 complete for everyone, and stage kb free again.
 */
template <int BN, int ST, int MT, int FMT>
__device__ __forceinline__ void tile8_step(const FGrp &g, int kb, int KB, int K, int mt0, uint8_t *smem,
                                           const long long *sRow, int tile, uint32_t cur[4][4], const float cw[2],
                                           uint32_t nxt[4][4], float nw[2], float *acc)
{
    typedef Tile8<BN, ST, MT> C;
    const int kn = kb + C::STAGES - 1;
    if (kn < KB)
        tile8_load<BN, ST, MT, FMT>(g, mt0, kn, KB, K, smem + (kn % C::STAGES) * C::STAGE, sRow);
    cp_async_commit();
    const uint8_t *stage = smem + (kb % C::STAGES) * C::STAGE;
    float d[BN / 2];
    tile8_mma<BN, ST, MT>(stage, cur, d);
    if (kb + 1 < KB) {
        cp_async_wait<C::STAGES - 2>();
        fence_async_smem();
        __syncthreads();
        tile8_decode<BN, ST, MT, FMT>(smem + ((kb + 1) % C::STAGES) * C::STAGE, tile, nxt, nw[0], nw[1]);
    }
    wg_wait<0>();
    tile8_promote<BN, ST, MT>(stage, cw[0], cw[1], d, acc);
    __syncthreads();
}

/*
 * The fused quantization's epilogue (k_tile8 with QF: gate/up of a block of 16 tiles, 128 features,
 * one 128-group of h): each thread's h (SPEC.md section 4 on bf16 g and u, the router weight before
 * w2, rounded to bf16: the value k_quant8 would read) for its feature and tokens; the block's
 * largest magnitude per token (NaN ignored, as quant_groupn) over its lanes, then its 16 warps
 * through red; the scale and the e4m3 code by quant_groupn's arithmetic (kernels.cuh; written again
 * here for one value a lane: routing quant_groupn through a shared helper changes the code of the
 * default kernels that inline it, k_router_count's among them, whose time is instruction fetch);
 * codes to a.qf_q, the scale (one a token) to a.qf_s, rows as h's. The clamp counts as fepi's.
 */
template <int BN>
__device__ __forceinline__ void tile8_epi_quant(const FastArgs &a, const FGrp &g, int r0, int mt, int gid, int tig,
                                                const float *acc, uint32_t *red)
{
    constexpr int NV = BN / 4; /* tokens a thread holds: two of each 8-token group */
    const int I = a.N >> 1, ngi = I >> 7, f = mt * 8 + gid, gq = f >> 7, warp = threadIdx.x >> 5;
    const bool sh = g.slot0 < 0;
    const bool clamp = (sh ? a.clamp_s : a.clamp_r) && a.L > 0.0f;
    unsigned gc = 0, uc = 0;
    float hv[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int j = r0 + 8 * (i >> 1) + 2 * tig + (i & 1);
        const float v0 = acc[4 * (i >> 1) + (i & 1)], v1 = acc[4 * (i >> 1) + 2 + (i & 1)];
        float h = 0.0f;
        uint32_t m = 0;
        if (j < g.n) {
            h = swiglu_h(rbf16(v0), rbf16(v1), clamp, a.L, gc, uc);
            if (!sh && a.before)
                h = __fmul_rn(h, a.slot_w[g.slot0 + j]);
            h = rbf16(h);
            m = __float_as_uint(h) & 0x7FFFFFFFu;
            m = m > 0x7F800000u ? 0u : m;
        }
        hv[i] = h;
        /* the 8 lanes of one tig hold this token's 8 features of the warp's tile */
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
            const uint32_t w = __shfl_xor_sync(0xFFFFFFFFu, m, o);
            m = w > m ? w : m;
        }
        if (gid == 0)
            red[warp * BN + 8 * (i >> 1) + 2 * tig + (i & 1)] = m;
    }
    __syncthreads();
    const long long base = sh ? a.qf_sh_row0 : 0;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int t = 8 * (i >> 1) + 2 * tig + (i & 1), j = r0 + t;
        if (j >= g.n)
            continue;
        uint32_t mb = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            mb = red[w * BN + t] > mb ? red[w * BN + t] : mb;
        float amax = __uint_as_float(mb);
        amax = amax < 1e-4f ? 1e-4f : amax;
        float s, x;
        if (a.qmode == 1) {
            const uint32_t b = ue8m0_scale_448(amax);
            s = dsv4_ue8m0_decode(b);
            x = __fmul_rn(hv[i], dsv4_ue8m0_inverse(b));
        } else {
            s = __fdiv_rn(amax, 448.0f);
            x = __fdiv_rn(hv[i], s);
        }
        uint32_t c = e4m3x2_encode(x, 0.0f) & 0xFFu;
        if ((c & 0x7Fu) == 0x7Fu)
            c = ((__float_as_uint(hv[i]) >> 24) & 0x80u) | 0x7Fu;
        const long long row = base + g.orow0 + j;
        a.qf_q[row * I + f] = (uint8_t)c;
        if (warp == 0 && gid == 0)
            a.qf_s[row * ngi + gq] = s;
    }
    if (a.gu)
        fepi_stats(a, g, gc, uc);
}

/*
 * The K loop and the epilogue of k_tile8 (MT 16-row tiles a block, a warp each): the next K block's
 * fragments are converted while this block's wgmmas run, which the warpgroup then waits for and
 * promotes (two barriers per K block, two fragment sets live; a second accumulator set promoted
 * while the next block's wgmmas run makes ptxas serialize the wgmmas, C7514). Epilogue: fepi
 * (mma_parts.cuh), as every tile kernel's, or with QF (gate/up, MT 16) the quantization of h fused
 * (tile8_epi_quant).
 */
template <int BN, int ST, int MT, int FMT, bool QF>
__device__ __forceinline__ void tile8_run(const FastArgs &a, const FGrp &g, int r0, uint8_t *smem, const long long *sRow)
{
    typedef Tile8<BN, ST, MT> C;
    constexpr int ND = BN / 2;
    const int K = a.K, KB = K >> 7;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int tile = warp; /* warpgroup wg = warp / 4 holds tiles 4 wg .. 4 wg + 3 */
    const int mt0 = blockIdx.x * MT;
    float acc[ND];
#pragma unroll
    for (int i = 0; i < ND; i++)
        acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < KB)
            tile8_load<BN, ST, MT, FMT>(g, mt0, s, KB, K, smem + s * C::STAGE, sRow);
        cp_async_commit();
    }
    {
        uint32_t a0[4][4], a1[4][4];
        float v0[2], v1[2];
        cp_async_wait<C::STAGES - 2>();
        fence_async_smem();
        __syncthreads();
        tile8_decode<BN, ST, MT, FMT>(smem, tile, a0, v0[0], v0[1]);
        for (int kb = 0; kb < KB; kb += 2) {
            tile8_step<BN, ST, MT, FMT>(g, kb, KB, K, mt0, smem, sRow, tile, a0, v0, a1, v1, acc);
            if (kb + 1 < KB)
                tile8_step<BN, ST, MT, FMT>(g, kb + 1, KB, K, mt0, smem, sRow, tile, a1, v1, a0, v0, acc);
        }
    }
    cp_async_wait<0>();
    if constexpr (QF) {
        static_assert(MT == 16, "the fused quantization needs a block's 128 features");
        tile8_epi_quant<BN>(a, g, r0, mt0 + tile, gid, tig, acc,
                            (uint32_t *)(smem + C::SMEM));
    } else {
        wg_tile_epilogue<BN>(a, g, r0, mt0 + tile, gid, tig, acc);
    }
}

} // namespace dsv4cuda

#endif
