#include <errno.h>
#include <unistd.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <stdarg.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/config.h"
#include "core/err.h"
#include "core/fileio.h"
#include "core/strbuf.h"

/* Dims are bounded so that every product of two of them fits int64 with room to spare. */
#define DIM_MAX (1 << 20)
#define EXPERTS_MAX (1 << 16)
#define VOCAB_MAX 0x7fffffffLL

static void set_flash(dsv4_config *c)
{
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->version = DSV4_CONFIG_VERSION;
    c->dim = 4096;
    c->moe_inter_dim = 2048;
    c->n_routed_experts = 256;
    c->n_activated = 6;
    c->n_shared_experts = 1;
    c->n_hash_layers = 3;
    c->vocab_size = 129280;
    c->n_layers = 43;
    c->layer = -1;
    c->score_func = DSV4_SCORE_SQRTSOFTPLUS;
    c->gate_logits = DSV4_GATE_LOGITS_FP32;
    c->route_scale = 1.5f;
    c->norm_eps = 0.0f;
    c->swiglu_limit = 10.0f;
    c->shared_clamp = true;
    c->weight_point = DSV4_WEIGHT_BEFORE_W2;
    c->top_p = 1.0f;
    c->top_p_min_keep = 1;
    c->top_p_renorm = false;
    c->top_p_predictor = DSV4_PREDICTOR_NONE;
    c->routed_format = DSV4_FORMAT_FP4;
    c->shared_format = DSV4_FORMAT_FP8;
    c->weight_scale = DSV4_SCALE_UE8M0;
    c->act_quant = DSV4_ACT_QUANT_UE8M0;
    c->gemm = DSV4_GEMM_AUTO;
}

void dsv4_config_init(dsv4_config *cfg)
{
    if (cfg)
        set_flash(cfg);
}

/*
 * The presets: v4-flash (set_flash) or the named base preset, then the preset's own settings as
 * "key=value" words applied with dsv4_config_set.
 */
static const struct {
    const char *name, *base, *set;
} presets[] = {
    {"v4-flash", NULL, ""},
    {"v4-pro", NULL, "dim=7168 moe_inter_dim=3072 n_routed_experts=384 route_scale=2.5 n_layers=61"},
    {"v4-flash-base", NULL, "routed_format=fp8 weight_scale=fp32"},
    {"mini", NULL, "dim=256 moe_inter_dim=128 n_routed_experts=16 n_activated=4 n_hash_layers=1 vocab_size=512 n_layers=4"},
    {"mini-fp8", "mini", "routed_format=fp8 weight_scale=fp32 act_quant=fp32"},
    {"mini-bf16", "mini", "routed_format=bf16 shared_format=bf16 act_quant=none"},
    {"mini-topp", "mini", "top_p=0.8 top_p_predictor=linear"},
    {"tiny", NULL, "dim=128 moe_inter_dim=128 n_routed_experts=8 n_activated=2 n_hash_layers=1 vocab_size=64 n_layers=2 "
                 "routed_format=bf16 shared_format=bf16 act_quant=none"},
};
#define NPRESETS (sizeof presets / sizeof presets[0])

/* The "key=value" words of `set` applied to c. */
static dsv4_status apply_words(dsv4_config *c, const char *set, dsv4_error *err)
{
    dsv4_status st = DSV4_OK;
    for (const char *p = set; *p && !st;) {
        size_t n = strcspn(p, " ");
        char kv[96];
        snprintf(kv, sizeof kv, "%.*s", (int)n, p);
        st = dsv4_config_set_kv(c, kv, err);
        p += n + (p[n] == ' ');
    }
    return st;
}

