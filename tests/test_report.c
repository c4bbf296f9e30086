/*
 * The reports' error profiles (ULP and |a-b| histograms, the worst elements) in the
 * results, report.json and report.html, and `dsv4moe run`'s progress line (only on a
 * terminal).
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4moe/formats.h"
#include "dsv4moe_harness/run.h"
#include "dsv4moe_harness/scenario.h"
#include "tests/scenutil.h"

Suite *report_suite(void);

static const char *cache_dir(void)
{
    static char buf[512];
    return tu_path(buf, sizeof buf, "report_cache");
}

static const char YAML[] = "name: prof\n"
                           "defaults: {preset: mini, layer: 1, tokens: [24], checks: [numerics],\n"
                           "           topology: {backend: cpu}}\n"
                           "cases:\n"
                           "  - {name: fp8, routed_format: fp8, shared_format: fp8, weight_scale: fp32, act_quant: fp32,\n"
                           "     swiglu_limit: 7, seed: 13, tokens: [64]}\n"
                           "  - {name: ep2, topology: {world: 2, dp: 2, ep: 2, backend: ref}, tokens: [5, 3]}\n"
                           "  - {name: tp2, routed_format: bf16, shared_format: bf16, act_quant: none,\n"
                           "     topology: {world: 2, tp: 2, dp: 1, ep: 1, backend: ref}, tokens: [9]}\n"
                           "  - {name: empty, tokens: [0]}\n"
                           "  - {name: fails, routed_format: fp8, shared_format: fp8, weight_scale: fp32, act_quant: fp32,\n"
                           "     swiglu_limit: 100000, seed: 13, tokens: [64], checks: [numerics, clamp_exercised]}\n";

static void check_profile(const dsv4_case_result *c, int64_t H, int world)
{
    dsv4_compare_metrics m;
    dsv4_case_errors E;
    ck_assert(dsv4_case_metrics(c, &m));
    ck_assert(dsv4_case_errors_of(c, &E));
    ck_assert_int_eq(E.n, m.n);
    uint64_t su = 0, sa = 0;
    for (int i = 0; i < DSV4_ERR_BINS; i++) {
        su += E.ulp_bins[i];
        sa += E.abs_bins[i];
    }
    ck_assert_uint_eq(su, (uint64_t)E.n);
    ck_assert_uint_eq(sa, (uint64_t)E.n);
    ck_assert_uint_eq(E.ulp_bins[0], (uint64_t)(E.n - m.ulp_nonzero));
    ck_assert_int_le(E.n_worst, DSV4_WORST_MAX);
    ck_assert_int_eq(E.n_worst, m.ulp_nonzero < DSV4_WORST_MAX ? (int)m.ulp_nonzero : DSV4_WORST_MAX);
    for (int i = 0; i < E.n_worst; i++) {
        const dsv4_case_worst *w = &E.worst[i];
        ck_assert_double_eq_tol(w->diff, fabs((double)w->a - (double)w->b), 1e-12);
        ck_assert(w->diff > 0);
        if (i)
            ck_assert(w->diff <= E.worst[i - 1].diff);
        ck_assert(w->column >= 0 && w->column < H);
        ck_assert(w->rank >= 0 && w->rank < world);
        if (world == 1)
            ck_assert_int_eq(w->index, w->token * H + w->column);
    }
    if (E.n_worst)
        ck_assert_double_eq_tol(E.worst[0].diff, m.max_abs, 1e-6 * (1 + m.max_abs));
}

START_TEST(error_profiles)
{
    dsv4_scenario *s = tu_scenario_text(YAML, "prof.yaml");
    dsv4_error e;
    dsv4_run_results *r = tu_run(s, cache_dir(), -1, NULL);
    int64_t H = dsv4_scenario_get(s, 0)->config.dim;
    const dsv4_case_result *fp8 = tu_case_find(r, "/fp8"), *ep2 = tu_case_find(r, "/ep2"), *tp2 = tu_case_find(r, "/tp2"),
                           *empty = tu_case_find(r, "/empty");
    ck_assert_int_eq(dsv4_case_status(fp8), DSV4_RESULT_PASS);
    check_profile(fp8, H, 1);
    dsv4_case_errors E;
    ck_assert(dsv4_case_errors_of(fp8, &E));
    ck_assert_int_gt(E.n_worst, 0); /* fp8 on the cpu differs from the reference somewhere */
    check_profile(ep2, H, 2);
    ck_assert(dsv4_case_errors_of(ep2, &E));
    ck_assert_int_eq(E.n, (5 + 3) * H);
    ck_assert_int_eq(E.n_worst, 0); /* ep sharding is bit-identical */
    ck_assert_uint_eq(E.ulp_bins[0], (uint64_t)E.n);
    check_profile(tp2, H, 2);
    ck_assert(!dsv4_case_errors_of(empty, &E)); /* nothing compared */

    /* report.json: the bins and the worst elements */
    char jp[512];
    tu_path(jp, sizeof jp, "report_prof.json");
    ck_assert_msg(dsv4_report_json(r, NULL, jp, &e) == DSV4_OK, "%s", e.message);
    json_error_t je;
    json_t *root = json_load_file(jp, 0, &je);
    ck_assert_ptr_nonnull(root);
    json_t *cases = json_object_get(root, "cases");
    int with = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i), *er = json_object_get(c, "errors");
        const char *name = json_string_value(json_object_get(c, "name"));
        if (strstr(name, "/empty")) {
            ck_assert(json_is_null(er));
            continue;
        }
        with++;
        ck_assert_uint_eq(json_array_size(json_object_get(er, "ulp_bins")), DSV4_ERR_BINS);
        ck_assert_uint_eq(json_array_size(json_object_get(er, "abs_bins")), DSV4_ERR_BINS);
        json_int_t sum = 0;
        for (size_t k = 0; k < DSV4_ERR_BINS; k++)
            sum += json_integer_value(json_array_get(json_object_get(er, "ulp_bins"), k));
        ck_assert_int_eq(sum, json_integer_value(json_object_get(er, "n")));
        if (strstr(name, "/fp8")) {
            json_t *w0 = json_array_get(json_object_get(er, "worst"), 0);
            ck_assert_ptr_nonnull(w0);
            ck_assert(json_is_integer(json_object_get(w0, "token")) && json_is_integer(json_object_get(w0, "column")));
            ck_assert(json_real_value(json_object_get(w0, "diff")) > 0);
        }
    }
    ck_assert_int_eq(with, 4);
    json_decref(root);

    /* report.html: two histograms per compared case, the worst elements as SVG */
    char hp[512];
    tu_path(hp, sizeof hp, "report_prof.html");
    ck_assert_msg(dsv4_report_html(r, hp, &e) == DSV4_OK, "%s", e.message);
    static char html[1 << 20];
    ck_assert_int_gt(tu_read_file(hp, html, sizeof html), 0);
    int nh = 0, na = 0, nw = 0;
    for (const char *p = html; (p = strstr(p, "<svg class=\"hulp\"")); p++)
        nh++;
    for (const char *p = html; (p = strstr(p, "<svg class=\"habs\"")); p++)
        na++;
    for (const char *p = html; (p = strstr(p, "<svg class=\"worst\"")); p++)
        nw++;
    /* the failing case in full (two histograms, the worst elements); the passing ones one line each,
       their profiles in report.json (above) */
    ck_assert_int_eq(nh, 1);
    ck_assert_int_eq(na, 1);
    ck_assert_int_eq(nw, 1);
    ck_assert_ptr_nonnull(strstr(html, "<svg class=\"mem\""));
    int nl = 0;
    for (const char *p = html; (p = strstr(p, "</td><td>ulp p99 ")); p++)
        nl++;
    ck_assert_int_eq(nl, 3);
    ck_assert_ptr_null(strstr(html, "<script"));
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
}
END_TEST

