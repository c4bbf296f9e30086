#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dsv4moe_harness/compare.h"
#include "dsv4moe/safetensors.h"

static const char DIFF_HELP[] =
    "usage: dsv4moe diff A.safetensors B.safetensors [--tensor NAME ...] [--rule RULE]\n"
    "                    [--terms FILE] [--sentinel E|-1|absent] [--experts E]\n\n"
    "Holds dump A (a candidate: a backend, an engine) against dump B (the reference, e.g. from\n"
    "`dsv4moe ref`), tensor by tensor, on the tensors they have in common (or the named ones):\n"
    "  - float tensors (F32, F64, F16, BF16, F8_E4M3, F8_E5M2) by the SPEC.md section 7 metrics\n"
    "    (max |a-b|, max relative error, nMSE, DeepGEMM's diff, ULP percentiles in the dtype's own\n"
    "    ULPs, elements beyond atol = rtol = 0.035), judged by one tolerance rule (--rule);\n"
    "  - topk_ids with topk_weights routing-aware: the kept experts of each token compared as a set\n"
    "    (slot order free), A's pruned top-p slots in its sentinel convention (--sentinel), weights\n"
    "    matched by expert id within |a-b| <= 1e-6 + 1e-5 |b| (fp32 terms);\n"
    "  - any other tensor bytewise.\n"
    "The rules are those of `run` and `check` (docs/scenarios.md, \"Tolerance rules\").\n\n"
    "  --tensor NAME     compare this tensor (repeatable; default: every common tensor)\n"
    "  --rule RULE       exact-quant (default: the project's own backends on fp8/fp4 layers, SPEC.md\n"
    "                    section 9), exact-bf16 (the own backends on bf16 layers: what `run` applies\n"
    "                    there), fp8-mma (FP8 tensor-core accumulation), outside or outside-fp8-mma\n"
    "                    (an outside engine, section 10: y's elements beyond atol + rtol |b| + 2^-8 S,\n"
    "                    S the reference's y_terms; hold A to a B computed at A's rounding profile,\n"
    "                    `dsv4moe ref --rounding P`)\n"
    "  --terms FILE      the y_terms (F32, y's shape) of the outside rules (default: B's own y_terms,\n"
    "                    which `dsv4moe ref` writes); y_terms itself is then not compared\n"
    "  --sentinel S      how A marks a pruned slot: E (default, the reference's), -1, absent\n"
    "  --experts E       n_routed_experts (default: B's metadata n_routed_experts, written by `ref`)\n\n"
    "exit status: 0 every tensor within tolerance, 1 some tensor outside it (a NaN or Inf in A where\n"
    "B is finite, a non-finite B value that A does not repeat as the same infinity, and any NaN pair\n"
    "always fail), 2 bad input (a missing file or tensor, shapes or dtypes that differ: both printed)\n";

typedef struct {
    dsv4_tolerance rule;
    dsv4_sentinel sentinel;
    long long experts;  /* -1: from B's metadata */
    const float *terms; /* outside rules: y's S, aligned; NULL otherwise */
} diff_opts;

static bool outside_rule(dsv4_tolerance t) { return t == DSV4_TOL_OUTSIDE || t == DSV4_TOL_OUTSIDE_FP8; }

/* y of a BF16 tensor as an aligned copy (the mapping may be unaligned); NULL on no memory. */
static uint16_t *bf16_copy(const dsv4_tensor_info *t)
{
    uint16_t *c = malloc((size_t)t->numel * sizeof *c + 2);
    if (c)
        memcpy(c, t->data, (size_t)t->numel * sizeof *c);
    return c;
}

static void shape_line(const dsv4_tensor_info *t, char *buf, size_t n)
{
    char s[96];
    dsv4_tensor_shape_str(t, s, sizeof s);
    snprintf(buf, n, "%s %s in %s", dsv4_dtype_name(t->dtype), s, t->file);
}

