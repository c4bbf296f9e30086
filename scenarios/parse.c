/*
 * Scenario files: YAML (libyaml's document API) -> a flat list of resolved cases.
 * The schema is docs/scenarios.md; the public API is include/dsv4moe/scenario.h.
 *
 * A case is first built as a `draft` (a preset name, config overrides as text, a
 * topology, a budget, token and replay lists as written, ...), by applying the
 * defaults and then each axis value or the explicit case's mapping. Every value
 * is checked the first time it is applied (in a pre-pass over all axis values
 * and exclusions), so errors name the place of the value whatever case it ends
 * up in. A draft is then resolved into a dsv4_scenario_case.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "dsv4moe/scenario.h"
#include "err.h"

#define MAX_FILE_BYTES (16u << 20)
#define MAX_MAP_PAIRS 256
#define MAX_AXES 64
#define MAX_CFG_KEYS 48
#define CFG_VALUE_MAX 64
#define REGEX_MAX 512
#define CASE_NAME_MAX 128
#define LABEL_MAX 64

/* ---------------- context and errors ---------------- */

typedef struct {
    const char *file; /* name used in messages */
    const char *text;
    size_t len;
    yaml_document_t *doc;
    dsv4_error *err;
} ctx;

static dsv4_status fail(ctx *c, dsv4_status st, yaml_mark_t m, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static dsv4_status fail(ctx *c, dsv4_status st, yaml_mark_t m, const char *fmt, ...)
{
    char where[DSV4_ERROR_WHERE_MAX];
    char msg[DSV4_ERROR_MESSAGE_MAX];
    snprintf(where, sizeof where, "%.200s:%zu:%zu", c->file, m.line + 1, m.column + 1);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dsv4_seterr(c->err, st, where, "%s", msg);
}

static dsv4_status nomem(ctx *c)
{
    return dsv4_seterr(c->err, DSV4_ERR_NOMEM, c->file, "out of memory");
}

static yaml_node_t *get(ctx *c, int id) { return yaml_document_get_node(c->doc, id); }

static const char *sval(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = sval(n);
    return !s[0] || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static const char *type_name(const yaml_node_t *n)
{
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    return is_null(n) ? "nothing (null)" : "a scalar";
}

/* A printable, shortened copy of a scalar for messages. */
static const char *shown(const yaml_node_t *n, char *buf, size_t size)
{
    if (n->type != YAML_SCALAR_NODE) {
        snprintf(buf, size, "%s", type_name(n));
        return buf;
    }
    size_t j = 0;
    for (const char *s = sval(n); *s && j + 4 < size; s++)
        buf[j++] = (*s >= 32 && *s < 127) ? *s : '?';
    buf[j] = '\0';
    return buf;
}

static dsv4_status want(ctx *c, const yaml_node_t *n, yaml_node_type_t t, const char *what)
{
    if (n->type == t)
        return DSV4_OK;
    const char *exp = t == YAML_SCALAR_NODE ? "a scalar" : t == YAML_SEQUENCE_NODE ? "a list" : "a mapping";
    return fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected %s, got %s", what, exp, type_name(n));
}

#define PAIRS(n) (size_t)((n)->data.mapping.pairs.top - (n)->data.mapping.pairs.start)
#define ITEMS(n) (size_t)((n)->data.sequence.items.top - (n)->data.sequence.items.start)

/* Checks a mapping: at most MAX_MAP_PAIRS pairs, scalar keys, no key twice. */
static dsv4_status check_mapping(ctx *c, const yaml_node_t *n, const char *what)
{
    dsv4_status st = want(c, n, YAML_MAPPING_NODE, what);
    if (st)
        return st;
    size_t np = PAIRS(n);
    if (np > MAX_MAP_PAIRS)
        return fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: %zu keys, more than the %d a scenario mapping may hold",
                    what, np, MAX_MAP_PAIRS);
    for (size_t i = 0; i < np; i++) {
        yaml_node_t *k = get(c, n->data.mapping.pairs.start[i].key);
        if (!k || !get(c, n->data.mapping.pairs.start[i].value))
            return fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: broken mapping", what);
        if (k->type != YAML_SCALAR_NODE)
            return fail(c, DSV4_ERR_FORMAT, k->start_mark, "%s: expected a scalar key, got %s", what, type_name(k));
        for (size_t j = 0; j < i; j++) {
            yaml_node_t *k2 = get(c, n->data.mapping.pairs.start[j].key);
            if (!strcmp(sval(k), sval(k2))) {
                char b[80];
                return fail(c, DSV4_ERR_FORMAT, k->start_mark, "%s: duplicate key '%s' (first at line %zu)", what,
                            shown(k, b, sizeof b), k2->start_mark.line + 1);
            }
        }
    }
    return DSV4_OK;
}

/* ---------------- scalars ---------------- */

static dsv4_status get_int(ctx *c, const yaml_node_t *n, const char *what, int64_t lo, int64_t hi, int64_t *out)
{
    char b[80];
    if (n->type != YAML_SCALAR_NODE || is_null(n))
        return fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected an integer, got %s", what, type_name(n));
    const char *s = sval(n);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno == ERANGE || s[0] == ' ')
        return fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected an integer, got '%s'", what, shown(n, b, sizeof b));
    if (v < lo || v > hi)
        return fail(c, DSV4_ERR_CONFIG, n->start_mark, "%s: %lld is outside [%lld, %lld]", what, v, (long long)lo,
                    (long long)hi);
    *out = v;
    return DSV4_OK;
}

static dsv4_status get_num(ctx *c, const yaml_node_t *n, const char *what, double lo, double hi, double *out)
{
    char b[80];
    if (n->type != YAML_SCALAR_NODE || is_null(n))
        return fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected a number, got %s", what, type_name(n));
    const char *s = sval(n);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || !isfinite(v) || s[0] == ' ')
        return fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected a finite number, got '%s'", what,
                    shown(n, b, sizeof b));
    if (v < lo || v > hi)
        return fail(c, DSV4_ERR_CONFIG, n->start_mark, "%s: %.9g is outside [%.9g, %.9g]", what, v, lo, hi);
    *out = v;
    return DSV4_OK;
}

/* YAML 1.1 booleans: true/false, yes/no, on/off (any case). */
static int bool_word(const char *s)
{
    static const char *const t[] = {"true", "yes", "on"}, *const f[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (!strcasecmp(s, t[i]))
            return 1;
        if (!strcasecmp(s, f[i]))
            return 0;
    }
    return -1;
}

static dsv4_status get_bool(ctx *c, const yaml_node_t *n, const char *what, bool *out)
{
    char b[80];
    int v = n->type == YAML_SCALAR_NODE ? bool_word(sval(n)) : -1;
    if (v < 0)
        return fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected a boolean (true/false, on/off), got %s%s%s",
                    what, n->type == YAML_SCALAR_NODE ? "'" : "", shown(n, b, sizeof b),
                    n->type == YAML_SCALAR_NODE ? "'" : "");
    *out = v == 1;
    return DSV4_OK;
}

static void join(char *buf, size_t size, const char *const *names)
{
    buf[0] = '\0';
    for (const char *const *p = names; *p; p++) {
        if (p != names)
            strncat(buf, ", ", size - strlen(buf) - 1);
        strncat(buf, *p, size - strlen(buf) - 1);
    }
}

static dsv4_status get_enum(ctx *c, const yaml_node_t *n, const char *what, const char *const *names, int *out)
{
    dsv4_status st = want(c, n, YAML_SCALAR_NODE, what);
    if (st)
        return st;
    for (int i = 0; names[i]; i++)
        if (!strcmp(sval(n), names[i])) {
            *out = i;
            return DSV4_OK;
        }
    char list[256], b[80];
    join(list, sizeof list, names);
    return fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: unknown value '%s' (one of: %s)", what, shown(n, b, sizeof b),
                list);
}

