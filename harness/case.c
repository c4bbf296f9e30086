/*
 * One case's context (harness/case.h): plans, data, the reference on every rank's tokens, the
 * backend's run (one rank) or the distributed driver's (several), the ranks' traces. The checks
 * that judge it are in harness/checks.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/cache.h"
#include "harness/case.h"
#include "compare/run_ext.h"
#include "core/fileio.h"
#include "dsv4moe_harness/engines.h"
#include "dsv4moe_harness/symmetry.h"

/* The stage stops here: every requested check it did not reach reports `r` with the detail. */
static void stop(dsv4_h_case *k, dsv4_result r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void stop(dsv4_h_case *k, dsv4_result r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->rest_detail, sizeof k->rest_detail, fmt, ap);
    va_end(ap);
    k->rest = r;
    k->rest_set = true;
}

/* The stop of a check that could have run on another machine or build: the case is skipped, not passed. */
static void stop_unrun(dsv4_h_case *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void stop_unrun(dsv4_h_case *k, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->rest_detail, sizeof k->rest_detail, fmt, ap);
    va_end(ap);
    k->rest = DSV4_RESULT_SKIP;
    k->rest_set = k->rest_unrun = true;
}

dsv4_status dsv4_h_ref_run(dsv4_ref *ref, const dsv4_config *cfg, const uint16_t *x, const int32_t *ids, int64_t off,
                           int64_t T, uint16_t *y, int32_t *topk, float *w, dsv4_ref_stats *stats, dsv4_error *e)
{
    dsv4_ref_output out;
    memset(&out, 0, sizeof out);
    out.y = y;
    out.topk_ids = topk;
    out.topk_weights = w;
    dsv4_status st = dsv4_ref_forward(ref, T, x + off * cfg->dim, ids + off, &out, e);
    if (!st && stats)
        *stats = out.stats;
    return st;
}

/* ---- plans: refused or accepted, and the planned memory ---- */
static bool build_plans(dsv4_h_case *k, dsv4_case_result *c, dsv4_error *e)
{
    const dsv4_scenario_case *sc = k->sc;
    k->plans = calloc((size_t)k->world, sizeof *k->plans);
    if (!k->plans) {
        k->stop_refusal_oom = true;
        stop(k, DSV4_RESULT_ERROR, "out of memory");
        return false;
    }
    k->stage = DSV4_H_PLANNED;
    if (sc->config_status != DSV4_OK) {
        k->refused = true;
        snprintf(k->refusal, sizeof k->refusal, "%s", sc->config_error ? sc->config_error : "invalid config");
    } else {
        for (int r = 0; r < k->world && !k->refused; r++) {
            dsv4_topology t = k->topo;
            t.rank = r;
            if (dsv4_plan_create(k->cfg, &t, &sc->budget, &k->plans[r], e) != DSV4_OK) {
                k->refused = true;
                snprintf(k->refusal, sizeof k->refusal, "rank %d: %s", r, e->message);
            }
        }
    }
    if (sc->expect == DSV4_EXPECT_REFUSED) {
        stop(k, DSV4_RESULT_SKIP, "not run: the case expects a refusal");
        return false;
    }
    if (k->refused) {
        stop(k, DSV4_RESULT_SKIP, "not run: the plan was refused");
        return false;
    }
    k->stage = DSV4_H_ACCEPTED;
    c->mem.available = UINT64_MAX;
    for (int r = 0; r < k->world; r++) {
        uint64_t mx = dsv4_plan_workspace_max(k->plans[r]), av = dsv4_plan_budget_available(k->plans[r]);
        if (mx > c->mem.planned_max)
            c->mem.planned_max = mx;
        if (av < c->mem.available)
            c->mem.available = av;
        if (mx > av && !k->planned_bad[0])
            snprintf(k->planned_bad, sizeof k->planned_bad,
                     "rank %d: planned maximum %llu bytes above the %llu bytes available", r, (unsigned long long)mx,
                     (unsigned long long)av);
    }
    return true;
}