/* Compares one tensor pair; returns 0 within tolerance, 1 outside, 2 not comparable. */
static int diff_tensor(const dsv4_tensor_info *a, const dsv4_tensor_info *b, const diff_opts *o)
{
    bool same = a->dtype == b->dtype && a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    if (!same) {
        char la[256], lb[256];
        shape_line(a, la, sizeof la);
        shape_line(b, lb, sizeof lb);
        fprintf(stderr, "dsv4moe diff: tensor '%s': %s, %s\n", a->name, la, lb);
        return 2;
    }
    if (!dsv4_compare_dtype_ok(a->dtype)) {
        size_t es = dsv4_dtype_size(a->dtype);
        uint64_t differ = 0;
        for (uint64_t i = 0; i < a->numel; i++)
            differ += memcmp((const char *)a->data + i * es, (const char *)b->data + i * es, es) != 0;
        printf("%-24s %-7s %llu elements, %llu differ\n", a->name, dsv4_dtype_name(a->dtype),
               (unsigned long long)a->numel, (unsigned long long)differ);
        return differ ? 1 : 0;
    }
    dsv4_compare_metrics m;
    if (!dsv4_compare_any(a->dtype, a->data, b->data, (int64_t)a->numel, &m)) {
        fprintf(stderr, "dsv4moe diff: out of memory comparing tensor '%s'\n", a->name);
        return 2;
    }
    char line[512], why[512];
    dsv4_compare_format(&m, line, sizeof line);
    int64_t beyond = m.tol_violations;
    if (o->terms && !strcmp(a->name, "y") && a->dtype == DSV4_DTYPE_BF16) { /* SPEC.md section 10.2 */
        uint16_t *ca = bf16_copy(a), *cb = bf16_copy(b);
        if (!ca || !cb) {
            free(ca);
            free(cb);
            fprintf(stderr, "dsv4moe diff: out of memory comparing tensor '%s'\n", a->name);
            return 2;
        }
        beyond = dsv4_compare_beyond_terms(ca, cb, o->terms, (int64_t)a->numel);
        free(ca);
        free(cb);
        size_t len = strlen(line);
        snprintf(line + len, sizeof line - len, " beyond_with_S %lld", (long long)beyond);
    }
    bool ok = dsv4_compare_within_beyond(o->rule, &m, beyond, why, sizeof why);
    printf("%-24s %-7s %s\n", a->name, dsv4_dtype_name(a->dtype), line);
    if (!ok)
        printf("%-24s %-7s outside: %s\n", "", "", why);
    return ok ? 0 : 1;
}

/* topk_ids (+ topk_weights when both have them) routing-aware; 0, 1 or 2 as diff_tensor. */
static int diff_routing(const dsv4_st_file *fa, const dsv4_st_file *fb, bool with_weights, const diff_opts *o)
{
    const dsv4_tensor_info *ia = dsv4_st_find(fa, "topk_ids"), *ib = dsv4_st_find(fb, "topk_ids");
    const dsv4_tensor_info *wa = with_weights ? dsv4_st_find(fa, "topk_weights") : NULL;
    const dsv4_tensor_info *wb = with_weights ? dsv4_st_find(fb, "topk_weights") : NULL;
    long long E = o->experts;
    if (E < 0) {
        const char *meta = dsv4_st_metadata(fb, "n_routed_experts");
        char *end = NULL;
        errno = 0;
        E = meta ? strtoll(meta, &end, 10) : -1;
        if (!meta) {
            fprintf(stderr,
                    "dsv4moe diff: comparing topk_ids needs n_routed_experts (the pruned-slot sentinel): %s has no "
                    "metadata n_routed_experts; give --experts E\n",
                    dsv4_st_path(fb));
            return 2;
        }
        if (end == meta || *end || errno == ERANGE || E < 1 || E > (1 << 20)) { /* --experts' range, no saturation */
            fprintf(stderr,
                    "dsv4moe diff: %s: metadata n_routed_experts '%.40s' is not an integer in [1, %d]; give --experts E\n",
                    dsv4_st_path(fb), meta, 1 << 20);
            return 2;
        }
    }
    dsv4_routing_metrics m;
    char msg[768];
    if (!dsv4_compare_routing_tensors(E, ia, wa, o->sentinel, ib, wb, &m, msg, sizeof msg)) {
        fprintf(stderr, "dsv4moe diff: %s\n", msg);
        return 2;
    }
    char line[256], why[768];
    dsv4_routing_format(&m, line, sizeof line);
    bool ok = dsv4_routing_within(&m, why, sizeof why);
    printf("%-24s %-7s %s (as sets per token, sentinel %s, E %lld)\n", wa ? "topk_ids+topk_weights" : "topk_ids",
           "routing", line, dsv4_sentinel_name(o->sentinel), E);
    if (!ok)
        printf("%-24s %-7s outside: %s\n", "", "", why);
    return ok ? 0 : 1;
}

