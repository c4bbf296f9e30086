/*
 * The device sim communicator (include/dsv4moe/comm_devsim.h): each endpoint wraps an endpoint of
 * an inner `sim` world and stages the device buffers through pinned host memory on the rank's
 * stream. The generic layer (fast/comm/comm.c) keeps this endpoint's trace; the inner sim checks
 * the fingerprints and moves the data.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/comm_devsim.h"
#include "dsv4moe/dtype.h"
extern "C" {
#include "fast/comm/comm_impl.h"
#include "core/err.h"
}

namespace {

struct devsim_comm {
    dsv4_comm base; /* first: the generic layer's view */
    dsv4_comm *inner;
    cudaStream_t stream;
    int device;
    void *hs, *hr; /* pinned staging: send, receive */
    size_t ns, nr;
};

}  // namespace

struct dsv4_devsim_world {
    dsv4_sim_world *sim;
    int world;
    devsim_comm *ranks;
};

static devsim_comm *as_devsim(dsv4_comm *c) { return reinterpret_cast<devsim_comm *>(c); }

/* Poisons the inner world so that no peer waits for this rank. */
static void poison(devsim_comm *d, const char *reason)
{
    if (d->inner && d->inner->vt->abort)
        d->inner->vt->abort(d->inner, reason);
}

static dsv4_status cuda_fail(devsim_comm *d, const dsv4_coll_record *rec, const char *what, cudaError_t e,
                             dsv4_error *err)
{
    char desc[160], reason[256];
    dsv4_comm_describe(rec, desc, sizeof desc);
    snprintf(reason, sizeof reason, "rank %d: %s of %s failed: %s", d->base.rank, what, desc, cudaGetErrorString(e));
    poison(d, reason);
    return dsv4_seterr(err, DSV4_ERR_DEVICE, "devsim", "%s", reason);
}

/* Grows a pinned staging buffer to at least n bytes. */
static cudaError_t ensure(void **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return cudaSuccess;
    if (*p)
        cudaFreeHost(*p);
    *p = nullptr;
    *cap = 0;
    cudaError_t e = cudaMallocHost(p, n);
    if (e == cudaSuccess)
        *cap = n;
    else
        *p = nullptr;
    return e;
}

/* Device -> pinned host on the rank's stream (which also orders after the kernels that wrote src). */
static dsv4_status stage_in(devsim_comm *d, const dsv4_coll_record *rec, const void *src, size_t n, dsv4_error *err)
{
    cudaError_t e = cudaSetDevice(d->device);
    if (e != cudaSuccess)
        return cuda_fail(d, rec, "cudaSetDevice", e, err);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if ((e = cudaStreamIsCapturing(d->stream, &cs)) != cudaSuccess)
        return cuda_fail(d, rec, "cudaStreamIsCapturing", e, err);
    if (cs != cudaStreamCaptureStatusNone) {
        char desc[160], reason[256];
        dsv4_comm_describe(rec, desc, sizeof desc);
        snprintf(reason, sizeof reason, "rank %d: %s under graph capture: the device sim stages through the host",
                 d->base.rank, desc);
        poison(d, reason);
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "devsim", "%s", reason);
    }
    if ((e = ensure(&d->hs, &d->ns, n ? n : 1)) != cudaSuccess)
        return cuda_fail(d, rec, "cudaMallocHost", e, err);
    if (n && (e = cudaMemcpyAsync(d->hs, src, n, cudaMemcpyDeviceToHost, d->stream)) != cudaSuccess)
        return cuda_fail(d, rec, "cudaMemcpyAsync to the host", e, err);
    if ((e = cudaStreamSynchronize(d->stream)) != cudaSuccess)
        return cuda_fail(d, rec, "cudaStreamSynchronize", e, err);
    return DSV4_OK;
}

/* Pinned host -> device on the rank's stream, complete on return. After the collective: a failure
   here is this rank's alone (the peers have their data). */
static dsv4_status stage_out(devsim_comm *d, const dsv4_coll_record *rec, void *dst, const void *src, size_t n,
                             dsv4_error *err)
{
    cudaError_t e = cudaSuccess;
    if (n && (e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, d->stream)) != cudaSuccess)
        return cuda_fail(d, rec, "cudaMemcpyAsync to the device", e, err);
    if ((e = cudaStreamSynchronize(d->stream)) != cudaSuccess)
        return cuda_fail(d, rec, "cudaStreamSynchronize", e, err);
    return DSV4_OK;
}

static dsv4_status recv_buffer(devsim_comm *d, const dsv4_coll_record *rec, size_t n, dsv4_error *err)
{
    cudaError_t e = ensure(&d->hr, &d->nr, n ? n : 1);
    return e == cudaSuccess ? DSV4_OK : cuda_fail(d, rec, "cudaMallocHost", e, err);
}

static dsv4_status ds_all_reduce(dsv4_comm *comm, const dsv4_coll_record *rec, void *buf, dsv4_error *err)
{
    devsim_comm *d = as_devsim(comm);
    size_t n = (size_t)rec->count * dsv4_dtype_size(rec->dtype);
    dsv4_status st = stage_in(d, rec, buf, n, err);
    if (st || (st = dsv4_comm_all_reduce(d->inner, rec->group, rec->dtype, d->hs, rec->count, rec->tag, err)))
        return st;
    return stage_out(d, rec, buf, d->hs, n, err); /* summed in place in the staging buffer */
}

