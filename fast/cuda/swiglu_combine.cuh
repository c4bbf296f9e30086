/*
 * The CUDA backend's epilogue kernels (fast/cuda): k_swiglu (the exact path's SwiGLU clamp,
 * router weight and quantization of h) and k_combine (fp32 per token over the kept slots in
 * ascending expert id, then the shared expert; both paths). Included once, by cuda.cu, after
 * exact_gemm.cuh.
 */
#ifndef DSV4MOE_FAST_CUDA_SWIGLU_COMBINE_CUH
#define DSV4MOE_FAST_CUDA_SWIGLU_COMBINE_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

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
                float h = swiglu_h(bf16f(gr[k]), bf16f(ur[k]), clamp, a.L, gc, uc);
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

/* A 16-byte piece of an expert's output row: through the read-only path (k_combine, a kernel after
   the ones that wrote it) or through L2 (cg: the down projection's own launch wrote it). */
template <bool CG> __device__ __forceinline__ uint4 combine_ld(const uint16_t *p)
{
    return CG ? __ldcg((const uint4 *)p) : __ldg((const uint4 *)p);
}

/*
 * y[t, col .. col + 7] of one token: the n expert rows rows[] (their slots slot[], in ascending
 * expert id) summed in fp32 (each times its router weight when after w2), then the shared row,
 * rounded to bf16. The shared row and four expert rows are in flight before their sums (a token's
 * handful of rows, each a dependent round trip to memory otherwise: 8 us for one token on the
 * H200); the sums keep the ascending expert order. k_combine and the down projection's folded
 * combine (mma.cuh) both sum here, so the two give the same bits.
 */
template <bool CG>
__device__ __forceinline__ void combine_cols(const CombineArgs &a, int t, int col, const int *rows, const int *slot, int n)
{
    const int K = a.K, H = a.H;
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        y[i] = 0.0f;
    const uint4 vsh = a.Osh ? combine_ld<CG>(a.Osh + (long long)t * H + col) : make_uint4(0u, 0u, 0u, 0u);
    for (int j0 = 0; j0 < n; j0 += 4) {
        uint4 v[4];
        float wj[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (j0 + q < n) {
                v[q] = combine_ld<CG>(a.O + (long long)rows[j0 + q] * H + col);
                wj[q] = a.after ? a.w[(long long)t * K + slot[j0 + q]] : 1.0f;
            }
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (j0 + q < n) {
                const uint32_t w4[4] = {v[q].x, v[q].y, v[q].z, v[q].w};
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float o = bf16f((uint16_t)(w4[i >> 1] >> (16 * (i & 1))));
                    y[i] = a.after ? __fadd_rn(y[i], __fmul_rn(wj[q], o)) : __fadd_rn(y[i], o);
                }
            }
    }
    if (a.Osh) {
        const uint32_t w4[4] = {vsh.x, vsh.y, vsh.z, vsh.w};
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

/* Token t's kept slots in ascending expert id, equal ids in slot order (insertion, as cpu.c): their
   o rows and slot indices; sid[k] / srow[k] hold the token's ids and rows by slot. One thread. */
__device__ __forceinline__ int combine_order(const CombineArgs &a, const int *sid, const int *srow, int *rows, int *slot)
{
    int n = 0;
    for (int k = 0; k < a.K; k++) {
        const int e = sid[k];
        if (e >= a.E)
            continue;
        int pos = n++;
        while (pos > 0 && sid[slot[pos - 1]] > e) {
            rows[pos] = rows[pos - 1];
            slot[pos] = slot[pos - 1];
            pos--;
        }
        rows[pos] = srow[k];
        slot[pos] = k;
    }
    return n;
}

/*
 * grid (Tc, ceil(H / (8 * blockDim.x))): each thread sums 8 columns (16-byte loads of the
 * experts' bf16 rows) over the token's kept slots in ascending expert id (equal ids in slot
 * order), in fp32, then adds the shared expert's bf16 row and rounds to bf16 (H % 8 == 0).
 */
__global__ void k_combine(CombineArgs a)
{
    pdl_enter();
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
    if (threadIdx.x == 0)
        s_n = combine_order(a, sid, srow, rows, slot);
    __syncthreads();
    const int col = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (col >= H)
        return;
    combine_cols<false>(a, t, col, rows, slot, s_n);
}

} // namespace dsv4cuda

#endif
