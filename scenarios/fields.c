/*
 * The case fields of a scenario file (docs/scenarios.md): each key of a case, the defaults, an
 * axis value or an exclusion applied to the case's draft, with its checks, and the draft resolved
 * into a config. Loading and expansion are scenarios/parse.c.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "dsv4moe/ref.h"
#include "dsv4moe_harness/scenario.h"
#include "core/err.h"

#include "scenarios/parse_int.h"

/* ---------------- scalars ---------------- */

dsv4_status dsv4_sp_get_int(ctx *c, const yaml_node_t *n, const char *what, int64_t lo, int64_t hi, int64_t *out)
{
    char b[80];
    if (n->type != YAML_SCALAR_NODE || dsv4_sp_is_null(n))
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected an integer, got %s", what, dsv4_sp_type_name(n));
    const char *s = sval(n);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno == ERANGE || s[0] == ' ')
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected an integer, got '%s'", what, dsv4_sp_shown(n, b, sizeof b));
    if (v < lo || v > hi)
        return dsv4_sp_fail(c, DSV4_ERR_CONFIG, n->start_mark, "%s: %lld is outside [%lld, %lld]", what, v, (long long)lo,
                    (long long)hi);
    *out = v;
    return DSV4_OK;
}

static dsv4_status get_num(ctx *c, const yaml_node_t *n, const char *what, double lo, double hi, double *out)
{
    char b[80];
    if (n->type != YAML_SCALAR_NODE || dsv4_sp_is_null(n))
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected a number, got %s", what, dsv4_sp_type_name(n));
    const char *s = sval(n);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || !isfinite(v) || s[0] == ' ')
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected a finite number, got '%s'", what,
                    dsv4_sp_shown(n, b, sizeof b));
    if (v < lo || v > hi)
        return dsv4_sp_fail(c, DSV4_ERR_CONFIG, n->start_mark, "%s: %.9g is outside [%.9g, %.9g]", what, v, lo, hi);
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
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected a boolean (true/false, on/off), got %s%s%s",
                    what, n->type == YAML_SCALAR_NODE ? "'" : "", dsv4_sp_shown(n, b, sizeof b),
                    n->type == YAML_SCALAR_NODE ? "'" : "");
    *out = v == 1;
    return DSV4_OK;
}

static dsv4_status get_enum(ctx *c, const yaml_node_t *n, const char *what, const char *const *names, int *out)
{
    dsv4_status st = dsv4_sp_want(c, n, YAML_SCALAR_NODE, what);
    if (st)
        return st;
    for (int i = 0; names[i]; i++)
        if (!strcmp(sval(n), names[i])) {
            *out = i;
            return DSV4_OK;
        }
    char list[256], b[80];
    dsv4_join_names(list, sizeof list, names);
    return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: unknown value '%s' (one of: %s)", what, dsv4_sp_shown(n, b, sizeof b),
                list);
}

/* ---------------- drafts ---------------- */

static const char *const field_names[] = {"preset", "layer", "config", "topology", "budget",     "tokens", "replay",
                                          "seed",   "checks", "expect", "name",     "checkpoint", "fault",
                                          "pad_to", "params", NULL};
/* The defects of the review in shared/seed/ by finding number (7 is the desync of 3: it names f03). */
const char *const dsv4_sp_review_ids[] = {"f01", "f02", "f03", "f04", "f05", "f06", "f08",
                                         "f09", "f10", "f11", "f12", "f13", "f14", NULL};
static const char *const ckpt_keys[] = {"layout", "shards", "order", NULL};
static const char *const layout_names[] = {"split", "stacked", NULL};
static const char *const order_names[] = {"experts_first", "experts_last", NULL};
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

int dsv4_sp_cfg_key_index(const char *key)
{
    const char *const *k = dsv4_config_keys();
    for (int i = 0; k[i] && i < MAX_CFG_KEYS; i++)
        if (!strcmp(k[i], key))
            return i;
    return -1;
}

int dsv4_sp_list_index(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], s))
            return i;
    return -1;
}

