/*
 * Internal, the fault build only (make faults: -DDSV4_FAULTS, build/faults/): the defect
 * catalogue's runs. Not installed; the release library holds none of it.
 *
 * A scenario file maps the defects its cases name (key `fault`, "f01".."f14") to the library's
 * test hooks (core/testctl.h) in its top-level `faults` mapping:
 *
 *   faults:
 *     f01: {hook: drop_routed_clamp, findings: "1", defect: "...", injected_at: "fast/cpu/ffn.c ..."}
 *
 * (scenarios/seed-review.yaml holds the review's thirteen). dsv4_run_scenario_faults reads that
 * mapping and runs every case naming a defect twice, clean and with its hook set; the injected
 * run is a result of its own (dsv4_case_injected), left out of dsv4_run_summarize and junit.xml,
 * and dsv4_run_fault_rows pairs the two.
 *
 * Everything of the defect catalogue is here, none of it in the installed headers: the release
 * library parses a scenario's `fault` and `faults` keys (and refuses unknown defect ids) but has
 * no accessor for them and makes no injected runs. Included by the fault build's CLI
 * (cli/cmd_run.c), its tests (tests/test_faults.c) and the library's fault-build code.
 */
#ifndef DSV4MOE_HARNESS_FAULT_RUNS_H
#define DSV4MOE_HARNESS_FAULT_RUNS_H

#ifndef DSV4_FAULTS
#error "harness/fault_runs.h belongs to the fault build only (make faults defines DSV4_FAULTS)"
#endif

#include <stdbool.h>
#include <stddef.h>

#include "dsv4moe_harness/run.h"
#include "dsv4moe_harness/scenario.h"

/* The `fault` key of case i of the scenario ("f01".."f14", static), or NULL (none, or i out of
   range). */
const char *dsv4_scenario_case_fault(const dsv4_scenario *s, size_t i);

/* dsv4_run_scenario with the defects injected as above. A case naming a defect that the file's
   `faults` mapping lacks, or a hook the library does not have, is DSV4_ERR_FORMAT naming the file
   and the case (nothing run). */
dsv4_status dsv4_run_scenario_faults(const dsv4_scenario *scn, const dsv4_run_options *opts,
                                     dsv4_run_results **results, dsv4_error *err);

/* The defect a result's case catches (its scenario `fault` key), set in the results of
   dsv4_run_scenario_faults (NULL elsewhere and for a case naming none). */
const char *dsv4_case_defect(const dsv4_case_result *c);
/* Whether this result is the second run of its case, with the defect injected. */
bool dsv4_case_injected(const dsv4_case_result *c);

/*
 * The detection table: one row per case naming a defect, its clean and its injected run. A defect
 * is caught when every case naming it fails (or errors) with the defect injected; a clean run that
 * does not pass is a false failure. Strings belong to the results.
 */
typedef struct dsv4_fault_row {
    const char *fault;     /* "f01" .. "f14" */
    const char *hook;      /* the test hook set ("drop_routed_clamp") */
    const char *findings;  /* the review's findings it stands for ("3, 7") */
    const char *summary;   /* the defect in one line */
    const char *where;     /* the hook's place */
    const char *case_name;
    dsv4_result clean, injected;
    bool caught;           /* clean passed and the injected run failed or errored */
    const char *caught_by; /* "check result: detail" of the first failing check of the injected run, else "" */
} dsv4_fault_row;

/* Writes up to `max` rows into rows (may be NULL with max 0); returns the number of rows. */
size_t dsv4_run_fault_rows(const dsv4_run_results *results, dsv4_fault_row *rows, size_t max);

typedef struct dsv4_fault_summary {
    size_t defects;        /* distinct defects named by the cases run */
    size_t caught;         /* of them, caught by every case naming them */
    size_t mapped;         /* defects in the `faults` mappings of the files run */
    size_t clean_runs;     /* cases run without a defect (all of them, named or not) */
    size_t false_failures; /* clean runs that failed or errored */
} dsv4_fault_summary;
dsv4_fault_summary dsv4_run_fault_summary(const dsv4_run_results *results);

#endif
