/*
 * report.json (dsv4moe_harness/run.h, docs/scenarios.md "report.json"): every case with its checks,
 * metrics, error profile and memory; the fault build adds the defect catalogue's table.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/err.h"
#include "core/fileio.h"
#include "compare/results.h"
#include "harness/reports.h"
#include "dsv4moe/formats.h"
#ifdef DSV4_FAULTS
#include "harness/fault_runs.h"
#endif

/* Every insertion into the report's JSON tree goes through jset / japp: jansson returns -1 when the
   value is NULL (its own allocation failed) or the insertion cannot allocate, and a report with a
   field missing must never be written, so a failure sticks until dsv4_report_json checks it. */
static _Thread_local bool j_failed;
static void jset(json_t *o, const char *key, json_t *v)
{
    if (json_object_set_new(o, key, v))
        j_failed = true;
}
static void japp(json_t *a, json_t *v)
{
    if (json_array_append_new(a, v))
        j_failed = true;
}

#ifdef DSV4_FAULTS
/* ---------------- the detection table (fault build: harness/fault_runs.h) ---------------- */

static json_t *fault_table_json(const dsv4_run_results *R)
{
    size_t n = dsv4_run_fault_rows(R, NULL, 0);
    dsv4_fault_row *rows = calloc(n + 1, sizeof *rows);
    json_t *o = json_object(), *arr = json_array();
    if (!rows) {
        j_failed = true;
        return o;
    }
    dsv4_run_fault_rows(R, rows, n);
    for (size_t i = 0; i < n; i++) {
        json_t *r = json_object();
        jset(r, "fault", json_string(rows[i].fault));
        jset(r, "hook", json_string(rows[i].hook));
        jset(r, "findings", json_string(rows[i].findings));
        jset(r, "defect", json_string(rows[i].summary));
        jset(r, "injected_at", json_string(rows[i].where));
        jset(r, "case", json_string(rows[i].case_name));
        jset(r, "clean", json_string(dsv4_result_name(rows[i].clean)));
        jset(r, "injected", json_string(dsv4_result_name(rows[i].injected)));
        jset(r, "caught", json_boolean(rows[i].caught));
        jset(r, "caught_by", json_string(rows[i].caught_by));
        japp(arr, r);
    }
    free(rows);
    dsv4_fault_summary s = dsv4_run_fault_summary(R);
    jset(o, "defects", json_integer((json_int_t)s.defects));
    jset(o, "caught", json_integer((json_int_t)s.caught));
    jset(o, "clean_runs", json_integer((json_int_t)s.clean_runs));
    jset(o, "false_failures", json_integer((json_int_t)s.false_failures));
    jset(o, "rows", arr);
    return o;
}
#endif

/* ---------------- reports ---------------- */


static json_t *jreal(double v) { return isfinite(v) ? json_real(v) : json_null(); }
static json_t *jstr(const char *s) { return s ? json_string(s) : json_null(); }
static json_t *ju64(uint64_t v) { return json_integer((json_int_t)v); }

static json_t *metrics_json(const dsv4_compare_metrics *m)
{
    json_t *o = json_object();
    jset(o, "n", json_integer(m->n));
    jset(o, "max_abs", jreal(m->max_abs));
    jset(o, "max_rel", jreal(m->max_rel));
    jset(o, "nmse", jreal(m->nmse));
    jset(o, "deepgemm_diff", jreal(m->deepgemm_diff));
    jset(o, "rms_ref", jreal(m->rms_ref));
    jset(o, "ulp_p50", ju64(m->ulp_p50));
    jset(o, "ulp_p90", ju64(m->ulp_p90));
    jset(o, "ulp_p99", ju64(m->ulp_p99));
    jset(o, "ulp_p999", ju64(m->ulp_p999));
    jset(o, "ulp_max", ju64(m->ulp_max));
    jset(o, "ulp_nonzero", json_integer(m->ulp_nonzero));
    jset(o, "tol_violations", json_integer(m->tol_violations));
    jset(o, "bad_nonfinite", json_integer(m->bad_nonfinite));
    jset(o, "ref_nonfinite", json_integer(m->ref_nonfinite));
    jset(o, "finite_ok", json_boolean(m->finite_ok));
    return o;
}

static json_t *bins_json(const uint64_t *v)
{
    json_t *a = json_array();
    for (int i = 0; i < DSV4_ERR_BINS; i++)
        japp(a, ju64(v[i]));
    return a;
}

