/*
 * dsv4moe: the scenario runner. Runs every case of an expanded scenario
 * (dsv4moe_harness/scenario.h) through its checks and records the results, and
 * writes them as report.json and junit.xml. The checks and their pass/skip
 * rules are documented in docs/scenarios.md ("Checks").
 *
 * Per case: the layer's weights are generated once per distinct
 * (dims, formats, predictor, layer, seed) into a cache folder and reused;
 * the input is a pool per (H, V, seed) of at least the sum of the ranks'
 * tokens (and 16), ranks taking consecutive slices (tp ranks of one block
 * share a slice). Every rank is planned; a world of one rank runs the
 * backend of its topology (or opts.backend) against the single-rank
 * reference; a larger world runs dsv4_dist_forward and compares each rank
 * with the reference on its tokens.
 */
#ifndef DSV4MOE_RUN_H
#define DSV4MOE_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe_harness/compare.h"
#include "dsv4moe/plan.h"
#include "dsv4moe_harness/scenario.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_result {
    DSV4_RESULT_PASS = 0,
    DSV4_RESULT_FAIL = 1,
    DSV4_RESULT_SKIP = 2,  /* a check: not requested, not applicable, or it could not run here; a case:
                              some check it asked for could not run (no CUDA device, ...) and none failed */
    DSV4_RESULT_ERROR = 3, /* the case could not be run (data generation, I/O, a backend that would not start) */
    DSV4_RESULT_SELF = 4   /* numerics compared the reference with itself (the ref backend at world 1: nothing
                              between the two sides, so it could not fail); a case whose numerics is self-
                              compared and whose other checks pass. Never a pass. */
} dsv4_result;

/* "pass", "fail", "skip", "error", "self-compared"; "?" otherwise. */
DSV4_API const char *dsv4_result_name(dsv4_result r);

typedef struct dsv4_case_result dsv4_case_result;
typedef struct dsv4_run_results dsv4_run_results;

/* Called after every case with the number done and the number to run in this call. */
typedef void (*dsv4_run_progress_fn)(void *user, size_t done, size_t total, const dsv4_case_result *last);

typedef struct dsv4_run_options {
    uint32_t struct_size;     /* sizeof(dsv4_run_options), set by init */
    const char *cache_dir;    /* generated weights and inputs (created on demand); NULL: "out/cache" */
    int backend;              /* -1 (default): each case's topology.backend; DSV4_BACKEND_REF, _CPU or
                                 _CUDA: replaces ref/cpu in every case (cuda cases keep theirs) */
    const char *filter;       /* run only cases whose name contains this substring; NULL: all */
    int threads;              /* threads of the data generation, the backend and the reference (>= 1; default 2) */
    dsv4_run_progress_fn progress; /* may be NULL */
    void *progress_user;
    /* When set, every multi-rank case writes each rank's collective trace as the JSONL of
       dsv4moe_harness/symmetry.h to trace_dir/<case id>/rank<r>.jsonl (dsv4moe symmetry reads them;
       the case id as dsv4_export_case_id makes it). Default NULL. */
    const char *trace_dir;
} dsv4_run_options;

/* cache "out/cache", backend -1, no filter, 2 threads, no progress, no traces. NULL is a no-op. */
DSV4_API void dsv4_run_options_init(dsv4_run_options *opt);

/*
 * Runs every case of scn (matching opts->filter) and appends its results to
 * *results (created when *results is NULL, so several scenarios can share
 * one result set and one report). Failing checks are results, not errors:
 * the return value is DSV4_OK unless the run itself could not proceed
 * (invalid arguments, the cache folder cannot be created, out of memory);
 * a case that cannot run is recorded with status DSV4_RESULT_ERROR.
 * opts may be NULL (defaults).
 */
DSV4_API dsv4_status dsv4_run_scenario(const dsv4_scenario *scn, const dsv4_run_options *opts,
                                       dsv4_run_results **results, dsv4_error *err);

/* NULL is a no-op. */
DSV4_API void dsv4_run_results_free(dsv4_run_results *results);

/* ---------------- accessors ---------------- */

DSV4_API size_t dsv4_run_count(const dsv4_run_results *results);
/* NULL when i >= count. */
DSV4_API const dsv4_case_result *dsv4_run_get(const dsv4_run_results *results, size_t i);
/* Cases by status; `seconds` is the summed case time. */
typedef struct dsv4_run_summary {
    size_t cases, passed, failed, skipped, errors;
    double seconds;
    size_t self_compared; /* cases with status DSV4_RESULT_SELF */
} dsv4_run_summary;
DSV4_API dsv4_run_summary dsv4_run_summarize(const dsv4_run_results *results);

DSV4_API const char *dsv4_case_name(const dsv4_case_result *c);
/* What the case is for people (dsv4_scenario_case.title: axis values by what they set); the name
   when it has none. Reports and JUnit show it; the name is the case's id. */
DSV4_API const char *dsv4_case_title(const dsv4_case_result *c);
DSV4_API const char *dsv4_case_scenario(const dsv4_case_result *c); /* the scenario's `name` */
DSV4_API const char *dsv4_case_file(const dsv4_case_result *c);     /* its path */
DSV4_API dsv4_result dsv4_case_status(const dsv4_case_result *c);
DSV4_API double dsv4_case_seconds(const dsv4_case_result *c);
/* The case's index in its scenario (dsv4_scenario_get). */
DSV4_API size_t dsv4_case_index(const dsv4_case_result *c);

