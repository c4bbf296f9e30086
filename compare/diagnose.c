/*
 * Naming the likely class of a failing engine (compare/diagnose.h): the case's layer computed
 * again with each known-wrong alternate of the reference (dsv4moe/ref.h) or config change, and
 * the engine's output held to each with the check's own rule; two classes are seen in the
 * output's pattern instead (magnitudes, one expert's tokens).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/diagnose.h"
#include "dsv4moe/formats.h"

typedef enum { BY_PADDING, BY_MEMORY, BY_PROFILE, BY_ALT, BY_WEIGHT_POINT, BY_ROUTE_SCALE_TWICE, BY_RENORM, BY_MAGNITUDE, BY_ONE_EXPERT } how;
typedef enum {
    ON_ANY, ON_HASH, ON_HASH_WIDE, ON_TOPP, ON_NOT_HASH, ON_NORMALISED, ON_CLAMP, ON_SHARED_CLAMP, ON_SHARED,
    ON_ACT_QUANT, ON_UE8M0, ON_FP4_TP
} where;

static const struct {
    dsv4_check_class c;
    how by;
    unsigned alt;
    where on;
} CAT[] = {
    {{"padding_leaks", "padded rows leaking into valid rows (the tokens' inputs are finite; the NaN came from "
                       "the padding)", "vLLM 51593", true}, BY_PADDING, 0, ON_ANY},
    {{"rounding_profile", "the engine rounds at another profile than the one it is held to (declare it in "
                          "engine_rounding)", "SPEC.md section 10", false}, BY_PROFILE, 0, ON_ANY},
    {{"tid2eid_through_bf16", "the hash table's expert ids rounded through bf16 (383 read as 384)",
      "verl-ascend-recipe 126", true}, BY_ALT, DSV4_ALT_HASH_IDS_BF16, ON_HASH_WIDE},
    {{"hash_without_ids", "hash routing without the input ids (every token routed as id 0)",
      "TensorRT-LLM 13442 review", true}, BY_ALT, DSV4_ALT_HASH_FIRST_ID, ON_HASH},
    {{"hash_uniform_weights", "hash-layer weights uniform, route_scale / K", "pie 480", true}, BY_ALT,
     DSV4_ALT_HASH_UNIFORM, ON_HASH},
    {{"topp_slot_as_expert0", "a pruned top-p slot computed as expert 0 with its weight",
      "the review in shared/seed", true}, BY_ALT, DSV4_ALT_PRUNED_AS_EXPERT0, ON_TOPP},
    {{"topp_renorm_switched", "top-p renormalization switched (SPEC.md section 3's top_p_renorm)",
      "SPEC.md section 3", true}, BY_RENORM, 0, ON_TOPP},
    {{"weights_not_normalized", "router weights not renormalized after top-k", "V3-family ports", true}, BY_ALT,
     DSV4_ALT_WEIGHTS_UNNORMALIZED, ON_NORMALISED},
    {{"bias_in_weights", "the selection bias kept in the router weights", "V3-family ports", true}, BY_ALT,
     DSV4_ALT_BIAS_IN_WEIGHTS, ON_NOT_HASH},
    {{"route_scale_twice", "route_scale applied twice", "common in ports", true}, BY_ROUTE_SCALE_TWICE, 0, ON_ANY},
    {{"routed_clamp_dropped", "the routed experts' SwiGLU clamp dropped", "vLLM 41935", true}, BY_ALT,
     DSV4_ALT_ROUTED_CLAMP_OFF, ON_CLAMP},
    {{"shared_clamp_dropped", "the shared expert's SwiGLU clamp dropped", "SGLang 23776, transformers 46018", true},
     BY_ALT, DSV4_ALT_SHARED_CLAMP_OFF, ON_SHARED_CLAMP},
    {{"clamp_gate_both_sides", "the gate clamped on both sides (SPEC.md section 4: from above only)",
      "SPEC.md section 4", true}, BY_ALT, DSV4_ALT_GATE_CLAMP_BOTH_SIDES, ON_CLAMP},
    {{"clamp_up_one_side", "the up value clamped from above only (SPEC.md section 4: both sides)",
      "SPEC.md section 4", true}, BY_ALT, DSV4_ALT_UP_CLAMP_ONE_SIDE, ON_CLAMP},
    {{"weight_point_swapped", "the router weight applied at the other point (before / after w2)",
      "the review in shared/seed", true}, BY_WEIGHT_POINT, 0, ON_ANY},
    {{"route_scale_on_shared", "route_scale applied to the shared expert", "common in ports", true}, BY_ALT,
     DSV4_ALT_SHARED_ROUTE_SCALED, ON_SHARED},
    {{"act_scale_per_token", "one activation scale per token instead of per 1 x 128 block", "FP8 ports", true},
     BY_ALT, DSV4_ALT_ACT_SCALE_PER_TOKEN, ON_ACT_QUANT},
    {{"act_scale_per_tensor", "one activation scale per tensor instead of per 1 x 128 block", "FP8 ports", true},
     BY_ALT, DSV4_ALT_ACT_SCALE_PER_TENSOR, ON_ACT_QUANT},
    {{"fp4_scales_misaligned_tp", "fp4 scale blocks misaligned under tensor parallelism (the second shard "
                                  "reading the first's)", "vLLM 47528", true}, BY_ALT, DSV4_ALT_TP2_FP4_SCALES,
     ON_FP4_TP},
    {{"ue8m0_byte_as_value", "ue8m0 scale bytes taken as values (120.0 instead of 2^-7)", "vLLM 43416", true},
     BY_MAGNITUDE, 0, ON_UE8M0},
    {{DSV4_H_MEMORY_CLASS, "the workspace sized on the wrong dimension (9x too large)",
      "aiconfigurator 1055, FlashInfer 4916", true}, BY_MEMORY, 0, ON_ANY},
    {{"ue8m0_bias_off_one_expert", "one expert's weights decoded wrong (a ue8m0 exponent bias off by one)",
      "vLLM 51946", true}, BY_ONE_EXPERT, 0, ON_ANY},
};
#define N_CAT (sizeof CAT / sizeof CAT[0])

size_t dsv4_check_class_count(void) { return N_CAT; }

const dsv4_check_class *dsv4_check_class_at(size_t i) { return i < N_CAT ? &CAT[i].c : NULL; }

/* Class i changes the routing (ids or weights): given the engine's routing, it can fit only where
   that routing differs from the contract's, and the others only where it does not. */