dsv4_status dsv4_config_preset(const char *name, dsv4_config *cfg, dsv4_error *err)
{
    if (!name || !cfg)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "preset", "name and config must not be NULL");
    size_t i = 0;
    while (i < NPRESETS && strcmp(presets[i].name, name))
        i++;
    if (i == NPRESETS) {
        char list[256];
        dsv4_join_names(list, sizeof list, dsv4_config_preset_names());
        return dsv4_seterr(err, DSV4_ERR_CONFIG, "preset", "unknown preset '%s' (known: %s)", name, list);
    }
    dsv4_config c;
    set_flash(&c);
    dsv4_status st = presets[i].base ? dsv4_config_preset(presets[i].base, &c, err) : DSV4_OK;
    if (!st)
        st = apply_words(&c, presets[i].set, err);
    if (!st)
        *cfg = c;
    return st;
}

/* ---------------- keys ---------------- */

typedef enum { K_INT, K_FLOAT, K_BOOL, K_ENUM } key_kind;

typedef struct {
    const char *name;
    key_kind kind;
    size_t offset;
    const char *const *enum_names; /* K_ENUM: index = enum value, NULL-terminated */
} key_desc;

static const char *const score_names[] = {"sqrtsoftplus", "sigmoid", "softmax", NULL};
static const char *const logits_names[] = {"fp32", "bf16", NULL};
static const char *const wp_names[] = {"before_w2", "after_w2", NULL};
static const char *const pred_names[] = {"none", "const", "linear", NULL};
static const char *const fmt_names[] = {"bf16", "fp8", "fp4", NULL};
static const char *const scale_names[] = {"ue8m0", "fp32", NULL};
static const char *const act_names[] = {"none", "ue8m0", "fp32", NULL};
static const char *const gemm_names[] = {"auto", "exact", "fp8", NULL};

#define KEY(n, k, e) {#n, k, offsetof(dsv4_config, n), e}
static const key_desc keys[] = {
    KEY(dim, K_INT, NULL),
    KEY(moe_inter_dim, K_INT, NULL),
    KEY(n_routed_experts, K_INT, NULL),
    KEY(n_activated, K_INT, NULL),
    KEY(n_shared_experts, K_INT, NULL),
    KEY(n_hash_layers, K_INT, NULL),
    KEY(vocab_size, K_INT, NULL),
    KEY(n_layers, K_INT, NULL),
    KEY(layer, K_INT, NULL),
    KEY(score_func, K_ENUM, score_names),
    KEY(gate_logits, K_ENUM, logits_names),
    KEY(route_scale, K_FLOAT, NULL),
    KEY(norm_eps, K_FLOAT, NULL),
    KEY(swiglu_limit, K_FLOAT, NULL),
    KEY(shared_clamp, K_BOOL, NULL),
    KEY(weight_point, K_ENUM, wp_names),
    KEY(top_p, K_FLOAT, NULL),
    KEY(top_p_min_keep, K_INT, NULL),
    KEY(top_p_renorm, K_BOOL, NULL),
    KEY(top_p_predictor, K_ENUM, pred_names),
    KEY(routed_format, K_ENUM, fmt_names),
    KEY(shared_format, K_ENUM, fmt_names),
    KEY(weight_scale, K_ENUM, scale_names),
    KEY(act_quant, K_ENUM, act_names),
    KEY(gemm, K_ENUM, gemm_names),
};
#undef KEY
#define NKEYS (sizeof keys / sizeof keys[0])

_Static_assert(sizeof(dsv4_score_func) == sizeof(int), "enums are stored as int");

/* The NULL-terminated lists of key and preset names, filled once from the tables. */
static const char *key_names[NKEYS + 1], *preset_names[NPRESETS + 1];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void fill_names(void)
{
    for (size_t i = 0; i < NKEYS; i++)
        key_names[i] = keys[i].name;
    for (size_t i = 0; i < NPRESETS; i++)
        preset_names[i] = presets[i].name;
}

const char *const *dsv4_config_keys(void)
{
    pthread_once(&names_once, fill_names);
    return key_names;
}

const char *const *dsv4_config_preset_names(void)
{
    pthread_once(&names_once, fill_names);
    return preset_names;
}

static const key_desc *find_key(const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (!strcmp(keys[i].name, name))
            return &keys[i];
    return NULL;
}

