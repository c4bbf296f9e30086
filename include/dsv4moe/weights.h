/*
 * dsv4moe: a layer's weights as views into an open checkpoint.
 *
 * The views point into the checkpoint's read-only mappings (no copy); they
 * are valid while the checkpoint is open. Every tensor is checked against
 * the [N = out, K = in] contract of SPEC.md section 6 for its layout and
 * format, and a mismatch is an error naming the key, its dtype and shape,
 * and what was expected.
 */
#ifndef DSV4MOE_WEIGHTS_H
#define DSV4MOE_WEIGHTS_H

#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/alloc.h"
#include "dsv4moe/config.h"
#include "dsv4moe/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_proj {
    DSV4_PROJ_W1 = 0, /* gate, [I, H] */
    DSV4_PROJ_W3 = 1, /* up,   [I, H] */
    DSV4_PROJ_W2 = 2  /* down, [H, I] */
} dsv4_proj;

#define DSV4_SHARED_EXPERT (-1)

/* One [n, k] weight matrix in its stored format. Rows may be unaligned in memory. */
typedef struct dsv4_matrix_view {
    const char *key;                /* key of the weight tensor */
    dsv4_weight_format format;      /* as stored: bf16, fp8 (e4m3) or fp4 (packed e2m1) */
    dsv4_scale_format scale_format; /* fp8 only */
    int64_t n, k;
    const uint8_t *data;            /* row r starts at data + r * row_bytes */
    uint64_t row_bytes;
    const uint8_t *scales;          /* fp8: [ceil(n/128), ceil(k/128)]; fp4: [n, k/32]; NULL for bf16 */
} dsv4_matrix_view;

/* The router's tensors. Optional ones are NULL when the layer has none. */
typedef struct dsv4_router_view {
    const char *gate_key;
    const uint8_t *gate;        /* bf16 [E, H] */
    const uint8_t *bias;        /* f32 [E], non-hash layers (required); NULL on hash layers */
    const uint8_t *tid2eid;     /* i32 [V, K], hash layers */
    const uint8_t *pred_norm;   /* f32 [E], top_p_predictor const */
    const uint8_t *pred_weight; /* f32 [E, H], top_p_predictor linear */
    const uint8_t *pred_bias;   /* f32 [E], top_p_predictor linear */
} dsv4_router_view;

/*
 * The view of projection `proj` of routed expert `expert` (0 .. E-1) or of
 * the shared expert (DSV4_SHARED_EXPERT). Split layout: the tensor's dtype
 * must match the config's routed_format / shared_format (and weight_scale for
 * fp8). Stacked layout: bf16 whatever the config says (quantizing at load is
 * the consumer's choice).
 */
DSV4_API dsv4_status dsv4_weights_matrix(const dsv4_checkpoint *ckpt, const dsv4_config *cfg, int64_t expert,
                                         dsv4_proj proj, dsv4_matrix_view *out, dsv4_error *err);
/* The same checks and view, without reading the bytes (a checkpoint reads a tensor on first
   use): the view's data must not be read before dsv4_weights_matrix has been called for it.
   Lets a consumer check a whole layer at creation and read only the experts it runs. */
DSV4_API dsv4_status dsv4_weights_matrix_view(const dsv4_checkpoint *ckpt, const dsv4_config *cfg, int64_t expert,
                                              dsv4_proj proj, dsv4_matrix_view *out, dsv4_error *err);

/* The router tensors of cfg->layer: the bias required on non-hash layers (DSV4_ERR_NOT_FOUND
   naming the key and the files searched), tid2eid required on hash layers, and a tid2eid of a
   layer the config makes non-hash refused (DSV4_ERR_CONFIG: the table would be ignored);
   predictor tensors as configured. A non-finite value in the gate weight, the bias or the
   predictor's tensors is DSV4_ERR_NUMERIC naming the key and the element. */
DSV4_API dsv4_status dsv4_weights_router(const dsv4_checkpoint *ckpt, const dsv4_config *cfg, dsv4_router_view *out,
                                         dsv4_error *err);

/* The router's tensors unpacked into aligned arrays, as the backends compute with them. */
typedef struct dsv4_router_tensors {
    float *gate;         /* [E, H] (bf16 values) */
    float *bias;         /* [E] or NULL */
    int32_t *tid2eid;    /* [V, K] or NULL */
    float *pred_norm;    /* [E] or NULL */
    float *pred_w;       /* [E, H] or NULL */
    float *pred_b;       /* [E] or NULL */
} dsv4_router_tensors;

/* dsv4_weights_router, then unpacks every present tensor through `alloc` (NULL: the system
   allocator). On error nothing stays allocated. */
DSV4_API dsv4_status dsv4_router_tensors_load(const dsv4_checkpoint *ckpt, const dsv4_config *cfg,
                                              dsv4_allocator *alloc, dsv4_router_tensors *out, dsv4_error *err);
/* Releases what dsv4_router_tensors_load allocated (through the same allocator); zeroes *t.
   NULL is a no-op. */
DSV4_API void dsv4_router_tensors_release(dsv4_router_tensors *t, dsv4_allocator *alloc);

/*
 * The hash-layer input check of SPEC.md 2.3, before anything runs: on a hash layer input_ids must
 * be given (DSV4_ERR_INVALID_ARG, naming `who` and the layer), every id in [0, vocab_size) and
 * every tid2eid entry of its row in [0, n_routed_experts) (DSV4_ERR_RANGE naming `input_ids[t]`
 * or `tid2eid[id, k]`). tid2eid is int32 [V, K]. DSV4_OK on a non-hash layer or T == 0.
 */
DSV4_API dsv4_status dsv4_router_check_input_ids(const dsv4_config *cfg, const int32_t *tid2eid, int64_t tokens,
                                                 const int32_t *input_ids, const char *who, dsv4_error *err);

/* Dequantizes rows [n0, n0 + rows) of a view into out[rows, k] as fp32. */
DSV4_API void dsv4_matrix_dequant_rows(const dsv4_matrix_view *m, int64_t n0, int64_t rows, float *out);

/* Unaligned little-endian loads for the raw pointers of the views. */
DSV4_API float dsv4_load_bf16(const uint8_t *p, int64_t index);
DSV4_API float dsv4_load_f32(const uint8_t *p, int64_t index);
DSV4_API int32_t dsv4_load_i32(const uint8_t *p, int64_t index);

#ifdef __cplusplus
}
#endif
#endif
