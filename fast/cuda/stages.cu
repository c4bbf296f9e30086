/*
 * The CUDA backend's stages (fast/backend/backend_impl.h) for a rank of a sharded plan, driven by
 * fast/multirank. Each stage call is one chunk of the backend's own pipeline in its workspace
 * (cuda_impl.h), so every row is computed by the forward's kernels in the forward's regime:
 *
 *   route    the chunk's router (logits GEMM, k_router): ids, weights, kept;
 *   experts  a chunk whose rows are the given token-slots, the router's choice replaced after it
 *            ran by one kept slot per row (the row's expert, the others the sentinel E) or, for
 *            the shared expert, by none: grouping, gate/up, SwiGLU, down as in the forward (a
 *            group's regime follows its row count, so an expert's group of a step's slots gives
 *            the same rows on the rank holding it as on one rank holding every expert); the rows'
 *            bf16 outputs come back widened to fp32;
 *   combine  the forward's k_combine over each token's slots in the order given.
 *
 * The kernels round each expert output to bf16 in their epilogue, so experts returns those values
 * (exact in fp32): with tp = 1 the driver's rounding gives them back unchanged. Under tp a rank's
 * weights are its inter range (sliced at creation) and its kernels run a layer of that many inter
 * rows, so experts returns each row's partial down projection over the range, rounded to bf16 by
 * the epilogue; the driver sums the ranks' partials in fp32 (its tp all_reduce) and rounds once
 * more. That is one bf16 rounding per partial more than the reference's fp32 partials: tp on cuda
 * is held to the tolerance, not to bit identity (ep with tp 1 stays bit-identical).
 */
#include <algorithm>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/comm_devsim.h"
extern "C" {
#include "dsv4moe/formats.h"
#include "dsv4moe/weights.h"
#include "fast/backend/backend_impl.h"
#include "fast/cuda/cuda_entry.h"
#include "core/err.h"
}
#include "core/bits.h"
#include "fast/cuda/cuda_impl.h"

using namespace dsv4cuda;

