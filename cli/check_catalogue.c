/*
 * dsv4moe check --catalogue: an engine that can carry each class of the catalogue
 * (dsv4moe_harness/engines.h) run clean and with each, in each rounding profile, through check; the
 * table of what was caught and named (docs/engines.md, "The detection table").
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "core/fileio.h"
#include "cli/cli.h"
#include "dsv4moe_harness/engines.h"

/* The marker of a catalogue folder this command made, the only kind it clears. */
#define MARKER ".dsv4moe-catalogue"

static int unlink_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* dir emptied of a previous run's outputs (made when absent); -1 with why set otherwise. */
static int fresh_dir(const char *dir, char *why, size_t n)
{
    struct stat sb;
    dsv4_error e;
    if (lstat(dir, &sb) == 0 && nftw(dir, unlink_one, 16, FTW_DEPTH | FTW_PHYS) != 0) {
        snprintf(why, n, "cannot clear %.200s: %s", dir, strerror(errno));
        return -1;
    }
    if (dsv4_mkdir_p(dir, &e)) {
        snprintf(why, n, "%.250s", e.message);
        return -1;
    }
    return 0;
}

/* s with '...' quoting for sh appended to buf. */
static int put_quoted(char *buf, size_t size, size_t *len, const char *s)
{
    if (*len + 1 >= size)
        return -1;
    buf[(*len)++] = '\'';
    for (; *s; s++) {
        const char *piece = *s == '\'' ? "'\\''" : NULL;
        size_t n = piece ? 4 : 1;
        if (*len + n + 2 >= size)
            return -1;
        memcpy(buf + *len, piece ? piece : s, n);
        *len += n;
    }
    buf[(*len)++] = '\'';
    buf[*len] = '\0';
    return 0;
}

/* The engine command with {cases} {outputs} {class} {rounding} replaced (values quoted), its
   output to log. */
static int build_command(const char *tmpl, const char *cases, const char *outputs, const char *cls,
                         const char *rounding, const char *log, char *buf, size_t size)
{
    static const char *const keys[] = {"{cases}", "{outputs}", "{class}", "{rounding}"};
    const char *vals[] = {cases, outputs, cls, rounding};
    size_t len = 0;
    buf[0] = '\0';
    for (const char *p = tmpl; *p;) {
        int k = -1;
        for (int i = 0; i < 4 && k < 0; i++)
            if (!strncmp(p, keys[i], strlen(keys[i])))
                k = i;
        if (k >= 0) {
            if (put_quoted(buf, size, &len, vals[k]))
                return -1;
            p += strlen(keys[k]);
        } else {
            if (len + 2 >= size)
                return -1;
            buf[len++] = *p++;
            buf[len] = '\0';
        }
    }
    int n = snprintf(buf + len, size - len, " > ");
    if (n < 0 || (size_t)n >= size - len)
        return -1;
    len += (size_t)n;
    if (put_quoted(buf, size, &len, log) || len + 8 >= size)
        return -1;
    strcat(buf, " 2>&1");
    return 0;
}

typedef struct {
    int ran;             /* 0: the engine failed (exit != 0), -1: check could not run */
    size_t cases, failed, errors, named;
    char first[160];     /* the first failing case */
    char error[300];     /* the first case in error, its detail */
    char why[300];       /* what went wrong when ran <= 0 */
} cell;

/* One engine run and its check. */
static void run_cell(const char *dir, const char *engine, const char *root, const char *cls, dsv4_rounding r,
                     const dsv4_check_options *co, cell *out)
{
    memset(out, 0, sizeof *out);
    char odir[4200], log[4300], cmd[16384], likely[128];
    if ((size_t)snprintf(odir, sizeof odir, "%s/%s.%s", root, cls, dsv4_rounding_name(r)) >= sizeof odir ||
        (size_t)snprintf(log, sizeof log, "%s/%s.%s.log", root, cls, dsv4_rounding_name(r)) >= sizeof log) {
        out->ran = -1;
        snprintf(out->why, sizeof out->why, "the report path is too long");
        return;
    }
    if (fresh_dir(odir, out->why, sizeof out->why) != 0) {
        out->ran = -1;
        return;
    }
    if (build_command(engine, dir, odir, cls, dsv4_rounding_name(r), log, cmd, sizeof cmd) != 0) {
        out->ran = -1;
        snprintf(out->why, sizeof out->why, "the engine command is too long");
        return;
    }
    fflush(NULL);
    int st = system(cmd);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(out->why, sizeof out->why, "the engine exited %d (its output: %.200s)",
                 st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1, log);
        return;
    }
    dsv4_run_results *res = NULL;
    dsv4_error err;
    dsv4_error_clear(&err);
    if (dsv4_check_engine(dir, odir, co, &res, &err)) {
        out->ran = -1;
        snprintf(out->why, sizeof out->why, "%.280s", err.message);
        return;
    }
    out->ran = 1;
    snprintf(likely, sizeof likely, "likely %s: ", cls);
    out->cases = dsv4_run_count(res);
    for (size_t i = 0; i < out->cases; i++) {
        const dsv4_case_result *c = dsv4_run_get(res, i);
        const char *detail = "", *mem = "";
        dsv4_case_check(c, DSV4_CHECK_NUMERICS, &detail);
        dsv4_case_check(c, DSV4_CHECK_MEMORY, &mem);
        dsv4_result s = dsv4_case_status(c);
        if (s == DSV4_RESULT_ERROR && !out->errors++)
            snprintf(out->error, sizeof out->error, "%.100s: %.190s", dsv4_case_name(c), detail ? detail : "");
        if (s != DSV4_RESULT_FAIL)
            continue;
        if (!out->failed++)
            snprintf(out->first, sizeof out->first, "%s", dsv4_case_name(c));
        out->named += strstr(detail, likely) != NULL || strstr(mem, likely) != NULL;
    }
    dsv4_run_results_free(res);
}

