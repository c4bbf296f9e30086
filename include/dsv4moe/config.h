/*
 * dsv4moe: the layer configuration (SPEC.md sections 1-5 and 8).
 *
 * The struct is versioned: callers fill it with dsv4_config_init() or
 * dsv4_config_preset(), which set `struct_size` and `version`; functions that
 * take a config reject one whose size or version they do not know, so a
 * library built against a newer header never reads past an older struct.
 */
#ifndef DSV4MOE_CONFIG_H
#define DSV4MOE_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "dsv4moe/api.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_CONFIG_VERSION 1

typedef enum dsv4_score_func {
    DSV4_SCORE_SQRTSOFTPLUS = 0, /* sqrt(softplus(l)); softplus(l) = l if l > 20 else log1p(exp(l)) */
    DSV4_SCORE_SIGMOID = 1,
    DSV4_SCORE_SOFTMAX = 2 /* over the E logits; weights are not renormalised */
} dsv4_score_func;

typedef enum dsv4_gate_logits {
    DSV4_GATE_LOGITS_FP32 = 0,
    DSV4_GATE_LOGITS_BF16 = 1 /* logits rounded to bf16 before scoring (rtp-llm default) */
} dsv4_gate_logits;

typedef enum dsv4_weight_point {
    DSV4_WEIGHT_BEFORE_W2 = 0, /* h *= w before the down projection (official) */
    DSV4_WEIGHT_AFTER_W2 = 1   /* y += w * (h . W2^T) (rtp GroupedFP4, HF transformers) */
} dsv4_weight_point;

typedef enum dsv4_top_p_predictor {
    DSV4_PREDICTOR_NONE = 0,  /* n = 1 */
    DSV4_PREDICTOR_CONST = 1, /* n = norm[e], a per-expert fp32 vector */
    DSV4_PREDICTOR_LINEAR = 2 /* n = max(0, P[e,:] . x + p0[e]) */
} dsv4_top_p_predictor;

typedef enum dsv4_weight_format {
    DSV4_FORMAT_BF16 = 0,
    DSV4_FORMAT_FP8 = 1, /* e4m3fn with 128x128 block scales */
    DSV4_FORMAT_FP4 = 2  /* e2m1 with 1x32 ue8m0 scales (routed experts only) */
} dsv4_weight_format;

typedef enum dsv4_scale_format {
    DSV4_SCALE_UE8M0 = 0,
    DSV4_SCALE_FP32 = 1
} dsv4_scale_format;

typedef enum dsv4_act_quant {
    DSV4_ACT_QUANT_NONE = 0,  /* bf16 activations into every GEMM */
    DSV4_ACT_QUANT_UE8M0 = 1, /* 1x128 groups, power-of-two scale */
    DSV4_ACT_QUANT_FP32 = 2   /* 1x128 groups, scale amax / 448 */
} dsv4_act_quant;

/*
 * How a fast path sums the products of its fp8/fp4 GEMMs (SPEC.md section 9). Not a property of
 * the layer: the reference ignores it; the planner resolves auto and refuses what a backend
 * cannot do (dsv4_plan_gemm).
 */
typedef enum dsv4_gemm_mode {
    DSV4_GEMM_AUTO = 0,  /* fp8 on backend cuda for fp8/fp4 weights with quantized activations, exact elsewhere */
    DSV4_GEMM_EXACT = 1, /* every product exact in fp32, sums in a fixed order (bit-faithful products) */
    DSV4_GEMM_FP8 = 2    /* e4m3 tensor-core MMA, fp32 promotion every 128 of K (backend cuda only) */
} dsv4_gemm_mode;

/*
 * One DSV4 MoE layer. Field names are the SPEC.md section 8 keys.
 * act_quant applies before fp8 and fp4 GEMMs only; bf16 GEMMs always take
 * bf16 activations, so "none when both formats are bf16" needs no special case.
 */
typedef struct dsv4_config {
    uint32_t struct_size; /* sizeof(dsv4_config), set by init/preset */
    uint32_t version;     /* DSV4_CONFIG_VERSION */

    int64_t dim;              /* H */
    int64_t moe_inter_dim;    /* I */
    int64_t n_routed_experts; /* E */
    int64_t n_activated;      /* K */
    int64_t n_shared_experts; /* 0 or 1 */
    int64_t n_hash_layers;    /* layers with id < this route through tid2eid */
    int64_t vocab_size;       /* V */
    int64_t n_layers;         /* layers of the model; layer must be below it */
    int64_t layer;            /* this layer's id; -1 = not set (required) */

    dsv4_score_func score_func;
    dsv4_gate_logits gate_logits;
    float route_scale;
    float norm_eps;
    float swiglu_limit; /* L; 0 disables the clamp */
    bool shared_clamp;
    dsv4_weight_point weight_point;

    float top_p; /* 1 disables pruning */
    int64_t top_p_min_keep;
    bool top_p_renorm;
    dsv4_top_p_predictor top_p_predictor;

    dsv4_weight_format routed_format;
    dsv4_weight_format shared_format;
    dsv4_scale_format weight_scale; /* scale format of fp8 weights */
    dsv4_act_quant act_quant;
    dsv4_gemm_mode gemm; /* the fast paths' numerics mode (added at the end: struct_size tells) */
} dsv4_config;