/* ---------------- drafts ---------------- */

typedef struct {
    bool set;
    char value[CFG_VALUE_MAX];
} cfg_ovr;

typedef struct {
    const char *preset; /* static, from dsv4_config_preset_names() */
    cfg_ovr cfg[MAX_CFG_KEYS];
    dsv4_topology topo;
    dsv4_budget budget;
    int n_tokens;
    int64_t tokens[DSV4_SCENARIO_MAX_WORLD];
    yaml_mark_t tokens_mark;
    int n_replay;
    bool replay[DSV4_SCENARIO_MAX_WORLD];
    yaml_mark_t replay_mark;
    uint64_t seed;
    unsigned checks;
    dsv4_expect expect;
    char regex[REGEX_MAX];
    bool has_name;
    char name[CASE_NAME_MAX];
    const char *defect; /* static, from review_ids; NULL: none */
    dsv4_scenario_checkpoint ckpt;
} draft;

static const char *const field_names[] = {"preset", "layer", "config", "topology", "budget",     "tokens", "replay",
                                          "seed",   "checks", "expect", "name",     "checkpoint", "fault",  NULL};
/* The defects of the review in shared/seed/ by finding number (7 is the desync of 3: it names f03). */
static const char *const review_ids[] = {"f01", "f02", "f03", "f04", "f05", "f06", "f08",
                                         "f09", "f10", "f11", "f12", "f13", "f14", NULL};
static const char *const ckpt_keys[] = {"layout", "shards", "order", NULL};
static const char *const layout_names[] = {"split", "stacked", NULL};
static const char *const order_names[] = {"experts_first", "experts_last", NULL};
static const char *const topo_keys[] = {"world", "world_size", "tp", "dp", "ep", "role", "backend", "sm", "graph",
                                        "cuda_graph", "buckets", "max_tokens", "max_tokens_per_rank", "chunk",
                                        "chunk_tokens", "dispatch", "executor", NULL};
static const char *const budget_keys[] = {"device_gib", "device_mb", "device_bytes", "reserve_mb", "taken_gib",
                                          "taken_mb", "taken_bytes", NULL};
static const char *const role_names[] = {"prefill", "decode", "mixed", NULL};
static const char *const backend_names[] = {"ref", "cpu", "cuda", NULL};
static const char *const dispatch_names[] = {"auto", "all_gather", "all_to_all", "low_latency", NULL};
static const char *const executor_names[] = {"auto", "contiguous", "masked", "per_token", NULL};
static const char *const check_names[] = {"numerics", "determinism", "symmetry", "memory",
                                          "empty",    "clamp_exercised", "refusal", NULL};

const char *dsv4_check_name(unsigned check_bit)
{
    for (int i = 0; i < DSV4_CHECK_COUNT; i++)
        if (check_bit == 1u << i)
            return check_names[i];
    return "?";
}

static int cfg_key_index(const char *key)
{
    const char *const *k = dsv4_config_keys();
    for (int i = 0; k[i] && i < MAX_CFG_KEYS; i++)
        if (!strcmp(k[i], key))
            return i;
    return -1;
}

static int list_index(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], s))
            return i;
    return -1;
}

static void draft_init(draft *d)
{
    memset(d, 0, sizeof *d);
    d->preset = dsv4_config_preset_names()[0];
    for (const char *const *p = dsv4_config_preset_names(); *p; p++)
        if (!strcmp(*p, "mini"))
            d->preset = *p;
    dsv4_topology_init(&d->topo);
    dsv4_budget_init(&d->budget);
    d->n_tokens = 1;
    d->tokens[0] = 16;
    d->n_replay = 1;
    d->replay[0] = true;
    d->seed = 1;
    d->checks = DSV4_CHECK_ALL;
    d->expect = DSV4_EXPECT_PASS;
    d->ckpt.layout = DSV4_LAYOUT_SPLIT;
    d->ckpt.shards = 1;
}

static dsv4_status set_cfg(ctx *c, draft *d, const char *key, const yaml_node_t *keynode, const yaml_node_t *v)
{
    char what[96], b[80];
    snprintf(what, sizeof what, "config.%.64s", key);
    int ki = cfg_key_index(key);
    if (ki < 0) {
        char list[640];
        join(list, sizeof list, dsv4_config_keys());
        return fail(c, DSV4_ERR_FORMAT, keynode->start_mark, "unknown config key '%s' (allowed: %s)",
                    shown(keynode, b, sizeof b), list);
    }
    if (v->type != YAML_SCALAR_NODE || is_null(v))
        return fail(c, DSV4_ERR_FORMAT, v->start_mark, "%s: expected a scalar value, got %s", what, type_name(v));
    const char *s = sval(v);
    int bw = bool_word(s);
    if (bw >= 0)
        s = bw ? "true" : "false";
    if (strlen(s) >= CFG_VALUE_MAX)
        return fail(c, DSV4_ERR_CONFIG, v->start_mark, "%s: value longer than %d characters", what,
                    CFG_VALUE_MAX - 1);
    dsv4_config scratch;
    dsv4_error e;
    dsv4_config_init(&scratch);
    dsv4_status st = dsv4_config_set(&scratch, key, s, &e);
    if (st)
        return fail(c, st == DSV4_ERR_NOT_FOUND ? DSV4_ERR_FORMAT : DSV4_ERR_CONFIG, v->start_mark, "%s", e.message);
    d->cfg[ki].set = true;
    snprintf(d->cfg[ki].value, sizeof d->cfg[ki].value, "%s", s);
    return DSV4_OK;
}

static dsv4_status set_topo(ctx *c, draft *d, const char *key, const yaml_node_t *keynode, const yaml_node_t *v)
{
    char what[96], b[80];
    snprintf(what, sizeof what, "topology.%.64s", key);
    int64_t i64 = 0;
    int e = 0;
    bool bv;
    dsv4_status st;
    dsv4_topology *t = &d->topo;
    switch (list_index(topo_keys, key)) {
    case 0:
    case 1:
        if ((st = get_int(c, v, what, 1, DSV4_SCENARIO_MAX_WORLD, &i64)))
            return st;
        t->world_size = (int)i64;
        return DSV4_OK;
    case 2:
    case 3:
    case 4:
        if ((st = get_int(c, v, what, INT_MIN, INT_MAX, &i64)))
            return st;
        *(key[0] == 't' ? &t->tp : key[0] == 'd' ? &t->dp : &t->ep) = (int)i64;
        return DSV4_OK;
    case 5:
        if ((st = get_enum(c, v, what, role_names, &e)))
            return st;
        t->role = (dsv4_role)e;
        return DSV4_OK;
    case 6:
        if ((st = get_enum(c, v, what, backend_names, &e)))
            return st;
        t->backend = (dsv4_backend_kind)e;
        return DSV4_OK;
    case 7:
        if ((st = get_int(c, v, what, INT_MIN, INT_MAX, &i64)))
            return st;
        t->sm = (int)i64;
        return DSV4_OK;
    case 8:
    case 9:
        if ((st = get_bool(c, v, what, &bv)))
            return st;
        t->cuda_graph = bv;
        return DSV4_OK;
    case 10: {
        if (is_null(v)) {
            t->n_buckets = 0;
            return DSV4_OK;
        }
        if ((st = want(c, v, YAML_SEQUENCE_NODE, what)))
            return st;
        size_t n = ITEMS(v);
        if (n > DSV4_MAX_BUCKETS)
            return fail(c, DSV4_ERR_CONFIG, v->start_mark, "%s: %zu buckets, more than %d", what, n,
                        DSV4_MAX_BUCKETS);
        int64_t tmp[DSV4_MAX_BUCKETS];
        for (size_t i = 0; i < n; i++) {
            yaml_node_t *it = get(c, v->data.sequence.items.start[i]);
            if (!it)
                return fail(c, DSV4_ERR_FORMAT, v->start_mark, "%s: broken list", what);
            if ((st = get_int(c, it, what, INT64_MIN, INT64_MAX, &tmp[i])))
                return st;
        }
        t->n_buckets = (int)n;
        memset(t->buckets, 0, sizeof t->buckets);
        memcpy(t->buckets, tmp, n * sizeof tmp[0]);
        return DSV4_OK;
    }
    case 11:
    case 12:
        if ((st = get_int(c, v, what, INT64_MIN, INT64_MAX, &i64)))
            return st;
        t->max_tokens_per_rank = i64;
        return DSV4_OK;
    case 13:
    case 14:
        if ((st = get_int(c, v, what, INT64_MIN, INT64_MAX, &i64)))
            return st;
        t->chunk_tokens = i64;
        return DSV4_OK;
    case 15:
        if ((st = get_enum(c, v, what, dispatch_names, &e)))
            return st;
        t->dispatch = (dsv4_dispatch_req)e;
        return DSV4_OK;
    case 16:
        if ((st = get_enum(c, v, what, executor_names, &e)))
            return st;
        t->executor = (dsv4_executor_req)e;
        return DSV4_OK;
    default: {
        char list[400];
        join(list, sizeof list, topo_keys);
        return fail(c, DSV4_ERR_FORMAT, keynode->start_mark, "unknown topology key '%s' (allowed: %s)",
                    shown(keynode, b, sizeof b), list);
    }
    }
}