/* ---- data: the layer, the backend's copy, the input pool, the reference, the output buffers ---- */
static bool build_data(dsv4_h_case *k, dsv4_error *e)
{
    const dsv4_scenario_case *sc = k->sc;
    const dsv4_config *cfg = k->cfg;
    int64_t total = 0;
    for (int r = 0; r < k->world; r++)
        total += sc->tokens[r];
    k->all_rows = total;
    int64_t pool = total > DSV4_H_DETERMINISM_TOKENS ? total : DSV4_H_DETERMINISM_TOKENS;
    if (dsv4_h_open_weights(k->cache, cfg, sc->seed, k->o->threads, &k->ck, e) ||
        dsv4_h_open_input(k->cache, cfg, sc->seed, pool, &k->in, e)) {
        stop(k, DSV4_RESULT_ERROR, "data generation failed: %s", e->message);
        return false;
    }
    /* The backend's copy: the loader is under test, so a copy it will not read fails numerics. */
    if (dsv4_h_custom_checkpoint(sc)) {
        char ckpath[4400], src[4200];
        dsv4_h_checkpoint_words(sc, k->ckwords, sizeof k->ckwords);
        if (dsv4_h_backend_checkpoint_path(k->cache, cfg, sc, k->o->threads, src, sizeof src, ckpath, sizeof ckpath,
                                           e)) {
            stop(k, DSV4_RESULT_ERROR, "writing the backend's checkpoint (%s) failed: %s", k->ckwords, e->message);
            return false;
        }
        /* The reference reads the one file of the layout (a stacked layer quantizes at load as the
           backend does); the backend its copy. */
        dsv4_checkpoint_close(k->ck);
        k->ck = NULL;
        if (dsv4_checkpoint_open(src, &k->ck, e) || dsv4_checkpoint_open(ckpath, &k->ckb, e)) {
            snprintf(k->stop_numerics, sizeof k->stop_numerics, "the layer's checkpoint (%s) does not load: %s",
                     k->ckwords, e->message);
            stop(k, DSV4_RESULT_SKIP, "not run: the checkpoint does not load");
            return false;
        }
    }
    const dsv4_tensor_info *tx = dsv4_st_find(k->in, "x"), *tid = dsv4_st_find(k->in, "input_ids");
    if (!tx || !tid) {
        stop(k, DSV4_RESULT_ERROR, "the input file has no x or input_ids");
        return false;
    }
    k->X = tx->data;
    k->IDS = tid->data;
    if (dsv4_ref_create(cfg, k->ck, k->o->threads, &k->ref, e)) {
        char msg[DSV4_H_MSG_MAX];
        snprintf(msg, sizeof msg, "the reference would not start%s%s%s: %s", k->ckb ? " on the layer's checkpoint (" : "",
                 k->ckwords, k->ckb ? ")" : "", e->message);
        if (k->ckb) { /* the loader is under test: a checkpoint it will not bind fails numerics */
            snprintf(k->stop_numerics, sizeof k->stop_numerics, "%s", msg);
            stop(k, DSV4_RESULT_SKIP, "not run: the reference would not start");
        } else {
            stop(k, DSV4_RESULT_ERROR, "%s", msg);
        }
        return false;
    }
    /* The whole case's outputs, rank after rank: y [sum T, H], ids/w [sum T, K]. */
    const int64_t H = k->H, K = k->K, n = k->all_rows;
    k->off = calloc((size_t)k->world, sizeof *k->off);
    k->ranks = calloc((size_t)k->world, sizeof *k->ranks);
    k->y = calloc((size_t)(n * H + 1), 2);
    k->yr = calloc((size_t)(n * H + 1), 2);
    k->ids_b = calloc((size_t)(n * K + 1), 4);
    k->ids_r = calloc((size_t)(n * K + 1), 4);
    k->w_b = calloc((size_t)(n * K + 1), 4);
    k->w_r = calloc((size_t)(n * K + 1), 4);
    if (!k->off || !k->ranks || !k->y || !k->yr || !k->ids_b || !k->ids_r || !k->w_b || !k->w_r) {
        stop(k, DSV4_RESULT_ERROR, "out of memory");
        return false;
    }
    dsv4_run_ext_slices(&k->topo, sc->tokens, k->world, k->off);
    int64_t row = 0;
    for (int r = 0; r < k->world; r++) {
        dsv4_dist_rank *d = &k->ranks[r];
        d->tokens = sc->tokens[r];
        d->x = k->X + k->off[r] * H;
        d->input_ids = k->IDS + k->off[r];
        d->can_replay = sc->replay[r];
        d->y = k->y + row * H;
        d->topk_ids = k->ids_b + row * K;
        d->topk_weights = k->w_b + row * K;
        row += sc->tokens[r];
    }
    return true;
}