void dsv4_sp_draft_init(draft *d)
{
    memset(d, 0, sizeof *d);
    d->preset = dsv4_config_preset_names()[0];
    for (const char *const *p = dsv4_config_preset_names(); *p; p++)
        if (!strcmp(*p, "mini"))
            d->preset = *p;
    dsv4_topology_init(&d->topo);
    /* A case without topology.backend runs the production CPU backend: the planner's default (ref)
       would compare the reference with itself at world 1. */
    d->topo.backend = DSV4_BACKEND_CPU;
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
    int ki = dsv4_sp_cfg_key_index(key);
    if (ki < 0) {
        char list[640];
        dsv4_join_names(list, sizeof list, dsv4_config_keys());
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, keynode->start_mark, "unknown config key '%s' (allowed: %s)",
                    dsv4_sp_shown(keynode, b, sizeof b), list);
    }
    if (v->type != YAML_SCALAR_NODE || dsv4_sp_is_null(v))
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "%s: expected a scalar value, got %s", what, dsv4_sp_type_name(v));
    const char *s = sval(v);
    int bw = bool_word(s);
    if (bw >= 0)
        s = bw ? "true" : "false";
    if (strlen(s) >= CFG_VALUE_MAX)
        return dsv4_sp_fail(c, DSV4_ERR_CONFIG, v->start_mark, "%s: value longer than %d characters", what,
                    CFG_VALUE_MAX - 1);
    dsv4_config scratch;
    dsv4_error e;
    dsv4_config_init(&scratch);
    dsv4_status st = dsv4_config_set(&scratch, key, s, &e);
    if (st)
        return dsv4_sp_fail(c, st == DSV4_ERR_NOT_FOUND ? DSV4_ERR_FORMAT : DSV4_ERR_CONFIG, v->start_mark, "%s", e.message);
    d->cfg[ki].set = true;
    snprintf(d->cfg[ki].value, sizeof d->cfg[ki].value, "%s", s);
    return DSV4_OK;
}

/* The topology keys (aliases next to each other): the field, how its value is read, the range of
   an integer, the names of an enum (stored as int). */
typedef enum { TF_INT, TF_I64, TF_BOOL, TF_ENUM, TF_BUCKETS } topo_kind;
#define TF(key, field, kind, lo, hi, names) {key, offsetof(dsv4_topology, field), kind, lo, hi, names}
static const struct {
    const char *key;
    size_t off;
    topo_kind kind;
    int64_t lo, hi;
    const char *const *names;
} topo_fields[] = {
    TF("world", world_size, TF_INT, 1, DSV4_SCENARIO_MAX_WORLD, NULL),
    TF("world_size", world_size, TF_INT, 1, DSV4_SCENARIO_MAX_WORLD, NULL),
    TF("tp", tp, TF_INT, INT_MIN, INT_MAX, NULL),
    TF("dp", dp, TF_INT, INT_MIN, INT_MAX, NULL),
    TF("ep", ep, TF_INT, INT_MIN, INT_MAX, NULL),
    TF("role", role, TF_ENUM, 0, 0, role_names),
    TF("backend", backend, TF_ENUM, 0, 0, backend_names),
    TF("sm", sm, TF_INT, INT_MIN, INT_MAX, NULL),
    TF("graph", cuda_graph, TF_BOOL, 0, 0, NULL),
    TF("cuda_graph", cuda_graph, TF_BOOL, 0, 0, NULL),
    TF("buckets", buckets, TF_BUCKETS, 0, 0, NULL),
    TF("max_tokens", max_tokens_per_rank, TF_I64, INT64_MIN, INT64_MAX, NULL),
    TF("max_tokens_per_rank", max_tokens_per_rank, TF_I64, INT64_MIN, INT64_MAX, NULL),
    TF("chunk", chunk_tokens, TF_I64, INT64_MIN, INT64_MAX, NULL),
    TF("chunk_tokens", chunk_tokens, TF_I64, INT64_MIN, INT64_MAX, NULL),
    TF("dispatch", dispatch, TF_ENUM, 0, 0, dispatch_names),
    TF("executor", executor, TF_ENUM, 0, 0, executor_names),
};
#undef TF
#define N_TOPO (sizeof topo_fields / sizeof topo_fields[0])
_Static_assert(sizeof(dsv4_role) == sizeof(int) && sizeof(dsv4_backend_kind) == sizeof(int) &&
                   sizeof(dsv4_dispatch_req) == sizeof(int) && sizeof(dsv4_executor_req) == sizeof(int),
               "the topology's enums are stored as int");

