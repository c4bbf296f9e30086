/*
 * The checks of a case (docs/scenarios.md, "Checks"), one function each over the case's context
 * (harness/case.h), run from one table. A check decides what the stage the build reached lets it
 * decide and leaves the rest to the build's stop; one rank and several ranks go through the same
 * functions (the wording of a detail names the ranks where there are several).
 */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/case.h"
#include "dsv4moe/formats.h"

#define set dsv4_h_set_check

/* ---------------- refusal ---------------- */

static void check_refusal(dsv4_h_case *k, dsv4_case_result *c)
{
    const dsv4_scenario_case *sc = k->sc;
    if (k->stage < DSV4_H_PLANNED)
        return;
    if (sc->expect == DSV4_EXPECT_REFUSED) {
        if (!k->refused) {
            set(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL,
                "expected a refusal matching /%s/, but the plan was accepted on all %d ranks",
                sc->refused_regex ? sc->refused_regex : "", k->world);
            return;
        }
        regex_t re;
        if (regcomp(&re, sc->refused_regex ? sc->refused_regex : "", REG_EXTENDED | REG_NOSUB) != 0) {
            set(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_ERROR, "refused_regex /%s/ does not compile", sc->refused_regex);
            return;
        }
        if (regexec(&re, k->refusal, 0, NULL, 0) == 0)
            set(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_PASS, "refused as expected: %s", k->refusal);
        else
            set(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL, "refused, but the message does not match /%s/: %s",
                sc->refused_regex, k->refusal);
        regfree(&re);
    } else if (k->refused) {
        /* Reported even when the case did not ask for the refusal check. */
        set(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL, "the plan was refused, but the case expects pass: %s",
            k->refusal);
    } else if (k->req & DSV4_CHECK_REFUSAL) {
        set(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_PASS, "the plan was accepted on all %d ranks, as expected", k->world);
    }
}

/* ---------------- memory: planned maximum within the budget, measured peak within the step's plan ---------------- */

static void check_memory(dsv4_h_case *k, dsv4_case_result *c)
{
    if (k->stage < DSV4_H_ACCEPTED || !(k->req & DSV4_CHECK_MEMORY))
        return;
    const unsigned long long mx = c->mem.planned_max, av = c->mem.available;
    if (k->planned_bad[0]) {
        set(c, DSV4_CHECK_MEMORY, DSV4_RESULT_FAIL, "%s", k->planned_bad);
        return;
    }
    if (k->cuda_missing) {
        set(c, DSV4_CHECK_MEMORY, DSV4_RESULT_PASS,
            "planned maximum %llu <= available %llu (the measured peak needs the cuda backend: %s)", mx, av,
            k->cuda_why);
        return;
    }
    if (k->stage < DSV4_H_RAN)
        return;
    if (k->run_status) {
        set(c, DSV4_CHECK_MEMORY, DSV4_RESULT_FAIL, "%s", k->run_error);
        return;
    }
    int bad = -1;
    for (int r = 0; r < k->world && bad < 0; r++)
        if (k->ranks[r].workspace_peak > k->ranks[r].workspace_planned)
            bad = r;
    const unsigned long long peak = c->mem.peak, step = c->mem.planned_step;
    if (k->world == 1) {
        const long long T = (long long)k->sc->tokens[0];
        if (bad >= 0)
            set(c, DSV4_CHECK_MEMORY, DSV4_RESULT_FAIL,
                "measured peak %llu bytes above the %llu planned for T = %lld (%s backend)", peak, step, T,
                k->be_name);
        else
            set(c, DSV4_CHECK_MEMORY, DSV4_RESULT_PASS,
                "planned maximum %llu <= available %llu; measured peak %llu <= planned %llu for T = %lld%s", mx, av,
                peak, step, T, peak == 0 ? " (the backend measured nothing)" : "");
    } else if (bad >= 0) {
        set(c, DSV4_CHECK_MEMORY, DSV4_RESULT_FAIL,
            "rank %d: measured peak %llu bytes above the %llu planned for the step", bad,
            (unsigned long long)k->ranks[bad].workspace_peak, (unsigned long long)k->ranks[bad].workspace_planned);
    } else {
        /* a backend with device weights (cuda): each rank's, as bound, within its plan's model */
        unsigned long long wmax = 0;
        for (int r = 0; r < k->world && bad < 0; r++) {
            if (k->ranks[r].weights_bound > k->ranks[r].weights_planned)
                bad = r;
            wmax = k->ranks[r].weights_bound > wmax ? k->ranks[r].weights_bound : wmax;
        }
        if (bad >= 0)
            set(c, DSV4_CHECK_MEMORY, DSV4_RESULT_FAIL, "rank %d: weights of %llu bytes above the %llu its plan models",
                bad, (unsigned long long)k->ranks[bad].weights_bound, (unsigned long long)k->ranks[bad].weights_planned);
        else if (wmax)
            set(c, DSV4_CHECK_MEMORY, DSV4_RESULT_PASS,
                "planned maximum %llu <= available %llu on every rank; measured peak %llu <= planned %llu; each rank's "
                "weights (at most %llu bytes) within its plan's model",
                mx, av, peak, step, wmax);
        else
            set(c, DSV4_CHECK_MEMORY, DSV4_RESULT_PASS,
                "planned maximum %llu <= available %llu on every rank; measured peak %llu <= planned %llu", mx, av, peak,
                step);
    }
}

