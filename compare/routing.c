/*
 * Routing-aware comparison of topk_ids / topk_weights (dsv4moe_harness/compare.h): the kept experts
 * of a token as a multiset (an engine may order a token's slots any way it likes), pruned
 * top-p slots in the candidate's sentinel convention, weights matched by expert id.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe_harness/compare.h"

const char *dsv4_sentinel_name(dsv4_sentinel s)
{
    switch (s) {
    case DSV4_SENTINEL_E: return "E";
    case DSV4_SENTINEL_MINUS1: return "-1";
    case DSV4_SENTINEL_ABSENT: return "absent";
    }
    return "?";
}

bool dsv4_sentinel_parse(const char *name, dsv4_sentinel *out)
{
    dsv4_sentinel s;
    if (!name)
        return false;
    if (!strcmp(name, "E") || !strcmp(name, "e"))
        s = DSV4_SENTINEL_E;
    else if (!strcmp(name, "-1"))
        s = DSV4_SENTINEL_MINUS1;
    else if (!strcmp(name, "absent"))
        s = DSV4_SENTINEL_ABSENT;
    else
        return false;
    if (out)
        *out = s;
    return true;
}

typedef struct {
    int64_t id;
    double w;
} slot;

static int slot_cmp(const void *pa, const void *pb)
{
    const slot *a = pa, *b = pb;
    if (a->id != b->id)
        return a->id < b->id ? -1 : 1;
    return a->w < b->w ? -1 : a->w > b->w ? 1 : 0;
}

/* Collects a row's kept experts into s (sorted); returns their count. A slot that is not an expert:
   the sentinel (or, with `absent`, any id outside [0, E)) is dropped, its weight must be 0;
   anything else is malformed (*bad_id set to it). */
static int64_t kept(const int64_t *ids, const double *w, int64_t k, int64_t E, dsv4_sentinel conv, slot *s,
                    int64_t *malformed, int64_t *bad_id, int64_t *nonzero_pruned)
{
    int64_t n = 0;
    for (int64_t j = 0; j < k; j++) {
        int64_t id = ids[j];
        if (id >= 0 && id < E) {
            s[n].id = id;
            s[n].w = w ? w[j] : 0;
            n++;
            continue;
        }
        bool pruned = conv == DSV4_SENTINEL_ABSENT || (conv == DSV4_SENTINEL_E && id == E) ||
                      (conv == DSV4_SENTINEL_MINUS1 && id == -1);
        if (!pruned) {
            (*malformed)++;
            *bad_id = id;
        } else if (w && !(fabs(w[j]) <= DSV4_ROUTING_WEIGHT_ATOL)) {
            (*nonzero_pruned)++;
        }
    }
    qsort(s, (size_t)n, sizeof *s, slot_cmp);
    return n;
}

static void set_words(char *buf, size_t size, const slot *s, int64_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int64_t i = 0; i < n && len + 16 < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? "," : "", (long long)s[i].id);
}

bool dsv4_compare_routing(int64_t T, int64_t E, int64_t ka, const int64_t *ids_a, const double *w_a, dsv4_sentinel sa,
                          int64_t kb, const int64_t *ids_b, const double *w_b, dsv4_routing_metrics *m)
{
    return dsv4_compare_routing_rtol(T, E, ka, ids_a, w_a, sa, kb, ids_b, w_b, DSV4_ROUTING_WEIGHT_RTOL, m);
}