static dsv4_status set_budget(ctx *c, draft *d, const char *key, const yaml_node_t *keynode, const yaml_node_t *v)
{
    char what[96], b[80];
    snprintf(what, sizeof what, "budget.%.64s", key);
    int ki = list_index(budget_keys, key);
    if (ki < 0) {
        char list[256];
        join(list, sizeof list, budget_keys);
        return fail(c, DSV4_ERR_FORMAT, keynode->start_mark, "unknown budget key '%s' (allowed: %s)",
                    shown(keynode, b, sizeof b), list);
    }
    dsv4_status st;
    uint64_t bytes;
    if (!strcmp(key, "device_bytes") || !strcmp(key, "taken_bytes") || !strcmp(key, "reserve_mb")) {
        int64_t v64;
        if ((st = get_int(c, v, what, 0, INT64_MAX, &v64)))
            return st;
        bytes = (uint64_t)v64;
    } else {
        /* *_gib / *_mb: non-negative numbers, at most 2^62 bytes */
        double x = 0, scale = strstr(key, "_gib") ? 1073741824.0 : 1048576.0;
        if ((st = get_num(c, v, what, 0.0, 4611686018427387904.0 / scale, &x)))
            return st;
        bytes = (uint64_t)llround(x * scale);
    }
    if (!strcmp(key, "reserve_mb"))
        d->budget.reserve_mb = bytes;
    else if (!strncmp(key, "device", 6))
        d->budget.device_bytes = bytes;
    else
        d->budget.taken_bytes = bytes;
    return DSV4_OK;
}

/* tokens / replay: one value for all ranks, or a list of one per rank. */
static dsv4_status set_ranks(ctx *c, draft *d, bool tokens, const yaml_node_t *v)
{
    const char *what = tokens ? "tokens" : "replay";
    dsv4_status st;
    size_t n = 1;
    if (v->type == YAML_MAPPING_NODE || is_null(v))
        return fail(c, DSV4_ERR_FORMAT, v->start_mark, "%s: expected a list of %s (one per rank, or one for all), got %s",
                    what, tokens ? "token counts" : "booleans", type_name(v));
    if (v->type == YAML_SEQUENCE_NODE) {
        n = ITEMS(v);
        if (n < 1 || n > DSV4_SCENARIO_MAX_WORLD)
            return fail(c, DSV4_ERR_CONFIG, v->start_mark, "%s: %zu entries; give 1 (for all ranks) to %d (one per rank)",
                        what, n, DSV4_SCENARIO_MAX_WORLD);
    }
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *it = v;
        if (v->type == YAML_SEQUENCE_NODE && !(it = get(c, v->data.sequence.items.start[i])))
            return fail(c, DSV4_ERR_FORMAT, v->start_mark, "%s: broken list", what);
        if (tokens) {
            int64_t t;
            if ((st = get_int(c, it, what, 0, INT64_C(1) << 40, &t)))
                return st;
            d->tokens[i] = t;
        } else {
            bool b;
            if ((st = get_bool(c, it, what, &b)))
                return st;
            d->replay[i] = b;
        }
    }
    if (tokens) {
        d->n_tokens = (int)n;
        d->tokens_mark = v->start_mark;
    } else {
        d->n_replay = (int)n;
        d->replay_mark = v->start_mark;
    }
    return DSV4_OK;
}

static dsv4_status set_checks(ctx *c, draft *d, const yaml_node_t *v)
{
    dsv4_status st;
    unsigned m = 0;
    if (v->type == YAML_SCALAR_NODE && !strcmp(sval(v), "all")) {
        d->checks = DSV4_CHECK_ALL;
        return DSV4_OK;
    }
    if (!is_null(v)) {
        if ((st = want(c, v, YAML_SEQUENCE_NODE, "checks")))
            return st;
        for (size_t i = 0; i < ITEMS(v); i++) {
            yaml_node_t *it = get(c, v->data.sequence.items.start[i]);
            int e;
            if (!it)
                return fail(c, DSV4_ERR_FORMAT, v->start_mark, "checks: broken list");
            if ((st = get_enum(c, it, "checks", check_names, &e)))
                return st;
            m |= 1u << e;
        }
    }
    d->checks = m;
    return DSV4_OK;
}

static dsv4_status set_expect(ctx *c, draft *d, const yaml_node_t *v)
{
    char b[80];
    dsv4_status st;
    if (v->type == YAML_SCALAR_NODE && !strcmp(sval(v), "pass")) {
        d->expect = DSV4_EXPECT_PASS;
        d->regex[0] = '\0';
        return DSV4_OK;
    }
    if (v->type != YAML_MAPPING_NODE)
        return fail(c, DSV4_ERR_FORMAT, v->start_mark, "expect: expected 'pass' or a mapping {refused: REGEX}, got %s%s%s",
                    v->type == YAML_SCALAR_NODE ? "'" : "", shown(v, b, sizeof b), v->type == YAML_SCALAR_NODE ? "'" : "");
    if ((st = check_mapping(c, v, "expect")))
        return st;
    if (PAIRS(v) != 1 || strcmp(sval(get(c, v->data.mapping.pairs.start[0].key)), "refused")) {
        yaml_node_t *k = PAIRS(v) ? get(c, v->data.mapping.pairs.start[PAIRS(v) > 1].key) : NULL;
        if (k && PAIRS(v) == 1)
            return fail(c, DSV4_ERR_FORMAT, k->start_mark, "unknown expect key '%s' (allowed: refused)",
                        shown(k, b, sizeof b));
        return fail(c, DSV4_ERR_FORMAT, k ? k->start_mark : v->start_mark,
                    "expect: expected exactly one key, refused: REGEX");
    }
    yaml_node_t *r = get(c, v->data.mapping.pairs.start[0].value);
    if (r->type != YAML_SCALAR_NODE || is_null(r) || !sval(r)[0])
        return fail(c, DSV4_ERR_FORMAT, r->start_mark, "expect.refused: expected a non-empty regex string, got %s",
                    type_name(r));
    if (strlen(sval(r)) >= REGEX_MAX)
        return fail(c, DSV4_ERR_CONFIG, r->start_mark, "expect.refused: regex longer than %d characters",
                    REGEX_MAX - 1);
    regex_t re;
    int rc = regcomp(&re, sval(r), REG_EXTENDED | REG_NOSUB);
    if (rc) {
        char eb[200];
        regerror(rc, &re, eb, sizeof eb);
        regfree(&re);
        return fail(c, DSV4_ERR_FORMAT, r->start_mark, "expect.refused: bad regex '%s': %s", shown(r, b, sizeof b),
                    eb);
    }
    regfree(&re);
    d->expect = DSV4_EXPECT_REFUSED;
    snprintf(d->regex, sizeof d->regex, "%s", sval(r));
    return DSV4_OK;
}

