/*
 * k_gemv: the exact path's decode-regime GEMM (gemv.cuh says what it computes; exact_gemm.cuh holds
 * the device code it shares with k_tiles).
 */
#include "fast/cuda/gemv.cuh"
#include "fast/cuda/exact_gemm.cuh"

namespace dsv4cuda {

namespace {

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

const exact_kernel variants[6] = {k_gemv<WF_BF16, 0>, k_gemv<WF_BF16, 1>, k_gemv<WF_FP8, 0>,
                                  k_gemv<WF_FP8, 1>,  k_gemv<WF_FP4, 0>,  k_gemv<WF_FP4, 1>};

} // namespace

void launch_gemv(int fmt, int aq, dim3 g, size_t smem, cudaStream_t s, const GemmArgs &a)
{
    exact_variant(variants, fmt, aq)<<<g, DSV4C_GEMV_THREADS, smem, s>>>(a);
}

cudaError_t gemv_attrs(size_t smem)
{
    cudaError_t ce = cudaSuccess;
    for (int i = 0; i < 6 && ce == cudaSuccess; i++)
        ce = cudaFuncSetAttribute(variants[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return ce;
}

} // namespace dsv4cuda
