/*
 * The "ref" backend: a thin wrapper of the reference (dsv4_ref) and its stages (dsv4_ref_stage_*),
 * for the simulated multi-rank driver and as the numerics every other backend is held to. Its
 * memory model is the planner's executor layout model (it brings none of its own).
 */
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/backend.h"
#include "dsv4moe/ref.h"
#include "fast/backend/backend_reg.h"
#include "core/err.h"

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

static const dsv4_backend_stages ref_stages = {ref_route, ref_experts, ref_combine, NULL, NULL};

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

static dsv4_status ref_create(const dsv4_plan *plan, const dsv4_checkpoint *ck, const dsv4_backend_options *opt,
                              void **impl, const dsv4_backend_vtable **vt, dsv4_error *err)
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

const dsv4_backend_reg *dsv4_ref_backend_reg(void)
{
    static const dsv4_backend_reg reg = {
        .name = "ref",
        .kind = DSV4_BACKEND_REF,
        .caps = {.sharding = true},
        .create = ref_create,
        .stages = &ref_stages,
    };
    return &reg;
}
