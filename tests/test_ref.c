#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/ref.h"
#include "dsv4moe/rng.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe/weights.h"
#include "core/hash.h"
#include "ref/ref_internal.h"
#include "tests/testutil.h"

Suite *ref_suite(void);

/* ---------------- math ---------------- */

START_TEST(math_functions_match_libm)
{
    for (float x = -30.0f; x <= 30.0f; x += 0.01953125f) {
        float a = dsv4_ref_expf(x), b = expf(x);
        ck_assert_msg(fabsf(a - b) <= 2.0f * fabsf(b) * 1.2e-7f, "exp(%g): %a vs %a", (double)x, (double)a, (double)b);
        double l = dsv4_ref_log1p_d(exp((double)x)), m = log1p(exp((double)x));
        ck_assert_msg(fabs(l - m) <= 1e-14 * fabs(m) + 1e-300, "log1p(exp(%g))", (double)x);
    }
    ck_assert(dsv4_ref_expf(0.0f) == 1.0f);
    ck_assert(dsv4_ref_expf(100.0f) == INFINITY);
    ck_assert(dsv4_ref_expf(-200.0f) == 0.0f);
    ck_assert(isnan(dsv4_ref_expf(NAN)));
    ck_assert(dsv4_ref_log1p_d(0.0) == 0.0);
    ck_assert(fabs(dsv4_ref_log1p_d(1e-6) - log1p(1e-6)) < 1e-21);
    ck_assert(dsv4_ref_softplusf(25.0f) == 25.0f);
    ck_assert(fabsf(dsv4_ref_softplusf(0.0f) - 0.69314718f) < 1e-7f);
    ck_assert(dsv4_ref_siluf(0.0f) == 0.0f);
    ck_assert(fabsf(dsv4_ref_siluf(10.0f) - 9.9995460f) < 1e-5f);
}
END_TEST

/* ---------------- router, hand-worked ---------------- */

static dsv4_config small_cfg(int64_t E, int64_t K)
{
    dsv4_config c;
    dsv4_config_init(&c);
    c.dim = 4;
    c.moe_inter_dim = 2;
    c.n_routed_experts = E;
    c.n_activated = K;
    c.n_hash_layers = 0;
    c.n_layers = 1;
    c.layer = 0;
    c.vocab_size = 8;
    c.n_shared_experts = 0;
    c.routed_format = c.shared_format = DSV4_FORMAT_BF16;
    c.act_quant = DSV4_ACT_QUANT_NONE;
    c.route_scale = 1.0f;
    return c;
}

START_TEST(scores_each_function)
{
    dsv4_config c = small_cfg(4, 2);
    float l[4] = {0.0f, 1.0f, -2.0f, 30.0f}, s[4];
    dsv4_ref_scores(&c, l, s);
    ck_assert(fabsf(s[0] - sqrtf(logf(2.0f))) < 1e-6f);
    ck_assert(fabsf(s[1] - sqrtf(log1pf(expf(1.0f)))) < 1e-6f);
    ck_assert(s[3] == sqrtf(30.0f)); /* softplus(l) = l above 20 */
    c.score_func = DSV4_SCORE_SIGMOID;
    dsv4_ref_scores(&c, l, s);
    ck_assert(s[0] == 0.5f);
    ck_assert(fabsf(s[2] - 1.0f / (1.0f + expf(2.0f))) < 1e-7f);
    c.score_func = DSV4_SCORE_SOFTMAX;
    dsv4_ref_scores(&c, l, s);
    float sum = s[0] + s[1] + s[2] + s[3];
    ck_assert(fabsf(sum - 1.0f) < 1e-6f);
    ck_assert(s[3] > 0.999f);
}
END_TEST

START_TEST(select_ties_bias_and_normalisation)
{
    dsv4_config c = small_cfg(8, 3);
    float s[8] = {0.1f, 0.5f, 0.9f, 0.5f, 0.2f, 0.9f, 0.3f, 0.5f};
    int32_t ids[3];
    float w[3];
    dsv4_route_select(&c, s, NULL, NULL, ids, w);
    /* 0.9 at 2 and 5 (tie: lower first), then 0.5 at 1, 3, 7: expert 1. */
    ck_assert_int_eq(ids[0], 2);
    ck_assert_int_eq(ids[1], 5);
    ck_assert_int_eq(ids[2], 1);
    ck_assert(w[0] == 0.9f / (0.9f + 0.9f + 0.5f));
    ck_assert(w[2] == 0.5f / (0.9f + 0.9f + 0.5f));
    /* Bias selects, the unbiased score weighs: expert 0 enters first. */
    float bias[8] = {2.0f, 0, 0, 0, 0, 0, 0, 0};
    dsv4_route_select(&c, s, bias, NULL, ids, w);
    ck_assert_int_eq(ids[0], 0);
    ck_assert_int_eq(ids[1], 2);
    ck_assert_int_eq(ids[2], 5);
    ck_assert(w[0] == 0.1f / ((0.1f + 0.9f) + 0.9f));
    /* norm_eps and route_scale. */
    c.norm_eps = 0.1f;
    c.route_scale = 2.5f;
    dsv4_route_select(&c, s, NULL, NULL, ids, w);
    ck_assert(w[0] == (0.9f / (((0.9f + 0.9f) + 0.5f) + 0.1f)) * 2.5f);
    /* softmax: no renormalisation, route_scale still applies. */
    c.norm_eps = 0.0f;
    c.score_func = DSV4_SCORE_SOFTMAX;
    dsv4_route_select(&c, s, NULL, NULL, ids, w);
    ck_assert(w[0] == 0.9f * 2.5f);
    ck_assert(w[2] == 0.5f * 2.5f);
    /* Hash ids are taken as given, with weights from their scores. */
    c.score_func = DSV4_SCORE_SQRTSOFTPLUS;
    c.route_scale = 1.0f;
    int32_t h[3] = {6, 0, 4};
    dsv4_route_select(&c, s, NULL, h, ids, w);
    ck_assert_int_eq(ids[0], 6);
    ck_assert_int_eq(ids[1], 0);
    ck_assert_int_eq(ids[2], 4);
    ck_assert(w[1] == 0.1f / ((0.3f + 0.1f) + 0.2f));
}
END_TEST

