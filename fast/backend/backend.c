/*
 * The backend interface (dsv4moe/backend.h): dispatch through the registry
 * (fast/backend/registry.c), and the "ref" implementation, a thin wrapper of
 * dsv4_ref with its stages (dsv4_ref_stage_*).
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

static void add_clamps(dsv4_backend_stats *s, const dsv4_ref_stats *r)
{
    s->routed_g_clamped += r->routed_g_clamped;
    s->routed_u_clamped += r->routed_u_clamped;
    s->shared_g_clamped += r->shared_g_clamped;
    s->shared_u_clamped += r->shared_u_clamped;
}

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
    add_clamps(&r->stats, &ro.stats);
    return DSV4_OK;
}

static dsv4_status ref_route(void *p, int64_t n, const uint16_t *x, const int32_t *in_ids, int32_t *ids, float *w,
                             int32_t *kept, dsv4_error *err)
{
    ref_impl *r = p;
    dsv4_status st = dsv4_ref_stage_route(r->ref, n, x, in_ids, ids, w, kept, &r->stats.nonfinite_rows, err);
    if (!st) {
        r->stats.forwards++;
        r->stats.tokens += (uint64_t)n;
    }
    return st;
}

static dsv4_status ref_experts(void *p, int64_t m, const uint16_t *x, const int32_t *expert, const float *w,
                               int64_t i0, int64_t ni, float *out, dsv4_error *err)
{
    ref_impl *r = p;
    dsv4_ref_stats rs;
    memset(&rs, 0, sizeof rs);
    dsv4_status st = dsv4_ref_stage_experts(r->ref, m, x, expert, w, i0, ni, out, &rs, err);
    add_clamps(&r->stats, &rs);
    return st;
}

static dsv4_status ref_combine(void *p, int64_t n, int64_t ns, const int32_t *tok, const float *w, const uint16_t *o,
                               const uint16_t *shared, uint16_t *y, dsv4_error *err)
{
    return dsv4_ref_stage_combine(((ref_impl *)p)->ref, n, ns, tok, w, o, shared, y, err);
}

const dsv4_backend_stages dsv4_ref_backend_stages = {ref_route, ref_experts, ref_combine, NULL, NULL};

static dsv4_backend_stats ref_stats(const void *p) { return ((const ref_impl *)p)->stats; }

static void ref_free(void *p)
{
    ref_impl *r = p;
    if (!r)
        return;
    dsv4_ref_free(r->ref);
    free(r);
}

static const dsv4_backend_vtable ref_vtable = {"ref", ref_forward, ref_stats, ref_free, NULL, NULL, NULL};

dsv4_status dsv4_ref_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ck,
                                    const dsv4_backend_options *opt, void **impl, const dsv4_backend_vtable **vt,
                                    dsv4_error *err)
{
    int threads = opt->threads;
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
    *vt = &ref_vtable;
    return DSV4_OK;
}

/* ---------------- dispatch ---------------- */

void dsv4_backend_options_init(dsv4_backend_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = (uint32_t)sizeof *opt;
    opt->threads = 1;
    opt->cpu_kernels = DSV4_CPU_KERNELS_AUTO;
}

/* The registry knows what this build holds (registry.c); the text list follows the same flag. */
#ifdef DSV4_WITH_CUDA
#define DSV4_BACKENDS_BUILT "ref, cpu, cuda"
#else
#define DSV4_BACKENDS_BUILT "ref, cpu"
#endif
const char *dsv4_backends_available(void) { return DSV4_BACKENDS_BUILT; }

bool dsv4_backend_available(dsv4_backend_kind kind)
{
    dsv4_backend_info info;
    return dsv4_backend_info_of(kind, &info, NULL) == DSV4_OK && info.built;
}

dsv4_status dsv4_backend_create(const dsv4_plan *plan, const dsv4_checkpoint *ckpt, int threads,
                                dsv4_backend **out, dsv4_error *err)
{
    dsv4_backend_options opt;
    dsv4_backend_options_init(&opt);
    opt.threads = threads;
    return dsv4_backend_create_with(plan, ckpt, &opt, out, err);
}

dsv4_status dsv4_backend_create_with(const dsv4_plan *plan, const dsv4_checkpoint *ckpt,
                                     const dsv4_backend_options *optp, dsv4_backend **out, dsv4_error *err)
{
    if (!plan || !ckpt || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend", "plan, checkpoint and output must not be NULL");
    *out = NULL;
    dsv4_backend_options opt;
    dsv4_backend_options_init(&opt);
    if (optp) {
        if (optp->struct_size != sizeof opt)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                               "struct_size %u is not %zu (initialise with dsv4_backend_options_init)",
                               (unsigned)optp->struct_size, sizeof opt);
        opt = *optp;
    }
    int threads = opt.threads;
    if (threads < 1 || threads > 256)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend", "threads %d is outside [1, 256]", threads);
    if ((int)opt.cpu_kernels < DSV4_CPU_KERNELS_AUTO || (int)opt.cpu_kernels > DSV4_CPU_KERNELS_AVX512_VBMI)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                           "cpu_kernels %d is not a dsv4_cpu_kernels value", (int)opt.cpu_kernels);
    const dsv4_topology *topo = dsv4_plan_topology(plan);
    dsv4_status st = dsv4_backend_plan_supported(plan, err);
    if (st)
        return st;
    const dsv4_backend_entry *ent = dsv4_backend_registry_find(topo->backend);
    if (opt.cuda_kernels && opt.cuda_kernels[0] && topo->backend != DSV4_BACKEND_CUDA)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend options",
                           "cuda_kernels '%s' given to backend %s: kernel variants are for cuda only", opt.cuda_kernels,
                           ent->name);
    if (opt.workspace && !ent->device_workspace)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend options",
                           "backend %s has no device: a caller workspace is for cuda only", ent->name);
    if (!opt.workspace && opt.workspace_bytes)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                           "workspace_bytes %llu given without a workspace pointer",
                           (unsigned long long)opt.workspace_bytes);
    if (opt.workspace && ((uintptr_t)opt.workspace & 255))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                           "the caller workspace %p is not 256-byte aligned", opt.workspace);
    dsv4_backend *b = calloc(1, sizeof *b);
    if (!b)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, "backend", "out of memory");
    b->max_tokens = topo->max_tokens_per_rank;
    b->stages = ent->stages;
    b->sharded = dsv4_plan_router(plan) != DSV4_ROUTER_LOCAL ||
                 dsv4_plan_expert_count(plan) != dsv4_plan_config(plan)->n_routed_experts ||
                 dsv4_plan_inter_count(plan) != dsv4_plan_config(plan)->moe_inter_dim;
    if ((st = ent->create(plan, ckpt, &opt, &b->impl, &b->vt, err))) {
        free(b);
        return st;
    }
    *out = b;
    return DSV4_OK;
}

