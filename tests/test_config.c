#include <check.h>
#include <math.h>
#include <string.h>

#include "dsv4moe/config.h"
#include "tests/testutil.h"

Suite *config_suite(void);

static dsv4_config flash_at(int64_t layer)
{
    dsv4_config c;
    dsv4_config_init(&c);
    c.layer = layer;
    return c;
}

START_TEST(presets_are_valid_and_match_spec)
{
    for (const char *const *p = dsv4_config_preset_names(); *p; p++) {
        dsv4_config c;
        dsv4_error e;
        ck_assert_int_eq(dsv4_config_preset(*p, &c, &e), DSV4_OK);
        ck_assert_int_eq(c.layer, -1);
        c.layer = c.n_layers - 1;
        ck_assert_msg(dsv4_config_validate(&c, &e) == DSV4_OK, "%s: %s", *p, e.message);
        ck_assert_int_lt(c.n_activated, c.n_routed_experts);
    }
    dsv4_config c;
    ck_assert_int_eq(dsv4_config_preset("v4-flash", &c, NULL), DSV4_OK);
    ck_assert_int_eq(c.dim, 4096);
    ck_assert_int_eq(c.moe_inter_dim, 2048);
    ck_assert_int_eq(c.n_routed_experts, 256);
    ck_assert_int_eq(c.n_activated, 6);
    ck_assert_int_eq(c.n_hash_layers, 3);
    ck_assert_int_eq(c.vocab_size, 129280);
    ck_assert_int_eq(c.n_layers, 43);
    ck_assert(c.route_scale == 1.5f && c.swiglu_limit == 10.0f);
    ck_assert_int_eq(c.routed_format, DSV4_FORMAT_FP4);
    ck_assert_int_eq(c.shared_format, DSV4_FORMAT_FP8);
    ck_assert_int_eq(dsv4_config_preset("v4-pro", &c, NULL), DSV4_OK);
    ck_assert_int_eq(c.dim, 7168);
    ck_assert_int_eq(c.moe_inter_dim, 3072);
    ck_assert_int_eq(c.n_routed_experts, 384);
    ck_assert(c.route_scale == 2.5f);
    ck_assert_int_eq(c.n_layers, 61);
    /* The mini presets keep hash and non-hash layers alive, with 128-multiples. */
    ck_assert_int_eq(dsv4_config_preset("mini", &c, NULL), DSV4_OK);
    ck_assert_int_eq(c.dim % 128, 0);
    ck_assert_int_eq(c.moe_inter_dim % 128, 0);
    c.layer = 0;
    ck_assert(dsv4_config_is_hash_layer(&c));
    c.layer = 1;
    ck_assert(!dsv4_config_is_hash_layer(&c));
}
END_TEST

START_TEST(unknown_preset_lists_known)
{
    dsv4_config c;
    dsv4_error e;
    ck_assert_int_eq(dsv4_config_preset("v5", &c, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "'v5'"));
    ck_assert_ptr_nonnull(strstr(e.message, "mini-topp"));
}
END_TEST

/* Each row: a key, a bad value, and a fragment the message must contain. */
static const struct {
    const char *key, *value, *fragment;
} bad_values[] = {
    {"n_activated", "0", "[1, n_routed_experts = 256]"},
    {"n_activated", "257", "[1, n_routed_experts = 256]"},
    {"dim", "4000", "multiple of 128"},
    {"dim", "0", "[1, 1048576]"},
    {"moe_inter_dim", "2000", "multiple of 128"},
    {"n_routed_experts", "0", "[1, 65536]"},
    {"n_shared_experts", "2", "0 or 1"},
    {"vocab_size", "0", "[1, 2147483647]"},
    {"n_hash_layers", "-1", "[0, n_layers = 43]"},
    {"layer", "-2", "required"},
    {"layer", "43", "below n_layers = 43"},
    {"swiglu_limit", "-1", "finite and >= 0"},
    {"route_scale", "0", "finite and > 0"},
    {"route_scale", "-1.5", "finite and > 0"},
    {"norm_eps", "-0.1", "finite and >= 0"},
    {"top_p", "0", "(0, 1]"},
    {"top_p", "1.01", "(0, 1]"},
    {"top_p_min_keep", "0", "[1, n_activated = 6]"},
    {"top_p_min_keep", "7", "[1, n_activated = 6]"},
    {"shared_format", "fp4", "shared expert is bf16 or fp8"},
};

START_TEST(validate_rejects_each_bad_value)
{
    int i = _i;
    dsv4_config c = flash_at(5);
    dsv4_error e;
    ck_assert_int_eq(dsv4_config_set(&c, bad_values[i].key, bad_values[i].value, &e), DSV4_OK);
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_ERR_CONFIG);
    char field[96];
    snprintf(field, sizeof field, "'%s'", bad_values[i].key);
    ck_assert_msg(strstr(e.message, field) != NULL, "%s: message '%s' does not name the field", bad_values[i].key,
                  e.message);
    ck_assert_msg(strstr(e.message, bad_values[i].fragment) != NULL, "%s=%s: message '%s' lacks '%s'",
                  bad_values[i].key, bad_values[i].value, e.message, bad_values[i].fragment);
}
END_TEST

