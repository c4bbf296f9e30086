/*
 * report.html (dsv4moe_harness/run.h): one self-contained page, inline CSS and
 * inline SVG, no script and no external resource. A summary table, then the
 * matrix at a glance (per scenario, pass / fail counts per axis value, the
 * values with failures first, links to the failing cases) and the failing
 * cases with their failing checks; then every case (failing ones first) with
 * its checks, the numerics and memory panels folded into <details> (open for
 * a failing case) (the detail as a tooltip), per case with numerics the
 * bf16 ULP percentiles on a log scale and the error metrics, memory bars
 * (budget, planned maximum, planned step, measured peak, log scale), and for
 * a failing check its detail; a symmetry failure's differing collectives
 * side by side; per case with numerics the bounded error profile the runner
 * keeps (ULP and |a-b| histograms over fixed bins, the worst elements with
 * rank, token, column and both values). In the fault build, the detection
 * table of a --faults run and the injected runs, marked. Written atomically
 * (temporary file next to the target, renamed into place, removed on error).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"
#include "compare/results.h"
#include "harness/reports.h"
#include "dsv4moe_harness/run.h"
#include "core/err.h"
#include "core/grow.h"
#ifdef DSV4_FAULTS
#include "harness/fault_runs.h"
#endif

/* Text or attribute value: & < > " ' escaped, newline kept as &#10;, other control characters dropped,
   invalid UTF-8 bytes replaced with '?'. At most `max` bytes of s (0: all). */
static void hb_esc_n(dsv4_strbuf *b, const char *s, size_t max)
{
    const unsigned char *p = (const unsigned char *)(s ? s : ""), *end = p + (max ? max : strlen((const char *)p));
    while (p < end && *p) {
        unsigned char ch = *p;
        const char *ent = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&quot;"
                        : ch == '\'' ? "&#39;" : ch == '\n' ? "&#10;" : ch == '\t' ? " " : NULL;
        if (ent) {
            dsv4_sb_put(b, ent, strlen(ent));
            p++;
        } else if (ch < 0x20 || ch == 0x7f) {
            p++;
        } else if (ch < 0x80) {
            dsv4_sb_put(b, (const char *)p++, 1);
        } else {
            dsv4_sb_utf8(b, &p, end);
        }
    }
}

static void hb_esc(dsv4_strbuf *b, const char *s) { hb_esc_n(b, s, 0); }


/* ULP percentiles as vertical bars, height log2(1 + ulp) against the case's maximum. */
static void svg_ulp(dsv4_strbuf *b, const dsv4_compare_metrics *m)
{
    const char *lab[5] = {"p50", "p90", "p99", "p99.9", "max"};
    uint32_t v[5] = {m->ulp_p50, m->ulp_p90, m->ulp_p99, m->ulp_p999, m->ulp_max};
    double top = log2(1.0 + (m->ulp_max > 1 ? m->ulp_max : 1));
    const int W = 200, H = 70, bw = 30;
    dsv4_sb_printf(b, "<svg class=\"ulp\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">"
                 "<title>bf16 ULP distance percentiles (log scale)</title>", W, H + 28, W, H + 28);
    dsv4_sb_printf(b, "<line x1=\"0\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>", H, W, H);
    for (int i = 0; i < 5; i++) {
        double h = top > 0 ? log2(1.0 + v[i]) / top * (H - 12) : 0;
        int x = 8 + i * 38;
        const char *col = v[i] == 0 ? "#6a6" : v[i] <= 1 ? "#cb4" : "#d55";
        dsv4_sb_printf(b, "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"><title>ulp %s = %u</title>"
                     "</rect>", x, H - h, bw, h > 0 ? h : 0.0, col, lab[i], v[i]);
        dsv4_sb_printf(b, "<text x=\"%d\" y=\"%.1f\" class=\"v\">%u</text>", x + bw / 2, H - h - 2, v[i]);
        dsv4_sb_printf(b, "<text x=\"%d\" y=\"%d\" class=\"l\">%s</text>", x + bw / 2, H + 12, lab[i]);
    }
    dsv4_sb_printf(b, "<text x=\"%d\" y=\"%d\" class=\"l\">bf16 ULP, log2(1+ulp) scale</text></svg>", W / 2, H + 25);
}

static const char *status_class(dsv4_result r);