/* ---------------- clamp_exercised: the reference saw the SwiGLU clamp act ---------------- */

static void check_clamp(dsv4_h_case *k, dsv4_case_result *c)
{
    if (k->stage < DSV4_H_REFERENCE)
        return;
    if (!k->ref_ok) {
        set(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_ERROR, "%s", k->ref_error);
        return;
    }
    if (!(k->req & DSV4_CHECK_CLAMP_EXERCISED))
        return;
    const dsv4_ref_stats *s = &k->ref_stats;
    const double L = (double)k->cfg->swiglu_limit;
    if (!(k->cfg->swiglu_limit > 0))
        set(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_SKIP, "not applicable (swiglu_limit 0)");
    else if (s->tokens < DSV4_H_CLAMP_MIN_TOKENS)
        set(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_SKIP, "not applicable (T < %d: %lld tokens)",
            DSV4_H_CLAMP_MIN_TOKENS, (long long)s->tokens);
    else if (s->routed_g_clamped + s->routed_u_clamped > 0)
        set(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_PASS,
            "%llu g and %llu u of %llu routed values clamped at L = %g over %lld tokens",
            (unsigned long long)s->routed_g_clamped, (unsigned long long)s->routed_u_clamped,
            (unsigned long long)s->routed_values, L, (long long)s->tokens);
    else
        set(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_FAIL,
            "no routed g or u value exceeded L = %g in %llu values over %lld tokens: a dropped clamp would not be seen",
            L, (unsigned long long)s->routed_values, (long long)s->tokens);
}

/* ---------------- determinism: the reference at 1 and 2 threads ---------------- */

/* The reference at `threads` threads on T tokens from row o: the case's own outputs of rank 0 when
   they were computed at that count on those tokens, else a reference created for it. */
static dsv4_status ref_at(dsv4_h_case *k, int threads, int64_t o, int64_t T, uint16_t *y, int32_t *ids, float *w,
                          dsv4_error *e)
{
    if (k->sc->tokens[0] > 0 && k->ref_ok && k->o->threads == threads) {
        memcpy(y, k->yr, (size_t)(T * k->H) * sizeof *y);
        memcpy(ids, k->ids_r, (size_t)(T * k->K) * sizeof *ids);
        memcpy(w, k->w_r, (size_t)(T * k->K) * sizeof *w);
        return DSV4_OK;
    }
    dsv4_ref *ref = NULL;
    dsv4_status st = dsv4_ref_create(k->cfg, k->ck, threads, &ref, e);
    if (!st)
        st = dsv4_h_ref_run(ref, k->cfg, k->X, k->IDS, o, T, y, ids, w, NULL, e);
    dsv4_ref_free(ref);
    return st;
}