/* The result of one check (a DSV4_CHECK_* bit): DSV4_RESULT_SKIP with detail "not requested" when the
   case did not ask for it. The detail is never NULL. */
DSV4_API dsv4_result dsv4_case_check(const dsv4_case_result *c, unsigned check_bit, const char **detail);

/* The numerics metrics (all ranks' outputs together); false when numerics did not compare anything. */
DSV4_API bool dsv4_case_metrics(const dsv4_case_result *c, dsv4_compare_metrics *out);

/* Bins of the error distributions of a numerics comparison. */
#define DSV4_ERR_BINS 16
/* Worst elements kept per comparison. */
#define DSV4_WORST_MAX 8

typedef struct dsv4_case_worst {
    int64_t index;  /* element in all ranks' outputs, rank after rank: row * H + column */
    int rank;       /* the rank whose output holds it (0 for one rank) */
    int64_t token;  /* that rank's token */
    int64_t column; /* hidden channel */
    float a, b;     /* backend, reference */
    double diff;    /* |a - b|; +inf where exactly one is not finite or they differ while not finite */
} dsv4_case_worst;

/*
 * The bounded error profile of a numerics comparison (bf16 outputs against the
 * reference), kept whatever the number of elements:
 *   ulp_bins[0]: 0 ULP; ulp_bins[i], 1 <= i <= 14: [2^(i-1), 2^i) ULP; ulp_bins[15]: >= 2^14 ULP or
 *   a non-finite pair that differs;
 *   abs_bins[0]: |a-b| = 0; abs_bins[i], 1 <= i <= 14: [10^(i-10), 10^(i-9)) (bin 1 also holds smaller
 *   values); abs_bins[15]: >= 1e5 or non-finite;
 *   worst: the elements with the largest |a-b| (ties: the lower index), largest first; only
 *   elements that differ.
 */
typedef struct dsv4_case_errors {
    int64_t n;
    uint64_t ulp_bins[DSV4_ERR_BINS];
    uint64_t abs_bins[DSV4_ERR_BINS];
    int n_worst;
    dsv4_case_worst worst[DSV4_WORST_MAX];
} dsv4_case_errors;

/* The error profile of the numerics check; false when numerics compared nothing. */
DSV4_API bool dsv4_case_errors_of(const dsv4_case_result *c, dsv4_case_errors *out);

/* Bytes: the smallest budget available over the ranks, the largest planned maximum
   (dsv4_plan_workspace_max), the largest planned workspace of the step run, the largest measured peak.
   All 0 when no plan was created. */
typedef struct dsv4_case_memory {
    uint64_t available, planned_max, planned_step, peak;
    bool measured; /* a backend or the distributed driver measured peak */
} dsv4_case_memory;
DSV4_API dsv4_case_memory dsv4_case_memory_of(const dsv4_case_result *c);

/* ---------------- reports ---------------- */

/*
 * report.json: a summary, then every case with its axes (names and value
 * indexes), topology, tokens, checks (result and detail), numerics metrics
 * and memory. junit.xml: one <testsuite> per scenario, one <testcase> per
 * case, a <failure> (or <error>, <skipped>) whose text lists the details of
 * the failing checks. scn may be NULL (every case of results); when given,
 * only its cases are written. Both are written atomically: a temporary file
 * next to `path`, renamed into place when complete, removed on error.
 */
DSV4_API dsv4_status dsv4_report_json(const dsv4_run_results *results, const dsv4_scenario *scn, const char *path,
                                      dsv4_error *err);
DSV4_API dsv4_status dsv4_report_junit(const dsv4_run_results *results, const dsv4_scenario *scn, const char *path,
                                       dsv4_error *err);

/*
 * report.html (harness/report_html.c): one self-contained page (inline CSS
 * and SVG, no script, no external resource) for every case of results: a
 * summary table; every case with its status and checks (each detail as a
 * tooltip, failing details shown in full); per case with numerics the bf16
 * ULP percentiles (p50/p90/p99/p99.9/max, log scale) and the error metrics;
 * memory bars (budget, planned maximum and step, measured peak); for a
 * symmetry failure the two ranks' differing collectives side by side. All
 * text is escaped. Written atomically like the others.
 */
DSV4_API dsv4_status dsv4_report_html(const dsv4_run_results *results, const char *path, dsv4_error *err);

/*
 * The three reports of one run as one unit: DIR/report.json, DIR/junit.xml and
 * DIR/report.html (every case of results). All three are rendered and written to
 * temporaries in DIR and fsynced first; only when all three are complete are they renamed
 * into place, together, while holding an exclusive flock(2) on DIR/.report.lock. So a
 * failure anywhere (a full disk at the third) changes none of the previous reports, and
 * two runs writing to one folder leave the three files of one of them, never a mix. A
 * reader that wants a consistent set takes LOCK_SH on DIR/.report.lock while reading.
 * DIR must exist.
 */
#define DSV4_REPORT_LOCK ".report.lock"
DSV4_API dsv4_status dsv4_report_write_all(const dsv4_run_results *results, const char *dir, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