static json_t *errors_json(const dsv4_case_errors *E)
{
    json_t *o = json_object(), *w = json_array();
    jset(o, "n", json_integer(E->n));
    jset(o, "ulp_bins", bins_json(E->ulp_bins));
    jset(o, "ulp_bin_rule", json_string("0: 0 ulp; i in 1..14: [2^(i-1), 2^i) ulp; 15: >= 2^14 or "
                                                       "non-finite"));
    jset(o, "abs_bins", bins_json(E->abs_bins));
    jset(o, "abs_bin_rule", json_string("0: |a-b| = 0; i in 1..14: [1e(i-10), 1e(i-9)) (1: also "
                                                       "smaller); 15: >= 1e5 or non-finite"));
    for (int i = 0; i < E->n_worst; i++) {
        const dsv4_case_worst *x = &E->worst[i];
        json_t *e = json_object();
        jset(e, "index", json_integer(x->index));
        jset(e, "rank", json_integer(x->rank));
        jset(e, "token", json_integer(x->token));
        jset(e, "column", json_integer(x->column));
        jset(e, "a", jreal(x->a));
        jset(e, "b", jreal(x->b));
        jset(e, "diff", jreal(x->diff));
        japp(w, e);
    }
    jset(o, "worst", w);
    return o;
}

static json_t *case_json(const dsv4_run_results *R, const dsv4_case_result *c)
{
    json_t *o = json_object();
    jset(o, "name", jstr(c->name));
    jset(o, "title", jstr(dsv4_case_title(c)));
    jset(o, "scenario", jstr(c->scn_name));
    jset(o, "file", jstr(c->scn_path));
    jset(o, "index", json_integer((json_int_t)c->index));
    jset(o, "line", json_integer(c->line));
    jset(o, "col", json_integer(c->col));
    jset(o, "status", json_string(dsv4_result_name(c->status)));
    jset(o, "seconds", jreal(c->seconds));
    json_t *axes = json_array();
    const dsv4_scn_rec *sr = &R->scns[c->scn];
    if (c->axis_index)
        for (size_t a = 0; a < sr->n_axes; a++) {
            json_t *ax = json_object();
            jset(ax, "name", jstr(sr->axis_names[a]));
            jset(ax, "index", json_integer(c->axis_index[a]));
            japp(axes, ax);
        }
    jset(o, "axes", axes);
    jset(o, "explicit_index", c->explicit_index >= 0 ? json_integer(c->explicit_index) : json_null());
    jset(o, "preset", jstr(c->preset));
    jset(o, "layer", json_integer(c->cfg.layer));
    json_t *cf = json_object();
    jset(cf, "routed_format", json_string(dsv4_weight_format_name(c->cfg.routed_format)));
    jset(cf, "shared_format", json_string(dsv4_weight_format_name(c->cfg.shared_format)));
    jset(cf, "act_quant", json_string(dsv4_act_quant_name(c->cfg.act_quant)));
    jset(cf, "swiglu_limit", jreal(c->cfg.swiglu_limit));
    jset(cf, "top_p", jreal(c->cfg.top_p));
    jset(o, "config", cf);
    json_t *t = json_object();
    jset(t, "world", json_integer(c->topo.world_size));
    jset(t, "tp", json_integer(c->topo.tp));
    jset(t, "dp", json_integer(c->topo.dp));
    jset(t, "ep", json_integer(c->topo.ep));
    jset(t, "role", json_string(dsv4_role_name(c->topo.role)));
    jset(t, "backend", json_string(dsv4_backend_kind_name(c->topo.backend)));
    jset(t, "sm", json_integer(c->topo.sm));
    jset(t, "graph", json_boolean(c->topo.cuda_graph));
    if (c->params)
        jset(t, "params", json_string(c->params));
    jset(o, "topology", t);
    jset(o, "ran_on", jstr(c->backend));
    json_t *tok = json_array(), *rep = json_array();
    for (int r = 0; r < c->n_ranks; r++) {
        japp(tok, json_integer(c->tokens[r]));
        japp(rep, json_boolean(c->replay[r]));
    }
    jset(o, "tokens", tok);
    jset(o, "replay", rep);
    jset(o, "seed", ju64(c->seed));
    jset(o, "expect", json_string(c->expect == DSV4_EXPECT_REFUSED ? "refused" : "pass"));
    jset(o, "refused_regex", jstr(c->regex));
    json_t *checks = json_array();
    for (int i = 0; i < DSV4_CHECK_COUNT; i++) {
        if (!c->checks[i].detail)
            continue;
        json_t *ck = json_object();
        jset(ck, "name", json_string(dsv4_check_name(1u << i)));
        jset(ck, "requested", json_boolean((c->requested >> i) & 1u));
        jset(ck, "result", json_string(dsv4_result_name(c->checks[i].r)));
        jset(ck, "detail", json_string(c->checks[i].detail));
        japp(checks, ck);
    }
    jset(o, "checks", checks);
    json_t *mj = c->has_metrics ? metrics_json(&c->m) : json_null();
    if (c->has_metrics && c->rounding) { /* an outside engine's check (SPEC.md section 10) */
        jset(mj, "rounding", json_string(c->rounding));
        jset(mj, "beyond_terms", json_integer(c->beyond_terms));
    }
    jset(o, "metrics", mj);
    jset(o, "errors", c->has_errors ? errors_json(&c->errs) : json_null());
    jset(o, "defect", jstr(c->defect));
    jset(o, "injected", json_boolean(c->injected));
    json_t *mem = json_object();
    jset(mem, "available", ju64(c->mem.available));
    jset(mem, "planned_max", ju64(c->mem.planned_max));
    jset(mem, "planned_step", ju64(c->mem.planned_step));
    jset(mem, "peak", c->mem.measured ? ju64(c->mem.peak) : json_null());
    jset(o, "memory", mem);
    return o;
}