static void check_determinism(dsv4_h_case *k, dsv4_case_result *c)
{
    if (k->stage < DSV4_H_REFERENCE || !(k->req & DSV4_CHECK_DETERMINISM))
        return;
    const int64_t H = k->H, K = k->K;
    const int64_t T = k->sc->tokens[0] > 0 ? k->sc->tokens[0] : DSV4_H_DETERMINISM_TOKENS;
    const int64_t o = k->sc->tokens[0] > 0 ? k->off[0] : 0;
    uint16_t *y1 = calloc((size_t)(T * H), 2), *y2 = calloc((size_t)(T * H), 2);
    int32_t *i1 = calloc((size_t)(T * K), 4), *i2 = calloc((size_t)(T * K), 4);
    float *w1 = calloc((size_t)(T * K), 4), *w2 = calloc((size_t)(T * K), 4);
    dsv4_error e;
    dsv4_error_clear(&e);
    if (!y1 || !y2 || !i1 || !i2 || !w1 || !w2) {
        set(c, DSV4_CHECK_DETERMINISM, DSV4_RESULT_ERROR, "out of memory");
    } else if (ref_at(k, 1, o, T, y1, i1, w1, &e) || ref_at(k, 2, o, T, y2, i2, w2, &e)) {
        set(c, DSV4_CHECK_DETERMINISM, DSV4_RESULT_ERROR, "the reference failed: %s", e.message);
    } else {
        dsv4_ref_output a = {.y = y1, .topk_ids = i1, .topk_weights = w1};
        dsv4_ref_output b = {.y = y2, .topk_ids = i2, .topk_weights = w2};
        unsigned long long h1 = dsv4_ref_hash(k->cfg, T, &a), h2 = dsv4_ref_hash(k->cfg, T, &b);
        if (h1 == h2)
            set(c, DSV4_CHECK_DETERMINISM, DSV4_RESULT_PASS, "hash %016llx at 1 and 2 threads over %lld tokens", h1,
                (long long)T);
        else
            set(c, DSV4_CHECK_DETERMINISM, DSV4_RESULT_FAIL,
                "hash %016llx at 1 thread, %016llx at 2 threads over %lld tokens", h1, h2, (long long)T);
    }
    free(y1), free(y2), free(i1), free(i2), free(w1), free(w2);
}

/* ---------------- numerics: the backend against the reference ---------------- */

/* The per-quant tolerance of the project's own backends (one rule set for run, diff and check:
   dsv4_compare_within): the exact mode's, or SPEC.md section 9's fp8 bound when the plan runs
   gemm fp8; fills why on failure. */
static bool within_tolerance(const dsv4_config *c, dsv4_gemm_mode gemm, const dsv4_compare_metrics *m, char *why,
                             size_t n)
{
    bool bf16 = c->routed_format == DSV4_FORMAT_BF16 && c->shared_format == DSV4_FORMAT_BF16;
    return dsv4_compare_within(bf16                    ? DSV4_TOL_EXACT_BF16
                               : gemm == DSV4_GEMM_FP8 ? DSV4_TOL_FP8_MMA
                                                       : DSV4_TOL_EXACT_QUANT,
                               m, why, n);
}

/* Several ranks, tp = 1: every rank bit-identical to the computing backend's single-rank counterpart
   (dsv4_dist_single_rank: the same stages over the same groups on one rank); every rank within
   tolerance of the reference. Fills bad with the first difference; false when out of memory. */
