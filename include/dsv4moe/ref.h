/*
 * dsv4moe: the deterministic CPU reference of the DSV4 MoE layer (SPEC.md
 * sections 2-5). The oracle every fast path is compared with.
 *
 * Bit-reproducible: the same inputs give the same bytes on any machine and
 * at any thread count. Dot products accumulate in double in ascending index
 * order (products of two floats are exact in double), then round once to
 * fp32; transcendental functions are the library's own (ref/mathf.c), not
 * libm's; the library is compiled with -ffp-contract=off; routed experts are
 * accumulated into y in ascending expert id, then the shared expert is added.
 */
#ifndef DSV4MOE_REF_H
#define DSV4MOE_REF_H

#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/config.h"
#include "dsv4moe/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_ref dsv4_ref;

/* The most tokens one forward takes. */
#define DSV4_REF_MAX_TOKENS (1 << 24)

/* What the reference saw in one forward, so reports can explain a difference. */
typedef struct dsv4_ref_stats {
    int64_t tokens;
    int64_t nonfinite_rows;    /* rows whose logits or routing weights were not finite (SPEC.md 2.5) */
    int64_t kept_slots;        /* routed (token, expert) pairs computed */
    int64_t pruned_slots;      /* slots set to the sentinel by top-p */
    uint64_t routed_values;    /* g (and u) values of routed experts */
    uint64_t routed_g_clamped; /* g > L */
    uint64_t routed_u_clamped; /* |u| > L */
    uint64_t shared_values;
    uint64_t shared_g_clamped;
    uint64_t shared_u_clamped;
} dsv4_ref_stats;

/*
 * Outputs of dsv4_ref_forward; the caller owns the buffers. y is required,
 * the others may be NULL.
 */
typedef struct dsv4_ref_output {
    uint16_t *y;           /* bf16 [T, H] */
    int32_t *topk_ids;     /* [T, K] after pruning: pruned slots hold E (the sentinel) */
    float *topk_weights;   /* [T, K] after pruning: pruned slots hold 0 */
    int32_t *kept_counts;  /* [T] routed experts kept per token */
    dsv4_ref_stats stats;  /* filled by every successful forward */
} dsv4_ref_output;

/*
 * Validates cfg and binds the layer cfg->layer of an open checkpoint (either
 * layout). Every tensor the layer needs is checked against the [N, K]
 * contract now, so a bad checkpoint fails here, naming the key. When the
 * checkpoint holds bf16 (stacked layout) and the config asks for fp8 or fp4,
 * the weights are quantized here exactly as dsv4_quant_* do. `threads` >= 1;
 * the results do not depend on it. The checkpoint must outlive the handle.
 */
DSV4_API dsv4_status dsv4_ref_create(const dsv4_config *cfg, const dsv4_checkpoint *ckpt, int threads, dsv4_ref **out,
                                     dsv4_error *err);
/* NULL is a no-op. */
DSV4_API void dsv4_ref_free(dsv4_ref *ref);
/* The config the handle was created with. */
DSV4_API const dsv4_config *dsv4_ref_config(const dsv4_ref *ref);

/*
 * Runs the layer on T tokens (T >= 0) in the handle's rounding profile
 * (dsv4_ref_set_rounding; section 4 as written unless set): x bf16 [T, H],
 * input_ids [T] (used by hash layers; may be NULL on other layers). An input id outside [0, V) or a
 * tid2eid entry outside [0, E) is DSV4_ERR_RANGE naming the token and value;
 * nothing is written to the outputs then.
 */
DSV4_API dsv4_status dsv4_ref_forward(dsv4_ref *ref, int64_t tokens, const uint16_t *x, const int32_t *input_ids,
                                      dsv4_ref_output *out, dsv4_error *err);

