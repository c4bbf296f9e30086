/* dsv4moe run: run scenario matrices, write report.json, junit.xml and report.html, print a summary. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fileio.h"
#include "cli/cli.h"
#include "dsv4moe/backend.h"
#ifdef DSV4_FAULTS
#include "harness/fault_runs.h" /* the fault build only: not an installed header */
#endif
#include "dsv4moe_harness/run.h"
#include "dsv4moe_harness/scenario.h"

static const char RUN_HELP[] =
    "usage: dsv4moe run FILE.yaml... [--report DIR] [--cache DIR] [--backend ref|cpu|cuda]\n"
    "                   [--filter SUBSTRING] [--threads N] [--traces DIR] [--strict | --no-strict] [--faults]\n\n"
    "Expands each scenario file into its cases (docs/scenarios.md), runs every case's checks\n"
    "(numerics, determinism, symmetry, memory, empty, clamp_exercised, refusal) and writes\n"
    "DIR/report.json, DIR/junit.xml and DIR/report.html. Prints a summary and the details of\n"
    "every failing case.\n\n"
    "  --report DIR         where the reports go (default out)\n"
    "  --cache DIR          generated weights and inputs, reused between runs (default DIR/cache)\n"
    "  --backend B          run ref, cpu or cuda (make cuda's CLI) in place of every case's ref/cpu backend\n"
    "                       (cases on cuda keep theirs)\n"
    "  --filter SUBSTRING   only the cases whose name contains SUBSTRING\n"
    "  --threads N          threads of the backend and the reference (default 2)\n"
    "  --traces DIR         multi-rank cases write each rank's collective trace to\n"
    "                       DIR/<case id>/rank<r>.jsonl (dsv4moe symmetry reads them; docs/engines.md)\n"
    "  --faults             the defect catalogue (fault build only: make faults, then\n"
    "                       build/faults/dsv4moe): every case with a `fault` key runs clean\n"
    "                       and with the test hook its file's `faults` mapping names set; prints the detection\n"
    "                       table; exit 0 only if every defect is caught and every clean run passes\n"
    "  --strict             a skipped case (a check it asked for could not run here, e.g. no CUDA device)\n"
    "                       fails the run, its reason printed; the default when the environment variable\n"
    "                       CI is set (not 0 or false); --no-strict turns it off\n"
    "  On a terminal, a progress line on stderr shows the case count and the time left.\n\n"
    "A case passes only if every check it asked for ran (or does not apply to it) and one could fail. A\n"
    "case on the ref backend at world 1 holds the reference to itself: its numerics is self-compared,\n"
    "counted apart and never a pass (a case without topology.backend runs the cpu backend).\n\n"
    "exit status: 0 no case failed (skipped and self-compared cases are counted, not failures; under\n"
    "--strict a skipped case fails), 1 a case failed, 2 bad input\n";

typedef struct {
    bool tty;
    size_t base, total;
    double t0;
} progress_state;

static void on_progress(void *user, size_t done, size_t total, const dsv4_case_result *last)
{
    progress_state *p = user;
    (void)total;
    if (!p->tty)
        return;
    size_t d = p->base + done;
    double el = cli_now() - p->t0;
    double left = d ? el / (double)d * (double)(p->total - d) : 0;
    char esc[1024];
    const char *name = cli_esc(dsv4_case_title(last), esc, sizeof esc);
    size_t nl = strlen(name);
    fprintf(stderr, "\r\033[K[%zu/%zu] %s  %.0f s left  %s%s", d, p->total, dsv4_result_name(dsv4_case_status(last)),
            left, nl > 60 ? "..." : "", nl > 60 ? name + nl - 57 : name);
    fflush(stderr);
}

#ifdef DSV4_FAULTS
/* The detection table of --faults; EXIT_OK only if every defect the cases run name is caught, no clean
   run failed, and (without --filter, which runs a chosen subset) every mapped defect was run. */
