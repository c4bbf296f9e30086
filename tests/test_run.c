/* The scenario runner: checks per case, the reports, and `dsv4moe run`'s exit statuses. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/backend.h"
#include "dsv4moe_harness/run.h"
#include "dsv4moe_harness/scenario.h"
#include "tests/scenutil.h"

Suite *run_suite(void);

static const char *cache_dir(void)
{
    static char buf[512];
    return tu_path(buf, sizeof buf, "run_cache");
}

static dsv4_run_results *run_traced(const dsv4_scenario *s, int backend, const char *trace_dir)
{
    dsv4_run_results *r = tu_run(s, cache_dir(), backend, trace_dir);
    ck_assert_uint_eq(dsv4_run_count(r), dsv4_scenario_count(s));
    return r;
}

static dsv4_run_results *run(const dsv4_scenario *s, int backend) { return run_traced(s, backend, NULL); }

static void expect_check(const dsv4_case_result *c, unsigned bit, dsv4_result want, const char *needle)
{
    const char *d;
    dsv4_result got = dsv4_case_check(c, bit, &d);
    ck_assert_msg(got == want, "%s: %s is %s, expected %s: %s", dsv4_case_name(c), dsv4_check_name(bit),
                  dsv4_result_name(got), dsv4_result_name(want), d);
    if (needle)
        ck_assert_msg(strstr(d, needle), "%s: %s detail '%s' lacks '%s'", dsv4_case_name(c), dsv4_check_name(bit), d,
                      needle);
}

static void dump_failures(const dsv4_run_results *r)
{
    for (size_t i = 0; i < dsv4_run_count(r); i++) {
        const dsv4_case_result *c = dsv4_run_get(r, i);
        if (dsv4_case_status(c) == DSV4_RESULT_PASS || dsv4_case_status(c) == DSV4_RESULT_SKIP)
            continue;
        for (int b = 0; b < DSV4_CHECK_COUNT; b++) {
            const char *d;
            dsv4_result x = dsv4_case_check(c, 1u << b, &d);
            if (x == DSV4_RESULT_FAIL || x == DSV4_RESULT_ERROR)
                fprintf(stderr, "  %s %s: %s\n", dsv4_case_name(c), dsv4_check_name(1u << b), d);
        }
    }
}

/* s run on the backend, every case passing (the failing checks printed first when not). */
static dsv4_run_results *run_all_pass(const dsv4_scenario *s, int backend)
{
    dsv4_run_results *r = run(s, backend);
    dsv4_run_summary sum = dsv4_run_summarize(r);
    if (sum.passed != sum.cases)
        dump_failures(r);
    ck_assert_uint_eq(sum.errors, 0);
    ck_assert_uint_eq(sum.passed, sum.cases);
    return r;
}

/* Every case of ci.yaml passes with each check run or skipped by its rule; on ref (self), the
   one-rank cases' numerics held the reference to itself: self-compared, never a pass. */
static void check_ci_results(const dsv4_run_results *r, bool self)
{
    for (size_t i = 0; i < dsv4_run_count(r); i++) {
        const dsv4_case_result *c = dsv4_run_get(r, i);
        const char *n = dsv4_case_name(c), *d;
        for (int b = 0; b < DSV4_CHECK_COUNT; b++) {
            dsv4_result x = dsv4_case_check(c, 1u << b, &d);
            ck_assert_msg(x == DSV4_RESULT_PASS || x == DSV4_RESULT_SKIP ||
                              (self && x == DSV4_RESULT_SELF && (1u << b) == DSV4_CHECK_NUMERICS),
                          "%s: %s %s: %s", n, dsv4_check_name(1u << b), dsv4_result_name(x), d);
        }
        bool product = strstr(n, "tokens=") != NULL;
        if (!product)
            continue;
        bool world2 = strstr(n, "topology=1") != NULL, empty = strstr(n, "tokens=[0]") != NULL;
        bool one = strstr(n, "tokens=[1]") != NULL;
        bool selfc = self && !world2 && !empty;
        expect_check(c, DSV4_CHECK_NUMERICS, selfc ? DSV4_RESULT_SELF : DSV4_RESULT_PASS,
                     selfc ? "self-compared" : NULL);
        ck_assert_msg(dsv4_case_status(c) == (selfc ? DSV4_RESULT_SELF : DSV4_RESULT_PASS), "%s is %s", n,
                      dsv4_result_name(dsv4_case_status(c)));
        expect_check(c, DSV4_CHECK_DETERMINISM, DSV4_RESULT_PASS, "hash");
        expect_check(c, DSV4_CHECK_SYMMETRY, world2 ? DSV4_RESULT_PASS : DSV4_RESULT_SKIP, NULL);
        expect_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_PASS, NULL);
        expect_check(c, DSV4_CHECK_EMPTY, empty ? DSV4_RESULT_PASS : DSV4_RESULT_SKIP, NULL);
        /* 77 tokens per rank clamp; 0 or 1 token (2 on two ranks) are below the rule's 8 */
        expect_check(c, DSV4_CHECK_CLAMP_EXERCISED, empty || one ? DSV4_RESULT_SKIP : DSV4_RESULT_PASS, NULL);
        expect_check(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_SKIP, "not requested");
        dsv4_compare_metrics m;
        ck_assert(dsv4_case_metrics(c, &m) == !empty);
        dsv4_case_memory mem = dsv4_case_memory_of(c);
        ck_assert(mem.planned_max <= mem.available && mem.peak <= mem.planned_step);
    }
    expect_check(tu_case_find(r, "/lowlat-prefill"), DSV4_CHECK_REFUSAL, DSV4_RESULT_PASS, "decode-only");
    expect_check(tu_case_find(r, "/graph-ep-sm100"), DSV4_CHECK_REFUSAL, DSV4_RESULT_PASS, NULL);
    expect_check(tu_case_find(r, "/mixed-replay"), DSV4_CHECK_SYMMETRY, DSV4_RESULT_PASS, NULL);
}