/* Fills `cfg` with the v4-flash preset and layer = -1. NULL is a no-op. */
DSV4_API void dsv4_config_init(dsv4_config *cfg);

/*
 * Fills `cfg` with a named preset (layer = -1):
 *   v4-flash, v4-pro   the real shapes (fp4 routed, fp8 ue8m0 shared);
 *   v4-flash-base      v4-flash with fp8 routed experts and fp32 scales;
 *   mini               H 256, I 128, E 16, K 4, V 512, 1 hash layer of 4, fp4/fp8;
 *   mini-fp8           mini with fp8 routed experts, fp32 weight scales, fp32 act scales;
 *   mini-bf16          mini with bf16 weights and no activation quantization;
 *   mini-topp          mini with top_p 0.8, linear predictor, min_keep 1;
 *   tiny               H 128, I 128, E 8, K 2, V 64, 1 hash layer of 2, bf16.
 * Unknown names give DSV4_ERR_CONFIG with the list of known presets.
 */
DSV4_API dsv4_status dsv4_config_preset(const char *name, dsv4_config *cfg, dsv4_error *err);

/* NULL-terminated list of preset names. */
DSV4_API const char *const *dsv4_config_preset_names(void);

/*
 * Checks every field against SPEC.md (K in [1, E], H and I multiples of 128
 * when an fp8 format is used and of 32 for fp4, L >= 0 and finite,
 * route_scale > 0, top_p in (0, 1], top_p_min_keep in [1, K], layer in
 * [0, n_layers), enums in range, struct_size and version known).
 * The first violation is reported naming the field, its value and the range.
 */
DSV4_API dsv4_status dsv4_config_validate(const dsv4_config *cfg, dsv4_error *err);

/*
 * Sets one field by its SPEC.md section 8 key from text ("top_p", "0.9").
 * Numbers must parse completely; enums and booleans take the names of the
 * spec (true/false). Only the value's syntax is checked here, so keys can be
 * set in any order (n_activated before n_routed_experts); ranges, including
 * those between fields, are dsv4_config_validate's, which every consumer of a
 * config calls. On error the config is unchanged.
 */
DSV4_API dsv4_status dsv4_config_set(dsv4_config *cfg, const char *key, const char *value, dsv4_error *err);

/* Same as dsv4_config_set for one "key=value" string. */
DSV4_API dsv4_status dsv4_config_set_kv(dsv4_config *cfg, const char *key_value, dsv4_error *err);

/*
 * Writes the value of `key` as text into buf (always NUL-terminated when
 * size > 0). DSV4_ERR_NOT_FOUND for an unknown key.
 */
DSV4_API dsv4_status dsv4_config_get(const dsv4_config *cfg, const char *key, char *buf, size_t size, dsv4_error *err);

/*
 * Applies a config file: one `key = value` (or `key: value`) per line, the
 * keys of dsv4_config_set; blank lines and `#` comments are ignored. Errors
 * name the place as file:line:col. On error the config is unchanged.
 */
DSV4_API dsv4_status dsv4_config_load_file(dsv4_config *cfg, const char *path, dsv4_error *err);

/* NULL-terminated list of every settable key, in SPEC.md order. */
DSV4_API const char *const *dsv4_config_keys(void);

/* True when `cfg->layer` routes through tid2eid (layer < n_hash_layers). */
DSV4_API bool dsv4_config_is_hash_layer(const dsv4_config *cfg);

/* Names of enum values as used in config files ("sqrtsoftplus", "fp4", ...). */
DSV4_API const char *dsv4_score_func_name(dsv4_score_func v);
DSV4_API const char *dsv4_weight_format_name(dsv4_weight_format v);
DSV4_API const char *dsv4_act_quant_name(dsv4_act_quant v);
DSV4_API const char *dsv4_gemm_mode_name(dsv4_gemm_mode v); /* "auto", "exact", "fp8" */

#ifdef __cplusplus
}
#endif
#endif
