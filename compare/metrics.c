/* Comparison metrics of SPEC.md section 7 (dsv4moe_harness/compare.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe_harness/compare.h"
#include "dsv4moe/formats.h"

/* One element as a double and as sign + magnitude of its bit pattern (the ordered integer whose
   differences are ULP distances). false when the dtype is not a float type. */
static bool element(dsv4_dtype dt, const unsigned char *p, int64_t i, double *v, uint64_t *mag, bool *neg)
{
    switch (dt) {
    case DSV4_DTYPE_BF16: {
        uint16_t u;
        memcpy(&u, p + 2 * i, 2);
        *v = dsv4_bf16_to_f32(u);
        *neg = u >> 15;
        *mag = u & 0x7FFFu;
        return true;
    }
    case DSV4_DTYPE_F16: {
        uint16_t u;
        memcpy(&u, p + 2 * i, 2);
        int e = (u >> 10) & 0x1F, f = u & 0x3FF;
        double x = e == 0 ? ldexp(f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexp(1024 + f, e - 25);
        *v = u >> 15 ? -x : x;
        *neg = u >> 15;
        *mag = u & 0x7FFFu;
        return true;
    }
    case DSV4_DTYPE_F32: {
        uint32_t u;
        float f;
        memcpy(&u, p + 4 * i, 4);
        memcpy(&f, &u, 4);
        *v = f;
        *neg = u >> 31;
        *mag = u & 0x7FFFFFFFu;
        return true;
    }
    case DSV4_DTYPE_F64: {
        uint64_t u;
        double d;
        memcpy(&u, p + 8 * i, 8);
        memcpy(&d, &u, 8);
        *v = d;
        *neg = u >> 63;
        *mag = u & 0x7FFFFFFFFFFFFFFFull;
        return true;
    }
    case DSV4_DTYPE_F8_E4M3:
        *v = dsv4_e4m3_to_f32(p[i]);
        *neg = p[i] >> 7;
        *mag = p[i] & 0x7Fu;
        return true;
    case DSV4_DTYPE_F8_E5M2: {
        int e = (p[i] >> 2) & 0x1F, f = p[i] & 3;
        double x = e == 0 ? ldexp(f, -16) : e == 31 ? (f ? NAN : INFINITY) : ldexp(4 + f, e - 17);
        *v = p[i] >> 7 ? -x : x;
        *neg = p[i] >> 7;
        *mag = p[i] & 0x7Fu;
        return true;
    }
    default:
        return false;
    }
}

double dsv4_float_value(dsv4_dtype dtype, const void *p, int64_t i)
{
    double v;
    uint64_t mag;
    bool neg;
    return p && i >= 0 && element(dtype, p, i, &v, &mag, &neg) ? v : NAN;
}

bool dsv4_compare_dtype_ok(dsv4_dtype dtype)
{
    return dtype == DSV4_DTYPE_BF16 || dtype == DSV4_DTYPE_F16 || dtype == DSV4_DTYPE_F32 ||
           dtype == DSV4_DTYPE_F64 || dtype == DSV4_DTYPE_F8_E4M3 || dtype == DSV4_DTYPE_F8_E5M2;
}

bool dsv4_compare_bf16(const uint16_t *a, const uint16_t *b, int64_t n, dsv4_compare_metrics *m)
{
    return dsv4_compare_any(DSV4_DTYPE_BF16, a, b, n, m);
}

bool dsv4_compare_any(dsv4_dtype dtype, const void *a, const void *b, int64_t n, dsv4_compare_metrics *m)
{
    if (!m || !dsv4_compare_dtype_ok(dtype))
        return false;
    uint32_t *hist = calloc(65536, sizeof *hist);
    if (!hist)
        return false;
    const unsigned char *pa = a, *pb = b;
    memset(m, 0, sizeof *m);
    m->n = n < 0 ? 0 : n;
    double sab = 0, saa = 0, sbb = 0, sdd = 0;
    int64_t finite = 0;
    double x, y;
    uint64_t ma, mb;
    bool na, nb;
    for (int64_t i = 0; i < m->n; i++) {
        element(dtype, pa, i, &x, &ma, &na);
        element(dtype, pb, i, &y, &mb, &nb);
        if (!isfinite(y)) {
            m->ref_nonfinite++;
            /* Only the same infinity repeats a non-finite reference; a NaN pair is no agreement. */
            if (isnan(y) || x != y)
                m->ref_nonfinite_bad++;
            continue;
        }
        if (!isfinite(x)) {
            m->bad_nonfinite++;
            continue;
        }
        finite++;
        sab += x * y;
        saa += x * x;
        sbb += y * y;
        sdd += (x - y) * (x - y);
    }
    m->rms_ref = finite ? sqrt(sbb / (double)finite) : 0.0;
    double floor_ = 0.01 * m->rms_ref;
    if (floor_ <= 0)
        floor_ = 1e-30;
    uint64_t npairs = 0;
    for (int64_t i = 0; i < m->n; i++) {
        element(dtype, pa, i, &x, &ma, &na);
        element(dtype, pb, i, &y, &mb, &nb);
        if (!isfinite(y) || !isfinite(x))
            continue;
        double d = fabs(x - y), ay = fabs(y);
        if (d > m->max_abs)
            m->max_abs = d;
        double r = d / (ay > floor_ ? ay : floor_);
        if (r > m->max_rel)
            m->max_rel = r;
        if (d > DSV4_COMPARE_ATOL + DSV4_COMPARE_RTOL * ay)
            m->tol_violations++;
        /* Same sign: the magnitudes' difference; opposite signs: their sum (+0 and -0 are 0 apart). */
        uint64_t du = na == nb ? (ma > mb ? ma - mb : mb - ma) : (ma > UINT64_MAX - mb ? UINT64_MAX : ma + mb);
        if (du > 65535)
            du = 65535;
        if (du)
            m->ulp_nonzero++;
        hist[du]++;
        npairs++;
    }
    m->nmse = sbb > 0 ? sdd / sbb : (sdd > 0 ? INFINITY : 0.0);
    m->deepgemm_diff = saa + sbb > 0 ? 1.0 - 2.0 * sab / (saa + sbb) : 0.0;
    if (npairs) {
        const double qs[4] = {0.50, 0.90, 0.99, 0.999};
        uint32_t *outs[4] = {&m->ulp_p50, &m->ulp_p90, &m->ulp_p99, &m->ulp_p999};
        uint64_t cum = 0;
        int qi = 0;
        for (uint32_t d = 0; d < 65536 && qi < 4; d++) {
            cum += hist[d];
            while (qi < 4 && (double)cum >= qs[qi] * (double)npairs) {
                *outs[qi] = d;
                qi++;
            }
        }
        for (uint32_t d = 65535;; d--) {
            if (hist[d]) {
                m->ulp_max = d;
                break;
            }
            if (d == 0)
                break;
        }
    }
    m->finite_ok = m->bad_nonfinite == 0 && m->ref_nonfinite_bad == 0;
    free(hist);
    return true;
}

/* ---------------- tolerance rules (SPEC.md sections 9 and 10) ---------------- */

typedef struct {
    const char *name, *words;
    double diff;        /* deepgemm_diff < diff */
    int ulp_p99;        /* ulp_p99 <= this; -1: not a bound */
    double share;       /* elements beyond <= max(1, share n); < 0: not a bound */
    double rms_factor;  /* max_abs <= atol + rms_factor rms(ref); < 0: not a bound */
    bool terms;         /* beyond counts with the 2^-8 S term (the caller's count) */
} tol_rule;

static const tol_rule RULES[DSV4_TOL_COUNT] = {
    {"exact-bf16", "deepgemm_diff < 1e-4 and bf16 ULP p99 <= 1", 1e-4, 1, -1, -1, false},
    {"exact-quant",
     "deepgemm_diff < 1e-3, at most 0.5 % of the elements beyond atol = rtol = 0.035, max |a-b| <= 0.035 + 0.1 "
     "rms(reference)",
     1e-3, -1, 0.005, 0.1, false},
    {"fp8-mma",
     "deepgemm_diff < 1e-3, at most 2 % of the elements beyond atol = rtol = 0.035, max |a-b| <= 0.035 + 0.2 "
     "rms(reference)",
     1e-3, -1, 0.02, 0.2, false},
    {"outside", "deepgemm_diff < 1e-3, at most 0.5 % of the elements beyond atol + rtol |b| + 2^-8 S (atol = rtol = "
                "0.035, S the reference's y_terms)",
     1e-3, -1, 0.005, -1, true},
    {"outside-fp8-mma",
     "deepgemm_diff < 1e-3, at most 2 % of the elements beyond atol + rtol |b| + 2^-8 S (atol = rtol = 0.035, S the "
     "reference's y_terms)",
     1e-3, -1, 0.02, -1, true},
};

const char *dsv4_tolerance_name(dsv4_tolerance t) { return (unsigned)t < DSV4_TOL_COUNT ? RULES[t].name : "?"; }
const char *dsv4_tolerance_describe(dsv4_tolerance t) { return (unsigned)t < DSV4_TOL_COUNT ? RULES[t].words : "?"; }

bool dsv4_tolerance_parse(const char *name, dsv4_tolerance *out)
{
    for (int i = 0; name && i < DSV4_TOL_COUNT; i++)
        if (!strcmp(name, RULES[i].name)) {
            if (out)
                *out = (dsv4_tolerance)i;
            return true;
        }
    return false;
}

bool dsv4_compare_within(dsv4_tolerance t, const dsv4_compare_metrics *m, char *why, size_t size)
{
    return dsv4_compare_within_beyond(t, m, m ? m->tol_violations : 0, why, size);
}

int64_t dsv4_compare_beyond_terms(const uint16_t *a, const uint16_t *b, const float *terms, int64_t n)
{
    int64_t k = 0;
    for (int64_t i = 0; a && b && i < n; i++) {
        double x = dsv4_bf16_to_f32(a[i]), y = dsv4_bf16_to_f32(b[i]);
        if (!isfinite(x) || !isfinite(y))
            continue;
        double bound = DSV4_COMPARE_ATOL + DSV4_COMPARE_RTOL * fabs(y);
        if (terms)
            bound += DSV4_COMPARE_TERMS_SCALE * (double)terms[i];
        k += fabs(x - y) > bound;
    }
    return k;
}

bool dsv4_compare_within_beyond(dsv4_tolerance t, const dsv4_compare_metrics *m, int64_t beyond, char *why,
                                size_t size)
{
    char dummy[8];
    if (!why || !size) {
        why = dummy;
        size = sizeof dummy;
    }
    why[0] = '\0';
    if (!m || (unsigned)t >= DSV4_TOL_COUNT) {
        snprintf(why, size, "no metrics or an unknown rule");
        return false;
    }
    if (m->bad_nonfinite > 0 || m->ref_nonfinite_bad > 0) {
        snprintf(why, size,
                 "%lld NaN or Inf values where the reference is finite, %lld non-finite reference values not "
                 "repeated as the same infinity (NaN never agrees)",
                 (long long)m->bad_nonfinite, (long long)m->ref_nonfinite_bad);
        return false;
    }
    if (m->n == 0)
        return true;
    const tol_rule *r = &RULES[t];
    if (!r->terms)
        beyond = m->tol_violations;
    int64_t allowed = 0;
    if (r->share >= 0) {
        allowed = (int64_t)(r->share * (double)m->n);
        allowed = allowed > 1 ? allowed : 1;
    }
    double worst = DSV4_COMPARE_ATOL + (r->rms_factor >= 0 ? r->rms_factor : 0) * m->rms_ref;
    bool ok = m->deepgemm_diff < r->diff && (r->ulp_p99 < 0 || m->ulp_p99 <= (uint32_t)r->ulp_p99) &&
              (r->share < 0 || beyond <= allowed) && (r->rms_factor < 0 || m->max_abs <= worst);
    if (!ok) {
        if (r->ulp_p99 >= 0)
            snprintf(why, size, "%s tolerance (%s) broken: diff %.3g, ulp_p99 %u", r->name, r->words,
                     m->deepgemm_diff, m->ulp_p99);
        else if (r->terms)
            snprintf(why, size,
                     "%s tolerance (%s; here at most %lld elements) broken: diff %.3g, %lld beyond with S (%lld "
                     "without)",
                     r->name, r->words, (long long)allowed, m->deepgemm_diff, (long long)beyond,
                     (long long)m->tol_violations);
        else
            snprintf(why, size,
                     "%s tolerance (%s; here at most %lld elements, max |a-b| <= %.3g) broken: diff %.3g, %lld beyond, "
                     "max |a-b| %.3g",
                     r->name, r->words, (long long)allowed, worst, m->deepgemm_diff, (long long)m->tol_violations,
                     m->max_abs);
    }
    return ok;
}

void dsv4_compare_format(const dsv4_compare_metrics *m, char *buf, unsigned long size)
{
    if (!buf || !size)
        return;
    if (!m) {
        buf[0] = 0;
        return;
    }
    snprintf(buf, size,
             "n %lld max_abs %.4g max_rel %.4g nmse %.3g diff %.3g ulp p50/p90/p99/p99.9/max %u/%u/%u/%u/%u "
             "(%lld differ) tol_viol %lld bad_nonfinite %lld",
             (long long)m->n, m->max_abs, m->max_rel, m->nmse, m->deepgemm_diff, m->ulp_p50, m->ulp_p90, m->ulp_p99,
             m->ulp_p999, m->ulp_max, (long long)m->ulp_nonzero, (long long)m->tol_violations,
             (long long)m->bad_nonfinite);
    size_t len = strlen(buf);
    if (m->ref_nonfinite && len < size)
        snprintf(buf + len, size - len, " ref_nonfinite %lld (%lld not repeated)", (long long)m->ref_nonfinite,
                 (long long)m->ref_nonfinite_bad);
}