/* topology.buckets: null (none) or a list of at most DSV4_MAX_BUCKETS integers. */
static dsv4_status set_buckets(ctx *c, dsv4_topology *t, const char *what, const yaml_node_t *v)
{
    dsv4_status st;
    if (dsv4_sp_is_null(v)) {
        t->n_buckets = 0;
        return DSV4_OK;
    }
    if ((st = dsv4_sp_want(c, v, YAML_SEQUENCE_NODE, what)))
        return st;
    size_t n = ITEMS(v);
    if (n > DSV4_MAX_BUCKETS)
        return dsv4_sp_fail(c, DSV4_ERR_CONFIG, v->start_mark, "%s: %zu buckets, more than %d", what, n,
                    DSV4_MAX_BUCKETS);
    int64_t tmp[DSV4_MAX_BUCKETS];
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *it = get(c, v->data.sequence.items.start[i]);
        if (!it)
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "%s: broken list", what);
        if ((st = dsv4_sp_get_int(c, it, what, INT64_MIN, INT64_MAX, &tmp[i])))
            return st;
    }
    t->n_buckets = (int)n;
    memset(t->buckets, 0, sizeof t->buckets);
    memcpy(t->buckets, tmp, n * sizeof tmp[0]);
    return DSV4_OK;
}

static dsv4_status set_topo(ctx *c, draft *d, const char *key, const yaml_node_t *keynode, const yaml_node_t *v)
{
    char what[96], b[80];
    snprintf(what, sizeof what, "topology.%.64s", key);
    size_t i = 0;
    while (i < N_TOPO && strcmp(topo_fields[i].key, key))
        i++;
    if (i == N_TOPO) {
        const char *keys[N_TOPO + 1];
        for (size_t k = 0; k < N_TOPO; k++)
            keys[k] = topo_fields[k].key;
        keys[N_TOPO] = NULL;
        char list[400];
        dsv4_join_names(list, sizeof list, keys);
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, keynode->start_mark, "unknown topology key '%s' (allowed: %s)",
                    dsv4_sp_shown(keynode, b, sizeof b), list);
    }
    char *field = (char *)&d->topo + topo_fields[i].off;
    dsv4_status st = DSV4_OK;
    int64_t i64 = 0;
    int e = 0;
    bool bv;
    switch (topo_fields[i].kind) {
    case TF_INT:
        if (!(st = dsv4_sp_get_int(c, v, what, topo_fields[i].lo, topo_fields[i].hi, &i64)))
            memcpy(field, &(int){(int)i64}, sizeof(int));
        break;
    case TF_I64:
        if (!(st = dsv4_sp_get_int(c, v, what, topo_fields[i].lo, topo_fields[i].hi, &i64)))
            memcpy(field, &i64, sizeof i64);
        break;
    case TF_BOOL:
        if (!(st = get_bool(c, v, what, &bv)))
            memcpy(field, &bv, sizeof bv);
        break;
    case TF_ENUM:
        if (!(st = get_enum(c, v, what, topo_fields[i].names, &e)))
            memcpy(field, &e, sizeof e);
        break;
    case TF_BUCKETS:
        st = set_buckets(c, &d->topo, what, v);
        break;
    }
    return st;
}

