/*
 * Device half of test_cuda's quant_x8_kernel test (quant_x8_hw.h): k_quant_x8 through its
 * launcher on the caller's chunk, every output copied back. Test code: linked into
 * build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>

#include "fast/cuda/quant_x8.cuh"
#include "tests/cuda/dev_arena.cuh"
#include "tests/cuda/quant_x8_hw.h"

extern "C" int dsv4_test_quant_x8(const dsv4_test_qx8_in *in, uint8_t *xq, float *xs, uint8_t *xp, float *xs8)
{
    using namespace dsv4cuda;
    const int T = in->T, H = in->H, E = in->E, K = in->K, ng = (H + 127) / 128;
    if (T < 1 || in->ntok < 0 || in->ntok > T || H < 4 || H % 4 || E < 1 || K < 1 || in->rows < 0)
        return (int)cudaErrorInvalidValue;
    const size_t nx = (size_t)T * H, ns = (size_t)T * ng, np = (size_t)in->rows * H + 1,
                 n8 = ((size_t)in->rows + T) * ng;
    DevArena ar;
    QuantX8Args a = QuantX8Args();
    a.x = ar.copy(in->x, nx);
    a.ntok = ar.copy(&in->ntok, 1);
    a.ids = ar.copy(in->ids, (size_t)T * K);
    a.rowmap = ar.copy(in->rowmap, (size_t)T * K);
    a.cnt = ar.copy(in->cnt, (size_t)E);
    a.pad_off = ar.copy(in->pad_off, (size_t)E);
    a.ok = in->ok ? ar.copy(in->ok, (size_t)E + 1) : nullptr;
    a.xq = ar.copy(in->xq_in, nx);
    a.xs = ar.copy(in->xs_in, ns);
    a.x16 = nullptr;
    a.xp = ar.get<uint8_t>(np);
    a.xs8 = ar.get<float>(n8);
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    a.sh_row0 = in->rows, a.H = H, a.E = E, a.K = K, a.qmode = in->qmode;
    a.has_shared = in->has_shared, a.min_rows = in->min_rows, a.small_max = in->small_max;
    cudaError_t e;
    if ((e = cudaMemset(a.xp, 0xA5, np)) != cudaSuccess || (e = cudaMemset(a.xs8, 0xA5, n8 * 4)) != cudaSuccess ||
        (e = launch_quant_x8(a, (unsigned)T, 0, false)) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
        (e = dev_take(xq, a.xq, nx)) != cudaSuccess || (e = dev_take(xs, a.xs, ns)) != cudaSuccess ||
        (e = dev_take(xp, a.xp, np - 1)) != cudaSuccess || (e = dev_take(xs8, a.xs8, n8)) != cudaSuccess)
        return (int)e;
    return 0;
}
