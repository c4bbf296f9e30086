/*
 * dsv4moe: comparing a fast path's bf16 output with the reference's
 * (SPEC.md section 7). Every metric at once, so a report can say how two
 * outputs differ, not only whether they do.
 */
#ifndef DSV4MOE_COMPARE_H
#define DSV4MOE_COMPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/dtype.h"
#include "dsv4moe/safetensors.h"

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
    uint32_t ulp_p50, ulp_p90, ulp_p99, ulp_p999, ulp_max; /* ULP distance percentiles (finite pairs), in ULPs
                                                              of the dtype compared (bf16 for outputs y) */
    int64_t ulp_nonzero;     /* elements whose bf16 bits differ (as ordered values) */
    int64_t tol_violations;  /* elements with |a - b| > atol + rtol |b| (vLLM's tolerance) */
    int64_t bad_nonfinite;   /* a NaN or Inf where b is finite: never passes */
    int64_t ref_nonfinite;   /* b NaN or Inf (not compared) */
    bool finite_ok;          /* bad_nonfinite == 0 and ref_nonfinite_bad == 0 */
    int64_t ref_nonfinite_bad; /* b NaN or Inf and a not the same infinity (a NaN pair counts): never passes */
} dsv4_compare_metrics;

/*
 * Compares a (candidate) with b (reference), both bf16 [n]; fills *m.
 * n >= 0; a, b may be NULL when n == 0. Returns false (and fills nothing)
 * only when m is NULL or the histogram cannot be allocated.
 */
DSV4_API bool dsv4_compare_bf16(const uint16_t *a, const uint16_t *b, int64_t n, dsv4_compare_metrics *m);

/*
 * The same for any float dtype: F32, F64, F16, BF16, F8_E4M3 (fn: no infinity, 0x7F NaN) and
 * F8_E5M2; a and b hold n elements each (any alignment). The ULP distance is counted in the
 * dtype's own ULPs (capped at 65535). Returns false for another dtype, a NULL m, or no memory.
 */
DSV4_API bool dsv4_compare_any(dsv4_dtype dtype, const void *a, const void *b, int64_t n, dsv4_compare_metrics *m);

/* Element i of a float array (a dsv4_compare_dtype_ok dtype, any alignment) as a double; NaN otherwise. */
DSV4_API double dsv4_float_value(dsv4_dtype dtype, const void *p, int64_t i);

/* Whether dsv4_compare_any takes this dtype. */
DSV4_API bool dsv4_compare_dtype_ok(dsv4_dtype dtype);

/*
 * The tolerance rules of SPEC.md sections 9 and 10, one place for `run`, `diff` and `check`
 * (docs/scenarios.md, "Tolerance rules"). Every rule first requires finite_ok: a NaN or Inf
 * where the reference is finite, a non-finite reference value that a does not repeat as the
 * same infinity, or any NaN pair, fails.
 */
typedef enum dsv4_tolerance {
    /* gemm = exact on bf16 formats (the project's own backends): deepgemm_diff < 1e-4, ulp_p99 <= 1 */
    DSV4_TOL_EXACT_BF16 = 0,
    /* gemm = exact on fp8/fp4 formats (the project's own backends): deepgemm_diff < 1e-3,
       at most 0.5 % of the elements (at least 1) beyond atol = rtol = 0.035,
       max |a-b| <= 0.035 + 0.1 rms(reference) */
    DSV4_TOL_EXACT_QUANT = 1,
    /* gemm = fp8 (FP8 tensor-core accumulation): deepgemm_diff < 1e-3, at most 2 % beyond,
       max |a-b| <= 0.035 + 0.2 rms(reference) */
    DSV4_TOL_FP8_MMA = 2,
    /* outside engines (SPEC.md section 10), against the reference at the engine's rounding
       profile: deepgemm_diff < 1e-3 and at most 0.5 % of the elements (at least 1) beyond
       atol + rtol |b| + 2^-8 S (S the reference's y_terms; dsv4_compare_beyond_terms) */
    DSV4_TOL_OUTSIDE = 3,
    /* the same for an outside engine that accumulates on FP8 tensor cores: at most 2 % beyond */
    DSV4_TOL_OUTSIDE_FP8 = 4
} dsv4_tolerance;
#define DSV4_TOL_COUNT 5