bool dsv4_compare_routing_rtol(int64_t T, int64_t E, int64_t ka, const int64_t *ids_a, const double *w_a,
                               dsv4_sentinel sa, int64_t kb, const int64_t *ids_b, const double *w_b,
                               double weights_rtol, dsv4_routing_metrics *m)
{
    if (!m || T < 0 || (T > 0 && (ka < 1 || kb < 1 || !ids_a || !ids_b)) || (!w_a) != (!w_b) ||
        !(weights_rtol >= DSV4_ROUTING_WEIGHT_RTOL && weights_rtol < 1))
        return false;
    memset(m, 0, sizeof *m);
    m->weights_rtol = weights_rtol;
    m->tokens = T;
    m->first_bad_token = -1;
    m->first_bad_weight_token = -1;
    m->weights_compared = w_a != NULL;
    slot *sa_ = malloc((size_t)(ka > 0 ? ka : 1) * sizeof *sa_), *sb = malloc((size_t)(kb > 0 ? kb : 1) * sizeof *sb);
    if (!sa_ || !sb) {
        free(sa_);
        free(sb);
        return false;
    }
    for (int64_t t = 0; t < T; t++) {
        int64_t mal = 0, bad_id = 0, nzp = 0, ref_mal = 0, ref_bad = 0, ref_nzp = 0;
        int64_t na = kept(ids_a + t * ka, w_a ? w_a + t * ka : NULL, ka, E, sa, sa_, &mal, &bad_id, &nzp);
        int64_t nb = kept(ids_b + t * kb, w_b ? w_b + t * kb : NULL, kb, E, DSV4_SENTINEL_E, sb, &ref_mal, &ref_bad,
                          &ref_nzp);
        m->malformed += mal + ref_mal;
        bool same = na == nb && !mal && !ref_mal;
        for (int64_t i = 0; same && i < na; i++)
            same = sa_[i].id == sb[i].id;
        if (!same) {
            m->id_tokens_bad++;
            if (m->first_bad_token < 0) {
                char x[96], y[96];
                m->first_bad_token = t;
                set_words(x, sizeof x, sa_, na);
                set_words(y, sizeof y, sb, nb);
                if (mal || ref_mal)
                    snprintf(m->first_bad, sizeof m->first_bad,
                             "token %lld: %s id %lld is neither an expert in [0, %lld) nor the sentinel (%s)",
                             (long long)t, mal ? "the candidate's" : "the reference's",
                             (long long)(mal ? bad_id : ref_bad), (long long)E,
                             mal ? dsv4_sentinel_name(sa) : "E");
                else
                    snprintf(m->first_bad, sizeof m->first_bad, "token %lld: experts {%s} vs the reference's {%s}",
                             (long long)t, x, y);
            }
            continue;
        }
        if (!w_a)
            continue;
        int64_t wbad = nzp;
        for (int64_t i = 0; i < na; i++) {
            double d = fabs(sa_[i].w - sb[i].w);
            m->weights_n++;
            bool ok = isfinite(sa_[i].w) && isfinite(sb[i].w) &&
                      d <= DSV4_ROUTING_WEIGHT_ATOL + weights_rtol * fabs(sb[i].w);
            if (isfinite(d) && d > m->weights_max_abs)
                m->weights_max_abs = d;
            if (!ok) {
                wbad++;
                if (m->first_bad_weight_token < 0) {
                    m->first_bad_weight_token = t;
                    snprintf(m->first_bad_weight, sizeof m->first_bad_weight,
                             "token %lld expert %lld: weight %.9g vs the reference's %.9g", (long long)t,
                             (long long)sa_[i].id, sa_[i].w, sb[i].w);
                }
            }
        }
        if (nzp && m->first_bad_weight_token < 0) {
            m->first_bad_weight_token = t;
            snprintf(m->first_bad_weight, sizeof m->first_bad_weight,
                     "token %lld: a pruned or padding slot carries a non-zero weight", (long long)t);
        }
        m->weights_bad += wbad;
    }
    free(sa_);
    free(sb);
    return true;
}

bool dsv4_routing_within(const dsv4_routing_metrics *m, char *why, size_t size)
{
    char dummy[8];
    if (!why || !size) {
        why = dummy;
        size = sizeof dummy;
    }
    why[0] = '\0';
    if (!m) {
        snprintf(why, size, "no routing metrics");
        return false;
    }
    if (m->id_tokens_bad || m->malformed) {
        snprintf(why, size, "topk_ids differ as sets on %lld of %lld tokens (%lld malformed entries); first: %s",
                 (long long)m->id_tokens_bad, (long long)m->tokens, (long long)m->malformed, m->first_bad);
        return false;
    }
    if (m->weights_bad) {
        snprintf(why, size,
                 "topk_weights: %lld of %lld matched by expert id beyond |a-b| <= %g + %g |b|; first: %s",
                 (long long)m->weights_bad, (long long)m->weights_n, DSV4_ROUTING_WEIGHT_ATOL, m->weights_rtol,
                 m->first_bad_weight);
        return false;
    }
    return true;
}

void dsv4_routing_format(const dsv4_routing_metrics *m, char *buf, size_t size)
{
    if (!buf || !size)
        return;
    if (!m) {
        buf[0] = '\0';
        return;
    }
    if (m->weights_compared)
        snprintf(buf, size, "tokens %lld id sets differ %lld malformed %lld weights %lld max |dw| %.3g beyond %lld",
                 (long long)m->tokens, (long long)m->id_tokens_bad, (long long)m->malformed, (long long)m->weights_n,
                 m->weights_max_abs, (long long)m->weights_bad);
    else
        snprintf(buf, size, "tokens %lld id sets differ %lld malformed %lld (weights not compared)",
                 (long long)m->tokens, (long long)m->id_tokens_bad, (long long)m->malformed);
}

void dsv4_tensor_shape_str(const dsv4_tensor_info *t, char *buf, size_t size)
{
    if (!buf || !size)
        return;
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int d = 0; t && d < t->ndim && len < size; d++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (len < size)
        snprintf(buf + len, size - len, "]");
}

