/*
 * Device parts of the combine that more than one kernel and translation unit use (fast/cuda): a
 * token's kept slots in ascending expert id and the fp32 sum of its output columns over them and
 * the shared expert (k_combine, swiglu_combine.cuh; the folded combine of the decode kernels,
 * mma_parts.cuh). Inline functions only.
 */
#ifndef DSV4MOE_FAST_CUDA_COMBINE_PARTS_CUH
#define DSV4MOE_FAST_CUDA_COMBINE_PARTS_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

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
 * combine (mma_parts.cuh) both sum here, so the two give the same bits.
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

} // namespace dsv4cuda

#endif
