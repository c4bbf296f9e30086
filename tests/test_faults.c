/*
 * The defect catalogue (scenarios/seed-review.yaml's `faults` mapping, the test hooks of
 * core/testctl.h) and `dsv4moe run --faults`.
 *
 * Built twice: in the release build (make test) it checks that the catalogue is absent (the
 * CLI's --faults an error with exit 2) and that the scenario keys `fault`, `faults` and
 * `checkpoint` parse; in the fault build (make test-faults, build/faults/) it also checks the
 * keys' values (harness/fault_runs.h: the release library has no accessor for them), test
 * control, and runs scenarios/seed-review.yaml with every defect injected and asserts the
 * detection table: 13 of 13 caught, 0 false failures.
 */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe_harness/run.h"
#include "dsv4moe_harness/scenario.h"
#include "core/testctl.h"
#ifdef DSV4_FAULTS
#include "harness/fault_runs.h"
#endif
#include "tests/scenutil.h"

Suite *faults_suite(void);

/* The review's defects (fourteen findings, 3 and 7 one desync). */
#define REVIEW_DEFECTS 13

#ifdef DSV4_FAULTS
static const char *cache_dir(void)
{
    static char buf[512];
    return tu_path(buf, sizeof buf, "faults_cache");
}
#endif

/* seed-review.yaml loads in both builds; in the fault build, every defect of the review is named by
   at least one of its cases, f07 by none. */
START_TEST(seed_review_names_every_defect)
{
    dsv4_scenario *s = tu_scenario_file("scenarios/seed-review.yaml");
    ck_assert_uint_ge(dsv4_scenario_count(s), REVIEW_DEFECTS);
#ifdef DSV4_FAULTS
    static const char *const ids[] = {"f01", "f02", "f03", "f04", "f05", "f06", "f08",
                                      "f09", "f10", "f11", "f12", "f13", "f14"};
    ck_assert_uint_eq(sizeof ids / sizeof ids[0], REVIEW_DEFECTS);
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        int n = 0;
        for (size_t i = 0; i < dsv4_scenario_count(s); i++) {
            const char *f = dsv4_scenario_case_fault(s, i);
            n += f && !strcmp(f, ids[k]);
        }
        ck_assert_msg(n >= 1, "no case of seed-review.yaml names %s", ids[k]);
    }
    /* finding 7 is the desync of 3: its case names f03 */
    bool seen7 = false;
    for (size_t i = 0; i < dsv4_scenario_count(s); i++) {
        const char *f = dsv4_scenario_case_fault(s, i);
        if (strstr(dsv4_scenario_get(s, i)->name, "/f07-")) {
            seen7 = true;
            ck_assert_str_eq(f, "f03");
        }
        ck_assert(!f || strcmp(f, "f07"));
    }
    ck_assert(seen7);
    ck_assert_ptr_null(dsv4_scenario_case_fault(s, dsv4_scenario_count(s)));
    ck_assert_ptr_null(dsv4_scenario_case_fault(NULL, 0));
#endif
    dsv4_scenario_free(s);
}
END_TEST

static dsv4_status load_text(const char *text, dsv4_scenario **s, dsv4_error *e)
{
    return dsv4_scenario_load_string(text, "k.yaml", s, e);
}

