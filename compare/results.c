/*
 * The verdict record (compare/results.h; dsv4moe_harness/run.h's case results and result sets): the
 * accessors, setting checks, the error profile of a comparison, and results built outside the
 * scenario runner (compare/run_ext.h: `dsv4moe check`, the export's token slices). The runner
 * (harness/) and check (compare/engines.c) both fill it; the report writers (harness/) read it.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/formats.h"
#include "core/grow.h"
#include "compare/results.h"
#include "compare/run_ext.h"

const char *dsv4_result_name(dsv4_result r)
{
    switch (r) {
    case DSV4_RESULT_PASS: return "pass";
    case DSV4_RESULT_FAIL: return "fail";
    case DSV4_RESULT_SKIP: return "skip";
    case DSV4_RESULT_ERROR: return "error";
    case DSV4_RESULT_SELF: return "self-compared";
    }
    return "?";
}

char *dsv4_h_strdup(const char *s) { return s ? strdup(s) : NULL; }

static char *xvasprintf(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

static int bit_index(unsigned bit)
{
    for (int i = 0; i < DSV4_CHECK_COUNT; i++)
        if (bit == 1u << i)
            return i;
    return -1;
}

void dsv4_h_set_check(dsv4_case_result *c, unsigned bit, dsv4_result r, const char *fmt, ...)
{
    int i = bit_index(bit);
    if (i < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    char *d = xvasprintf(fmt, ap);
    va_end(ap);
    free(c->checks[i].detail);
    c->checks[i].detail = d;
    c->checks[i].r = r;
    if (!d)
        c->lost_detail = true;
}

bool dsv4_h_check_set(const dsv4_case_result *c, unsigned bit) { return c->checks[bit_index(bit)].detail != NULL; }

void dsv4_h_set_rest(dsv4_case_result *c, dsv4_result r, const char *detail, bool unrun)
{
    for (int i = 0; i < DSV4_CHECK_COUNT; i++)
        if ((c->requested & (1u << i)) && !c->checks[i].detail) {
            dsv4_h_set_check(c, 1u << i, r, "%s", detail);
            c->checks[i].unrun = unrun && r == DSV4_RESULT_SKIP;
        }
}

void dsv4_h_case_free(dsv4_case_result *c)
{
    if (!c)
        return;
    free(c->name);
    free(c->title);
    free(c->scn_name);
    free(c->scn_path);
    free(c->axis_index);
    for (int i = 0; i < DSV4_CHECK_COUNT; i++)
        free(c->checks[i].detail);
    free(c->preset);
    free(c->tokens);
    free(c->replay);
    free(c->regex);
    free(c->params);
    free(c->backend);
    free(c->defect);
    free(c->caught_by);
    free(c);
}

void dsv4_run_results_free(dsv4_run_results *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        dsv4_h_case_free(r->cases[i]);
    free(r->cases);
    for (size_t i = 0; i < r->nscn; i++) {
        free(r->scns[i].name);
        free(r->scns[i].path);
        for (size_t a = 0; a < r->scns[i].n_axes; a++)
            free(r->scns[i].axis_names[a]);
        free(r->scns[i].axis_names);
    }
    free(r->scns);
    for (size_t i = 0; i < r->nfaults; i++) {
        dsv4_fault_entry *f = &r->faults[i];
        free(f->id), free(f->hook), free(f->findings), free(f->defect), free(f->where);
    }
    free(r->faults);
    free(r);
}

size_t dsv4_run_count(const dsv4_run_results *r) { return r ? r->n : 0; }
const dsv4_case_result *dsv4_run_get(const dsv4_run_results *r, size_t i)
{
    return r && i < r->n ? r->cases[i] : NULL;
}

dsv4_run_summary dsv4_h_summary(const dsv4_run_results *R, const dsv4_scenario *scn, size_t scn_index)
{
    dsv4_run_summary s;
    memset(&s, 0, sizeof s);
    for (size_t i = 0; R && i < R->n; i++) {
        const dsv4_case_result *c = R->cases[i];
        if (c->injected || !dsv4_h_case_in(c, scn) || (scn_index != SIZE_MAX && c->scn != scn_index))
            continue;
        s.cases++;
        s.seconds += c->seconds;
        switch (c->status) {
        case DSV4_RESULT_PASS: s.passed++; break;
        case DSV4_RESULT_FAIL: s.failed++; break;
        case DSV4_RESULT_SKIP: s.skipped++; break;
        case DSV4_RESULT_ERROR: s.errors++; break;
        case DSV4_RESULT_SELF: s.self_compared++; break;
        }
    }
    return s;
}

dsv4_run_summary dsv4_run_summarize(const dsv4_run_results *r) { return dsv4_h_summary(r, NULL, SIZE_MAX); }

const char *dsv4_case_name(const dsv4_case_result *c) { return c ? c->name : NULL; }
const char *dsv4_case_title(const dsv4_case_result *c) { return !c ? NULL : c->title ? c->title : c->name; }

void dsv4_run_ext_title(dsv4_case_result *c, const char *title)
{
    if (c && title && strcmp(title, c->name ? c->name : "")) {
        free(c->title);
        c->title = dsv4_h_strdup(title);
        c->lost_detail |= !c->title; /* a title lost to memory must not read as the case's name */
    }
}
dsv4_result dsv4_case_status(const dsv4_case_result *c) { return c ? c->status : DSV4_RESULT_ERROR; }
double dsv4_case_seconds(const dsv4_case_result *c) { return c ? c->seconds : 0; }
size_t dsv4_case_index(const dsv4_case_result *c) { return c ? c->index : 0; }