/* The progress line goes to stderr on a terminal only. */
/* report.html opens with the matrix: per axis value its counts, the failing values first with
   links to their cases, then the failing cases; the case table lists failing cases first and
   folds the passing cases' panels into <details>. */
/* Runs the scenario text `yaml` (n cases), writes its report.html as `file` and reads it into h. */
static void html_of(const char *yaml, const char *file, size_t n, char *h, size_t hn)
{
    char name[64];
    snprintf(name, sizeof name, "%s.yaml", file);
    dsv4_scenario *s = tu_scenario_text(yaml, name);
    dsv4_error e;
    dsv4_run_results *r = tu_run(s, cache_dir(), -1, NULL);
    ck_assert_uint_eq(dsv4_run_count(r), n);
    char hp[512];
    snprintf(name, sizeof name, "%s.html", file);
    tu_path(hp, sizeof hp, name);
    ck_assert_msg(dsv4_report_html(r, hp, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_gt(tu_read_file(hp, h, hn), 0);
    dsv4_run_results_free(r);
    dsv4_scenario_free(s);
}

START_TEST(html_matrix_summary)
{
    static const char yaml[] = "name: mx\n"
                               "defaults: {preset: tiny, layer: 1, topology: {backend: cpu}, checks: [numerics, refusal]}\n"
                               "axes:\n"
                               "  tokens: [3, 5]\n"
                               "  expect: [pass, {refused: zzz}]\n"
                               "cases:\n"
                               "  - {name: lone, tokens: [2]}\n";
    static char h[1 << 20];
    html_of(yaml, "report_matrix", 5, h, sizeof h);
    /* cases 1 and 3 (expect = the refusal) fail; the matrix comes before the cases */
    const char *mx = strstr(h, "<h2 id=\"matrix\">"), *cases = strstr(h, "<h2>Cases</h2>");
    ck_assert_ptr_nonnull(mx);
    ck_assert_ptr_nonnull(cases);
    ck_assert(mx < cases);
    const char *row_fail = strstr(mx, "<tr class=\"fail\"><td>expect</td><td class=\"name\">refused zzz</td><td class=\"num\">2</td>"
                                      "<td class=\"num\">0</td><td class=\"num\">2</td><td class=\"num\">0</td>"
                                      "<td class=\"num\">0</td><td class=\"num\">0</td><td><a href=\"#case-1\">1</a> "
                                      "<a href=\"#case-3\">3</a></td></tr>");
    const char *row_pass = strstr(mx, "<tr class=\"pass\"><td>expect</td><td class=\"name\">pass</td><td class=\"num\">2</td>"
                                      "<td class=\"num\">2</td><td class=\"num\">0</td>");
    const char *row_tok = strstr(mx, "<td>tokens</td><td class=\"name\">3</td><td class=\"num\">2</td><td class=\"num\">1</td>"
                                     "<td class=\"num\">1</td>");
    const char *row_case = strstr(mx, "<tr class=\"pass\"><td>case</td><td class=\"name\">lone</td>");
    ck_assert_msg(row_fail && row_pass && row_tok && row_case, "matrix rows missing");
    ck_assert(row_fail < row_pass); /* failures first */
    const char *failing = strstr(h, "<h2 id=\"failing\">Failing cases (2)</h2>");
    ck_assert_ptr_nonnull(failing);
    ck_assert_ptr_nonnull(strstr(failing, "<li><a href=\"#case-1\">1</a> <span class=\"name\">mx/tokens: 3; expect: refused zzz</span>"));
    /* the case table: the failing cases 1 and 3 before case 0; passing panels folded */
    const char *c0 = strstr(cases, "<tr id=\"case-0\">"), *c1 = strstr(cases, "<tr id=\"case-1\">"),
               *c3 = strstr(cases, "<tr id=\"case-3\">");
    ck_assert(c0 && c1 && c3 && c1 < c3 && c3 < c0);
    /* a failing case in full, a passing one in one line after the table */
    ck_assert_ptr_nonnull(strstr(c1, "<div class=\"ck fail\" title=\"expected a refusal matching /zzz/"));
    const char *rest = strstr(h, "<details class=\"rest\"><summary>3 cases passed, self-compared or skipped");
    ck_assert(rest && rest < c0);
    ck_assert_ptr_nonnull(strstr(c0, "</td><td>ulp p99 0, max 0; diff 0</td>"));
    ck_assert_ptr_null(strstr(c0, "<svg"));
    ck_assert_ptr_null(strstr(h, "<script"));
}
END_TEST

/* The matrix keeps each axis's rows together in the scenario's order: a case's name lists every
   axis, so tokens=5 first appears after layer=0 and layer=1, and its row still comes before them. */
START_TEST(html_matrix_grouped)
{
    static const char yaml[] = "name: gx\n"
                               "defaults: {preset: tiny, topology: {backend: cpu}, checks: [numerics]}\n"
                               "axes:\n"
                               "  tokens: [3, 5]\n"
                               "  layer: [0, 1]\n";
    static char h[1 << 20];
    html_of(yaml, "report_grouped", 4, h, sizeof h);
    const char *mx = strstr(h, "<h2 id=\"matrix\">");
    ck_assert_ptr_nonnull(mx);
    const char *t3 = strstr(mx, "<td>tokens</td><td class=\"name\">3</td>"),
               *t5 = strstr(mx, "<td>tokens</td><td class=\"name\">5</td>"),
               *l0 = strstr(mx, "<td>layer</td><td class=\"name\">0</td>"),
               *l1 = strstr(mx, "<td>layer</td><td class=\"name\">1</td>");
    ck_assert_msg(t3 && t5 && l0 && l1, "matrix rows missing");
    ck_assert_msg(t3 < t5 && t5 < l0 && l0 < l1, "rows not grouped by axis in the scenario's order");
}
END_TEST

/* Axis values by what they set (their titles) in report.html's matrix and case rows, JUnit's case
   names (the id as a property), report.json and run's summary (with the id) */
START_TEST(titles_in_reports)
{
    static const char yaml[] = "name: tl\n"
                               "defaults: {preset: tiny, layer: 1, topology: {backend: cpu}, checks: [numerics, refusal]}\n"
                               "axes:\n"
                               "  quant:\n"
                               "    - {label: \"routed fp8, shared fp8\", routed_format: fp8, shared_format: fp8}\n"
                               "    - {routed_format: bf16, shared_format: bf16, act_quant: none}\n"
                               "  expect: [pass, {refused: zzz}]\n";
    static char h[1 << 20];
    html_of(yaml, "report_titles", 4, h, sizeof h);
    const char *mx = strstr(h, "<h2 id=\"matrix\">");
    ck_assert_ptr_nonnull(mx);
    ck_assert_ptr_nonnull(strstr(mx, "<td>quant</td><td class=\"name\">routed fp8, shared fp8</td>"));
    ck_assert_ptr_nonnull(
        strstr(mx, "<td>quant</td><td class=\"name\">routed_format bf16, shared_format bf16, act_quant none</td>"));
    ck_assert_ptr_null(strstr(mx, "<td class=\"name\">0</td>"));
    ck_assert_ptr_nonnull(strstr(h, "title=\"tl/quant=0,expect=pass\">tl/quant: routed fp8, shared fp8; expect: "
                                    "pass</td>"));
    const char *cli = getenv("DSV4MOE_CLI");
    if (!cli)
        return; /* not run through make test */
    char f[512], dir[512], args[2048], p[600];
    static char out[1 << 16];
    tu_path(f, sizeof f, "report_titles.yaml");
    tu_path(dir, sizeof dir, "report_titles_run");
    ck_assert_int_eq(tu_write_file(f, yaml, strlen(yaml)), 0);
    snprintf(args, sizeof args, "run %s --report %s --cache %s", f, dir, cache_dir());
    ck_assert_int_eq(tu_run_cli(args, "report_titles.txt", out, sizeof out), 1);
    ck_assert_msg(strstr(out, "FAIL tl/quant: routed fp8, shared fp8; expect: refused zzz  [tl/quant=0,expect=1]"), "%s",
                  out);
    snprintf(p, sizeof p, "%s/junit.xml", dir);
    ck_assert_int_gt(tu_read_file(p, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "name=\"tl/quant: routed fp8, shared fp8; expect: pass\"") &&
                      strstr(out, "<property name=\"case\" value=\"tl/quant=0,expect=pass\"/>"),
                  "%s", out);
    snprintf(p, sizeof p, "%s/report.json", dir);
    ck_assert_int_gt(tu_read_file(p, out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"title\": \"tl/quant: routed fp8, shared fp8; expect: pass\""));
}
END_TEST

START_TEST(progress_only_on_a_terminal)
{
    const char *cli = getenv("DSV4MOE_CLI");
    if (!cli)
        return; /* not run through make test */
    char f[512], dir[512], args[2048], out[16384];
    tu_path(f, sizeof f, "report_progress.yaml");
    tu_path(dir, sizeof dir, "report_progress");
    static const char y[] = "name: prog\n"
                            "defaults: {preset: mini, layer: 1, topology: {backend: ref}, checks: [refusal]}\n"
                            "axes:\n  tokens: [[1], [2], [3]]\n";
    ck_assert_int_eq(tu_write_file(f, y, strlen(y)), 0);
    snprintf(args, sizeof args, "run %s --report %s --cache %s", f, dir, cache_dir());
    /* not a terminal: stdout and stderr into a file */
    int rc = tu_run_cli(args, "report_progress.txt", out, sizeof out);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, out);
    ck_assert_ptr_nonnull(strstr(out, "3 cases: 3 passed"));
    ck_assert_ptr_null(strchr(out, '\r'));
    ck_assert_ptr_null(strstr(out, "\033["));
    ck_assert_ptr_null(strstr(out, " left"));
    /* a terminal (script(1) gives the command a pseudo-terminal): the line with the count and time left */
    if (access("/usr/bin/script", X_OK) != 0)
        return;
    char cmd[4096], log[512];
    tu_path(log, sizeof log, "report_progress_tty.txt");
    snprintf(cmd, sizeof cmd, "/usr/bin/script -qec '%s %s' /dev/null > %s 2>&1 < /dev/null", cli, args, log);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_ge(tu_read_file(log, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "[1/3]") && strstr(out, "[3/3]") && strstr(out, " s left"), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "\r\033[K"));
}
END_TEST

Suite *report_suite(void)
{
    Suite *s = suite_create("report");
    TCase *t = tcase_create("report");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, error_profiles);
    tcase_add_test(t, progress_only_on_a_terminal);
    tcase_add_test(t, titles_in_reports);
    tcase_add_test(t, html_matrix_summary);
    tcase_add_test(t, html_matrix_grouped);
    suite_add_tcase(s, t);
    return s;
}
