/* Comparison metrics of SPEC.md section 7 (dsv4moe/compare.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/compare.h"

static float bf(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 bits as a monotone integer: the ULP distance is the difference. */
static int32_t ordered(uint16_t v) { return v & 0x8000u ? -(int32_t)(v & 0x7FFFu) : (int32_t)v; }

bool dsv4_compare_bf16(const uint16_t *a, const uint16_t *b, int64_t n, dsv4_compare_metrics *m)
{
    if (!m)
        return false;
    uint32_t *hist = calloc(65536, sizeof *hist);
    if (!hist)
        return false;
    memset(m, 0, sizeof *m);
    m->n = n < 0 ? 0 : n;
    double sab = 0, saa = 0, sbb = 0, sdd = 0;
    int64_t finite = 0;
    for (int64_t i = 0; i < m->n; i++) {
        float x = bf(a[i]), y = bf(b[i]);
        if (!isfinite(y)) {
            m->ref_nonfinite++;
            continue;
        }
        if (!isfinite(x)) {
            m->bad_nonfinite++;
            continue;
        }
        finite++;
        sab += (double)x * y;
        saa += (double)x * x;
        sbb += (double)y * y;
        sdd += ((double)x - y) * ((double)x - y);
    }
    m->rms_ref = finite ? sqrt(sbb / (double)finite) : 0.0;
    double floor_ = 0.01 * m->rms_ref;
    if (floor_ <= 0)
        floor_ = 1e-30;
    uint64_t npairs = 0;
    for (int64_t i = 0; i < m->n; i++) {
        float x = bf(a[i]), y = bf(b[i]);
        if (!isfinite(y) || !isfinite(x))
            continue;
        double d = fabs((double)x - y), ay = fabs((double)y);
        if (d > m->max_abs)
            m->max_abs = d;
        double r = d / (ay > floor_ ? ay : floor_);
        if (r > m->max_rel)
            m->max_rel = r;
        if (d > DSV4_COMPARE_ATOL + DSV4_COMPARE_RTOL * ay)
            m->tol_violations++;
        int32_t u = ordered(a[i]) - ordered(b[i]);
        uint32_t du = (uint32_t)(u < 0 ? -u : u);
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
    m->finite_ok = m->bad_nonfinite == 0;
    free(hist);
    return true;
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
}