START_TEST(fault_and_checkpoint_keys)
{
    dsv4_scenario *s = NULL;
    dsv4_error e;
    static const char ok[] = "name: k\ndefaults: {layer: 1}\ncases:\n"
                             "  - {name: a, fault: f05, checkpoint: {layout: stacked, shards: 3, order: experts_last}}\n"
                             "  - {name: b}\n";
    ck_assert_msg(load_text(ok, &s, &e) == DSV4_OK, "%s", e.message);
    const dsv4_scenario_case *a = dsv4_scenario_get(s, 0), *b = dsv4_scenario_get(s, 1);
#ifdef DSV4_FAULTS
    ck_assert_str_eq(dsv4_scenario_case_fault(s, 0), "f05");
    ck_assert_ptr_null(dsv4_scenario_case_fault(s, 1));
#endif
    ck_assert_int_eq(a->checkpoint.layout, DSV4_LAYOUT_STACKED);
    ck_assert_int_eq(a->checkpoint.shards, 3);
    ck_assert(a->checkpoint.experts_last);
    ck_assert_int_eq(b->checkpoint.layout, DSV4_LAYOUT_SPLIT);
    ck_assert_int_eq(b->checkpoint.shards, 1);
    ck_assert(!b->checkpoint.experts_last);
    dsv4_scenario_free(s);

    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"name: k\ndefaults: {layer: 1}\ncases:\n  - {name: a, fault: f07}\n", "k.yaml:4:"},
        {"name: k\ndefaults: {layer: 1}\ncases:\n  - {name: a, fault: f99}\n", "unknown defect 'f99'"},
        {"name: k\ndefaults: {layer: 1}\ncases:\n  - {name: a, fault: [f01]}\n", "k.yaml:4:"},
        {"name: k\ndefaults: {layer: 1}\ncases:\n  - {name: a, checkpoint: {shards: 0}}\n", "checkpoint.shards"},
        {"name: k\ndefaults: {layer: 1}\ncases:\n  - {name: a, checkpoint: {shards: 17}}\n", "checkpoint.shards"},
        {"name: k\ndefaults: {layer: 1}\ncases:\n  - {name: a, checkpoint: {layout: raw}}\n", "checkpoint.layout"},
        {"name: k\ndefaults: {layer: 1}\ncases:\n  - {name: a, checkpoint: {bogus: 1}}\n",
         "unknown checkpoint key 'bogus'"},
        {"name: k\ndefaults: {layer: 1}\ncases:\n  - {name: a, checkpoint: stacked}\n", "k.yaml:4:"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s = NULL;
        ck_assert_int_ne(load_text(bad[i].text, &s, &e), DSV4_OK);
        ck_assert_ptr_null(s);
        ck_assert_msg(strstr(e.message, bad[i].needle), "case %zu: '%s' lacks '%s'", i, e.message, bad[i].needle);
        ck_assert_msg(strstr(e.message, "k.yaml:4:"), "case %zu: '%s' has no file:line:col", i, e.message);
    }
    s = NULL;
    ck_assert_int_ne(load_text("name: k\ndefaults: {layer: 1}\ncases:\n  - {name: a, fault: f07}\n", &s, &e), DSV4_OK);
    ck_assert_ptr_nonnull(strstr(e.message, "write fault: f03"));

    /* The top-level `faults` mapping (read by the fault build): its keys are defect ids. */
    s = NULL;
    ck_assert_msg(load_text("name: k\nfaults: {f01: {hook: drop_routed_clamp}}\ndefaults: {layer: 1}\ncases: [{name: a, fault: f01}]\n", &s, &e) ==
                      DSV4_OK,
                  "%s", e.message);
    dsv4_scenario_free(s);
    s = NULL;
    ck_assert_int_ne(load_text("name: k\nfaults: {f99: {hook: x}}\ndefaults: {layer: 1}\n", &s, &e), DSV4_OK);
    ck_assert_msg(strstr(e.message, "k.yaml:2:") && strstr(e.message, "faults: unknown defect 'f99'"), "%s", e.message);
    ck_assert_int_ne(load_text("name: k\nfaults: [f01]\ndefaults: {layer: 1}\n", &s, &e), DSV4_OK);
    ck_assert_msg(strstr(e.message, "k.yaml:2:"), "%s", e.message);
    ck_assert_ptr_null(s);
}
END_TEST

#ifndef DSV4_FAULTS

/* The release library holds no catalogue: the CLI points at the fault build. */
START_TEST(release_refuses_faults)
{
    char out[8192], args[1200], dir[512];
    tu_path(dir, sizeof dir, "faults_release");
    snprintf(args, sizeof args, "run --faults %s/scenarios/seed-review.yaml --report %s", tu_src_dir(), dir);
    int rc = tu_run_cli(args, "faults_release.txt", out, sizeof out);
    if (rc == -2)
        return; /* not run through make test */
    ck_assert_msg(rc == 2, "rc %d: %s", rc, out);
    ck_assert_msg(strstr(out, "fault build") && strstr(out, "make faults"), "%s", out);
    char jp[600];
    snprintf(jp, sizeof jp, "%s/report.json", dir);
    ck_assert(!tu_file_exists(jp));
}
END_TEST