/*
 * The layer's stages, the pieces dsv4_ref_forward is composed of, for a run sharded over ranks
 * (fast/multirank drives them through the ref backend's stage table): each value is computed with
 * the forward's operations, so an expert-parallel run is bit-identical to one forward.
 *
 * dsv4_ref_stage_route: n tokens (x bf16 [n, H]; input_ids [n], required on hash layers and
 * checked as dsv4_ref_forward does) to ids, w [n, K] (pruned slots E and 0); kept [n] may be NULL.
 * nonfinite_rows (may be NULL) gets the count of rows with non-finite logits or weights added.
 */
DSV4_API dsv4_status dsv4_ref_stage_route(const dsv4_ref *ref, int64_t n, const uint16_t *x, const int32_t *input_ids,
                                          int32_t *ids, float *w, int32_t *kept, uint64_t *nonfinite_rows,
                                          dsv4_error *err);
/*
 * The FFN of m token-slots grouped by expert: x bf16 [m, H], expert[m] ascending runs of routed
 * ids (or DSV4_SHARED_EXPERT), w[m] router weights (NULL for the shared expert), intermediate
 * rows [i0, i0 + ni) (i0 and ni multiples of 128, or the whole [0, I)). out [m, H] fp32 gets the
 * down projection summed over those rows, not rounded: over [0, I), bf16(out) is the expert
 * output. Clamp hits are added to stats (routed or shared counters; may be NULL).
 */
DSV4_API dsv4_status dsv4_ref_stage_experts(const dsv4_ref *ref, int64_t m, const uint16_t *x, const int32_t *expert,
                                            const float *w, int64_t i0, int64_t ni, float *out, dsv4_ref_stats *stats,
                                            dsv4_error *err);
/*
 * y[t] = bf16(sum over the slots s with tok[s] == t, in the order given, of o_s (before_w2) or
 * w_s o_s (after_w2), in fp32, plus shared[t]) for t in [0, n). o bf16 [ns, H]; shared bf16
 * [n, H] or NULL. Giving the slots in ascending expert id reproduces dsv4_ref_forward.
 */
DSV4_API dsv4_status dsv4_ref_stage_combine(const dsv4_ref *ref, int64_t n, int64_t ns, const int32_t *tok,
                                            const float *w, const uint16_t *o, const uint16_t *shared, uint16_t *y,
                                            dsv4_error *err);

/*
 * Rounding profiles (SPEC.md section 10): where an outside engine rounds before an activation
 * quantization, so that a check computes the expected output at the engine's own rounding
 * points. A key of the check, not of the model (the config, the planner and the fast paths do
 * not know it); routing is the same in every profile, and each profile is bit-reproducible.
 *   DSV4_ROUNDING_SPEC      section 4 as written (the default; the canonical hashes)
 *   DSV4_ROUNDING_BF16_OPS  every elementwise result rounded to bf16, as eager PyTorch runs a
 *                           bf16 model: silu(g) before the product, silu(g) u, h w (before_w2)
 *                           or w o (after_w2)
 *   DSV4_ROUNDING_FP32      g, u, h, o and the shared expert's output kept in fp32; h quantized
 *                           from fp32 (a model run in fp32; a fused SwiGLU + quantization epilogue)
 */
typedef enum dsv4_rounding {
    DSV4_ROUNDING_SPEC = 0,
    DSV4_ROUNDING_BF16_OPS = 1,
    DSV4_ROUNDING_FP32 = 2,
} dsv4_rounding;
#define DSV4_ROUNDING_COUNT 3

/* "spec", "bf16_ops", "fp32"; NULL outside the enum. */
DSV4_API const char *dsv4_rounding_name(dsv4_rounding r);
/* The profile named s; anything else is DSV4_ERR_INVALID_ARG naming the value and the three names. */
DSV4_API dsv4_status dsv4_rounding_parse(const char *s, dsv4_rounding *out, dsv4_error *err);

/* The profile of the handle's forwards (DSV4_ROUNDING_SPEC after create). Not while a forward
   runs on the handle. The stages above always compute section 4 as written. */
DSV4_API dsv4_status dsv4_ref_set_rounding(dsv4_ref *ref, dsv4_rounding rounding, dsv4_error *err);
DSV4_API dsv4_rounding dsv4_ref_rounding(const dsv4_ref *ref);

