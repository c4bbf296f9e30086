/*
 * k_tiles: the exact path's tensor-core GEMM and the large chunks' router logits (tiles.cuh says
 * what it computes; exact_gemm.cuh holds the device code it shares with k_gemv).
 */
#include "fast/cuda/tiles.cuh"
#include "fast/cuda/exact_gemm.cuh"

namespace dsv4cuda {

namespace {

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

const exact_kernel variants[6] = {k_tiles<WF_BF16, 0>, k_tiles<WF_BF16, 1>, k_tiles<WF_FP8, 0>,
                                  k_tiles<WF_FP8, 1>,  k_tiles<WF_FP4, 0>,  k_tiles<WF_FP4, 1>};

} // namespace

cudaError_t launch_tiles(int fmt, int aq, dim3 g, cudaStream_t s, bool pdl, const GemmArgs &a)
{
    return launch_kernel(exact_variant(variants, fmt, aq), g, DSV4C_TILE_THREADS, 0, s, pdl, a);
}

} // namespace dsv4cuda
