/*
 * Hostile inputs (docs/reliability.md): malformed safetensors headers, NaN and
 * Inf in weights and inputs, out-of-range token and expert ids, impossible
 * configs, alias bombs and cycles, axes products past max_cases and past 2^64.
 * Each must give a clean error naming the place, or a defined result.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4moe/backend.h"
#include "dsv4moe/config.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/ref.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe_harness/scenario.h"
#include "tests/testutil.h"

Suite *hostile_suite(void);

/* ---------------- safetensors headers ---------------- */

/* Writes an 8-byte little-endian length, then `hdr`, then `data_len` zero bytes. */
static void write_st(const char *path, uint64_t len, const char *hdr, size_t data_len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    unsigned char l[8];
    for (int i = 0; i < 8; i++)
        l[i] = (unsigned char)(len >> (8 * i));
    ck_assert_uint_eq(fwrite(l, 1, 8, f), 8);
    if (hdr)
        ck_assert_uint_eq(fwrite(hdr, 1, strlen(hdr), f), strlen(hdr));
    for (size_t i = 0; i < data_len; i++)
        fputc(0, f);
    fclose(f);
}

static void expect_st_error(const char *name, uint64_t len, const char *hdr, size_t data_len, const char *needle)
{
    char path[512];
    tu_path(path, sizeof path, name);
    write_st(path, len, hdr, data_len);
    dsv4_st_file *f = (dsv4_st_file *)&f; /* must be reset to NULL */
    dsv4_error e;
    dsv4_status st = dsv4_st_open(path, &f, &e);
    ck_assert_msg(st == DSV4_ERR_FORMAT || st == DSV4_ERR_SHAPE, "%s: status %d (%s)", name, st, e.message);
    ck_assert_ptr_null(f);
    ck_assert_msg(strstr(e.message, path), "%s: the message does not name the file: %s", name, e.message);
    if (needle)
        ck_assert_msg(strstr(e.message, needle), "%s: '%s' lacks '%s'", name, e.message, needle);
}

#define HDR(s) (uint64_t)(sizeof(s) - 1), s

START_TEST(st_truncated_and_oversized_headers)
{
    char path[512];
    /* shorter than the length prefix */
    tu_path(path, sizeof path, "hostile_short.safetensors");
    ck_assert_int_eq(tu_write_file(path, "\x10\0\0", 3), 0);
    dsv4_st_file *f = NULL;
    dsv4_error e;
    ck_assert_int_eq(dsv4_st_open(path, &f, &e), DSV4_ERR_FORMAT);
    ck_assert_ptr_null(f);
    /* a header longer than the file */
    expect_st_error("hostile_trunc.safetensors", 4096, "{\"a\":{", 0, NULL);
    /* larger than the 100 MiB limit (refused before reading or allocating) */
    expect_st_error("hostile_big.safetensors", (uint64_t)DSV4_ST_MAX_HEADER + 8, "{}      ", 0, NULL);
    expect_st_error("hostile_huge.safetensors", UINT64_MAX, "{}      ", 0, NULL);
    /* a header cut inside its JSON */
    expect_st_error("hostile_cut.safetensors", HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_"), 0, NULL);
}
END_TEST

START_TEST(st_shapes_and_offsets)
{
    /* a shape product that overflows 64 bits: 2^32 * 2^32 * 4 bytes */
    expect_st_error("hostile_ovf.safetensors",
                    HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}"), 0,
                    "'w'");
    /* elements fit, bytes do not: 2^62 * 4 */
    expect_st_error("hostile_ovf2.safetensors",
                    HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}"), 0,
                    "'w'");
    /* negative and fractional dims */
    expect_st_error("hostile_neg.safetensors", HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}"),
                    0, "'w'");
    expect_st_error("hostile_frac.safetensors",
                    HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}"), 4, "'w'");
    /* offsets past the end of the data section */
    expect_st_error("hostile_past.safetensors", HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}"),
                    8, "'w'");
    expect_st_error("hostile_past2.safetensors",
                    HDR("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9223372036854775807,0]}}"), 8, "'w'");
    /* reversed offsets, and offsets disagreeing with the shape */
    expect_st_error("hostile_rev.safetensors", HDR("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}"), 4,
                    "'w'");
    expect_st_error("hostile_len.safetensors", HDR("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}"),
                    4, "'w'");
    /* more dims than supported */
    expect_st_error("hostile_dims.safetensors",
                    HDR("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}"), 1, "'w'");
}
END_TEST

