/*
 * params quant=down: the down projection's decode blocks quantize the h rows they read themselves,
 * into shared memory, so no k_quant launch (and no kernel boundary) sits between gate/up and down.
 * Every block of a group quantizes the group's whole rows (at most FM_DEC_QIN_MAX rows of I
 * features: a few KB from L2) with quant_groupn, k_quant's arithmetic, so the codes and scales are
 * k_quant's bit for bit (the amax is a maximum: any layout of a 128-group over lanes gives the
 * same). The block issues its first weight ring stages before it quantizes (mma_parts.cuh
 * dec_warp), so the h reads overlap the weights' DRAM latency. Inline device code only.
 */
#ifndef DSV4MOE_FAST_CUDA_DEC_QIN_CUH
#define DSV4MOE_FAST_CUDA_DEC_QIN_CUH

#include "fast/cuda/kernels.cuh"

namespace dsv4cuda {

/* Groups of at most this many rows quantize in the down projection with quant=down (larger ones
   keep k_quant): 8 rows of I = 2048 are 17 KB of codes and scales a block, which keep three fp4
   blocks a multiprocessor; 16 would leave two. */
#define FM_DEC_QIN_MAX 8

/* A quantized row's stride in the block's buffer: K + 16 bytes, so the eight rows a warp's B loads
   touch at one K place (rows gid, 4-byte words tig) fall in 32 different banks. */
__host__ __device__ constexpr int dec_qin_ld(int K) { return K + 16; }

/* Bytes of a block's buffer for n rows of K features: the codes, then the fp32 scales [n, K / 128]. */
__host__ __device__ constexpr size_t dec_qin_bytes(int n, int K)
{
    return (size_t)n * (size_t)dec_qin_ld(K) + (size_t)n * (size_t)(K / 128) * 4;
}

/* The scales of the n-row buffer qbuf (16-byte aligned: K + 16 is a multiple of 16). */
__device__ __forceinline__ float *dec_qin_scales(uint8_t *qbuf, int n, int K)
{
    return (float *)(qbuf + (size_t)n * dec_qin_ld(K));
}

/*
 * The whole block: rows 0 .. n - 1 of bf16 h (row r at h + r K, K % 128 == 0, written by the grid
 * before this one) to e4m3 codes (qbuf + r dec_qin_ld(K) + k) and scales (dec_qin_scales, [r, kb])
 * by `qmode` (SPEC.md section 5). A half warp takes a 128-group (16 lanes of 8 values), and loads
 * up to QB groups before it computes any, so a few round trips to L2 cover the rows. The caller
 * synchronizes the block before reading the buffer.
 */
__device__ __forceinline__ void dec_quant_rows(const uint16_t *h, int n, int K, uint8_t *qbuf, int qmode)
{
    constexpr int QB = 4;
    const int KB = K >> 7, G = n * KB;
    const int hw = (int)(threadIdx.x >> 4), nhw = (int)(blockDim.x >> 4), hl = (int)(threadIdx.x & 15);
    float *sc = dec_qin_scales(qbuf, n, K);
    /* the loop bounds are the same in both halves of a warp (G and nhw are), so the shuffles of
       quant_groupn see every lane */
    for (int g0 = (hw & ~1) * QB; g0 < G; g0 += nhw * QB) {
        uint4 raw[QB];
#pragma unroll
        for (int b = 0; b < QB; b++) {
            const int gi = g0 + (hw & 1) * 1 + 2 * b; /* the two halves of a warp interleave */
            raw[b] = gi < G ? __ldcg((const uint4 *)(h + (size_t)(gi / KB) * K + (size_t)(gi % KB) * 128 + hl * 8))
                            : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int b = 0; b < QB; b++) {
            const int gi = g0 + (hw & 1) * 1 + 2 * b;
            const bool in = gi < G;
            const uint32_t w4[4] = {raw[b].x, raw[b].y, raw[b].z, raw[b].w};
            float v[8];
            bool ok[8];
            uint8_t c[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                v[i] = bf16f((uint16_t)(w4[i >> 1] >> (16 * (i & 1))));
                ok[i] = in;
            }
            const float s = quant_groupn<8, 16>(v, ok, qmode, c);
            if (!in)
                continue;
            const int r = gi / KB, kb = gi % KB;
            *(uint2 *)(qbuf + (size_t)r * dec_qin_ld(K) + kb * 128 + hl * 8) =
                make_uint2((uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) | ((uint32_t)c[3] << 24),
                           (uint32_t)c[4] | ((uint32_t)c[5] << 8) | ((uint32_t)c[6] << 16) | ((uint32_t)c[7] << 24));
            if (hl == 0)
                sc[r * KB + kb] = s;
        }
    }
}

} // namespace dsv4cuda

#endif
