/* junit.xml (dsv4moe_harness/run.h): one testsuite per scenario, one testcase per case (injected runs left out). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "compare/results.h"
#include "harness/reports.h"

/* XML text or attribute value: the five entities escaped, characters XML 1.0 forbids dropped
   (control characters other than tab, newline, carriage return; bytes of invalid UTF-8 become '?'). */
static void sb_xml(dsv4_strbuf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p) {
        unsigned char ch = *p;
        const char *ent = NULL;
        switch (ch) {
        case '&': ent = "&amp;"; break;
        case '<': ent = "&lt;"; break;
        case '>': ent = "&gt;"; break;
        case '"': ent = "&quot;"; break;
        case '\'': ent = "&apos;"; break;
        case '\t': ent = "&#9;"; break;
        case '\n': ent = "&#10;"; break;
        case '\r': ent = "&#13;"; break;
        default: break;
        }
        if (ent) {
            dsv4_sb_put(b, ent, strlen(ent));
            p++;
            continue;
        }
        if (ch < 0x20 || ch == 0x7f) {
            p++;
            continue;
        }
        if (ch < 0x80) {
            dsv4_sb_put(b, (const char *)p, 1);
            p++;
            continue;
        }
        dsv4_sb_utf8(b, &p, p + strlen((const char *)p)); /* a well-formed sequence, else '?' */
    }
}

static void junit_case(dsv4_strbuf *b, const dsv4_case_result *c)
{
    dsv4_sb_printf(b, "    <testcase classname=\"");
    sb_xml(b, c->scn_name);
    dsv4_sb_printf(b, "\" name=\"");
    sb_xml(b, dsv4_case_title(c)); /* what the case sets (dsv4_case_title) */
    dsv4_sb_printf(b, "\" file=\"");
    sb_xml(b, c->scn_path);
    dsv4_sb_printf(b, "\" line=\"%d\" time=\"%.3f\">\n", c->line, c->seconds);
    if (c->title) { /* the case's id (its name: --filter, export folders) beside the title */
        dsv4_sb_str(b, "      <properties><property name=\"case\" value=\"");
        sb_xml(b, c->name);
        dsv4_sb_str(b, "\"/></properties>\n");
    }
    if (c->status == DSV4_RESULT_FAIL || c->status == DSV4_RESULT_ERROR) {
        dsv4_result want = c->status;
        const char *elem = want == DSV4_RESULT_FAIL ? "failure" : "error";
        /* The message names the failing checks; the text holds each one's detail. */
        dsv4_strbuf names = {0};
        for (int i = 0; i < DSV4_CHECK_COUNT; i++)
            if (c->checks[i].detail && c->checks[i].r == want)
                dsv4_sb_printf(&names, "%s%s", names.n ? ", " : "", dsv4_check_name(1u << i));
        dsv4_sb_printf(b, "      <%s type=\"check\" message=\"", elem);
        sb_xml(b, names.s ? names.s : "");
        dsv4_sb_printf(b, "\">");
        free(names.s);
        for (int i = 0; i < DSV4_CHECK_COUNT; i++)
            if (c->checks[i].detail && c->checks[i].r == want) {
                sb_xml(b, dsv4_check_name(1u << i));
                dsv4_sb_put(b, ": ", 2);
                sb_xml(b, c->checks[i].detail);
                dsv4_sb_put(b, "&#10;", 5);
            }
        dsv4_sb_printf(b, "</%s>\n", elem);
    } else if (c->status == DSV4_RESULT_SKIP || c->status == DSV4_RESULT_SELF) {
        /* a self-compared case is no pass for a CI's JUnit reader: skipped, with the reason */
        const char *why = NULL, *first = NULL;
        for (int i = 0; i < DSV4_CHECK_COUNT; i++) {
            const dsv4_check_rec *k = &c->checks[i];
            if (!k->detail)
                continue;
            first = first ? first : k->detail;
            if (!why && k->r == c->status && (c->status == DSV4_RESULT_SELF || k->unrun))
                why = k->detail;
        }
        why = why ? why : first ? first : "every check skipped";
        dsv4_sb_printf(b, "      <skipped message=\"");
        sb_xml(b, why);
        dsv4_sb_printf(b, "\"/>\n");
    }
    dsv4_sb_printf(b, "      <system-out>");
    for (int i = 0; i < DSV4_CHECK_COUNT; i++)
        if (c->checks[i].detail) {
            sb_xml(b, dsv4_check_name(1u << i));
            dsv4_sb_put(b, " ", 1);
            sb_xml(b, dsv4_result_name(c->checks[i].r));
            dsv4_sb_put(b, ": ", 2);
            sb_xml(b, c->checks[i].detail);
            dsv4_sb_put(b, "&#10;", 5);
        }
    dsv4_sb_printf(b, "</system-out>\n    </testcase>\n");
}

dsv4_status dsv4_report_junit(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path, dsv4_error *err)
{
    dsv4_outfile o;
    dsv4_status st = dsv4_report_junit_stage(R, scn, path, &o, err);
    return st ? st : dsv4_out_commit(&o, err);
}

dsv4_status dsv4_report_junit_stage(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path,
                                    dsv4_outfile *o, dsv4_error *err)
{
    if (!R || !path)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "report", "results and path must not be NULL");
    dsv4_strbuf b = {0};
    dsv4_run_summary all = dsv4_h_summary(R, scn, SIZE_MAX);
    dsv4_sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    dsv4_sb_printf(&b, "<testsuites name=\"dsv4moe\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\" "
                  "time=\"%.3f\">\n",
              all.cases, all.failed, all.errors, all.skipped + all.self_compared, all.seconds);
    for (size_t k = 0; k < R->nscn; k++) {
        const dsv4_scn_rec *sr = &R->scns[k];
        if (scn && (strcmp(sr->name, dsv4_scenario_name(scn)) || strcmp(sr->path, dsv4_scenario_path(scn))))
            continue;
        dsv4_run_summary s = dsv4_h_summary(R, NULL, k);
        dsv4_sb_printf(&b, "  <testsuite name=\"");
        sb_xml(&b, sr->name);
        dsv4_sb_printf(&b, "\" file=\"");
        sb_xml(&b, sr->path);
        dsv4_sb_printf(&b, "\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\" time=\"%.3f\">\n", s.cases,
                  s.failed, s.errors, s.skipped + s.self_compared, s.seconds);
        for (size_t i = 0; i < R->n; i++)
            if (R->cases[i]->scn == k && !R->cases[i]->injected)
                junit_case(&b, R->cases[i]);
        dsv4_sb_printf(&b, "  </testsuite>\n");
    }
    dsv4_sb_printf(&b, "</testsuites>\n");
    return dsv4_sb_stage(&b, path, o, err);
}