static bool ranks_agree(dsv4_h_case *k, bool bitwise, char *bad, size_t badn)
{
    const int64_t H = k->H;
    uint16_t *ys = NULL;
    if (bitwise) {
        ys = calloc((size_t)(k->all_rows * H + 1), sizeof *ys);
        dsv4_dist_rank *one = calloc((size_t)k->world, sizeof *one);
        if (!ys || !one) {
            free(ys), free(one);
            return false;
        }
        int64_t row = 0;
        for (int r = 0; r < k->world; r++) {
            one[r] = k->ranks[r];
            one[r].y = ys + row * H;
            one[r].topk_ids = NULL;
            one[r].topk_weights = NULL;
            one[r].trace = NULL;
            row += k->sc->tokens[r];
        }
        dsv4_error e1;
        if (dsv4_dist_single_rank(k->cfg, k->ckb ? k->ckb : k->ck, &k->topo, &k->sc->budget, &k->dopt, one, &e1) !=
            DSV4_OK)
            snprintf(bad, badn, "the %s backend's single-rank counterpart failed: %s", k->be_name, e1.message);
        free(one);
    }
    bool ok = true;
    int64_t row = 0;
    for (int r = 0; r < k->world && !bad[0] && ok; r++) {
        const uint16_t *y = k->y + row * H, *yr = k->yr + row * H;
        int64_t n = k->sc->tokens[r] * H;
        if (bitwise && memcmp(y, ys + row * H, (size_t)n * 2) != 0) {
            int64_t i = 0;
            while (i < n && y[i] == ys[row * H + i])
                i++;
            snprintf(bad, badn,
                     "rank %d differs from the %s backend on one rank (ep sharding must be bit-identical): "
                     "first at token %lld channel %lld: 0x%04x vs 0x%04x",
                     r, k->be_name, (long long)(i / H), (long long)(i % H), y[i], ys[row * H + i]);
        }
        dsv4_compare_metrics m;
        char why[256];
        if (!bad[0] && n > 0 && !dsv4_compare_bf16(y, yr, n, &m))
            ok = false;
        else if (!bad[0] && n > 0 &&
                 !within_tolerance(k->cfg, k->dopt.compute_backend >= 0 ? DSV4_GEMM_EXACT : dsv4_plan_gemm(k->plans[0]),
                                   &m, why, sizeof why)) /* a stand-in computes gemm exact */
            snprintf(bad, badn, "rank %d vs ref: %s", r, why);
        row += k->sc->tokens[r];
    }
    free(ys);
    return ok;
}

static void check_numerics(dsv4_h_case *k, dsv4_case_result *c)
{
    const unsigned bit = DSV4_CHECK_NUMERICS;
    const bool req = k->req & bit;
    if (k->stage < DSV4_H_REFERENCE)
        return;
    if (k->stage >= DSV4_H_RAN && k->run_status && req) {
        set(c, bit, DSV4_RESULT_FAIL, "%s", k->run_error);
        return;
    }
    if (!k->ref_ok) {
        set(c, bit, DSV4_RESULT_ERROR, "%s", k->ref_error);
        return;
    }
    if (k->stage < DSV4_H_RAN || !req)
        return;
    /* The whole case's outputs against the reference's: the metrics and the error profile. */
    bool cmp_oom = false;
    if (k->all_rows > 0 && dsv4_compare_bf16(k->y, k->yr, k->all_rows * k->H, &c->m)) {
        c->has_metrics = true;
        dsv4_h_error_profile(c, k->y, k->yr, k->sc->tokens, k->world, k->H);
    } else if (k->all_rows > 0) {
        cmp_oom = true;
    }
    char line[512] = "nothing compared (0 tokens)", why[256], bad[DSV4_H_MSG_MAX] = "";
    if (c->has_metrics)
        dsv4_compare_format(&c->m, line, sizeof line);
    if (k->world == 1) {
        /* One rank: the whole output within the tolerance of the plan's gemm mode. */
        if (k->all_rows == 0)
            set(c, bit, DSV4_RESULT_PASS, "nothing to compare (0 tokens)%s", k->note);
        else if (cmp_oom)
            set(c, bit, DSV4_RESULT_ERROR, "comparison failed (out of memory)");
        else if (k->self_compared && within_tolerance(k->cfg, k->gemm, &c->m, why, sizeof why))
            set(c, bit, DSV4_RESULT_SELF,
                "self-compared: the %s backend at world 1 is the reference's own code on its own checkpoint, so "
                "nothing lies between the two sides%s (give the case topology.backend cpu or cuda): %s",
                k->be_name, k->note, line);
        else if (within_tolerance(k->cfg, k->gemm, &c->m, why, sizeof why))
            set(c, bit, DSV4_RESULT_PASS, "%s vs ref%s: %s", k->be_name, k->note, line);
        else
            set(c, bit, DSV4_RESULT_FAIL, "%s vs ref%s: %s; %s", k->be_name, k->note, why, line);
        return;
    }
    const bool bitwise = k->topo.tp <= 1;
    cmp_oom |= !ranks_agree(k, bitwise, bad, sizeof bad);
    if (cmp_oom) /* a comparison that did not run must not read as a pass */
        set(c, bit, DSV4_RESULT_ERROR, "comparison failed (out of memory)");
    else if (bad[0])
        set(c, bit, DSV4_RESULT_FAIL, "%s%s; all ranks vs ref: %s", bad, k->note, line);
    else if (bitwise)
        set(c, bit, DSV4_RESULT_PASS, "%d ranks of %s bit-identical to %s on one rank%s; vs ref: %s", k->world,
            k->be_name, k->be_name, k->note, line);
    else
        set(c, bit, DSV4_RESULT_PASS, "%d ranks of %s (tp %d) within tolerance of ref%s: %s", k->world, k->be_name,
            k->topo.tp, k->note, line);
}