START_TEST(st_zero_dims_are_empty_tensors)
{
    char path[512];
    tu_path(path, sizeof path, "hostile_zero.safetensors");
    write_st(path, HDR("{\"z\":{\"dtype\":\"F32\",\"shape\":[0,4096],\"data_offsets\":[0,0]}}"), 0);
    dsv4_st_file *f = NULL;
    dsv4_error e;
    ck_assert_msg(dsv4_st_open(path, &f, &e) == DSV4_OK, "%s", e.message);
    const dsv4_tensor_info *t = dsv4_st_find(f, "z");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->numel, 0);
    ck_assert_uint_eq(t->nbytes, 0);
    ck_assert_int_eq(t->shape[1], 4096);
    dsv4_st_close(f);
}
END_TEST

/* ---------------- configs ---------------- */

static void expect_config_error(const char *kv, const char *field)
{
    dsv4_config c;
    dsv4_error e;
    ck_assert_int_eq(dsv4_config_preset("tiny", &c, &e), DSV4_OK);
    c.layer = 1; /* presets leave the layer unset (-1), which validation would name first */
    dsv4_status st = dsv4_config_set_kv(&c, kv, &e);
    bool parsed = st == DSV4_OK; /* else the text itself was refused and c is unchanged */
    if (parsed)
        st = dsv4_config_validate(&c, &e);
    ck_assert_msg(st == DSV4_ERR_CONFIG, "%s: status %d (%s)", kv, st, e.message);
    ck_assert_msg(strstr(e.message, field), "%s: '%s' does not name %s", kv, e.message, field);
    if (!parsed)
        return;
    /* the planner refuses it too, whoever validates */
    dsv4_topology topo;
    dsv4_budget b;
    dsv4_topology_init(&topo);
    dsv4_budget_init(&b);
    dsv4_plan *p = NULL;
    ck_assert_int_ne(dsv4_plan_create(&c, &topo, &b, &p, &e), DSV4_OK);
    ck_assert_ptr_null(p);
}

START_TEST(configs_out_of_range)
{
    expect_config_error("n_activated=9", "n_activated");  /* topk > E = 8 */
    expect_config_error("n_activated=0", "n_activated");
    expect_config_error("n_routed_experts=0", "n_routed_experts");
    expect_config_error("dim=0", "dim");
    expect_config_error("moe_inter_dim=0", "moe_inter_dim");
    expect_config_error("vocab_size=0", "vocab_size");
    expect_config_error("top_p=nan", "top_p");
    expect_config_error("swiglu_limit=inf", "swiglu_limit");
    expect_config_error("route_scale=-1", "route_scale");
    expect_config_error("dim=99999999999999999999999", "dim");
    expect_config_error("layer=99999", "layer");
}
END_TEST

/* ---------------- weights and inputs ---------------- */

typedef struct {
    dsv4_config cfg;
    char wpath[512], ipath[512];
    dsv4_checkpoint *ck;
    dsv4_st_file *in;
    const uint16_t *x;
    const int32_t *ids;
} fixture;

