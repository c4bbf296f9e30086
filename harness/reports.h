/* Internal: the report writers' staging (harness/reports.c writes the three together). Not installed. */
#ifndef DSV4MOE_HARNESS_REPORTS_H
#define DSV4MOE_HARNESS_REPORTS_H

#include "dsv4moe_harness/run.h"
#include "core/strbuf.h" /* core/strbuf.h */

/* The three reports, staged into *o for dsv4_report_write_all (harness/reports.c). */
dsv4_status dsv4_report_json_stage(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path,
                                   dsv4_outfile *o, dsv4_error *err);
dsv4_status dsv4_report_junit_stage(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path,
                                    dsv4_outfile *o, dsv4_error *err);
dsv4_status dsv4_report_html_stage(const dsv4_run_results *R, const char *path, dsv4_outfile *o, dsv4_error *err);

#endif