START_TEST(ci_passes_on_ref)
{
    dsv4_scenario *s = tu_scenario_file("scenarios/ci.yaml");
    dsv4_run_results *r = run(s, DSV4_BACKEND_REF);
    dsv4_run_summary sum = dsv4_run_summarize(r);
    if (sum.passed + sum.self_compared != sum.cases)
        dump_failures(r);
    ck_assert_uint_eq(sum.errors + sum.failed + sum.skipped, 0);
    ck_assert_uint_eq(sum.passed + sum.self_compared, sum.cases);
    ck_assert_uint_gt(sum.self_compared, 0);
    check_ci_results(r, true);
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
}
END_TEST

/* The CPU backend: every case of ci.yaml passes every check, numerics included. */
START_TEST(ci_on_cpu)
{
    dsv4_scenario *s = tu_scenario_file("scenarios/ci.yaml");
    dsv4_run_results *r = run_all_pass(s, DSV4_BACKEND_CPU);
    check_ci_results(r, false);
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
}
END_TEST

/* scenarios/seed-review.yaml: one case per finding of the review; clean, every case passes. */
START_TEST(seed_review_clean)
{
    dsv4_scenario *s = tu_scenario_file("scenarios/seed-review.yaml");
    ck_assert_uint_eq(dsv4_scenario_count(s), 19);
    dsv4_run_results_free(run_all_pass(s, DSV4_BACKEND_CPU));
    dsv4_scenario_free(s);
}
END_TEST

static const char CHECKS_YAML[] =
    "name: checks\n"
    "defaults:\n"
    "  preset: mini\n"
    "  layer: 1\n"
    "  topology: {world: 1, tp: 1, dp: 1, ep: 1, backend: ref}\n"
    "  tokens: [16]\n"
    "  seed: 3\n"
    "cases:\n"
    "  - {name: all-checks}\n"
    "  - {name: refused-as-expected, budget: {device_gib: 80, taken_gib: 77.9},\n"
    "     expect: {refused: 'budget too small'}}\n"
    "  - {name: accepted-but-refusal-expected, checks: [refusal], expect: {refused: 'budget too small'}}\n"
    "  - {name: refused-wrong-message, budget: {device_gib: 2}, checks: [refusal],\n"
    "     expect: {refused: 'low-latency'}}\n"
    "  - {name: refused-unexpectedly, budget: {device_gib: 2}, checks: [numerics]}\n"
    "  - {name: bad-config-refused, top_p: 2, checks: [refusal], expect: {refused: 'top_p'}}\n"
    "  - {name: bad-config-unexpected, top_p: 2, checks: [numerics]}\n"
    "  - {name: clamp-too-high, swiglu_limit: 100000, checks: [clamp_exercised]}\n"
    "  - {name: clamp-off, swiglu_limit: 0, checks: [clamp_exercised, numerics]}\n"
    "  - {name: clamp-one-token, tokens: [1], checks: [clamp_exercised]}\n"
    "  - {name: cuda-one-rank, topology: {backend: cuda}, checks: [numerics, determinism]}\n"
    "  - {name: cuda-only, topology: {backend: cuda}, checks: [numerics]}\n"
    "  - {name: empty-one-rank, tokens: [0], checks: [empty, numerics, determinism, memory]}\n"
    "  - {name: ep-empty, topology: {world: 2, dp: 2, ep: 2}, tokens: [0, 5],\n"
    "     checks: [numerics, symmetry, empty, memory]}\n"
    "  - {name: ep-all-empty, topology: {world: 4, dp: 4, ep: 4}, tokens: [0], checks: [symmetry, empty]}\n"
    "  - {name: tp-bf16, preset: mini-bf16, topology: {world: 2, tp: 2, dp: 1, ep: 1}, tokens: [9],\n"
    "     checks: [numerics, symmetry, memory]}\n"
    "  - {name: nothing-needed, checks: [refusal]}\n";

/* What CHECKS_YAML's cases come to, on either host backend: a case's status (check STATUS) or
   one check's result with a word of its detail (NULL: any). */