static bool routes(size_t i)
{
    const unsigned routing_alts = DSV4_ALT_HASH_IDS_BF16 | DSV4_ALT_HASH_FIRST_ID | DSV4_ALT_HASH_UNIFORM |
                                  DSV4_ALT_PRUNED_AS_EXPERT0 | DSV4_ALT_WEIGHTS_UNNORMALIZED | DSV4_ALT_BIAS_IN_WEIGHTS;
    return CAT[i].by == BY_ROUTE_SCALE_TWICE || CAT[i].by == BY_RENORM ||
           (CAT[i].by == BY_ALT && (CAT[i].alt & routing_alts));
}

static bool applies(where on, const dsv4_config *c)
{
    bool hash = dsv4_config_is_hash_layer(c), clamp = c->swiglu_limit > 0.0f;
    bool fp8_ue8m0 = c->weight_scale == DSV4_SCALE_UE8M0 &&
                     (c->routed_format == DSV4_FORMAT_FP8 || c->shared_format == DSV4_FORMAT_FP8);
    switch (on) {
    case ON_HASH: return hash;
    case ON_HASH_WIDE: return hash && c->n_routed_experts > 256;
    case ON_TOPP: return !hash && c->top_p < 1.0f;
    case ON_NOT_HASH: return !hash;
    case ON_NORMALISED: return c->score_func != DSV4_SCORE_SOFTMAX;
    case ON_CLAMP: return clamp;
    case ON_SHARED_CLAMP: return clamp && c->shared_clamp && c->n_shared_experts > 0;
    case ON_SHARED: return c->n_shared_experts > 0;
    case ON_ACT_QUANT:
        return c->act_quant != DSV4_ACT_QUANT_NONE &&
               (c->routed_format != DSV4_FORMAT_BF16 || c->shared_format != DSV4_FORMAT_BF16);
    case ON_FP4_TP: return c->routed_format == DSV4_FORMAT_FP4 && c->moe_inter_dim % 64 == 0;
    case ON_UE8M0: return c->routed_format == DSV4_FORMAT_FP4 || c->shared_format == DSV4_FORMAT_FP4 || fp8_ue8m0;
    default: return true;
    }
}

/* Most elements tens of times the contract's magnitude (or not finite): scales read as values. */
static bool magnitude_fits(const dsv4_h_failure *f)
{
    int64_t n = f->T * f->cfg->dim, big = 0, seen = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = dsv4_bf16_to_f32(f->y[i]), b = dsv4_bf16_to_f32(f->y_ref[i]);
        if (!(fabsf(b) > 0.0f) || !isfinite(b))
            continue;
        seen++;
        big += !isfinite(a) || fabsf(a) > 8.0f * fabsf(b);
    }
    return seen > 0 && 2 * big >= seen;
}

/* The tokens with an element beyond are all routed to one expert, and at least half of that
   expert's tokens have one: that expert's weights (or scales) read wrong. *which gets it. */