/* ---- the reference on every rank's tokens (numerics, clamp_exercised) ---- */
static void build_reference(dsv4_h_case *k, dsv4_error *e)
{
    const int64_t H = k->H, K = k->K;
    int64_t row = 0;
    k->ref_ok = true;
    for (int r = 0; r < k->world; r++) {
        dsv4_ref_stats rs;
        if (dsv4_h_ref_run(k->ref, k->cfg, k->X, k->IDS, k->off[r], k->sc->tokens[r], k->yr + row * H,
                           k->ids_r + row * K, k->w_r + row * K, &rs, e)) {
            snprintf(k->ref_error, sizeof k->ref_error, "the reference failed on rank %d's tokens: %s", r, e->message);
            k->ref_ok = false;
            break;
        }
        k->ref_stats.tokens += rs.tokens;
        k->ref_stats.routed_values += rs.routed_values;
        k->ref_stats.routed_g_clamped += rs.routed_g_clamped;
        k->ref_stats.routed_u_clamped += rs.routed_u_clamped;
        k->ref_stats.shared_g_clamped += rs.shared_g_clamped;
        k->ref_stats.shared_u_clamped += rs.shared_u_clamped;
        row += k->sc->tokens[r];
    }
    k->stage = DSV4_H_REFERENCE;
}

static void set_ran_on(dsv4_case_result *c, const char *name)
{
    free(c->backend);
    c->backend = dsv4_h_strdup(name);
    c->lost_detail |= !c->backend;
}