START_TEST(top_p_worked_examples)
{
    dsv4_config c = small_cfg(8, 4);
    float one[4] = {1, 1, 1, 1};
    /* Keep the shortest prefix reaching 0.6 of the total: 0.4 + 0.3 crosses it. */
    int32_t ids[4] = {1, 2, 3, 4};
    float w[4] = {0.4f, 0.3f, 0.2f, 0.1f};
    c.top_p = 0.6f;
    ck_assert_int_eq(dsv4_route_top_p(&c, ids, w, one), 2);
    ck_assert_int_eq(ids[0], 1);
    ck_assert_int_eq(ids[1], 2);
    ck_assert_int_eq(ids[2], 8);
    ck_assert_int_eq(ids[3], 8);
    ck_assert(w[0] == 0.4f && w[1] == 0.3f && w[2] == 0.0f && w[3] == 0.0f);
    /* min_keep raises it. */
    int32_t ids2[4] = {1, 2, 3, 4};
    float w2[4] = {0.4f, 0.3f, 0.2f, 0.1f};
    c.top_p_min_keep = 3;
    ck_assert_int_eq(dsv4_route_top_p(&c, ids2, w2, one), 3);
    ck_assert_int_eq(ids2[2], 3);
    ck_assert_int_eq(ids2[3], 8);
    c.top_p_min_keep = 1;
    /* Ties in contribution go to the lower expert id; positions are kept. */
    int32_t ids3[4] = {7, 2, 5, 1};
    float w3[4] = {0.25f, 0.25f, 0.25f, 0.25f};
    c.top_p = 0.5f;
    ck_assert_int_eq(dsv4_route_top_p(&c, ids3, w3, one), 2);
    ck_assert_int_eq(ids3[0], 8);
    ck_assert_int_eq(ids3[1], 2);
    ck_assert_int_eq(ids3[2], 8);
    ck_assert_int_eq(ids3[3], 1);
    /* Everything but one slot pruned. */
    int32_t ids4[4] = {0, 1, 2, 3};
    float w4[4] = {0.97f, 0.01f, 0.01f, 0.01f};
    c.top_p = 0.9f;
    ck_assert_int_eq(dsv4_route_top_p(&c, ids4, w4, one), 1);
    ck_assert_int_eq(ids4[0], 0);
    ck_assert_int_eq(ids4[1] + ids4[2] + ids4[3], 24);
    /* The predictor's norms change the order: slot 3 now contributes most. */
    int32_t ids5[4] = {1, 2, 3, 4};
    float w5[4] = {0.4f, 0.3f, 0.2f, 0.1f};
    float norms[4] = {1.0f, 1.0f, 1.0f, 10.0f};
    c.top_p = 0.5f;
    ck_assert_int_eq(dsv4_route_top_p(&c, ids5, w5, norms), 1);
    ck_assert_int_eq(ids5[3], 4);
    ck_assert_int_eq(ids5[0], 8);
    /* Renormalisation restores the original sum. */
    int32_t ids6[4] = {1, 2, 3, 4};
    float w6[4] = {0.4f, 0.3f, 0.2f, 0.1f};
    c.top_p = 0.6f;
    c.top_p_renorm = true;
    ck_assert_int_eq(dsv4_route_top_p(&c, ids6, w6, one), 2);
    float sum0 = ((0.4f + 0.3f) + 0.2f) + 0.1f, kept = 0.4f + 0.3f;
    ck_assert(w6[0] == 0.4f * (sum0 / kept));
    ck_assert(w6[2] == 0.0f);
}
END_TEST

/* ---------------- whole layer on a hand-built checkpoint ---------------- */

/* A layer with H = 4, I = 2, given as fp32 arrays, written as bf16 in the split layout. */
typedef struct {
    dsv4_config c;
    float gate[8 * 4], bias[8];
    float w1[8][2 * 4], w3[8][2 * 4], w2[8][4 * 2];
    float sw1[2 * 4], sw3[2 * 4], sw2[4 * 2];
    int32_t tid[8 * 8];
} toy;

static void put_bf16_arr(uint16_t *dst, const float *src, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = dsv4_f32_to_bf16(src[i]);
}

static void toy_write(const toy *t, const char *path)
{
    dsv4_st_writer *w;
    dsv4_error e;
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    const dsv4_config *c = &t->c;
    int E = (int)c->n_routed_experts;
    static uint16_t buf[64][16];
    int nb = 0;
    char name[128];
    int64_t sg[2] = {E, 4}, sb[1] = {E}, s13[2] = {2, 4}, s2[2] = {4, 2}, st[2] = {c->vocab_size, c->n_activated};
    put_bf16_arr(buf[nb], t->gate, E * 4);
    ck_assert_int_eq(dsv4_st_writer_add(w, "layers.0.ffn.gate.weight", DSV4_DTYPE_BF16, 2, sg, buf[nb++], &e), 0);
    if (c->n_hash_layers > 0)
        ck_assert_int_eq(dsv4_st_writer_add(w, "layers.0.ffn.gate.tid2eid", DSV4_DTYPE_I32, 2, st, t->tid, &e), 0);
    else
        ck_assert_int_eq(dsv4_st_writer_add(w, "layers.0.ffn.gate.bias", DSV4_DTYPE_F32, 1, sb, t->bias, &e), 0);
    for (int x = 0; x < E; x++) {
        const float *m[3] = {t->w1[x], t->w3[x], t->w2[x]};
        const char *pn[3] = {"w1", "w3", "w2"};
        for (int p = 0; p < 3; p++) {
            put_bf16_arr(buf[nb], m[p], 8);
            snprintf(name, sizeof name, "layers.0.ffn.experts.%d.%s.weight", x, pn[p]);
            ck_assert_int_eq(dsv4_st_writer_add(w, name, DSV4_DTYPE_BF16, 2, p == 2 ? s2 : s13, buf[nb++], &e), 0);
        }
    }
    if (c->n_shared_experts) {
        const float *m[3] = {t->sw1, t->sw3, t->sw2};
        const char *pn[3] = {"w1", "w3", "w2"};
        for (int p = 0; p < 3; p++) {
            put_bf16_arr(buf[nb], m[p], 8);
            snprintf(name, sizeof name, "layers.0.ffn.shared_experts.%s.weight", pn[p]);
            ck_assert_int_eq(dsv4_st_writer_add(w, name, DSV4_DTYPE_BF16, 2, p == 2 ? s2 : s13, buf[nb++], &e), 0);
        }
    }
    ck_assert_msg(dsv4_st_writer_write(w, path, NULL, NULL, &e) == DSV4_OK, "%s", e.message);
    dsv4_st_writer_free(w);
}

/* The toy layer written to the scratch file `name` and opened. */
static dsv4_checkpoint *toy_open(const toy *t, const char *name)
{
    char path[512];
    toy_write(t, tu_path(path, sizeof path, name));
    dsv4_checkpoint *ck;
    dsv4_error e;
    ck_assert_msg(dsv4_checkpoint_open(path, &ck, &e) == DSV4_OK, "%s", e.message);
    return ck;
}

/* The alternates (dsv4_ref_set_alternates) the toy runs set; 0: the contract. */
static unsigned toy_alt;

/* Runs the toy layer on T tokens in a rounding profile; y as floats into yf, y_terms into terms
   (may be NULL). */
static dsv4_status toy_run_rounded(const toy *t, const char *name, dsv4_rounding rnd, int T, const float *x,
                                   const int32_t *ids, float *yf, float *terms, int32_t *topk, float *topw,
                                   dsv4_ref_stats *stats, dsv4_error *e)
{
    dsv4_checkpoint *ck = toy_open(t, name);
    dsv4_ref *r;
    dsv4_status st = dsv4_ref_create(&t->c, ck, 2, &r, e);
    if (!st)
        st = dsv4_ref_set_rounding(r, rnd, e);
    if (!st)
        st = dsv4_ref_set_alternates(r, toy_alt, e);
    if (st) {
        dsv4_ref_free(r);
        dsv4_checkpoint_close(ck);
        return st;
    }
    uint16_t xb[64], y[64];
    put_bf16_arr(xb, x, T * 4);
    dsv4_ref_output out = {.y = y, .topk_ids = topk, .topk_weights = topw};
    st = dsv4_ref_forward_terms(r, T, xb, ids, &out, terms, e);
    if (!st) {
        for (int i = 0; i < T * 4; i++)
            yf[i] = dsv4_bf16_to_f32(y[i]);
        if (stats)
            *stats = out.stats;
    }
    dsv4_ref_free(r);
    dsv4_checkpoint_close(ck);
    return st;
}

static dsv4_status toy_run(const toy *t, const char *name, int T, const float *x, const int32_t *ids, float *yf,
                           int32_t *topk, float *topw, dsv4_ref_stats *stats, dsv4_error *e)
{
    return toy_run_rounded(t, name, DSV4_ROUNDING_SPEC, T, x, ids, yf, NULL, topk, topw, stats, e);
}

/* Expert e computes g = x0 * w1[i][0], u = x0 * w3[i][0] for x = [x0, 0, 0, 0]. */
static void toy_expert(toy *t, int e, float g0, float g1, float u0, float u1, const float w2[8])
{
    memset(t->w1[e], 0, sizeof t->w1[e]);
    memset(t->w3[e], 0, sizeof t->w3[e]);
    t->w1[e][0] = g0;
    t->w1[e][4] = g1;
    t->w3[e][0] = u0;
    t->w3[e][4] = u1;
    memcpy(t->w2[e], w2, sizeof t->w2[e]);
}