#define STATUS 0u
static const struct {
    const char *c;
    unsigned check;
    dsv4_result want;
    const char *needle;
} CHECKS_EXPECTED[] = {
    {"/all-checks", STATUS, DSV4_RESULT_PASS, NULL}, /* on ref: self-compared (check_cases) */
    {"/all-checks", DSV4_CHECK_REFUSAL, DSV4_RESULT_PASS, "accepted"},
    {"/all-checks", DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_PASS, "clamped"},
    {"/all-checks", DSV4_CHECK_SYMMETRY, DSV4_RESULT_SKIP, "one rank"},
    {"/refused-as-expected", STATUS, DSV4_RESULT_PASS, NULL},
    {"/refused-as-expected", DSV4_CHECK_REFUSAL, DSV4_RESULT_PASS, "budget too small"},
    {"/refused-as-expected", DSV4_CHECK_NUMERICS, DSV4_RESULT_SKIP, "expects a refusal"},
    {"/accepted-but-refusal-expected", STATUS, DSV4_RESULT_FAIL, NULL},
    {"/accepted-but-refusal-expected", DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL, "accepted"},
    {"/refused-wrong-message", STATUS, DSV4_RESULT_FAIL, NULL},
    {"/refused-wrong-message", DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL, "does not match /low-latency/"},
    {"/refused-unexpectedly", STATUS, DSV4_RESULT_FAIL, NULL},
    {"/refused-unexpectedly", DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL, "budget too small"},
    {"/refused-unexpectedly", DSV4_CHECK_NUMERICS, DSV4_RESULT_SKIP, "refused"},
    {"/bad-config-refused", DSV4_CHECK_REFUSAL, DSV4_RESULT_PASS, "top_p"},
    {"/bad-config-unexpected", DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL, "top_p"},
    {"/clamp-too-high", STATUS, DSV4_RESULT_FAIL, NULL},
    {"/clamp-too-high", DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_FAIL, "no routed g or u value exceeded"},
    {"/clamp-off", STATUS, DSV4_RESULT_PASS, NULL},
    {"/clamp-off", DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_SKIP, "swiglu_limit 0"},
    {"/clamp-one-token", STATUS, DSV4_RESULT_SKIP, NULL},
    {"/clamp-one-token", DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_SKIP, "not applicable (T < 8"},
    {"/cuda-one-rank", STATUS, DSV4_RESULT_SKIP, NULL}, /* numerics could not run: skipped, never passed */
    {"/cuda-one-rank", DSV4_CHECK_NUMERICS, DSV4_RESULT_SKIP, "no CUDA in this build"},
    {"/cuda-one-rank", DSV4_CHECK_DETERMINISM, DSV4_RESULT_PASS, NULL},
    {"/cuda-only", STATUS, DSV4_RESULT_SKIP, NULL},
    {"/empty-one-rank", STATUS, DSV4_RESULT_PASS, NULL},
    {"/empty-one-rank", DSV4_CHECK_EMPTY, DSV4_RESULT_PASS, "0 launches"},
    {"/empty-one-rank", DSV4_CHECK_DETERMINISM, DSV4_RESULT_PASS, "16 tokens"},
    {"/ep-empty", STATUS, DSV4_RESULT_PASS, NULL},
    {"/ep-empty", DSV4_CHECK_EMPTY, DSV4_RESULT_PASS, "1 of 2 ranks"},
    {"/ep-empty", DSV4_CHECK_NUMERICS, DSV4_RESULT_PASS, "bit-identical"},
    {"/ep-all-empty", STATUS, DSV4_RESULT_PASS, NULL},
    {"/ep-all-empty", DSV4_CHECK_EMPTY, DSV4_RESULT_PASS, "4 of 4 ranks"},
    {"/tp-bf16", DSV4_CHECK_NUMERICS, DSV4_RESULT_PASS, "within tolerance"},
    {"/tp-bf16", DSV4_CHECK_SYMMETRY, DSV4_RESULT_PASS, NULL},
    {"/nothing-needed", STATUS, DSV4_RESULT_PASS, NULL},
};

/* On ref (self) a one-rank case whose numerics compared tokens held the reference to itself. */
static void check_cases(const dsv4_run_results *r, bool self)
{
    for (size_t i = 0; i < sizeof CHECKS_EXPECTED / sizeof CHECKS_EXPECTED[0]; i++) {
        const dsv4_case_result *c = tu_case_find(r, CHECKS_EXPECTED[i].c);
        dsv4_result want = CHECKS_EXPECTED[i].want;
        if (self && (!strcmp(CHECKS_EXPECTED[i].c, "/all-checks") || !strcmp(CHECKS_EXPECTED[i].c, "/clamp-off")) &&
            (CHECKS_EXPECTED[i].check == STATUS || CHECKS_EXPECTED[i].check == DSV4_CHECK_NUMERICS))
            want = DSV4_RESULT_SELF;
        if (CHECKS_EXPECTED[i].check == STATUS)
            ck_assert_msg(dsv4_case_status(c) == want, "%s is %s", dsv4_case_name(c),
                          dsv4_result_name(dsv4_case_status(c)));
        else
            expect_check(c, CHECKS_EXPECTED[i].check, want, CHECKS_EXPECTED[i].needle);
    }
    if (self)
        expect_check(tu_case_find(r, "/all-checks"), DSV4_CHECK_NUMERICS, DSV4_RESULT_SELF, "topology.backend cpu");
}