static dsv4_status ds_all_gather(dsv4_comm *comm, const dsv4_coll_record *rec, const void *send, void *recv,
                                 dsv4_error *err)
{
    devsim_comm *d = as_devsim(comm);
    size_t n = (size_t)rec->count * dsv4_dtype_size(rec->dtype);
    size_t total = n * (size_t)comm->group_size[rec->group];
    dsv4_status st = stage_in(d, rec, send, n, err);
    if (!st)
        st = recv_buffer(d, rec, total, err);
    if (st)
        return st;
    if ((st = dsv4_comm_all_gather(d->inner, rec->group, rec->dtype, d->hs, rec->count, d->hr, rec->tag, err)))
        return st;
    return stage_out(d, rec, recv, d->hr, total, err);
}

static dsv4_status ds_all_to_allv(dsv4_comm *comm, const dsv4_coll_record *rec, const void *send,
                                  const uint64_t *send_counts, void *recv, const uint64_t *recv_counts,
                                  dsv4_error *err)
{
    devsim_comm *d = as_devsim(comm);
    size_t dsz = dsv4_dtype_size(rec->dtype), ns = 0, nr = 0;
    for (int j = 0; j < comm->group_size[rec->group]; j++) {
        ns += (size_t)send_counts[j];
        nr += (size_t)recv_counts[j];
    }
    dsv4_status st = stage_in(d, rec, send, ns * dsz, err);
    if (!st)
        st = recv_buffer(d, rec, nr * dsz, err);
    if (st)
        return st;
    if ((st = dsv4_comm_all_to_allv(d->inner, rec->group, rec->dtype, d->hs, send_counts, d->hr, recv_counts,
                                    rec->tag, err)))
        return st;
    return stage_out(d, rec, recv, d->hr, nr * dsz, err);
}

static dsv4_status ds_barrier(dsv4_comm *comm, const dsv4_coll_record *rec, dsv4_error *err)
{
    devsim_comm *d = as_devsim(comm);
    dsv4_status st = stage_in(d, rec, nullptr, 0, err); /* the rank's stream is done */
    return st ? st : dsv4_comm_barrier(d->inner, rec->group, rec->tag, err);
}

static void ds_abort(dsv4_comm *comm, const char *reason) { poison(as_devsim(comm), reason); }

static const dsv4_comm_vtable devsim_vtable = {"devsim", ds_all_reduce, ds_all_gather, ds_all_to_allv, ds_barrier,
                                               ds_abort};

extern "C" void dsv4_devsim_options_init(dsv4_devsim_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->struct_size = (uint32_t)sizeof *o;
    o->timeout_ms = 5000;
    o->device = 0;
}

extern "C" void dsv4_devsim_world_free(dsv4_devsim_world *w)
{
    if (!w)
        return;
    for (int r = 0; w->ranks && r < w->world; r++) {
        devsim_comm *d = &w->ranks[r];
        if (d->hs)
            cudaFreeHost(d->hs);
        if (d->hr)
            cudaFreeHost(d->hr);
        dsv4_comm_base_fini(&d->base);
    }
    free(w->ranks);
    dsv4_sim_world_free(w->sim);
    free(w);
}

extern "C" dsv4_status dsv4_devsim_world_create(const dsv4_comm_groups *groups, const dsv4_devsim_options *opt,
                                                dsv4_devsim_world **out, dsv4_error *err)
{
    static const char fn[] = "dsv4_devsim_world_create";
    if (!groups || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "groups and out must not be NULL");
    *out = nullptr;
    dsv4_devsim_options o;
    dsv4_devsim_options_init(&o);
    if (opt) {
        if (opt->struct_size != sizeof o)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, fn, "options struct_size %u is not %zu",
                               (unsigned)opt->struct_size, sizeof o);
        o = *opt;
    }
    cudaError_t e = cudaSetDevice(o.device);
    if (e != cudaSuccess)
        return dsv4_seterr(err, DSV4_ERR_DEVICE, fn, "cudaSetDevice(%d) failed: %s", o.device, cudaGetErrorString(e));
    dsv4_devsim_world *w = static_cast<dsv4_devsim_world *>(calloc(1, sizeof *w));
    if (!w)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, fn, "out of memory");
    dsv4_sim_options so;
    dsv4_sim_options_init(&so);
    so.timeout_ms = o.timeout_ms;
    dsv4_status st = dsv4_sim_world_create(groups, &so, &w->sim, err);
    if (st) {
        free(w);
        return st;
    }
    w->world = groups->world;
    w->ranks = static_cast<devsim_comm *>(calloc((size_t)w->world, sizeof *w->ranks));
    if (!w->ranks) {
        dsv4_devsim_world_free(w);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, fn, "out of memory for %d ranks", groups->world);
    }
    for (int r = 0; r < w->world; r++) {
        devsim_comm *d = &w->ranks[r];
        dsv4_comm_base_init(&d->base, &devsim_vtable, r);
        d->inner = dsv4_sim_world_comm(w->sim, r);
        d->device = o.device;
        d->stream = nullptr;
        for (int g = 0; g < DSV4_GROUP_COUNT; g++) {
            d->base.group_rank[g] = d->inner->group_rank[g];
            d->base.group_size[g] = d->inner->group_size[g];
        }
    }
    *out = w;
    return DSV4_OK;
}

extern "C" dsv4_comm *dsv4_devsim_world_comm(dsv4_devsim_world *w, int rank)
{
    return w && rank >= 0 && rank < w->world ? &w->ranks[rank].base : nullptr;
}

extern "C" dsv4_status dsv4_devsim_set_stream(dsv4_comm *comm, void *stream, dsv4_error *err)
{
    if (!comm || comm->vt != &devsim_vtable)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "dsv4_devsim_set_stream", "the comm is not a devsim endpoint");
    as_devsim(comm)->stream = static_cast<cudaStream_t>(stream);
    return DSV4_OK;
}