/*
 * dsv4_ref_forward in the handle's profile, also giving y_terms (F32 [T, H], may be NULL): per
 * output element S = |s| + sum_k |o_k| in fp32 (SPEC.md section 10.2), s the shared expert's
 * output and o_k the k-th kept expert's weighted output (o at before_w2, w o at after_w2) as
 * the profile computes them, summed in ascending expert id before |s| is added. The bound of
 * the rounding an engine may do after its last quantization.
 */
DSV4_API dsv4_status dsv4_ref_forward_terms(dsv4_ref *ref, int64_t tokens, const uint16_t *x,
                                            const int32_t *input_ids, dsv4_ref_output *out, float *y_terms,
                                            dsv4_error *err);

/*
 * Alternate models: the layer computed the way a known-wrong engine computes it, one bit per way
 * (docs/engines.md's catalogue names where each was reported). `dsv4moe check` holds a failing
 * engine's output to each to name the likely cause; no expected output is ever computed with one.
 * They apply to the handle's forwards (and to the stages' routing and FFNs); 0 (after create) is
 * SPEC.md as written.
 */
typedef enum dsv4_ref_alternate {
    DSV4_ALT_ROUTED_CLAMP_OFF = 1u << 0,      /* routed experts' g and u not clamped */
    DSV4_ALT_SHARED_CLAMP_OFF = 1u << 1,      /* the shared expert's not clamped */
    DSV4_ALT_GATE_CLAMP_BOTH_SIDES = 1u << 2, /* g clamped to [-L, L] (the contract: from above) */
    DSV4_ALT_UP_CLAMP_ONE_SIDE = 1u << 3,     /* u clamped from above only (the contract: both sides) */
    DSV4_ALT_ACT_SCALE_PER_TOKEN = 1u << 4,   /* one activation scale per row of an FFN's input */
    DSV4_ALT_ACT_SCALE_PER_TENSOR = 1u << 5,  /* one for all the rows one FFN runs */
    DSV4_ALT_SHARED_ROUTE_SCALED = 1u << 6,   /* the shared expert's output times route_scale */
    DSV4_ALT_WEIGHTS_UNNORMALIZED = 1u << 7,  /* weights the selected scores times route_scale */
    DSV4_ALT_BIAS_IN_WEIGHTS = 1u << 8,       /* weights from score + bias (normalised) */
    DSV4_ALT_HASH_FIRST_ID = 1u << 9,         /* hash layers: every token routed as input id 0 */
    DSV4_ALT_HASH_UNIFORM = 1u << 10,         /* hash layers: every weight route_scale / K */
    DSV4_ALT_HASH_IDS_BF16 = 1u << 11,        /* tid2eid entries rounded to bf16; an id past E-1 is the
                                                 sentinel E, its expert not run */
    DSV4_ALT_PRUNED_AS_EXPERT0 = 1u << 12,    /* top-p: a pruned slot computed as expert 0, weight kept */
    DSV4_ALT_TP2_FP4_SCALES = 1u << 13,       /* fp4 routed experts split over two tensor-parallel shards
                                                 of the intermediate dimension, the second reading the first's
                                                 scale blocks (set before the handle's first forward) */
} dsv4_ref_alternate;
#define DSV4_ALT_ALL ((1u << 14) - 1)

/* Sets the handle's alternates (an OR of dsv4_ref_alternate; bits outside DSV4_ALT_ALL are
   DSV4_ERR_INVALID_ARG). Not while a forward runs on the handle. */
DSV4_API dsv4_status dsv4_ref_set_alternates(dsv4_ref *ref, unsigned alternates, dsv4_error *err);

/* FNV-1a 64 of y, then topk_ids, then topk_weights (those given), as raw bytes. */
DSV4_API uint64_t dsv4_ref_hash(const dsv4_config *cfg, int64_t tokens, const dsv4_ref_output *out);

#ifdef __cplusplus
}
#endif
#endif
