/*
 * The exact path's grouped GEMMs of the CUDA backend (fast/cuda): k_gemv (groups of up to
 * DSV4C_SMALL_MAX rows, activations dequantized to fp32 in shared memory) and k_tiles (larger
 * groups: DSV4C_BM x DSV4C_BN tiles, operands converted exactly to bf16, mma.sync m16n8k16), with
 * their weight decoders. k_tiles also computes the router logits on both paths. Included once,
 * by cuda.cu, after router.cuh.
 */
#ifndef DSV4MOE_FAST_CUDA_EXACT_GEMM_CUH
#define DSV4MOE_FAST_CUDA_EXACT_GEMM_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

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
    pdl_enter();
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
            if (arow < 0)
                bf16x16_zero(pa);
            else if (AQ)
                bf16x16_e4m3(ra0, pa);
            else
                bf16x16_raw(ra0, ra1, pa);
            bf16x16_put((uint4 *)&sA[lrow][lhalf * 16], pa);
        }
        if (wload) {
            uint32_t pw[8];
            if (!wrow) {
                bf16x16_zero(pw);
            } else if (FMT == WF_FP4) {
                float sc = dsv4_ue8m0_decode(rsc);
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
                bf16x16_e4m3(rw0, pw);
            } else {
                bf16x16_raw(rw0, rw1, pw);
            }
            bf16x16_put((uint4 *)&sW[lrow][lhalf * 16], pw);
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
                                sw = a.W.sfp32 ? ((const float *)sp)[si] : dsv4_ue8m0_decode(sp[si]);
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

} // namespace dsv4cuda

#endif