START_TEST(validate_rejects_non_finite_and_bad_enums)
{
    dsv4_config c = flash_at(5);
    dsv4_error e;
    c.swiglu_limit = NAN;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "swiglu_limit"));
    c = flash_at(5);
    c.swiglu_limit = INFINITY;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_ERR_CONFIG);
    c = flash_at(5);
    c.top_p = NAN;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "top_p"));
    c = flash_at(5);
    c.score_func = (dsv4_score_func)7;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "score_func"));
    ck_assert_ptr_nonnull(strstr(e.message, "sqrtsoftplus"));
    c = flash_at(5);
    c.struct_size = 8;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "struct_size"));
    c = flash_at(5);
    c.version = 99;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "version"));
    ck_assert_int_eq(dsv4_config_validate(NULL, &e), DSV4_ERR_INVALID_ARG);
}
END_TEST

START_TEST(dims_follow_formats)
{
    /* fp4 routed + bf16 shared needs only multiples of 32; fp8 anywhere needs 128. */
    dsv4_config c = flash_at(5);
    dsv4_error e;
    c.shared_format = DSV4_FORMAT_BF16;
    c.dim = 4096 + 32;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_OK);
    c.dim = 4096 + 16;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "multiple of 32"));
    c.routed_format = DSV4_FORMAT_BF16;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_OK);
    c.routed_format = DSV4_FORMAT_FP8;
    c.dim = 4096 + 32;
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "multiple of 128"));
}
END_TEST

START_TEST(set_parses_every_key_and_round_trips)
{
    dsv4_config c = flash_at(5);
    dsv4_error e;
    const char *kv[] = {"dim=256", "moe_inter_dim=128", "n_routed_experts=16", "n_activated=4",
                        "n_shared_experts=0", "n_hash_layers=1", "vocab_size=512", "n_layers=4", "layer=2",
                        "score_func=softmax", "gate_logits=bf16", "route_scale=2.5", "norm_eps=0",
                        "swiglu_limit=7", "shared_clamp=false", "weight_point=after_w2", "top_p=0.75",
                        "top_p_min_keep=2", "top_p_renorm=true", "top_p_predictor=linear", "routed_format=fp8",
                        "shared_format=bf16", "weight_scale=fp32", "act_quant=fp32", "gemm=exact"};
    size_t n = sizeof kv / sizeof kv[0];
    size_t nkeys = 0;
    while (dsv4_config_keys()[nkeys])
        nkeys++;
    ck_assert_uint_eq(n, nkeys);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(dsv4_config_set_kv(&c, kv[i], &e) == DSV4_OK, "%s: %s", kv[i], e.message);
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_OK);
    ck_assert_int_eq(c.dim, 256);
    ck_assert_int_eq(c.score_func, DSV4_SCORE_SOFTMAX);
    ck_assert_int_eq(c.gate_logits, DSV4_GATE_LOGITS_BF16);
    ck_assert(c.route_scale == 2.5f && c.swiglu_limit == 7.0f && c.top_p == 0.75f);
    ck_assert(!c.shared_clamp && c.top_p_renorm);
    ck_assert_int_eq(c.weight_point, DSV4_WEIGHT_AFTER_W2);
    ck_assert_int_eq(c.top_p_predictor, DSV4_PREDICTOR_LINEAR);
    ck_assert_int_eq(c.routed_format, DSV4_FORMAT_FP8);
    ck_assert_int_eq(c.weight_scale, DSV4_SCALE_FP32);
    ck_assert_int_eq(c.act_quant, DSV4_ACT_QUANT_FP32);
    /* get returns text that set accepts, giving the same struct. */
    dsv4_config d = flash_at(0);
    for (const char *const *k = dsv4_config_keys(); *k; k++) {
        char buf[64];
        ck_assert_int_eq(dsv4_config_get(&c, *k, buf, sizeof buf, &e), DSV4_OK);
        ck_assert_int_eq(dsv4_config_set(&d, *k, buf, &e), DSV4_OK);
    }
    ck_assert_int_eq(memcmp(&c, &d, sizeof c), 0);
}
END_TEST