#else

/* Test control: hooks by name, set, read, reset; unknown hooks and ops refused. */
START_TEST(test_control_hooks)
{
    for (int h = 0; h < DSV4_HOOK_COUNT; h++)
        ck_assert_uint_eq(dsv4_test_hook_value((dsv4_test_hook)h), 0);
    for (int h = 1; h < DSV4_HOOK_COUNT; h++) {
        const char *n = dsv4_test_hook_name((dsv4_test_hook)h);
        ck_assert_ptr_nonnull(n);
        ck_assert_int_eq(dsv4_test_hook_parse(n), h);
    }
    ck_assert_ptr_null(dsv4_test_hook_name(DSV4_HOOK_NONE));
    ck_assert_ptr_null(dsv4_test_hook_name(DSV4_HOOK_COUNT));
    ck_assert_int_eq(dsv4_test_hook_parse("f01"), DSV4_HOOK_NONE); /* hooks are named by behaviour */
    ck_assert_int_eq(dsv4_test_hook_parse("drop_routed_clamp"), DSV4_HOOK_DROP_ROUTED_CLAMP);
    ck_assert_int_eq(dsv4_test_control(DSV4_TESTCTRL_HOOK_SET, (int)DSV4_HOOK_REFUSAL_OMITS_CUDA_GRAPH, (uint64_t)1), 0);
    ck_assert(DSV4_TESTHOOK(REFUSAL_OMITS_CUDA_GRAPH));
    ck_assert(!DSV4_TESTHOOK(DROP_ROUTED_CLAMP));
    ck_assert_int_eq(dsv4_test_control(DSV4_TESTCTRL_HOOK_SET, (int)DSV4_HOOK_SKIP_METADATA_COLLECTIVE,
                                       (uint64_t)1 << 3),
                     0);
    ck_assert(DSV4_TESTHOOK_RANK(SKIP_METADATA_COLLECTIVE, 3));
    ck_assert(!DSV4_TESTHOOK_RANK(SKIP_METADATA_COLLECTIVE, 2));
    ck_assert_int_eq(dsv4_test_control(DSV4_TESTCTRL_HOOK_SET, (int)DSV4_HOOK_COUNT, (uint64_t)1), -1);
    ck_assert_int_eq(dsv4_test_control(DSV4_TESTCTRL_HOOK_SET, 0, (uint64_t)1), -1);
    ck_assert_int_eq(dsv4_test_control(99), -1);
    ck_assert_int_eq(dsv4_test_control(DSV4_TESTCTRL_RESET), 0);
    for (int h = 0; h < DSV4_HOOK_COUNT; h++)
        ck_assert_uint_eq(dsv4_test_hook_value((dsv4_test_hook)h), 0);
}
END_TEST

/* A case naming a defect the file does not map to a hook, or a hook the library lacks: refused, nothing run. */
START_TEST(unmapped_defects_refused)
{
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"name: u\ndefaults: {preset: mini, layer: 1, topology: {backend: ref}, tokens: [8]}\n"
         "cases:\n  - {name: a, fault: f01, checks: [refusal]}\n",
         "does not map to a test hook"},
        {"name: u\nfaults:\n  f01: {hook: drop_the_clamp}\n"
         "defaults: {preset: mini, layer: 1, topology: {backend: ref}, tokens: [8]}\n"
         "cases:\n  - {name: a, fault: f01, checks: [refusal]}\n",
         "unknown hook 'drop_the_clamp'"},
        {"name: u\nfaults:\n  f01: [drop_routed_clamp]\n"
         "defaults: {preset: mini, layer: 1, topology: {backend: ref}, tokens: [8]}\n"
         "cases:\n  - {name: a, fault: f01, checks: [refusal]}\n",
         "expected a mapping with a `hook`"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char f[512];
        tu_path(f, sizeof f, "faults_unmapped.yaml");
        ck_assert_int_eq(tu_write_file(f, bad[i].text, strlen(bad[i].text)), 0);
        dsv4_scenario *s = NULL;
        dsv4_error e;
        ck_assert_msg(dsv4_scenario_load(f, &s, &e) == DSV4_OK, "%s", e.message);
        dsv4_run_options o;
        dsv4_run_options_init(&o);
        o.cache_dir = cache_dir();
        dsv4_run_results *r = NULL;
        ck_assert_int_eq(dsv4_run_scenario_faults(s, &o, &r, &e), DSV4_ERR_FORMAT);
        ck_assert_msg(strstr(e.message, bad[i].needle), "case %zu: %s", i, e.message);
        ck_assert_ptr_null(r);
        dsv4_scenario_free(s);
    }
}
END_TEST

