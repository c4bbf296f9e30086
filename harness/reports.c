/* dsv4_report_write_all (dsv4moe_harness/run.h): the three reports of a result set, committed together. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/fileio.h"
#include "harness/reports.h"

/* Joins dir and name into a new string; NULL when out of memory. */
static char *dir_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

dsv4_status dsv4_report_write_all(const dsv4_run_results *R, const char *dir, dsv4_error *err)
{
    if (!R || !dir || !dir[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "report", "results and folder must not be NULL or empty");
    static const char *const names[3] = {"report.json", "junit.xml", "report.html"};
    char *paths[4] = {NULL, NULL, NULL, NULL};
    dsv4_outfile o[3];
    size_t staged = 0;
    dsv4_status st = DSV4_OK;
    for (int i = 0; i < 3 && !st; i++)
        if (!(paths[i] = dir_join(dir, names[i])))
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
    if (!st && !(paths[3] = dir_join(dir, DSV4_REPORT_LOCK)))
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
    if (!st && !(st = dsv4_report_json_stage(R, NULL, paths[0], &o[0], err)))
        staged++;
    if (!st && !(st = dsv4_report_junit_stage(R, NULL, paths[1], &o[1], err)))
        staged++;
    if (!st && !(st = dsv4_report_html_stage(R, paths[2], &o[2], err)))
        staged++;
    if (!st)
        st = dsv4_out_commit_all(o, 3, paths[3], err);
    else
        for (size_t i = 0; i < staged; i++)
            dsv4_out_abort(&o[i]);
    for (int i = 0; i < 4; i++)
        free(paths[i]);
    return st;
}

