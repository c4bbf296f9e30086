#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/err.h"
#include "dsv4moe/ref.h"

const char CLI_CONFIG_HELP[] =
    "  --preset NAME        start from a preset (default v4-flash; see `dsv4moe help presets`)\n"
    "  --config FILE        apply a config file of `key = value` lines\n"
    "  --layer N            the layer id (required)\n"
    "  --set KEY=VALUE      set one SPEC.md section 8 key; repeatable, applied last\n";

int cli_fail(const char *cmd, const dsv4_error *err)
{
    const char *msg = err->message[0] ? err->message : "error";
    /* The library names the place first ("plan: ..."); when it is the command itself, say it once. */
    size_t n = strlen(cmd);
    if (!strncmp(msg, cmd, n) && msg[n] == ':' && msg[n + 1] == ' ')
        msg += n + 2;
    fprintf(stderr, "dsv4moe %s: %s (%s)\n", cmd, msg, dsv4_status_str(err->status));
    return EXIT_BAD_INPUT;
}

int cli_failf(const char *cmd, const char *fmt, ...)
{
    /* Formatted first, then escaped: an argument quoted here (a file or case name) may hold
       control characters, which must not reach the terminal raw. */
    char msg[2048], esc[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dsv4moe %s: %s\n", cmd, cli_esc(msg, esc, sizeof esc));
    return EXIT_BAD_INPUT;
}

static bool one_of(const char *arg, const char *const *options)
{
    for (const char *const *o = options; o && *o; o++)
        if (!strcmp(arg, *o))
            return true;
    return false;
}

int cli_known(const char *cmd, const char *arg, const char *const *options)
{
    if (one_of(arg, options))
        return 0;
    if (arg[0] != '-')
        cli_failf(cmd, "unexpected argument '%s' (see dsv4moe %s --help)", arg, cmd);
    else
        cli_failf(cmd, "unknown option '%s' (see dsv4moe %s --help)", arg, cmd);
    return -1;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        cli_failf(cmd, "option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno == ERANGE || v < lo || v > hi) {
        cli_failf(cmd, "option %s: '%s' is not an integer in [%lld, %lld]", opt, s, (long long)lo, (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_layout(const char *cmd, const char *s, dsv4_layout *out)
{
    if (!strcmp(s, "split"))
        *out = DSV4_LAYOUT_SPLIT;
    else if (!strcmp(s, "stacked"))
        *out = DSV4_LAYOUT_STACKED;
    else {
        cli_failf(cmd, "option --layout: '%s' is not split or stacked", s);
        return -1;
    }
    return 0;
}

int cli_parse_roundings(const char *cmd, const char *s, unsigned *mask)
{
    unsigned m = 0;
    for (const char *p = s;;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char name[32];
        dsv4_rounding r;
        if (n == 0 || n >= sizeof name) {
            cli_failf(cmd, "option --rounding: '%s' is not a comma-separated list of spec, bf16_ops, fp32", s);
            return -1;
        }
        memcpy(name, p, n);
        name[n] = '\0';
        if (dsv4_rounding_parse(name, &r, NULL)) {
            cli_failf(cmd, "option --rounding: '%s' is not a rounding profile (spec, bf16_ops, fp32)", name);
            return -1;
        }
        m |= 1u << r;
        if (!e)
            break;
        p = e + 1;
    }
    *mask = m;
    return 0;
}

void cli_free_scenarios(dsv4_scenario **scns, int n)
{
    for (int f = 0; scns && f < n; f++)
        dsv4_scenario_free(scns[f]);
    free(scns);
}

int cli_load_scenarios(const cli_args *args, dsv4_scenario ***out)
{
    const char *cmd = args->cmd;
    const int n = args->nops;
    *out = NULL;
    dsv4_scenario **scns = calloc((size_t)n + 1, sizeof *scns);
    if (!scns)
        return cli_failf(cmd, "out of memory");
    dsv4_error err;
    dsv4_error_clear(&err);
    for (int f = 0; f < n; f++)
        if (dsv4_scenario_load(args->argv[1 + f], &scns[f], &err) != DSV4_OK) {
            fprintf(stderr, "dsv4moe %s: %s\n", cmd, err.message);
            cli_free_scenarios(scns, n);
            return EXIT_BAD_INPUT;
        }
    *out = scns;
    return EXIT_OK;
}

int cli_config_arg(const char *cmd, int argc, char **argv, int *i, cli_config_opts *o)
{
    const char *a = argv[*i];
    const char **slot = !strcmp(a, "--preset") ? &o->preset
                        : !strcmp(a, "--config") ? &o->config_file
                        : !strcmp(a, "--layer")  ? &o->layer
                                                 : NULL;
    if (slot) {
        if (!(*slot = cli_value(cmd, argc, argv, i)))
            return -1;
        return 1;
    }
    if (!strcmp(a, "--set")) {
        const char *v = cli_value(cmd, argc, argv, i);
        if (!v)
            return -1;
        if (o->nsets == (int)(sizeof o->sets / sizeof o->sets[0])) {
            cli_failf(cmd, "too many --set options (at most %zu)", sizeof o->sets / sizeof o->sets[0]);
            return -1;
        }
        o->sets[o->nsets++] = v;
        return 1;
    }
    return 0;
}

bool cli_next_arg(cli_args *it, const char **opt, const char **val)
{
    it->status = -1;
    while (++it->i < it->argc) {
        const char *a = it->argv[it->i];
        int r = it->co ? cli_config_arg(it->cmd, it->argc, it->argv, &it->i, it->co) : 0;
        if (r < 0) {
            it->status = EXIT_BAD_INPUT;
            return false;
        }
        if (r)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (it->co)
                printf(it->help, CLI_CONFIG_HELP);
            else
                fputs(it->help, stdout);
            it->status = EXIT_OK;
            return false;
        }
        if (it->positional && (a[0] != '-' || !strcmp(a, "-"))) {
            it->argv[++it->nops] = it->argv[it->i]; /* nops <= i: a slot already read */
            continue;
        }
        *opt = a;
        *val = NULL;
        if (one_of(a, it->flags))
            return true;
        if (cli_known(it->cmd, a, it->value_opts) || !(*val = cli_value(it->cmd, it->argc, it->argv, &it->i))) {
            it->status = EXIT_BAD_INPUT;
            return false;
        }
        return true;
    }
    return false;
}

int cli_config_build(const char *cmd, const cli_config_opts *o, dsv4_config *cfg)
{
    dsv4_error err;
    dsv4_error_clear(&err);
    if (dsv4_config_preset(o->preset ? o->preset : "v4-flash", cfg, &err))
        return cli_fail(cmd, &err);
    if (o->config_file && dsv4_config_load_file(cfg, o->config_file, &err))
        return cli_fail(cmd, &err);
    if (o->layer && dsv4_config_set(cfg, "layer", o->layer, &err))
        return cli_fail(cmd, &err);
    for (int k = 0; k < o->nsets; k++) {
        if (dsv4_config_set_kv(cfg, o->sets[k], &err)) {
            fprintf(stderr, "dsv4moe %s: --set %s: %s\n", cmd, o->sets[k], err.message);
            return EXIT_BAD_INPUT;
        }
    }
    if (cfg->layer < 0 && !o->layer)
        return cli_failf(cmd, "the layer id is required: pass --layer N");
    if (dsv4_config_validate(cfg, &err))
        return cli_fail(cmd, &err);
    return EXIT_OK;
}

void cli_dim_hint(const cli_config_opts *o, const dsv4_config *cfg, int64_t want_dim, char *buf, size_t n)
{
    const char *preset = o->preset ? o->preset : "v4-flash";
    bool own = o->config_file || o->nsets;
    int len = snprintf(buf, n, "dim %lld comes from %s%s%s", (long long)cfg->dim,
                       own ? "the config (--config, --set)" : "the preset ", own ? "" : preset,
                       own || o->preset ? "" : ", the default");
    const char *match = NULL;
    for (const char *const *p = dsv4_config_preset_names(); *p && !match; p++) {
        dsv4_config c;
        if (dsv4_config_preset(*p, &c, NULL) == DSV4_OK && c.dim == want_dim)
            match = *p;
    }
    if (len < 0 || (size_t)len >= n)
        return;
    if (match)
        snprintf(buf + len, n - (size_t)len, "; the preset %s has dim %lld: give --preset %s (or --set dim=%lld)",
                 match, (long long)want_dim, match, (long long)want_dim);
    else
        snprintf(buf + len, n - (size_t)len, "; give --preset P (dsv4moe help presets) or --set dim=%lld",
                 (long long)want_dim);
}

void cli_print_skipped(const char *cmd, const dsv4_checkpoint *ck)
{
    for (size_t i = 0; i < dsv4_checkpoint_skipped_count(ck); i++) {
        const char *why = NULL, *path = dsv4_checkpoint_skipped(ck, i, &why);
        char e[8192];
        fprintf(stderr, "dsv4moe %s: skipped %s: %s\n", cmd, cli_esc(path, e, sizeof e), why);
    }
}

const char *cli_esc(const char *s, char *buf, size_t n) { return dsv4_escape_controls(s, buf, n); }

const char *cli_tensor_desc(const dsv4_tensor_info *t, char *buf, size_t n)
{
    if (!t) {
        snprintf(buf, n, "missing");
        return buf;
    }
    size_t off = (size_t)snprintf(buf, n, "%s [", dsv4_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (off < n)
        snprintf(buf + off, n - off, "]");
    return buf;
}

void cli_progress_start(cli_progress *p, const char *what, bool quiet)
{
    p->on = !quiet && isatty(2);
    p->what = what;
    p->t0 = p->last = cli_now();
}

/* Whether to draw now (on, something to count, five times a second, always the last) and, if so,
   "N s left" from the share done so far (nothing until 2 % is done: too early to say). */
static bool progress_due(cli_progress *p, uint64_t done, uint64_t total, char *left, size_t n)
{
    double now = cli_now();
    if (!p->on || !total || (now - p->last < 0.2 && done < total))
        return false;
    p->last = now;
    double share = (double)done / (double)total;
    if (share < 0.02)
        snprintf(left, n, "estimating");
    else
        snprintf(left, n, "%.0f s left", (now - p->t0) / share * (1 - share));
    return true;
}

void cli_progress_bytes(void *user, uint64_t done, uint64_t total)
{
    cli_progress *p = user;
    char left[48];
    if (!progress_due(p, done, total, left, sizeof left))
        return;
    fprintf(stderr, "\r\033[K%s: %.0f %% of %.1f %s, %s", p->what, 100.0 * (double)done / (double)total,
            total >= 1e9 ? total / 1e9 : total / 1e6, total >= 1e9 ? "GB" : "MB", left);
    fflush(stderr);
}

void cli_progress_count(cli_progress *p, size_t done, size_t total, const char *item)
{
    char left[48];
    if (!progress_due(p, done, total, left, sizeof left))
        return;
    fprintf(stderr, "\r\033[K%s: %zu of %zu, %s%s%.60s", p->what, done, total, left, item ? "  " : "", item ? item : "");
    fflush(stderr);
}

void cli_progress_end(cli_progress *p)
{
    if (p->on)
        fputs("\r\033[K", stderr);
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