static int print_detection_table(const dsv4_run_results *res, const char *filter)
{
    size_t n = dsv4_run_fault_rows(res, NULL, 0);
    dsv4_fault_row *rows = calloc(n + 1, sizeof *rows);
    if (!rows)
        return cli_failf("run", "out of memory");
    dsv4_run_fault_rows(res, rows, n);
    printf("\ndetection table (the review's defects injected one at a time)\n");
    printf("%-5s %-8s %-40s %-6s %-8s %-6s %s\n", "fault", "finding", "scenario", "clean", "injected", "caught",
           "caught by");
    for (size_t i = 0; i < n; i++) {
        const dsv4_fault_row *r = &rows[i];
        const char *nm = strrchr(r->case_name, '/');
        char by[121];
        snprintf(by, sizeof by, "%s", r->caught_by);
        printf("%-5s %-8s %-40s %-6s %-8s %-6s %s\n", r->fault, r->findings, nm ? nm + 1 : r->case_name,
               dsv4_result_name(r->clean), dsv4_result_name(r->injected), r->caught ? "yes" : "NO", by);
    }
    free(rows);
    dsv4_fault_summary s = dsv4_run_fault_summary(res);
    printf("\n%zu of %zu defects caught; %zu false failures in %zu clean runs\n", s.caught, s.defects,
           s.false_failures, s.clean_runs);
    const size_t unrun = s.mapped > s.defects ? s.mapped - s.defects : 0;
    if (unrun && filter)
        printf("%zu mapped defect%s not run: --filter '%s' left out the cases naming %s\n", unrun,
               unrun == 1 ? "" : "s", filter, unrun == 1 ? "it" : "them");
    else if (unrun)
        printf("%zu mapped defect%s named by no case: each defect in a file's faults mapping needs a case that "
               "injects it\n", unrun, unrun == 1 ? "" : "s");
    return s.caught == s.defects && (filter || !unrun) && s.false_failures == 0 ? EXIT_OK : EXIT_CHECK_FAILED;
}
#endif