static bool one_expert_fits(const dsv4_h_failure *f, int64_t *which)
{
    int64_t T = f->T, H = f->cfg->dim, K = f->cfg->n_activated, E = f->cfg->n_routed_experts;
    unsigned char *bad = calloc((size_t)T + 1, 1);
    if (!bad)
        return false;
    int64_t nbad = 0;
    for (int64_t t = 0; t < T; t++) {
        bad[t] = dsv4_compare_beyond_terms(f->y + t * H, f->y_ref + t * H, f->terms_ref + t * H, H) > 0;
        nbad += bad[t];
    }
    bool fit = false;
    for (int64_t e = 0; e < E && nbad > 0 && !fit; e++) {
        int64_t routed = 0, bad_routed = 0;
        for (int64_t t = 0; t < T; t++) {
            bool on = false;
            for (int64_t k = 0; k < K; k++)
                on = on || f->ids_ref[t * K + k] == e;
            routed += on;
            bad_routed += on && bad[t];
        }
        if (bad_routed == nbad && 2 * bad_routed >= routed) {
            fit = true;
            *which = e;
        }
    }
    free(bad);
    return fit;
}

/* The layer's case input into x bf16 [T, H] and ids [T] (copied: the file's bytes may be unaligned);
   false with out set when it does not read or fit. */
static bool read_input(const dsv4_h_failure *f, uint16_t *x, int32_t *ids, char *out, size_t size)
{
    char path[2200];
    snprintf(path, sizeof path, "%s/input.safetensors", f->case_dir);
    dsv4_st_file *in = NULL;
    dsv4_error e;
    dsv4_error_clear(&e);
    if (dsv4_st_open(path, &in, &e)) {
        snprintf(out, size, "not named: %s", e.message);
        return false;
    }
    const dsv4_tensor_info *tx = dsv4_st_find(in, "x"), *ti = dsv4_st_find(in, "input_ids");
    if (!tx || tx->dtype != DSV4_DTYPE_BF16 || tx->numel != (uint64_t)(f->T * f->cfg->dim) || !ti ||
        ti->dtype != DSV4_DTYPE_I32 || ti->numel != (uint64_t)f->T) {
        snprintf(out, size, "not named: %s is not the case's x BF16 and input_ids I32", path);
        dsv4_st_close(in);
        return false;
    }
    memcpy(x, tx->data, (size_t)tx->nbytes);
    memcpy(ids, ti->data, (size_t)ti->nbytes);
    dsv4_st_close(in);
    return true;
}

typedef struct {
    uint16_t *y;
    float *terms, *w;
    int32_t *ids;
} outputs;

/* The layer computed the class's way at profile rnd; false when the reference refuses it (the class then does
   not apply). */
static bool alternate(const dsv4_h_failure *f, const dsv4_checkpoint *ck, size_t i, dsv4_rounding rnd,
                      const uint16_t *x, const int32_t *in_ids, outputs *o)
{
    dsv4_config c = *f->cfg;
    if (CAT[i].by == BY_WEIGHT_POINT)
        c.weight_point = c.weight_point == DSV4_WEIGHT_BEFORE_W2 ? DSV4_WEIGHT_AFTER_W2 : DSV4_WEIGHT_BEFORE_W2;
    else if (CAT[i].by == BY_ROUTE_SCALE_TWICE)
        c.route_scale = c.route_scale * c.route_scale;
    else if (CAT[i].by == BY_RENORM)
        c.top_p_renorm = !c.top_p_renorm;
    dsv4_ref *r = NULL;
    dsv4_ref_output ro;
    memset(&ro, 0, sizeof ro);
    ro.y = o->y;
    ro.topk_ids = o->ids;
    ro.topk_weights = o->w;
    bool ok = !dsv4_ref_create(&c, ck, 1, &r, NULL) && !dsv4_ref_set_rounding(r, rnd, NULL) &&
              !dsv4_ref_set_alternates(r, CAT[i].alt, NULL) &&
              !dsv4_ref_forward_terms(r, f->T, x, in_ids, &ro, o->terms, NULL);
    dsv4_ref_free(r);
    return ok;
}

/* The engine's output held to the alternate o with the check's rule; *beyond gets its count. */
static bool holds(const dsv4_h_failure *f, const outputs *o, int64_t *beyond)
{
    int64_t TH = f->T * f->cfg->dim, K = f->cfg->n_activated;
    dsv4_compare_metrics m;
    if (!dsv4_compare_bf16(f->y, o->y, TH, &m))
        return false;
    *beyond = dsv4_compare_beyond_terms(f->y, o->y, o->terms, TH);
    bool ok = dsv4_compare_within_beyond(f->rule, &m, *beyond, NULL, 0);
    if (!f->ids)
        return ok;
    dsv4_tensor_info ti, tw;
    memset(&ti, 0, sizeof ti);
    ti.name = "topk_ids";
    ti.dtype = DSV4_DTYPE_I32;
    ti.ndim = 2;
    ti.shape[0] = f->T;
    ti.shape[1] = K;
    ti.numel = (uint64_t)(f->T * K);
    ti.nbytes = ti.numel * 4;
    ti.data = o->ids;
    tw = ti;
    tw.name = "topk_weights";
    tw.dtype = DSV4_DTYPE_F32;
    tw.data = o->w;
    dsv4_routing_metrics rm;
    return dsv4_compare_routing_tensors_rtol(f->cfg->n_routed_experts, f->ids, f->weights, f->sentinel, &ti,
                                             f->weights ? &tw : NULL, f->weights_rtol, &rm, NULL, 0) &&
           dsv4_routing_within(&rm, NULL, 0) && ok;
}