static dsv4_status apply_map(ctx *c, draft *d, const yaml_node_t *m, const char *what, bool allow_name);

/* checkpoint: {layout: split|stacked, shards: 1..16, order: experts_first|experts_last} */
static dsv4_status set_checkpoint(ctx *c, draft *d, const yaml_node_t *v)
{
    dsv4_status st;
    char b[80], list[128];
    if ((st = check_mapping(c, v, "checkpoint")))
        return st;
    for (size_t i = 0; i < PAIRS(v); i++) {
        yaml_node_t *k = get(c, v->data.mapping.pairs.start[i].key);
        yaml_node_t *x = get(c, v->data.mapping.pairs.start[i].value);
        int e;
        int64_t n;
        switch (list_index(ckpt_keys, sval(k))) {
        case 0:
            if ((st = get_enum(c, x, "checkpoint.layout", layout_names, &e)))
                return st;
            d->ckpt.layout = e == 0 ? DSV4_LAYOUT_SPLIT : DSV4_LAYOUT_STACKED;
            break;
        case 1:
            if ((st = get_int(c, x, "checkpoint.shards", 1, DSV4_SCENARIO_MAX_SHARDS, &n)))
                return st;
            d->ckpt.shards = (int)n;
            break;
        case 2:
            if ((st = get_enum(c, x, "checkpoint.order", order_names, &e)))
                return st;
            d->ckpt.experts_last = e == 1;
            break;
        default:
            join(list, sizeof list, ckpt_keys);
            return fail(c, DSV4_ERR_FORMAT, k->start_mark, "unknown checkpoint key '%s' (allowed: %s)",
                        shown(k, b, sizeof b), list);
        }
    }
    return DSV4_OK;
}

/* fault: f01 .. f14, the defect of the review this case catches. */
static dsv4_status set_defect(ctx *c, draft *d, const yaml_node_t *v)
{
    dsv4_status st;
    char b[80], list[160];
    if (is_null(v)) {
        d->defect = NULL;
        return DSV4_OK;
    }
    if ((st = want(c, v, YAML_SCALAR_NODE, "fault")))
        return st;
    int i = list_index(review_ids, sval(v));
    if (i >= 0) {
        d->defect = review_ids[i];
        return DSV4_OK;
    }
    if (!strcmp(sval(v), "f07"))
        return fail(c, DSV4_ERR_FORMAT, v->start_mark,
                    "fault: findings 3 and 7 are one defect (the plan collective of eager steps only): write fault: f03");
    join(list, sizeof list, review_ids);
    return fail(c, DSV4_ERR_FORMAT, v->start_mark, "fault: unknown defect '%s' (one of: %s)", shown(v, b, sizeof b),
                list);
}

static dsv4_status unknown_field(ctx *c, const yaml_node_t *keynode, bool allow_name)
{
    char b[80], list[640];
    join(list, sizeof list, dsv4_config_keys());
    return fail(c, DSV4_ERR_FORMAT, keynode->start_mark,
                "unknown key '%s' (allowed: preset, layer, config, topology, budget, tokens, replay, seed, checks, "
                "expect, checkpoint, fault%s; a dotted path config.KEY, topology.KEY or budget.KEY; or a config key: %s)",
                shown(keynode, b, sizeof b), allow_name ? ", name" : "", list);
}

/* Is `key` a case field (top-level field, dotted path with a known prefix, or bare config key)? */
static bool is_field(const char *key)
{
    if (list_index(field_names, key) >= 0 || cfg_key_index(key) >= 0)
        return true;
    return !strncmp(key, "config.", 7) || !strncmp(key, "topology.", 9) || !strncmp(key, "budget.", 7);
}

/* Applies one field `key: v` (key as written in the file). */
static dsv4_status apply_field(ctx *c, draft *d, const char *key, const yaml_node_t *keynode, const yaml_node_t *v,
                               bool allow_name)
{
    dsv4_status st;
    char b[80];
    if (!strncmp(key, "config.", 7))
        return set_cfg(c, d, key + 7, keynode, v);
    if (!strncmp(key, "topology.", 9))
        return set_topo(c, d, key + 9, keynode, v);
    if (!strncmp(key, "budget.", 7))
        return set_budget(c, d, key + 7, keynode, v);
    switch (list_index(field_names, key)) {
    case 0: { /* preset */
        if ((st = want(c, v, YAML_SCALAR_NODE, "preset")))
            return st;
        for (const char *const *p = dsv4_config_preset_names(); *p; p++)
            if (!strcmp(*p, sval(v))) {
                d->preset = *p;
                return DSV4_OK;
            }
        char list[256];
        join(list, sizeof list, dsv4_config_preset_names());
        return fail(c, DSV4_ERR_FORMAT, v->start_mark, "preset: unknown preset '%s' (one of: %s)",
                    shown(v, b, sizeof b), list);
    }
    case 1: /* layer */
        return set_cfg(c, d, "layer", keynode, v);
    case 2:
    case 3:
    case 4: { /* config, topology, budget */
        if (is_null(v))
            return DSV4_OK;
        if ((st = check_mapping(c, v, key)))
            return st;
        for (size_t i = 0; i < PAIRS(v); i++) {
            yaml_node_t *k = get(c, v->data.mapping.pairs.start[i].key);
            yaml_node_t *x = get(c, v->data.mapping.pairs.start[i].value);
            st = key[0] == 'c' ? set_cfg(c, d, sval(k), k, x)
                 : key[0] == 't' ? set_topo(c, d, sval(k), k, x)
                                 : set_budget(c, d, sval(k), k, x);
            if (st)
                return st;
        }
        return DSV4_OK;
    }
    case 5:
        return set_ranks(c, d, true, v);
    case 6:
        return set_ranks(c, d, false, v);
    case 7: {
        int64_t s;
        if ((st = get_int(c, v, "seed", 0, INT64_MAX, &s)))
            return st;
        d->seed = (uint64_t)s;
        return DSV4_OK;
    }
    case 8:
        return set_checks(c, d, v);
    case 9:
        return set_expect(c, d, v);
    case 10:
        if (!allow_name)
            return fail(c, DSV4_ERR_FORMAT, keynode->start_mark,
                        "'name' is only allowed in an explicit case (cases: - {name: ...})");
        if ((st = want(c, v, YAML_SCALAR_NODE, "name")))
            return st;
        if (!sval(v)[0] || strlen(sval(v)) >= CASE_NAME_MAX)
            return fail(c, DSV4_ERR_FORMAT, v->start_mark, "name: expected 1 to %d characters", CASE_NAME_MAX - 1);
        d->has_name = true;
        snprintf(d->name, sizeof d->name, "%s", sval(v));
        return DSV4_OK;
    case 11:
        return set_checkpoint(c, d, v);
    case 12:
        return set_defect(c, d, v);
    default:
        if (cfg_key_index(key) >= 0)
            return set_cfg(c, d, key, keynode, v);
        return unknown_field(c, keynode, allow_name);
    }
}