dsv4_result dsv4_case_check(const dsv4_case_result *c, unsigned bit, const char **detail)
{
    int i = bit_index(bit);
    if (!c || i < 0) {
        if (detail)
            *detail = "no such check";
        return DSV4_RESULT_ERROR;
    }
    if (!c->checks[i].detail) {
        if (detail)
            *detail = "not requested";
        return DSV4_RESULT_SKIP;
    }
    if (detail)
        *detail = c->checks[i].detail;
    return c->checks[i].r;
}

bool dsv4_case_metrics(const dsv4_case_result *c, dsv4_compare_metrics *out)
{
    if (!c || !c->has_metrics)
        return false;
    if (out)
        *out = c->m;
    return true;
}

bool dsv4_case_errors_of(const dsv4_case_result *c, dsv4_case_errors *out)
{
    if (!c || !c->has_errors)
        return false;
    if (out)
        *out = c->errs;
    return true;
}

dsv4_case_memory dsv4_case_memory_of(const dsv4_case_result *c)
{
    dsv4_case_memory m;
    memset(&m, 0, sizeof m);
    return c ? c->mem : m;
}

const char *dsv4_case_scenario(const dsv4_case_result *c) { return c ? c->scn_name : NULL; }
const char *dsv4_case_file(const dsv4_case_result *c) { return c ? c->scn_path : NULL; }

/* ---------------- the error profile of a comparison ---------------- */

static int32_t bf16_order(uint16_t v) { return (v & 0x8000) ? -(int32_t)(v & 0x7fff) : (int32_t)v; }
static bool bf16_finite(uint16_t v) { return (v & 0x7f80) != 0x7f80; }