static dsv4_status set_budget(ctx *c, draft *d, const char *key, const yaml_node_t *keynode, const yaml_node_t *v)
{
    char what[96], b[80];
    snprintf(what, sizeof what, "budget.%.64s", key);
    int ki = dsv4_sp_list_index(budget_keys, key);
    if (ki < 0) {
        char list[256];
        dsv4_join_names(list, sizeof list, budget_keys);
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, keynode->start_mark, "unknown budget key '%s' (allowed: %s)",
                    dsv4_sp_shown(keynode, b, sizeof b), list);
    }
    dsv4_status st;
    uint64_t bytes;
    if (!strcmp(key, "device_bytes") || !strcmp(key, "taken_bytes") || !strcmp(key, "reserve_mb")) {
        int64_t v64;
        if ((st = dsv4_sp_get_int(c, v, what, 0, INT64_MAX, &v64)))
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
    if (v->type == YAML_MAPPING_NODE || dsv4_sp_is_null(v))
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "%s: expected a list of %s (one per rank, or one for all), got %s",
                    what, tokens ? "token counts" : "booleans", dsv4_sp_type_name(v));
    if (v->type == YAML_SEQUENCE_NODE) {
        n = ITEMS(v);
        if (n < 1 || n > DSV4_SCENARIO_MAX_WORLD)
            return dsv4_sp_fail(c, DSV4_ERR_CONFIG, v->start_mark, "%s: %zu entries; give 1 (for all ranks) to %d (one per rank)",
                        what, n, DSV4_SCENARIO_MAX_WORLD);
    }
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *it = v;
        if (v->type == YAML_SEQUENCE_NODE && !(it = get(c, v->data.sequence.items.start[i])))
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "%s: broken list", what);
        if (tokens) {
            int64_t t;
            if ((st = dsv4_sp_get_int(c, it, what, 0, INT64_C(1) << 40, &t)))
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
    if (!dsv4_sp_is_null(v)) {
        if ((st = dsv4_sp_want(c, v, YAML_SEQUENCE_NODE, "checks")))
            return st;
        for (size_t i = 0; i < ITEMS(v); i++) {
            yaml_node_t *it = get(c, v->data.sequence.items.start[i]);
            int e;
            if (!it)
                return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "checks: broken list");
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
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "expect: expected 'pass' or a mapping {refused: REGEX}, got %s%s%s",
                    v->type == YAML_SCALAR_NODE ? "'" : "", dsv4_sp_shown(v, b, sizeof b), v->type == YAML_SCALAR_NODE ? "'" : "");
    if ((st = dsv4_sp_check_mapping(c, v, "expect")))
        return st;
    if (PAIRS(v) != 1 || strcmp(sval(get(c, v->data.mapping.pairs.start[0].key)), "refused")) {
        yaml_node_t *k = PAIRS(v) ? get(c, v->data.mapping.pairs.start[PAIRS(v) > 1].key) : NULL;
        if (k && PAIRS(v) == 1)
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, k->start_mark, "unknown expect key '%s' (allowed: refused)",
                        dsv4_sp_shown(k, b, sizeof b));
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, k ? k->start_mark : v->start_mark,
                    "expect: expected exactly one key, refused: REGEX");
    }
    yaml_node_t *r = get(c, v->data.mapping.pairs.start[0].value);
    if (r->type != YAML_SCALAR_NODE || dsv4_sp_is_null(r) || !sval(r)[0])
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, r->start_mark, "expect.refused: expected a non-empty regex string, got %s",
                    dsv4_sp_type_name(r));
    if (strlen(sval(r)) >= REGEX_MAX)
        return dsv4_sp_fail(c, DSV4_ERR_CONFIG, r->start_mark, "expect.refused: regex longer than %d characters",
                    REGEX_MAX - 1);
    regex_t re;
    int rc = regcomp(&re, sval(r), REG_EXTENDED | REG_NOSUB);
    if (rc) {
        char eb[200];
        regerror(rc, &re, eb, sizeof eb);
        regfree(&re);
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, r->start_mark, "expect.refused: bad regex '%s': %s", dsv4_sp_shown(r, b, sizeof b),
                    eb);
    }
    regfree(&re);
    d->expect = DSV4_EXPECT_REFUSED;
    snprintf(d->regex, sizeof d->regex, "%s", sval(r));
    return DSV4_OK;
}

dsv4_status dsv4_sp_apply_map(ctx *c, draft *d, const yaml_node_t *m, const char *what, bool allow_name);

/* checkpoint: {layout: split|stacked, shards: 1..16, order: experts_first|experts_last} */
static dsv4_status set_checkpoint(ctx *c, draft *d, const yaml_node_t *v)
{
    dsv4_status st;
    char b[80], list[128];
    if ((st = dsv4_sp_check_mapping(c, v, "checkpoint")))
        return st;
    for (size_t i = 0; i < PAIRS(v); i++) {
        yaml_node_t *k = get(c, v->data.mapping.pairs.start[i].key);
        yaml_node_t *x = get(c, v->data.mapping.pairs.start[i].value);
        int e;
        int64_t n;
        switch (dsv4_sp_list_index(ckpt_keys, sval(k))) {
        case 0:
            if ((st = get_enum(c, x, "checkpoint.layout", layout_names, &e)))
                return st;
            d->ckpt.layout = e == 0 ? DSV4_LAYOUT_SPLIT : DSV4_LAYOUT_STACKED;
            break;
        case 1:
            if ((st = dsv4_sp_get_int(c, x, "checkpoint.shards", 1, DSV4_SCENARIO_MAX_SHARDS, &n)))
                return st;
            d->ckpt.shards = (int)n;
            break;
        case 2:
            if ((st = get_enum(c, x, "checkpoint.order", order_names, &e)))
                return st;
            d->ckpt.experts_last = e == 1;
            break;
        default:
            dsv4_join_names(list, sizeof list, ckpt_keys);
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, k->start_mark, "unknown checkpoint key '%s' (allowed: %s)",
                        dsv4_sp_shown(k, b, sizeof b), list);
        }
    }
    return DSV4_OK;
}