namespace {

/* dst row q = src row idx[q * stride] (idx NULL: row q), bf16 rows of H. One block per row. */
__global__ void k_rows(const uint16_t *src, const int32_t *idx, int stride, int H, uint16_t *dst)
{
    const long long q = blockIdx.x, r = idx ? (long long)idx[q * stride] : q;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        dst[q * H + i] = src[r * H + i];
}

/* core/formats.c's dsv4_f32_to_bf16 (core/bits.h: one copy for host and device). */
__device__ __forceinline__ uint16_t to_bf16(float x) { return dsv4_bf16_bits(x); }

/* dst row (idx ? idx[q] : q) = bf16(src row q), src fp32. One block per row. */
__global__ void k_round(const float *src, const int32_t *idx, int H, uint16_t *dst)
{
    const long long q = blockIdx.x, r = idx ? (long long)idx[q] : q;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        dst[r * H + i] = to_bf16(src[q * H + i]);
}

__global__ void k_widen(const uint16_t *src, long long n, float *dst)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

/* Whether p is device memory (device or managed): the stages take host or device rows. */
bool on_device(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

dsv4_status cuda_fail(cudaError_t e, const char *where, const char *what, dsv4_error *err)
{
    (void)cudaGetLastError();
    return dsv4_seterr(err, DSV4_ERR_DEVICE, where, "%s failed: %s (%s)", what, cudaGetErrorString(e),
                       cudaGetErrorName(e));
}

#define CU(call, what)                                                                                      \
    do {                                                                                                    \
        cudaError_t ce_ = (call);                                                                           \
        if (ce_ != cudaSuccess)                                                                             \
            return cuda_fail(ce_, where, what, err);                                                        \
    } while (0)

/* The mirror's [from, to) to the device. */
cudaError_t to_device(const StageChunk &c, uint64_t from, uint64_t to)
{
    return cudaMemcpyAsync(c.ws + from, c.hio + from, (size_t)(to - from), cudaMemcpyHostToDevice, c.stream);
}

/* The device's [from, to) back into the mirror, and the wait. */
cudaError_t to_host(const StageChunk &c, uint64_t from, uint64_t to)
{
    cudaError_t e = cudaMemcpyAsync(c.hio + from, c.ws + from, (size_t)(to - from), cudaMemcpyDeviceToHost, c.stream);
    return e == cudaSuccess ? cudaStreamSynchronize(c.stream) : e;
}

dsv4_status cu_route(void *p, int64_t n, const uint16_t *x, const int32_t *in_ids, int32_t *ids, float *w,
                     int32_t *kept, dsv4_error *err)
{
    static const char where[] = "cuda route";
    const dsv4_config *c = stage_config(p);
    const int64_t H = c->dim, K = c->n_activated;
    const bool hash = dsv4_config_is_hash_layer(c);
    if (n < 0)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where, "%lld tokens", (long long)n);
    if (n > 0 && hash && !in_ids)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where, "layer %lld is a hash layer: input_ids are required",
                           (long long)c->layer);
    StageChunk ch;
    dsv4_status st = DSV4_OK;
    if (n == 0 || (st = stage_chunk(p, n, -1, &ch, err))) /* no tokens: nothing to do */
        return st;
    if (hash)
        memcpy(ch.hio + ch.in_ids, in_ids, (size_t)n * 4);
    const uint64_t kept_end = ch.kept + (uint64_t)n * 4;
    CU(to_device(ch, 0, ch.x), "the copy of the chunk's head");
    CU(cudaMemcpyAsync(ch.ws + ch.x, x, (size_t)(n * H) * 2, cudaMemcpyDefault, ch.stream), "the copy of the tokens");
    CU(stage_enqueue(p, ch, CHUNK_ROUTE), "the router's launch");
    CU(to_host(ch, ch.stats, kept_end), "the router's outputs");
    if ((st = stage_done(p, ch, STAGE_ROUTE, err)))
        return st;
    memcpy(ids, ch.hio + ch.ids, (size_t)(n * K) * 4);
    memcpy(w, ch.hio + ch.w, (size_t)(n * K) * 4);
    if (kept)
        memcpy(kept, ch.hio + ch.kept, (size_t)n * 4);
    return DSV4_OK;
}

/* The rows' expert ids: all the shared expert, or ascending runs inside the bound range. */
dsv4_status check_rows(const void *p, int64_t m, const int32_t *expert, const float *w, bool *shared,
                       dsv4_error *err)
{
    const dsv4_config *c = stage_config(p);
    int64_t first, count;
    stage_experts(p, &first, &count);
    *shared = m > 0 && expert[0] == DSV4_SHARED_EXPERT;
    if (*shared && (c->n_shared_experts == 0 || w))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cuda experts",
                           "the shared expert rows need a layer with a shared expert and no router weights");
    if (!*shared && m > 0 && !w)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cuda experts", "routed rows need their router weights");
    for (int64_t q = 0; q < m; q++) {
        const int32_t e = expert[q];
        const bool ok = *shared ? e == DSV4_SHARED_EXPERT : e >= first && e < first + count && (q == 0 || e >= expert[q - 1]);
        if (!ok)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "cuda experts",
                               "row %lld names expert %d: rows must be all shared or ascending in [%lld, %lld)",
                               (long long)q, e, (long long)first, (long long)(first + count));
    }
    return DSV4_OK;
}