static const char *enum_name(const char *const *names, int v)
{
    int n = 0;
    while (names[n])
        n++;
    return v >= 0 && v < n ? names[v] : "?";
}

const char *dsv4_score_func_name(dsv4_score_func v) { return enum_name(score_names, (int)v); }
const char *dsv4_weight_format_name(dsv4_weight_format v) { return enum_name(fmt_names, (int)v); }
const char *dsv4_act_quant_name(dsv4_act_quant v) { return enum_name(act_names, (int)v); }
const char *dsv4_gemm_mode_name(dsv4_gemm_mode v) { return enum_name(gemm_names, (int)v); }

/* ---------------- validation ---------------- */

static dsv4_status bad(dsv4_error *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static dsv4_status bad(dsv4_error *err, const char *field, const char *fmt, ...)
{
    char where[96], msg[512];
    snprintf(where, sizeof where, "config field '%s'", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dsv4_seterr(err, DSV4_ERR_CONFIG, where, "%s", msg);
}

#define CHECK_INT(f, lo, hi, rule)                                                                      \
    do {                                                                                                \
        if (c->f < (lo) || c->f > (hi))                                                                 \
            return bad(err, #f, "value %lld is out of range: %s", (long long)c->f, rule);               \
    } while (0)

#define CHECK_ENUM(f, names)                                                                            \
    do {                                                                                                \
        int v_ = (int)c->f, n_ = 0;                                                                     \
        while (names[n_])                                                                               \
            n_++;                                                                                       \
        if (v_ < 0 || v_ >= n_) {                                                                       \
            char l_[128];                                                                               \
            dsv4_join_names(l_, sizeof l_, names);                                                            \
            return bad(err, #f, "value %d is not one of %s", v_, l_);                                   \
        }                                                                                               \
    } while (0)

/*
 * The rules of one field that depend on no other field: checked by dsv4_config_load_file for
 * each key it sets (so a config file's bad value is reported at its file:line:col), and by
 * dsv4_config_validate for all (only == NULL). Values are printed at full
 * precision: fp32 needs 9 significant digits to tell 1.00000012 from 1.
 */
#define ONLY(name) (!only || !strcmp(only, name))
static dsv4_status check_self(const dsv4_config *c, const char *only, dsv4_error *err)
{
    if (ONLY("dim"))
        CHECK_INT(dim, 1, DIM_MAX, "must be in [1, 1048576]");
    if (ONLY("moe_inter_dim"))
        CHECK_INT(moe_inter_dim, 1, DIM_MAX, "must be in [1, 1048576]");
    if (ONLY("n_routed_experts"))
        CHECK_INT(n_routed_experts, 1, EXPERTS_MAX, "must be in [1, 65536]");
    if (ONLY("n_shared_experts"))
        CHECK_INT(n_shared_experts, 0, 1, "must be 0 or 1");
    if (ONLY("vocab_size"))
        CHECK_INT(vocab_size, 1, VOCAB_MAX, "must be in [1, 2147483647]");
    if (ONLY("n_layers"))
        CHECK_INT(n_layers, 1, 1 << 20, "must be in [1, 1048576]");
    if (ONLY("route_scale") && (!isfinite(c->route_scale) || !(c->route_scale > 0)))
        return bad(err, "route_scale", "value %.9g is out of range: must be finite and > 0", (double)c->route_scale);
    if (ONLY("norm_eps") && (!isfinite(c->norm_eps) || c->norm_eps < 0))
        return bad(err, "norm_eps", "value %.9g is out of range: must be finite and >= 0", (double)c->norm_eps);
    if (ONLY("swiglu_limit") && (!isfinite(c->swiglu_limit) || c->swiglu_limit < 0))
        return bad(err, "swiglu_limit",
                   "value %.9g is out of range: must be finite and >= 0 (0 disables the clamp)",
                   (double)c->swiglu_limit);
    if (ONLY("top_p") && !(c->top_p > 0 && c->top_p <= 1))
        return bad(err, "top_p", "value %.9g is out of range: must be in (0, 1]", (double)c->top_p);
    return DSV4_OK;
}
#undef ONLY

dsv4_status dsv4_config_validate(const dsv4_config *c, dsv4_error *err)
{
    if (!c)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "config", "config must not be NULL");
    if (c->struct_size != sizeof *c)
        return bad(err, "struct_size", "value %u is not sizeof(dsv4_config) = %zu of this library "
                   "(initialise with dsv4_config_init or dsv4_config_preset)", c->struct_size, sizeof *c);
    if (c->version != DSV4_CONFIG_VERSION)
        return bad(err, "version", "value %u is not supported: this library reads version %d", c->version,
                   DSV4_CONFIG_VERSION);

    CHECK_ENUM(score_func, score_names);
    CHECK_ENUM(gate_logits, logits_names);
    CHECK_ENUM(weight_point, wp_names);
    CHECK_ENUM(top_p_predictor, pred_names);
    CHECK_ENUM(routed_format, fmt_names);
    CHECK_ENUM(shared_format, fmt_names);
    CHECK_ENUM(weight_scale, scale_names);
    CHECK_ENUM(act_quant, act_names);
    CHECK_ENUM(gemm, gemm_names);
    if (c->shared_format == DSV4_FORMAT_FP4)
        return bad(err, "shared_format", "value fp4 is not allowed: the shared expert is bf16 or fp8");

    bool any_fp8 = c->routed_format == DSV4_FORMAT_FP8 || (c->n_shared_experts > 0 && c->shared_format == DSV4_FORMAT_FP8);
    bool any_fp4 = c->routed_format == DSV4_FORMAT_FP4;
    int64_t mult = any_fp8 ? 128 : any_fp4 ? 32 : 1;
    const char *why = any_fp8 ? "a multiple of 128 (fp8 block scales)" : any_fp4 ? "a multiple of 32 (fp4 scale groups)" : "";

    dsv4_status st = check_self(c, NULL, err);
    if (st)
        return st;
    if (c->dim % mult)
        return bad(err, "dim", "value %lld must be %s", (long long)c->dim, why);
    if (c->moe_inter_dim % mult)
        return bad(err, "moe_inter_dim", "value %lld must be %s", (long long)c->moe_inter_dim, why);
    if (c->n_activated < 1 || c->n_activated > c->n_routed_experts)
        return bad(err, "n_activated", "value %lld is out of range: must be in [1, n_routed_experts = %lld]",
                   (long long)c->n_activated, (long long)c->n_routed_experts);
    if (c->n_hash_layers < 0 || c->n_hash_layers > c->n_layers)
        return bad(err, "n_hash_layers", "value %lld is out of range: must be in [0, n_layers = %lld]",
                   (long long)c->n_hash_layers, (long long)c->n_layers);
    if (c->layer < 0)
        return bad(err, "layer", "value %lld is out of range: the layer id is required and must be >= 0",
                   (long long)c->layer);
    if (c->layer >= c->n_layers)
        return bad(err, "layer", "value %lld is out of range: must be below n_layers = %lld",
                   (long long)c->layer, (long long)c->n_layers);
    if (c->top_p_min_keep < 1 || c->top_p_min_keep > c->n_activated)
        return bad(err, "top_p_min_keep", "value %lld is out of range: must be in [1, n_activated = %lld]",
                   (long long)c->top_p_min_keep, (long long)c->n_activated);
    if (c->score_func == DSV4_SCORE_SOFTMAX && c->norm_eps != 0)
        return bad(err, "norm_eps", "value %.9g has no effect with score_func softmax (weights are not "
                   "renormalised); leave it 0", (double)c->norm_eps);
    return DSV4_OK;
}

bool dsv4_config_is_hash_layer(const dsv4_config *c)
{
    return c && c->layer >= 0 && c->layer < c->n_hash_layers;
}

/* ---------------- set / get ---------------- */

/* A key's value on its way in or out of the struct: the member its kind names. */
typedef union {
    int64_t i;
    float f;
    bool b;
    int e; /* every enum of the struct is int-sized */
} key_value;

static dsv4_status parse_int(const key_desc *k, const char *s, key_value *out, dsv4_error *err)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno == ERANGE)
        return bad(err, k->name, "value '%s' is not an integer", s);
    out->i = v;
    return DSV4_OK;
}

static dsv4_status parse_float(const key_desc *k, const char *s, key_value *out, dsv4_error *err)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE)
        return bad(err, k->name, "value '%s' is not a number", s);
    if (!isfinite(v) || fabs(v) > 3.0e38)
        return bad(err, k->name, "value '%s' is not a finite fp32 number", s);
    if (v != 0 && fabs(v) < FLT_MIN)
        return bad(err, k->name, "value '%s' is below the smallest normal fp32 number (%.9g)", s, (double)FLT_MIN);
    out->f = (float)v;
    return DSV4_OK;
}