/* The detection table through the library: every defect caught by every case naming it. */
START_TEST(detection_table_13_of_13)
{
    dsv4_scenario *s = tu_scenario_file("scenarios/seed-review.yaml");
    dsv4_run_options o;
    dsv4_run_options_init(&o);
    o.cache_dir = cache_dir();
    dsv4_run_results *r = NULL;
    dsv4_error e;
    ck_assert_msg(dsv4_run_scenario_faults(s, &o, &r, &e) == DSV4_OK, "%s", e.message);
    for (int h = 0; h < DSV4_HOOK_COUNT; h++) /* cleared after each injected run */
        ck_assert_uint_eq(dsv4_test_hook_value((dsv4_test_hook)h), 0);
    size_t named = 0;
    for (size_t i = 0; i < dsv4_scenario_count(s); i++)
        named += dsv4_scenario_case_fault(s, i) != NULL;
    ck_assert_uint_eq(dsv4_run_count(r), dsv4_scenario_count(s) + named);
    /* each case naming a defect: its clean run, then its injected twin, both marked with the defect */
    size_t injected = 0, marked = 0;
    for (size_t i = 0; i < dsv4_run_count(r); i++) {
        const dsv4_case_result *c = dsv4_run_get(r, i);
        marked += dsv4_case_defect(c) != NULL;
        if (dsv4_case_injected(c)) {
            injected++;
            ck_assert_uint_ge(i, 1);
            const dsv4_case_result *clean = dsv4_run_get(r, i - 1);
            ck_assert(!dsv4_case_injected(clean));
            ck_assert_str_eq(dsv4_case_name(clean), dsv4_case_name(c));
            ck_assert_ptr_nonnull(dsv4_case_defect(c));
            ck_assert_str_eq(dsv4_case_defect(clean), dsv4_case_defect(c));
        }
    }
    ck_assert_uint_eq(injected, named);
    ck_assert_uint_eq(marked, 2 * named);
    ck_assert(!dsv4_case_injected(NULL));
    ck_assert_ptr_null(dsv4_case_defect(NULL));
    size_t n = dsv4_run_fault_rows(r, NULL, 0);
    ck_assert_uint_eq(n, named);
    dsv4_fault_row *rows = calloc(n, sizeof *rows);
    ck_assert_uint_eq(dsv4_run_fault_rows(r, rows, n), n);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(rows[i].clean == DSV4_RESULT_PASS, "%s clean: %s", rows[i].case_name,
                      dsv4_result_name(rows[i].clean));
        ck_assert_msg(rows[i].caught, "%s: %s not caught (injected run %s)", rows[i].case_name, rows[i].fault,
                      dsv4_result_name(rows[i].injected));
        ck_assert_msg(rows[i].injected == DSV4_RESULT_FAIL, "%s: the injected run %s, expected a failing check",
                      rows[i].case_name, dsv4_result_name(rows[i].injected));
        ck_assert_str_ne(rows[i].caught_by, "");
        /* the file's mapping: a hook named by behaviour, the findings, the defect and where */
        ck_assert_int_ne(dsv4_test_hook_parse(rows[i].hook), DSV4_HOOK_NONE);
        ck_assert_str_ne(rows[i].findings, "");
        ck_assert_str_ne(rows[i].summary, "");
        ck_assert_str_ne(rows[i].where, "");
        if (!strcmp(rows[i].fault, "f03"))
            ck_assert_str_eq(rows[i].findings, "3, 7");
    }
    /* Which check catches which defect: the table says it and it stays so. */
    static const struct {
        const char *case_suffix, *check;
    } by[] = {{"f01-fp8-per-block-clamp", "numerics fail"},    {"f02-single-rank-all-gather", "refusal fail"},
              {"f03-mixed-replay-symmetry", "symmetry fail"},  {"f04-graph-ep-sm100", "refusal fail"},
              {"f05-stacked-shards-layout", "numerics fail"},  {"f06-online-quant-fp32-scales", "numerics fail"},
              {"f07-mixed-replay-four-ranks", "symmetry fail"}, {"f08-long-prefill-bounded", "memory fail"},
              {"f09-refusal-names-cuda-graph", "refusal fail"}, {"f10-all-ranks-empty", "empty fail"},
              {"f11-router-empty-forward", "empty fail"},      {"f12-top-p-sentinel-ep", "numerics fail"},
              {"f13-graph-eager-prefill", "memory fail"},      {"f14-lowlat-prefill", "refusal fail"}};
    for (size_t k = 0; k < sizeof by / sizeof by[0]; k++) {
        bool found = false;
        for (size_t i = 0; i < n; i++) {
            size_t a = strlen(rows[i].case_name), b = strlen(by[k].case_suffix);
            if (a >= b && !strcmp(rows[i].case_name + a - b, by[k].case_suffix)) {
                found = true;
                ck_assert_msg(!strncmp(rows[i].caught_by, by[k].check, strlen(by[k].check)), "%s: caught by '%s'",
                              by[k].case_suffix, rows[i].caught_by);
            }
        }
        ck_assert_msg(found, "no row for %s", by[k].case_suffix);
    }
    free(rows);
    dsv4_fault_summary sum = dsv4_run_fault_summary(r);
    ck_assert_uint_eq(sum.defects, REVIEW_DEFECTS);
    ck_assert_uint_eq(sum.caught, REVIEW_DEFECTS);
    ck_assert_uint_eq(sum.mapped, REVIEW_DEFECTS);
    ck_assert_uint_eq(sum.false_failures, 0);
    ck_assert_uint_eq(sum.clean_runs, dsv4_scenario_count(s));
    /* The summary and junit count the clean runs only; report.json holds the table. */
    dsv4_run_summary rs = dsv4_run_summarize(r);
    ck_assert_uint_eq(rs.cases, dsv4_scenario_count(s));
    ck_assert_uint_eq(rs.passed, rs.cases);
    char jp[512];
    tu_path(jp, sizeof jp, "faults_report.json");
    ck_assert_msg(dsv4_report_json(r, NULL, jp, &e) == DSV4_OK, "%s", e.message);
    json_error_t je;
    json_t *root = json_load_file(jp, 0, &je);
    ck_assert_ptr_nonnull(root);
    json_t *ft = json_object_get(root, "fault_table");
    ck_assert_ptr_nonnull(ft);
    ck_assert_int_eq(json_integer_value(json_object_get(ft, "caught")), REVIEW_DEFECTS);
    ck_assert_int_eq(json_integer_value(json_object_get(ft, "false_failures")), 0);
    ck_assert_uint_eq(json_array_size(json_object_get(ft, "rows")), named);
    ck_assert_uint_eq(json_array_size(json_object_get(root, "cases")), dsv4_scenario_count(s) + named);
    json_decref(root);
    char hp[512];
    tu_path(hp, sizeof hp, "faults_report.html");
    ck_assert_msg(dsv4_report_html(r, hp, &e) == DSV4_OK, "%s", e.message);
    static char html[1 << 21];
    ck_assert_int_gt(tu_read_file(hp, html, sizeof html), 0);
    ck_assert_ptr_nonnull(strstr(html, "<h2>Defect catalogue</h2>"));
    ck_assert_ptr_nonnull(strstr(html, "13 of 13 defects caught; 0 false failures"));
    ck_assert_ptr_nonnull(strstr(html, "class=\"inj\">injected f01"));
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
}
END_TEST

