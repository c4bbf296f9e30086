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
#include "config.h"
#include "safetensors.h"

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
dsv4_status dsv4_ref_create(const dsv4_config *cfg, const dsv4_checkpoint *ckpt, int threads, dsv4_ref **out,
                            dsv4_error *err);
/* NULL is a no-op. */
void dsv4_ref_free(dsv4_ref *ref);
/* The config the handle was created with. */
const dsv4_config *dsv4_ref_config(const dsv4_ref *ref);

/*
 * Runs the layer on T tokens (T >= 0): x bf16 [T, H], input_ids [T] (used by
 * hash layers; may be NULL on other layers). An input id outside [0, V) or a
 * tid2eid entry outside [0, E) is DSV4_ERR_RANGE naming the token and value;
 * nothing is written to the outputs then.
 */
dsv4_status dsv4_ref_forward(dsv4_ref *ref, int64_t tokens, const uint16_t *x, const int32_t *input_ids,
                             dsv4_ref_output *out, dsv4_error *err);

/* FNV-1a 64 of y, then topk_ids, then topk_weights (those given), as raw bytes. */
uint64_t dsv4_ref_hash(const dsv4_config *cfg, int64_t tokens, const dsv4_ref_output *out);

#ifdef __cplusplus
}
#endif
#endif
