/*
 * Device half of test_cuda's quant8_kernel test (quant8_hw.h): k_quant8 through its launcher on the
 * caller's chunk, every output copied back, and each row's h by the device's SwiGLU for the
 * expected codes. Test code: linked into build/cuda/test_cuda only.
 */
#include <cuda_runtime.h>

#include "fast/cuda/quant8.cuh"
#include "tests/cuda/dev_arena.cuh"
#include "tests/cuda/quant8_hw.h"

namespace {

/* h_ref: row r's bf16 h from its g and u as k_quant8 makes it (swiglu_h, then the weight, then one
   bf16 rounding), one thread an element. */
__global__ void k_swiglu_ref(const uint16_t *gu8, const float *row_w, const uint8_t *row_clamp, float L, int I,
                             long long n, uint16_t *out)
{
    using namespace dsv4cuda;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const long long r = i / I;
    const int k = (int)(i % I);
    unsigned gc = 0, uc = 0;
    const uint16_t *gr = gu8 + r * 2 * I;
    float hv = swiglu_h(bf16f(gr[k]), bf16f(gr[I + k]), row_clamp[r] && L > 0.0f, L, gc, uc);
    if (row_w[r] != 1.0f)
        hv = __fmul_rn(hv, row_w[r]);
    out[i] = f2bf16(hv);
}

} // namespace

extern "C" int dsv4_test_quant8(const dsv4_test_q8_in *in, const float *row_w, const uint8_t *row_clamp, uint8_t *q,
                                float *s, float *s8, uint16_t *h, uint16_t *h_ref, unsigned long long clamps[4])
{
    using namespace dsv4cuda;
    const int I = in->I, ng = I / 128;
    if (I < 128 || I % 128 || in->hrows < 1 || in->E < 1 || in->slots < 0 || in->kept < 0 || in->kept > in->slots ||
        in->Tc < 0 || in->ntok < 0 || in->ntok > in->Tc)
        return (int)cudaErrorInvalidValue;
    const size_t hr = (size_t)in->hrows, nh = hr * I, ns = hr * ng, sl = (size_t)in->slots + 1;
    const int meta[4] = {0, 0, in->kept, 0};
    DevArena ar;
    Quant8Args a = Quant8Args();
    a.sel.slot_row = ar.copy(in->slot_row, sl);
    a.sel.slot_tok = ar.copy(in->slot_tok, sl);
    a.sel.slot_e = ar.copy(in->slot_e, sl);
    a.sel.cnt = ar.copy(in->cnt, (size_t)in->E);
    a.sel.pad_off = ar.copy(in->pad_off, (size_t)in->E);
    a.sel.meta = ar.copy(meta, 4);
    a.sel.ntok = ar.copy(&in->ntok, 1);
    a.sel.ok = ar.copy(in->ok, (size_t)in->E + 1);
    a.sel.sh_row0 = in->sh_row0, a.sel.E = in->E, a.sel.slots = in->slots, a.sel.has_shared = in->has_shared;
    a.sel.min_rows = in->min_rows;
    a.h = ar.copy(in->h_in, nh);
    a.gu8 = ar.copy(in->gu8, 2 * nh);
    a.q = ar.get<uint8_t>(nh);
    a.s = ar.get<float>(ns);
    a.s8 = ar.get<float>(ns);
    a.slot_w = ar.copy(in->slot_w, sl);
    a.stats = ar.get<unsigned long long>(ST_N);
    const float *rw = ar.copy(row_w, hr);
    const uint8_t *rc = ar.copy(row_clamp, hr);
    uint16_t *ref = ar.get<uint16_t>(nh);
    if (ar.err != cudaSuccess)
        return (int)ar.err;
    a.I = I, a.qmode = in->qmode, a.f16_codes = in->f16_codes, a.before = in->before;
    a.clamp_r = in->clamp_r, a.clamp_s = in->clamp_s, a.L = in->L;
    const unsigned rows = (unsigned)(in->slots + (in->has_shared ? in->Tc : 0));
    unsigned long long st[ST_N];
    cudaError_t e;
    if ((e = cudaMemset(a.q, 0xA5, nh)) != cudaSuccess || (e = cudaMemset(a.s, 0xA5, ns * 4)) != cudaSuccess ||
        (e = cudaMemset(a.s8, 0xA5, ns * 4)) != cudaSuccess ||
        (e = launch_quant8(a, rows, in->skip_direct != 0, in->lean != 0, 0, false)) != cudaSuccess)
        return (int)e;
    k_swiglu_ref<<<(unsigned)((nh + 255) / 256), 256>>>(a.gu8, rw, rc, in->L, I, (long long)nh, ref);
    if ((e = cudaPeekAtLastError()) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
        (e = dev_take(q, a.q, nh)) != cudaSuccess || (e = dev_take(s, a.s, ns)) != cudaSuccess ||
        (e = dev_take(s8, a.s8, ns)) != cudaSuccess || (e = dev_take(h, a.h, nh)) != cudaSuccess ||
        (e = dev_take(h_ref, (const uint16_t *)ref, nh)) != cudaSuccess ||
        (e = dev_take(st, (const unsigned long long *)a.stats, (size_t)ST_N)) != cudaSuccess)
        return (int)e;
    for (int i = 0; i < 4; i++)
        clamps[i] = st[ST_RG + i];
    return 0;
}