static dsv4_status parse_bool(const key_desc *k, const char *s, key_value *out, dsv4_error *err)
{
    if (!strcmp(s, "true") || !strcmp(s, "1"))
        out->b = true;
    else if (!strcmp(s, "false") || !strcmp(s, "0"))
        out->b = false;
    else
        return bad(err, k->name, "value '%s' is not a boolean (true or false)", s);
    return DSV4_OK;
}

static dsv4_status parse_enum(const key_desc *k, const char *s, key_value *out, dsv4_error *err)
{
    out->e = -1;
    for (int i = 0; k->enum_names[i]; i++)
        if (!strcmp(k->enum_names[i], s))
            out->e = i;
    if (out->e < 0) {
        char l[128];
        dsv4_join_names(l, sizeof l, k->enum_names);
        return bad(err, k->name, "value '%s' is not one of %s", s, l);
    }
    return DSV4_OK;
}

static void format_int(const key_desc *k, key_value v, char *buf, size_t n) { snprintf(buf, n, "%lld", (long long)v.i); }
static void format_float(const key_desc *k, key_value v, char *buf, size_t n) { snprintf(buf, n, "%.9g", (double)v.f); }
static void format_bool(const key_desc *k, key_value v, char *buf, size_t n) { snprintf(buf, n, "%s", v.b ? "true" : "false"); }
static void format_enum(const key_desc *k, key_value v, char *buf, size_t n)
{
    snprintf(buf, n, "%s", enum_name(k->enum_names, v.e));
}