/* A mapping of fields (defaults, an explicit case, a mapping-valued axis value). */
static dsv4_status apply_map(ctx *c, draft *d, const yaml_node_t *m, const char *what, bool allow_name)
{
    dsv4_status st;
    if (is_null(m))
        return DSV4_OK;
    if ((st = check_mapping(c, m, what)))
        return st;
    for (size_t i = 0; i < PAIRS(m); i++) {
        yaml_node_t *k = get(c, m->data.mapping.pairs.start[i].key);
        yaml_node_t *v = get(c, m->data.mapping.pairs.start[i].value);
        if ((st = apply_field(c, d, sval(k), k, v, allow_name)))
            return st;
    }
    return DSV4_OK;
}

/* The config of a draft: preset, then the overrides (already checked). */
static dsv4_status draft_config(const draft *d, dsv4_config *cfg, dsv4_error *e)
{
    dsv4_status st = dsv4_config_preset(d->preset, cfg, e);
    const char *const *keys = dsv4_config_keys();
    for (int i = 0; !st && keys[i] && i < MAX_CFG_KEYS; i++)
        if (d->cfg[i].set)
            st = dsv4_config_set(cfg, keys[i], d->cfg[i].value, e);
    return st;
}

static bool ranks_equal_i64(const int64_t *a, int na, const int64_t *b, int nb)
{
    if (na != nb && na != 1 && nb != 1)
        return false;
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++)
        if (a[na == 1 ? 0 : i] != b[nb == 1 ? 0 : i])
            return false;
    return true;
}

static bool ranks_equal_b(const bool *a, int na, const bool *b, int nb)
{
    if (na != nb && na != 1 && nb != 1)
        return false;
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++)
        if (a[na == 1 ? 0 : i] != b[nb == 1 ? 0 : i])
            return false;
    return true;
}

/* Same resolved case (used by `exclude`: applying the exclusion changes nothing). */
static bool draft_equal(const draft *a, const draft *b)
{
    if (strcmp(a->preset, b->preset) || a->seed != b->seed || a->checks != b->checks || a->expect != b->expect ||
        strcmp(a->regex, b->regex))
        return false;
    const dsv4_topology *s = &a->topo, *t = &b->topo;
    if (s->world_size != t->world_size || s->tp != t->tp || s->dp != t->dp || s->ep != t->ep || s->role != t->role ||
        s->backend != t->backend || s->sm != t->sm || s->cuda_graph != t->cuda_graph || s->n_buckets != t->n_buckets ||
        s->max_tokens_per_rank != t->max_tokens_per_rank || s->chunk_tokens != t->chunk_tokens ||
        s->dispatch != t->dispatch || s->executor != t->executor)
        return false;
    for (int i = 0; i < s->n_buckets && i < DSV4_MAX_BUCKETS; i++)
        if (s->buckets[i] != t->buckets[i])
            return false;
    if (a->budget.device_bytes != b->budget.device_bytes || a->budget.reserve_mb != b->budget.reserve_mb ||
        a->budget.taken_bytes != b->budget.taken_bytes)
        return false;
    if (!ranks_equal_i64(a->tokens, a->n_tokens, b->tokens, b->n_tokens) ||
        !ranks_equal_b(a->replay, a->n_replay, b->replay, b->n_replay))
        return false;
    dsv4_config ca, cb;
    if (draft_config(a, &ca, NULL) || draft_config(b, &cb, NULL))
        return false;
    char va[96], vb[96];
    for (const char *const *k = dsv4_config_keys(); *k; k++) {
        if (dsv4_config_get(&ca, *k, va, sizeof va, NULL) || dsv4_config_get(&cb, *k, vb, sizeof vb, NULL))
            return false;
        if (strcmp(va, vb))
            return false;
    }
    return true;
}

/* ---------------- the scenario ---------------- */

struct dsv4_scenario {
    char *name, *path;
    size_t n_axes;
    char **axis_names;
    size_t *axis_sizes;
    size_t n_cases;
    dsv4_scenario_case *cases;
    size_t product, excluded;
    int max_cases;
};

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static void case_free(dsv4_scenario_case *k)
{
    free((void *)k->name);
    free((void *)k->config_error);
    free((void *)k->tokens);
    free((void *)k->replay);
    free((void *)k->refused_regex);
    free((void *)k->axis_index);
}

void dsv4_scenario_free(dsv4_scenario *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_cases; i++)
        case_free(&s->cases[i]);
    free(s->cases);
    for (size_t i = 0; i < s->n_axes; i++)
        free(s->axis_names ? s->axis_names[i] : NULL);
    free(s->axis_names);
    free(s->axis_sizes);
    free(s->name);
    free(s->path);
    free(s);
}

const char *dsv4_scenario_name(const dsv4_scenario *s) { return s ? s->name : NULL; }
const char *dsv4_scenario_path(const dsv4_scenario *s) { return s ? s->path : NULL; }
size_t dsv4_scenario_count(const dsv4_scenario *s) { return s ? s->n_cases : 0; }
const dsv4_scenario_case *dsv4_scenario_get(const dsv4_scenario *s, size_t i)
{
    return s && i < s->n_cases ? &s->cases[i] : NULL;
}
size_t dsv4_scenario_axis_count(const dsv4_scenario *s) { return s ? s->n_axes : 0; }
const char *dsv4_scenario_axis_name(const dsv4_scenario *s, size_t a)
{
    return s && a < s->n_axes ? s->axis_names[a] : NULL;
}
size_t dsv4_scenario_axis_size(const dsv4_scenario *s, size_t a) { return s && a < s->n_axes ? s->axis_sizes[a] : 0; }
size_t dsv4_scenario_product_size(const dsv4_scenario *s) { return s ? s->product : 0; }
size_t dsv4_scenario_excluded(const dsv4_scenario *s) { return s ? s->excluded : 0; }
int dsv4_scenario_max_cases(const dsv4_scenario *s) { return s ? s->max_cases : 0; }

/* Resolves a draft into case k (k is zeroed; on error the caller frees what k holds). */
static dsv4_status finalize(ctx *c, const draft *d, const char *name, yaml_mark_t where, dsv4_scenario_case *k)
{
    int w = d->topo.world_size;
    if (d->n_tokens != 1 && d->n_tokens != w)
        return fail(c, DSV4_ERR_CONFIG, d->tokens_mark,
                    "case %s: tokens has %d entries but topology.world is %d: give one count for all ranks or one per "
                    "rank",
                    name, d->n_tokens, w);
    if (d->n_replay != 1 && d->n_replay != w)
        return fail(c, DSV4_ERR_CONFIG, d->replay_mark,
                    "case %s: replay has %d entries but topology.world is %d: give one flag for all ranks or one per "
                    "rank",
                    name, d->n_replay, w);
    int li = cfg_key_index("layer");
    if (li < 0 || !d->cfg[li].set)
        return fail(c, DSV4_ERR_CONFIG, where,
                    "case %s: layer is not set (give defaults.layer, a layer axis, or layer in the case)", name);
    dsv4_error e;
    dsv4_status st = draft_config(d, &k->config, &e);
    if (st)
        return fail(c, st, where, "case %s: %s", name, e.message);
    k->config_status = dsv4_config_validate(&k->config, &e);
    if (k->config_status && !(k->config_error = xstrdup(e.message)))
        return nomem(c);
    k->preset = d->preset;
    k->topology = d->topo;
    k->topology.rank = 0;
    k->budget = d->budget;
    k->n_ranks = w;
    int64_t *tk = malloc((size_t)w * sizeof *tk);
    bool *rp = malloc((size_t)w * sizeof *rp);
    k->tokens = tk;
    k->replay = rp;
    if (!tk || !rp || !(k->name = xstrdup(name)))
        return nomem(c);
    for (int i = 0; i < w; i++) {
        tk[i] = d->tokens[d->n_tokens == 1 ? 0 : i];
        rp[i] = d->replay[d->n_replay == 1 ? 0 : i];
    }
    k->seed = d->seed;
    k->fault = d->defect;
    k->checkpoint = d->ckpt;
    k->checks = d->checks;
    k->expect = d->expect;
    if (d->expect == DSV4_EXPECT_REFUSED && !(k->refused_regex = xstrdup(d->regex)))
        return nomem(c);
    k->line = (int)where.line + 1;
    k->col = (int)where.column + 1;
    k->explicit_index = -1;
    return DSV4_OK;
}