static void fixture_open(fixture *fx, int layer, const char *tag)
{
    dsv4_error e;
    ck_assert_int_eq(dsv4_config_preset("tiny", &fx->cfg, &e), DSV4_OK);
    fx->cfg.layer = layer;
    char n[128];
    snprintf(n, sizeof n, "hostile_%s_w.safetensors", tag);
    tu_path(fx->wpath, sizeof fx->wpath, n);
    snprintf(n, sizeof n, "hostile_%s_in.safetensors", tag);
    tu_path(fx->ipath, sizeof fx->ipath, n);
    dsv4_gen_options go;
    dsv4_gen_options_init(&go);
    ck_assert_msg(dsv4_gen_weights(&fx->cfg, &go, fx->wpath, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_gen_input(&fx->cfg, &go, 5, fx->ipath, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_checkpoint_open(fx->wpath, &fx->ck, &e) == DSV4_OK, "%s", e.message);
    ck_assert_msg(dsv4_st_open(fx->ipath, &fx->in, &e) == DSV4_OK, "%s", e.message);
    fx->x = dsv4_st_find(fx->in, "x")->data;
    fx->ids = dsv4_st_find(fx->in, "input_ids")->data;
}

static void fixture_close(fixture *fx)
{
    dsv4_st_close(fx->in);
    dsv4_checkpoint_close(fx->ck);
}

typedef void (*patch_fn)(const char *name, void *data, uint64_t nbytes, const dsv4_config *cfg);

/* Rewrites the fixture's weights with `patch` applied to a copy of each tensor; reopens fx->ck on it. */
static void rewrite_weights(fixture *fx, const char *tag, patch_fn patch)
{
    dsv4_error e;
    dsv4_st_writer *w = NULL;
    ck_assert_int_eq(dsv4_st_writer_create(&w, &e), DSV4_OK);
    size_t n = dsv4_checkpoint_tensor_count(fx->ck);
    void **copies = calloc(n, sizeof *copies);
    ck_assert_ptr_nonnull(copies);
    for (size_t i = 0; i < n; i++) {
        const dsv4_tensor_info *t = dsv4_checkpoint_tensor(fx->ck, i);
        copies[i] = malloc(t->nbytes ? t->nbytes : 1);
        ck_assert_ptr_nonnull(copies[i]);
        memcpy(copies[i], t->data, t->nbytes);
        patch(t->name, copies[i], t->nbytes, &fx->cfg);
        ck_assert_msg(dsv4_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, copies[i], &e) == DSV4_OK, "%s",
                      e.message);
    }
    char path[512], nm[128];
    snprintf(nm, sizeof nm, "hostile_%s_patched.safetensors", tag);
    tu_path(path, sizeof path, nm);
    ck_assert_msg(dsv4_st_writer_write(w, path, NULL, NULL, &e) == DSV4_OK, "%s", e.message);
    dsv4_st_writer_free(w);
    for (size_t i = 0; i < n; i++)
        free(copies[i]);
    free(copies);
    dsv4_checkpoint_close(fx->ck);
    fx->ck = NULL;
    ck_assert_msg(dsv4_checkpoint_open(path, &fx->ck, &e) == DSV4_OK, "%s", e.message);
}

static bool bf16_finite(uint16_t v) { return (v & 0x7f80u) != 0x7f80u; }

/* Runs ref and cpu on T tokens; returns their statuses, outputs in yr / yc ([T, H]). */
static void run_both(fixture *fx, int64_t T, const uint16_t *x, const int32_t *ids, uint16_t *yr, uint16_t *yc,
                     dsv4_status *sr, dsv4_status *sc, dsv4_error *er, dsv4_error *ec, int64_t *nf_r, int64_t *nf_c)
{
    dsv4_ref *ref = NULL;
    *sr = dsv4_ref_create(&fx->cfg, fx->ck, 1, &ref, er);
    if (*sr == DSV4_OK) {
        dsv4_ref_output o;
        memset(&o, 0, sizeof o);
        o.y = yr;
        *sr = dsv4_ref_forward(ref, T, x, ids, &o, er);
        if (nf_r)
            *nf_r = o.stats.nonfinite_rows;
    }
    dsv4_ref_free(ref);

    dsv4_topology topo;
    dsv4_budget b;
    dsv4_topology_init(&topo);
    dsv4_budget_init(&b);
    topo.backend = DSV4_BACKEND_CPU;
    dsv4_plan *p = NULL;
    dsv4_backend *be = NULL;
    ck_assert_msg(dsv4_plan_create(&fx->cfg, &topo, &b, &p, ec) == DSV4_OK, "%s", ec->message);
    *sc = dsv4_backend_create(p, fx->ck, 1, &be, ec);
    if (*sc == DSV4_OK) {
        ck_assert_str_eq(dsv4_backend_name(be), "cpu");
        dsv4_forward_out fo = {.y = yc};
        *sc = dsv4_backend_forward(be, T, x, ids, &fo, ec);
        if (nf_c)
            *nf_c = (int64_t)dsv4_backend_get_stats(be).nonfinite_rows;
    }
    dsv4_backend_free(be);
    dsv4_plan_free(p);
}

/* run_both on token ids `ids` (T = 5, fx's x), both backends refusing with DSV4_ERR_RANGE and a
   message naming `needle`; `what` names the case in a failure. */
static void expect_both_range_error(fixture *fx, const int32_t ids[5], const char *needle, const char *what)
{
    const int64_t T = 5, H = fx->cfg.dim;
    uint16_t *yr = calloc((size_t)(T * H), 2), *yc = calloc((size_t)(T * H), 2);
    dsv4_status sr, sc;
    dsv4_error er, ec;
    run_both(fx, T, fx->x, ids, yr, yc, &sr, &sc, &er, &ec, NULL, NULL);
    ck_assert_msg(sr == DSV4_ERR_RANGE, "ref %s: %d %s", what, sr, er.message);
    ck_assert_msg(sc == DSV4_ERR_RANGE, "cpu %s: %d %s", what, sc, ec.message);
    ck_assert_msg(strstr(er.message, needle), "%s", er.message);
    ck_assert_msg(strstr(ec.message, needle), "%s", ec.message);
    free(yr), free(yc);
}

/* Rows 0 and 1 of the shared expert's w2 [H, I] become NaN and +Inf. */
static void patch_shared_w2(const char *name, void *data, uint64_t nbytes, const dsv4_config *cfg)
{
    if (!strstr(name, "shared_experts.w2.weight"))
        return;
    uint16_t *v = data;
    int64_t I = cfg->moe_inter_dim;
    ck_assert_uint_ge(nbytes, (uint64_t)(2 * I) * 2);
    for (int64_t i = 0; i < I; i++) {
        v[i] = 0x7fc0;     /* NaN */
        v[I + i] = 0x7f80; /* +Inf */
    }
}

START_TEST(nan_and_inf_in_weights)
{
    fixture fx;
    fixture_open(&fx, 1, "wnan");
    rewrite_weights(&fx, "wnan", patch_shared_w2);
    const int64_t T = 5, H = fx.cfg.dim;
    uint16_t *yr = calloc((size_t)(T * H), 2), *yc = calloc((size_t)(T * H), 2);
    dsv4_status sr, sc;
    dsv4_error er, ec;
    run_both(&fx, T, fx.x, fx.ids, yr, yc, &sr, &sc, &er, &ec, NULL, NULL);
    ck_assert_msg(sr == DSV4_OK, "ref: %s", er.message);
    ck_assert_msg(sc == DSV4_OK, "cpu: %s", ec.message);
    /* Non-finite weights propagate to exactly the columns they feed, in both. */
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            bool want_finite = h >= 2;
            ck_assert_msg(bf16_finite(yr[t * H + h]) == want_finite, "ref y[%lld,%lld] = 0x%04x", (long long)t,
                          (long long)h, yr[t * H + h]);
            ck_assert_msg(bf16_finite(yc[t * H + h]) == want_finite, "cpu y[%lld,%lld] = 0x%04x", (long long)t,
                          (long long)h, yc[t * H + h]);
        }
    free(yr);
    free(yc);
    fixture_close(&fx);
}
END_TEST

