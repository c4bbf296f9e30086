/*
 * The backend interface (dsv4moe/backend.h): dispatch on the plan's backend
 * kind, and the "ref" implementation, a thin wrapper of dsv4_ref.
 */
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/backend.h"
#include "dsv4moe/ref.h"
#include "backend_impl.h"
#include "err.h"

/* ---------------- ref ---------------- */

typedef struct {
    dsv4_ref *ref;
    dsv4_backend_stats stats;
} ref_impl;

static dsv4_status ref_forward(void *p, int64_t T, const uint16_t *x, const int32_t *ids, dsv4_forward_out *out,
                               dsv4_error *err)
{
    ref_impl *r = p;
    dsv4_ref_output ro;
    memset(&ro, 0, sizeof ro);
    ro.y = out->y;
    ro.topk_ids = out->topk_ids;
    ro.topk_weights = out->topk_weights;
    ro.kept_counts = out->kept_counts;
    dsv4_status st = dsv4_ref_forward(r->ref, T, x, ids, &ro, err);
    if (st)
        return st;
    r->stats.forwards++;
    r->stats.tokens += (uint64_t)T;
    /* launches and empty_skips stay 0: the reference does not report its groups. */
    r->stats.nonfinite_rows += (uint64_t)ro.stats.nonfinite_rows;
    r->stats.routed_g_clamped += ro.stats.routed_g_clamped;
    r->stats.routed_u_clamped += ro.stats.routed_u_clamped;
    r->stats.shared_g_clamped += ro.stats.shared_g_clamped;
    r->stats.shared_u_clamped += ro.stats.shared_u_clamped;
    return DSV4_OK;
}

static dsv4_backend_stats ref_stats(const void *p) { return ((const ref_impl *)p)->stats; }

static void ref_free(void *p)
{
    ref_impl *r = p;
    if (!r)
        return;
    dsv4_ref_free(r->ref);
    free(r);
}

static const dsv4_backend_vtable ref_vtable = {"ref", ref_forward, ref_stats, ref_free, NULL};

static dsv4_status ref_create(const dsv4_plan *plan, const dsv4_checkpoint *ck, int threads, void **impl,
                              dsv4_error *err)
{
    ref_impl *r = calloc(1, sizeof *r);
    if (!r)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "backend ref", "out of memory");
    dsv4_status st = dsv4_ref_create(dsv4_plan_config(plan), ck, threads, &r->ref, err);
    if (st) {
        free(r);
        return st;
    }
    r->stats.workspace_planned = dsv4_plan_workspace_max(plan);
    *impl = r;
    return DSV4_OK;
}

/* ---------------- dispatch ---------------- */

#ifdef DSV4_WITH_CUDA
#define DSV4_BACKENDS_EXTRA ", cuda"
#else
#define DSV4_BACKENDS_EXTRA ""
#endif

const char *dsv4_backends_available(void) { return "ref, cpu" DSV4_BACKENDS_EXTRA; }

bool dsv4_backend_available(dsv4_backend_kind kind)
{
#ifdef DSV4_WITH_CUDA
    if (kind == DSV4_BACKEND_CUDA)
        return true;
#endif
    return kind == DSV4_BACKEND_REF || kind == DSV4_BACKEND_CPU;
}

dsv4_status dsv4_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ckpt, int threads,
                                dsv4_backend **out, dsv4_error *err)
{
    if (!plan || !ckpt || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend", "plan, checkpoint and output must not be NULL");
    *out = NULL;
    if (threads < 1 || threads > 256)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend", "threads %d is outside [1, 256]", threads);
    const dsv4_topology *topo = dsv4_plan_topology(plan);
    dsv4_backend *b = calloc(1, sizeof *b);
    if (!b)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "backend", "out of memory");
    b->max_tokens = topo->max_tokens_per_rank;
    dsv4_status st;
    switch (topo->backend) {
    case DSV4_BACKEND_REF:
        b->vt = &ref_vtable;
        st = ref_create(plan, ckpt, threads, &b->impl, err);
        break;
    case DSV4_BACKEND_CPU:
        st = dsv4_cpu_backend_create(plan, ckpt, threads, &b->impl, &b->vt, err);
        break;
#ifdef DSV4_WITH_CUDA
    case DSV4_BACKEND_CUDA:
        st = dsv4_cuda_backend_create(plan, ckpt, threads, &b->impl, &b->vt, err);
        break;
#endif
    default:
        st = dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend",
                         "backend %s is not available in this build (available: ref, cpu%s)",
                         dsv4_backend_kind_name(topo->backend), DSV4_BACKENDS_EXTRA);
        break;
    }
    if (st) {
        free(b);
        return st;
    }
    *out = b;
    return DSV4_OK;
}

void dsv4_backend_free(dsv4_backend *b)
{
    if (!b)
        return;
    if (b->vt && b->impl)
        b->vt->free(b->impl);
    free(b);
}

const char *dsv4_backend_name(const dsv4_backend *b) { return b && b->vt ? b->vt->name : "none"; }

dsv4_status dsv4_backend_forward(dsv4_backend *b, int64_t T, const uint16_t *x, const int32_t *input_ids,
                                 dsv4_forward_out *out, dsv4_error *err)
{
    if (!b || !out || !out->y || (T > 0 && !x))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend forward", "backend, x and out->y must not be NULL");
    if (T < 0 || T > b->max_tokens)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend forward",
                           "token count %lld is outside [0, max_tokens_per_rank = %lld]", (long long)T,
                           (long long)b->max_tokens);
    return b->vt->forward(b->impl, T, x, input_ids, out, err);
}

dsv4_status dsv4_backend_forward_device(dsv4_backend *b, int64_t T, const void *x, const int32_t *input_ids,
                                        const dsv4_forward_out *out, dsv4_error *err)
{
    if (!b || !out || !out->y || (T > 0 && !x))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend forward_device",
                           "backend, x and out->y must not be NULL");
    if (T < 0 || T > b->max_tokens)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend forward_device",
                           "token count %lld is outside [0, max_tokens_per_rank = %lld]", (long long)T,
                           (long long)b->max_tokens);
    if (!b->vt->forward_device)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend forward_device",
                           "backend %s holds no device tensors (only cuda does)", b->vt->name);
    return b->vt->forward_device(b->impl, T, x, input_ids, out, err);
}

dsv4_backend_stats dsv4_backend_get_stats(const dsv4_backend *b)
{
    dsv4_backend_stats s;
    memset(&s, 0, sizeof s);
    return b && b->vt ? b->vt->stats(b->impl) : s;
}