/* One histogram of fixed bins: bar heights log10(1 + count) against the largest. */
static void svg_hist(dsv4_strbuf *b, const char *cls, const char *title, const uint64_t *v, const char *const *lab,
                     int64_t n)
{
    const int W = 16 * 15 + 20, H = 60, bw = 13;
    double top = 0;
    for (int i = 0; i < DSV4_ERR_BINS; i++)
        top = log10(1.0 + (double)v[i]) > top ? log10(1.0 + (double)v[i]) : top;
    dsv4_sb_printf(b, "<svg class=\"%s\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\"><title>", cls, W,
                   H + 40, W, H + 40);
    hb_esc(b, title);
    dsv4_sb_printf(b, "</title><line x1=\"0\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>", H, W, H);
    for (int i = 0; i < DSV4_ERR_BINS; i++) {
        double h = top > 0 ? log10(1.0 + (double)v[i]) / top * (H - 4) : 0;
        int x = 4 + i * 15;
        const char *col = i == 0 ? "#6a6" : i < 4 ? "#cb4" : "#d55";
        dsv4_sb_printf(b, "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"><title>%s: %llu of %lld"
                          "</title></rect>",
                       x, H - h, bw, h, col, lab[i], (unsigned long long)v[i], (long long)n);
        if (i % 3 == 0 || i == DSV4_ERR_BINS - 1)
            dsv4_sb_printf(b, "<text x=\"%d\" y=\"%d\" class=\"l\">%s</text>", x + bw / 2, H + 11, lab[i]);
    }
    dsv4_sb_printf(b, "<text x=\"%d\" y=\"%d\" class=\"l\">", W / 2, H + 30);
    hb_esc(b, title);
    dsv4_sb_str(b, "</text></svg>");
}

static void svg_errors(dsv4_strbuf *b, const dsv4_case_errors *E)
{
    static const char *const ulab[DSV4_ERR_BINS] = {"0", "1", "2", "4", "8", "16", "32", "64", "128", "256",
                                                   "512", "1k", "2k", "4k", "8k", "16k+"};
    static const char *const alab[DSV4_ERR_BINS] = {"0", "&lt;1e-8", "1e-8", "1e-7", "1e-6", "1e-5", "1e-4", "1e-3",
                                                   "1e-2", "0.1", "1", "10", "100", "1e3", "1e4", "1e5+"};
    svg_hist(b, "hulp", "bf16 ULP distance histogram (log count)", E->ulp_bins, ulab, E->n);
    svg_hist(b, "habs", "|a-b| histogram by decade (log count)", E->abs_bins, alab, E->n);
}

/* The worst elements as rows of an SVG table with a bar of |a-b| against the worst. */
static void svg_worst(dsv4_strbuf *b, const dsv4_case_errors *E)
{
    if (E->n_worst == 0) {
        dsv4_sb_str(b, "<div class=\"note\">no element differs</div>");
        return;
    }
    const int rh = 13, W = 430, H = (E->n_worst + 1) * rh + 4;
    double top = E->worst[0].diff;
    dsv4_sb_printf(b, "<svg class=\"worst\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">"
                      "<title>the worst elements</title>",
                   W, H, W, H);
    static const char *const head[] = {"index", "rank", "token", "col", "a (backend)", "b (ref)", "|a-b|"};
    static const int col_x[] = {40, 70, 105, 140, 210, 280, 340};
    for (int k = 0; k < 7; k++)
        dsv4_sb_printf(b, "<text x=\"%d\" y=\"%d\" class=\"wh\">%s</text>", col_x[k], rh - 2, head[k]);
    for (int i = 0; i < E->n_worst; i++) {
        const dsv4_case_worst *w = &E->worst[i];
        int y = (i + 2) * rh - 2;
        double f = top > 0 && isfinite(top) ? w->diff / top : 1.0;
        dsv4_sb_printf(b, "<rect x=\"345\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#e99\"/>", y - rh + 4,
                       (isfinite(f) ? f : 1.0) * 80, rh - 3);
        dsv4_sb_printf(b, "<text x=\"40\" y=\"%d\" class=\"wv\">%lld</text><text x=\"70\" y=\"%d\" class=\"wv\">%d"
                          "</text><text x=\"105\" y=\"%d\" class=\"wv\">%lld</text><text x=\"140\" y=\"%d\" "
                          "class=\"wv\">%lld</text><text x=\"210\" y=\"%d\" class=\"wv\">%.5g</text><text x=\"280\" "
                          "y=\"%d\" class=\"wv\">%.5g</text><text x=\"340\" y=\"%d\" class=\"wv\">%.3g</text>",
                       y, (long long)w->index, y, w->rank, y, (long long)w->token, y, (long long)w->column, y,
                       (double)w->a, y, (double)w->b, y, w->diff);
    }
    dsv4_sb_str(b, "</svg>");
}