/* ---------------- symmetry: every rank issued the same collectives ---------------- */

static void trace_entry(const dsv4_coll_record *r, char *buf, size_t n)
{
    snprintf(buf, n, "%s seq %llu %s %s count %llu '%s'", dsv4_group_name(r->group), (unsigned long long)r->seq,
             dsv4_coll_op_name(r->op), dsv4_dtype_name(r->dtype), (unsigned long long)r->count, r->tag);
}

static bool same_fingerprint(const dsv4_coll_record *a, const dsv4_coll_record *b)
{
    if (a->group != b->group || a->seq != b->seq || a->op != b->op || a->dtype != b->dtype ||
        strncmp(a->tag, b->tag, DSV4_COMM_TAG_MAX) != 0)
        return false;
    if ((a->op == DSV4_COLL_ALL_REDUCE || a->op == DSV4_COLL_ALL_GATHER) && a->count != b->count)
        return false;
    return true;
}

static void check_symmetry(dsv4_h_case *k, dsv4_case_result *c)
{
    if (k->trace_error[0]) { /* a trace asked for and not written must not read as a pass */
        set(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_ERROR, "%s", k->trace_error);
        return;
    }
    if (k->stage < DSV4_H_RUN_BEGUN || !(k->req & DSV4_CHECK_SYMMETRY))
        return;
    if (k->world == 1) {
        set(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_SKIP, "not applicable (one rank)");
        return;
    }
    if (k->stage < DSV4_H_RAN)
        return;
    const dsv4_dist_rank *ranks = k->ranks;
    char bad[1024] = "";
    for (int r = 1; r < k->world && !bad[0]; r++) {
        size_t n0 = ranks[0].trace_len, nr = ranks[r].trace_len, n = n0 < nr ? n0 : nr;
        size_t i = 0;
        while (i < n && same_fingerprint(&ranks[0].trace[i], &ranks[r].trace[i]))
            i++;
        if (i < n || n0 != nr) {
            char a[192] = "(none)", b[192] = "(none)";
            if (i < n0)
                trace_entry(&ranks[0].trace[i], a, sizeof a);
            if (i < nr)
                trace_entry(&ranks[r].trace[i], b, sizeof b);
            snprintf(bad, sizeof bad,
                     "collective #%zu differs: rank 0 [%s] vs rank %d [%s] (rank 0 issued %zu, rank %d %zu)", i, a, r,
                     b, n0, r, nr);
        }
    }
    bool failed = k->run_status != DSV4_OK;
    if (bad[0])
        set(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_FAIL, "%s%s%s", bad, failed ? "; " : "", failed ? k->run_error : "");
    else if (failed)
        set(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_FAIL, "%s", k->run_error);
    else
        set(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_PASS, "%d ranks issued the same %zu collectives", k->world,
            ranks[0].trace_len);
}

/* ---------------- empty: a rank with 0 tokens launches nothing and takes part in every collective ---------------- */