/* Bins and the worst elements of a [sum tokens, H] bf16 comparison, ranks one after another. */
void dsv4_h_error_profile(dsv4_case_result *c, const uint16_t *a, const uint16_t *b, const int64_t *tokens, int world,
                          int64_t H)
{
    dsv4_case_errors *E = &c->errs;
    memset(E, 0, sizeof *E);
    int64_t i = 0;
    for (int r = 0; r < world; r++)
        for (int64_t t = 0; t < tokens[r]; t++)
            for (int64_t h = 0; h < H; h++, i++) {
                uint16_t x = a[i], y = b[i];
                double diff;
                int ub, ab;
                if (x == y || (bf16_finite(x) && bf16_finite(y) && bf16_order(x) == bf16_order(y))) {
                    diff = 0, ub = 0, ab = 0;
                } else if (!bf16_finite(x) || !bf16_finite(y)) {
                    diff = INFINITY, ub = DSV4_ERR_BINS - 1, ab = DSV4_ERR_BINS - 1;
                } else {
                    diff = fabs((double)dsv4_bf16_to_f32(x) - (double)dsv4_bf16_to_f32(y));
                    int32_t u = bf16_order(x) - bf16_order(y);
                    ub = 1 + (int)floor(log2((double)(u < 0 ? -u : u)));
                    ub = ub < DSV4_ERR_BINS - 1 ? ub : DSV4_ERR_BINS - 1;
                    ab = diff > 0 ? (int)floor(log10(diff)) + 10 : 1;
                    ab = ab < 1 ? 1 : ab > DSV4_ERR_BINS - 1 ? DSV4_ERR_BINS - 1 : ab;
                }
                E->ulp_bins[ub]++;
                E->abs_bins[ab]++;
                if (ub == 0 || (E->n_worst == DSV4_WORST_MAX && !(diff > E->worst[DSV4_WORST_MAX - 1].diff)))
                    continue;
                /* Insertion into the list kept largest first; an equal diff stays behind (lower index first). */
                int k = E->n_worst < DSV4_WORST_MAX ? E->n_worst++ : DSV4_WORST_MAX - 1;
                while (k > 0 && diff > E->worst[k - 1].diff) {
                    E->worst[k] = E->worst[k - 1];
                    k--;
                }
                E->worst[k] = (dsv4_case_worst){i, r, t, h, dsv4_bf16_to_f32(x), dsv4_bf16_to_f32(y), diff};
            }
    E->n = i;
    c->has_errors = true;
}


void dsv4_h_finish_status(dsv4_case_result *c)
{
    /* A case passes only if every check it asked for ran (or does not apply) and one could fail. */
    bool any_pass = false, any_fail = false, any_error = false, any_unrun = false, any_self = false;
    for (int i = 0; i < DSV4_CHECK_COUNT; i++) {
        if (!c->checks[i].detail)
            continue;
        any_pass |= c->checks[i].r == DSV4_RESULT_PASS;
        any_fail |= c->checks[i].r == DSV4_RESULT_FAIL;
        any_error |= c->checks[i].r == DSV4_RESULT_ERROR;
        any_self |= c->checks[i].r == DSV4_RESULT_SELF;
        any_unrun |= c->checks[i].r == DSV4_RESULT_SKIP && c->checks[i].unrun;
    }
    c->status = any_error || c->lost_detail ? DSV4_RESULT_ERROR
                : any_fail ? DSV4_RESULT_FAIL
                : any_unrun ? DSV4_RESULT_SKIP
                : any_self ? DSV4_RESULT_SELF
                : any_pass ? DSV4_RESULT_PASS
                           : DSV4_RESULT_SKIP;
}

bool dsv4_h_grow_cases(dsv4_run_results *R, size_t extra)
{
    if (R->n + extra <= R->cap)
        return true; /* also with no array yet and extra 0 */
    dsv4_case_result **nc = dsv4_grow(R->cases, &R->cap, R->n + extra, sizeof *nc, 64);
    if (!nc)
        return false;
    R->cases = nc;
    return true;
}

bool dsv4_h_case_in(const dsv4_case_result *c, const dsv4_scenario *scn)
{
    return !scn || (!strcmp(c->scn_name, dsv4_scenario_name(scn)) && !strcmp(c->scn_path, dsv4_scenario_path(scn)));
}

/* ---------------- results built outside the runner (run_ext.h, dsv4moe check) ---------------- */

size_t dsv4_run_ext_scenario(dsv4_run_results **RP, const char *name, const char *path)
{
    if (!RP)
        return SIZE_MAX;
    dsv4_run_results *R = *RP;
    bool created = !R;
    if (created && !(R = calloc(1, sizeof *R)))
        return SIZE_MAX;
    dsv4_scn_rec *ns = realloc(R->scns, (R->nscn + 1) * sizeof *ns);
    if (ns)
        R->scns = ns;
    dsv4_scn_rec rec = {dsv4_h_strdup(name), dsv4_h_strdup(path), 0, calloc(1, sizeof(char *))};
    if (!ns || !rec.name || !rec.path || !rec.axis_names) {
        free(rec.name), free(rec.path), free(rec.axis_names);
        if (created)
            dsv4_run_results_free(R);
        return SIZE_MAX;
    }
    R->scns[R->nscn] = rec;
    *RP = R;
    return R->nscn++;
}

