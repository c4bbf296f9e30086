/*
 * Results built outside the scenario runner (compare/engines.c: `dsv4moe check`), so an
 * outside engine's verdicts go through the same report writers as `run`'s (report.json,
 * junit.xml, report.html); and how a case's token pool is sliced over its ranks (the runner,
 * export and check agree on it). Internal to the library: not an installed header.
 */
#ifndef DSV4MOE_RUN_EXT_H
#define DSV4MOE_RUN_EXT_H

#include "dsv4moe_harness/run.h"

/* Appends a scenario record (name, path) to *R (created when NULL); returns its index or SIZE_MAX
   (out of memory: *R unchanged when it existed, NULL when it did not). */
size_t dsv4_run_ext_scenario(dsv4_run_results **R, const char *name, const char *path);

/* Appends an empty case of scenario `scn` (its index); NULL when out of memory. The case takes
   copies of the strings and the token counts. */
dsv4_case_result *dsv4_run_ext_case(dsv4_run_results *R, size_t scn, size_t index, const char *name,
                                    const dsv4_config *cfg, int n_ranks, const int64_t *tokens, uint64_t seed,
                                    const char *ran_on);

/* The case's title (dsv4_case_title) where it differs from its name; NULL keeps it. */
void dsv4_run_ext_title(dsv4_case_result *c, const char *title);
/* Names what produced the case's outputs (report.json "ran_on"); NULL keeps the current name. */
void dsv4_run_ext_ran_on(dsv4_case_result *c, const char *ran_on);

/* Sets one check's result and detail (the first setting of a check wins). */
void dsv4_run_ext_check(dsv4_case_result *c, unsigned check_bit, dsv4_result r, const char *detail);

/* Records the numerics metrics of bf16 outputs a (candidate) and b (reference) [T, H], with the
   error profile that `run` keeps. */
void dsv4_run_ext_numerics(dsv4_case_result *c, const dsv4_compare_metrics *m, const uint16_t *a, const uint16_t *b,
                           int64_t T, int64_t H);
/* Records an outside-engine check's rounding profile and its beyond count with S (SPEC.md section 10;
   report.json's numerics "rounding" and "beyond_terms", report.html's numerics line). */
void dsv4_run_ext_outside(dsv4_case_result *c, const char *rounding, int64_t beyond_terms);

/* The case's status from its checks (error > fail > pass > skip) and its time. */
void dsv4_run_ext_finish(dsv4_case_result *c, double seconds);

/* Where each rank's tokens start in the case's token pool, as `run` slices them (the tp ranks of a
   block share their block's slice). */
void dsv4_run_ext_slices(const dsv4_topology *t, const int64_t *tokens, int n, int64_t *off);

#endif