START_TEST(checks_pass_fail_and_skip_by_their_rules)
{
    dsv4_scenario *s = tu_scenario_text(CHECKS_YAML, "checks.yaml");
    for (int b = 0; b < 2; b++) {
        dsv4_run_results *r = run(s, b == 0 ? DSV4_BACKEND_REF : DSV4_BACKEND_CPU);
        check_cases(r, b == 0);
        dsv4_run_results_free(r);
    }
    dsv4_scenario_free(s);
}
END_TEST

START_TEST(filter_and_appending_results)
{
    dsv4_scenario *s = tu_scenario_text(CHECKS_YAML, "checks.yaml");
    dsv4_run_options o;
    dsv4_run_options_init(&o);
    o.cache_dir = cache_dir();
    o.filter = "clamp";
    dsv4_run_results *r = NULL;
    dsv4_error e;
    ck_assert_int_eq(dsv4_run_scenario(s, &o, &r, &e), DSV4_OK);
    ck_assert_uint_eq(dsv4_run_count(r), 3);
    o.filter = "ep-";
    ck_assert_int_eq(dsv4_run_scenario(s, &o, &r, &e), DSV4_OK);
    ck_assert_uint_eq(dsv4_run_count(r), 5);
    ck_assert_str_eq(dsv4_case_scenario(dsv4_run_get(r, 4)), "checks");
    ck_assert_ptr_null(dsv4_run_get(r, 5));
    dsv4_run_results_free(r);
    o.threads = 0;
    r = NULL;
    ck_assert_int_eq(dsv4_run_scenario(s, &o, &r, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_null(r);
    o.threads = 1;
    o.backend = dsv4_backend_count();
    ck_assert_int_eq(dsv4_run_scenario(s, &o, &r, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_str_eq(e.message, "run: backend 3 is not -1 (each case's own) or the index of ref, cpu or cuda");
    ck_assert_ptr_null(r);
    dsv4_scenario_free(s);
}
END_TEST

static size_t count_str(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

START_TEST(reports_hold_every_case)
{
    /* A case name with XML specials, to check the escaping. */
    static const char yaml[] = "name: rep\n"
                               "defaults: {preset: mini, layer: 1, topology: {backend: cpu}, tokens: [8]}\n"
                               "axes:\n"
                               "  tokens: [[0], [8]]\n"
                               "cases:\n"
                               "  - {name: \"a<b>&'q\\\"\", checks: [refusal], expect: {refused: 'x'}}\n"
                               "  - {name: skipped, tokens: [1], checks: [clamp_exercised]}\n";
    dsv4_scenario *s = tu_scenario_text(yaml, "rep.yaml");
    dsv4_run_results *r = run(s, -1);
    char jp[512], xp[512];
    tu_path(jp, sizeof jp, "run_report.json");
    tu_path(xp, sizeof xp, "run_junit.xml");
    dsv4_error e;
    ck_assert_msg(dsv4_report_json(r, s, jp, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_report_junit(r, NULL, xp, &e) == DSV4_OK, "%s", e.message);

    json_error_t je;
    json_t *root = json_load_file(jp, 0, &je);
    ck_assert_msg(root, "%s: %s", jp, je.text);
    json_t *cases = json_object_get(root, "cases");
    ck_assert_uint_eq(json_array_size(cases), 4);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(root, "summary"), "failed")), 1);
    for (size_t i = 0; i < 4; i++) {
        json_t *c = json_array_get(cases, i);
        ck_assert_str_eq(json_string_value(json_object_get(c, "name")), dsv4_case_name(dsv4_run_get(r, i)));
        ck_assert(json_is_array(json_object_get(c, "checks")));
        ck_assert(json_is_object(json_object_get(c, "memory")));
    }
    json_t *c1 = json_array_get(cases, 1);
    ck_assert_uint_eq(json_array_size(json_object_get(c1, "axes")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(c1, "axes"), 0), "name")),
                     "tokens");
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(json_object_get(c1, "axes"), 0), "index")), 1);
    ck_assert(json_is_object(json_object_get(c1, "metrics")));
    ck_assert(json_is_number(json_object_get(json_object_get(c1, "metrics"), "deepgemm_diff")));
    ck_assert(json_is_null(json_object_get(json_array_get(cases, 0), "metrics"))); /* 0 tokens */
    json_decref(root);

    char *x = (char *)tu_slurp(xp, NULL);
    ck_assert_ptr_nonnull(x);
    ck_assert_uint_eq(count_str(x, "<testcase "), 4);
    ck_assert_uint_eq(count_str(x, "<failure "), 1);
    ck_assert_uint_eq(count_str(x, "<skipped "), 1);
    ck_assert_ptr_nonnull(strstr(x, "tests=\"4\" failures=\"1\" errors=\"0\" skipped=\"1\""));
    ck_assert_ptr_nonnull(strstr(x, "rep/a&lt;b&gt;&amp;&apos;q&quot;"));
    ck_assert_ptr_null(strstr(x, "a<b>"));
    free(x);
    /* No temporary left next to the reports. */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "ls %s | grep -q 'run_report.json.tmp\\|run_junit.xml.tmp'", tu_tmpdir());
    ck_assert_int_ne(system(tmp), 0);
    /* An unwritable path fails and leaves nothing. */
    ck_assert_int_eq(dsv4_report_json(r, s, "/nonexistent-dir/report.json", &e), DSV4_ERR_IO);
    ck_assert_int_eq(dsv4_report_junit(r, s, "/nonexistent-dir/junit.xml", &e), DSV4_ERR_IO);
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
}
END_TEST

