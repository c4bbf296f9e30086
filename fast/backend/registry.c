/*
 * The backend registry (fast/backend/backend_impl.h, dsv4moe/backend.h): one entry per backend
 * with its name, whether this library holds it and this machine runs it, its create function,
 * its memory model and its stages. The planner takes memory models from here (it knows no
 * backend's buffers) and the runner asks here what exists.
 */
#include <stdio.h>
#include <string.h>

#include "dsv4moe/backend.h"
#include "backend_impl.h"
#include "err.h"

extern const dsv4_backend_stages dsv4_ref_backend_stages;
extern const dsv4_backend_stages dsv4_cpu_backend_stages;
uint64_t dsv4_cpu_backend_workspace_bytes(const dsv4_config *cfg, const dsv4_topology *topo, int64_t tokens);

#ifdef DSV4_WITH_CUDA
static dsv4_status cuda_create(const dsv4_plan *plan, const dsv4_checkpoint *ck, const dsv4_backend_options *opt,
                               void **impl, const dsv4_backend_vtable **vt, dsv4_error *err)
{
    return dsv4_cuda_backend_create(plan, ck, opt, impl, vt, err);
}
#endif

static const dsv4_backend_entry REGISTRY[] = {
    {"ref", DSV4_BACKEND_REF, dsv4_ref_backend_create, NULL, NULL, NULL, &dsv4_ref_backend_stages, NULL, NULL, NULL},
    {"cpu", DSV4_BACKEND_CPU, dsv4_cpu_backend_create, NULL, dsv4_cpu_backend_workspace_bytes, NULL,
     &dsv4_cpu_backend_stages, NULL, NULL, NULL},
#ifdef DSV4_WITH_CUDA
    /* Memory: one rank, the planner's executor layout model, which the CUDA layout stays within
       (tests/cuda holds them together); a rank of several, its stage chunks' layouts; the
       weights of the rank's shard. Stages: expert ranges (ep, dp) and inter ranges (tp). */
    {"cuda", DSV4_BACKEND_CUDA, cuda_create, dsv4_cuda_backend_available, NULL, dsv4_cuda_stage_workspace_bytes,
     &dsv4_cuda_backend_stages, dsv4_cuda_backend_supports, dsv4_cuda_device_workspace, dsv4_cuda_weight_bytes},
#else
    {"cuda", DSV4_BACKEND_CUDA, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL},
#endif
};
#define N_REGISTRY (int)(sizeof REGISTRY / sizeof REGISTRY[0])

const dsv4_backend_entry *dsv4_backend_registry_find(dsv4_backend_kind kind)
{
    for (int i = 0; i < N_REGISTRY; i++)
        if (REGISTRY[i].kind == kind)
            return &REGISTRY[i];
    return NULL;
}

/* dsv4moe/plan.h: the plan's weights by its backend's model (here, next to the models). */
uint64_t dsv4_plan_weight_bytes(const dsv4_plan *plan)
{
    const dsv4_backend_entry *be = plan ? dsv4_backend_registry_find(dsv4_plan_topology(plan)->backend) : NULL;
    return be && be->weight_bytes ? be->weight_bytes(plan) : 0;
}

static bool has_stages(const dsv4_backend_entry *e)
{
    return e->stages && e->stages->route && e->stages->experts && e->stages->combine;
}

/* The names of the backends this library holds, for messages. */
static void built_names(char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_REGISTRY && len < n; i++)
        if (REGISTRY[i].create) {
            int w = snprintf(buf + len, n - len, "%s%s", len ? ", " : "", REGISTRY[i].name);
            if (w < 0)
                break;
            len += (size_t)w;
        }
}

static void fill_info(const dsv4_backend_entry *e, dsv4_backend_info *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = (uint32_t)sizeof *o;
    o->name = e->name;
    o->kind = e->kind;
    o->built = e->create != NULL;
    o->sharded = has_stages(e);
    if (!o->built) {
        char names[64];
        built_names(names, sizeof names);
        snprintf(o->why, sizeof o->why, "backend %s is not available in this build (available: %s)", e->name, names);
        return;
    }
    o->available = !e->available || e->available(o->why, sizeof o->why);
    if (o->available)
        o->why[0] = '\0';
    else if (!o->why[0])
        snprintf(o->why, sizeof o->why, "backend %s cannot run on this machine", e->name);
}

int dsv4_backend_count(void) { return N_REGISTRY; }

dsv4_status dsv4_backend_info_at(int index, dsv4_backend_info *out, dsv4_error *err)
{
    if (!out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend registry", "out must not be NULL");
    if (index < 0 || index >= N_REGISTRY)
        return dsv4_seterr(err, DSV4_ERR_RANGE, "backend registry", "index %d is outside [0, %d)", index, N_REGISTRY);
    fill_info(&REGISTRY[index], out);
    return DSV4_OK;
}

dsv4_status dsv4_backend_info_of(dsv4_backend_kind kind, dsv4_backend_info *out, dsv4_error *err)
{
    const dsv4_backend_entry *e = dsv4_backend_registry_find(kind);
    if (!out || !e)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend registry", "%s", out ? "unknown backend kind" :
                           "out must not be NULL");
    fill_info(e, out);
    return DSV4_OK;
}

dsv4_status dsv4_backend_plan_supported(const dsv4_plan *plan, dsv4_error *err)
{
    if (!plan)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "backend", "plan must not be NULL");
    const dsv4_topology *topo = dsv4_plan_topology(plan);
    const dsv4_config *cfg = dsv4_plan_config(plan);
    const dsv4_backend_entry *e = dsv4_backend_registry_find(topo->backend);
    if (!e)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend", "backend kind %d is unknown", (int)topo->backend);
    dsv4_backend_info info;
    fill_info(e, &info);
    if (!info.available)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend", "%s", info.why);
    bool sharded = dsv4_plan_expert_count(plan) != cfg->n_routed_experts ||
                   dsv4_plan_inter_count(plan) != cfg->moe_inter_dim;
    if ((sharded || dsv4_plan_router(plan) != DSV4_ROUTER_LOCAL) && !info.sharded)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend " "plan",
                           "backend %s runs one unsharded rank (router local) and has no stages for router %s "
                           "(experts %lld of %lld, inter %lld of %lld)",
                           e->name, dsv4_router_kind_name(dsv4_plan_router(plan)),
                           (long long)dsv4_plan_expert_count(plan), (long long)cfg->n_routed_experts,
                           (long long)dsv4_plan_inter_count(plan), (long long)cfg->moe_inter_dim);
    char why[160] = "";
    if (e->supports && !e->supports(plan, why, sizeof why))
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "backend", "backend %s: %s", e->name, why);
    return DSV4_OK;
}