static bool named(const char *const *names, int nn, const char *n)
{
    for (int k = 0; k < nn; k++)
        if (!strcmp(names[k], n))
            return true;
    return false;
}

int cmd_diff(int argc, char **argv)
{
    const char *cmd = "diff", *names[64];
    int nn = 0;
    diff_opts o = {DSV4_TOL_EXACT_QUANT, DSV4_SENTINEL_E, -1, NULL};
    const char *terms_path = NULL;
    static const char *const opts[] = {"--tensor", "--rule", "--sentinel", "--experts", "--terms", NULL};
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .help = DIFF_HELP, .value_opts = opts,
                     .positional = true};
    const char *opt, *v;
    int64_t e;
    while (cli_next_arg(&args, &opt, &v)) {
        if (!strcmp(opt, "--tensor")) {
            if (nn == (int)(sizeof names / sizeof names[0]))
                return cli_failf(cmd, "too many --tensor options (at most %zu)", sizeof names / sizeof names[0]);
            names[nn++] = v;
        } else if (!strcmp(opt, "--rule")) {
            if (!dsv4_tolerance_parse(v, &o.rule))
                return cli_failf(cmd, "--rule '%s': not exact-bf16, exact-quant, fp8-mma, outside or outside-fp8-mma",
                                 v);
        } else if (!strcmp(opt, "--terms")) {
            terms_path = v;
        } else if (!strcmp(opt, "--sentinel")) {
            if (!dsv4_sentinel_parse(v, &o.sentinel))
                return cli_failf(cmd, "--sentinel '%s': not E, -1 or absent", v);
        } else {
            if (cli_parse_i64(cmd, opt, v, 1, 1 << 20, &e))
                return EXIT_BAD_INPUT;
            o.experts = (long long)e;
        }
    }
    if (args.status >= 0)
        return args.status;
    if (args.nops > 2)
        return cli_failf(cmd, "unexpected argument '%s': two files only", argv[3]);
    const char *pa = args.nops > 0 ? argv[1] : NULL, *pb = args.nops > 1 ? argv[2] : NULL; /* the operands */
    if (!pa || !pb)
        return cli_failf(cmd, "two files are needed (see dsv4moe diff --help)");
    dsv4_st_file *a = NULL, *b = NULL;
    dsv4_error err;
    dsv4_error_clear(&err);
    if (terms_path && !outside_rule(o.rule))
        return cli_failf(cmd, "--terms goes with --rule outside or outside-fp8-mma (SPEC.md section 10)");
    dsv4_st_file *tf = NULL;
    float *terms = NULL;
    if (dsv4_st_open(pa, &a, &err) || dsv4_st_open(pb, &b, &err) ||
        (terms_path && dsv4_st_open(terms_path, &tf, &err))) {
        dsv4_st_close(a);
        dsv4_st_close(b);
        return cli_fail(cmd, &err);
    }
    int worst = 0, compared = 0;
    if (outside_rule(o.rule)) { /* the S of SPEC.md section 10.2, for y */
        const dsv4_tensor_info *ts = dsv4_st_find(tf ? tf : b, "y_terms"), *yb = dsv4_st_find(b, "y");
        bool fits = ts && yb && ts->dtype == DSV4_DTYPE_F32 && ts->ndim == yb->ndim && ts->numel == yb->numel;
        for (int d = 0; fits && d < ts->ndim; d++)
            fits = ts->shape[d] == yb->shape[d];
        if (!fits) {
            char s[96] = "absent";
            if (ts)
                dsv4_tensor_shape_str(ts, s, sizeof s);
            fprintf(stderr,
                    "dsv4moe diff: rule %s needs y_terms F32 of y's shape (SPEC.md section 10.2) in %s: found %s%s%s%s\n",
                    dsv4_tolerance_name(o.rule), tf ? terms_path : pb, ts ? dsv4_dtype_name(ts->dtype) : "",
                    ts ? " " : "", s, tf ? "" : "; give --terms FILE");
            worst = 2;
        } else if (!(terms = malloc((size_t)ts->numel * sizeof *terms + 4))) {
            fprintf(stderr, "dsv4moe diff: out of memory\n");
            worst = 2;
        } else {
            memcpy(terms, ts->data, (size_t)ts->numel * sizeof *terms);
            o.terms = terms;
        }
    }
    for (int k = 0; k < nn && worst < 2; k++)
        if (!dsv4_st_find(a, names[k]) || !dsv4_st_find(b, names[k])) {
            fprintf(stderr, "dsv4moe diff: tensor '%s' is missing from %s\n", names[k],
                    !dsv4_st_find(a, names[k]) ? pa : pb);
            worst = 2;
        }
    /* Routing-aware when both have topk_ids (and it is asked for): topk_weights goes with it. */
    bool ids_both = dsv4_st_find(a, "topk_ids") && dsv4_st_find(b, "topk_ids");
    bool w_both = dsv4_st_find(a, "topk_weights") && dsv4_st_find(b, "topk_weights");
    bool routing = ids_both && (!nn || named(names, nn, "topk_ids"));
    bool route_w = routing && w_both && (!nn || named(names, nn, "topk_weights"));
    for (size_t k = 0; k < dsv4_st_count(a) && worst < 2; k++) {
        const dsv4_tensor_info *ta = dsv4_st_tensor(a, k), *tb = dsv4_st_find(b, ta->name);
        if (!tb || (nn && !named(names, nn, ta->name)) || (o.terms && !strcmp(ta->name, "y_terms")))
            continue;
        if (routing && (!strcmp(ta->name, "topk_ids") || (route_w && !strcmp(ta->name, "topk_weights"))))
            continue;
        int r = diff_tensor(ta, tb, &o);
        worst = r > worst ? r : worst;
        compared++;
    }
    if (routing && worst < 2) {
        int r = diff_routing(a, b, route_w, &o);
        worst = r > worst ? r : worst;
        compared += route_w ? 2 : 1;
    }
    int rows = compared - (routing && route_w && worst < 2); /* topk_ids and topk_weights share one row */
    if (!compared && worst < 2) {
        fprintf(stderr, "dsv4moe diff: %s and %s have no tensor in common\n", pa, pb);
        worst = 2;
    }
    dsv4_st_close(a);
    dsv4_st_close(b);
    dsv4_st_close(tf);
    free(terms);
    if (worst < 2)
        printf("dsv4moe diff: %d tensor%s compared in %d row%s%s (rule %s): %s\n", compared, compared == 1 ? "" : "s",
               rows, rows == 1 ? "" : "s", rows < compared ? ", topk_ids and topk_weights in one routing row" : "",
               dsv4_tolerance_name(o.rule), worst ? "outside tolerance" : "within tolerance");
    return worst;
}