dsv4_status dsv4_report_json(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path, dsv4_error *err)
{
    dsv4_outfile o;
    dsv4_status st = dsv4_report_json_stage(R, scn, path, &o, err);
    return st ? st : dsv4_out_commit(&o, err);
}

dsv4_status dsv4_report_json_stage(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path,
                                   dsv4_outfile *o, dsv4_error *err)
{
    if (!R || !path)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "report", "results and path must not be NULL");
    j_failed = false;
    json_t *root = json_object();
    jset(root, "tool", json_string("dsv4moe"));
    jset(root, "version", json_string(DSV4_VERSION));
    jset(root, "report_version", json_integer(1));
    dsv4_run_summary s = dsv4_h_summary(R, scn, SIZE_MAX);
    json_t *cases = json_array();
    for (size_t i = 0; i < R->n; i++)
        if (dsv4_h_case_in(R->cases[i], scn))
            japp(cases, case_json(R, R->cases[i]));
    json_t *sum = json_object();
    jset(sum, "cases", json_integer((json_int_t)s.cases));
    jset(sum, "passed", json_integer((json_int_t)s.passed));
    jset(sum, "failed", json_integer((json_int_t)s.failed));
    jset(sum, "skipped", json_integer((json_int_t)s.skipped));
    jset(sum, "self_compared", json_integer((json_int_t)s.self_compared));
    jset(sum, "errors", json_integer((json_int_t)s.errors));
    jset(sum, "seconds", jreal(s.seconds));
    jset(root, "summary", sum);
    json_t *scns = json_array();
    for (size_t i = 0; i < R->nscn; i++) {
        if (scn && (strcmp(R->scns[i].name, dsv4_scenario_name(scn)) || strcmp(R->scns[i].path, dsv4_scenario_path(scn))))
            continue;
        json_t *so = json_object(), *axes = json_array();
        jset(so, "name", jstr(R->scns[i].name));
        jset(so, "file", jstr(R->scns[i].path));
        for (size_t a = 0; a < R->scns[i].n_axes; a++)
            japp(axes, jstr(R->scns[i].axis_names[a]));
        jset(so, "axes", axes);
        japp(scns, so);
    }
    jset(root, "scenarios", scns);
#ifdef DSV4_FAULTS
    if (dsv4_run_fault_rows(R, NULL, 0) > 0)
        jset(root, "fault_table", fault_table_json(R));
#endif
    jset(root, "cases", cases);
    if (j_failed) {
        json_decref(root);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory while building the report (nothing written)");
    }
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "cannot serialise the report");
    size_t len = strlen(text);
    char *withnl = realloc(text, len + 2);
    if (!withnl) {
        free(text);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    }
    withnl[len] = '\n';
    withnl[len + 1] = '\0';
    dsv4_status st = dsv4_out_begin(o, path, err);
    if (!st)
        st = dsv4_out_write(o, withnl, len + 1, err);
    free(withnl);
    return st;
}