/* A [T, k] integer tensor into int64 (any alignment). */
static int64_t *ids_of(const dsv4_tensor_info *t)
{
    int64_t *o = malloc((size_t)t->numel * sizeof *o + 8);
    if (!o)
        return NULL;
    const unsigned char *p = t->data;
    for (uint64_t i = 0; i < t->numel; i++) {
        if (t->dtype == DSV4_DTYPE_I32) {
            int32_t v;
            memcpy(&v, p + 4 * i, 4);
            o[i] = v;
        } else {
            memcpy(&o[i], p + 8 * i, 8);
        }
    }
    return o;
}

/* A float tensor into double. */
static double *weights_of(const dsv4_tensor_info *t)
{
    double *o = malloc((size_t)t->numel * sizeof *o + 8);
    if (!o)
        return NULL;
    for (uint64_t i = 0; i < t->numel; i++)
        o[i] = dsv4_float_value(t->dtype, t->data, (int64_t)i);
    return o;
}

static bool fits(const dsv4_tensor_info *ids, const dsv4_tensor_info *w)
{
    if (ids->ndim != 2 || (ids->dtype != DSV4_DTYPE_I32 && ids->dtype != DSV4_DTYPE_I64))
        return false;
    return !w || (w->ndim == 2 && w->shape[0] == ids->shape[0] && w->shape[1] == ids->shape[1] &&
                  dsv4_compare_dtype_ok(w->dtype));
}

bool dsv4_compare_routing_tensors(int64_t E, const dsv4_tensor_info *ids_a, const dsv4_tensor_info *w_a,
                                  dsv4_sentinel sa, const dsv4_tensor_info *ids_b, const dsv4_tensor_info *w_b,
                                  dsv4_routing_metrics *m, char *msg, size_t size)
{
    return dsv4_compare_routing_tensors_rtol(E, ids_a, w_a, sa, ids_b, w_b, DSV4_ROUTING_WEIGHT_RTOL, m, msg, size);
}

bool dsv4_compare_routing_tensors_rtol(int64_t E, const dsv4_tensor_info *ids_a, const dsv4_tensor_info *w_a,
                                       dsv4_sentinel sa, const dsv4_tensor_info *ids_b, const dsv4_tensor_info *w_b,
                                       double weights_rtol, dsv4_routing_metrics *m, char *msg, size_t size)
{
    char dummy[8];
    if (!msg || !size) {
        msg = dummy;
        size = sizeof dummy;
    }
    msg[0] = '\0';
    if (!ids_a || !ids_b || !m || (!w_a) != (!w_b)) {
        snprintf(msg, size, "routing comparison: ids of both sides, and weights of both or neither, are needed");
        return false;
    }
    if (!fits(ids_a, w_a) || !fits(ids_b, w_b) || ids_a->shape[0] != ids_b->shape[0] || ids_a->shape[1] < 1 ||
        ids_b->shape[1] < 1) {
        char s1[64], s2[64], s3[64] = "-", s4[64] = "-";
        dsv4_tensor_shape_str(ids_a, s1, sizeof s1);
        dsv4_tensor_shape_str(ids_b, s2, sizeof s2);
        if (w_a)
            dsv4_tensor_shape_str(w_a, s3, sizeof s3);
        if (w_b)
            dsv4_tensor_shape_str(w_b, s4, sizeof s4);
        snprintf(msg, size,
                 "routing tensors do not fit together: %s %s %s vs %s %s %s, weights %s %s vs %s %s (ids I32 or I64 "
                 "[T, k], weights a float dtype of the ids' shape, the same T on both sides)",
                 ids_a->name, dsv4_dtype_name(ids_a->dtype), s1, ids_b->name, dsv4_dtype_name(ids_b->dtype), s2,
                 w_a ? dsv4_dtype_name(w_a->dtype) : "", s3, w_b ? dsv4_dtype_name(w_b->dtype) : "", s4);
        return false;
    }
    int64_t *ia = ids_of(ids_a), *ib = ids_of(ids_b);
    double *wa = w_a ? weights_of(w_a) : NULL, *wb = w_b ? weights_of(w_b) : NULL;
    bool ok = ia && ib && (!w_a || (wa && wb)) &&
              dsv4_compare_routing_rtol(ids_a->shape[0], E, ids_a->shape[1], ia, wa, sa, ids_b->shape[1], ib, wb,
                                        weights_rtol, m);
    if (!ok)
        snprintf(msg, size, weights_rtol >= DSV4_ROUTING_WEIGHT_RTOL && weights_rtol < 1
                                ? "routing comparison: out of memory"
                                : "routing comparison: the weights' rtol must be in [1e-5, 1)");
    free(ia);
    free(ib);
    free(wa);
    free(wb);
    return ok;
}