START_TEST(nan_and_inf_in_inputs)
{
    fixture fx;
    fixture_open(&fx, 1, "xnan");
    const int64_t T = 5, H = fx.cfg.dim;
    uint16_t *x = malloc((size_t)(T * H) * 2);
    memcpy(x, fx.x, (size_t)(T * H) * 2);
    for (int64_t h = 0; h < H; h++)
        x[1 * H + h] = 0x7fc0; /* row 1 all NaN */
    x[3 * H + 5] = 0xff80;     /* row 3 one -Inf */
    uint16_t *y0r = calloc((size_t)(T * H), 2), *y0c = calloc((size_t)(T * H), 2);
    uint16_t *yr = calloc((size_t)(T * H), 2), *yc = calloc((size_t)(T * H), 2);
    dsv4_status sr, sc;
    dsv4_error er, ec;
    int64_t nfr = -1, nfc = -1;
    run_both(&fx, T, fx.x, fx.ids, y0r, y0c, &sr, &sc, &er, &ec, &nfr, &nfc);
    ck_assert_msg(sr == DSV4_OK && sc == DSV4_OK, "%s / %s", er.message, ec.message);
    ck_assert_int_eq(nfr, 0);
    ck_assert_int_eq(nfc, 0);
    run_both(&fx, T, x, fx.ids, yr, yc, &sr, &sc, &er, &ec, &nfr, &nfc);
    ck_assert_msg(sr == DSV4_OK, "ref: %s", er.message);
    ck_assert_msg(sc == DSV4_OK, "cpu: %s", ec.message);
    /* The two poisoned rows take the SPEC.md 2.5 fallback and are counted; the others are untouched. */
    ck_assert_int_eq(nfr, 2);
    ck_assert_int_eq(nfc, 2);
    for (int64_t t = 0; t < T; t++) {
        if (t == 1 || t == 3)
            continue;
        ck_assert_msg(!memcmp(yr + t * H, y0r + t * H, (size_t)H * 2), "ref row %lld changed", (long long)t);
        ck_assert_msg(!memcmp(yc + t * H, y0c + t * H, (size_t)H * 2), "cpu row %lld changed", (long long)t);
    }
    for (int64_t h = 0; h < H; h++) { /* a NaN row stays NaN in both (no silent zeros) */
        ck_assert(!bf16_finite(yr[1 * H + h]));
        ck_assert(!bf16_finite(yc[1 * H + h]));
    }
    free(x);
    free(y0r), free(y0c), free(yr), free(yc);
    fixture_close(&fx);
}
END_TEST