dsv4_status cu_experts(void *p, int64_t m, const uint16_t *x, const int32_t *expert, const float *w, int64_t i0,
                       int64_t ni, float *out, dsv4_error *err)
{
    static const char where[] = "cuda experts";
    const dsv4_config *c = stage_config(p);
    const int64_t H = c->dim, K = c->n_activated, E = c->n_routed_experts;
    int64_t if0, ifn;
    stage_inter(p, &if0, &ifn);
    if (i0 != if0 || ni != ifn)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where,
                           "inter rows [%lld, %lld) are not the [%lld, %lld) this rank's plan bound", (long long)i0,
                           (long long)(i0 + ni), (long long)if0, (long long)(if0 + ifn));
    if (m < 0)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where, "%lld rows", (long long)m);
    bool shared;
    dsv4_status st = check_rows(p, m, expert, w, &shared, err);
    if (st || m == 0)
        return st;
    /* The decode regime splits K by the launch's group count, min(slots, E) (+ the shared expert):
       the rows are padded with zero rows of no routed slot to E slots at least, so that count is E
       for any set of groups and any chunk holding them (a replay's bucket too); the shared expert's
       call likewise (its K split follows that count where it shares the routed experts' format). */
    const int64_t mp = m * K >= E ? m : (E + K - 1) / K;
    StageChunk ch;
    if ((st = stage_chunk(p, mp, shared ? 0 : m, &ch, err)))
        return st;
    int32_t *hid = (int32_t *)(void *)(ch.hio + ch.ids);
    float *hw = (float *)(void *)(ch.hio + ch.w);
    for (int64_t q = 0; q < ch.tc; q++) /* every row of the layout (a replay's bucket may hold more) */
        for (int64_t k = 0; k < K; k++) {
            const bool slot = !shared && k == 0 && q < m;
            hid[q * K + k] = slot ? expert[q] : (int32_t)E;
            hw[q * K + k] = slot ? w[q] : 0.0f;
        }
    const uint64_t rows_end = ch.x + (uint64_t)(m * H) * 2;
    uint16_t *wx = (uint16_t *)(void *)(ch.ws + ch.x);
    /* the head (row count, counters) from the mirror, the rows from the caller (host or device);
       the slots are copied from the mirror by the enqueue, after the router */
    CU(to_device(ch, 0, ch.x), "the copy of the chunk's head");
    CU(cudaMemcpyAsync(wx, x, (size_t)(m * H) * 2, cudaMemcpyDefault, ch.stream), "the copy of the rows");
    if (mp > m)
        CU(cudaMemsetAsync(wx + m * H, 0, (size_t)((mp - m) * H) * 2, ch.stream), "the padding rows");
    CU(stage_enqueue(p, ch, CHUNK_SLOTS), "the experts' launches");
    if (shared && !ch.osh)
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, where, "the layer's chunk has no shared rows");
    k_rows<<<(unsigned)m, 256, 0, ch.stream>>>((const uint16_t *)(void *)(ch.ws + (shared ? ch.osh : ch.o)),
                                               shared ? nullptr : (const int32_t *)(void *)(ch.ws + ch.rowmap), (int)K,
                                               (int)H, wx);
    CU(cudaPeekAtLastError(), "the outputs' gather");
    const bool dev = on_device(out);
    if (dev) {
        k_widen<<<(unsigned)std::min<int64_t>(4096, (m * H + 255) / 256), 256, 0, ch.stream>>>(wx, m * H, out);
        CU(cudaPeekAtLastError(), "the outputs' widening");
    }
    CU(to_host(ch, ch.stats, dev ? ch.x : rows_end), "the experts' outputs");
    if ((st = stage_done(p, ch, shared ? STAGE_SHARED : STAGE_ROUTED, err)))
        return st;
    if (!dev) {
        const uint16_t *o = (const uint16_t *)(void *)(ch.hio + ch.x);
        for (int64_t i = 0; i < m * H; i++)
            out[i] = dsv4_bf16_to_f32(o[i]);
    }
    return DSV4_OK;
}