#ifdef DSV4_FAULTS
/* The detection table of a --faults run (fault build). */
static void fault_section(dsv4_strbuf *b, const dsv4_run_results *R)
{
    size_t n = dsv4_run_fault_rows(R, NULL, 0);
    dsv4_fault_row *rows = n ? calloc(n, sizeof *rows) : NULL;
    if (!rows)
        return;
    dsv4_run_fault_rows(R, rows, n);
    dsv4_fault_summary s = dsv4_run_fault_summary(R);
    dsv4_sb_printf(b, "<h2>Defect catalogue</h2>\n<p id=\"f-summary\" class=\"%s\">%zu of %zu defects caught; %zu "
                      "false failures in %zu clean runs</p>\n<table class=\"faults\"><tr><th>fault</th><th>finding"
                      "</th><th>defect</th><th>injected at</th><th>scenario</th><th>clean</th><th>injected</th>"
                      "<th>caught</th><th>caught by</th></tr>\n",
                   s.caught == s.defects && !s.false_failures ? "pass" : "fail", s.caught, s.defects,
                   s.false_failures, s.clean_runs);
    for (size_t i = 0; i < n; i++) {
        const dsv4_fault_row *r = &rows[i];
        const char *cell[5] = {r->fault, r->findings, r->summary, r->where, r->case_name};
        dsv4_sb_str(b, "<tr>");
        for (int k = 0; k < 5; k++) {
            dsv4_sb_str(b, k >= 3 ? "<td class=\"name\">" : "<td>");
            hb_esc(b, cell[k]);
            dsv4_sb_str(b, "</td>");
        }
        dsv4_sb_printf(b, "<td class=\"st %s\">%s</td><td class=\"st %s\">%s</td><td class=\"st %s\">%s</td>"
                          "<td class=\"det\">",
                       status_class(r->clean), dsv4_result_name(r->clean), status_class(r->injected),
                       dsv4_result_name(r->injected), r->caught ? "pass" : "fail", r->caught ? "yes" : "no");
        hb_esc_n(b, r->caught_by, 400);
        dsv4_sb_str(b, "</td></tr>\n");
    }
    dsv4_sb_str(b, "</table>\n");
    free(rows);
}
#endif

/* Budget, planned maximum, planned step and measured peak as horizontal bars, log10 bytes from 1 KiB. */
static void svg_mem(dsv4_strbuf *b, const dsv4_case_memory *mem)
{
    const char *lab[4] = {"budget", "planned max", "planned step", "peak"};
    uint64_t v[4] = {mem->available, mem->planned_max, mem->planned_step, mem->peak};
    const char *col[4] = {"#8ab", "#58c", "#9bd", "#e93"};
    uint64_t mx = 1024;
    for (int i = 0; i < 4; i++)
        mx = v[i] > mx ? v[i] : mx;
    double lo = log10(1024.0), span = log10((double)mx) - lo;
    const int W = 300, bar_x = 78, bar_w = 130, rh = 14;
    dsv4_sb_printf(b, "<svg class=\"mem\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">"
                 "<title>memory per case (log scale from 1 KiB)</title>", W, 4 * rh + 4, W, 4 * rh + 4);
    for (int i = 0; i < 4; i++) {
        char hb[32];
        int y = 2 + i * rh;
        bool na = i == 3 && !mem->measured;
        double f = na || v[i] <= 1024 || span <= 0 ? (v[i] > 0 && !na ? 0.01 : 0) : (log10((double)v[i]) - lo) / span;
        if (na)
            snprintf(hb, sizeof hb, "not measured");
        else
            dsv4_h_human_bytes(v[i], hb, sizeof hb);
        dsv4_sb_printf(b, "<text x=\"%d\" y=\"%d\" class=\"ml\">%s</text>", bar_x - 4, y + 10, lab[i]);
        dsv4_sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#eee\"/>", bar_x, y + 1, bar_w, rh - 3);
        dsv4_sb_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>%s: %s (%llu bytes)"
                     "</title></rect>", bar_x, y + 1, f * bar_w, rh - 3, col[i], lab[i], hb,
                  (unsigned long long)v[i]);
        dsv4_sb_printf(b, "<text x=\"%d\" y=\"%d\" class=\"mv\">%s</text>", bar_x + bar_w + 4, y + 10, hb);
    }
    dsv4_sb_str(b, "</svg>");
}

/* "... rank 0 [A] vs rank R [B] (...)" (harness/run.c's symmetry detail): both entries side by side. */
static bool symmetry_table(dsv4_strbuf *b, const char *d)
{
    const char *a0 = strstr(d, "rank 0 ["), *vs = a0 ? strstr(a0, "] vs rank ") : NULL;
    const char *b0 = vs ? strchr(vs + 10, '[') : NULL, *b1 = b0 ? strstr(b0, "] (") : NULL;
    if (!b1)
        return false;
    const char *hash = strstr(d, "#");
    dsv4_sb_str(b, "<table class=\"sym\"><tr><th>position</th><th>rank 0</th><th>rank ");
    size_t rl = (size_t)(b0 - (vs + 10));
    hb_esc_n(b, vs + 10, rl > 1 && vs[10 + rl - 1] == ' ' ? rl - 1 : rl);
    dsv4_sb_str(b, "</th></tr><tr><td>");
    if (hash && hash < a0) {
        size_t k = strspn(hash + 1, "0123456789");
        hb_esc_n(b, hash, k + 1);
    }
    dsv4_sb_str(b, "</td><td class=\"tr\">");
    hb_esc_n(b, a0 + 8, (size_t)(vs - (a0 + 8)));
    dsv4_sb_str(b, "</td><td class=\"tr\">");
    hb_esc_n(b, b0 + 1, (size_t)(b1 - (b0 + 1)));
    dsv4_sb_str(b, "</td></tr></table><div class=\"note\">");
    hb_esc(b, b1 + 2);
    dsv4_sb_str(b, "</div>");
    return true;
}

