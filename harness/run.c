/*
 * The scenario runner (dsv4moe_harness/run.h): every case of a scenario built once into its context
 * (harness/case.c) and judged by the table of checks (harness/checks.c). The rules of each check
 * are in docs/scenarios.md ("Checks").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness/cache.h"
#include "harness/case.h"
#include "core/err.h"
#include "core/fileio.h"
#include "compare/results.h"
#include "compare/run_ext.h"

void dsv4_run_options_init(dsv4_run_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->cache_dir = NULL;
    opt->backend = -1;
    opt->threads = 2;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Builds the case's context, runs the checks over it, frees the context. */
static void run_case(const dsv4_run_options *o, const char *cache, int timeout_ms, const dsv4_scenario_case *sc,
                     dsv4_case_result *c)
{
    dsv4_h_case k;
    memset(&k, 0, sizeof k);
    k.o = o;
    k.cache = cache;
    k.timeout_ms = timeout_ms;
    k.sc = sc;
    dsv4_h_case_build(&k, c);
    dsv4_h_case_check(&k, c);
    dsv4_h_case_release(&k);
}

/* "check result: detail" of the first failing (then erroring) check, "" if none (an injected run: what
   caught its defect). */
static char *first_failure(const dsv4_case_result *c)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < DSV4_CHECK_COUNT; i++) {
            dsv4_result want = pass == 0 ? DSV4_RESULT_FAIL : DSV4_RESULT_ERROR;
            if (c->checks[i].detail && c->checks[i].r == want) {
                const char *nm = dsv4_check_name(1u << i), *rn = dsv4_result_name(want);
                size_t len = strlen(nm) + strlen(rn) + strlen(c->checks[i].detail) + 4;
                char *s = malloc(len);
                if (s)
                    snprintf(s, len, "%s %s: %s", nm, rn, c->checks[i].detail);
                return s;
            }
        }
    return dsv4_h_strdup("");
}

/* ---------------- the scenario ---------------- */

/* defect: the case's defect (runs with an injector), or NULL. */
static dsv4_case_result *new_case(const dsv4_scenario *scn, size_t scn_index, size_t i, const dsv4_scenario_case *sc,
                                  const char *defect)
{
    dsv4_case_result *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->name = dsv4_h_strdup(sc->name);
    dsv4_run_ext_title(c, sc->title);
    c->scn_name = dsv4_h_strdup(dsv4_scenario_name(scn));
    c->scn_path = dsv4_h_strdup(dsv4_scenario_path(scn));
    c->scn = scn_index;
    c->index = i;
    c->line = sc->line;
    c->col = sc->col;
    c->explicit_index = sc->explicit_index;
    size_t na = dsv4_scenario_axis_count(scn);
    if (sc->axis_index && na) {
        c->axis_index = malloc(na * sizeof *c->axis_index);
        if (c->axis_index)
            memcpy(c->axis_index, sc->axis_index, na * sizeof *c->axis_index);
    }
    c->preset = dsv4_h_strdup(sc->preset);
    c->cfg = sc->config;
    c->topo = sc->topology;
    c->n_ranks = sc->n_ranks;
    c->tokens = malloc((size_t)sc->n_ranks * sizeof *c->tokens);
    c->replay = malloc((size_t)sc->n_ranks * sizeof *c->replay);
    c->seed = sc->seed;
    c->expect = sc->expect;
    c->regex = dsv4_h_strdup(sc->refused_regex);
    c->params = dsv4_h_strdup(sc->params);
    c->defect = dsv4_h_strdup(defect);
    c->twin = SIZE_MAX;
    if ((defect && !c->defect) || !c->name || !c->scn_name || !c->scn_path || !c->tokens || !c->replay ||
        (na && sc->axis_index && !c->axis_index) || (sc->preset && !c->preset) || (sc->refused_regex && !c->regex) ||
        (sc->params && !c->params)) {
        dsv4_h_case_free(c);
        return NULL;
    }
    memcpy(c->tokens, sc->tokens, (size_t)sc->n_ranks * sizeof *c->tokens);
    memcpy(c->replay, sc->replay, (size_t)sc->n_ranks * sizeof *c->replay);
    return c;
}

dsv4_status dsv4_run_scenario(const dsv4_scenario *scn, const dsv4_run_options *opts, dsv4_run_results **results,
                              dsv4_error *err)
{
    return dsv4_h_run_scenario(scn, opts, NULL, results, err);
}