dsv4_status cu_combine(void *p, int64_t n, int64_t ns, const int32_t *tok, const float *w, const uint16_t *o,
                       const uint16_t *shared, uint16_t *y, dsv4_error *err)
{
    static const char where[] = "cuda combine";
    const dsv4_config *c = stage_config(p);
    const int64_t H = c->dim, K = c->n_activated, E = c->n_routed_experts;
    if (n < 0 || ns < 0 || ns > n * K)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where, "%lld tokens and %lld slots outside [0, tokens x K]",
                           (long long)n, (long long)ns);
    if (shared && c->n_shared_experts == 0)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where, "shared rows given for a layer without a shared expert");
    StageChunk ch;
    dsv4_status st = DSV4_OK;
    if (n == 0 || (st = stage_chunk(p, n, -1, &ch, err))) /* no tokens: nothing to do */
        return st;
    if (ns > ch.rows) /* the layout holds tc K rows of o (layout_for): never copy past them */
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, where, "%lld slots of %lld tokens above the chunk's %lld rows",
                           (long long)ns, (long long)n, (long long)ch.rows);
    /* token t's j-th slot in the order given: id j (k_combine sums ascending ids), row s of o */
    int32_t *hid = (int32_t *)(void *)(ch.hio + ch.ids);
    float *hw = (float *)(void *)(ch.hio + ch.w);
    int32_t *rowmap = (int32_t *)calloc((size_t)(n * K), sizeof *rowmap);
    int32_t *fill = (int32_t *)calloc((size_t)n, sizeof *fill);
    if (!rowmap || !fill) {
        free(rowmap);
        free(fill);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, where, "out of memory for %lld tokens", (long long)n);
    }
    for (int64_t i = 0; i < n * K; i++) {
        hid[i] = (int32_t)E;
        hw[i] = 0.0f;
    }
    for (int64_t s = 0; s < ns && !st; s++) {
        const int32_t t = tok[s];
        if (t < 0 || t >= n || fill[t] >= K) {
            st = dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where, "slot %lld names token %d: outside [0, %lld) or its %lldth slot",
                             (long long)s, t, (long long)n, (long long)K + 1);
            break;
        }
        const int64_t j = (int64_t)t * K + fill[t];
        hid[j] = fill[t]++;
        hw[j] = w[s];
        rowmap[j] = (int32_t)s;
    }
    free(fill);
    /* the head and the slots from the mirror, the rows (host or device) from the caller */
    cudaError_t e = st ? cudaSuccess : to_device(ch, 0, ch.x);
    if (!st && e == cudaSuccess)
        e = to_device(ch, ch.ids, ch.w + (uint64_t)ch.slots * 4);
    if (!st && e == cudaSuccess)
        e = cudaMemcpyAsync(ch.ws + ch.rowmap, rowmap, (size_t)(n * K) * 4, cudaMemcpyHostToDevice, ch.stream);
    if (!st && e == cudaSuccess && ns)
        e = cudaMemcpyAsync(ch.ws + ch.o, o, (size_t)(ns * H) * 2, cudaMemcpyDefault, ch.stream);
    if (!st && e == cudaSuccess && shared)
        e = cudaMemcpyAsync(ch.ws + ch.osh, shared, (size_t)(n * H) * 2, cudaMemcpyDefault, ch.stream);
    if (!st && e == cudaSuccess)
        e = stage_combine(p, ch, shared != nullptr);
    if (!st && e == cudaSuccess)
        e = cudaMemcpyAsync(y, ch.ws + ch.x, (size_t)(n * H) * 2, cudaMemcpyDefault, ch.stream);
    if (!st && e == cudaSuccess)
        e = cudaStreamSynchronize(ch.stream);
    free(rowmap); /* the pageable copies above completed before the wait returned */
    if (st)
        return st;
    if (e != cudaSuccess)
        return cuda_fail(e, where, "the combine", err);
    return DSV4_OK;
}

/* ---------------- device residency (backend_impl.h: dsv4_backend_device) ---------------- */

/* Every call waits for its own work (the legacy stream: the backend's streams were synchronised
   by the stage calls before it). */