const dsv4_backend_stages *dsv4_backend_get_stages(const dsv4_backend *b)
{
    const dsv4_backend_stages *s = b ? b->stages : NULL;
    return s && s->route && s->experts && s->combine ? s : NULL;
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

const char *dsv4_backend_kernels(const dsv4_backend *b)
{
    if (b && b->vt && strcmp(b->vt->name, "cpu") == 0)
        return dsv4_cpu_backend_kernels(b->impl);
    return dsv4_backend_name(b);
}

/* The arguments every forward entry (forward, forward_device, enqueue; `where` names it) takes:
   the backend, out->y, x where there are tokens, and 0 <= T <= the plan's max_tokens_per_rank. */
static dsv4_status check_forward_args(const dsv4_backend *b, int64_t T, const void *x, const dsv4_forward_out *out,
                                      const char *where, dsv4_error *err)
{
    if (!b || !out || !out->y || (T > 0 && !x))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where, "backend, x and out->y must not be NULL");
    if (T < 0 || T > b->max_tokens)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, where,
                           "token count %lld is outside [0, max_tokens_per_rank = %lld]", (long long)T,
                           (long long)b->max_tokens);
    return DSV4_OK;
}

dsv4_status dsv4_backend_forward(dsv4_backend *b, int64_t T, const uint16_t *x, const int32_t *input_ids,
                                 dsv4_forward_out *out, dsv4_error *err)
{
    dsv4_status st = check_forward_args(b, T, x, out, "backend forward", err);
    if (st)
        return st;
    if (b->sharded)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend forward",
                           "the plan shards the layer over ranks: a rank of it runs through the distributed driver "
                           "(dsv4_dist_forward), which composes the %s backend's stages", b->vt->name);
    return b->vt->forward(b->impl, T, x, input_ids, out, err);
}

dsv4_status dsv4_backend_forward_device(dsv4_backend *b, int64_t T, const void *x, const int32_t *input_ids,
                                        const dsv4_forward_out *out, dsv4_error *err)
{
    dsv4_status st = check_forward_args(b, T, x, out, "backend forward_device", err);
    if (st)
        return st;
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

/* ---------------- embedding (docs/embedding.md) ---------------- */

dsv4_status dsv4_backend_workspace_size(const dsv4_plan *plan, int64_t max_tokens, uint64_t *bytes, dsv4_error *err)
{
    if (!plan || !bytes)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend workspace_size", "plan and bytes must not be NULL");
    *bytes = 0;
    if (max_tokens < 1)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend workspace_size", "max_tokens %lld is below 1",
                           (long long)max_tokens);
    const dsv4_backend_entry *ent = dsv4_backend_registry_find(dsv4_plan_topology(plan)->backend);
    if (!ent)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend workspace_size", "the plan names no known backend");
    if (!ent->create)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend workspace_size",
                           "backend %s is not in this build (backends: %s)", ent->name, dsv4_backends_available());
    if (ent->device_workspace)
        *bytes = ent->device_workspace(plan, max_tokens);
    return DSV4_OK;
}

dsv4_status dsv4_backend_enqueue(dsv4_backend *b, void *stream, int64_t T, const int32_t *valid_tokens, const void *x,
                                 const int32_t *input_ids, const dsv4_forward_out *out, dsv4_error *err)
{
    dsv4_status st = check_forward_args(b, T, x, out, "backend enqueue", err);
    if (st)
        return st;
    if (!b->vt->enqueue)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend enqueue",
                           "backend %s runs on the host: it has no stream to enqueue on (use dsv4_backend_forward)",
                           b->vt->name);
    return b->vt->enqueue(b->impl, stream, T, valid_tokens, x, input_ids, out, err);
}

dsv4_status dsv4_backend_poll_error(dsv4_backend *b, void *stream, dsv4_device_errors *out, dsv4_error *err)
{
    if (!b)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend poll_error", "backend must not be NULL");
    if (out && out->struct_size != sizeof *out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend poll_error",
                           "struct_size %u is not %zu (set it to sizeof(dsv4_device_errors))",
                           (unsigned)out->struct_size, sizeof *out);
    dsv4_device_errors d;
    memset(&d, 0, sizeof d);
    d.struct_size = (uint32_t)sizeof d;
    d.first_bad_input = -1;
    dsv4_status st = b->vt->poll_error ? b->vt->poll_error(b->impl, stream, &d, err) : DSV4_OK;
    if (out)
        *out = d;
    return st;
}
