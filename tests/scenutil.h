/* Helpers of the suites that load scenarios and run them through the harness (run, report,
   faults, scenario): loading with the error asserted away, a case of the results by name. */
#ifndef DSV4MOE_SCENUTIL_H
#define DSV4MOE_SCENUTIL_H

#include <check.h>
#include <stdio.h>
#include <string.h>

#include "dsv4moe_harness/run.h"
#include "dsv4moe_harness/scenario.h"
#include "tests/testutil.h"

/* The scenario file `rel` of the source tree (scenarios/ci.yaml, ...), loaded. */
static inline dsv4_scenario *tu_scenario_file(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", tu_src_dir(), rel);
    dsv4_scenario *s = NULL;
    dsv4_error e;
    ck_assert_msg(dsv4_scenario_load(path, &s, &e) == DSV4_OK, "%s", e.message);
    return s;
}

/* A scenario from its text (name: the file name its errors quote), loaded. */
static inline dsv4_scenario *tu_scenario_text(const char *text, const char *name)
{
    dsv4_scenario *s = NULL;
    dsv4_error e;
    ck_assert_msg(dsv4_scenario_load_string(text, name, &s, &e) == DSV4_OK, "%s", e.message);
    return s;
}

/* Every case of s through the harness, its results cached in `cache` (backend -1: each case's
   own; trace_dir: NULL, or where the collective traces go). */
static inline dsv4_run_results *tu_run(const dsv4_scenario *s, const char *cache, int backend, const char *trace_dir)
{
    dsv4_run_options o;
    dsv4_run_options_init(&o);
    o.cache_dir = cache;
    o.backend = backend;
    o.trace_dir = trace_dir;
    dsv4_run_results *r = NULL;
    dsv4_error e;
    ck_assert_msg(dsv4_run_scenario(s, &o, &r, &e) == DSV4_OK, "%s", e.message);
    return r;
}

/* The first case of r whose name ends in `suffix`; the test fails when there is none. */
static inline const dsv4_case_result *tu_case_find(const dsv4_run_results *r, const char *suffix)
{
    for (size_t i = 0; i < dsv4_run_count(r); i++) {
        const char *n = dsv4_case_name(dsv4_run_get(r, i));
        size_t a = strlen(n), b = strlen(suffix);
        if (a >= b && !strcmp(n + a - b, suffix))
            return dsv4_run_get(r, i);
    }
    ck_abort_msg("no case named *%s", suffix);
    return NULL;
}

#endif