/* s with & < > " ' escaped the way report.html escapes them. */
static void html_escaped(const char *s, char *out, size_t n)
{
    size_t k = 0;
    for (; *s && k + 8 < n; s++) {
        const char *ent = *s == '&' ? "&amp;" : *s == '<' ? "&lt;" : *s == '>' ? "&gt;" : *s == '"' ? "&quot;"
                        : *s == '\'' ? "&#39;" : NULL;
        if (ent) {
            memcpy(out + k, ent, strlen(ent));
            k += strlen(ent);
        } else {
            out[k++] = *s;
        }
    }
    out[k] = '\0';
}

START_TEST(html_report)
{
    static const char yaml[] = "name: html\n"
                               "defaults: {preset: mini, layer: 1, topology: {backend: cpu}, tokens: [8]}\n"
                               "axes:\n"
                               "  tokens: [[0], [8]]\n"
                               "cases:\n"
                               "  - {name: \"a<b>&'q\\\"\", checks: [refusal], expect: {refused: 'x'}}\n"
                               "  - {name: skipped, tokens: [1], checks: [clamp_exercised]}\n"
                               "  - {name: two, topology: {world: 2, dp: 2, ep: 2, backend: ref}, tokens: [8, 0]}\n";
    dsv4_scenario *s = tu_scenario_text(yaml, "html.yaml");
    dsv4_run_results *r = run(s, -1);
    char hp[512];
    tu_path(hp, sizeof hp, "run_report.html");
    dsv4_error e;
    ck_assert_msg(dsv4_report_html(r, hp, &e) == DSV4_OK, "%s", e.message);
    char *h = (char *)tu_slurp(hp, NULL);
    ck_assert_ptr_nonnull(h);
    ck_assert_ptr_nonnull(strstr(h, "<!DOCTYPE html>"));
    ck_assert_ptr_nonnull(strstr(h, "</html>"));
    for (size_t i = 0; i < dsv4_run_count(r); i++) {
        char esc[1024];
        html_escaped(dsv4_case_name(dsv4_run_get(r, i)), esc, sizeof esc);
        ck_assert_msg(strstr(h, esc), "report.html lacks case '%s'", esc);
    }
    ck_assert_ptr_nonnull(strstr(h, "html/a&lt;b&gt;&amp;&#39;q&quot;"));
    ck_assert_ptr_null(strstr(h, "a<b>"));
    /* the failing case in full (a refusal check alone: no numerics, no memory); the others one line each,
       their numerics and memory as text (the profiles are in report.json) */
    ck_assert_uint_eq(count_str(h, "<svg class=\"ulp\""), 0);
    ck_assert_uint_eq(count_str(h, "<svg class=\"mem\""), 0);
    ck_assert_uint_ge(count_str(h, "</td><td>ulp p99 "), 2);
    ck_assert_uint_ge(count_str(h, " planned</td></tr>"), 3);
    dsv4_run_summary sum = dsv4_run_summarize(r);
    ck_assert_uint_eq(sum.cases, 5);
    ck_assert_uint_eq(sum.failed, 1);
    char want[64];
    snprintf(want, sizeof want, "id=\"s-cases\">%zu<", sum.cases);
    ck_assert_ptr_nonnull(strstr(h, want));
    snprintf(want, sizeof want, "id=\"s-passed\">%zu<", sum.passed);
    ck_assert_ptr_nonnull(strstr(h, want));
    snprintf(want, sizeof want, "id=\"s-failed\">%zu<", sum.failed);
    ck_assert_ptr_nonnull(strstr(h, want));
    snprintf(want, sizeof want, "id=\"s-skipped\">%zu<", sum.skipped);
    ck_assert_ptr_nonnull(strstr(h, want));
    snprintf(want, sizeof want, "id=\"s-errors\">%zu<", sum.errors);
    ck_assert_ptr_nonnull(strstr(h, want));
    /* the failing refusal's detail is shown, escaped; self-contained: no script, no external resource */
    ck_assert_ptr_nonnull(strstr(h, "refusal fail"));
    ck_assert_ptr_null(strstr(h, "<script"));
    ck_assert_ptr_null(strstr(h, "src="));
    for (const char *p = h; (p = strstr(p, "href=")); p++) /* links only within the page (the matrix's) */
        ck_assert_msg(!strncmp(p, "href=\"#case-", 12), "external link: %.40s", p);
    free(h);

    /* An unwritable path fails and leaves nothing: a missing folder, and a target that is a folder. */
    ck_assert_int_eq(dsv4_report_html(r, "/nonexistent-dir/report.html", &e), DSV4_ERR_IO);
    ck_assert_int_eq(dsv4_report_html(NULL, hp, &e), DSV4_ERR_INVALID_ARG);
    char dir[512], cmd[1200];
    tu_path(dir, sizeof dir, "run_html_dir");
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/sub", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(dsv4_report_html(r, dir, &e), DSV4_ERR_IO);
    snprintf(cmd, sizeof cmd, "ls %s | grep -q 'run_html_dir.tmp\\|run_report.html.tmp'", tu_tmpdir());
    ck_assert_int_ne(system(cmd), 0);
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
}
END_TEST