static const float W2_ID[8] = {1, 0, 0, 1, 0, 0, 0, 0}; /* y0 = h0, y1 = h1 */

static toy toy_one_expert(void)
{
    /* E = 2, K = 1: expert 1 always wins (logit 4 against 0), weight route_scale. */
    toy t;
    memset(&t, 0, sizeof t);
    t.c = small_cfg(2, 1);
    t.gate[4] = 4.0f;
    toy_expert(&t, 0, 0, 0, 0, 0, W2_ID);
    toy_expert(&t, 1, 12.0f, 10.0f, -15.0f, 10.0f, W2_ID);
    return t;
}

static float bf(float v) { return dsv4_round_bf16(v); }

START_TEST(clamp_at_and_beyond_limit)
{
    toy t = toy_one_expert();
    float x[4] = {1, 0, 0, 0}, y[4];
    int32_t ids[1];
    float w[1];
    dsv4_ref_stats s;
    dsv4_error e;
    t.c.swiglu_limit = 10.0f;
    ck_assert_msg(toy_run(&t, "toy_clamp.safetensors", 1, x, NULL, y, ids, w, &s, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(ids[0], 1);
    ck_assert(w[0] == 1.0f);
    /* g = 12 -> 10 (upper side), u = -15 -> -10 (symmetric); g = 10 and u = 10 sit exactly at L: untouched. */
    ck_assert(y[0] == bf(bf(dsv4_ref_siluf(10.0f) * -10.0f)));
    ck_assert(y[1] == bf(bf(dsv4_ref_siluf(10.0f) * 10.0f)));
    ck_assert(fabsf(y[0] - (-10.0f * 10.0f / (1.0f + expf(-10.0f)))) < 0.05f);
    ck_assert_uint_eq(s.routed_g_clamped, 1);
    ck_assert_uint_eq(s.routed_u_clamped, 1);
    ck_assert_uint_eq(s.routed_values, 2);
    /* g below -L is never clamped (upper side only). */
    toy_expert(&t, 1, -12.0f, 10.0f, 3.0f, 10.0f, W2_ID);
    ck_assert_int_eq(toy_run(&t, "toy_clamp2.safetensors", 1, x, NULL, y, ids, w, &s, &e), DSV4_OK);
    ck_assert(y[0] == bf(bf(dsv4_ref_siluf(-12.0f) * 3.0f)));
    ck_assert_uint_eq(s.routed_g_clamped, 0);
    /* L = 0 disables the clamp. */
    toy_expert(&t, 1, 12.0f, 10.0f, -15.0f, 10.0f, W2_ID);
    t.c.swiglu_limit = 0.0f;
    ck_assert_int_eq(toy_run(&t, "toy_noclamp.safetensors", 1, x, NULL, y, ids, w, &s, &e), DSV4_OK);
    ck_assert(y[0] == bf(bf(dsv4_ref_siluf(12.0f) * -15.0f)));
    ck_assert(y[0] < -14.9f);
    ck_assert_uint_eq(s.routed_g_clamped + s.routed_u_clamped, 0);
}
END_TEST

/* The clamp's alternates (dsv4moe/ref.h) by hand: row 0 has g = -12, u = -15 and row 1 g = 12,
   u = 5 at L = 10; each alternate moves exactly the values its form treats otherwise. */
START_TEST(clamp_alternates_by_hand)
{
    toy t = toy_one_expert();
    toy_expert(&t, 1, -12.0f, 12.0f, -15.0f, 5.0f, W2_ID);
    t.c.swiglu_limit = 10.0f;
    static const struct {
        unsigned alt;
        float g0, u0, g1;
    } runs[] = {
        {0, -12.0f, -10.0f, 10.0f},
        {DSV4_ALT_GATE_CLAMP_BOTH_SIDES, -10.0f, -10.0f, 10.0f},
        {DSV4_ALT_UP_CLAMP_ONE_SIDE, -12.0f, -15.0f, 10.0f},
        {DSV4_ALT_ROUTED_CLAMP_OFF, -12.0f, -15.0f, 12.0f},
        {DSV4_ALT_SHARED_CLAMP_OFF, -12.0f, -10.0f, 10.0f}, /* no shared expert: the contract */
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        float x[4] = {1, 0, 0, 0}, y[4];
        dsv4_error e;
        toy_alt = runs[k].alt;
        dsv4_status st = toy_run(&t, "toy_alt.safetensors", 1, x, NULL, y, NULL, NULL, NULL, &e);
        toy_alt = 0;
        ck_assert_msg(st == DSV4_OK, "%s", e.message);
        ck_assert_msg(y[0] == bf(bf(dsv4_ref_siluf(runs[k].g0) * runs[k].u0)), "alt 0x%x: y0 %a", runs[k].alt,
                      (double)y[0]);
        ck_assert_msg(y[1] == bf(bf(dsv4_ref_siluf(runs[k].g1) * 5.0f)), "alt 0x%x: y1 %a", runs[k].alt, (double)y[1]);
    }
    dsv4_error e;
    ck_assert_int_eq(dsv4_ref_set_alternates(NULL, 0, &e), DSV4_ERR_INVALID_ARG);
    dsv4_checkpoint *ck = toy_open(&t, "toy_alt_bad.safetensors");
    dsv4_ref *ref;
    ck_assert_int_eq(dsv4_ref_create(&t.c, ck, 1, &ref, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_ref_set_alternates(ref, 1u << 20, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "0x100000"));
    ck_assert_int_eq(dsv4_ref_set_alternates(ref, DSV4_ALT_ALL, &e), DSV4_OK);
    dsv4_ref_free(ref);
    dsv4_checkpoint_close(ck);
}
END_TEST

START_TEST(shared_clamp_on_and_off)
{
    toy t = toy_one_expert();
    toy_expert(&t, 1, 0, 0, 0, 0, W2_ID); /* the routed expert contributes 0 */
    t.c.n_shared_experts = 1;
    memset(t.sw1, 0, sizeof t.sw1);
    memset(t.sw3, 0, sizeof t.sw3);
    t.sw1[0] = 20.0f;
    t.sw3[0] = 2.0f;
    memcpy(t.sw2, W2_ID, sizeof t.sw2);
    float x[4] = {1, 0, 0, 0}, y[4];
    dsv4_ref_stats s;
    dsv4_error e;
    t.c.shared_clamp = true;
    ck_assert_int_eq(toy_run(&t, "toy_shared_on.safetensors", 1, x, NULL, y, NULL, NULL, &s, &e), DSV4_OK);
    ck_assert(y[0] == bf(bf(dsv4_ref_siluf(10.0f) * 2.0f)));
    ck_assert_uint_eq(s.shared_g_clamped, 1);
    t.c.shared_clamp = false;
    ck_assert_int_eq(toy_run(&t, "toy_shared_off.safetensors", 1, x, NULL, y, NULL, NULL, &s, &e), DSV4_OK);
    ck_assert(y[0] == bf(bf(dsv4_ref_siluf(20.0f) * 2.0f)));
    ck_assert_uint_eq(s.shared_g_clamped, 0);
}
END_TEST

START_TEST(weight_point_both_ways)
{
    toy t = toy_one_expert();
    t.c.route_scale = 0.3f; /* the single expert's weight */
    const float w2[8] = {3.0f, 0, 0, 3.0f, 0, 0, 0, 0};
    toy_expert(&t, 1, 1.7f, 0, 2.9f, 0, w2);
    float x[4] = {1, 0, 0, 0}, y[4];
    dsv4_error e;
    float g = bf(1.7f), u = bf(2.9f), h = dsv4_ref_siluf(g) * u;
    t.c.weight_point = DSV4_WEIGHT_BEFORE_W2;
    ck_assert_int_eq(toy_run(&t, "toy_wp_before.safetensors", 1, x, NULL, y, NULL, NULL, NULL, &e), DSV4_OK);
    float before = bf(bf(h * 0.3f) * 3.0f);
    ck_assert(y[0] == before);
    t.c.weight_point = DSV4_WEIGHT_AFTER_W2;
    ck_assert_int_eq(toy_run(&t, "toy_wp_after.safetensors", 1, x, NULL, y, NULL, NULL, NULL, &e), DSV4_OK);
    float after = bf(0.3f * bf(bf(h) * 3.0f));
    ck_assert(y[0] == after);
    ck_assert(before != after); /* these values round differently: the switch is visible */
}
END_TEST

/* SPEC.md section 10.1 worked by hand: one routed expert (g = 1.7, u = 3.7, w = 0.3, w2 = 3)
   and a shared expert whose output is negative, both weight points, every profile; y_terms is
   |weighted routed output| + |shared output| as the profile computes them. */
START_TEST(rounding_profiles_by_hand)
{
    toy t = toy_one_expert();
    t.c.route_scale = 0.3f;
    const float w2[8] = {3.0f, 0, 0, 3.0f, 0, 0, 0, 0};
    toy_expert(&t, 1, 1.7f, 0, 3.7f, 0, w2);
    t.c.n_shared_experts = 1;
    memset(t.sw1, 0, sizeof t.sw1);
    memset(t.sw3, 0, sizeof t.sw3);
    t.sw1[0] = 1.3f;
    t.sw3[0] = -2.3f;
    memcpy(t.sw2, W2_ID, sizeof t.sw2);
    float x[4] = {1, 0, 0, 0}, y[4], terms[4];
    dsv4_error e;
    float g = bf(1.7f), u = bf(3.7f), sg = bf(1.3f), su = bf(-2.3f);
    float h = dsv4_ref_siluf(g) * u, hops = bf(bf(dsv4_ref_siluf(g)) * u);
    float sh = dsv4_ref_siluf(sg) * su, shops = bf(bf(dsv4_ref_siluf(sg)) * su);
    /* [weight point][profile]: the routed contribution and the shared output. */
    float routed[2][3] = {
        {bf(bf(h * 0.3f) * 3.0f), bf(bf(hops * 0.3f) * 3.0f), (h * 0.3f) * 3.0f},
        {0.3f * bf(bf(h) * 3.0f), bf(0.3f * bf(hops * 3.0f)), 0.3f * (h * 3.0f)},
    };
    float shared[3] = {bf(bf(sh)), bf(shops), sh};
    const dsv4_weight_point wp[2] = {DSV4_WEIGHT_BEFORE_W2, DSV4_WEIGHT_AFTER_W2};
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < DSV4_ROUNDING_COUNT; k++) {
            t.c.weight_point = wp[p];
            char name[64];
            snprintf(name, sizeof name, "toy_rounding_%d_%d.safetensors", p, k);
            ck_assert_msg(toy_run_rounded(&t, name, (dsv4_rounding)k, 1, x, NULL, y, terms, NULL, NULL, NULL, &e) ==
                              DSV4_OK,
                          "%s", e.message);
            float want = bf(routed[p][k] + shared[k]);
            ck_assert_msg(y[0] == want, "%s %s: y %a, want %a", p ? "after_w2" : "before_w2",
                          dsv4_rounding_name((dsv4_rounding)k), (double)y[0], (double)want);
            ck_assert(terms[0] == fabsf(routed[p][k]) + fabsf(shared[k]));
            ck_assert(terms[2] == 0.0f && y[2] == 0.0f);
        }
    /* The profiles are told apart by these values (else the test would prove nothing). */
    ck_assert(routed[0][0] != routed[0][1] && routed[0][0] != routed[0][2] && routed[0][1] != routed[0][2]);
    ck_assert(routed[1][0] != routed[1][1] && routed[1][0] != routed[1][2] && routed[1][1] != routed[1][2]);
    ck_assert(shared[0] != shared[1] && shared[0] != shared[2]);
}
END_TEST

START_TEST(rounding_names_and_bad_values)
{
    dsv4_rounding r = DSV4_ROUNDING_FP32;
    dsv4_error e;
    for (int k = 0; k < DSV4_ROUNDING_COUNT; k++) {
        ck_assert_int_eq(dsv4_rounding_parse(dsv4_rounding_name((dsv4_rounding)k), &r, &e), DSV4_OK);
        ck_assert_int_eq(r, k);
    }
    ck_assert_str_eq(dsv4_rounding_name(DSV4_ROUNDING_BF16_OPS), "bf16_ops");
    ck_assert_ptr_null(dsv4_rounding_name((dsv4_rounding)3));
    ck_assert_int_eq(dsv4_rounding_parse("bf16", &r, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(e.message, "'bf16' is not a rounding profile (spec, bf16_ops, fp32)"));
    ck_assert_int_eq(dsv4_rounding_parse(NULL, &r, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_ref_set_rounding(NULL, DSV4_ROUNDING_SPEC, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_ref_rounding(NULL), DSV4_ROUNDING_SPEC);
    toy t = toy_one_expert();
    dsv4_checkpoint *ck = toy_open(&t, "toy_rounding_bad.safetensors");
    dsv4_ref *ref;
    ck_assert_int_eq(dsv4_ref_create(&t.c, ck, 1, &ref, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_ref_rounding(ref), DSV4_ROUNDING_SPEC);
    ck_assert_int_eq(dsv4_ref_set_rounding(ref, (dsv4_rounding)7, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_ref_rounding(ref), DSV4_ROUNDING_SPEC);
    ck_assert_int_eq(dsv4_ref_set_rounding(ref, DSV4_ROUNDING_FP32, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_ref_rounding(ref), DSV4_ROUNDING_FP32);
    dsv4_ref_free(ref);
    dsv4_checkpoint_close(ck);
}
END_TEST

/* A bf16 value c near target / h with bf16(h * c) == target (asserted). */
static float solve_w2(float h, float target)
{
    uint16_t base = dsv4_f32_to_bf16(target / h);
    for (int d = 0; d < 16; d++) {
        uint16_t cand = (uint16_t)(base + ((d & 1) ? -(d + 1) / 2 : d / 2));
        float c = dsv4_bf16_to_f32(cand);
        if (dsv4_round_bf16(h * c) == target)
            return c;
    }
    ck_abort_msg("no bf16 c gives bf16(%a c) = %a", (double)h, (double)target);
    return 0;
}

START_TEST(combine_in_ascending_expert_order)
{
    /* Experts 1, 2, 3 tie on score; the bias orders the slots 3, 2, 1. Their outputs are
       1, 2^-24 and -1: ascending order gives (1 + 2^-24) - 1 = 0 (the tie rounds to 1), slot
       order (-1 + 2^-24) + 1 = 2^-24, so the result shows which order was used. */
    toy t;
    memset(&t, 0, sizeof t);
    t.c = small_cfg(4, 3);
    t.c.swiglu_limit = 0.0f;
    for (int x = 1; x < 4; x++)
        t.gate[x * 4] = 3.0f;
    t.bias[1] = 0.1f;
    t.bias[2] = 0.2f;
    t.bias[3] = 0.3f;
    float g = bf(2.0f), u = bf(1.0f);
    float lg = 3.0f, sc;
    dsv4_config one = small_cfg(1, 1);
    dsv4_ref_scores(&one, &lg, &sc);
    float wt = sc / ((sc + sc) + sc);
    float h = bf(dsv4_ref_siluf(g) * u * wt);
    /* W2 entries c with bf16(h c) exactly 1 and exactly 2^-24. */
    float c1 = solve_w2(h, 1.0f), c2 = solve_w2(h, 0x1p-24f);
    float a = bf(h * c1), b = bf(h * c2);
    ck_assert(a == 1.0f && b == 0x1p-24f);
    float asc = bf((a + b) + -a), desc = bf((-a + b) + a);
    ck_assert(asc == 0.0f && desc == 0x1p-24f);
    const float c[4] = {0, c1, c2, -c1};
    toy_expert(&t, 0, 0, 0, 0, 0, W2_ID);
    for (int x = 1; x < 4; x++) {
        float w2[8] = {c[x], 0, 0, 0, 0, 0, 0, 0};
        toy_expert(&t, x, g, 0, u, 0, w2);
    }
    float x[4] = {1, 0, 0, 0}, y[4], w[3];
    int32_t ids[3];
    dsv4_error e;
    ck_assert_int_eq(toy_run(&t, "toy_order.safetensors", 1, x, NULL, y, ids, w, NULL, &e), DSV4_OK);
    ck_assert_int_eq(ids[0], 3);
    ck_assert_int_eq(ids[1], 2);
    ck_assert_int_eq(ids[2], 1);
    ck_assert(w[0] == wt && w[1] == wt && w[2] == wt);
    ck_assert_msg(y[0] == asc, "y %a, ascending %a, slot order %a", (double)y[0], (double)asc, (double)desc);
}
END_TEST

/* A hash layer of 4 experts, 2 a token (expert x: g = (1 + x) x0, u = x0, w2 the identity); the
   token -> expert table is the caller's. */
static toy toy_hash4(void)
{
    toy t = toy_one_expert();
    t.c = small_cfg(4, 2);
    t.c.n_hash_layers = 1;
    for (int x = 0; x < 4; x++)
        toy_expert(&t, x, 1.0f + (float)x, 0, 1.0f, 0, W2_ID);
    return t;
}

START_TEST(hash_layer_lookup_and_range_errors)
{
    toy t = toy_hash4();
    for (int v = 0; v < 8; v++) {
        t.tid[v * 2] = v % 4;
        t.tid[v * 2 + 1] = (v + 1) % 4;
    }
    float x[8] = {1, 0, 0, 0, 1, 0, 0, 0}, y[8], w[4];
    int32_t in[2] = {2, 7}, ids[4];
    dsv4_ref_stats s;
    dsv4_error e;
    ck_assert_msg(toy_run(&t, "toy_hash.safetensors", 2, x, in, y, ids, w, &s, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(ids[0], 2);
    ck_assert_int_eq(ids[1], 3);
    ck_assert_int_eq(ids[2], 3);
    ck_assert_int_eq(ids[3], 0);
    ck_assert(w[0] == 0.5f && w[1] == 0.5f); /* all gate logits 0: equal scores */
    ck_assert_int_eq(s.pruned_slots, 0);
    /* An input id outside [0, V). */
    int32_t bad_in[2] = {2, 8};
    ck_assert_int_eq(toy_run(&t, "toy_hash_bad.safetensors", 2, x, bad_in, y, ids, w, &s, &e), DSV4_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.message, "input_ids[1]"));
    ck_assert_ptr_nonnull(strstr(e.message, "8"));
    /* A table entry outside [0, E). */
    t.tid[7 * 2 + 1] = 4;
    ck_assert_int_eq(toy_run(&t, "toy_hash_bad2.safetensors", 2, x, in, y, ids, w, &s, &e), DSV4_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.message, "tid2eid[7, 1]"));
    /* top_p < 1 is ignored on hash layers. */
    t.tid[7 * 2 + 1] = 0;
    t.c.top_p = 0.1f;
    ck_assert_int_eq(toy_run(&t, "toy_hash_topp.safetensors", 2, x, in, y, ids, w, &s, &e), DSV4_OK);
    ck_assert_int_eq(s.pruned_slots, 0);
}
END_TEST

START_TEST(non_finite_row_is_isolated)
{
    toy t;
    memset(&t, 0, sizeof t);
    t.c = small_cfg(4, 2);
    t.c.route_scale = 1.5f;
    for (int x = 0; x < 4; x++) {
        t.gate[x * 4] = (float)x;
        toy_expert(&t, x, 1.0f, 0, 1.0f + (float)x, 0, W2_ID);
    }
    float x2[8] = {1, 0, 0, 0, NAN, 0, 0, 0}, y2[8], w2[4];
    int32_t ids2[4];
    dsv4_ref_stats s;
    dsv4_error e;
    ck_assert_int_eq(toy_run(&t, "toy_nan.safetensors", 2, x2, NULL, y2, ids2, w2, &s, &e), DSV4_OK);
    ck_assert_int_eq(s.nonfinite_rows, 1);
    ck_assert_int_eq(ids2[2], 0);
    ck_assert_int_eq(ids2[3], 1);
    ck_assert(w2[2] == 0.75f && w2[3] == 0.75f);
    /* Row 0 is what it is alone. */
    float y1[4], w1[2];
    int32_t ids1[2];
    ck_assert_int_eq(toy_run(&t, "toy_nan1.safetensors", 1, x2, NULL, y1, ids1, w1, &s, &e), DSV4_OK);
    ck_assert_int_eq(s.nonfinite_rows, 0);
    ck_assert_int_eq(memcmp(y1, y2, sizeof y1), 0);
    ck_assert_int_eq(ids1[0], 3);
    ck_assert_int_eq(ids1[1], 2);
}
END_TEST

START_TEST(top_p_in_the_layer)
{
    toy t;
    memset(&t, 0, sizeof t);
    t.c = small_cfg(4, 3);
    t.c.top_p = 0.4f;
    for (int x = 0; x < 4; x++) {
        t.gate[x * 4] = 2.0f * (float)x; /* weights 0.41, 0.34, 0.25 on experts 3, 2, 1 */
        toy_expert(&t, x, 1.0f, 0, 1.0f, 0, W2_ID);
    }
    float x[4] = {1, 0, 0, 0}, y[4], w[3];
    int32_t ids[3];
    dsv4_ref_stats s;
    dsv4_error e;
    ck_assert_int_eq(toy_run(&t, "toy_topp.safetensors", 1, x, NULL, y, ids, w, &s, &e), DSV4_OK);
    ck_assert_int_eq(ids[0], 3);
    ck_assert_int_eq(ids[1], 4);
    ck_assert_int_eq(ids[2], 4);
    ck_assert(w[1] == 0.0f && w[2] == 0.0f);
    ck_assert_int_eq(s.kept_slots, 1);
    ck_assert_int_eq(s.pruned_slots, 2);
    /* top_p = 1 keeps every slot. */
    t.c.top_p = 1.0f;
    ck_assert_int_eq(toy_run(&t, "toy_topp1.safetensors", 1, x, NULL, y, ids, w, &s, &e), DSV4_OK);
    ck_assert_int_eq(s.pruned_slots, 0);
    ck_assert_int_eq(ids[1], 2);
}
END_TEST

START_TEST(checkpoint_shape_mismatch_names_key)
{
    toy t = toy_one_expert();
    dsv4_checkpoint *ck = toy_open(&t, "toy_dims.safetensors");
    dsv4_error e;
    dsv4_config c = t.c;
    c.moe_inter_dim = 3; /* --set moe_inter_dim=3 against a checkpoint of I = 2 */
    dsv4_ref *r;
    ck_assert_int_eq(dsv4_ref_create(&c, ck, 1, &r, &e), DSV4_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(e.message, "layers.0.ffn.experts.0.w1.weight"));
    ck_assert_ptr_nonnull(strstr(e.message, "BF16 [2, 4]"));
    ck_assert_ptr_null(r);
    c = t.c;
    c.n_routed_experts = 3;
    ck_assert_int_eq(dsv4_ref_create(&c, ck, 1, &r, &e), DSV4_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(e.message, "layers.0.ffn.gate.weight"));
    dsv4_checkpoint_close(ck);
}
END_TEST


START_TEST(stacked_checkpoint_matches_split_and_quantizes_at_load)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset("mini-bf16", &c, NULL), DSV4_OK);
    c.layer = 2;
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    dsv4_error e;
    char split[512], stacked[512], in[512];
    ck_assert_int_eq(dsv4_gen_weights(&c, &o, tu_path(split, sizeof split, "st_split.safetensors"), &e), DSV4_OK);
    ck_assert_int_eq(dsv4_gen_input(&c, &o, 24, tu_path(in, sizeof in, "st_in.safetensors"), &e), DSV4_OK);
    o.layout = DSV4_LAYOUT_STACKED;
    o.model_prefix = true;
    ck_assert_int_eq(dsv4_gen_weights(&c, &o, tu_path(stacked, sizeof stacked, "st_stacked.safetensors"), &e),
                     DSV4_OK);
    dsv4_st_file *inf;
    ck_assert_int_eq(dsv4_st_open(in, &inf, &e), DSV4_OK);
    const uint16_t *xsrc = dsv4_st_find(inf, "x")->data;
    uint16_t x[24 * 256], y[24 * 256];
    memcpy(x, xsrc, sizeof x);
    uint64_t hashes[4];
    const char *paths[2] = {split, stacked};
    for (int q = 0; q < 4; q++) {
        dsv4_config cq = c;
        if (q >= 2) { /* the same stacked bf16 export, quantized at load */
            cq.routed_format = q == 2 ? DSV4_FORMAT_FP8 : DSV4_FORMAT_FP4;
            cq.shared_format = DSV4_FORMAT_FP8;
            cq.act_quant = DSV4_ACT_QUANT_UE8M0;
        }
        dsv4_checkpoint *ck;
        ck_assert_int_eq(dsv4_checkpoint_open(paths[q == 0 ? 0 : 1], &ck, &e), DSV4_OK);
        dsv4_ref *r;
        ck_assert_msg(dsv4_ref_create(&cq, ck, 2, &r, &e) == DSV4_OK, "%s", e.message);
        dsv4_ref_output out = {.y = y};
        ck_assert_int_eq(dsv4_ref_forward(r, 24, x, NULL, &out, &e), DSV4_OK);
        hashes[q] = dsv4_ref_hash(&cq, 24, &out);
        dsv4_ref_free(r);
        dsv4_checkpoint_close(ck);
    }
    ck_assert_uint_eq(hashes[0], hashes[1]);
    ck_assert_uint_ne(hashes[1], hashes[2]);
    ck_assert_uint_ne(hashes[2], hashes[3]);
    dsv4_st_close(inf);
}
END_TEST

START_TEST(empty_batch_and_bad_arguments)
{
    toy t = toy_one_expert();
    dsv4_checkpoint *ck = toy_open(&t, "toy_empty.safetensors");
    dsv4_error e;
    dsv4_ref *r;
    ck_assert_int_eq(dsv4_ref_create(&t.c, ck, 1, &r, &e), DSV4_OK);
    uint16_t y[4] = {0x1234, 0x1234, 0x1234, 0x1234};
    dsv4_ref_output out = {.y = y};
    ck_assert_int_eq(dsv4_ref_forward(r, 0, NULL, NULL, &out, &e), DSV4_OK);
    ck_assert_int_eq(out.stats.tokens, 0);
    ck_assert_int_eq(out.stats.kept_slots, 0);
    ck_assert_uint_eq(y[0], 0x1234);
    ck_assert_int_eq(dsv4_ref_forward(r, -1, NULL, NULL, &out, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_ref_forward(r, 1, NULL, NULL, &out, &e), DSV4_ERR_INVALID_ARG);
    dsv4_ref_free(r);
    dsv4_ref_free(NULL);
    ck_assert_int_eq(dsv4_ref_create(&t.c, ck, 0, &r, &e), DSV4_ERR_INVALID_ARG);
    dsv4_config bad = t.c;
    bad.n_activated = 3;
    ck_assert_int_eq(dsv4_ref_create(&bad, ck, 1, &r, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "n_activated"));
    dsv4_checkpoint_close(ck);
}
END_TEST


START_TEST(hostile_routing_tensors)
{
    /* A hash table row naming one expert twice: that expert runs twice for the token. */
    toy t = toy_hash4();
    for (int v = 0; v < 8; v++)
        t.tid[v * 2] = t.tid[v * 2 + 1] = 2;
    float x[12] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0}, y[12], w[6];
    int32_t in[3] = {0, 5, 7}, ids[6];
    dsv4_ref_stats s;
    dsv4_error e;
    ck_assert_msg(toy_run(&t, "toy_dup.safetensors", 3, x, in, y, ids, w, &s, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(ids[0], 2);
    ck_assert_int_eq(ids[1], 2);
    ck_assert(w[0] == 0.5f && w[1] == 0.5f); /* equal scores on both slots */
    float o = bf(bf(dsv4_ref_siluf(3.0f) * 1.0f * 0.5f) * 1.0f); /* before_w2: h carries the weight */
    ck_assert(y[0] == bf(o + o));
    ck_assert_int_eq(s.kept_slots, 6);

    /* Logits so negative that every score underflows to 0: the fallback, counted, not NaN. */
    toy z;
    memset(&z, 0, sizeof z);
    z.c = small_cfg(4, 2);
    for (int x2 = 0; x2 < 4; x2++) {
        z.gate[x2 * 4] = -200.0f;
        toy_expert(&z, x2, 1.0f, 0, 1.0f, 0, W2_ID);
    }
    float x1[4] = {1, 0, 0, 0}, y1[4], w1[2];
    int32_t ids1[2];
    ck_assert_int_eq(toy_run(&z, "toy_zero.safetensors", 1, x1, NULL, y1, ids1, w1, &s, &e), DSV4_OK);
    ck_assert_int_eq(s.nonfinite_rows, 1);
    ck_assert_int_eq(ids1[0], 0);
    ck_assert_int_eq(ids1[1], 1);
    ck_assert(w1[0] == 0.5f && w1[1] == 0.5f);
    ck_assert(y1[0] == y1[0]); /* not NaN */

    /* A NaN in the selection bias is refused at creation. */
    z.gate[0] = 0.0f;
    z.bias[2] = NAN;
    ck_assert_int_eq(toy_run(&z, "toy_nanbias.safetensors", 1, x1, NULL, y1, ids1, w1, &s, &e), DSV4_ERR_NUMERIC);
    ck_assert_ptr_nonnull(strstr(e.message, "layers.0.ffn.gate.bias"));
    ck_assert_ptr_nonnull(strstr(e.message, "element 2"));
}
END_TEST

/* ---------------- the experts' tiled dot products ---------------- */

/* Powers of two of random sign over 61 binades: their products span more than double's 53 bits
   and often cancel exactly, so the double sums round and a sum taken in another order (partial
   sums paired otherwise, a tail element in another partial sum) changes the fp32 result. */
static float spread_value(uint64_t key, uint64_t i)
{
    uint64_t r = dsv4_rng_u64(key, i);
    return ldexpf(r & 1 ? -1.0f : 1.0f, 15 * (int)((r >> 1) % 5) - 30);
}

START_TEST(dot_tile_matches_dot)
{
    static const int64_t lens[] = {1, 3, 4, 7, 130, 257}; /* every tail length of the four partial sums */
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int64_t n = lens[li], nt = 11; /* two blocks: 8 tokens, then 3 and 5 padding lanes */
        float *x = malloc((size_t)(nt * n) * sizeof *x), *w = malloc((size_t)(3 * n) * sizeof *w);
        double *xt = malloc((size_t)(DSV4_REF_TB * n) * sizeof *xt);
        ck_assert(x && w && xt);
        for (int64_t i = 0; i < nt * n; i++)
            x[i] = spread_value(11, (uint64_t)i);
        for (int64_t i = 0; i < 3 * n; i++)
            w[i] = spread_value(12, (uint64_t)i);
        const float *rows[DSV4_REF_NR] = {w, w + n, w + 2 * n, w + n}; /* a row may repeat */
        for (int64_t t0 = 0; t0 < nt; t0 += DSV4_REF_TB) {
            float out[DSV4_REF_NR * DSV4_REF_TB];
            dsv4_ref_block_tokens(x, nt, n, t0, xt);
            dsv4_ref_dot_tile(xt, rows, n, out);
            for (int r = 0; r < DSV4_REF_NR; r++)
                for (int64_t t = 0; t < DSV4_REF_TB; t++) {
                    float want = t0 + t < nt ? dsv4_ref_dot(x + (t0 + t) * n, rows[r], n) : 0.0f;
                    ck_assert_msg(!memcmp(&want, &out[r * DSV4_REF_TB + t], sizeof want),
                                  "n %lld token %lld row %d: tile %a, dot %a", (long long)n, (long long)(t0 + t), r,
                                  (double)out[r * DSV4_REF_TB + t], (double)want);
                }
        }
        free(x);
        free(w);
        free(xt);
    }
}
END_TEST

/* An FFN over many rows (tiled) gives each row the bits the same FFN gives that row alone (one
   dot at a time): routed and shared experts, fp4 and fp8 weights, the whole intermediate range,
   a 128-aligned part of it and an odd length (a chunk whose last row pairs with itself). */
START_TEST(ffn_tiled_rows_match_single_rows)
{
    static const char *presets[] = {"mini", "mini-fp8"};
    static const int64_t ranges[][2] = {{0, 256}, {128, 128}, {0, 65}};
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset(presets[_i], &c, NULL), DSV4_OK);
    ck_assert_int_eq(dsv4_config_set(&c, "moe_inter_dim", "256", NULL), DSV4_OK);
    c.layer = 1;
    char path[512], tag[64];
    snprintf(tag, sizeof tag, "tile_%s.safetensors", presets[_i]);
    tu_path(path, sizeof path, tag);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    dsv4_error e;
    ck_assert_int_eq(dsv4_gen_weights(&c, &o, path, &e), DSV4_OK);
    dsv4_checkpoint *ck;
    ck_assert_int_eq(dsv4_checkpoint_open(path, &ck, &e), DSV4_OK);
    dsv4_ref *r;
    ck_assert_msg(dsv4_ref_create(&c, ck, 2, &r, &e) == DSV4_OK, "%s", e.message);
    int64_t n = 13, H = c.dim;
    float *x = malloc((size_t)(n * H) * sizeof *x), *tw = malloc((size_t)n * sizeof *tw);
    float *all = malloc((size_t)(n * H) * sizeof *all), *one = malloc((size_t)H * sizeof *one);
    ck_assert(x && tw && all && one);
    for (int64_t i = 0; i < n * H; i++) /* bf16 values, as the layer's x; some rows clamp */
        x[i] = dsv4_round_bf16(4.0f * dsv4_rng_normal(21, (uint64_t)i));
    for (int64_t q = 0; q < n; q++)
        tw[q] = 0.05f + dsv4_rng_uniform(22, (uint64_t)q);
    uint64_t clamps = 0;
    for (int ex = 0; ex < 2; ex++) {
        int64_t expert = ex ? DSV4_SHARED_EXPERT : 5;
        const float *w = ex ? NULL : tw;
        for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
            int64_t i0 = ranges[ri][0], ni = ranges[ri][1];
            uint64_t g = 0, u = 0, g1 = 0, u1 = 0;
            ck_assert_int_eq(dsv4_ref_ffn_partial(r, 2, DSV4_ROUNDING_SPEC, expert, n, x, w, i0, ni, all, &g, &u, &e), DSV4_OK);
            for (int64_t q = 0; q < n; q++) {
                ck_assert_int_eq(dsv4_ref_ffn_partial(r, 1, DSV4_ROUNDING_SPEC, expert, 1, x + q * H, w ? w + q : NULL, i0, ni, one, &g1,
                                                      &u1, &e),
                                 DSV4_OK);
                ck_assert_msg(!memcmp(one, all + q * H, (size_t)H * sizeof *one),
                              "%s expert %lld rows [%lld, %lld): row %lld differs", presets[_i], (long long)expert,
                              (long long)i0, (long long)(i0 + ni), (long long)q);
            }
            ck_assert_uint_eq(g, g1);
            ck_assert_uint_eq(u, u1);
            clamps += g + u;
        }
    }
    ck_assert_uint_gt(clamps, 0);
    free(x);
    free(tw);
    free(all);
    free(one);
    dsv4_ref_free(r);
    dsv4_checkpoint_close(ck);
}
END_TEST

/* ---------------- canonical cases: hashes ---------------- */

typedef struct {
    const char *preset;
    int64_t layer;
    uint64_t hash;
    uint64_t profile_hash[2]; /* bf16_ops, fp32 (SPEC.md section 10): y, ids, weights, then y_terms */
} canon;

/* Pinned: the reference's output for seed 1, 32 tokens. A change is a change of numerics. */
static const canon canonical[] = {
    {"mini", 0, 0x48e0200f3511c03eULL, {0xeb09665e5e80d2d0ULL, 0xd6f5db7692873170ULL}},
    {"mini", 1, 0x60c5ebd0665633a1ULL, {0xb01b8edd8aacf073ULL, 0xa3e88269eee22f32ULL}},
    {"mini-fp8", 2, 0x911ca0389f98e611ULL, {0xef028b30816db362ULL, 0xfa61ba66548c00efULL}},
    {"mini-bf16", 3, 0x9a72f16e90c41dcaULL, {0x75c764cb618f2434ULL, 0x7580debd0db4542fULL}},
    {"mini-topp", 1, 0xe0e8bf2dd5d27673ULL, {0x49a49e04175d80b5ULL, 0x11cf0909b5f5aca5ULL}},
};

#define CANON_T 32

/* What one canonical run gives besides its hash (each may be NULL). */
typedef struct {
    dsv4_ref_stats stats;
    uint16_t *y;     /* [T, H] */
    float *terms;    /* [T, H]: y_terms; NULL: not asked for */
    int32_t *ids;    /* [T, K] */
    float *weights;  /* [T, K] */
} canon_out;

static uint64_t run_canonical_rounded(const canon *k, int threads, dsv4_rounding rnd, canon_out *co)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset(k->preset, &c, NULL), DSV4_OK);
    c.layer = k->layer;
    char w[512], in[512], tag[96];
    snprintf(tag, sizeof tag, "canon_%s_%lld.safetensors", k->preset, (long long)k->layer);
    tu_path(w, sizeof w, tag);
    snprintf(tag, sizeof tag, "canon_%s_%lld_in.safetensors", k->preset, (long long)k->layer);
    tu_path(in, sizeof in, tag);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    dsv4_error e;
    ck_assert_int_eq(dsv4_gen_weights(&c, &o, w, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_gen_input(&c, &o, 32, in, &e), DSV4_OK);
    dsv4_checkpoint *ck;
    dsv4_st_file *inf;
    ck_assert_int_eq(dsv4_checkpoint_open(w, &ck, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_open(in, &inf, &e), DSV4_OK);
    dsv4_ref *r;
    ck_assert_msg(dsv4_ref_create(&c, ck, threads, &r, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(dsv4_ref_set_rounding(r, rnd, &e), DSV4_OK);
    int64_t T = CANON_T, H = c.dim, K = c.n_activated;
    uint16_t *x = malloc((size_t)(T * H) * 2), *y = malloc((size_t)(T * H) * 2);
    int32_t *ids = malloc((size_t)T * 4), *topk = malloc((size_t)(T * K) * 4);
    float *topw = malloc((size_t)(T * K) * 4);
    memcpy(x, dsv4_st_find(inf, "x")->data, (size_t)(T * H) * 2);
    memcpy(ids, dsv4_st_find(inf, "input_ids")->data, (size_t)T * 4);
    dsv4_ref_output out = {.y = y, .topk_ids = topk, .topk_weights = topw};
    ck_assert_msg(dsv4_ref_forward_terms(r, T, x, ids, &out, co->terms, &e) == DSV4_OK, "%s", e.message);
    uint64_t h = dsv4_ref_hash(&c, T, &out);
    if (co->terms)
        h = dsv4_fnv1a(h, co->terms, (size_t)(T * H) * sizeof *co->terms);
    co->stats = out.stats;
    if (co->y)
        memcpy(co->y, y, (size_t)(T * H) * sizeof *y);
    if (co->ids)
        memcpy(co->ids, topk, (size_t)(T * K) * sizeof *topk);
    if (co->weights)
        memcpy(co->weights, topw, (size_t)(T * K) * sizeof *topw);
    if (getenv("DSV4MOE_PRINT_HASHES"))
        fprintf(stderr, "canonical %s layer %lld threads %d %s%s: 0x%016llxULL\n", k->preset, (long long)k->layer,
                threads, dsv4_rounding_name(rnd), co->terms ? " +terms" : "", (unsigned long long)h);
    free(x);
    free(y);
    free(ids);
    free(topk);
    free(topw);
    dsv4_ref_free(r);
    dsv4_st_close(inf);
    dsv4_checkpoint_close(ck);
    return h;
}

static uint64_t run_canonical(const canon *k, int threads, dsv4_ref_stats *stats)
{
    canon_out co = {.y = NULL};
    uint64_t h = run_canonical_rounded(k, threads, DSV4_ROUNDING_SPEC, &co);
    *stats = co.stats;
    return h;
}

START_TEST(canonical_hashes_at_1_and_2_threads)
{
    const canon *k = &canonical[_i];
    dsv4_ref_stats s1, s2;
    uint64_t h1 = run_canonical(k, 1, &s1), h2 = run_canonical(k, 2, &s2);
    ck_assert_msg(h1 == h2, "%s layer %lld: 1 thread %016llx, 2 threads %016llx", k->preset, (long long)k->layer,
                  (unsigned long long)h1, (unsigned long long)h2);
    ck_assert_msg(h1 == k->hash, "%s layer %lld: hash %016llx, pinned %016llx", k->preset, (long long)k->layer,
                  (unsigned long long)h1, (unsigned long long)k->hash);
    ck_assert_uint_gt(s1.routed_g_clamped + s1.routed_u_clamped, 0);
    if (!strcmp(k->preset, "mini-topp"))
        ck_assert_int_gt(s1.pruned_slots, 0);
    else
        ck_assert_int_eq(s1.pruned_slots, 0);
}
END_TEST

/* The three profiles of a canonical case (SPEC.md section 10): each bit-reproducible at 1 and 2
   threads (y, ids, weights and y_terms pinned), spec's y unchanged by asking for y_terms, the
   same routing in every profile, y within its terms, and on quantized layers y moved by the
   profile (bf16 layers: within the outside-engine bound of the spec reference). */
START_TEST(canonical_profiles)
{
    const canon *k = &canonical[_i];
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset(k->preset, &c, NULL), DSV4_OK);
    size_t TH = (size_t)(CANON_T * c.dim), TK = (size_t)(CANON_T * c.n_activated);
    uint16_t *y[3];
    float *terms[3], *wts[3], *t2 = malloc(TH * sizeof *t2);
    int32_t *ids[3];
    for (int p = 0; p < 3; p++) {
        y[p] = malloc(TH * sizeof *y[p]);
        terms[p] = malloc(TH * sizeof *terms[p]);
        ids[p] = malloc(TK * sizeof *ids[p]);
        wts[p] = malloc(TK * sizeof *wts[p]);
        canon_out co = {.y = y[p], .terms = terms[p], .ids = ids[p], .weights = wts[p]};
        uint64_t h1 = run_canonical_rounded(k, 1, (dsv4_rounding)p, &co);
        canon_out c2 = {.terms = t2};
        uint64_t h2 = run_canonical_rounded(k, 2, (dsv4_rounding)p, &c2);
        ck_assert_msg(h1 == h2, "%s layer %lld %s: 1 thread %016llx, 2 threads %016llx", k->preset,
                      (long long)k->layer, dsv4_rounding_name((dsv4_rounding)p), (unsigned long long)h1,
                      (unsigned long long)h2);
        if (p == 0) {
            canon_out plain = {.y = NULL};
            ck_assert_uint_eq(run_canonical_rounded(k, 1, DSV4_ROUNDING_SPEC, &plain), k->hash);
        } else
            ck_assert_msg(h1 == k->profile_hash[p - 1], "%s layer %lld %s: hash 0x%016llxULL, pinned %016llx",
                          k->preset, (long long)k->layer, dsv4_rounding_name((dsv4_rounding)p), (unsigned long long)h1,
                          (unsigned long long)k->profile_hash[p - 1]);
    }
    bool quant = c.act_quant != DSV4_ACT_QUANT_NONE;
    for (int p = 1; p < 3; p++) {
        ck_assert(!memcmp(ids[p], ids[0], TK * sizeof *ids[0]));
        ck_assert(!memcmp(wts[p], wts[0], TK * sizeof *wts[0]));
        size_t moved = 0, beyond = 0;
        for (size_t i = 0; i < TH; i++) {
            float a = dsv4_bf16_to_f32(y[p][i]), b = dsv4_bf16_to_f32(y[0][i]);
            moved += a != b;
            beyond += fabsf(a - b) > 0.035f + 0.035f * fabsf(b) + 0x1p-8f * terms[0][i];
        }
        if (quant)
            ck_assert_msg(moved > TH / 100, "%s %s: %zu of %zu moved", k->preset,
                          dsv4_rounding_name((dsv4_rounding)p), moved, TH);
        else /* SPEC.md section 10: on bf16 layers each profile passes the others' reference */
            ck_assert_msg(beyond <= TH / 200, "%s %s: %zu beyond", k->preset, dsv4_rounding_name((dsv4_rounding)p),
                          beyond);
    }
    for (int p = 0; p < 3; p++)
        for (size_t i = 0; i < TH; i++) /* |y| <= S up to y's own bf16 rounding */
            ck_assert(fabsf(dsv4_bf16_to_f32(y[p][i])) <= terms[p][i] * (1.0f + 0x1p-7f) + 1e-30f);
    for (int p = 0; p < 3; p++) {
        free(y[p]);
        free(terms[p]);
        free(ids[p]);
        free(wts[p]);
    }
    free(t2);
}
END_TEST

Suite *ref_suite(void)
{
    Suite *s = suite_create("ref");
    TCase *tc = tcase_create("hand-worked");
    tcase_add_test(tc, math_functions_match_libm);
    tcase_add_test(tc, scores_each_function);
    tcase_add_test(tc, select_ties_bias_and_normalisation);
    tcase_add_test(tc, top_p_worked_examples);
    tcase_add_test(tc, clamp_at_and_beyond_limit);
    tcase_add_test(tc, clamp_alternates_by_hand);
    tcase_add_test(tc, shared_clamp_on_and_off);
    tcase_add_test(tc, weight_point_both_ways);
    tcase_add_test(tc, rounding_profiles_by_hand);
    tcase_add_test(tc, rounding_names_and_bad_values);
    tcase_add_test(tc, combine_in_ascending_expert_order);
    tcase_add_test(tc, hash_layer_lookup_and_range_errors);
    tcase_add_test(tc, non_finite_row_is_isolated);
    tcase_add_test(tc, top_p_in_the_layer);
    tcase_add_test(tc, checkpoint_shape_mismatch_names_key);
    tcase_add_test(tc, stacked_checkpoint_matches_split_and_quantizes_at_load);
    tcase_add_test(tc, empty_batch_and_bad_arguments);
    tcase_add_test(tc, hostile_routing_tensors);
    tcase_add_test(tc, dot_tile_matches_dot);
    tcase_add_loop_test(tc, ffn_tiled_rows_match_single_rows, 0, 2);
    suite_add_tcase(s, tc);
    TCase *tk = tcase_create("canonical");
    tcase_set_timeout(tk, 300);
    tcase_add_loop_test(tk, canonical_hashes_at_1_and_2_threads, 0, (int)(sizeof canonical / sizeof canonical[0]));
    tcase_add_loop_test(tk, canonical_profiles, 0, (int)(sizeof canonical / sizeof canonical[0]));
    suite_add_tcase(s, tk);
    return s;
}
