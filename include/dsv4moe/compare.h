/*
 * dsv4moe: comparing a fast path's bf16 output with the reference's
 * (SPEC.md section 7). Every metric at once, so a report can say how two
 * outputs differ, not only whether they do.
 */
#ifndef DSV4MOE_COMPARE_H
#define DSV4MOE_COMPARE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The vLLM block-FP8 MoE test tolerance (atol = rtol = 0.035). */
#define DSV4_COMPARE_ATOL 0.035
#define DSV4_COMPARE_RTOL 0.035

typedef struct dsv4_compare_metrics {
    int64_t n;               /* elements compared */
    double max_abs;          /* max |a - b| over elements finite in both */
    double max_rel;          /* max |a - b| / max(|b|, 0.01 rms(b)): the floor keeps near-zero values meaningful */
    double nmse;             /* sum (a - b)^2 / sum b^2 (0 when b is all zero and a == b) */
    double deepgemm_diff;    /* 1 - 2 sum(ab) / sum(a^2 + b^2), DeepGEMM's calc_diff (its tests: < 1e-3) */
    double rms_ref;          /* sqrt(mean b^2) */
    uint32_t ulp_p50, ulp_p90, ulp_p99, ulp_p999, ulp_max; /* bf16 ULP distance percentiles (finite pairs) */
    int64_t ulp_nonzero;     /* elements whose bf16 bits differ (as ordered values) */
    int64_t tol_violations;  /* elements with |a - b| > atol + rtol |b| (vLLM's tolerance) */
    int64_t bad_nonfinite;   /* a NaN or Inf where b is finite: never passes */
    int64_t ref_nonfinite;   /* b NaN or Inf (not compared) */
    bool finite_ok;          /* bad_nonfinite == 0 */
} dsv4_compare_metrics;

/*
 * Compares a (candidate) with b (reference), both bf16 [n]; fills *m.
 * n >= 0; a, b may be NULL when n == 0. Returns false (and fills nothing)
 * only when m is NULL or the histogram cannot be allocated.
 */
bool dsv4_compare_bf16(const uint16_t *a, const uint16_t *b, int64_t n, dsv4_compare_metrics *m);

/* One line "max_abs .. max_rel .. nmse .. diff .. ulp p50/p99/max .. tol .. nonfinite .." into buf. */
void dsv4_compare_format(const dsv4_compare_metrics *m, char *buf, unsigned long size);

#ifdef __cplusplus
}
#endif
#endif