void *dv_alloc(void *, size_t bytes)
{
    void *d = nullptr;
    if (cudaMalloc(&d, bytes ? bytes : 256) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    return d;
}

void dv_release(void *, void *d)
{
    if (d)
        cudaFree(d);
}

dsv4_status dv_copy(void *, void *dst, const void *src, size_t bytes, dsv4_error *err)
{
    static const char where[] = "cuda device copy";
    if (bytes)
        CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
    return DSV4_OK;
}

/* Launches k_rows or k_round over n rows with the host index array idx (NULL: identity). */
dsv4_status dv_rows(int64_t n, int64_t H, const void *src, const int32_t *idx, uint16_t *dst, bool round,
                    dsv4_error *err)
{
    static const char where[] = "cuda device rows";
    if (n <= 0)
        return DSV4_OK;
    int32_t *di = nullptr;
    if (idx) {
        CU(cudaMalloc((void **)&di, (size_t)n * 4), "cudaMalloc of the row index");
        cudaError_t e = cudaMemcpy(di, idx, (size_t)n * 4, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            cudaFree(di);
            return cuda_fail(e, where, "the row index's copy", err);
        }
    }
    if (round)
        k_round<<<(unsigned)n, 256>>>((const float *)src, di, (int)H, dst);
    else
        k_rows<<<(unsigned)n, 256>>>((const uint16_t *)src, di, 1, (int)H, dst);
    cudaError_t e = cudaPeekAtLastError();
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(0);
    cudaFree(di);
    return e == cudaSuccess ? DSV4_OK : cuda_fail(e, where, round ? "k_round" : "k_rows", err);
}

dsv4_status dv_gather(void *, int64_t n, int64_t H, const uint16_t *src, const int32_t *idx, uint16_t *dst,
                      dsv4_error *err)
{
    return dv_rows(n, H, src, idx, dst, false, err);
}

dsv4_status dv_round(void *, int64_t n, int64_t H, const float *src, const int32_t *idx, uint16_t *dst,
                     dsv4_error *err)
{
    return dv_rows(n, H, src, idx, dst, true, err);
}

dsv4_status dv_world_create(const dsv4_comm_groups *g, int timeout_ms, void **world, dsv4_error *err)
{
    dsv4_devsim_options o;
    dsv4_devsim_options_init(&o);
    o.timeout_ms = timeout_ms;
    if (cudaGetDevice(&o.device) != cudaSuccess) {
        (void)cudaGetLastError();
        o.device = 0;
    }
    dsv4_devsim_world *w = nullptr;
    dsv4_status st = dsv4_devsim_world_create(g, &o, &w, err);
    *world = w;
    return st;
}

dsv4_comm *dv_world_comm(void *w, int rank) { return dsv4_devsim_world_comm((dsv4_devsim_world *)w, rank); }

void dv_world_free(void *w) { dsv4_devsim_world_free((dsv4_devsim_world *)w); }

const dsv4_backend_device cuda_device = {dv_alloc,  dv_release,      dv_copy,      dv_gather,
                                         dv_round, dv_world_create, dv_world_comm, dv_world_free};

/* The step's graphs (dsv4_backend_stages.graphs): the experts calls' (cuda_impl.h, stage_graphs). */
dsv4_status cu_graphs(void *p, bool capture, bool replay, int64_t *held, dsv4_error *err)
{
    return stage_graphs(p, capture, replay, held, err);
}

} // namespace

int64_t dsv4cuda::stage_rows(const dsv4_config *cfg, const dsv4_topology *topo, int64_t tc)
{
    const int64_t K = cfg->n_activated, ep = topo->ep > 1 ? topo->ep : 1, El = cfg->n_routed_experts / ep;
    const int64_t kc = ep > 1 && !dsv4_config_is_hash_layer(cfg) && El < K ? El : K;
    const int64_t m = ep * tc * kc, pad = (cfg->n_routed_experts + K - 1) / K; /* cu_experts' padding */
    return m > tc ? (m > pad ? m : pad) : (tc > pad ? tc : pad);
}

extern "C" const dsv4_backend_stages dsv4_cuda_backend_stages = {cu_route, cu_experts, cu_combine, &cuda_device,
                                                                 cu_graphs};
