/*
 * The verdict record: what a case result and a result set hold (dsv4moe_harness/run.h's opaque
 * types), and the few operations the runner, the checks, check of outside engines and the report
 * writers share. It lives in compare/ because both the runner (harness/) and check (compare/)
 * produce verdicts: harness/ includes compare/, never the other way. Not an installed header.
 */
#ifndef DSV4MOE_COMPARE_RESULTS_H
#define DSV4MOE_COMPARE_RESULTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsv4moe_harness/run.h"
#include "dsv4moe_harness/scenario.h"

typedef struct {
    dsv4_result r;
    char *detail; /* NULL: the check was not decided (not reported) */
    bool unrun;   /* a skip because the check could not run here (no CUDA device, ...), not because it does
                     not apply: the case is then skipped, never passed */
} dsv4_check_rec;

struct dsv4_case_result {
    char *name;
    char *title; /* dsv4_scenario_case.title (or case.json's "title"); NULL: the name */
    char *scn_name, *scn_path; /* the scenario's name and path */
    size_t scn;                /* index into results->scns */
    size_t index;              /* in its scenario */
    int line, col, explicit_index;
    int *axis_index; /* [n_axes of its scenario] or NULL */
    dsv4_result status;
    double seconds;
    unsigned requested;
    dsv4_check_rec checks[DSV4_CHECK_COUNT];
    bool has_metrics;
    dsv4_compare_metrics m;
    const char *rounding;  /* outside-engine checks: the profile (a static name), else NULL */
    int64_t beyond_terms;  /* with rounding: elements beyond the section 10 bound with S */
    dsv4_case_memory mem;
    /* what the case was */
    char *preset;
    dsv4_config cfg;
    dsv4_topology topo;
    int n_ranks;
    int64_t *tokens;
    bool *replay;
    uint64_t seed;
    dsv4_expect expect;
    char *regex;
    char *params;  /* the backend's params (the case's `params`), or NULL */
    char *backend; /* the backend that produced the numerics, or NULL */
    bool has_errors;
    dsv4_case_errors errs; /* the bounded error profile of numerics */
    char *defect;          /* the case's `fault` key (runs with an injector only), or NULL */
    bool injected;         /* this run had the defect injected */
    size_t twin;           /* index of the clean / injected twin in the results, SIZE_MAX for none */
    char *caught_by;       /* injected runs: the first failing check and its detail */
    bool lost_detail; /* a check's detail (or the backend name, the title) could not be allocated: an error, not a pass */
};

typedef struct {
    char *name, *path;
    size_t n_axes;
    char **axis_names;
} dsv4_scn_rec;

/* One defect of a scenario file's `faults` mapping: its id, test hook, findings, the defect in a line
   and where the hook sits. Only the fault build's runs (harness/fault_runs.c) record them. */
typedef struct {
    char *id, *hook, *findings, *defect, *where;
} dsv4_fault_entry;

struct dsv4_run_results {
    dsv4_case_result **cases;
    size_t n, cap;
    dsv4_scn_rec *scns;
    size_t nscn;
    dsv4_fault_entry *faults;
    size_t nfaults;
};

/* How the runner makes a case's second run with its defect injected (the fault build's
   harness/fault_runs.c): defect(user, scn, i) is case i's defect (its `fault` key) or NULL;
   set(user, defect, true) before the injected run, set(user, defect, false) after it. */
typedef struct {
    const char *(*defect)(void *user, const dsv4_scenario *scn, size_t i);
    void (*set)(void *user, const char *defect, bool on);
    void *user;
} dsv4_h_injector;

/* dsv4_run_scenario; with an injector, every case naming a defect runs a second time with it
   injected, as a result of its own (injected, paired through `twin`); both runs record the defect.
   Without one (the release library) no result has a defect. */
dsv4_status dsv4_h_run_scenario(const dsv4_scenario *scn, const dsv4_run_options *opts, const dsv4_h_injector *inj,
                                dsv4_run_results **results, dsv4_error *err);

/* strdup that passes NULL through (NULL also when out of memory). */
char *dsv4_h_strdup(const char *s);

/* Sets a check's result and detail (a later setting replaces an earlier one); a detail that cannot be
   allocated marks the case lost_detail. */
void dsv4_h_set_check(dsv4_case_result *c, unsigned bit, dsv4_result r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Whether the check has been decided. */
bool dsv4_h_check_set(const dsv4_case_result *c, unsigned bit);
/* Every requested check not yet decided gets `r` with the detail. */
/* Every requested check not decided yet gets r and detail; unrun marks them as checks that could not run. */
void dsv4_h_set_rest(dsv4_case_result *c, dsv4_result r, const char *detail, bool unrun);
/* The case's status from its checks: error (or a lost detail) > fail > pass > skip. */
void dsv4_h_finish_status(dsv4_case_result *c);

/* Frees a case result and everything it owns; NULL is a no-op. */
void dsv4_h_case_free(dsv4_case_result *c);
/* Room for `extra` more cases in R->cases. */
bool dsv4_h_grow_cases(dsv4_run_results *R, size_t extra);

/* Bins and the worst elements of a [sum tokens, H] bf16 comparison a (candidate) vs b (reference),
   ranks one after another; sets c->errs and c->has_errors. */
void dsv4_h_error_profile(dsv4_case_result *c, const uint16_t *a, const uint16_t *b, const int64_t *tokens,
                          int world, int64_t H);

/* The summary of the cases (injected runs left out) of `scn` (NULL: any) and of the scenario record
   scn_index (SIZE_MAX: any). */
dsv4_run_summary dsv4_h_summary(const dsv4_run_results *R, const dsv4_scenario *scn, size_t scn_index);

/* Whether the case belongs to `scn` (NULL: every case does). */
bool dsv4_h_case_in(const dsv4_case_result *c, const dsv4_scenario *scn);

/* v bytes as "4.6 MiB" (one decimal from KiB on, "812 B" below): the reports' and check's wording. */
const char *dsv4_h_human_bytes(uint64_t v, char *buf, size_t n);

#endif