static void check_empty(dsv4_h_case *k, dsv4_case_result *c)
{
    if (k->stage < DSV4_H_RAN || !(k->req & DSV4_CHECK_EMPTY))
        return;
    const dsv4_dist_rank *ranks = k->ranks;
    int n_empty = 0, ref_rank = -1;
    for (int r = 0; r < k->world; r++) {
        if (k->sc->tokens[r] == 0)
            n_empty++;
        else if (ref_rank < 0)
            ref_rank = r;
    }
    char bad[256] = "";
    if (n_empty == 0) {
        set(c, DSV4_CHECK_EMPTY, DSV4_RESULT_SKIP, "not applicable (no rank with 0 tokens)");
    } else if (k->run_status) {
        set(c, DSV4_CHECK_EMPTY, DSV4_RESULT_FAIL, "%s", k->run_error);
    } else if (k->world == 1) {
        if (k->bs.launches == 0)
            set(c, DSV4_CHECK_EMPTY, DSV4_RESULT_PASS,
                "T = 0: the %s backend returned with 0 launches (%llu empty groups skipped)", k->be_name,
                (unsigned long long)k->bs.empty_skips);
        else
            set(c, DSV4_CHECK_EMPTY, DSV4_RESULT_FAIL, "T = 0: the %s backend launched %llu groups", k->be_name,
                (unsigned long long)k->bs.launches);
    } else {
        if (ref_rank < 0)
            ref_rank = 0; /* every rank empty: they must still agree with each other */
        for (int r = 0; r < k->world && !bad[0]; r++)
            if (k->sc->tokens[r] == 0 && ranks[r].trace_len != ranks[ref_rank].trace_len)
                snprintf(bad, sizeof bad, "rank %d (0 tokens) issued %zu collectives, rank %d issued %zu", r,
                         ranks[r].trace_len, ref_rank, ranks[ref_rank].trace_len);
        /* A step whose largest rank holds 0 tokens has 0 chunks: anything run is a zero-size launch. */
        for (int r = 0; r < k->world && !bad[0]; r++)
            if (ranks[r].step_max_tokens == 0 && ranks[r].chunks > 0)
                snprintf(bad, sizeof bad,
                         "every rank had 0 tokens, yet rank %d ran %lld chunks of 0 rows (a zero-size launch)", r,
                         (long long)ranks[r].chunks);
        if (bad[0])
            set(c, DSV4_CHECK_EMPTY, DSV4_RESULT_FAIL, "%s", bad);
        else
            set(c, DSV4_CHECK_EMPTY, DSV4_RESULT_PASS,
                "%d of %d ranks had 0 tokens and took part in all %zu collectives", n_empty, k->world,
                ranks[ref_rank].trace_len);
    }
}

/* ---------------- the table ---------------- */

typedef struct {
    unsigned bit; /* DSV4_CHECK_*; its name is dsv4_check_name(bit) */
    void (*fn)(dsv4_h_case *k, dsv4_case_result *c);
} check_entry;

static const check_entry CHECKS[] = {
    {DSV4_CHECK_REFUSAL, check_refusal},     {DSV4_CHECK_MEMORY, check_memory},
    {DSV4_CHECK_CLAMP_EXERCISED, check_clamp}, {DSV4_CHECK_DETERMINISM, check_determinism},
    {DSV4_CHECK_NUMERICS, check_numerics},   {DSV4_CHECK_SYMMETRY, check_symmetry},
    {DSV4_CHECK_EMPTY, check_empty},
};

void dsv4_h_case_check(dsv4_h_case *k, dsv4_case_result *c)
{
    for (size_t i = 0; i < sizeof CHECKS / sizeof CHECKS[0]; i++)
        CHECKS[i].fn(k, c);
    /* What the stopping stage decided itself, then the stop for every check it did not reach. */
    if (k->stop_refusal_oom)
        set(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_ERROR, "out of memory");
    if (k->stop_numerics[0])
        set(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_FAIL, "%s", k->stop_numerics);
    if (k->stop_empty[0])
        set(c, DSV4_CHECK_EMPTY, k->stop_empty_result, "%s", k->stop_empty);
    if (k->rest_set)
        dsv4_h_set_rest(c, k->rest, k->rest_detail, k->rest_unrun);
    if (c->mem.available == UINT64_MAX)
        c->mem.available = 0;
    dsv4_h_finish_status(c);
}