START_TEST(cli_exit_statuses)
{
    char out[16384], args[2048], dir[512], f[512];
    tu_path(dir, sizeof dir, "run_cli");
    const char *src = tu_src_dir();
    /* 0: every case passes */
    snprintf(args, sizeof args, "run %s/scenarios/ci.yaml --report %s --cache %s --backend ref --filter layer=1", src,
             dir, cache_dir());
    int rc = tu_run_cli(args, "run_cli0.txt", out, sizeof out);
    if (rc == -2)
        return; /* not run through make test */
    ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
    ck_assert_ptr_nonnull(strstr(out, "passed, 0 failed"));
    char jp[600];
    snprintf(jp, sizeof jp, "%s/report.json", dir);
    ck_assert(tu_file_exists(jp));
    snprintf(jp, sizeof jp, "%s/junit.xml", dir);
    ck_assert(tu_file_exists(jp));
    snprintf(jp, sizeof jp, "%s/report.html", dir);
    ck_assert(tu_file_exists(jp));
    ck_assert_ptr_nonnull(strstr(out, "report.html"));

    /* 1: a failing case, listed with its check's detail */
    tu_path(f, sizeof f, "run_fail.yaml");
    static const char failing[] = "name: failing\n"
                                  "defaults: {preset: mini, layer: 1, topology: {backend: ref}}\n"
                                  "cases:\n"
                                  "  - {name: ok, checks: [refusal]}\n"
                                  "  - {name: bad, checks: [refusal], expect: {refused: 'never'}}\n";
    ck_assert_int_eq(tu_write_file(f, failing, strlen(failing)), 0);
    snprintf(args, sizeof args, "run %s --report %s --cache %s", f, dir, cache_dir());
    rc = tu_run_cli(args, "run_cli1.txt", out, sizeof out);
    ck_assert_msg(rc == 1, "rc %d: %s", rc, out);
    ck_assert_ptr_nonnull(strstr(out, "2 cases: 1 passed, 1 failed"));
    ck_assert_ptr_nonnull(strstr(out, "FAIL failing/bad"));
    ck_assert_ptr_nonnull(strstr(out, "expected a refusal matching /never/"));

    /* 2: malformed scenario, with file:line:col */
    tu_path(f, sizeof f, "run_bad.yaml");
    static const char bad[] = "name: bad\ndefaults: {layer: 1}\ncases:\n  - {name: x, bogus: 1}\n";
    ck_assert_int_eq(tu_write_file(f, bad, strlen(bad)), 0);
    snprintf(args, sizeof args, "run %s --report %s --cache %s", f, dir, cache_dir());
    rc = tu_run_cli(args, "run_cli2.txt", out, sizeof out);
    ck_assert_msg(rc == 2, "rc %d: %s", rc, out);
    char where[600];
    snprintf(where, sizeof where, "%s:4:", f);
    ck_assert_msg(strstr(out, where), "%s", out);
    /* 2: a missing file, an unknown option, a filter matching nothing */
    snprintf(args, sizeof args, "run %s/nonexistent.yaml --report %s", dir, dir);
    ck_assert_int_eq(tu_run_cli(args, "run_cli3.txt", out, sizeof out), 2);
    snprintf(args, sizeof args, "run %s/scenarios/ci.yaml --bogus", src);
    ck_assert_int_eq(tu_run_cli(args, "run_cli4.txt", out, sizeof out), 2);
    snprintf(args, sizeof args, "run %s/scenarios/ci.yaml --report %s --filter no-such-case", src, dir);
    ck_assert_int_eq(tu_run_cli(args, "run_cli5.txt", out, sizeof out), 2);
    ck_assert_int_eq(tu_run_cli("run", "run_cli6.txt", out, sizeof out), 2);
    ck_assert_int_eq(tu_run_cli("run --help", "run_cli7.txt", out, sizeof out), 0);
}
END_TEST

/* What ran, as it ran: a case without topology.backend runs the cpu backend (its numerics a real
   comparison); the ref backend at world 1 is self-compared (counted apart, never a pass, in the
   summary, report.json and JUnit); a case whose numerics could not run (cuda in this build) is
   skipped, not passed, and --strict (the default where CI is set) makes that skip a failure that
   names the reason; --backend cuda where it cannot run is refused before any case runs. */
/* A case's `params` reach its backend on every rank: a table the cpu backend has passes, one it
   refuses (an unknown table, an unknown key) and a list for the ref backend (which takes none)
   make the case an error whose detail names the key, in one process and over two ranks; the report
   shows the list. */
