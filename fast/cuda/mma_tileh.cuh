/*
 * The device code of the fp8 path's large-group regime (fast/cuda): k_tileh (tileh.cu), exact f16
 * wgmma over the fragment-native weights converted to f16 in registers (mma_parts.cuh's header
 * describes the three regimes). Inline functions and types only; included by tileh.cu.
 */
#ifndef DSV4MOE_FAST_CUDA_MMA_TILEH_CUH
#define DSV4MOE_FAST_CUDA_MMA_TILEH_CUH

#include "fast/cuda/mma_parts.cuh"
#include "fast/cuda/wg_tile.cuh"
#include "fast/cuda/tileh.cuh"

namespace dsv4cuda {

/* ---------------- large groups on wgmma with f16 operands (sm_90a) ---------------- */

/*
 * Hopper's fp8 wgmma sums a k32 step with 13 fraction bits below the largest product and keeps
 * a 14-bit result, which is measurably off the reference (docs/cuda.md); its f16 variant keeps
 * fp32. So the large-group kernel converts exactly to f16 and multiplies with
 * wgmma.m64nNk16.f32.f16.f16: fp4 weights become f16 e2m1 * 2^(s - 127) (the step's scale
 * folded in by one f16 multiply, exact for scale bytes in [DSV4_FH_SCALE_LO, DSV4_FH_SCALE_HI],
 * checked at creation), fp8 weights their e4m3 values; the activations arrive as f16 copies of
 * their codes (store_f16_codes, in the K order that matches the weights' runs). Each 128-wide K
 * block accumulates on the tensor cores in fp32; the block's sum is scaled by the activation
 * scale (and the fp8 weight block scale) in fp32.
 */
/* DSV4_FH_SCALE_LO, DSV4_FH_SCALE_HI: tileh.cuh (the creation checks them too) */

/* D (BN / 2 floats) (+)= A (f16 registers) x B (BN tokens of f16, shared memory). */
template <int BN>
__device__ __forceinline__ void wg_mma_f16(float *d, const uint32_t *a, uint64_t bd, int acc)
{
    if constexpr (BN == 32) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(acc));
    } else if constexpr (BN == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(acc));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(acc));
    }
}

