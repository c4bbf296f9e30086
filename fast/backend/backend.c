/*
 * The backend interface (dsv4moe/backend.h): options, creation through the backend's
 * registration (fast/backend/registry.c) and dispatch through its vtable.
 */
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/backend.h"
#include "fast/backend/backend_reg.h"
#include "core/err.h"

/* ---------------- dispatch ---------------- */

void dsv4_backend_options_init(dsv4_backend_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = (uint32_t)sizeof *opt;
    opt->threads = 1;
}

/* dsv4_backend_options as dsv4moe 0.1 laid it out (its kernel knobs, now the params string), so
   that an old caller is refused by name rather than read wrong. */
struct options_0_1 {
    uint32_t struct_size;
    int threads;
    int cpu_kernels;
    void *workspace;
    uint64_t workspace_bytes;
    const char *cuda_kernels;
};

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
        if (optp->struct_size == sizeof(struct options_0_1) && optp->struct_size != sizeof opt)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                               "struct_size %u is dsv4moe 0.1's dsv4_backend_options, with the fields cpu_kernels "
                               "and cuda_kernels; they are the backend's params string now (docs/cpu.md, "
                               "docs/cuda.md): rebuild against this header and fill it with "
                               "dsv4_backend_options_init", (unsigned)optp->struct_size);
        if (optp->struct_size != sizeof opt)
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend options",
                               "struct_size %u is not %zu (initialise with dsv4_backend_options_init)",
                               (unsigned)optp->struct_size, sizeof opt);
        opt = *optp;
    }
    int threads = opt.threads;
    if (threads < 1 || threads > 256)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend", "threads %d is outside [1, 256]", threads);
    const dsv4_topology *topo = dsv4_plan_topology(plan);
    dsv4_status st = dsv4_backend_plan_supported(plan, err);
    if (st)
        return st;
    const dsv4_backend_reg *ent = dsv4_backend_registry_find(topo->backend);
    if (opt.params && opt.params[0] && !ent->params)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend options",
                           "params '%s' given to backend %s, which takes no parameters", opt.params, ent->name);
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
    b->reg = ent;
    b->sharded = dsv4_plan_shard(plan)->sharded;
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
    dsv4_backend_proc fn = b && b->reg && b->reg->get_proc ? b->reg->get_proc("kernels") : NULL;
    if (fn)
        return ((dsv4_backend_kernels_fn)fn)(b->impl);
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
    const dsv4_backend_reg *ent = dsv4_backend_registry_find(dsv4_plan_topology(plan)->backend);
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