START_TEST(backend_params)
{
    static const char yaml[] =
        "name: params\n"
        "defaults: {preset: mini, layer: 1, tokens: [8], seed: 3, checks: [numerics], topology: {backend: cpu}}\n"
        "cases:\n"
        "  - {name: ref-table, params: kernels=ref}\n"
        "  - {name: no-such-table, params: kernels=avx9}\n"
        "  - {name: no-such-key, params: colour=red}\n"
        "  - {name: ref-takes-none, topology: {backend: ref}, params: kernels=ref}\n"
        "  - {name: two-ranks, topology: {world: 2, dp: 2, ep: 2}, tokens: [4, 4], params: kernels=ref}\n"
        "  - {name: two-ranks-refused, topology: {world: 2, dp: 2, ep: 2}, tokens: [4, 4], params: kernels=avx9}\n";
    dsv4_scenario *s = tu_scenario_text(yaml, "params.yaml");
    ck_assert_str_eq(dsv4_scenario_get(s, 0)->params, "kernels=ref");
    dsv4_run_results *r = run(s, -1);
    ck_assert_int_eq(dsv4_case_status(tu_case_find(r, "/ref-table")), DSV4_RESULT_PASS);
    ck_assert_int_eq(dsv4_case_status(tu_case_find(r, "/two-ranks")), DSV4_RESULT_PASS);
    static const char *const bad[][2] = {{"/no-such-table", "avx9"},
                                         {"/no-such-key", "colour"},
                                         {"/ref-takes-none", "takes no parameters"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const dsv4_case_result *c = tu_case_find(r, bad[i][0]);
        ck_assert_msg(dsv4_case_status(c) == DSV4_RESULT_ERROR, "%s is %s", bad[i][0],
                      dsv4_result_name(dsv4_case_status(c)));
        expect_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_ERROR, bad[i][1]);
    }
    /* over ranks the refusal is the distributed step's failure, which names it */
    expect_check(tu_case_find(r, "/two-ranks-refused"), DSV4_CHECK_NUMERICS, DSV4_RESULT_FAIL, "avx9");
    char dir[512], p[700], buf[1 << 16];
    tu_path(dir, sizeof dir, "params_reports");
    snprintf(p, sizeof p, "mkdir -p %s", dir);
    ck_assert_int_eq(system(p), 0);
    dsv4_error e;
    ck_assert_msg(dsv4_report_write_all(r, dir, &e) == DSV4_OK, "%s", e.message);
    snprintf(p, sizeof p, "%s/report.json", dir);
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_msg(strstr(buf, "\"params\": \"kernels=ref\""), "report.json lacks the params");
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
}
END_TEST