/* ---------------- alias guard ---------------- */

typedef struct {
    unsigned char *color; /* 0 unseen, 1 on the stack, 2 done */
    uint64_t *size;       /* expanded size, saturated */
} walk;

static dsv4_status expand_check(ctx *c, walk *w, int id, int depth, uint64_t *out)
{
    yaml_node_t *n = get(c, id);
    if (!n)
        return dsv4_seterr(c->err, DSV4_ERR_FORMAT, c->file, "broken YAML document (node %d)", id);
    size_t i = (size_t)(id - 1);
    if (w->color[i] == 2) {
        *out = w->size[i];
        return DSV4_OK;
    }
    if (w->color[i] == 1)
        return fail(c, DSV4_ERR_FORMAT, n->start_mark,
                    "alias cycle: this anchored collection contains an alias of itself");
    if (depth > DSV4_SCENARIO_MAX_DEPTH)
        return fail(c, DSV4_ERR_FORMAT, n->start_mark, "nesting deeper than %d levels", DSV4_SCENARIO_MAX_DEPTH);
    w->color[i] = 1;
    uint64_t total = 1, s;
    dsv4_status st;
    if (n->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
            if ((st = expand_check(c, w, *it, depth + 1, &s)))
                return st;
            total += s;
            if (total > DSV4_SCENARIO_MAX_EXPANDED_NODES)
                break;
        }
    } else if (n->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
            if ((st = expand_check(c, w, p->key, depth + 1, &s)))
                return st;
            total += s;
            if ((st = expand_check(c, w, p->value, depth + 1, &s)))
                return st;
            total += s;
            if (total > DSV4_SCENARIO_MAX_EXPANDED_NODES)
                break;
        }
    }
    if (total > DSV4_SCENARIO_MAX_EXPANDED_NODES)
        return fail(c, DSV4_ERR_FORMAT, n->start_mark,
                    "alias expansion too large: this node expands to more than %d nodes once its aliases are "
                    "expanded (a guard against alias bombs)",
                    DSV4_SCENARIO_MAX_EXPANDED_NODES);
    w->color[i] = 2;
    w->size[i] = total;
    *out = total;
    return DSV4_OK;
}

