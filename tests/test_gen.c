#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe/weights.h"
#include "tests/testutil.h"

Suite *gen_suite(void);

static dsv4_config preset_at(const char *name, int64_t layer)
{
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset(name, &c, NULL), DSV4_OK);
    c.layer = layer;
    return c;
}

static void gen_pair(const dsv4_config *c, int threads, const char *wname, const char *iname, int64_t tokens)
{
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.threads = threads;
    char w[512], in[512];
    dsv4_error e;
    ck_assert_msg(dsv4_gen_weights(c, &o, tu_path(w, sizeof w, wname), &e) == DSV4_OK, "%s", e.message);
    if (iname)
        ck_assert_msg(dsv4_gen_input(c, &o, tokens, tu_path(in, sizeof in, iname), &e) == DSV4_OK, "%s", e.message);
}

/* The checkpoint holds tensor `name` of dtype dt and shape [rows, cols] (-1: not checked). */
static void expect_tensor(const dsv4_checkpoint *ck, const char *name, dsv4_dtype dt, int64_t rows, int64_t cols)
{
    const dsv4_tensor_info *t = dsv4_checkpoint_find(ck, name);
    ck_assert_msg(t != NULL, "%s missing", name);
    ck_assert_msg(t->dtype == dt, "%s: dtype %d, expected %d", name, (int)t->dtype, (int)dt);
    if (rows >= 0)
        ck_assert_msg(t->shape[0] == rows && t->shape[1] == cols, "%s: shape [%lld, %lld], expected [%lld, %lld]", name,
                      (long long)t->shape[0], (long long)t->shape[1], (long long)rows, (long long)cols);
}