static const char *status_class(dsv4_result r)
{
    return r == DSV4_RESULT_PASS   ? "pass"
           : r == DSV4_RESULT_FAIL ? "fail"
           : r == DSV4_RESULT_SKIP ? "skip"
           : r == DSV4_RESULT_SELF ? "self"
                                   : "error";
}

/* ---------------- the matrix summary ---------------- */

/* One (scenario, axis, value) of the matrix: its case counts and the failing cases. */
typedef struct {
    const char *scen;
    char *axis, *value;
    size_t axis_order; /* the first appearance of its axis: a scenario's rows stay grouped by axis */
    size_t order;      /* first appearance: the matrix keeps the scenario's axis and value order */
    size_t n[5];  /* pass, fail, skip, error, self-compared (dsv4_result order) */
    size_t *bad;  /* indices of the failed and errored cases */
    size_t nbad, capbad;
} mx_cell;

typedef struct {
    mx_cell *c;
    size_t n, cap;
    bool oom;
} mx_table;

static mx_cell *mx_find(mx_table *t, const char *scen, const char *axis, size_t alen, const char *value, size_t vlen)
{
    size_t axis_order = t->n;
    for (size_t i = 0; i < t->n; i++) {
        const bool same_axis = !strcmp(t->c[i].scen, scen) && strlen(t->c[i].axis) == alen &&
                               !strncmp(t->c[i].axis, axis, alen);
        if (same_axis && strlen(t->c[i].value) == vlen && !strncmp(t->c[i].value, value, vlen))
            return &t->c[i];
        if (same_axis && t->c[i].axis_order < axis_order)
            axis_order = t->c[i].axis_order;
    }
    mx_cell *nc = dsv4_grow(t->c, &t->cap, t->n + 1, sizeof *nc, 32);
    if (!nc)
        return NULL;
    t->c = nc;
    mx_cell *c = &t->c[t->n];
    memset(c, 0, sizeof *c);
    c->scen = scen;
    c->axis_order = axis_order;
    c->order = t->n;
    c->axis = malloc(alen + 1);
    c->value = malloc(vlen + 1);
    if (!c->axis || !c->value) {
        free(c->axis);
        free(c->value);
        return NULL;
    }
    memcpy(c->axis, axis, alen);
    c->axis[alen] = '\0';
    memcpy(c->value, value, vlen);
    c->value[vlen] = '\0';
    t->n++;
    return c;
}

static void mx_count(mx_table *t, const char *scen, const char *axis, size_t alen, const char *value, size_t vlen,
                     dsv4_result r, size_t idx)
{
    mx_cell *c = t->oom ? NULL : mx_find(t, scen, axis, alen, value, vlen);
    if (!c) {
        t->oom = true;
        return;
    }
    c->n[r]++;
    if (r != DSV4_RESULT_FAIL && r != DSV4_RESULT_ERROR)
        return;
    size_t *nb = dsv4_grow(c->bad, &c->capbad, c->nbad + 1, sizeof *nb, 8);
    if (!nb) {
        t->oom = true;
        return;
    }
    c->bad = nb;
    c->bad[c->nbad++] = idx;
}

/* A product case's title is "<scenario>/<axis>: <value>; <axis>: <value>..." (each value by what
   it sets); a case without one is read from its name, "<scenario>/<axis>=<value>,<axis>=<value>..."
   (a value may be a bracketed list with commas); any other case counts under the axis "case". */
static void mx_add_case(mx_table *t, const dsv4_case_result *c, size_t idx)
{
    const char *name = c->title ? c->title : dsv4_case_name(c), *scen = dsv4_case_scenario(c);
    size_t sl = strlen(scen);
    const char *rest = !strncmp(name, scen, sl) && name[sl] == '/' ? name + sl + 1 : name;
    dsv4_result r = dsv4_case_status(c);
    bool pairs = false;
    for (const char *p = rest; c->title && *p;) {
        const char *e = strstr(p, "; "), *colon;
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if ((colon = strstr(p, ": ")) && colon < p + len) {
            mx_count(t, scen, p, (size_t)(colon - p), colon + 2, (size_t)(p + len - colon - 2), r, idx);
            pairs = true;
        }
        p = e ? e + 2 : p + len;
    }
    for (const char *p = rest; !c->title && *p;) {
        const char *e = p;
        int depth = 0;
        while (*e && (depth > 0 || *e != ',')) {
            depth += *e == '[' ? 1 : *e == ']' ? -1 : 0;
            e++;
        }
        const char *eq = memchr(p, '=', (size_t)(e - p));
        if (eq) {
            mx_count(t, scen, p, (size_t)(eq - p), eq + 1, (size_t)(e - eq - 1), r, idx);
            pairs = true;
        }
        p = *e ? e + 1 : e;
    }
    if (!pairs)
        mx_count(t, scen, "case", 4, rest, strlen(rest), r, idx);
}

static void mx_free(mx_table *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free(t->c[i].axis);
        free(t->c[i].value);
        free(t->c[i].bad);
    }
    free(t->c);
}

/* Failing values first (most failures first), then the scenario's own order: its axes in the
   order they first appear, each axis's values in theirs (a case's name lists every axis, so first
   appearance alone would interleave the axes). */