/* ---- one rank: the plan's backend ---- */
static void run_one(dsv4_h_case *k, dsv4_case_result *c, dsv4_error *e)
{
    const int64_t T = k->sc->tokens[0];
    const dsv4_plan *plan = k->plans[0];
    /* The registry says whether this library holds the backend and this machine runs it. */
    dsv4_backend_info info;
    if (dsv4_backend_info_of(k->topo.backend, &info, e) == DSV4_OK && !info.available) {
        if (k->topo.backend == DSV4_BACKEND_CUDA) {
            /* The plan's half of memory holds without a device; the measured peak needs CUDA. */
            k->cuda_missing = true;
            snprintf(k->cuda_why, sizeof k->cuda_why, "%s", info.why);
            stop_unrun(k, "%s",
                       info.built ? "skipped: no CUDA device on this machine" : "skipped: no CUDA in this build");
            return;
        }
        /* Any other backend missing here: the reference stands in, and says so. */
        dsv4_topology t = k->topo;
        t.backend = DSV4_BACKEND_REF;
        if (dsv4_plan_create(k->cfg, &t, &k->sc->budget, &k->fallback_plan, e) == DSV4_OK) {
            plan = k->fallback_plan;
            k->note = " (backend unavailable here: ref stood in)";
        }
    }
    k->gemm = dsv4_plan_gemm(plan);
    /* The ref backend on the reference's own checkpoint is the reference: numerics could not fail. */
    k->self_compared = !k->ckb && (plan == k->fallback_plan || k->topo.backend == DSV4_BACKEND_REF);
    dsv4_backend_options bopt;
    dsv4_backend_options_init(&bopt);
    bopt.threads = k->o->threads;
    bopt.params = plan == k->fallback_plan ? NULL : k->sc->params; /* not the stand-in's */
    dsv4_status st = dsv4_backend_create_with(plan, k->ckb ? k->ckb : k->ck, &bopt, &k->be, e);
    if (st) {
        char msg[DSV4_H_MSG_MAX];
        snprintf(msg, sizeof msg, "the %s backend would not start%s%s%s: %s", dsv4_backend_kind_name(k->topo.backend),
                 k->ckb ? " on its checkpoint (" : "", k->ckwords, k->ckb ? ")" : "", e->message);
        if (k->ckb) { /* the loader under test refused a checkpoint that the reference reads */
            snprintf(k->stop_numerics, sizeof k->stop_numerics, "%s", msg);
            stop(k, DSV4_RESULT_SKIP, "not run: the backend would not start");
        } else {
            stop(k, DSV4_RESULT_ERROR, "%s", msg);
        }
        return;
    }
    snprintf(k->be_name, sizeof k->be_name, "%s", dsv4_backend_name(k->be));
    set_ran_on(c, k->be_name);
    dsv4_dist_rank *d = &k->ranks[0];
    dsv4_forward_out fo = {.y = d->y, .topk_ids = d->topk_ids, .topk_weights = d->topk_weights};
    st = dsv4_backend_forward(k->be, T, d->x, d->input_ids, &fo, e);
    k->bs = dsv4_backend_get_stats(k->be);
    bool replay = k->topo.cuda_graph && k->sc->replay[0] && dsv4_plan_can_replay(plan, T);
    d->workspace_planned = c->mem.planned_step = dsv4_plan_workspace_bytes(plan, T, replay);
    d->workspace_peak = c->mem.peak = k->bs.workspace_peak;
    c->mem.measured = true;
    if (st) {
        char msg[DSV4_H_MSG_MAX];
        snprintf(msg, sizeof msg, "the %s backend failed at T = %lld: %s", k->be_name, (long long)T, e->message);
        snprintf(k->stop_numerics, sizeof k->stop_numerics, "%s", msg);
        snprintf(k->stop_empty, sizeof k->stop_empty, "%s", msg);
        k->stop_empty_result = T == 0 ? DSV4_RESULT_FAIL : DSV4_RESULT_SKIP;
        stop(k, DSV4_RESULT_SKIP, "not run: the backend failed");
        return;
    }
    k->stage = DSV4_H_RAN;
}

/* Writes every rank's trace as trace_dir/<case id>/rank<r>.jsonl; a failure is the symmetry
   check's error (a trace asked for and not written must not read as a pass). */
static void write_traces(dsv4_h_case *k, const dsv4_case_result *c)
{
    char id[512], dir[4700], path[4800];
    dsv4_error e;
    dsv4_error_clear(&e);
    dsv4_export_case_id(c->name, -1, id, sizeof id);
    snprintf(dir, sizeof dir, "%s/%s", k->o->trace_dir, id);
    dsv4_status st = dsv4_mkdir_p(dir, &e);
    for (int r = 0; r < k->world && !st; r++) {
        snprintf(path, sizeof path, "%s/rank%d.jsonl", dir, r);
        st = dsv4_trace_write_jsonl(k->ranks[r].trace, k->ranks[r].trace_len, r, k->world, path, &e);
    }
    if (st)
        snprintf(k->trace_error, sizeof k->trace_error, "writing the collective traces failed: %s", e.message);
}