/* ---------------- names ---------------- */

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t len)
{
    if (b->oom)
        return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->n + len + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* The label of axis value `v` (index `idx`): the scalar, [a,b] for a short list of scalars, else the index. */
static void label(ctx *c, sbuf *b, const yaml_node_t *v, size_t idx)
{
    char num[32];
    snprintf(num, sizeof num, "%zu", idx);
    if (v->type == YAML_SCALAR_NODE) {
        sb_str(b, strlen(sval(v)) <= LABEL_MAX ? sval(v) : num);
        return;
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        size_t total = 2;
        for (size_t i = 0; i < ITEMS(v); i++) {
            yaml_node_t *it = get(c, v->data.sequence.items.start[i]);
            if (!it || it->type != YAML_SCALAR_NODE)
                goto index;
            total += strlen(sval(it)) + 1;
        }
        if (total > LABEL_MAX)
            goto index;
        sb_str(b, "[");
        for (size_t i = 0; i < ITEMS(v); i++) {
            if (i)
                sb_str(b, ",");
            sb_str(b, sval(get(c, v->data.sequence.items.start[i])));
        }
        sb_str(b, "]");
        return;
    }
index:
    sb_str(b, num);
}

/* ---------------- loading ---------------- */

typedef struct {
    const char *name;
    yaml_node_t *key, *seq;
    bool merge; /* not a field: each value is a mapping merged into the case */
} axis;

typedef struct {
    yaml_node_t *name, *defaults, *axes, *axes_key, *cases, *exclude, *max_cases;
} top;

static dsv4_status apply_axis_value(ctx *c, draft *d, const axis *a, const yaml_node_t *v)
{
    if (a->merge) {
        char what[96];
        snprintf(what, sizeof what, "axis '%.64s' value", a->name);
        return apply_map(c, d, v, what, false);
    }
    return apply_field(c, d, a->name, a->key, v, false);
}

static dsv4_status apply_exclusion(ctx *c, draft *d, const yaml_node_t *m, const axis *axes, size_t n_axes,
                                   const size_t *idx, bool *match)
{
    dsv4_status st;
    *match = true;
    for (size_t i = 0; i < PAIRS(m); i++) {
        yaml_node_t *k = get(c, m->data.mapping.pairs.start[i].key);
        yaml_node_t *v = get(c, m->data.mapping.pairs.start[i].value);
        size_t a = 0;
        while (a < n_axes && (!axes[a].merge || strcmp(axes[a].name, sval(k))))
            a++;
        if (a < n_axes) {
            if (v->type == YAML_MAPPING_NODE) {
                if ((st = apply_map(c, d, v, "exclude", false)))
                    return st;
                continue;
            }
            int64_t want_idx;
            char what[160];
            snprintf(what, sizeof what, "exclude: axis '%.64s' (an index into its values, or a mapping)", axes[a].name);
            if ((st = get_int(c, v, what, 0, (int64_t)ITEMS(axes[a].seq) - 1, &want_idx)))
                return st;
            if (idx && idx[a] != (size_t)want_idx)
                *match = false;
            continue;
        }
        if ((st = apply_field(c, d, sval(k), k, v, false)))
            return st;
    }
    return DSV4_OK;
}

static dsv4_status read_top(ctx *c, yaml_node_t *root, top *t)
{
    static const char *const keys[] = {"name", "description", "defaults", "axes", "cases", "exclude", "max_cases",
                                       "faults", NULL};
    dsv4_status st;
    memset(t, 0, sizeof *t);
    if (root->type != YAML_MAPPING_NODE)
        return fail(c, DSV4_ERR_FORMAT, root->start_mark, "a scenario file is a mapping (name, defaults, axes, ...), got %s",
                    type_name(root));
    if ((st = check_mapping(c, root, "scenario")))
        return st;
    for (size_t i = 0; i < PAIRS(root); i++) {
        yaml_node_t *k = get(c, root->data.mapping.pairs.start[i].key);
        yaml_node_t *v = get(c, root->data.mapping.pairs.start[i].value);
        char b[80], list[200];
        switch (list_index(keys, sval(k))) {
        case 0:
            if ((st = want(c, v, YAML_SCALAR_NODE, "name")))
                return st;
            if (!sval(v)[0] || is_null(v) || strlen(sval(v)) >= CASE_NAME_MAX)
                return fail(c, DSV4_ERR_FORMAT, v->start_mark, "name: expected 1 to %d characters", CASE_NAME_MAX - 1);
            t->name = v;
            break;
        case 1:
            if ((st = want(c, v, YAML_SCALAR_NODE, "description")))
                return st;
            break;
        case 2:
            if (!is_null(v) && (st = check_mapping(c, v, "defaults")))
                return st;
            t->defaults = v;
            break;
        case 3:
            if (!is_null(v) && (st = check_mapping(c, v, "axes")))
                return st;
            t->axes = v;
            t->axes_key = k;
            break;
        case 4:
            if (!is_null(v) && (st = want(c, v, YAML_SEQUENCE_NODE, "cases")))
                return st;
            t->cases = v;
            break;
        case 5:
            if (!is_null(v) && (st = want(c, v, YAML_SEQUENCE_NODE, "exclude")))
                return st;
            t->exclude = v;
            break;
        case 6:
            t->max_cases = v;
            break;
        case 7:
            /* The defects' test hooks (scenarios/seed-review.yaml), read by the fault build's runs
               (harness/fault_runs.c); here only the defect ids are checked. */
            if ((st = check_mapping(c, v, "faults")))
                return st;
            for (size_t f = 0; f < PAIRS(v); f++) {
                yaml_node_t *fk = get(c, v->data.mapping.pairs.start[f].key);
                if (list_index(review_ids, sval(fk)) < 0) {
                    join(list, sizeof list, review_ids);
                    return fail(c, DSV4_ERR_FORMAT, fk->start_mark, "faults: unknown defect '%s' (one of: %s)",
                                shown(fk, b, sizeof b), list);
                }
            }
            break;
        default:
            join(list, sizeof list, keys);
            return fail(c, DSV4_ERR_FORMAT, k->start_mark, "unknown key '%s' (allowed: %s)", shown(k, b, sizeof b),
                        list);
        }
    }
    if (!t->name)
        return fail(c, DSV4_ERR_FORMAT, root->start_mark, "the scenario has no 'name' (required)");
    return DSV4_OK;
}

static dsv4_status expand(ctx *c, yaml_node_t *root, dsv4_scenario *s)
{
    dsv4_status st;
    top t;
    if ((st = read_top(c, root, &t)))
        return st;
    if (!(s->name = xstrdup(sval(t.name))))
        return nomem(c);

    int64_t maxc = DSV4_SCENARIO_DEFAULT_MAX_CASES;
    if (t.max_cases && (st = get_int(c, t.max_cases, "max_cases", 1, DSV4_SCENARIO_MAX_CASES_LIMIT, &maxc)))
        return st;
    s->max_cases = (int)maxc;

    /* defaults */
    draft *base = malloc(sizeof *base), *d = malloc(sizeof *d), *x = malloc(sizeof *x);
    axis axes[MAX_AXES];
    size_t n_axes = 0, *idx = NULL;
    sbuf nb = {0};
    if (!base || !d || !x) {
        st = nomem(c);
        goto out;
    }
    draft_init(base);
    if (t.defaults && (st = apply_map(c, base, t.defaults, "defaults", false)))
        goto out;

    /* axes: kinds, then every value applied once to catch its errors where it is written */
    bool have_axes = t.axes && !is_null(t.axes);
    if (have_axes) {
        if (PAIRS(t.axes) > MAX_AXES) {
            st = fail(c, DSV4_ERR_FORMAT, t.axes->start_mark, "axes: %zu axes, more than %d", PAIRS(t.axes), MAX_AXES);
            goto out;
        }
        for (size_t i = 0; i < PAIRS(t.axes); i++) {
            axis *a = &axes[n_axes];
            a->key = get(c, t.axes->data.mapping.pairs.start[i].key);
            a->seq = get(c, t.axes->data.mapping.pairs.start[i].value);
            a->name = sval(a->key);
            a->merge = !is_field(a->name);
            char what[96];
            snprintf(what, sizeof what, "axis '%.64s'", a->name);
            if (!strcmp(a->name, "name")) {
                st = fail(c, DSV4_ERR_FORMAT, a->key->start_mark, "'name' cannot be an axis (case names are generated)");
                goto out;
            }
            if ((st = want(c, a->seq, YAML_SEQUENCE_NODE, what)))
                goto out;
            if (ITEMS(a->seq) == 0) {
                st = fail(c, DSV4_ERR_FORMAT, a->seq->start_mark, "%s: an axis needs at least one value", what);
                goto out;
            }
            for (size_t j = 0; j < ITEMS(a->seq); j++) {
                yaml_node_t *v = get(c, a->seq->data.sequence.items.start[j]);
                if (a->merge && v->type != YAML_MAPPING_NODE) {
                    char b[80];
                    st = fail(c, DSV4_ERR_FORMAT, v->start_mark,
                              "axis '%s' is not a case field (preset, layer, config, topology, budget, tokens, "
                              "replay, seed, checks, expect, a dotted path config.KEY/topology.KEY/budget.KEY, or a "
                              "config key), so each of its values must be a mapping to merge into the case; got %s",
                              shown(a->key, b, sizeof b), type_name(v));
                    goto out;
                }
                *d = *base;
                if ((st = apply_axis_value(c, d, a, v)))
                    goto out;
            }
            n_axes++;
        }
    }
    s->n_axes = n_axes;
    if (n_axes) {
        s->axis_names = calloc(n_axes, sizeof *s->axis_names);
        s->axis_sizes = calloc(n_axes, sizeof *s->axis_sizes);
        idx = calloc(n_axes, sizeof *idx);
        if (!s->axis_names || !s->axis_sizes || !idx) {
            st = nomem(c);
            goto out;
        }
        for (size_t a = 0; a < n_axes; a++) {
            s->axis_sizes[a] = ITEMS(axes[a].seq);
            if (!(s->axis_names[a] = xstrdup(axes[a].name))) {
                st = nomem(c);
                goto out;
            }
        }
    }

    /* exclusions: shape and values checked once */
    size_t n_excl = t.exclude && !is_null(t.exclude) ? ITEMS(t.exclude) : 0;
    for (size_t e = 0; e < n_excl; e++) {
        yaml_node_t *m = get(c, t.exclude->data.sequence.items.start[e]);
        bool match;
        if ((st = check_mapping(c, m, "exclude entry")))
            goto out;
        if (PAIRS(m) == 0) {
            st = fail(c, DSV4_ERR_FORMAT, m->start_mark, "exclude entry: empty (it would drop every case)");
            goto out;
        }
        *d = *base;
        if ((st = apply_exclusion(c, d, m, axes, n_axes, NULL, &match)))
            goto out;
    }

    /* the size, refused above max_cases before anything per case is allocated */
    size_t n_expl = t.cases && !is_null(t.cases) ? ITEMS(t.cases) : 0;
    uint64_t product = have_axes ? 1 : 0;
    bool over = false;
    for (size_t a = 0; a < n_axes; a++) {
        uint64_t n = ITEMS(axes[a].seq);
        if (product > UINT64_MAX / n)
            over = true;
        else
            product *= n;
    }
    if (over || product > (uint64_t)maxc || product + n_expl > (uint64_t)maxc) {
        char dims[400] = "";
        for (size_t a = 0; a < n_axes; a++) {
            char one[32];
            snprintf(one, sizeof one, "%s%zu", a ? " x " : "", (size_t)ITEMS(axes[a].seq));
            strncat(dims, one, sizeof dims - strlen(dims) - 1);
        }
        char total[48];
        if (over)
            snprintf(total, sizeof total, "more than 2^64");
        else
            snprintf(total, sizeof total, "%llu", (unsigned long long)product);
        st = fail(c, DSV4_ERR_CONFIG, t.max_cases ? t.max_cases->start_mark : t.axes_key ? t.axes_key->start_mark
                                                                                         : root->start_mark,
                  "the axes product (%s) is %s cases, plus %zu explicit cases: above max_cases %lld (raise max_cases, "
                  "up to %d, or shrink the axes)",
                  n_axes ? dims : "no axes", total, n_expl, (long long)maxc, DSV4_SCENARIO_MAX_CASES_LIMIT);
        goto out;
    }
    if (product + n_expl == 0) {
        st = fail(c, DSV4_ERR_FORMAT, root->start_mark, "the scenario defines no cases (give axes or cases)");
        goto out;
    }
    s->product = (size_t)product;
    s->cases = calloc((size_t)(product + n_expl), sizeof *s->cases);
    if (!s->cases) {
        st = nomem(c);
        goto out;
    }

    /* the product, first axis slowest */
    yaml_mark_t axes_mark = t.axes_key ? t.axes_key->start_mark : root->start_mark;
    for (uint64_t p = 0; p < product; p++) {
        *d = *base;
        nb.n = 0;
        sb_str(&nb, s->name);
        for (size_t a = 0; a < n_axes; a++) {
            yaml_node_t *v = get(c, axes[a].seq->data.sequence.items.start[idx[a]]);
            if ((st = apply_axis_value(c, d, &axes[a], v)))
                goto out;
            sb_str(&nb, a ? "," : "/");
            sb_str(&nb, axes[a].name);
            sb_str(&nb, "=");
            label(c, &nb, v, idx[a]);
        }
        if (nb.oom) {
            st = nomem(c);
            goto out;
        }
        bool excluded = false;
        for (size_t e = 0; e < n_excl && !excluded; e++) {
            yaml_node_t *m = get(c, t.exclude->data.sequence.items.start[e]);
            bool match;
            *x = *d;
            if ((st = apply_exclusion(c, x, m, axes, n_axes, idx, &match)))
                goto out;
            excluded = match && draft_equal(x, d);
        }
        if (excluded) {
            s->excluded++;
        } else {
            dsv4_scenario_case *k = &s->cases[s->n_cases++];
            if ((st = finalize(c, d, nb.p, axes_mark, k)))
                goto out;
            int *ai = malloc(n_axes * sizeof *ai + 1);
            if (!ai) {
                st = nomem(c);
                goto out;
            }
            for (size_t a = 0; a < n_axes; a++)
                ai[a] = (int)idx[a];
            k->axis_index = ai;
        }
        for (size_t a = n_axes; a-- > 0;) { /* odometer */
            if (++idx[a] < ITEMS(axes[a].seq))
                break;
            idx[a] = 0;
        }
    }

    /* explicit cases */
    size_t first_expl = s->n_cases;
    for (size_t i = 0; i < n_expl; i++) {
        yaml_node_t *m = get(c, t.cases->data.sequence.items.start[i]);
        char what[48];
        snprintf(what, sizeof what, "cases[%zu]", i);
        if ((st = want(c, m, YAML_MAPPING_NODE, what)))
            goto out;
        *d = *base;
        d->has_name = false;
        if ((st = apply_map(c, d, m, what, true)))
            goto out;
        nb.n = 0;
        sb_str(&nb, s->name);
        sb_str(&nb, "/");
        if (d->has_name) {
            sb_str(&nb, d->name);
        } else {
            char num[40];
            snprintf(num, sizeof num, "case%zu", i);
            sb_str(&nb, num);
        }
        if (nb.oom) {
            st = nomem(c);
            goto out;
        }
        for (size_t j = first_expl; j < s->n_cases; j++)
            if (!strcmp(s->cases[j].name, nb.p)) {
                st = fail(c, DSV4_ERR_FORMAT, m->start_mark, "%s: duplicate case name '%s' (also at line %d)", what,
                          nb.p, s->cases[j].line);
                goto out;
            }
        dsv4_scenario_case *k = &s->cases[s->n_cases++];
        if ((st = finalize(c, d, nb.p, m->start_mark, k)))
            goto out;
        k->explicit_index = (int)i;
    }
    st = DSV4_OK;
out:
    free(nb.p);
    free(idx);
    free(base);
    free(d);
    free(x);
    return st;
}

static void mark_of_offset(const char *text, size_t len, size_t off, yaml_mark_t *m)
{
    m->line = m->column = 0;
    for (size_t i = 0; i < off && i < len; i++) {
        if (text[i] == '\n') {
            m->line++;
            m->column = 0;
        } else {
            m->column++;
        }
    }
}

static dsv4_status load_text(const char *text, size_t len, const char *file, dsv4_scenario **out, dsv4_error *err)
{
    ctx c = {file, text, len, NULL, err};
    yaml_parser_t parser;
    yaml_document_t doc, doc2;
    dsv4_status st;
    if (!yaml_parser_initialize(&parser))
        return nomem(&c);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        yaml_mark_t m = parser.problem_mark;
        if (parser.error == YAML_READER_ERROR)
            mark_of_offset(text, len, parser.problem_offset, &m);
        if (parser.error == YAML_MEMORY_ERROR)
            st = nomem(&c);
        else if (parser.context)
            st = fail(&c, DSV4_ERR_FORMAT, m, "YAML syntax error: %s (%s at line %zu, column %zu)",
                      parser.problem ? parser.problem : "malformed", parser.context, parser.context_mark.line + 1,
                      parser.context_mark.column + 1);
        else
            st = fail(&c, DSV4_ERR_FORMAT, m, "YAML syntax error: %s", parser.problem ? parser.problem : "malformed");
        yaml_parser_delete(&parser);
        return st;
    }
    c.doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
        yaml_mark_t m = {0, 0, 0};
        st = fail(&c, DSV4_ERR_FORMAT, m, "empty scenario file (expected a mapping with name, defaults, axes, ...)");
        goto done_doc;
    }
    /* one document only */
    if (!yaml_parser_load(&parser, &doc2)) {
        yaml_mark_t m = parser.problem_mark;
        if (parser.error == YAML_READER_ERROR)
            mark_of_offset(text, len, parser.problem_offset, &m);
        st = fail(&c, DSV4_ERR_FORMAT, m, "YAML syntax error: %s", parser.problem ? parser.problem : "malformed");
        goto done_doc;
    }
    if (yaml_document_get_root_node(&doc2)) {
        yaml_mark_t m = doc2.start_mark;
        yaml_document_delete(&doc2);
        st = fail(&c, DSV4_ERR_FORMAT, m, "a scenario file holds one YAML document; this is a second one");
        goto done_doc;
    }
    yaml_document_delete(&doc2);

    /* alias bombs and cycles, before anything walks the tree */
    size_t n_nodes = (size_t)(doc.nodes.top - doc.nodes.start);
    walk w = {calloc(n_nodes, 1), calloc(n_nodes, sizeof(uint64_t))};
    uint64_t total;
    if (!w.color || !w.size)
        st = nomem(&c);
    else
        st = expand_check(&c, &w, 1, 0, &total);
    free(w.color);
    free(w.size);
    if (st)
        goto done_doc;

    dsv4_scenario *s = calloc(1, sizeof *s);
    if (!s || !(s->path = xstrdup(file))) {
        free(s);
        st = nomem(&c);
        goto done_doc;
    }
    if ((st = expand(&c, root, s))) {
        dsv4_scenario_free(s);
        goto done_doc;
    }
    *out = s;
    if (err)
        dsv4_error_clear(err);