START_TEST(split_layout_keys_dtypes_shapes)
{
    dsv4_config c = preset_at("mini", 1);
    gen_pair(&c, 2, "gen_mini_l1.safetensors", NULL, 0);
    char p[512];
    dsv4_checkpoint *ck;
    dsv4_error e;
    ck_assert_int_eq(dsv4_checkpoint_open(tu_path(p, sizeof p, "gen_mini_l1.safetensors"), &ck, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_checkpoint_layout(ck), DSV4_LAYOUT_SPLIT);
    /* gate + bias + 16 experts x 3 matrices x (weight, scale) + shared 3 x 2 */
    ck_assert_uint_eq(dsv4_checkpoint_tensor_count(ck), 2 + 16 * 3 * 2 + 3 * 2);
    expect_tensor(ck, "layers.1.ffn.experts.15.w1.weight", DSV4_DTYPE_I8, 128, 128);
    expect_tensor(ck, "layers.1.ffn.experts.15.w2.scale", DSV4_DTYPE_F8_E8M0, 256, 4);
    expect_tensor(ck, "layers.1.ffn.shared_experts.w2.weight", DSV4_DTYPE_F8_E4M3, 256, 128);
    expect_tensor(ck, "layers.1.ffn.shared_experts.w2.scale", DSV4_DTYPE_F8_E8M0, 2, 1);
    expect_tensor(ck, "layers.1.ffn.gate.weight", DSV4_DTYPE_BF16, -1, -1);
    expect_tensor(ck, "layers.1.ffn.gate.bias", DSV4_DTYPE_F32, -1, -1);
    ck_assert_ptr_null(dsv4_checkpoint_find(ck, "layers.1.ffn.gate.tid2eid"));
    /* Every view the loader builds passes the [N, K] contract. */
    for (int64_t ex = -1; ex < 16; ex++)
        for (int pr = 0; pr < 3; pr++) {
            dsv4_matrix_view m;
            ck_assert_msg(dsv4_weights_matrix(ck, &c, ex, (dsv4_proj)pr, &m, &e) == DSV4_OK, "%s", e.message);
        }
    dsv4_router_view r;
    ck_assert_int_eq(dsv4_weights_router(ck, &c, &r, &e), DSV4_OK);
    ck_assert_ptr_nonnull(r.bias);
    ck_assert_ptr_null(r.tid2eid);
    /* Asking for the wrong format is an error naming the key. */
    dsv4_config wrong = c;
    wrong.routed_format = DSV4_FORMAT_FP8;
    dsv4_matrix_view m;
    ck_assert_int_eq(dsv4_weights_matrix(ck, &wrong, 3, DSV4_PROJ_W1, &m, &e), DSV4_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(e.message, "layers.1.ffn.experts.3.w1.weight"));
    ck_assert_ptr_nonnull(strstr(e.message, "I8 [128, 128]"));
    ck_assert_int_eq(dsv4_weights_matrix(ck, &c, 16, DSV4_PROJ_W1, &m, &e), DSV4_ERR_RANGE);
    dsv4_checkpoint_close(ck);
}
END_TEST

START_TEST(hash_layer_tid2eid_distinct_in_range)
{
    dsv4_config c = preset_at("mini", 0);
    gen_pair(&c, 1, "gen_mini_l0.safetensors", NULL, 0);
    char p[512];
    dsv4_checkpoint *ck;
    dsv4_error e;
    ck_assert_int_eq(dsv4_checkpoint_open(tu_path(p, sizeof p, "gen_mini_l0.safetensors"), &ck, &e), DSV4_OK);
    dsv4_router_view r;
    ck_assert_int_eq(dsv4_weights_router(ck, &c, &r, &e), DSV4_OK);
    ck_assert_ptr_nonnull(r.tid2eid);
    ck_assert_ptr_null(r.bias);
    int used[16] = {0};
    for (int64_t v = 0; v < c.vocab_size; v++)
        for (int j = 0; j < 4; j++) {
            int32_t id = dsv4_load_i32(r.tid2eid, v * 4 + j);
            ck_assert_int_ge(id, 0);
            ck_assert_int_lt(id, 16);
            used[id]++;
            for (int jj = 0; jj < j; jj++)
                ck_assert_int_ne(id, dsv4_load_i32(r.tid2eid, v * 4 + jj));
        }
    for (int x = 0; x < 16; x++) /* 2048 slots over 16 experts: about 128 each */
        ck_assert_msg(used[x] > 80 && used[x] < 180, "expert %d used %d times", x, used[x]);
    dsv4_checkpoint_close(ck);
}
END_TEST

START_TEST(output_independent_of_threads)
{
    dsv4_config c = preset_at("mini-fp8", 2);
    gen_pair(&c, 1, "gen_t1.safetensors", "gen_t1_in.safetensors", 33);
    gen_pair(&c, 2, "gen_t2.safetensors", "gen_t2_in.safetensors", 33);
    const char *pairs[2][2] = {{"gen_t1.safetensors", "gen_t2.safetensors"},
                               {"gen_t1_in.safetensors", "gen_t2_in.safetensors"}};
    for (int i = 0; i < 2; i++) {
        char a[512], b[512];
        size_t na, nb;
        unsigned char *da = tu_slurp(tu_path(a, sizeof a, pairs[i][0]), &na);
        unsigned char *db = tu_slurp(tu_path(b, sizeof b, pairs[i][1]), &nb);
        ck_assert(da && db);
        ck_assert_uint_eq(na, nb);
        ck_assert_int_eq(memcmp(da, db, na), 0);
        free(da);
        free(db);
    }
}
END_TEST

/* The progress callback: called once per tensor with bytes done and the layer's data bytes, the
   last call at done == total == the file's data size; the same file as without it; a caller that
   passes the struct size from before the callback is accepted (and gets none). */
typedef struct {
    int calls;
    uint64_t last_done, total;
    bool monotonic;
} prog_seen;

static void on_progress(void *user, uint64_t done, uint64_t total)
{
    prog_seen *p = user;
    p->monotonic &= done > p->last_done && (p->total == 0 || p->total == total);
    p->calls++;
    p->last_done = done;
    p->total = total;
}

START_TEST(progress_reports_every_tensor)
{
    dsv4_config c = preset_at("mini", 1);
    char a[512], b[512];
    tu_path(a, sizeof a, "gen_prog.safetensors");
    tu_path(b, sizeof b, "gen_prog_old.safetensors");
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    prog_seen seen = {0, 0, 0, true};
    o.progress = on_progress;
    o.progress_user = &seen;
    dsv4_error e;
    ck_assert_msg(dsv4_gen_weights(&c, &o, a, &e) == DSV4_OK, "%s", e.message);
    dsv4_st_file *f = NULL;
    ck_assert_int_eq(dsv4_st_open(a, &f, &e), DSV4_OK);
    ck_assert_int_eq(seen.calls, (int)dsv4_st_count(f));
    ck_assert(seen.monotonic);
    ck_assert_uint_eq(seen.last_done, seen.total);
    uint64_t data = 0;
    for (size_t i = 0; i < dsv4_st_count(f); i++)
        data += dsv4_st_tensor(f, i)->nbytes;
    ck_assert_uint_eq(seen.total, data);
    dsv4_st_close(f);
    /* the size before the callback: accepted, no calls, the same bytes */
    dsv4_gen_options old;
    dsv4_gen_options_init(&old);
    old.struct_size = (uint32_t)offsetof(dsv4_gen_options, progress);
    seen.calls = 0;
    ck_assert_msg(dsv4_gen_weights(&c, &old, b, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(seen.calls, 0);
    size_t na = 0, nb = 0;
    unsigned char *da = tu_slurp(a, &na), *db = tu_slurp(b, &nb);
    ck_assert(da && db && na == nb && !memcmp(da, db, na));
    free(da);
    free(db);
}
END_TEST

START_TEST(stacked_and_split_hold_the_same_layer)
{
    dsv4_config c = preset_at("mini-bf16", 3);
    gen_pair(&c, 2, "gen_split_bf16.safetensors", NULL, 0);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.layout = DSV4_LAYOUT_STACKED;
    o.model_prefix = true;
    char sp[512], st[512];
    dsv4_error e;
    ck_assert_msg(dsv4_gen_weights(&c, &o, tu_path(st, sizeof st, "gen_stacked.safetensors"), &e) == DSV4_OK, "%s",
                  e.message);
    dsv4_checkpoint *a, *b;
    ck_assert_int_eq(dsv4_checkpoint_open(tu_path(sp, sizeof sp, "gen_split_bf16.safetensors"), &a, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_checkpoint_open(st, &b, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_checkpoint_layout(b), DSV4_LAYOUT_STACKED);
    ck_assert_str_eq(dsv4_checkpoint_prefix(b), "model.");
    ck_assert_ptr_nonnull(dsv4_checkpoint_find(b, "model.layers.3.mlp.experts.gate_up_proj"));
    float *wa = malloc(256 * 128 * sizeof(float)), *wb = malloc(256 * 128 * sizeof(float));
    for (int64_t ex = -1; ex < 16; ex++)
        for (int pr = 0; pr < 3; pr++) {
            dsv4_matrix_view ma, mb;
            ck_assert_int_eq(dsv4_weights_matrix(a, &c, ex, (dsv4_proj)pr, &ma, &e), DSV4_OK);
            ck_assert_msg(dsv4_weights_matrix(b, &c, ex, (dsv4_proj)pr, &mb, &e) == DSV4_OK, "%s", e.message);
            dsv4_matrix_dequant_rows(&ma, 0, ma.n, wa);
            dsv4_matrix_dequant_rows(&mb, 0, mb.n, wb);
            ck_assert_int_eq(memcmp(wa, wb, (size_t)(ma.n * ma.k) * sizeof(float)), 0);
        }
    dsv4_router_view ra, rb;
    ck_assert_int_eq(dsv4_weights_router(a, &c, &ra, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_weights_router(b, &c, &rb, &e), DSV4_OK);
    ck_assert_int_eq(memcmp(ra.gate, rb.gate, 16 * 256 * 2), 0);
    ck_assert_int_eq(memcmp(ra.bias, rb.bias, 16 * 4), 0);
    free(wa);
    free(wb);
    dsv4_checkpoint_close(a);
    dsv4_checkpoint_close(b);
    /* Stacked needs bf16: asking for fp4 is refused and writes nothing. */
    dsv4_config q = preset_at("mini", 1);
    ck_assert_int_eq(dsv4_gen_weights(&q, &o, tu_path(st, sizeof st, "gen_stacked_fp4.safetensors"), &e),
                     DSV4_ERR_CONFIG);
    ck_assert(!tu_file_exists(st));
}
END_TEST

/* Routing over the generated data is spread: sqrtsoftplus + bias, top-K, as SPEC.md section 2. */
START_TEST(routing_not_degenerate)
{
    dsv4_config c = preset_at("mini", 1);
    gen_pair(&c, 2, "gen_route.safetensors", "gen_route_in.safetensors", 256);
    char p[512], q[512];
    dsv4_checkpoint *ck;
    dsv4_st_file *in;
    dsv4_error e;
    ck_assert_int_eq(dsv4_checkpoint_open(tu_path(p, sizeof p, "gen_route.safetensors"), &ck, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_open(tu_path(q, sizeof q, "gen_route_in.safetensors"), &in, &e), DSV4_OK);
    dsv4_router_view r;
    ck_assert_int_eq(dsv4_weights_router(ck, &c, &r, &e), DSV4_OK);
    const dsv4_tensor_info *x = dsv4_st_find(in, "x");
    ck_assert_ptr_nonnull(x);
    int load[16] = {0};
    for (int t = 0; t < 256; t++) {
        double b[16];
        for (int ex = 0; ex < 16; ex++) {
            double l = 0;
            for (int h = 0; h < 256; h++)
                l += (double)dsv4_load_bf16(x->data, t * 256 + h) * dsv4_load_bf16(r.gate, ex * 256 + h);
            b[ex] = sqrt(l > 20 ? l : log1p(exp(l))) + dsv4_load_f32(r.bias, ex);
        }
        for (int k = 0; k < 4; k++) {
            int best = -1;
            for (int ex = 0; ex < 16; ex++)
                if (b[ex] > -1e30 && (best < 0 || b[ex] > b[best]))
                    best = ex;
            load[best]++;
            b[best] = -1e31;
        }
    }
    int used = 0, maxload = 0;
    for (int ex = 0; ex < 16; ex++) {
        used += load[ex] > 0;
        maxload = load[ex] > maxload ? load[ex] : maxload;
    }
    ck_assert_int_eq(used, 16);
    ck_assert_msg(maxload < 256 / 2, "one expert takes %d of 1024 slots", maxload);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}
END_TEST

static void probe_preset(dsv4_config c, const char *tag)
{
    char w[64], i[64];
    snprintf(w, sizeof w, "probe_%s.safetensors", tag);
    snprintf(i, sizeof i, "probe_%s_in.safetensors", tag);
    gen_pair(&c, 2, w, i, 16);
    char p[512], q[512];
    dsv4_checkpoint *ck;
    dsv4_st_file *in;
    dsv4_error e;
    ck_assert_int_eq(dsv4_checkpoint_open(tu_path(p, sizeof p, w), &ck, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_open(tu_path(q, sizeof q, i), &in, &e), DSV4_OK);
    dsv4_clamp_probe pr;
    ck_assert_msg(dsv4_gen_probe_clamp(ck, &c, in, 16, 8, &pr, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(pr.tokens, 16);
    ck_assert_uint_eq(pr.values, (uint64_t)(16 * pr.experts * c.moe_inter_dim));
    double gf = (double)pr.g_clamped / (double)pr.values, uf = (double)pr.u_clamped / (double)pr.values;
    /* Aimed at std 4: |u| > 10 about 1.2 %, g > 10 about 0.6 %. Above zero, and not absurd. */
    ck_assert_msg(pr.g_clamped > 0 && pr.u_clamped > 0, "%s: g %llu u %llu of %llu", tag,
                  (unsigned long long)pr.g_clamped, (unsigned long long)pr.u_clamped, (unsigned long long)pr.values);
    ck_assert_msg(uf > 0.002 && uf < 0.05 && gf < 0.05, "%s: g %.4f u %.4f", tag, gf, uf);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
}

START_TEST(clamp_exercised_by_default_presets)
{
    probe_preset(preset_at("mini", 1), "mini");
    probe_preset(preset_at("mini-fp8", 1), "minifp8");
    probe_preset(preset_at("mini-bf16", 1), "minibf16");
    probe_preset(preset_at("tiny", 1), "tiny");
    /* The v4-flash shapes (H 4096, I 2048, fp4/fp8) with 8 experts, to keep the file small. */
    dsv4_config f = preset_at("v4-flash", 5);
    f.n_routed_experts = 8;
    probe_preset(f, "flash8");
}
END_TEST

START_TEST(input_file_contents)
{
    dsv4_config c = preset_at("mini", 1);
    gen_pair(&c, 1, "gen_in_w.safetensors", "gen_in.safetensors", 100);
    char p[512];
    dsv4_st_file *in;
    dsv4_error e;
    ck_assert_int_eq(dsv4_st_open(tu_path(p, sizeof p, "gen_in.safetensors"), &in, &e), DSV4_OK);
    const dsv4_tensor_info *x = dsv4_st_find(in, "x"), *ids = dsv4_st_find(in, "input_ids");
    ck_assert_int_eq(x->dtype, DSV4_DTYPE_BF16);
    ck_assert_int_eq(x->shape[0], 100);
    ck_assert_int_eq(x->shape[1], 256);
    ck_assert_int_eq(ids->dtype, DSV4_DTYPE_I32);
    ck_assert_int_eq(ids->shape[0], 100);
    double s2 = 0;
    float amax = 0;
    for (int i = 0; i < 100 * 256; i++) {
        float v = dsv4_load_bf16(x->data, i);
        ck_assert(isfinite(v));
        s2 += (double)v * v;
        amax = fabsf(v) > amax ? fabsf(v) : amax;
    }
    double rms = sqrt(s2 / (100 * 256));
    ck_assert_msg(rms > 0.9 && rms < 1.4, "rms %g", rms);
    ck_assert_msg(amax > 4.0f, "no outlier channel: amax %g", (double)amax);
    for (int t = 0; t < 100; t++) {
        int32_t id = dsv4_load_i32(ids->data, t);
        ck_assert(id >= 0 && id < 512);
    }
    dsv4_st_close(in);
    /* T = 0 is a valid input. */
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    ck_assert_int_eq(dsv4_gen_input(&c, &o, 0, tu_path(p, sizeof p, "gen_in0.safetensors"), &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_open(p, &in, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_st_find(in, "x")->shape[0], 0);
    dsv4_st_close(in);
}
END_TEST

START_TEST(invalid_requests_write_nothing)
{
    dsv4_config c = preset_at("mini", 1);
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    dsv4_error e;
    char p[512];
    tu_path(p, sizeof p, "gen_never.safetensors");
    c.n_activated = 17;
    ck_assert_int_eq(dsv4_gen_weights(&c, &o, p, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "n_activated"));
    c = preset_at("mini", -1);
    ck_assert_int_eq(dsv4_gen_weights(&c, &o, p, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "layer"));
    c = preset_at("mini", 1);
    o.threads = 0;
    ck_assert_int_eq(dsv4_gen_weights(&c, &o, p, &e), DSV4_ERR_INVALID_ARG);
    dsv4_gen_options_init(&o);
    ck_assert_int_eq(dsv4_gen_input(&c, &o, -1, p, &e), DSV4_ERR_INVALID_ARG);
    ck_assert_int_eq(dsv4_gen_weights(&c, &o, "/nonexistent-dir/w.safetensors", &e), DSV4_ERR_IO);
    ck_assert(!tu_file_exists(p));
}
END_TEST

Suite *gen_suite(void)
{
    Suite *s = suite_create("gen");
    TCase *tc = tcase_create("gen");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, split_layout_keys_dtypes_shapes);
    tcase_add_test(tc, hash_layer_tid2eid_distinct_in_range);
    tcase_add_test(tc, output_independent_of_threads);
    tcase_add_test(tc, progress_reports_every_tensor);
    tcase_add_test(tc, stacked_and_split_hold_the_same_layer);
    tcase_add_test(tc, routing_not_degenerate);
    tcase_add_test(tc, clamp_exercised_by_default_presets);
    tcase_add_test(tc, input_file_contents);
    tcase_add_test(tc, invalid_requests_write_nothing);
    suite_add_tcase(s, tc);
    return s;
}