/* f16x2 of 2^(s - 121), s the stored byte minus 6 (step c of four stored bytes): bits (stored - 112) << 10. */
__device__ __forceinline__ uint32_t fh_scale2(uint32_t bytes, int c)
{
    const uint32_t h = (((bytes >> (8 * c)) & 0xFFu) - 112u) << 10;
    return h | (h << 16);
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b)
{
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

/*
 * k_tileh: 128 features (two warpgroups of 64) x BN tokens of one group per block, 256 threads;
 * per 128-wide K block a cp.async stage holds the 8 weight tiles, their scales, the BN
 * activation rows as f16 in K-major core matrices per k16 step ([kc][token group][8][16 B]),
 * and the activation scales.
 */
template <int BN_, int ST_ = 4> struct TileH {
    enum {
        BN = BN_,
        W_BYTES = 8 * DSV4_FN_FP8_CHUNK,
        WS_BYTES = 8 * DSV4_FN_FP4_SCHUNK,
        B_STEP = BN * 32, /* one k16 step of BN f16 rows */
        B_BYTES = 8 * B_STEP,
        AS_BYTES = BN * 4,
        STAGE = W_BYTES + WS_BYTES + B_BYTES + AS_BYTES,
        STAGES = ST_,
        SMEM = STAGES * STAGE + BN * 8
    };
};

template <int BN, int FMT, int ST>
__device__ __forceinline__ void tileh_load(const FGrp &g, const uint16_t *A16, int mt0, int kb, int KB, int K,
                                           uint8_t *stage, const long long *sRow)
{
    typedef TileH<BN, ST> C;
    uint8_t *sW = stage, *sWS = stage + C::W_BYTES, *sB = sWS + C::WS_BYTES;
    float *sAS = (float *)(sB + C::B_BYTES);
    const int tid = threadIdx.x;
    wg_tile_load_w<FMT>(g, mt0, kb, KB, sW, sWS);
    /* q: 16-byte piece (8 f16) of a row's 128 values (step q / 2, kc q % 2). A warp takes 8 rows x 4
       consecutive pieces: 64 contiguous bytes per row from global memory, and each 8-thread phase of
       its shared-memory stores covers 8 rows of one core matrix, so no two of them share a bank. */
    for (int i = tid; i < C::BN * 16; i += 256) {
        const int lane = i & 31, w = i >> 5;
        const int r = (w >> 2) * 8 + (lane & 7), q = (w & 3) * 4 + (lane >> 3);
        const long long ar = sRow[r];
        uint8_t *dst = sB + (q >> 1) * C::B_STEP + (q & 1) * (C::BN * 16) + (r >> 3) * 128 + (r & 7) * 16;
        cp_async16(dst, ar >= 0 ? (const void *)(A16 + ar * K + kb * 128 + q * 8) : (const void *)A16, ar >= 0);
    }
    for (int r = tid; r < C::BN; r += 256) {
        const long long ar = sRow[r];
        cp_async4(sAS + r, ar >= 0 ? g.As + ar * KB + kb : g.As, ar >= 0);
    }
}

/* The stage's A fragments (8 k16 steps) of this warp's 16 rows, as exact f16 (fp4 scales folded in). */
template <int FMT>
__device__ __forceinline__ void tileh_decode(const uint8_t *stage, int tile, uint32_t af[8][4])
{
    constexpr int CH = FMT == WF_FP4 ? DSV4_FN_FP4_CHUNK : DSV4_FN_FP8_CHUNK;
    constexpr int SCH = FMT == WF_FP4 ? DSV4_FN_FP4_SCHUNK : DSV4_FN_FP8_SCHUNK;
    const int lane = threadIdx.x & 31, gid = lane >> 2;
    const uint8_t *sW = stage + tile * CH + lane * 16;
    uint2 sc = make_uint2(0u, 0u);
    if constexpr (FMT == WF_FP4)
        sc = *(const uint2 *)(stage + 8 * DSV4_FN_FP8_CHUNK + tile * SCH + gid * 8);
    /* 16-byte loads: a warp's 32 lanes read 512 contiguous bytes, no bank conflicts */
    uint4 v[FMT == WF_FP4 ? 2 : 4];
#pragma unroll
    for (int i = 0; i < (FMT == WF_FP4 ? 2 : 4); i++)
        v[i] = *(const uint4 *)(sW + i * 512);
#pragma unroll
    for (int c = 0; c < 4; c++) {
        uint32_t ra, rb, xa, xb;
        if constexpr (FMT == WF_FP4) {
            const uint32_t w0 = u4_at(v[0], c), w1 = u4_at(v[1], c);
            ra = dsv4_fn_lo(w0), rb = dsv4_fn_hi(w0), xa = dsv4_fn_lo(w1), xb = dsv4_fn_hi(w1);
        } else {
            const uint4 &h0 = v[c >> 1], &h1 = v[2 + (c >> 1)];
            ra = (c & 1) ? h0.z : h0.x, rb = (c & 1) ? h0.w : h0.y;
            xa = (c & 1) ? h1.z : h1.x, xb = (c & 1) ? h1.w : h1.y;
        }
        uint32_t f[8] = {e4m3x2_to_f16x2(ra), e4m3x2_to_f16x2(ra >> 16), e4m3x2_to_f16x2(xa), e4m3x2_to_f16x2(xa >> 16),
                         e4m3x2_to_f16x2(rb), e4m3x2_to_f16x2(rb >> 16), e4m3x2_to_f16x2(xb), e4m3x2_to_f16x2(xb >> 16)};
        if constexpr (FMT == WF_FP4) {
            const uint32_t s0 = fh_scale2(sc.x, c), s1 = fh_scale2(sc.y, c);
#pragma unroll
            for (int q = 0; q < 8; q++)
                f[q] = hmul2(f[q], (q & 2) ? s1 : s0);
        }
        /* run A is the first k16 step of the pair, run B the second; registers: row gid lo,
           row gid + 8 lo, row gid hi, row gid + 8 hi */
        af[2 * c][0] = f[0], af[2 * c][1] = f[2], af[2 * c][2] = f[1], af[2 * c][3] = f[3];
        af[2 * c + 1][0] = f[4], af[2 * c + 1][1] = f[6], af[2 * c + 1][2] = f[5], af[2 * c + 1][3] = f[7];
    }
}

/* Issues (and commits, without waiting) this warpgroup's 8 wgmmas of one K block into d (zeroed). */
template <int BN, int ST>
__device__ __forceinline__ void tileh_mma(const uint8_t *stage, uint32_t af[8][4], float *d)
{
    typedef TileH<BN, ST> C;
    const uint64_t bd0 = wg_desc(stage + C::W_BYTES + C::WS_BYTES, C::BN * 16, 128);
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
        d[i] = 0.0f;
    wg_fence();
#pragma unroll
    for (int s2 = 0; s2 < 8; s2++)
        wg_mma_f16<BN>(d, af[s2], bd0 + (uint64_t)((s2 * C::B_STEP) >> 4), s2 > 0);
    wg_commit();
}

/* The per-K-block promotion of a warpgroup's f16 products d into the fp32 accumulators acc. */
template <int BN, int FMT, int ST>
__device__ __forceinline__ void tileh_promote(const uint8_t *stage, int tile, const float *d, float *acc)
{
    typedef TileH<BN, ST> C;
    const float *sAS = (const float *)(stage + C::W_BYTES + C::WS_BYTES + C::B_BYTES);
    float w0 = 1.0f, w1 = 1.0f;
    if constexpr (FMT == WF_FP8) {
        const float *fs = (const float *)(stage + C::W_BYTES + tile * DSV4_FN_FP8_SCHUNK);
        w0 = fs[0];
        w1 = fs[1];
    }
    wg_tile_promote<BN, FMT>(sAS, w0, w1, d, acc);
}

/*
 * One K block of k_tileh: the block's load of stage kb + STAGES - 1, this warpgroup's 8 wgmma on
 * stage kb (A already decoded in cur), and, while they run, the wait for stage kb + 1 and the
 * decode of its A into nxt; then the block sum is scaled into acc. Two barriers: stage kb + 1
 * complete for everyone, and stage kb free again before the next step overwrites it.
 */
template <int BN, int FMT, int ST>
__device__ __forceinline__ void tileh_step(const FastArgs &a, const FGrp &g, const uint16_t *A16, int kb, int KB,
                                           uint8_t *smem, const long long *sRow, int tile, uint32_t cur[8][4],
                                           uint32_t nxt[8][4], float *acc)
{
    typedef TileH<BN, ST> C;
    constexpr int ND = BN / 2;
    const int K = a.K, mt0 = blockIdx.x * 8;
    const int kn = kb + C::STAGES - 1;
    if (kn < KB)
        tileh_load<BN, FMT, ST>(g, A16, mt0, kn, KB, K, smem + (kn % C::STAGES) * C::STAGE, sRow);
    cp_async_commit();
    const uint8_t *stage = smem + (kb % C::STAGES) * C::STAGE;
    float d[ND];
    tileh_mma<BN, ST>(stage, cur, d);
    if (kb + 1 < KB) {
        cp_async_wait<C::STAGES - 2>();
        fence_async_smem();
        __syncthreads();
        tileh_decode<FMT>(smem + ((kb + 1) % C::STAGES) * C::STAGE, tile, nxt);
    }
    wg_wait<0>();
    tileh_promote<BN, FMT, ST>(stage, tile, d, acc);
    __syncthreads();
}

/*
 * The K loop of k_tileh. PIPE: the next K block's A is decoded while this block's wgmmas run
 * (two fragment sets live, two barriers per K block); otherwise decode, wgmma and wait follow
 * each other with one barrier per K block (fewer registers, so room for 128-token tiles).
 */
template <int BN, int FMT, bool PIPE, int ST>
__device__ __forceinline__ void tileh_run(const FastArgs &a, const FGrp &g, const uint16_t *A16, int r0, uint8_t *smem,
                                          const long long *sRow)
{
    typedef TileH<BN, ST> C;
    constexpr int ND = BN / 2;
    const int K = a.K, KB = K >> 7;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int tile = warp; /* warpgroup wg = warp / 4 holds tiles 4 wg .. 4 wg + 3 */
    const int mt0 = blockIdx.x * 8;
    float acc[ND];
#pragma unroll
    for (int i = 0; i < ND; i++)
        acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < C::STAGES - 1; s++) {
        if (s < KB)
            tileh_load<BN, FMT, ST>(g, A16, mt0, s, KB, K, smem + s * C::STAGE, sRow);
        cp_async_commit();
    }
    if constexpr (PIPE) {
        cp_async_wait<C::STAGES - 2>();
        fence_async_smem();
        __syncthreads();
        uint32_t a0[8][4], a1[8][4];
        tileh_decode<FMT>(smem, tile, a0);
        for (int kb = 0; kb < KB; kb += 2) {
            tileh_step<BN, FMT, ST>(a, g, A16, kb, KB, smem, sRow, tile, a0, a1, acc);
            if (kb + 1 < KB)
                tileh_step<BN, FMT, ST>(a, g, A16, kb + 1, KB, smem, sRow, tile, a1, a0, acc);
        }
    } else {
        for (int kb = 0; kb < KB; kb++) {
            cp_async_wait<C::STAGES - 2>();
            fence_async_smem();
            __syncthreads(); /* stage kb landed for everyone; stage kb - 1 is no longer read */
            const int kn = kb + C::STAGES - 1;
            if (kn < KB)
                tileh_load<BN, FMT, ST>(g, A16, mt0, kn, KB, K, smem + (kn % C::STAGES) * C::STAGE, sRow);
            cp_async_commit();
            const uint8_t *stage = smem + (kb % C::STAGES) * C::STAGE;
            uint32_t af[8][4];
            tileh_decode<FMT>(stage, tile, af);
            float d[ND];
            tileh_mma<BN, ST>(stage, af, d);
            wg_wait<0>();
            tileh_promote<BN, FMT, ST>(stage, tile, d, acc);
        }
    }
    cp_async_wait<0>();
    wg_tile_epilogue<BN>(a, g, r0, mt0 + tile, gid, tig, acc);
}

} // namespace dsv4cuda

#endif