done_doc:
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return st;
}

dsv4_status dsv4_scenario_load_string(const char *text, const char *name_for_errors, dsv4_scenario **out,
                                      dsv4_error *err)
{
    if (out)
        *out = NULL;
    if (!text || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "scenario", "text and out must not be NULL");
    return load_text(text, strlen(text), name_for_errors ? name_for_errors : "<string>", out, err);
}

dsv4_status dsv4_scenario_load(const char *path, dsv4_scenario **out, dsv4_error *err)
{
    if (out)
        *out = NULL;
    if (!path || !out)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "scenario", "path and out must not be NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return dsv4_seterr(err, DSV4_ERR_IO, path, "cannot open: %s", strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    dsv4_status st = DSV4_OK;
    while (buf) {
        if (n == cap) {
            if (cap >= MAX_FILE_BYTES) {
                st = dsv4_seterr(err, DSV4_ERR_FORMAT, path, "larger than %u bytes, the limit of a scenario file",
                                 MAX_FILE_BYTES);
                break;
            }
            char *q = realloc(buf, cap * 2);
            if (!q) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = q;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f))
                st = dsv4_seterr(err, DSV4_ERR_IO, path, "read failed");
            break;
        }
    }
    fclose(f);
    if (!buf)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    if (!st)
        st = load_text(buf, n, path, out, err);
    free(buf);
    return st;
}