START_TEST(verdicts_say_what_ran)
{
    static const char yaml[] = "name: what-ran\n"
                               "defaults: {preset: mini, layer: 1, tokens: [16], seed: 3, checks: [numerics, memory]}\n"
                               "cases:\n"
                               "  - {name: default-backend}\n"
                               "  - {name: on-ref, topology: {backend: ref}}\n"
                               "  - {name: on-ref-two-ranks, topology: {world: 2, dp: 2, ep: 2, backend: ref}, tokens: [8, 8]}\n"
                               "  - {name: on-cuda, topology: {backend: cuda}}\n";
    dsv4_scenario *s = tu_scenario_text(yaml, "what-ran.yaml");
    dsv4_run_results *r = run(s, -1);
    const dsv4_case_result *c = tu_case_find(r, "/default-backend");
    ck_assert_int_eq(dsv4_case_status(c), DSV4_RESULT_PASS);
    expect_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_PASS, "cpu");
    c = tu_case_find(r, "/on-ref");
    ck_assert_int_eq(dsv4_case_status(c), DSV4_RESULT_SELF);
    expect_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_SELF, "self-compared");
    expect_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_PASS, NULL);
    /* two ranks of ref: the distributed composition against the one-process reference is a comparison */
    ck_assert_int_eq(dsv4_case_status(tu_case_find(r, "/on-ref-two-ranks")), DSV4_RESULT_PASS);
    c = tu_case_find(r, "/on-cuda");
    bool cuda_here = dsv4_backend_available(DSV4_BACKEND_CUDA);
    if (!cuda_here) {
        ck_assert_int_eq(dsv4_case_status(c), DSV4_RESULT_SKIP);
        expect_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_SKIP, "no CUDA");
    }
    dsv4_run_summary sum = dsv4_run_summarize(r);
    ck_assert_uint_eq(sum.self_compared, 1);
    ck_assert_uint_eq(sum.passed, cuda_here ? 3 : 2);
    ck_assert_uint_eq(sum.skipped, cuda_here ? 0 : 1);
    /* report.json and JUnit count them as they are */
    char dir[512], p[700], buf[1 << 16];
    tu_path(dir, sizeof dir, "what_ran_reports");
    snprintf(p, sizeof p, "mkdir -p %s", dir);
    ck_assert_int_eq(system(p), 0);
    dsv4_error e;
    ck_assert_int_eq(dsv4_report_write_all(r, dir, &e), DSV4_OK);
    snprintf(p, sizeof p, "%s/report.json", dir);
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_ptr_nonnull(strstr(buf, "\"self_compared\": 1"));
    ck_assert_ptr_nonnull(strstr(buf, "\"status\": \"self-compared\""));
    snprintf(p, sizeof p, "%s/junit.xml", dir);
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_ptr_nonnull(strstr(buf, "<skipped message=\"self-compared: "));
    snprintf(p, sizeof p, "%s/report.html", dir);
    ck_assert(tu_read_file(p, buf, sizeof buf) > 0);
    ck_assert_ptr_nonnull(strstr(buf, "id=\"s-self\">1<"));
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);

    /* the CLI: summary counts, --strict, CI, and --backend cuda where it cannot run */
    char out[16384], args[2048], f[512];
    tu_path(f, sizeof f, "what_ran.yaml");
    ck_assert_int_eq(tu_write_file(f, yaml, strlen(yaml)), 0);
    unsetenv("CI");
    snprintf(args, sizeof args, "run %s --report %s --cache %s", f, dir, cache_dir());
    int rc = tu_run_cli(args, "what_ran0.txt", out, sizeof out);
    if (rc == -2)
        return; /* not run through make test */
    ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
    if (cuda_here)
        return;
    ck_assert_msg(strstr(out, "4 cases: 2 passed, 0 failed, 1 skipped, 1 self-compared, 0 errors"), "%s", out);
    ck_assert_ptr_null(strstr(out, "SKIPPED"));
    snprintf(args, sizeof args, "run %s --report %s --cache %s --strict", f, dir, cache_dir());
    rc = tu_run_cli(args, "what_ran1.txt", out, sizeof out);
    ck_assert_msg(rc == 1, "rc %d: %s", rc, out);
    ck_assert_msg(strstr(out, "SKIPPED (a failure under --strict) what-ran/on-cuda") &&
                      strstr(out, "numerics         skip: skipped: no CUDA in this build"),
                  "%s", out);
    setenv("CI", "true", 1);
    snprintf(args, sizeof args, "run %s --report %s --cache %s", f, dir, cache_dir());
    ck_assert_int_eq(tu_run_cli(args, "what_ran2.txt", out, sizeof out), 1);
    snprintf(args, sizeof args, "run %s --report %s --cache %s --no-strict", f, dir, cache_dir());
    ck_assert_int_eq(tu_run_cli(args, "what_ran3.txt", out, sizeof out), 0);
    unsetenv("CI");
    snprintf(args, sizeof args, "run %s --report %s --cache %s --backend cuda", f, dir, cache_dir());
    rc = tu_run_cli(args, "what_ran4.txt", out, sizeof out);
    ck_assert_msg(rc == 2 && strstr(out, "--backend: 'cuda'"), "rc %d: %s", rc, out);
}
END_TEST

/* A trace asked for and not written (options.trace_dir under a regular file) is the symmetry check's
   error, whatever the traces themselves say; the other checks keep their verdicts. */
START_TEST(unwritable_traces_are_a_symmetry_error)
{
    dsv4_scenario *s = tu_scenario_text("name: tr\n"
                                "defaults: {preset: mini, layer: 1, tokens: [4, 5], replay: [false, false], seed: 3,\n"
                                "           topology: {world: 2, dp: 2, ep: 2, backend: cpu, max_tokens: 64},\n"
                                "           checks: [numerics, symmetry]}\n"
                                "cases:\n  - {name: two-ranks}\n",
                                "tr.yaml");
    char file[512], dir[600];
    tu_path(file, sizeof file, "run_traces_blocker");
    ck_assert_int_eq(tu_write_file(file, "x", 1), 0);
    snprintf(dir, sizeof dir, "%s/traces", file); /* a folder under a regular file cannot be made */
    dsv4_run_results *r = run_traced(s, -1, dir);
    const dsv4_case_result *c = tu_case_find(r, "two-ranks");
    expect_check(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_ERROR, "writing the collective traces failed");
    expect_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_PASS, "bit-identical");
    ck_assert_int_eq(dsv4_case_status(c), DSV4_RESULT_ERROR);
    dsv4_run_results_free(r);
    /* the same case with the traces written: symmetry passes */
    tu_path(dir, sizeof dir, "run_traces_ok");
    r = run_traced(s, -1, dir);
    expect_check(tu_case_find(r, "two-ranks"), DSV4_CHECK_SYMMETRY, DSV4_RESULT_PASS, "issued the same");
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
}
END_TEST

Suite *run_suite(void)
{
    Suite *s = suite_create("run");
    TCase *t = tcase_create("run");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, ci_passes_on_ref);
    tcase_add_test(t, ci_on_cpu);
    tcase_add_test(t, seed_review_clean);
    tcase_add_test(t, checks_pass_fail_and_skip_by_their_rules);
    tcase_add_test(t, filter_and_appending_results);
    tcase_add_test(t, reports_hold_every_case);
    tcase_add_test(t, html_report);
    tcase_add_test(t, cli_exit_statuses);
    tcase_add_test(t, verdicts_say_what_ran);
    tcase_add_test(t, backend_params);
    tcase_add_test(t, unwritable_traces_are_a_symmetry_error);
    suite_add_tcase(s, t);
    return s;
}