static void say(char *out, size_t size, size_t i, const char *how_seen)
{
    snprintf(out, size, "likely %s: %s (%s); %s", CAT[i].c.name, CAT[i].c.what, CAT[i].c.source, how_seen);
}

void dsv4_h_diagnose(const dsv4_h_failure *f, char *out, size_t size)
{
    if (!out || size == 0)
        return;
    snprintf(out, size, "no known class fits");
    if (!f || f->T <= 0)
        return;
    int64_t T = f->T, H = f->cfg->dim, K = f->cfg->n_activated;
    char path[2200];
    snprintf(path, sizeof path, "%s/model.safetensors", f->case_dir);
    dsv4_checkpoint *ck = NULL;
    uint16_t *x = malloc((size_t)(T * H) * 2);
    int32_t *in_ids = malloc((size_t)T * 4);
    dsv4_error e;
    dsv4_error_clear(&e);
    outputs o = {malloc((size_t)(T * H) * 2), malloc((size_t)(T * H) * 4), malloc((size_t)(T * K) * 4),
                 malloc((size_t)(T * K) * 4)};
    if (!o.y || !o.terms || !o.w || !o.ids || !x || !in_ids) {
        snprintf(out, size, "not named: out of memory");
        goto done;
    }
    if (dsv4_checkpoint_open(path, &ck, &e)) {
        snprintf(out, size, "not named: %s", e.message);
        goto done;
    }
    if (!read_input(f, x, in_ids, out, size))
        goto done;
    for (size_t i = 0; i < N_CAT; i++) {
        if (!applies(CAT[i].on, f->cfg))
            continue;
        char seen[256];
        if (CAT[i].by == BY_MEMORY) /* named by the memory check, not from y */
            continue;
        if (CAT[i].by == BY_PADDING) {
            if (f->padded && f->bad_nonfinite > 0) {
                snprintf(seen, sizeof seen, "%lld elements of the tokens' rows are not finite where the contract's "
                                            "are", (long long)f->bad_nonfinite);
                say(out, size, i, seen);
                break;
            }
            continue;
        }
        if (CAT[i].by == BY_MAGNITUDE) {
            if (magnitude_fits(f)) {
                say(out, size, i, "most elements are more than 8 times the contract's");
                break;
            }
            continue;
        }
        if (CAT[i].by == BY_ONE_EXPERT) {
            int64_t ex = -1;
            if (f->routing_ok && one_expert_fits(f, &ex)) {
                snprintf(seen, sizeof seen, "the elements beyond are all on tokens routed to expert %lld",
                         (long long)ex);
                say(out, size, i, seen);
                break;
            }
            continue;
        }
        int64_t beyond = 0;
        if (f->ids && routes(i) == f->routing_ok) /* cannot fit: skipped (each try is a forward) */
            continue;
        if (CAT[i].by == BY_PROFILE) {
            int found = -1;
            for (int p = 0; p < DSV4_ROUNDING_COUNT && found < 0; p++)
                if (p != (int)f->rounding && alternate(f, ck, i, (dsv4_rounding)p, x, in_ids, &o) &&
                    holds(f, &o, &beyond))
                    found = p;
            if (found >= 0) {
                snprintf(seen, sizeof seen, "the output passes against the reference at rounding %s (%lld beyond; "
                                            "%lld at %s)", dsv4_rounding_name((dsv4_rounding)found),
                         (long long)beyond, (long long)f->beyond, dsv4_rounding_name(f->rounding));
                say(out, size, i, seen);
                break;
            }
            continue;
        }
        if (alternate(f, ck, i, f->rounding, x, in_ids, &o) && holds(f, &o, &beyond)) {
            snprintf(seen, sizeof seen, "the output passes against the reference computed that way (%lld beyond; "
                                        "%lld against the contract)",
                     (long long)beyond, (long long)f->beyond);
            say(out, size, i, seen);
            break;
        }
    }
done:
    dsv4_checkpoint_close(ck);
    free(o.y), free(o.terms), free(o.w), free(o.ids), free(x), free(in_ids);
}
