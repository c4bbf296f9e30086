/*
 * k_quant_x8: a large chunk's x quantized once and gathered into the grouped FP8 GEMM's rows
 * (quant_x8.cuh says what it writes and why).
 */
#include "fast/cuda/quant_x8.cuh"

namespace dsv4cuda {

namespace {

constexpr int QX8_THREADS = 128; /* four warps, each a 128-feature group at a time */

/* The four codes of lane l's elements k0 .. k0 + 3 into a row of codes (whole word inside the row). */
__device__ __forceinline__ void put_codes(uint8_t *row, int k0, const uint8_t c[4], const bool ok[4])
{
    if (ok[3]) {
        *(uint32_t *)(row + k0) =
            (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) | ((uint32_t)c[3] << 24);
    } else {
        for (int i = 0; i < 4; i++)
            if (ok[i])
                row[k0 + i] = c[i];
    }
}

/* Block t: token t. Its gathered slots first (row, group base r0 and rows m of each kept slot in
   a large group; row -1 otherwise), then per 128-group: the codes and scale (quantized here as
   route_block does, or read where k_logits_small wrote them), stored in x's row, its f16 copy,
   every gathered row, and the shared expert's M-major scales. */
__global__ void __launch_bounds__(QX8_THREADS) k_quant_x8(QuantX8Args a)
{
    pdl_enter();
    extern __shared__ int qx8_sm[]; /* [3 K]: row, r0, m per slot */
    const int t = blockIdx.x, nt = *a.ntok;
    if (t >= nt)
        return;
    const int H = a.H, K = a.K, E = a.E, ng = (H + 127) / 128, lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int *srow = qx8_sm, *sr0 = srow + K, *sm = sr0 + K;
    for (int j = threadIdx.x; j < K; j += blockDim.x) {
        const int id = a.ids[(long long)t * K + j];
        const bool big = a.ok && id >= 0 && id < E && a.ok[id] && a.cnt[id] > a.min_rows;
        srow[j] = big ? a.rowmap[(long long)t * K + j] : -1;
        sr0[j] = big ? a.pad_off[id] : 0;
        sm[j] = big ? a.cnt[id] : 0;
    }
    __syncthreads();
    const bool quantized = a.small_max > 0 && nt <= a.small_max; /* k_logits_small's chunk */
    const bool sh = a.ok && a.has_shared && a.ok[E] && nt > a.min_rows;
    const uint16_t *xr = a.x + (long long)t * H;
    uint8_t *qr = a.xq + (long long)t * H;
    for (int g = warp; g < ng; g += nw) {
        const int k0 = g * 128 + lane * 4;
        bool ok[4];
        uint8_t c[4];
        float s;
        for (int i = 0; i < 4; i++)
            ok[i] = k0 + i < H;
        if (quantized) {
            for (int i = 0; i < 4; i++)
                c[i] = ok[i] ? qr[k0 + i] : 0;
            s = a.xs[(long long)t * ng + g];
        } else {
            float v[4];
            for (int i = 0; i < 4; i++)
                v[i] = ok[i] ? bf16f(xr[k0 + i]) : 0.0f;
            s = quant_group4(v, ok, a.qmode, c); /* route_block's quantization (quant_x_group) */
            put_codes(qr, k0, c, ok);
            if (a.x16 && ok[3])
                store_f16_codes(a.x16 + (long long)t * H, k0, c);
            if (lane == 0)
                a.xs[(long long)t * ng + g] = s;
        }
        for (int j = 0; j < K; j++) {
            const int row = srow[j];
            if (row < 0)
                continue;
            put_codes(a.xp + (long long)row * H, k0, c, ok);
            if (lane == 0)
                a.xs8[(long long)sr0[j] * ng + (long long)g * sm[j] + (row - sr0[j])] = s;
        }
        if (sh && lane == 0)
            a.xs8[a.sh_row0 * ng + (long long)g * nt + t] = s;
    }
}

} // namespace

cudaError_t launch_quant_x8(const QuantX8Args &a, unsigned tokens, cudaStream_t s, bool pdl)
{
    QuantX8Args q = a;
    if (q.H % 128)
        q.ok = nullptr; /* the GEMM's K is a multiple of 128: no large group can exist */
    return launch_kernel(k_quant_x8, dim3(tokens), QX8_THREADS, (size_t)q.K * 3 * sizeof(int), s, pdl, q);
}

} // namespace dsv4cuda