/* fault: f01 .. f14, the defect of the review this case catches. */
static dsv4_status set_defect(ctx *c, draft *d, const yaml_node_t *v)
{
    dsv4_status st;
    char b[80], list[160];
    if (dsv4_sp_is_null(v)) {
        d->defect = NULL;
        return DSV4_OK;
    }
    if ((st = dsv4_sp_want(c, v, YAML_SCALAR_NODE, "fault")))
        return st;
    int i = dsv4_sp_list_index(dsv4_sp_review_ids, sval(v));
    if (i >= 0) {
        d->defect = dsv4_sp_review_ids[i];
        return DSV4_OK;
    }
    if (!strcmp(sval(v), "f07"))
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark,
                    "fault: findings 3 and 7 are one defect (the plan collective of eager steps only): write fault: f03");
    dsv4_join_names(list, sizeof list, dsv4_sp_review_ids);
    return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "fault: unknown defect '%s' (one of: %s)", dsv4_sp_shown(v, b, sizeof b),
                list);
}

static dsv4_status unknown_field(ctx *c, const yaml_node_t *keynode, bool allow_name)
{
    char b[80], list[640];
    dsv4_join_names(list, sizeof list, dsv4_config_keys());
    return dsv4_sp_fail(c, DSV4_ERR_FORMAT, keynode->start_mark,
                "unknown key '%s' (allowed: preset, layer, config, topology, budget, tokens, replay, seed, checks, "
                "expect, checkpoint, fault, pad_to, params%s; a dotted path config.KEY, topology.KEY or budget.KEY; or a config key: %s)",
                dsv4_sp_shown(keynode, b, sizeof b), allow_name ? ", name" : "", list);
}

/* Is `key` a case field (top-level field, dotted path with a known prefix, or bare config key)? */
bool dsv4_sp_is_field(const char *key)
{
    if (dsv4_sp_list_index(field_names, key) >= 0 || dsv4_sp_cfg_key_index(key) >= 0)
        return true;
    return !strncmp(key, "config.", 7) || !strncmp(key, "topology.", 9) || !strncmp(key, "budget.", 7);
}

/* The setter of one section's keys (set_cfg, set_topo, set_budget). */
typedef dsv4_status section_setter(ctx *c, draft *d, const char *key, const yaml_node_t *keynode, const yaml_node_t *v);

/* Every `key: value` pair of the mapping m (null: none) in order, until the first error: as keys
   of a section (set) or, with set NULL, as fields (dsv4_sp_apply_field). */
static dsv4_status apply_pairs(ctx *c, draft *d, const yaml_node_t *m, const char *what, section_setter *set,
                               bool allow_name)
{
    dsv4_status st;
    if (dsv4_sp_is_null(m))
        return DSV4_OK;
    if ((st = dsv4_sp_check_mapping(c, m, what)))
        return st;
    for (size_t i = 0; i < PAIRS(m); i++) {
        yaml_node_t *k = get(c, m->data.mapping.pairs.start[i].key);
        yaml_node_t *v = get(c, m->data.mapping.pairs.start[i].value);
        if ((st = set ? set(c, d, sval(k), k, v) : dsv4_sp_apply_field(c, d, sval(k), k, v, allow_name)))
            return st;
    }
    return DSV4_OK;
}