/* The fault build's CLI: the table, exit 0; a file whose defect goes unseen exits 1. */
START_TEST(cli_detection_table)
{
    char out[65536], args[2200], dir[512];
    tu_path(dir, sizeof dir, "faults_cli");
    snprintf(args, sizeof args, "run --faults %s/scenarios/seed-review.yaml --report %s --cache %s", tu_src_dir(), dir,
             cache_dir());
    int rc = tu_run_cli(args, "faults_cli.txt", out, sizeof out);
    if (rc == -2)
        return;
    ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
    ck_assert_msg(strstr(out, "13 of 13 defects caught; 0 false failures"), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "fault finding  scenario"));
    ck_assert_ptr_nonnull(strstr(out, "f03   3, 7"));
    ck_assert_ptr_null(strstr(out, " NO "));
    ck_assert_ptr_null(strstr(out, "FAIL seed-review")); /* injected failures are in the table only */

    /* --filter runs a chosen subset: its defects caught, exit 0, the mapped ones left out named as such */
    snprintf(args, sizeof args, "run --faults %s/scenarios/seed-review.yaml --filter f01-fp8-per-block --report %s --cache %s",
             tu_src_dir(), dir, cache_dir());
    rc = tu_run_cli(args, "faults_cli_filter.txt", out, sizeof out);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
    ck_assert_msg(strstr(out, "1 of 1 defects caught; 0 false failures"), "%s", out);
    ck_assert_msg(strstr(out, "12 mapped defects not run: --filter 'f01-fp8-per-block' left out"), "%s", out);

    /* A case naming a defect its checks cannot see: not caught, exit 1. */
    char f[512];
    tu_path(f, sizeof f, "faults_blind.yaml");
    static const char blind[] = "name: blind\n"
                                "faults: {f01: {hook: drop_routed_clamp}}\n"
                                "defaults: {preset: mini, layer: 1, topology: {backend: ref}, tokens: [8]}\n"
                                "cases:\n"
                                "  - {name: refusal-only, fault: f01, checks: [refusal]}\n";
    ck_assert_int_eq(tu_write_file(f, blind, strlen(blind)), 0);
    snprintf(args, sizeof args, "run --faults %s --report %s --cache %s", f, dir, cache_dir());
    rc = tu_run_cli(args, "faults_cli2.txt", out, sizeof out);
    ck_assert_msg(rc == 1, "rc %d: %s", rc, out);
    ck_assert_msg(strstr(out, "0 of 1 defects caught"), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, " NO "));

    /* Without --filter, a mapped defect no case injects fails the run, and the line says why. */
    static const char unnamed[] = "name: unnamed\n"
                                  "faults: {f01: {hook: drop_routed_clamp}, f02: {hook: refuse_single_rank_all_gather}}\n"
                                  "defaults: {preset: mini, layer: 1, tokens: [8], seed: 13}\n"
                                  "cases:\n"
                                  "  - {name: clamp, fault: f01, routed_format: fp8, shared_format: fp8, weight_scale: fp32,\n"
                                  "     act_quant: fp32, swiglu_limit: 7, checks: [numerics, clamp_exercised]}\n";
    tu_path(f, sizeof f, "faults_unnamed.yaml");
    ck_assert_int_eq(tu_write_file(f, unnamed, strlen(unnamed)), 0);
    snprintf(args, sizeof args, "run --faults %s --report %s --cache %s", f, dir, cache_dir());
    rc = tu_run_cli(args, "faults_cli3.txt", out, sizeof out);
    ck_assert_msg(rc == 1, "rc %d: %s", rc, out);
    ck_assert_msg(strstr(out, "1 of 1 defects caught"), "%s", out);
    ck_assert_msg(strstr(out, "1 mapped defect named by no case"), "%s", out);
}
END_TEST

#endif

Suite *faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *t = tcase_create("faults");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, seed_review_names_every_defect);
    tcase_add_test(t, fault_and_checkpoint_keys);
#ifndef DSV4_FAULTS
    tcase_add_test(t, release_refuses_faults);
#else
    tcase_add_test(t, test_control_hooks);
    tcase_add_test(t, unmapped_defects_refused);
    tcase_add_test(t, detection_table_13_of_13);
    tcase_add_test(t, cli_detection_table);
#endif
    suite_add_tcase(s, t);
    return s;
}