int cli_check_catalogue(const char *dir, const char *engine, const char *report, const dsv4_check_options *opt,
                        unsigned profiles)
{
    const char *cmd = "check";
    char root[4200], marker[4300], mdpath[4300];
    snprintf(root, sizeof root, "%s/catalogue", report);
    snprintf(marker, sizeof marker, "%s/" MARKER, root);
    snprintf(mdpath, sizeof mdpath, "%s/catalogue.md", report);
    struct stat sb;
    if (lstat(root, &sb) == 0 && lstat(marker, &sb) != 0)
        return cli_failf(cmd, "--catalogue: %s exists and was not made by check --catalogue (no %s): name another "
                              "--report", root, MARKER);
    FILE *mf = NULL;
    dsv4_error me;
    if (dsv4_mkdir_p(root, &me))
        return cli_failf(cmd, "--catalogue: %s", me.message);
    if (!(mf = fopen(marker, "w")) || fclose(mf) != 0)
        return cli_failf(cmd, "--catalogue: cannot create %s: %s", marker, strerror(errno));
    dsv4_check_options co = *opt;
    FILE *md = fopen(mdpath, "w");
    if (!md)
        return cli_failf(cmd, "--catalogue: cannot write %s: %s", mdpath, strerror(errno));
    int rc = EXIT_OK;
    char line[2048];
    size_t len = (size_t)snprintf(line, sizeof line, "| class | reported |");
    for (int r = 0; r < DSV4_ROUNDING_COUNT; r++)
        if (profiles & (1u << r))
            len += (size_t)snprintf(line + len, sizeof line - len, " %s |", dsv4_rounding_name((dsv4_rounding)r));
    printf("%s\n", line);
    fprintf(md, "%s\n", line);
    len = (size_t)snprintf(line, sizeof line, "|---|---|");
    for (int r = 0; r < DSV4_ROUNDING_COUNT; r++)
        if (profiles & (1u << r))
            len += (size_t)snprintf(line + len, sizeof line - len, "---|");
    printf("%s\n", line);
    fprintf(md, "%s\n", line);
    size_t n = dsv4_check_class_count();
    for (size_t i = 0; i <= n; i++) { /* row 0: the engine clean ("none") */
        const dsv4_check_class *k = i ? dsv4_check_class_at(i - 1) : NULL;
        if (k && !k->computed)
            continue;
        const char *cls = k ? k->name : "none";
        len = (size_t)snprintf(line, sizeof line, "| %s | %s |", k ? cls : "none (the engine as it is)",
                               k ? k->source : "");
        for (int r = 0; r < DSV4_ROUNDING_COUNT; r++) {
            if (!(profiles & (1u << r)))
                continue;
            cell c;
            co.rounding = (dsv4_rounding)r;
            co.no_diagnose = !k;
            run_cell(dir, engine, root, cls, (dsv4_rounding)r, &co, &c);
            char txt[512];
            if (c.ran <= 0) {
                snprintf(txt, sizeof txt, "not run: %s", c.why);
                rc = EXIT_BAD_INPUT;
            } else if (c.errors) {
                snprintf(txt, sizeof txt, "not judged: %zu of %zu cases in error (%s)", c.errors, c.cases, c.error);
                rc = EXIT_BAD_INPUT;
            } else if (!k) {
                snprintf(txt, sizeof txt, "%zu of %zu pass", c.cases - c.failed - c.errors, c.cases);
                if (c.failed)
                    rc = rc == EXIT_OK ? EXIT_CHECK_FAILED : rc;
            } else {
                snprintf(txt, sizeof txt, "caught %zu of %zu, named %zu; first %s", c.failed, c.cases, c.named,
                         c.failed ? c.first : "none");
                if (!c.failed || c.named != c.failed)
                    rc = rc == EXIT_OK ? EXIT_CHECK_FAILED : rc;
            }
            len += (size_t)snprintf(line + len, sizeof line - len, " %s |", txt);
            if (len >= sizeof line)
                len = sizeof line - 1;
        }
        printf("%s\n", line);
        fprintf(md, "%s\n", line);
        fflush(stdout);
    }
    if (fclose(md) != 0)
        return cli_failf(cmd, "--catalogue: cannot write %s: %s", mdpath, strerror(errno));
    printf("dsv4moe check --catalogue: %s (table: %s; each run's outputs and log under %s)\n",
           rc == EXIT_OK ? "every class caught and named in every profile, the clean engine passing every case"
           : rc == EXIT_CHECK_FAILED ? "NOT every class caught and named, or the clean engine failed a case"
                                     : "some run could not be made",
           mdpath, root);
    return rc;
}