/* The factor of S in the outside rules' bound (SPEC.md section 10.2). */
#define DSV4_COMPARE_TERMS_SCALE 0.00390625 /* 2^-8 */

/* "exact-bf16", "exact-quant", "fp8-mma", "outside", "outside-fp8-mma"; "?" otherwise. */
DSV4_API const char *dsv4_tolerance_name(dsv4_tolerance t);
/* Parses one of those names; false when unknown. */
DSV4_API bool dsv4_tolerance_parse(const char *name, dsv4_tolerance *out);
/* The rule in words, with its bounds (static text). */
DSV4_API const char *dsv4_tolerance_describe(dsv4_tolerance t);

/*
 * Applies rule t to metrics m: true within it. On false, `why` (when given) says which bound
 * broke, with the figures. An empty comparison (n == 0) is within every rule. The outside rules
 * count m->tol_violations here (S = 0: stricter than section 10); dsv4_compare_within_beyond
 * gives them the count with S.
 */
DSV4_API bool dsv4_compare_within(dsv4_tolerance t, const dsv4_compare_metrics *m, char *why, size_t size);

/*
 * SPEC.md section 10.2: the elements, finite in both a (candidate) and b (reference), with
 * |a_i - b_i| > atol + rtol |b_i| + 2^-8 terms_i; a, b bf16 [n], terms F32 [n] (the reference's
 * y_terms; NULL counts with S = 0, which is m.tol_violations). 0 when n <= 0 or a or b is NULL.
 */
DSV4_API int64_t dsv4_compare_beyond_terms(const uint16_t *a, const uint16_t *b, const float *terms, int64_t n);

/* dsv4_compare_within where the outside rules judge `beyond` (dsv4_compare_beyond_terms) in place
   of m->tol_violations; the other rules ignore it. */
DSV4_API bool dsv4_compare_within_beyond(dsv4_tolerance t, const dsv4_compare_metrics *m, int64_t beyond, char *why,
                                         size_t size);

/* ---------------- routing (topk_ids / topk_weights) ---------------- */

/* How a candidate marks a pruned top-p slot (SPEC.md section 3; the reference uses E). */
typedef enum dsv4_sentinel {
    DSV4_SENTINEL_E = 0,      /* id == E (n_routed_experts), weight 0 */
    DSV4_SENTINEL_MINUS1 = 1, /* id == -1, weight 0 */
    DSV4_SENTINEL_ABSENT = 2  /* pruned slots left out: the rows list their kept experts (K' <= K columns),
                                 any id outside [0, E) is padding, its weight 0 */
} dsv4_sentinel;

/* "E", "-1", "absent"; "?" otherwise. */
DSV4_API const char *dsv4_sentinel_name(dsv4_sentinel s);
/* Parses "E" (or "e"), "-1", "absent"; false when unknown. */
DSV4_API bool dsv4_sentinel_parse(const char *name, dsv4_sentinel *out);

/* Router weights are matched by expert id and compared in fp32 terms:
   |a - b| <= DSV4_ROUTING_WEIGHT_ATOL + DSV4_ROUTING_WEIGHT_RTOL |b| (about 84 fp32 ULPs, so fp32 against
   fp64 normalisation or another summation order passes; a bf16-rounded weight does not). */
#define DSV4_ROUTING_WEIGHT_ATOL 1e-6
#define DSV4_ROUTING_WEIGHT_RTOL 1e-5
/* The weights' rtol for an engine at the bf16_ops rounding profile (SPEC.md section 10: every elementwise
   result rounded to bf16, as eager PyTorch runs a bf16 model). Such an engine runs its router in bf16 too:
   the logits, the scores, their sum, the quotient and the route_scale product each rounded to bf16 put a
   weight up to about 6 bf16 roundings (2^-9 each) off, more where the score function's slope magnifies
   the logit's rounding. 2^-5: HF transformers 5.17's block in bfloat16 measured 1.15 %, an emulation
   of its router over 32 mini cases (hash and non-hash layers) 1.38 %; wrong weights (route_scale
   or the normalization dropped, another score function) are off by more. The
   ids are still compared exactly (routing is the same in every profile). */
#define DSV4_ROUTING_WEIGHT_RTOL_BF16 0.03125