START_TEST(token_ids_out_of_range)
{
    fixture fx;
    fixture_open(&fx, 0, "ids"); /* layer 0 is tiny's hash layer: ids index tid2eid */
    ck_assert(dsv4_config_is_hash_layer(&fx.cfg));
    int32_t ids[5];
    const int32_t bad[3] = {-1, (int32_t)fx.cfg.vocab_size, INT32_MAX};
    for (int b = 0; b < 3; b++) {
        memcpy(ids, fx.ids, sizeof ids);
        ids[2] = bad[b];
        char what[32];
        snprintf(what, sizeof what, "id %d", bad[b]);
        expect_both_range_error(&fx, ids, "input_ids[2]", what);
    }
    fixture_close(&fx);
}
END_TEST

static int32_t bad_expert;

/* tid2eid[token 3, slot 1] becomes bad_expert. */
static void patch_tid2eid(const char *name, void *data, uint64_t nbytes, const dsv4_config *cfg)
{
    if (!strstr(name, "tid2eid"))
        return;
    int32_t *v = data;
    ck_assert_uint_ge(nbytes, (uint64_t)(4 * cfg->n_activated) * 4);
    v[3 * cfg->n_activated + 1] = bad_expert;
}

START_TEST(expert_ids_out_of_range)
{
    const int32_t bad[2] = {8, -1}; /* tiny has E = 8 */
    for (int b = 0; b < 2; b++) {
        fixture fx;
        fixture_open(&fx, 0, "eid");
        bad_expert = bad[b];
        rewrite_weights(&fx, "eid", patch_tid2eid);
        const int32_t ids[5] = {0, 1, 3, 2, 0};
        char what[32];
        snprintf(what, sizeof what, "expert %d", bad[b]);
        expect_both_range_error(&fx, ids, "tid2eid", what);
        fixture_close(&fx);
    }
}
END_TEST

/* ---------------- scenario files ---------------- */

static void expect_scn_error(const char *text, dsv4_status want, const char *needle)
{
    dsv4_scenario *s = (dsv4_scenario *)&s;
    dsv4_error e;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dsv4_status st = dsv4_scenario_load_string(text, "hostile.yaml", &s, &e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ck_assert_msg(st == want, "status %d, expected %d: %s", st, want, e.message);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(e.message, "hostile.yaml:"), "no file:line:col in '%s'", e.message);
    ck_assert_msg(strstr(e.message, needle), "'%s' lacks '%s'", e.message, needle);
    ck_assert_msg(secs < 5.0, "took %.1f s to refuse", secs);
}