/* Applies one field `key: v` (key as written in the file). */
dsv4_status dsv4_sp_apply_field(ctx *c, draft *d, const char *key, const yaml_node_t *keynode, const yaml_node_t *v,
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
    switch (dsv4_sp_list_index(field_names, key)) {
    case 0: { /* preset */
        if ((st = dsv4_sp_want(c, v, YAML_SCALAR_NODE, "preset")))
            return st;
        for (const char *const *p = dsv4_config_preset_names(); *p; p++)
            if (!strcmp(*p, sval(v))) {
                d->preset = *p;
                return DSV4_OK;
            }
        char list[256];
        dsv4_join_names(list, sizeof list, dsv4_config_preset_names());
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "preset: unknown preset '%s' (one of: %s)",
                    dsv4_sp_shown(v, b, sizeof b), list);
    }
    case 1: /* layer */
        return set_cfg(c, d, "layer", keynode, v);
    case 2:
    case 3:
    case 4: /* config, topology, budget */
        return apply_pairs(c, d, v, key, key[0] == 'c' ? set_cfg : key[0] == 't' ? set_topo : set_budget, false);
    case 5:
        return set_ranks(c, d, true, v);
    case 6:
        return set_ranks(c, d, false, v);
    case 7: {
        int64_t s;
        if ((st = dsv4_sp_get_int(c, v, "seed", 0, INT64_MAX, &s)))
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
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, keynode->start_mark,
                        "'name' is only allowed in an explicit case (cases: - {name: ...})");
        if ((st = dsv4_sp_want(c, v, YAML_SCALAR_NODE, "name")))
            return st;
        if (!sval(v)[0] || strlen(sval(v)) >= CASE_NAME_MAX)
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "name: expected 1 to %d characters", CASE_NAME_MAX - 1);
        d->has_name = true;
        snprintf(d->name, sizeof d->name, "%s", sval(v));
        return DSV4_OK;
    case 11:
        return set_checkpoint(c, d, v);
    case 12:
        return set_defect(c, d, v);
    case 13: { /* the export's padded bucket (parse.c checks it against the tokens) */
        int64_t bucket;
        if ((st = dsv4_sp_get_int(c, v, "pad_to", 0, DSV4_REF_MAX_TOKENS, &bucket)))
            return st;
        d->pad_to = bucket;
        d->pad_mark = v->start_mark;
        return DSV4_OK;
    }
    case 14: { /* the backend's params (dsv4_backend_options.params), checked when the backend starts */
        if (dsv4_sp_is_null(v)) {
            d->params[0] = '\0';
            return DSV4_OK;
        }
        if ((st = dsv4_sp_want(c, v, YAML_SCALAR_NODE, "params")))
            return st;
        const char *p = sval(v);
        if (strlen(p) >= PARAMS_MAX)
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "params: longer than %d characters", PARAMS_MAX - 1);
        for (const char *q = p; *q; q++)
            if ((unsigned char)*q < 0x21 || (unsigned char)*q > 0x7E)
                return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark,
                                    "params: '%s' holds a space or control character (a comma-separated list of "
                                    "key=value, e.g. route=one,quant=fold)",
                                    dsv4_sp_shown(v, b, sizeof b));
        snprintf(d->params, sizeof d->params, "%s", p);
        return DSV4_OK;
    }
    default:
        if (dsv4_sp_cfg_key_index(key) >= 0)
            return set_cfg(c, d, key, keynode, v);
        return unknown_field(c, keynode, allow_name);
    }
}

/* A mapping of fields (defaults, an explicit case, a mapping-valued axis value). */
dsv4_status dsv4_sp_apply_map(ctx *c, draft *d, const yaml_node_t *m, const char *what, bool allow_name)
{
    return apply_pairs(c, d, m, what, NULL, allow_name);
}

/* The config of a draft: preset, then the overrides (already checked). */
dsv4_status dsv4_sp_draft_config(const draft *d, dsv4_config *cfg, dsv4_error *e)
{
    dsv4_status st = dsv4_config_preset(d->preset, cfg, e);
    const char *const *keys = dsv4_config_keys();
    for (int i = 0; !st && keys[i] && i < MAX_CFG_KEYS; i++)
        if (d->cfg[i].set)
            st = dsv4_config_set(cfg, keys[i], d->cfg[i].value, e);
    return st;
}

/* Per-rank lists of `size`-byte values as written: equal when they give every rank the same value (a
   list of one holds for every rank). */
static bool ranks_equal(const void *a, int na, const void *b, int nb, size_t size)
{
    if (na != nb && na != 1 && nb != 1)
        return false;
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++)
        if (memcmp((const char *)a + (size_t)(na == 1 ? 0 : i) * size, (const char *)b + (size_t)(nb == 1 ? 0 : i) * size,
                   size))
            return false;
    return true;
}

/* Same resolved case (used by `exclude`: applying the exclusion changes nothing). */
bool dsv4_sp_draft_equal(const draft *a, const draft *b)
{
    if (strcmp(a->preset, b->preset) || a->seed != b->seed || a->checks != b->checks || a->expect != b->expect ||
        a->pad_to != b->pad_to || strcmp(a->regex, b->regex) || strcmp(a->params, b->params))
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
    if (!ranks_equal(a->tokens, a->n_tokens, b->tokens, b->n_tokens, sizeof *a->tokens) ||
        !ranks_equal(a->replay, a->n_replay, b->replay, b->n_replay, sizeof *a->replay))
        return false;
    dsv4_config ca, cb;
    if (dsv4_sp_draft_config(a, &ca, NULL) || dsv4_sp_draft_config(b, &cb, NULL))
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

