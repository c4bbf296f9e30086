/*
 * The CUDA backend's epilogue kernels (fast/cuda): k_swiglu (the exact path's SwiGLU clamp,
 * router weight and quantization of h) and k_combine (fp32 per token over the kept slots in
 * ascending expert id, then the shared expert; both paths). Included once, by cuda.cu, after
 * router.cuh.
 */
#ifndef DSV4MOE_FAST_CUDA_SWIGLU_COMBINE_CUH
#define DSV4MOE_FAST_CUDA_SWIGLU_COMBINE_CUH

#include "fast/cuda/combine_parts.cuh"

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

/* combine_cols, combine_order: combine_parts.cuh */

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