START_TEST(set_rejects_bad_syntax_unchanged)
{
    dsv4_config c = flash_at(5), before = c;
    dsv4_error e;
    ck_assert_int_eq(dsv4_config_set(&c, "dim", "12x", &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "'dim'"));
    ck_assert_ptr_nonnull(strstr(e.message, "12x"));
    ck_assert_int_eq(dsv4_config_set(&c, "dim", "", &e), DSV4_ERR_CONFIG);
    ck_assert_int_eq(dsv4_config_set(&c, "dim", "99999999999999999999999", &e), DSV4_ERR_CONFIG);
    ck_assert_int_eq(dsv4_config_set(&c, "top_p", "nan", &e), DSV4_ERR_CONFIG);
    ck_assert_int_eq(dsv4_config_set(&c, "top_p", "1e400", &e), DSV4_ERR_CONFIG);
    ck_assert_int_eq(dsv4_config_set(&c, "shared_clamp", "yes", &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "true or false"));
    ck_assert_int_eq(dsv4_config_set(&c, "score_func", "relu", &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(e.message, "sqrtsoftplus, sigmoid, softmax"));
    ck_assert_int_eq(dsv4_config_set(&c, "no_such_key", "1", &e), DSV4_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(e.message, "'no_such_key'"));
    ck_assert_int_eq(dsv4_config_set_kv(&c, "dim", &e), DSV4_ERR_CONFIG);
    ck_assert_int_eq(dsv4_config_set_kv(&c, "=3", &e), DSV4_ERR_CONFIG);
    ck_assert_int_eq(memcmp(&c, &before, sizeof c), 0);
}
END_TEST

START_TEST(config_file_applies_and_reports_line_col)
{
    char path[512];
    tu_path(path, sizeof path, "cfg_ok.txt");
    const char *ok = "# mini-like\n  dim = 256\nmoe_inter_dim: 128\n\nn_routed_experts=16 # trailing\n"
                     "n_activated = 4\nlayer = 1\nn_layers = 4\nn_hash_layers = 1\nvocab_size = 512\n";
    ck_assert_int_eq(tu_write_file(path, ok, strlen(ok)), 0);
    dsv4_config c = flash_at(-1);
    dsv4_error e;
    ck_assert_msg(dsv4_config_load_file(&c, path, &e) == DSV4_OK, "%s", e.message);
    ck_assert_int_eq(c.dim, 256);
    ck_assert_int_eq(c.moe_inter_dim, 128);
    ck_assert_int_eq(c.n_routed_experts, 16);
    ck_assert_int_eq(dsv4_config_validate(&c, &e), DSV4_OK);

    tu_path(path, sizeof path, "cfg_bad.txt");
    const char *badv = "dim = 256\ntop_p =   abc\n";
    ck_assert_int_eq(tu_write_file(path, badv, strlen(badv)), 0);
    dsv4_config before = c;
    ck_assert_int_eq(dsv4_config_load_file(&c, path, &e), DSV4_ERR_CONFIG);
    char want[600];
    snprintf(want, sizeof want, "%s:2:11", path);
    ck_assert_msg(strstr(e.message, want) != NULL, "'%s' lacks '%s'", e.message, want);
    ck_assert_int_eq(memcmp(&c, &before, sizeof c), 0);

    const char *badk = "\n   bogus = 1\n";
    ck_assert_int_eq(tu_write_file(path, badk, strlen(badk)), 0);
    ck_assert_int_eq(dsv4_config_load_file(&c, path, &e), DSV4_ERR_NOT_FOUND);
    snprintf(want, sizeof want, "%s:2:4", path);
    ck_assert_msg(strstr(e.message, want) != NULL, "'%s' lacks '%s'", e.message, want);

    const char *nosep = "dim 256\n";
    ck_assert_int_eq(tu_write_file(path, nosep, strlen(nosep)), 0);
    ck_assert_int_eq(dsv4_config_load_file(&c, path, &e), DSV4_ERR_FORMAT);
    ck_assert_int_eq(dsv4_config_load_file(&c, "/nonexistent/x.cfg", &e), DSV4_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.message, "/nonexistent/x.cfg"));
}
END_TEST

START_TEST(status_strings)
{
    ck_assert_str_eq(dsv4_status_str(DSV4_OK), "ok");
    for (int s = 1; s <= DSV4_ERR_INTERNAL; s++) {
        ck_assert_ptr_nonnull(dsv4_status_str((dsv4_status)s));
        ck_assert_str_ne(dsv4_status_str((dsv4_status)s), "unknown status");
    }
    ck_assert_str_eq(dsv4_status_str((dsv4_status)999), "unknown status");
    dsv4_error e;
    strcpy(e.message, "x");
    e.status = DSV4_ERR_IO;
    dsv4_error_clear(&e);
    ck_assert_int_eq(e.status, DSV4_OK);
    ck_assert_str_eq(e.message, "");
    dsv4_error_clear(NULL);
}
END_TEST

Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, presets_are_valid_and_match_spec);
    tcase_add_test(tc, unknown_preset_lists_known);
    tcase_add_loop_test(tc, validate_rejects_each_bad_value, 0, (int)(sizeof bad_values / sizeof bad_values[0]));
    tcase_add_test(tc, validate_rejects_non_finite_and_bad_enums);
    tcase_add_test(tc, dims_follow_formats);
    tcase_add_test(tc, set_parses_every_key_and_round_trips);
    tcase_add_test(tc, set_rejects_bad_syntax_unchanged);
    tcase_add_test(tc, config_file_applies_and_reports_line_col);
    tcase_add_test(tc, status_strings);
    suite_add_tcase(s, tc);
    return s;
}