/* What dsv4_config_set and dsv4_config_get do with a key of each kind: the field's size, its
   parser and its printer. */
static const struct {
    size_t size;
    dsv4_status (*parse)(const key_desc *k, const char *s, key_value *out, dsv4_error *err);
    void (*format)(const key_desc *k, key_value v, char *buf, size_t n);
} kinds[] = {
    [K_INT] = {sizeof(int64_t), parse_int, format_int},
    [K_FLOAT] = {sizeof(float), parse_float, format_float},
    [K_BOOL] = {sizeof(bool), parse_bool, format_bool},
    [K_ENUM] = {sizeof(int), parse_enum, format_enum},
};

dsv4_status dsv4_config_set(dsv4_config *cfg, const char *key, const char *value, dsv4_error *err)
{
    if (!cfg || !key || !value)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "config", "config, key and value must not be NULL");
    const key_desc *k = find_key(key);
    if (!k) {
        char list[640];
        dsv4_join_names(list, sizeof list, dsv4_config_keys());
        return dsv4_seterr(err, DSV4_ERR_NOT_FOUND, "config", "unknown key '%s' (keys: %s)", key, list);
    }
    key_value v = {0};
    dsv4_status st = kinds[k->kind].parse(k, value, &v, err);
    if (!st)
        memcpy((char *)cfg + k->offset, &v, kinds[k->kind].size);
    return st;
}