START_TEST(scenario_alias_bombs_and_cycles)
{
    /* billion laughs: 10 levels of 10 aliases, 10^10 nodes once expanded */
    char doc[4096] = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
    for (int i = 1; i <= 10; i++) {
        char line[256];
        snprintf(line, sizeof line, "a%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n", i, i,
                 i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
        strcat(doc, line);
    }
    strcat(doc, "name: laughs\ndefaults: {preset: tiny}\ncases: [{name: x}]\n");
    expect_scn_error(doc, DSV4_ERR_FORMAT, "alias");
    /* the same bomb hidden inside a value the schema reads */
    char doc2[4096] = "name: laughs2\ndefaults:\n  preset: tiny\n  x0: &b0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
    for (int i = 1; i <= 9; i++) {
        char line[256];
        snprintf(line, sizeof line, "  x%d: &b%d [*b%d, *b%d, *b%d, *b%d, *b%d, *b%d, *b%d, *b%d, *b%d, *b%d]\n", i,
                 i, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
        strcat(doc2, line);
    }
    strcat(doc2, "cases: [{name: x}]\n");
    expect_scn_error(doc2, DSV4_ERR_FORMAT, "alias");
    /* an anchored collection holding an alias of itself */
    expect_scn_error("name: c\ndefaults: &d {preset: tiny, again: *d}\ncases: [{name: x}]\n", DSV4_ERR_FORMAT,
                     "alias");
    /* an alias of an anchor that is never defined */
    expect_scn_error("name: c\ndefaults: *nowhere\ncases: [{name: x}]\n", DSV4_ERR_FORMAT, "hostile.yaml");
}
END_TEST

START_TEST(scenario_huge_axes)
{
    /* 10^5 cases: above the default max_cases (10000), refused before any case is built */
    expect_scn_error("name: h\ndefaults: {preset: tiny}\naxes:\n"
                     "  seed: [1,2,3,4,5,6,7,8,9,10]\n  layer: [0,1,0,1,0,1,0,1,0,1]\n"
                     "  tokens: [[1],[2],[3],[4],[5],[6],[7],[8],[9],[10]]\n"
                     "  top_p: [1,1,1,1,1,1,1,1,1,1]\n  route_scale: [1,2,3,4,5,6,7,8,9,10]\n",
                     DSV4_ERR_CONFIG, "max_cases");
    /* 10^20: past 2^64, the product must not wrap around to a small number */
    char doc[4096] = "name: h2\ndefaults: {preset: tiny}\naxes:\n";
    for (int i = 0; i < 20; i++) {
        char line[128];
        snprintf(line, sizeof line, "  a%d: [{seed: 1},{seed: 2},{seed: 3},{seed: 4},{seed: 5},{seed: 6},{seed: 7},"
                 "{seed: 8},{seed: 9},{seed: 10}]\n", i);
        strcat(doc, line);
    }
    expect_scn_error(doc, DSV4_ERR_CONFIG, "max_cases");
    /* max_cases itself is bounded */
    expect_scn_error("name: h3\nmax_cases: 100000000\ndefaults: {preset: tiny}\ncases: [{name: x}]\n",
                     DSV4_ERR_CONFIG, "max_cases");
    /* an empty axis gives no cases, and says so (no division by zero on the way) */
    dsv4_scenario *s = NULL;
    dsv4_error e;
    dsv4_status st = dsv4_scenario_load_string("name: h4\ndefaults: {preset: tiny}\naxes:\n  seed: []\n  layer: [0, 1]\n",
                                               "hostile.yaml", &s, &e);
    ck_assert_int_ne(st, DSV4_OK);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(e.message, "hostile.yaml:"), "%s", e.message);
}
END_TEST

Suite *hostile_suite(void)
{
    Suite *s = suite_create("hostile");
    TCase *tc = tcase_create("inputs");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, st_truncated_and_oversized_headers);
    tcase_add_test(tc, st_shapes_and_offsets);
    tcase_add_test(tc, st_zero_dims_are_empty_tensors);
    tcase_add_test(tc, configs_out_of_range);
    tcase_add_test(tc, nan_and_inf_in_weights);
    tcase_add_test(tc, nan_and_inf_in_inputs);
    tcase_add_test(tc, token_ids_out_of_range);
    tcase_add_test(tc, expert_ids_out_of_range);
    tcase_add_test(tc, scenario_alias_bombs_and_cycles);
    tcase_add_test(tc, scenario_huge_axes);
    suite_add_tcase(s, tc);
    return s;
}