dsv4_case_result *dsv4_run_ext_case(dsv4_run_results *R, size_t scn, size_t index, const char *name,
                                    const dsv4_config *cfg, int n_ranks, const int64_t *tokens, uint64_t seed,
                                    const char *ran_on)
{
    if (!R || scn >= R->nscn || n_ranks < 1 || !dsv4_h_grow_cases(R, 1))
        return NULL;
    dsv4_case_result *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->name = dsv4_h_strdup(name);
    c->scn_name = dsv4_h_strdup(R->scns[scn].name);
    c->scn_path = dsv4_h_strdup(R->scns[scn].path);
    c->scn = scn;
    c->index = index;
    c->explicit_index = -1;
    c->cfg = *cfg;
    c->topo.world_size = n_ranks;
    c->topo.tp = c->topo.dp = c->topo.ep = 1;
    c->n_ranks = n_ranks;
    c->tokens = malloc((size_t)n_ranks * sizeof *c->tokens);
    c->replay = calloc((size_t)n_ranks, sizeof *c->replay);
    c->seed = seed;
    c->twin = SIZE_MAX;
    c->backend = dsv4_h_strdup(ran_on);
    if (!c->name || !c->scn_name || !c->scn_path || !c->tokens || !c->replay || (ran_on && !c->backend)) {
        dsv4_h_case_free(c);
        return NULL;
    }
    memcpy(c->tokens, tokens, (size_t)n_ranks * sizeof *c->tokens);
    R->cases[R->n++] = c;
    return c;
}

void dsv4_run_ext_ran_on(dsv4_case_result *c, const char *ran_on)
{
    char *n = ran_on ? dsv4_h_strdup(ran_on) : NULL;
    if (!c || !n) {
        free(n);
        return;
    }
    free(c->backend);
    c->backend = n;
}

void dsv4_run_ext_check(dsv4_case_result *c, unsigned check_bit, dsv4_result r, const char *detail)
{
    if (!c || bit_index(check_bit) < 0 || dsv4_h_check_set(c, check_bit))
        return;
    c->requested |= check_bit;
    dsv4_h_set_check(c, check_bit, r, "%s", detail ? detail : "");
}

void dsv4_run_ext_numerics(dsv4_case_result *c, const dsv4_compare_metrics *m, const uint16_t *a, const uint16_t *b,
                           int64_t T, int64_t H)
{
    if (!c || !m)
        return;
    c->m = *m;
    c->has_metrics = true;
    if (a && b && T > 0)
        dsv4_h_error_profile(c, a, b, &T, 1, H);
}

void dsv4_run_ext_outside(dsv4_case_result *c, const char *rounding, int64_t beyond_terms)
{
    if (!c)
        return;
    c->rounding = rounding;
    c->beyond_terms = beyond_terms;
}

void dsv4_run_ext_finish(dsv4_case_result *c, double seconds)
{
    if (!c)
        return;
    c->seconds = seconds;
    dsv4_h_finish_status(c);
}



const char *dsv4_h_human_bytes(uint64_t v, char *buf, size_t n)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)v;
    int u = 0;
    while (x >= 1024 && u < 4) {
        x /= 1024;
        u++;
    }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", x, unit[u]);
    return buf;
}

void dsv4_run_ext_slices(const dsv4_topology *t, const int64_t *tokens, int n, int64_t *off)
{
    int tp = t->tp >= 1 ? t->tp : 1;
    int64_t o = 0;
    for (int r = 0; r < n; r++) {
        if (r % tp == 0) {
            off[r] = o;
            o += tokens[r];
        } else {
            off[r] = off[r - r % tp]; /* the tp ranks of a block share their block's slice */
        }
    }
}
