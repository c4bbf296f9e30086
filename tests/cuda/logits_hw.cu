/*
 * Device half of test_cuda's logits_small_kernel and logits_blas_call tests (logits_hw.h):
 * k_logits_small through its launcher in each of its variants, and the cuBLASLt logits twice, on
 * the caller's inputs, the logits copied back. Test code: linked into build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>

#include "fast/cuda/logits_blas.cuh"
#include "fast/cuda/logits_small.cuh"
#include "tests/cuda/dev_arena.cuh"
#include "tests/cuda/logits_hw.h"

extern "C" int dsv4_test_logits_small(int T, int E, int H, const uint16_t *x, const uint16_t *gate, float *out[4],
                                      int *fits)
{
    using namespace dsv4cuda;
    if (T < 1 || T > DSV4C_LOGITS_SMALL || E < 1 || H < 8 || H % 8)
        return (int)cudaErrorInvalidValue;
    *fits = logits_loop_fits(H) ? 1 : 0;
    DevArena ar;
    const uint16_t *dx = ar.copy(x, (size_t)T * H), *dg = ar.copy(gate, (size_t)E * H);
    const int *ntok = ar.copy(&T, 1);
    float *lg = ar.get<float>((size_t)T * E);
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    LogitsArgs la = LogitsArgs();
    la.x = dx, la.gate = dg, la.ntok = ntok, la.logits = lg;
    la.xq = nullptr, la.xs = nullptr, la.x16 = nullptr, la.ticket = nullptr; /* no quantizing blocks */
    la.qmode = 0, la.H = H, la.E = E, la.lblocks = (E + LS_EPB - 1) / LS_EPB, la.tgroups = 1;
    for (int v = 0; v < 4; v++) {
        cudaError_t e;
        const bool loop = (v & 2) && *fits;
        if ((e = cudaMemset(lg, 0xFF, sizeof(float) * (size_t)T * E)) != cudaSuccess ||
            (e = launch_logits_small(la, v & 1 ? 4 : 1, loop, (unsigned)la.lblocks, 0, false)) != cudaSuccess ||
            (e = cudaDeviceSynchronize()) != cudaSuccess || (e = dev_take(out[v], lg, (size_t)T * E)) != cudaSuccess)
            return (int)e;
    }
    return 0;
}

extern "C" int dsv4_test_logits_blas(int T, int E, int H, const uint16_t *x, const uint16_t *gate, float *out,
                                     float *again, int *refused, char *why, int why_len)
{
    using namespace dsv4cuda;
    if (T < 1 || E < 1 || H < 1 || why_len < 1)
        return (int)cudaErrorInvalidValue;
    DevArena ar;
    const uint16_t *dx = ar.copy(x, (size_t)T * H), *dg = ar.copy(gate, (size_t)E * H);
    float *lg = ar.get<float>((size_t)T * E);
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    LogitsBlas *g = nullptr;
    cudaError_t e = logits_blas_create(&g, E, H, T, why, (size_t)why_len);
    if (e != cudaSuccess)
        return (int)e;
    float *dst[2] = {out, again};
    for (int i = 0; i < 2 && e == cudaSuccess; i++)
        if ((e = cudaMemset(lg, 0xFF, sizeof(float) * (size_t)T * E)) != cudaSuccess ||
            (e = logits_blas_enqueue(g, dx, dg, lg, T, 0)) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
            (e = dev_take(dst[i], lg, (size_t)T * E)) != cudaSuccess)
            break;
    *refused = (int)logits_blas_enqueue(g, dx, dg, lg, 0, 0);
    logits_blas_free(g);
    return (int)e;
}