typedef struct dsv4_routing_metrics {
    int64_t tokens;
    int64_t id_tokens_bad;   /* tokens whose sets of kept experts differ */
    int64_t malformed;       /* candidate entries neither an expert in [0, E) nor its sentinel (E, -1 conventions) */
    int64_t first_bad_token; /* -1 when none */
    char first_bad[256];     /* that token's two sets, or the malformed entry, in words */
    bool weights_compared;
    int64_t weights_n;       /* weights matched by expert id */
    int64_t weights_bad;     /* beyond the tolerance above, non-finite, or a non-zero weight on a pruned or padding slot */
    double weights_max_abs;  /* max |a - b| over matched weights */
    int64_t first_bad_weight_token; /* -1 when none */
    char first_bad_weight[160];
    double weights_rtol;     /* the rtol the weights were held to */
} dsv4_routing_metrics;

/*
 * Compares the candidate's routing (a) with the reference's (b) over T tokens and E experts.
 * ids_a [T, ka] in the candidate's sentinel convention; ids_b [T, kb] with the reference's (id E
 * pruned). Per token the kept experts are compared as multisets (slot order free). Weights
 * (w_a [T, ka], w_b [T, kb]; both or neither may be NULL) are matched by expert id. Returns false
 * only for bad arguments (m NULL, T < 0, ka or kb < 1 with T > 0, NULL ids with T > 0, out of memory).
 */
DSV4_API bool dsv4_compare_routing(int64_t T, int64_t E, int64_t ka, const int64_t *ids_a, const double *w_a,
                                   dsv4_sentinel sa, int64_t kb, const int64_t *ids_b, const double *w_b,
                                   dsv4_routing_metrics *m);
/* The same with the weights held to |a - b| <= DSV4_ROUTING_WEIGHT_ATOL + weights_rtol |b| (weights_rtol
   finite, >= DSV4_ROUTING_WEIGHT_RTOL and < 1; false otherwise). */
DSV4_API bool dsv4_compare_routing_rtol(int64_t T, int64_t E, int64_t ka, const int64_t *ids_a, const double *w_a,
                                        dsv4_sentinel sa, int64_t kb, const int64_t *ids_b, const double *w_b,
                                        double weights_rtol, dsv4_routing_metrics *m);

/* Ids identical as sets on every token, no malformed entry, every compared weight within tolerance. */
DSV4_API bool dsv4_routing_within(const dsv4_routing_metrics *m, char *why, size_t size);

/*
 * The same on safetensors tensors: ids I32 or I64 [T, k] (the candidate's k may differ from the
 * reference's), weights [T, k] of any dsv4_compare_dtype_ok dtype (both or neither NULL). Returns
 * false with a message in `msg` (naming the tensors and their shapes) when they do not fit
 * together or memory runs out; the tensors' names are those of the tensor infos.
 */
DSV4_API bool dsv4_compare_routing_tensors(int64_t E, const dsv4_tensor_info *ids_a, const dsv4_tensor_info *w_a,
                                           dsv4_sentinel sa, const dsv4_tensor_info *ids_b, const dsv4_tensor_info *w_b,
                                           dsv4_routing_metrics *m, char *msg, size_t size);
/* The same with the weights' rtol given (as dsv4_compare_routing_rtol). */
DSV4_API bool dsv4_compare_routing_tensors_rtol(int64_t E, const dsv4_tensor_info *ids_a,
                                                const dsv4_tensor_info *w_a, dsv4_sentinel sa,
                                                const dsv4_tensor_info *ids_b, const dsv4_tensor_info *w_b,
                                                double weights_rtol, dsv4_routing_metrics *m, char *msg, size_t size);

/* "[d0, d1, ...]" of a tensor into buf. */
DSV4_API void dsv4_tensor_shape_str(const dsv4_tensor_info *t, char *buf, size_t size);

/* One line "tokens .. id sets differ on .. weights .. max |dw| .." into buf. */
DSV4_API void dsv4_routing_format(const dsv4_routing_metrics *m, char *buf, size_t size);

/* One line "max_abs .. max_rel .. nmse .. diff .. ulp p50/p99/max .. tol .. nonfinite .." into buf. */
DSV4_API void dsv4_compare_format(const dsv4_compare_metrics *m, char *buf, unsigned long size);

#ifdef __cplusplus
}
#endif
#endif