static int mx_cmp(const void *a, const void *b)
{
    const mx_cell *x = a, *y = b;
    size_t bx = x->n[DSV4_RESULT_FAIL] + x->n[DSV4_RESULT_ERROR], by = y->n[DSV4_RESULT_FAIL] + y->n[DSV4_RESULT_ERROR];
    if ((bx > 0) != (by > 0))
        return bx > 0 ? -1 : 1;
    if (bx != by)
        return bx > by ? -1 : 1;
    if (x->axis_order != y->axis_order)
        return x->axis_order < y->axis_order ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* The matrix: per scenario, one row per axis value with its pass / fail counts and links to the
   failing cases; then the failing cases with their failing checks. Returns false when out of memory. */
static bool matrix_section(dsv4_strbuf *b, const dsv4_run_results *R)
{
    mx_table t = {0};
    size_t nbad = 0;
    for (size_t i = 0; i < dsv4_run_count(R); i++) {
        const dsv4_case_result *c = dsv4_run_get(R, i);
        if (c->injected)
            continue;
        mx_add_case(&t, c, i);
        dsv4_result r = dsv4_case_status(c);
        nbad += r == DSV4_RESULT_FAIL || r == DSV4_RESULT_ERROR;
    }
    if (t.oom) {
        mx_free(&t);
        return false;
    }
    qsort(t.c, t.n, sizeof *t.c, mx_cmp);
    dsv4_sb_str(b, "<h2 id=\"matrix\">Matrix</h2>\n<p class=\"note\">Cases by axis value (the scenario's axes; "
                  "cases outside the product under <i>case</i>); values with failures first. A number links to "
                  "the case's details below.</p>\n");
    const char *scen_done[64];
    size_t nscen = 0;
    for (size_t i = 0; i < t.n; i++) {
        const char *scen = t.c[i].scen;
        bool seen = false;
        for (size_t k = 0; k < nscen && !seen; k++)
            seen = !strcmp(scen_done[k], scen);
        if (seen)
            continue;
        if (nscen < 64)
            scen_done[nscen++] = scen;
        dsv4_sb_str(b, "<h3>");
        hb_esc(b, scen);
        dsv4_sb_str(b, "</h3>\n<table class=\"mx\"><tr><th>axis</th><th>value</th><th>cases</th><th>passed</th>"
                      "<th>failed</th><th>errors</th><th>skipped</th><th>self-compared</th><th>failing cases</th></tr>\n");
        for (size_t j = i; j < t.n; j++) {
            const mx_cell *m = &t.c[j];
            if (strcmp(m->scen, scen))
                continue;
            size_t bad = m->n[DSV4_RESULT_FAIL] + m->n[DSV4_RESULT_ERROR];
            dsv4_sb_printf(b, "<tr class=\"%s\"><td>", bad ? "fail" : "pass");
            hb_esc(b, m->axis);
            dsv4_sb_str(b, "</td><td class=\"name\">");
            hb_esc(b, m->value);
            dsv4_sb_printf(b, "</td><td class=\"num\">%zu</td><td class=\"num\">%zu</td><td class=\"num\">%zu</td>"
                              "<td class=\"num\">%zu</td><td class=\"num\">%zu</td><td class=\"num\">%zu</td><td>",
                           m->n[0] + m->n[1] + m->n[2] + m->n[3] + m->n[4], m->n[DSV4_RESULT_PASS],
                           m->n[DSV4_RESULT_FAIL], m->n[DSV4_RESULT_ERROR], m->n[DSV4_RESULT_SKIP],
                           m->n[DSV4_RESULT_SELF]);
            for (size_t k = 0; k < m->nbad && k < 40; k++)
                dsv4_sb_printf(b, "%s<a href=\"#case-%zu\">%zu</a>", k ? " " : "", m->bad[k], m->bad[k]);
            if (m->nbad > 40)
                dsv4_sb_printf(b, " (+%zu more)", m->nbad - 40);
            dsv4_sb_str(b, "</td></tr>\n");
        }
        dsv4_sb_str(b, "</table>\n");
    }
    mx_free(&t);
    dsv4_sb_printf(b, "<h2 id=\"failing\">Failing cases (%zu)</h2>\n", nbad);
    if (!nbad) {
        dsv4_sb_str(b, "<p>none</p>\n");
        return true;
    }
    dsv4_sb_str(b, "<ul class=\"failing\">\n");
    for (size_t i = 0; i < dsv4_run_count(R); i++) {
        const dsv4_case_result *c = dsv4_run_get(R, i);
        dsv4_result r = dsv4_case_status(c);
        if (c->injected || (r != DSV4_RESULT_FAIL && r != DSV4_RESULT_ERROR))
            continue;
        dsv4_sb_printf(b, "<li><a href=\"#case-%zu\">%zu</a> <span class=\"name\">", i, i);
        hb_esc(b, dsv4_case_title(c));
        dsv4_sb_printf(b, "</span> <span class=\"st %s\">%s</span>:", status_class(r), dsv4_result_name(r));
        for (int k = 0; k < DSV4_CHECK_COUNT; k++) {
            const char *d;
            dsv4_result cr = dsv4_case_check(c, 1u << k, &d);
            if (cr == DSV4_RESULT_FAIL || cr == DSV4_RESULT_ERROR)
                dsv4_sb_printf(b, " %s", dsv4_check_name(1u << k));
        }
        dsv4_sb_str(b, "</li>\n");
    }
    dsv4_sb_str(b, "</ul>\n");
    return true;
}

static const char CSS[] =
    "body{font:13px/1.35 system-ui,sans-serif;margin:16px;color:#222}h1{font-size:20px}h2{font-size:16px}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}"
    "th{background:#f3f3f3;text-align:left}.pass{background:#d8f0d8}.fail{background:#f6c9c9}"
    ".skip{background:#eee;color:#777}.self{background:#fff3c4;color:#7a5b00}.error{background:#f6ddb0}.st{font-weight:bold;text-transform:uppercase}"
    ".ck{font-size:11px;white-space:nowrap;cursor:help}.name{font-family:monospace;max-width:340px;"
    "overflow-wrap:anywhere}.num{text-align:right}.metrics{font-family:monospace;font-size:11px}"
    "svg text{font:10px sans-serif}svg .v,svg .l{text-anchor:middle}svg .ml{text-anchor:end}"
    ".det{font-family:monospace;font-size:11px;white-space:pre-wrap;max-width:900px}"
    ".sym td.tr{font-family:monospace;background:#fff3f3}.note{font-size:11px;color:#555}"
    "svg .wh{font-weight:bold;text-anchor:end}svg .wv{font-family:monospace;text-anchor:end}"
    ".inj{font-size:11px;background:#fde;padding:0 3px;border-radius:3px}"
    "h3{font-size:14px;margin:10px 0 4px}.mx td{padding:2px 6px}.mx td.name{max-width:260px}"
    "ul.failing{font-size:12px}details summary{cursor:pointer;font-size:11px;color:#333}";

dsv4_status dsv4_report_html(const dsv4_run_results *R, const char *path, dsv4_error *err)
{
    dsv4_outfile o;
    dsv4_status st = dsv4_report_html_stage(R, path, &o, err);
    return st ? st : dsv4_out_commit(&o, err);
}

/* "peak X of Y planned" for a planned case; false when it has no plan. */
static bool mem_summary(const dsv4_case_memory *mem, char *buf, size_t n)
{
    if (!mem->available && !mem->planned_max)
        return false;
    char pk[32], pl[32];
    dsv4_h_human_bytes(mem->peak, pk, sizeof pk);
    dsv4_h_human_bytes(mem->planned_max, pl, sizeof pl);
    snprintf(buf, n, "peak %s of %s planned", mem->measured ? pk : "not measured", pl);
    return true;
}

/* The case's name cell: its title, its id when the title differs, and a fault run's defect. */
static void case_name_cell(dsv4_strbuf *b, const dsv4_case_result *c, size_t i)
{
    dsv4_sb_printf(b, "<tr id=\"case-%zu\"><td class=\"num\">%zu</td><td class=\"name\">", i, i);
    hb_esc(b, dsv4_case_title(c));
    if (c->title) { /* the id: what --filter and the export folders use */
        dsv4_sb_str(b, "<br><span class=\"note\">");
        hb_esc(b, c->name);
        dsv4_sb_str(b, "</span>");
    }
    if (c->defect) { /* the fault build's --faults runs only */
        dsv4_sb_printf(b, " <span class=\"%s\">", c->injected ? "inj" : "note");
        dsv4_sb_str(b, c->injected ? "injected " : "catches ");
        hb_esc(b, c->defect);
        dsv4_sb_str(b, "</span>");
    }
}

/* A failing or errored case in full: every check with its detail on hover, the error profile and the
   memory bars open, and the failing checks' details in rows of their own. */
static void case_row_full(dsv4_strbuf *b, const dsv4_case_result *c, size_t i)
{
    dsv4_result st = dsv4_case_status(c);
    case_name_cell(b, c, i);
    dsv4_sb_printf(b, "</td><td class=\"st %s\">%s</td><td>", status_class(st), dsv4_result_name(st));
    for (int k = 0; k < DSV4_CHECK_COUNT; k++) {
        const char *d;
        dsv4_result r = dsv4_case_check(c, 1u << k, &d);
        if (r == DSV4_RESULT_SKIP && !strcmp(d, "not requested"))
            continue;
        dsv4_sb_printf(b, "<div class=\"ck %s\" title=\"", status_class(r));
        hb_esc(b, d);
        dsv4_sb_printf(b, "\">%s: %s</div>", dsv4_check_name(1u << k), dsv4_result_name(r));
    }
    dsv4_sb_printf(b, "</td><td class=\"num\">%.3f</td><td>", dsv4_case_seconds(c));
    dsv4_compare_metrics m;
    if (dsv4_case_metrics(c, &m)) {
        dsv4_sb_printf(b, "<details open><summary>ulp p99 %u, max %u; diff %.3g</summary>", m.ulp_p99, m.ulp_max,
                       m.deepgemm_diff);
        svg_ulp(b, &m);
        dsv4_sb_printf(b, "<div class=\"metrics\">n %lld, max_abs %.3g, max_rel %.3g<br>nmse %.3g, diff %.3g, rms %.3g"
                          "<br>ulp&ne;0 %lld, beyond tol %lld, non-finite %lld</div>",
                       (long long)m.n, m.max_abs, m.max_rel, m.nmse, m.deepgemm_diff, m.rms_ref,
                       (long long)m.ulp_nonzero, (long long)m.tol_violations, (long long)m.bad_nonfinite);
        if (c->rounding) /* an outside engine's check: both counts side by side (SPEC.md section 10) */
            dsv4_sb_printf(b, "<div class=\"metrics\">rounding %s: beyond %lld with S, %lld without</div>",
                           c->rounding, (long long)c->beyond_terms, (long long)m.tol_violations);
        dsv4_case_errors E;
        if (dsv4_case_errors_of(c, &E)) {
            svg_errors(b, &E);
            svg_worst(b, &E);
        }
        dsv4_sb_str(b, "</details>");
    } else {
        dsv4_sb_str(b, "<span class=\"note\">nothing compared</span>");
    }
    dsv4_sb_str(b, "</td><td>");
    dsv4_case_memory mem = dsv4_case_memory_of(c);
    char ms[96];
    if (mem_summary(&mem, ms, sizeof ms)) {
        dsv4_sb_printf(b, "<details open><summary>%s</summary>", ms);
        svg_mem(b, &mem);
        dsv4_sb_str(b, "</details>");
    } else {
        dsv4_sb_str(b, "<span class=\"note\">no plan</span>");
    }
    dsv4_sb_str(b, "</td></tr>\n");
    /* The details of the failing checks, in a row of their own (visible without hovering). */
    for (int k = 0; k < DSV4_CHECK_COUNT; k++) {
        const char *d;
        dsv4_result r = dsv4_case_check(c, 1u << k, &d);
        if (r != DSV4_RESULT_FAIL && r != DSV4_RESULT_ERROR)
            continue;
        dsv4_sb_printf(b, "<tr><td></td><td colspan=\"6\" class=\"%s\"><b>%s %s</b>", status_class(r),
                       dsv4_check_name(1u << k), dsv4_result_name(r));
        if (!((1u << k) == DSV4_CHECK_SYMMETRY && symmetry_table(b, d))) {
            dsv4_sb_str(b, "<div class=\"det\">");
            hb_esc(b, d);
            dsv4_sb_str(b, "</div>");
        }
        dsv4_sb_str(b, "</td></tr>\n");
    }
}

/* Any other case in one line: its id on hover, the checks that passed counted and the others named
   (a skip's or a self-comparison's reason shown, as it says what did not run), the numerics and
   memory summaries. */
static void case_row_line(dsv4_strbuf *b, const dsv4_case_result *c, size_t i)
{
    dsv4_result st = dsv4_case_status(c);
    dsv4_sb_printf(b, "<tr id=\"case-%zu\"><td class=\"num\">%zu</td><td class=\"name\"", i, i);
    if (c->title) { /* the id (what --filter and the export folders use) on hover */
        dsv4_sb_str(b, " title=\"");
        hb_esc(b, c->name);
        dsv4_sb_str(b, "\"");
    }
    dsv4_sb_str(b, ">");
    hb_esc(b, dsv4_case_title(c));
    dsv4_sb_printf(b, "</td><td class=\"st %s\">%s</td><td>", status_class(st), dsv4_result_name(st));
    int passed = 0, asked = 0;
    for (int k = 0; k < DSV4_CHECK_COUNT; k++) {
        const char *d;
        dsv4_result r = dsv4_case_check(c, 1u << k, &d);
        asked += !(r == DSV4_RESULT_SKIP && !strcmp(d, "not requested"));
        passed += r == DSV4_RESULT_PASS;
    }
    dsv4_sb_printf(b, "%d of %d pass", passed, asked);
    for (int k = 0; k < DSV4_CHECK_COUNT; k++) {
        const char *d;
        dsv4_result r = dsv4_case_check(c, 1u << k, &d);
        if (r == DSV4_RESULT_PASS || (r == DSV4_RESULT_SKIP && !strcmp(d, "not requested")))
            continue;
        bool na = r == DSV4_RESULT_SKIP && !strncmp(d, "not applicable", 14);
        dsv4_sb_printf(b, "; <span class=\"%s\">%s %s</span>", status_class(r), dsv4_check_name(1u << k),
                       na ? "n/a" : dsv4_result_name(r));
        if (!na) {
            dsv4_sb_str(b, " <span class=\"note\">(");
            hb_esc(b, d);
            dsv4_sb_str(b, ")</span>");
        }
    }
    dsv4_sb_printf(b, "</td><td class=\"num\">%.3f</td><td>", dsv4_case_seconds(c));
    dsv4_compare_metrics m;
    if (dsv4_case_metrics(c, &m))
        dsv4_sb_printf(b, "ulp p99 %u, max %u; diff %.3g", m.ulp_p99, m.ulp_max, m.deepgemm_diff);
    dsv4_sb_str(b, "</td><td>");
    dsv4_case_memory mem = dsv4_case_memory_of(c);
    char ms[96];
    if (mem_summary(&mem, ms, sizeof ms))
        dsv4_sb_str(b, ms);
    dsv4_sb_str(b, "</td></tr>\n");
}

dsv4_status dsv4_report_html_stage(const dsv4_run_results *R, const char *path, dsv4_outfile *o, dsv4_error *err)
{
    if (!R || !path)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "report", "results and path must not be NULL");
    dsv4_strbuf b = {0};
    dsv4_run_summary s = dsv4_run_summarize(R);
    dsv4_sb_printf(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dsv4moe report</title>"
                  "<style>%s</style></head><body>\n<h1>dsv4moe run report</h1>\n", CSS);
    dsv4_sb_printf(&b, "<table class=\"summary\"><tr><th>cases</th><th>passed</th><th>failed</th><th>skipped</th>"
                  "<th>self-compared</th><th>errors</th><th>time (s)</th><th>version</th></tr>\n<tr><td class=\"num\" "
                  "id=\"s-cases\">%zu</td><td class=\"num pass\" id=\"s-passed\">%zu</td><td class=\"num%s\" "
                  "id=\"s-failed\">%zu</td><td class=\"num%s\" id=\"s-skipped\">%zu</td><td class=\"num%s\" "
                  "id=\"s-self\">%zu</td><td class=\"num%s\" id=\"s-errors\">%zu</td><td class=\"num\">%.2f</td>"
                  "<td>%s</td></tr></table>\n",
              s.cases, s.passed, s.failed ? " fail" : "", s.failed, s.skipped ? " skip" : "", s.skipped,
              s.self_compared ? " self" : "", s.self_compared, s.errors ? " error" : "", s.errors, s.seconds,
              DSV4_VERSION);
    if (s.self_compared)
        dsv4_sb_str(&b, "<p class=\"note\">Self-compared: cases on the ref backend at world 1, whose numerics held "
                        "the reference to itself and could not fail; not passes.</p>\n");
    if (!matrix_section(&b, R))
        b.oom = true; /* dsv4_sb_write_file reports it */
#ifdef DSV4_FAULTS
    fault_section(&b, R);
#endif
    dsv4_sb_str(&b, "<h2>Cases</h2>\n<p class=\"note\">Hover a check for its detail. ULP bars: bf16 ULP distance "
               "percentiles of all ranks' outputs. Histograms: the ULP distance (bins 0, 1, [2,4), [4,8), ...) and "
               "|a-b| by decade over every compared element, log count; then the worst elements (index in all "
               "ranks' outputs, rank, token, column, both values, |a-b|). Memory bars: log scale from 1 KiB. Runs "
               "marked <span class=\"inj\">injected</span> had a defect of the review injected (fault build) and "
               "are not counted in the summary.</p>\n");
    /* Failed and errored cases first, in full; the others after them as one line each, folded (their
       checks' details are in report.json: the page stays small for a whole matrix). Every case keeps
       its index (the anchor case-<index>). */
    size_t n_rest = 0;
    for (size_t i = 0; i < dsv4_run_count(R); i++) {
        dsv4_result st = dsv4_case_status(dsv4_run_get(R, i));
        n_rest += st != DSV4_RESULT_FAIL && st != DSV4_RESULT_ERROR;
    }
    if (n_rest < dsv4_run_count(R)) {
        dsv4_sb_str(&b, "<table class=\"cases\"><tr><th>#</th><th>case</th><th>status</th><th>checks</th>"
                        "<th>time (s)</th><th>numerics</th><th>memory</th></tr>\n");
        for (size_t i = 0; i < dsv4_run_count(R); i++) {
            dsv4_result st = dsv4_case_status(dsv4_run_get(R, i));
            if (st == DSV4_RESULT_FAIL || st == DSV4_RESULT_ERROR)
                case_row_full(&b, dsv4_run_get(R, i), i);
        }
        dsv4_sb_str(&b, "</table>\n");
    }
    if (n_rest) {
        dsv4_sb_printf(&b, "<details class=\"rest\"><summary>%zu cases passed, self-compared or skipped (one line "
                           "each; every check's detail is in report.json)</summary>\n<table class=\"cases\"><tr>"
                           "<th>#</th><th>case</th><th>status</th><th>checks</th><th>time (s)</th><th>numerics</th>"
                           "<th>memory</th></tr>\n",
                       n_rest);
        for (size_t i = 0; i < dsv4_run_count(R); i++) {
            dsv4_result st = dsv4_case_status(dsv4_run_get(R, i));
            if (st != DSV4_RESULT_FAIL && st != DSV4_RESULT_ERROR)
                case_row_line(&b, dsv4_run_get(R, i), i);
        }
        dsv4_sb_str(&b, "</table></details>\n");
    }
    dsv4_sb_str(&b, "</body></html>\n");
    return dsv4_sb_stage(&b, path, o, err);
}
