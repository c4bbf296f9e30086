/*
 * dsv4moe: deterministic synthetic layers and inputs.
 *
 * Every element is a pure function of (seed, logical tensor name, element
 * index) through dsv4moe/rng.h, so files are identical whatever the thread
 * count, and the split and stacked layouts of the same seed hold the same
 * layer (the stacked one in bf16, the split one quantized as configured).
 *
 * Distributions (chosen so that routing is spread and the SwiGLU clamp is
 * exercised, see docs/data.md): x ~ N(0, 1) per element with 1 in 64 hidden
 * channels scaled by 4 (activation outliers); gate rows ~ N(0, 1/H); bias
 * ~ N(0, 0.1^2); w1 and w3 rows scaled so that g and u have a standard
 * deviation of about 4 (so |u| > 10 for about 1 % of values) with a per-expert
 * factor in [0.8, 1.2); w2 ~ N(0, 0.25/I); tid2eid rows are K distinct
 * experts; the norm predictor's tensors are written when top_p < 1 asks for them.
 */
#ifndef DSV4MOE_GEN_H
#define DSV4MOE_GEN_H

#include <stdbool.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/config.h"
#include "dsv4moe/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_gen_options {
    uint32_t struct_size; /* sizeof(dsv4_gen_options), set by init */
    uint64_t seed;
    int threads;          /* worker threads; the output does not depend on it */
    dsv4_layout layout;   /* DSV4_LAYOUT_SPLIT (default) or DSV4_LAYOUT_STACKED (bf16) */
    bool model_prefix;    /* stacked only: keys start with "model." */
    /* Called by dsv4_gen_weights after each tensor with the bytes written and the layer's total (a
       v4-flash layer is 3.4 GB and takes a minute: the CLI's progress line). NULL: none. A caller
       built before these two fields passes their offset as struct_size and gets none. */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *progress_user;
} dsv4_gen_options;

/* seed 1, 1 thread, split layout. NULL is a no-op. */
DSV4_API void dsv4_gen_options_init(dsv4_gen_options *opt);

/* Writes the weights of cfg->layer (validated first) to one safetensors file, atomically. */
DSV4_API dsv4_status dsv4_gen_weights(const dsv4_config *cfg, const dsv4_gen_options *opt, const char *path,
                                      dsv4_error *err);

/* Writes x BF16 [tokens, H] and input_ids I32 [tokens] (tokens >= 0), atomically. */
DSV4_API dsv4_status dsv4_gen_input(const dsv4_config *cfg, const dsv4_gen_options *opt, int64_t tokens,
                                    const char *path, dsv4_error *err);

/* How often the SwiGLU clamp would act on a sample of the generated data. */
typedef struct dsv4_clamp_probe {
    int64_t tokens, experts;  /* the sample: first tokens of the input x first experts */
    uint64_t values;          /* g (and u) values looked at */
    uint64_t g_clamped;       /* g > L */
    uint64_t u_clamped;       /* |u| > L */
} dsv4_clamp_probe;

/*
 * Computes g = bf16(act_quant(x) . W1^T) and u likewise for the first
 * max_tokens tokens of `input` against the first max_experts routed experts
 * of the checkpoint, as stored (dequantized), and counts the values past
 * swiglu_limit. This measures the data, not a backend.
 */
DSV4_API dsv4_status dsv4_gen_probe_clamp(const dsv4_checkpoint *ckpt, const dsv4_config *cfg,
                                          const dsv4_st_file *input, int64_t max_tokens, int64_t max_experts,
                                          dsv4_clamp_probe *out, dsv4_error *err);

#ifdef __cplusplus
}
#endif
#endif