/* ---- several ranks: the distributed driver, each rank running its plan's backend's stages ---- */
static void run_ranks(dsv4_h_case *k, dsv4_case_result *c, dsv4_error *e)
{
    if (k->world > DSV4_COMM_MAX_RANKS) {
        stop_unrun(k, "skipped: world %d above the %d ranks the simulator holds", k->world, DSV4_COMM_MAX_RANKS);
        return;
    }
    dsv4_dist_options_init(&k->dopt);
    if (k->timeout_ms > 0)
        k->dopt.timeout_ms = k->timeout_ms;
    k->dopt.backend_params = k->sc->params;
    /* A backend this library or machine lacks (cuda without `make cuda` or a device): the cpu
       backend's stages compute the plan's step (its protocol, replay decision and chunks). */
    dsv4_backend_info binfo;
    if (dsv4_backend_info_of(k->topo.backend, &binfo, e) == DSV4_OK && !binfo.available) {
        k->dopt.compute_backend = DSV4_BACKEND_CPU;
        k->note = " (cpu stages standing in: the plan's backend is not available here)";
    }
    snprintf(k->be_name, sizeof k->be_name, "%s",
             dsv4_backend_kind_name(k->dopt.compute_backend >= 0 ? (dsv4_backend_kind)k->dopt.compute_backend
                                                                 : k->topo.backend));
    char ran_on[80];
    snprintf(ran_on, sizeof ran_on, "dist:%s", k->be_name);
    set_ran_on(c, ran_on);
    k->run_status = dsv4_dist_forward(k->cfg, k->ckb ? k->ckb : k->ck, &k->topo, &k->sc->budget, &k->dopt, k->ranks, e);
    if (k->run_status)
        snprintf(k->run_error, sizeof k->run_error, "the distributed step failed: %s", e->message);
    for (int r = 0; r < k->world; r++) {
        if (k->ranks[r].workspace_planned > c->mem.planned_step)
            c->mem.planned_step = k->ranks[r].workspace_planned;
        if (k->ranks[r].workspace_peak > c->mem.peak)
            c->mem.peak = k->ranks[r].workspace_peak;
    }
    c->mem.measured = k->run_status == DSV4_OK;
    k->stage = DSV4_H_RAN;
    /* the ranks' traces for dsv4moe symmetry (options.trace_dir) */
    if (k->o->trace_dir && k->o->trace_dir[0] && !c->injected)
        write_traces(k, c);
}

void dsv4_h_case_build(dsv4_h_case *k, dsv4_case_result *c)
{
    const dsv4_scenario_case *sc = k->sc;
    k->req = sc->checks;
    c->requested = k->req;
    k->world = sc->n_ranks;
    k->topo = sc->topology;
    if (k->o->backend >= 0 && k->topo.backend != DSV4_BACKEND_CUDA)
        k->topo.backend = (dsv4_backend_kind)k->o->backend;
    c->topo = k->topo;
    k->cfg = &sc->config;
    k->H = k->cfg->dim;
    k->K = k->cfg->n_activated;
    k->note = "";
    dsv4_error e;
    dsv4_error_clear(&e);
    if (!build_plans(k, c, &e))
        return;
    const unsigned needs_run = DSV4_CHECK_NUMERICS | DSV4_CHECK_DETERMINISM | DSV4_CHECK_SYMMETRY |
                               DSV4_CHECK_MEMORY | DSV4_CHECK_EMPTY | DSV4_CHECK_CLAMP_EXERCISED;
    if (!(k->req & needs_run) || !build_data(k, &e))
        return;
    build_reference(k, &e);
    const unsigned after = DSV4_CHECK_NUMERICS | DSV4_CHECK_SYMMETRY | DSV4_CHECK_MEMORY | DSV4_CHECK_EMPTY;
    if (!(k->req & after))
        return;
    k->stage = DSV4_H_RUN_BEGUN;
    if (k->world == 1)
        run_one(k, c, &e);
    else
        run_ranks(k, c, &e);
}

void dsv4_h_case_release(dsv4_h_case *k)
{
    if (k->ranks)
        for (int r = 0; r < k->world; r++)
            dsv4_dist_rank_release(&k->ranks[r]);
    free(k->ranks);
    free(k->off);
    free(k->y), free(k->yr), free(k->ids_b), free(k->ids_r), free(k->w_b), free(k->w_r);
    dsv4_backend_free(k->be);
    dsv4_plan_free(k->fallback_plan);
    dsv4_ref_free(k->ref);
    dsv4_st_close(k->in);
    dsv4_checkpoint_close(k->ckb);
    dsv4_checkpoint_close(k->ck);
    for (int r = 0; k->plans && r < k->world; r++)
        dsv4_plan_free(k->plans[r]);
    free(k->plans);
}