dsv4_status dsv4_config_set_kv(dsv4_config *cfg, const char *kv, dsv4_error *err)
{
    if (!kv)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "config", "key=value must not be NULL");
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv)
        return dsv4_seterr(err, DSV4_ERR_CONFIG, "config", "'%s' is not of the form key=value", kv);
    char key[64];
    size_t n = (size_t)(eq - kv);
    if (n >= sizeof key)
        return dsv4_seterr(err, DSV4_ERR_NOT_FOUND, "config", "unknown key '%.*s'", (int)(n > 80 ? 80 : n), kv);
    memcpy(key, kv, n);
    key[n] = '\0';
    return dsv4_config_set(cfg, key, eq + 1, err);
}

dsv4_status dsv4_config_get(const dsv4_config *cfg, const char *key, char *buf, size_t size, dsv4_error *err)
{
    if (!cfg || !key || !buf || !size)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "config", "config, key and buffer must not be NULL");
    const key_desc *k = find_key(key);
    if (!k)
        return dsv4_seterr(err, DSV4_ERR_NOT_FOUND, "config", "unknown key '%s'", key);
    key_value v = {0};
    memcpy(&v, (const char *)cfg + k->offset, kinds[k->kind].size);
    kinds[k->kind].format(k, v, buf, size);
    return DSV4_OK;
}

/* Largest config file read: a config is a few dozen lines; this bounds what a wrong path costs. */
#define CONFIG_FILE_MAX (1 << 20)

dsv4_status dsv4_config_load_file(dsv4_config *cfg, const char *path, dsv4_error *err)
{
    if (!cfg || !path)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "config", "config and path must not be NULL");
    char *text = NULL;
    size_t tlen = 0;
    dsv4_status st = dsv4_read_small_file(path, CONFIG_FILE_MAX, "a config file", &text, &tlen, err);
    if (st)
        return st;
    dsv4_config c = *cfg;
    char line[1024];
    int lineno = 0;
    char where[300];
    /* Bytes, not C strings: a NUL inside a line would otherwise end it early and hide the rest. */
    for (size_t pos = 0; pos < tlen && !st;) {
        lineno++;
        const char *nl = memchr(text + pos, '\n', tlen - pos);
        size_t len = nl ? (size_t)(nl - (text + pos)) : tlen - pos;
        const char *nul = memchr(text + pos, '\0', len);
        if (nul) {
            snprintf(where, sizeof where, "%s:%d:%d", path, lineno, (int)(nul - (text + pos)) + 1);
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, where, "NUL byte (a config file is text)");
            break;
        }
        if (len > sizeof line - 2) {
            snprintf(where, sizeof where, "%s:%d", path, lineno);
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, where, "line %d is longer than %zu characters", lineno,
                             sizeof line - 2);
            break;
        }
        memcpy(line, text + pos, len);
        line[len] = '\0';
        pos += len + (nl != NULL);
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        char *end = p + strlen(p);
        while (end > p && (end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        if (!*p)
            continue;
        int col = (int)(p - line) + 1;
        char *sep = p + strcspn(p, "=:");
        snprintf(where, sizeof where, "%s:%d:%d", path, lineno, col);
        if (!*sep) {
            st = dsv4_seterr(err, DSV4_ERR_FORMAT, where, "expected 'key = value', got '%s'", p);
            break;
        }
        char *kend = sep;
        while (kend > p && (kend[-1] == ' ' || kend[-1] == '\t'))
            kend--;
        *kend = '\0';
        char *v = sep + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        int vcol = (int)(v - line) + 1;
        dsv4_error e;
        dsv4_error_clear(&e);
        st = dsv4_config_set(&c, p, v, &e);
        /* The rules of the field alone are checked here, while the line is known; a rule
           linking fields waits for dsv4_config_validate (a later --set may complete it). */
        if (!st)
            st = check_self(&c, p, &e);
        if (st) {
            snprintf(where, sizeof where, "%s:%d:%d", path, lineno, st == DSV4_ERR_NOT_FOUND ? col : vcol);
            dsv4_seterr(err, st, where, "%s", e.message);
            break;
        }
    }
    free(text);
    if (!st)
        *cfg = c;
    return st;
}