int cmd_run(int argc, char **argv)
{
    const char *cmd = "run";
    const char *report = "out", *cache = NULL, *filter = NULL, *traces = NULL;
    int backend = -1;
    int64_t threads = 2;
#ifdef DSV4_FAULTS
    bool faults = false;
#endif
    /* --strict (a skipped case fails the run) is the default where the CI variable says so */
    const char *ci = getenv("CI");
    bool strict = ci && ci[0] && strcmp(ci, "0") && strcmp(ci, "false");
    static const char *const opts[] = {"--report", "--cache", "--backend", "--filter", "--threads", "--traces", NULL};
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .help = RUN_HELP, .value_opts = opts,
                     .flags = (const char *const[]){"--faults", "--strict", "--no-strict", NULL}, .positional = true};
    const char *a, *v;
    while (cli_next_arg(&args, &a, &v)) {
        if (!strcmp(a, "--faults")) {
#ifndef DSV4_FAULTS
            return cli_failf(cmd, "--faults needs the fault build, which holds the defect catalogue: run make faults, "
                                  "then build/faults/dsv4moe run --faults FILE.yaml");
#else
            faults = true;
#endif
        } else if (!strcmp(a, "--strict"))
            strict = true;
        else if (!strcmp(a, "--no-strict"))
            strict = false;
        else if (!strcmp(a, "--report"))
            report = v;
        else if (!strcmp(a, "--cache"))
            cache = v;
        else if (!strcmp(a, "--filter"))
            filter = v;
        else if (!strcmp(a, "--traces"))
            traces = v;
        else if (!strcmp(a, "--backend")) {
            backend = -1;
            for (int i = 0; i < dsv4_backend_count(); i++) {
                dsv4_backend_info info;
                dsv4_backend_info_at(i, &info, NULL);
                if (!strcmp(v, info.name))
                    backend = i;
            }
            if (backend < 0)
                return cli_failf(cmd, "option --backend: '%s' is not %s", v, dsv4_backends_registered());
            /* Asking for a backend this build lacks would "pass" on the checks that need no
               backend; it is bad input, refused before any case runs. */
            if (!dsv4_backend_available((dsv4_backend_kind)backend))
                return cli_failf(cmd, "option --backend: '%s' is not part of this build (available: %s)", v,
                                 dsv4_backends_available());
            /* ... and so would one this build holds that this machine cannot run (cuda without a device) */
            dsv4_backend_info info;
            if (dsv4_backend_info_of((dsv4_backend_kind)backend, &info, NULL) == DSV4_OK && !info.available)
                return cli_failf(cmd, "option --backend: '%s' is built but cannot run on this machine (%s); run on a "
                                      "machine with a CUDA device, or use --backend cpu",
                                 v, info.why);
        } else if (cli_parse_i64(cmd, a, v, 1, 256, &threads))
            return EXIT_BAD_INPUT;
    }
    if (args.status >= 0)
        return args.status;
    const int nfiles = args.nops;
    if (nfiles == 0)
        return cli_failf(cmd, "no scenario file given (see dsv4moe run --help)");
    const char *const *files = (const char *const *)argv + 1; /* the operands (cli_next_arg) */
    dsv4_scenario **scns;
    int rc = cli_load_scenarios(&args, &scns);
    if (rc)
        return rc;
    size_t total = 0;
    for (int f = 0; f < nfiles; f++)
        for (size_t i = 0; i < dsv4_scenario_count(scns[f]); i++)
            total += !filter || strstr(dsv4_scenario_get(scns[f], i)->name, filter);
    if (total == 0) {
        rc = cli_failf(cmd, "no case %s%s%s", filter ? "matches --filter '" : "to run", filter ? filter : "",
                       filter ? "'" : "");
        goto out;
    }
    dsv4_error merr;
    if (dsv4_mkdir_p(report, &merr)) {
        rc = cli_fail(cmd, &merr);
        goto out;
    }
    char cache_buf[4200];
    if (!cache) {
        snprintf(cache_buf, sizeof cache_buf, "%s/cache", report);
        cache = cache_buf;
    }

    progress_state ps = {isatty(2) != 0, 0, total, cli_now()};
    dsv4_run_options ro;
    dsv4_run_options_init(&ro);
    ro.cache_dir = cache;
    ro.backend = backend;
    ro.filter = filter;
    ro.threads = (int)threads;
    ro.progress = on_progress;
    ro.progress_user = &ps;
    ro.trace_dir = traces;
    dsv4_error err;
    dsv4_error_clear(&err);
    dsv4_run_results *res = NULL;
    double t0 = cli_now();
    for (int f = 0; f < nfiles; f++) {
        size_t before = dsv4_run_count(res);
#ifdef DSV4_FAULTS
        dsv4_status rst = faults ? dsv4_run_scenario_faults(scns[f], &ro, &res, &err)
                                 : dsv4_run_scenario(scns[f], &ro, &res, &err);
#else
        dsv4_status rst = dsv4_run_scenario(scns[f], &ro, &res, &err);
#endif
        if (rst != DSV4_OK) {
            if (ps.tty)
                fputs("\r\033[K", stderr);
            char esc[4096];
            fprintf(stderr, "dsv4moe run: %s: %s\n", cli_esc(files[f], esc, sizeof esc), err.message);
            dsv4_run_results_free(res);
            rc = EXIT_BAD_INPUT;
            goto out;
        }
        ps.base += dsv4_run_count(res) - before;
    }
    double wall = cli_now() - t0;
    if (ps.tty)
        fputs("\r\033[K", stderr);

    char jpath[4200], xpath[4200], hpath[4200];
    snprintf(jpath, sizeof jpath, "%s/report.json", report);
    snprintf(xpath, sizeof xpath, "%s/junit.xml", report);
    snprintf(hpath, sizeof hpath, "%s/report.html", report);
    if (dsv4_report_write_all(res, report, &err)) {
        fprintf(stderr, "dsv4moe run: %s\n", err.message);
        dsv4_run_results_free(res);
        rc = EXIT_BAD_INPUT;
        goto out;
    }

    dsv4_run_summary s = dsv4_run_summarize(res);
    printf("dsv4moe run: %zu cases: %zu passed, %zu failed, %zu skipped, %zu self-compared, %zu errors in %.1f s\n",
           s.cases, s.passed, s.failed, s.skipped, s.self_compared, s.errors, wall);
    if (s.self_compared)
        printf("  (self-compared: the ref backend at world 1 held to the reference, which is itself; not a pass)\n");
    for (size_t i = 0; i < dsv4_run_count(res); i++) {
        const dsv4_case_result *c = dsv4_run_get(res, i);
        dsv4_result st = dsv4_case_status(c);
        if (st != DSV4_RESULT_FAIL && st != DSV4_RESULT_ERROR && !(strict && st == DSV4_RESULT_SKIP))
            continue;
#ifdef DSV4_FAULTS
        if (dsv4_case_injected(c))
            continue; /* an injected run's failure is in the detection table */
#endif
        /* Names and details come from the scenario file: control characters are escaped. */
        char esc[4096];
        printf("\n%s %s",
               st == DSV4_RESULT_FAIL ? "FAIL" : st == DSV4_RESULT_SKIP ? "SKIPPED (a failure under --strict)" : "ERROR",
               cli_esc(dsv4_case_title(c), esc, sizeof esc));
        if (strcmp(dsv4_case_title(c), dsv4_case_name(c))) /* the id --filter takes */
            printf("  [%s]", cli_esc(dsv4_case_name(c), esc, sizeof esc));
        printf("\n");
        for (int b = 0; b < DSV4_CHECK_COUNT; b++) {
            const char *detail;
            dsv4_result r = dsv4_case_check(c, 1u << b, &detail);
            if (r == DSV4_RESULT_FAIL || r == DSV4_RESULT_ERROR ||
                (st == DSV4_RESULT_SKIP && r == DSV4_RESULT_SKIP && strcmp(detail, "not requested") &&
                 strncmp(detail, "not applicable", 14)))
                printf("  %-16s %s: %s\n", dsv4_check_name(1u << b), dsv4_result_name(r),
                       cli_esc(detail, esc, sizeof esc));
        }
    }
    printf("\nreports: %s, %s, %s\n", jpath, xpath, hpath);
    rc = s.failed || s.errors || (strict && s.skipped) ? EXIT_CHECK_FAILED : EXIT_OK;
#ifdef DSV4_FAULTS
    if (faults)
        rc = print_detection_table(res, filter);
#endif
    dsv4_run_results_free(res);
out:
    cli_free_scenarios(scns, nfiles);
    return rc;
}