dsv4_status dsv4_h_run_scenario(const dsv4_scenario *scn, const dsv4_run_options *opts, const dsv4_h_injector *inj,
                                dsv4_run_results **results, dsv4_error *err)
{
    if (!scn || !results)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "scenario and results must not be NULL");
    dsv4_run_options defaults;
    dsv4_run_options_init(&defaults);
    if (!opts)
        opts = &defaults;
    if (opts->struct_size != sizeof(dsv4_run_options))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "options struct_size %u unknown (expected %zu)",
                           opts->struct_size, sizeof(dsv4_run_options));
    if (opts->threads < 1 || opts->threads > 256)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "threads %d is outside [1, 256]", opts->threads);
    if (opts->backend < -1 || opts->backend >= dsv4_backend_count())
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "backend %d is not -1 (each case's own) or the index of %s",
                           opts->backend, dsv4_backends_registered());
    const char *cache = opts->cache_dir && opts->cache_dir[0] ? opts->cache_dir : "out/cache";
    dsv4_status st = dsv4_mkdir_p(cache, err);
    if (st)
        return st;

    bool created = false;
    dsv4_run_results *R = *results;
    if (!R) {
        R = calloc(1, sizeof *R);
        if (!R)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, "run", "out of memory");
        created = true;
    }
    /* Record the scenario. */
    dsv4_scn_rec *ns = realloc(R->scns, (R->nscn + 1) * sizeof *ns);
    if (!ns)
        goto nomem;
    R->scns = ns;
    dsv4_scn_rec *sr = &R->scns[R->nscn];
    memset(sr, 0, sizeof *sr);
    sr->name = dsv4_h_strdup(dsv4_scenario_name(scn));
    sr->path = dsv4_h_strdup(dsv4_scenario_path(scn));
    sr->n_axes = dsv4_scenario_axis_count(scn);
    sr->axis_names = calloc(sr->n_axes + 1, sizeof *sr->axis_names);
    if (!sr->name || !sr->path || !sr->axis_names)
        goto nomem_scn;
    for (size_t a = 0; a < sr->n_axes; a++)
        if (!(sr->axis_names[a] = dsv4_h_strdup(dsv4_scenario_axis_name(scn, a))))
            goto nomem_scn;
    size_t scn_index = R->nscn++;

    size_t n = dsv4_scenario_count(scn), total = 0, done = 0;
    for (size_t i = 0; i < n; i++) {
        const dsv4_scenario_case *sc = dsv4_scenario_get(scn, i);
        if (!opts->filter || strstr(sc->name, opts->filter))
            total += inj && inj->defect(inj->user, scn, i) ? 2 : 1;
    }
    for (size_t i = 0; i < n; i++) {
        const dsv4_scenario_case *sc = dsv4_scenario_get(scn, i);
        if (opts->filter && !strstr(sc->name, opts->filter))
            continue;
        if (!dsv4_h_grow_cases(R, 2))
            goto nomem;
        const char *defect = inj ? inj->defect(inj->user, scn, i) : NULL;
        dsv4_case_result *c = new_case(scn, scn_index, i, sc, defect);
        if (!c)
            goto nomem;
        double t0 = now_s();
        run_case(opts, cache, 0, sc, c);
        c->seconds = now_s() - t0;
        R->cases[R->n++] = c;
        done++;
        if (opts->progress)
            opts->progress(opts->progress_user, done, total, c);
        if (defect) {
            /* The same case again with its defect injected, as a result of its own. */
            dsv4_case_result *f = new_case(scn, scn_index, i, sc, defect);
            if (!f)
                goto nomem;
            f->injected = true;
            /* A desync injected on purpose need not wait the full deadlock timeout to be reported. */
            inj->set(inj->user, defect, true);
            t0 = now_s();
            run_case(opts, cache, 1000, sc, f);
            f->seconds = now_s() - t0;
            inj->set(inj->user, defect, false);
            f->caught_by = first_failure(f);
            c->twin = R->n;
            f->twin = R->n - 1;
            R->cases[R->n++] = f;
            done++;
            if (opts->progress)
                opts->progress(opts->progress_user, done, total, f);
        }
    }
    *results = R;
    return DSV4_OK;
nomem_scn:
    /* Drop the half-recorded scenario, so a result set appended to stays whole. */
    free(sr->name);
    free(sr->path);
    for (size_t a = 0; sr->axis_names && a < sr->n_axes; a++)
        free(sr->axis_names[a]);
    free(sr->axis_names);
nomem:
    if (created)
        dsv4_run_results_free(R);
    else
        *results = R;
    return dsv4_seterr(err, DSV4_ERR_NOMEM, "run", "out of memory");
}
