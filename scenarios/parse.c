/*
 * Scenario files: YAML (libyaml's document API) -> a flat list of resolved cases.
 * The schema is docs/scenarios.md; the public API is include/dsv4moe_harness/scenario.h.
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

#include "dsv4moe_harness/scenario.h"
#include "core/err.h"
#include "core/strbuf.h"

#include "scenarios/parse_int.h"
#ifdef DSV4_FAULTS
#include "harness/fault_runs.h" /* dsv4_scenario_case_fault: the fault build only */
#endif

/* ---------------- context and errors ---------------- */

dsv4_status dsv4_sp_fail(ctx *c, dsv4_status st, yaml_mark_t m, const char *fmt, ...)
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

dsv4_status dsv4_sp_nomem(ctx *c)
{
    return dsv4_seterr(c->err, DSV4_ERR_NOMEM, c->file, "out of memory");
}

bool dsv4_sp_is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = sval(n);
    return !s[0] || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

const char *dsv4_sp_type_name(const yaml_node_t *n)
{
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    return dsv4_sp_is_null(n) ? "nothing (null)" : "a scalar";
}

/* A printable, shortened copy of a scalar for messages. */
const char *dsv4_sp_shown(const yaml_node_t *n, char *buf, size_t size)
{
    if (n->type != YAML_SCALAR_NODE) {
        snprintf(buf, size, "%s", dsv4_sp_type_name(n));
        return buf;
    }
    size_t j = 0;
    for (const char *s = sval(n); *s && j + 4 < size; s++)
        buf[j++] = (*s >= 32 && *s < 127) ? *s : '?';
    buf[j] = '\0';
    return buf;
}

dsv4_status dsv4_sp_want(ctx *c, const yaml_node_t *n, yaml_node_type_t t, const char *what)
{
    if (n->type == t)
        return DSV4_OK;
    const char *exp = t == YAML_SCALAR_NODE ? "a scalar" : t == YAML_SEQUENCE_NODE ? "a list" : "a mapping";
    return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: expected %s, got %s", what, exp, dsv4_sp_type_name(n));
}


/* Checks a mapping: at most MAX_MAP_PAIRS pairs, scalar keys, no key twice. */
dsv4_status dsv4_sp_check_mapping(ctx *c, const yaml_node_t *n, const char *what)
{
    dsv4_status st = dsv4_sp_want(c, n, YAML_MAPPING_NODE, what);
    if (st)
        return st;
    size_t np = PAIRS(n);
    if (np > MAX_MAP_PAIRS)
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: %zu keys, more than the %d a scenario mapping may hold",
                    what, np, MAX_MAP_PAIRS);
    for (size_t i = 0; i < np; i++) {
        yaml_node_t *k = get(c, n->data.mapping.pairs.start[i].key);
        if (!k || !get(c, n->data.mapping.pairs.start[i].value))
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "%s: broken mapping", what);
        if (k->type != YAML_SCALAR_NODE)
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, k->start_mark, "%s: expected a scalar key, got %s", what, dsv4_sp_type_name(k));
        for (size_t j = 0; j < i; j++) {
            yaml_node_t *k2 = get(c, n->data.mapping.pairs.start[j].key);
            if (!strcmp(sval(k), sval(k2))) {
                char b[80];
                return dsv4_sp_fail(c, DSV4_ERR_FORMAT, k->start_mark, "%s: duplicate key '%s' (first at line %zu)", what,
                            dsv4_sp_shown(k, b, sizeof b), k2->start_mark.line + 1);
            }
        }
    }
    return DSV4_OK;
}


/* ---------------- the scenario ---------------- */

struct dsv4_scenario {
    char *name, *path;
    size_t n_axes;
    char **axis_names;
    size_t *axis_sizes;
    size_t n_cases;
    dsv4_scenario_case *cases;
    /* [n_cases] each case's `fault` key ("f01".."f14", static) or NULL: data for the fault build's
       runs (harness/fault_runs.h, dsv4_scenario_case_fault); the release library only checks it. */
    const char **fault;
    size_t product, excluded;
    int max_cases;
};

static void case_free(dsv4_scenario_case *k)
{
    free((void *)k->name);
    free((void *)k->title);
    free((void *)k->config_error);
    free((void *)k->tokens);
    free((void *)k->replay);
    free((void *)k->refused_regex);
    free((void *)k->params);
    free((void *)k->axis_index);
}

void dsv4_scenario_free(dsv4_scenario *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_cases; i++)
        case_free(&s->cases[i]);
    free(s->cases);
    free(s->fault);
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
#ifdef DSV4_FAULTS
const char *dsv4_scenario_case_fault(const dsv4_scenario *s, size_t i)
{
    return s && i < s->n_cases ? s->fault[i] : NULL;
}
#endif

/* Resolves a draft into case k (k is zeroed; on error the caller frees what k holds) and its `fault`
   key into *fault. */
static dsv4_status finalize(ctx *c, const draft *d, const char *name, yaml_mark_t where, dsv4_scenario_case *k,
                            const char **fault)
{
    int w = d->topo.world_size;
    if (d->n_tokens != 1 && d->n_tokens != w)
        return dsv4_sp_fail(c, DSV4_ERR_CONFIG, d->tokens_mark,
                    "case %s: tokens has %d entries but topology.world is %d: give one count for all ranks or one per "
                    "rank",
                    name, d->n_tokens, w);
    if (d->n_replay != 1 && d->n_replay != w)
        return dsv4_sp_fail(c, DSV4_ERR_CONFIG, d->replay_mark,
                    "case %s: replay has %d entries but topology.world is %d: give one flag for all ranks or one per "
                    "rank",
                    name, d->n_replay, w);
    int li = dsv4_sp_cfg_key_index("layer");
    if (li < 0 || !d->cfg[li].set)
        return dsv4_sp_fail(c, DSV4_ERR_CONFIG, where,
                    "case %s: layer is not set (give defaults.layer, a layer axis, or layer in the case)", name);
    dsv4_error e;
    dsv4_status st = dsv4_sp_draft_config(d, &k->config, &e);
    if (st)
        return dsv4_sp_fail(c, st, where, "case %s: %s", name, e.message);
    k->config_status = dsv4_config_validate(&k->config, &e);
    if (k->config_status && !(k->config_error = strdup(e.message)))
        return dsv4_sp_nomem(c);
    k->preset = d->preset;
    k->topology = d->topo;
    k->topology.rank = 0;
    k->budget = d->budget;
    k->n_ranks = w;
    int64_t *tk = malloc((size_t)w * sizeof *tk);
    bool *rp = malloc((size_t)w * sizeof *rp);
    k->tokens = tk;
    k->replay = rp;
    if (!tk || !rp || !(k->name = strdup(name)))
        return dsv4_sp_nomem(c);
    for (int i = 0; i < w; i++) {
        tk[i] = d->tokens[d->n_tokens == 1 ? 0 : i];
        rp[i] = d->replay[d->n_replay == 1 ? 0 : i];
    }
    k->seed = d->seed;
    for (int i = 0; i < w && d->pad_to; i++)
        if (d->pad_to <= tk[i])
            return dsv4_sp_fail(c, DSV4_ERR_CONFIG, d->pad_mark,
                                "case %s: pad_to %lld must exceed the tokens of every rank (rank %d has %lld): the "
                                "bucket holds the tokens and at least one padding row",
                                name, (long long)d->pad_to, i, (long long)tk[i]);
    k->pad_to = d->pad_to;
    *fault = d->defect;
    k->checkpoint = d->ckpt;
    k->checks = d->checks;
    k->expect = d->expect;
    if (d->expect == DSV4_EXPECT_REFUSED && !(k->refused_regex = strdup(d->regex)))
        return dsv4_sp_nomem(c);
    if (d->params[0] && !(k->params = strdup(d->params)))
        return dsv4_sp_nomem(c);
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
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark,
                    "alias cycle: this anchored collection contains an alias of itself");
    if (depth > DSV4_SCENARIO_MAX_DEPTH)
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark, "nesting deeper than %d levels", DSV4_SCENARIO_MAX_DEPTH);
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
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, n->start_mark,
                    "alias expansion too large: this node expands to more than %d nodes once its aliases are "
                    "expanded (a guard against alias bombs)",
                    DSV4_SCENARIO_MAX_EXPANDED_NODES);
    w->color[i] = 2;
    w->size[i] = total;
    *out = total;
    return DSV4_OK;
}

/* ---------------- names ---------------- */

/* The label of axis value `v` (index `idx`): the scalar, [a,b] for a short list of scalars, else the index. */
static void label(ctx *c, dsv4_strbuf *b, const yaml_node_t *v, size_t idx)
{
    char num[32];
    snprintf(num, sizeof num, "%zu", idx);
    if (v->type == YAML_SCALAR_NODE) {
        dsv4_sb_str(b, strlen(sval(v)) <= LABEL_MAX ? sval(v) : num);
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
        dsv4_sb_str(b, "[");
        for (size_t i = 0; i < ITEMS(v); i++) {
            if (i)
                dsv4_sb_str(b, ",");
            dsv4_sb_str(b, sval(get(c, v->data.sequence.items.start[i])));
        }
        dsv4_sb_str(b, "]");
        return;
    }
index:
    dsv4_sb_str(b, num);
}

/* Text of a title, with ';' (the title's separator of axes) shown as ','. */
static void title_text(dsv4_strbuf *b, const char *s)
{
    for (; *s; s++)
        dsv4_sb_printf(b, "%c", *s == ';' ? ',' : *s);
}

/* An axis value by what it sets: a scalar as written; a list as [a,b]; a mapping by its `label:`,
   else "key value" for each pair (nested mappings flattened), joined by ", ". */
static void title_value(ctx *c, dsv4_strbuf *b, const yaml_node_t *v, int depth)
{
    if (!v || depth > 4) {
        dsv4_sb_str(b, "...");
        return;
    }
    if (v->type == YAML_SCALAR_NODE) {
        title_text(b, sval(v));
        return;
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        dsv4_sb_str(b, "[");
        for (size_t i = 0; i < ITEMS(v); i++) {
            if (i)
                dsv4_sb_str(b, ",");
            title_value(c, b, get(c, v->data.sequence.items.start[i]), depth + 1);
        }
        dsv4_sb_str(b, "]");
        return;
    }
    if (PAIRS(v) == 0) {
        dsv4_sb_str(b, "defaults");
        return;
    }
    for (size_t i = 0; i < PAIRS(v); i++) {
        yaml_node_t *k = get(c, v->data.mapping.pairs.start[i].key);
        if (depth == 0 && k && !strcmp(sval(k), "label")) {
            title_value(c, b, get(c, v->data.mapping.pairs.start[i].value), depth + 1);
            return;
        }
    }
    for (size_t i = 0; i < PAIRS(v); i++) {
        yaml_node_t *k = get(c, v->data.mapping.pairs.start[i].key), *x = get(c, v->data.mapping.pairs.start[i].value);
        if (i)
            dsv4_sb_str(b, ", ");
        if (x && x->type == YAML_MAPPING_NODE) {
            title_value(c, b, x, depth + 1);
            continue;
        }
        title_text(b, k ? sval(k) : "?");
        dsv4_sb_str(b, " ");
        title_value(c, b, x, depth + 1);
    }
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

/* An axis value's `label:` (how reports show the value; it sets nothing): a string of 1 to LABEL_TEXT_MAX
   characters. */
static dsv4_status check_label(ctx *c, const yaml_node_t *x, const char *what)
{
    dsv4_status st = dsv4_sp_want(c, x, YAML_SCALAR_NODE, "label");
    size_t n = st ? 0 : strlen(sval(x));
    if (!st && (n == 0 || n > LABEL_TEXT_MAX))
        st = dsv4_sp_fail(c, DSV4_ERR_FORMAT, x->start_mark, "%s: label: expected 1 to %d characters", what,
                          LABEL_TEXT_MAX);
    return st;
}

/* One axis value. A mapping value may carry a `label:`: on a merged axis beside its fields, on the
   config, topology and budget axes beside their keys (applied as config.KEY and so on). */
static dsv4_status apply_axis_value(ctx *c, draft *d, const axis *a, const yaml_node_t *v)
{
    bool section = !strcmp(a->name, "config") || !strcmp(a->name, "topology") || !strcmp(a->name, "budget");
    if (!a->merge && !(section && v->type == YAML_MAPPING_NODE))
        return dsv4_sp_apply_field(c, d, a->name, a->key, v, false);
    char what[96];
    snprintf(what, sizeof what, "axis '%.64s' value", a->name);
    dsv4_status st;
    if (dsv4_sp_is_null(v))
        return DSV4_OK;
    if ((st = dsv4_sp_check_mapping(c, v, what)))
        return st;
    for (size_t i = 0; i < PAIRS(v); i++) {
        yaml_node_t *k = get(c, v->data.mapping.pairs.start[i].key), *x = get(c, v->data.mapping.pairs.start[i].value);
        char path[160];
        if (!strcmp(sval(k), "label"))
            st = check_label(c, x, what);
        else if (section && (size_t)snprintf(path, sizeof path, "%s.%s", a->name, sval(k)) < sizeof path)
            st = dsv4_sp_apply_field(c, d, path, k, x, false);
        else
            st = dsv4_sp_apply_field(c, d, sval(k), k, x, false);
        if (st)
            return st;
    }
    return DSV4_OK;
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
                if ((st = dsv4_sp_apply_map(c, d, v, "exclude", false)))
                    return st;
                continue;
            }
            int64_t want_idx;
            char what[160];
            snprintf(what, sizeof what, "exclude: axis '%.64s' (an index into its values, or a mapping)", axes[a].name);
            if ((st = dsv4_sp_get_int(c, v, what, 0, (int64_t)ITEMS(axes[a].seq) - 1, &want_idx)))
                return st;
            if (idx && idx[a] != (size_t)want_idx)
                *match = false;
            continue;
        }
        if ((st = dsv4_sp_apply_field(c, d, sval(k), k, v, false)))
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
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, root->start_mark, "a scenario file is a mapping (name, defaults, axes, ...), got %s",
                    dsv4_sp_type_name(root));
    if ((st = dsv4_sp_check_mapping(c, root, "scenario")))
        return st;
    for (size_t i = 0; i < PAIRS(root); i++) {
        yaml_node_t *k = get(c, root->data.mapping.pairs.start[i].key);
        yaml_node_t *v = get(c, root->data.mapping.pairs.start[i].value);
        char b[80], list[200];
        switch (dsv4_sp_list_index(keys, sval(k))) {
        case 0:
            if ((st = dsv4_sp_want(c, v, YAML_SCALAR_NODE, "name")))
                return st;
            if (!sval(v)[0] || dsv4_sp_is_null(v) || strlen(sval(v)) >= CASE_NAME_MAX)
                return dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark, "name: expected 1 to %d characters", CASE_NAME_MAX - 1);
            t->name = v;
            break;
        case 1:
            if ((st = dsv4_sp_want(c, v, YAML_SCALAR_NODE, "description")))
                return st;
            break;
        case 2:
            if (!dsv4_sp_is_null(v) && (st = dsv4_sp_check_mapping(c, v, "defaults")))
                return st;
            t->defaults = v;
            break;
        case 3:
            if (!dsv4_sp_is_null(v) && (st = dsv4_sp_check_mapping(c, v, "axes")))
                return st;
            t->axes = v;
            t->axes_key = k;
            break;
        case 4:
            if (!dsv4_sp_is_null(v) && (st = dsv4_sp_want(c, v, YAML_SEQUENCE_NODE, "cases")))
                return st;
            t->cases = v;
            break;
        case 5:
            if (!dsv4_sp_is_null(v) && (st = dsv4_sp_want(c, v, YAML_SEQUENCE_NODE, "exclude")))
                return st;
            t->exclude = v;
            break;
        case 6:
            t->max_cases = v;
            break;
        case 7:
            /* The defects' test hooks (scenarios/seed-review.yaml), read by the fault build's runs
               (harness/fault_runs.c); here only the defect ids are checked. */
            if ((st = dsv4_sp_check_mapping(c, v, "faults")))
                return st;
            for (size_t f = 0; f < PAIRS(v); f++) {
                yaml_node_t *fk = get(c, v->data.mapping.pairs.start[f].key);
                if (dsv4_sp_list_index(dsv4_sp_review_ids, sval(fk)) < 0) {
                    dsv4_join_names(list, sizeof list, dsv4_sp_review_ids);
                    return dsv4_sp_fail(c, DSV4_ERR_FORMAT, fk->start_mark, "faults: unknown defect '%s' (one of: %s)",
                                dsv4_sp_shown(fk, b, sizeof b), list);
                }
            }
            break;
        default:
            dsv4_join_names(list, sizeof list, keys);
            return dsv4_sp_fail(c, DSV4_ERR_FORMAT, k->start_mark, "unknown key '%s' (allowed: %s)", dsv4_sp_shown(k, b, sizeof b),
                        list);
        }
    }
    if (!t->name)
        return dsv4_sp_fail(c, DSV4_ERR_FORMAT, root->start_mark, "the scenario has no 'name' (required)");
    return DSV4_OK;
}

static dsv4_status expand(ctx *c, yaml_node_t *root, dsv4_scenario *s)
{
    dsv4_status st;
    top t;
    if ((st = read_top(c, root, &t)))
        return st;
    if (!(s->name = strdup(sval(t.name))))
        return dsv4_sp_nomem(c);

    int64_t maxc = DSV4_SCENARIO_DEFAULT_MAX_CASES;
    if (t.max_cases && (st = dsv4_sp_get_int(c, t.max_cases, "max_cases", 1, DSV4_SCENARIO_MAX_CASES_LIMIT, &maxc)))
        return st;
    s->max_cases = (int)maxc;

    /* defaults */
    draft *base = malloc(sizeof *base), *d = malloc(sizeof *d), *x = malloc(sizeof *x);
    axis axes[MAX_AXES];
    size_t n_axes = 0, *idx = NULL;
    dsv4_strbuf nb = {0}, tb = {0}; /* a case's name, its title */
    if (!base || !d || !x) {
        st = dsv4_sp_nomem(c);
        goto out;
    }
    dsv4_sp_draft_init(base);
    if (t.defaults && (st = dsv4_sp_apply_map(c, base, t.defaults, "defaults", false)))
        goto out;

    /* axes: kinds, then every value applied once to catch its errors where it is written */
    bool have_axes = t.axes && !dsv4_sp_is_null(t.axes);
    if (have_axes) {
        if (PAIRS(t.axes) > MAX_AXES) {
            st = dsv4_sp_fail(c, DSV4_ERR_FORMAT, t.axes->start_mark, "axes: %zu axes, more than %d", PAIRS(t.axes), MAX_AXES);
            goto out;
        }
        for (size_t i = 0; i < PAIRS(t.axes); i++) {
            axis *a = &axes[n_axes];
            a->key = get(c, t.axes->data.mapping.pairs.start[i].key);
            a->seq = get(c, t.axes->data.mapping.pairs.start[i].value);
            a->name = sval(a->key);
            a->merge = !dsv4_sp_is_field(a->name);
            char what[96];
            snprintf(what, sizeof what, "axis '%.64s'", a->name);
            if (!strcmp(a->name, "name")) {
                st = dsv4_sp_fail(c, DSV4_ERR_FORMAT, a->key->start_mark, "'name' cannot be an axis (case names are generated)");
                goto out;
            }
            if ((st = dsv4_sp_want(c, a->seq, YAML_SEQUENCE_NODE, what)))
                goto out;
            if (ITEMS(a->seq) == 0) {
                st = dsv4_sp_fail(c, DSV4_ERR_FORMAT, a->seq->start_mark, "%s: an axis needs at least one value", what);
                goto out;
            }
            for (size_t j = 0; j < ITEMS(a->seq); j++) {
                yaml_node_t *v = get(c, a->seq->data.sequence.items.start[j]);
                if (a->merge && v->type != YAML_MAPPING_NODE) {
                    char b[80];
                    st = dsv4_sp_fail(c, DSV4_ERR_FORMAT, v->start_mark,
                              "axis '%s' is not a case field (preset, layer, config, topology, budget, tokens, "
                              "replay, seed, checks, expect, a dotted path config.KEY/topology.KEY/budget.KEY, or a "
                              "config key), so each of its values must be a mapping to merge into the case; got %s",
                              dsv4_sp_shown(a->key, b, sizeof b), dsv4_sp_type_name(v));
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
            st = dsv4_sp_nomem(c);
            goto out;
        }
        for (size_t a = 0; a < n_axes; a++) {
            s->axis_sizes[a] = ITEMS(axes[a].seq);
            if (!(s->axis_names[a] = strdup(axes[a].name))) {
                st = dsv4_sp_nomem(c);
                goto out;
            }
        }
    }

    /* exclusions: shape and values checked once */
    size_t n_excl = t.exclude && !dsv4_sp_is_null(t.exclude) ? ITEMS(t.exclude) : 0;
    for (size_t e = 0; e < n_excl; e++) {
        yaml_node_t *m = get(c, t.exclude->data.sequence.items.start[e]);
        bool match;
        if ((st = dsv4_sp_check_mapping(c, m, "exclude entry")))
            goto out;
        if (PAIRS(m) == 0) {
            st = dsv4_sp_fail(c, DSV4_ERR_FORMAT, m->start_mark, "exclude entry: empty (it would drop every case)");
            goto out;
        }
        *d = *base;
        if ((st = apply_exclusion(c, d, m, axes, n_axes, NULL, &match)))
            goto out;
    }

    /* the size, refused above max_cases before anything per case is allocated */
    size_t n_expl = t.cases && !dsv4_sp_is_null(t.cases) ? ITEMS(t.cases) : 0;
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
        st = dsv4_sp_fail(c, DSV4_ERR_CONFIG, t.max_cases ? t.max_cases->start_mark : t.axes_key ? t.axes_key->start_mark
                                                                                         : root->start_mark,
                  "the axes product (%s) is %s cases, plus %zu explicit cases: above max_cases %lld (raise max_cases, "
                  "up to %d, or shrink the axes)",
                  n_axes ? dims : "no axes", total, n_expl, (long long)maxc, DSV4_SCENARIO_MAX_CASES_LIMIT);
        goto out;
    }
    if (product + n_expl == 0) {
        st = dsv4_sp_fail(c, DSV4_ERR_FORMAT, root->start_mark, "the scenario defines no cases (give axes or cases)");
        goto out;
    }
    s->product = (size_t)product;
    s->cases = calloc((size_t)(product + n_expl), sizeof *s->cases);
    s->fault = calloc((size_t)(product + n_expl), sizeof *s->fault);
    if (!s->cases || !s->fault) {
        st = dsv4_sp_nomem(c);
        goto out;
    }

    /* the product, first axis slowest */
    yaml_mark_t axes_mark = t.axes_key ? t.axes_key->start_mark : root->start_mark;
    for (uint64_t p = 0; p < product; p++) {
        *d = *base;
        nb.n = 0;
        tb.n = 0;
        dsv4_sb_str(&nb, s->name);
        dsv4_sb_str(&tb, s->name);
        for (size_t a = 0; a < n_axes; a++) {
            yaml_node_t *v = get(c, axes[a].seq->data.sequence.items.start[idx[a]]);
            if ((st = apply_axis_value(c, d, &axes[a], v)))
                goto out;
            dsv4_sb_str(&nb, a ? "," : "/");
            dsv4_sb_str(&nb, axes[a].name);
            dsv4_sb_str(&nb, "=");
            label(c, &nb, v, idx[a]);
            dsv4_sb_str(&tb, a ? "; " : "/");
            title_text(&tb, axes[a].name);
            dsv4_sb_str(&tb, ": ");
            title_value(c, &tb, v, 0);
        }
        if (nb.oom || tb.oom) {
            st = dsv4_sp_nomem(c);
            goto out;
        }
        bool excluded = false;
        for (size_t e = 0; e < n_excl && !excluded; e++) {
            yaml_node_t *m = get(c, t.exclude->data.sequence.items.start[e]);
            bool match;
            *x = *d;
            if ((st = apply_exclusion(c, x, m, axes, n_axes, idx, &match)))
                goto out;
            excluded = match && dsv4_sp_draft_equal(x, d);
        }
        if (excluded) {
            s->excluded++;
        } else {
            dsv4_scenario_case *k = &s->cases[s->n_cases++];
            if ((st = finalize(c, d, nb.s, axes_mark, k, &s->fault[k - s->cases])))
                goto out;
            if (!(k->title = strdup(tb.s))) {
                st = dsv4_sp_nomem(c);
                goto out;
            }
            int *ai = malloc(n_axes * sizeof *ai + 1);
            if (!ai) {
                st = dsv4_sp_nomem(c);
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
        if ((st = dsv4_sp_want(c, m, YAML_MAPPING_NODE, what)))
            goto out;
        *d = *base;
        d->has_name = false;
        if ((st = dsv4_sp_apply_map(c, d, m, what, true)))
            goto out;
        nb.n = 0;
        dsv4_sb_str(&nb, s->name);
        dsv4_sb_str(&nb, "/");
        if (d->has_name) {
            dsv4_sb_str(&nb, d->name);
        } else {
            char num[40];
            snprintf(num, sizeof num, "case%zu", i);
            dsv4_sb_str(&nb, num);
        }
        if (nb.oom) {
            st = dsv4_sp_nomem(c);
            goto out;
        }
        for (size_t j = first_expl; j < s->n_cases; j++)
            if (!strcmp(s->cases[j].name, nb.s)) {
                st = dsv4_sp_fail(c, DSV4_ERR_FORMAT, m->start_mark, "%s: duplicate case name '%s' (also at line %d)", what,
                          nb.s, s->cases[j].line);
                goto out;
            }
        dsv4_scenario_case *k = &s->cases[s->n_cases++];
        if ((st = finalize(c, d, nb.s, m->start_mark, k, &s->fault[k - s->cases])))
            goto out;
        k->explicit_index = (int)i;
        if (!(k->title = strdup(nb.s))) {
            st = dsv4_sp_nomem(c);
            goto out;
        }
    }
    st = DSV4_OK;
out:
    free(nb.s);
    free(tb.s);
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
        return dsv4_sp_nomem(&c);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        yaml_mark_t m = parser.problem_mark;
        if (parser.error == YAML_READER_ERROR)
            mark_of_offset(text, len, parser.problem_offset, &m);
        if (parser.error == YAML_MEMORY_ERROR)
            st = dsv4_sp_nomem(&c);
        else if (parser.context)
            st = dsv4_sp_fail(&c, DSV4_ERR_FORMAT, m, "YAML syntax error: %s (%s at line %zu, column %zu)",
                      parser.problem ? parser.problem : "malformed", parser.context, parser.context_mark.line + 1,
                      parser.context_mark.column + 1);
        else
            st = dsv4_sp_fail(&c, DSV4_ERR_FORMAT, m, "YAML syntax error: %s", parser.problem ? parser.problem : "malformed");
        yaml_parser_delete(&parser);
        return st;
    }
    c.doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
        yaml_mark_t m = {0, 0, 0};
        st = dsv4_sp_fail(&c, DSV4_ERR_FORMAT, m, "empty scenario file (expected a mapping with name, defaults, axes, ...)");
        goto done_doc;
    }
    /* one document only */
    if (!yaml_parser_load(&parser, &doc2)) {
        yaml_mark_t m = parser.problem_mark;
        if (parser.error == YAML_READER_ERROR)
            mark_of_offset(text, len, parser.problem_offset, &m);
        st = dsv4_sp_fail(&c, DSV4_ERR_FORMAT, m, "YAML syntax error: %s", parser.problem ? parser.problem : "malformed");
        goto done_doc;
    }
    if (yaml_document_get_root_node(&doc2)) {
        yaml_mark_t m = doc2.start_mark;
        yaml_document_delete(&doc2);
        st = dsv4_sp_fail(&c, DSV4_ERR_FORMAT, m, "a scenario file holds one YAML document; this is a second one");
        goto done_doc;
    }
    yaml_document_delete(&doc2);

    /* alias bombs and cycles, before anything walks the tree */
    size_t n_nodes = (size_t)(doc.nodes.top - doc.nodes.start);
    walk w = {calloc(n_nodes, 1), calloc(n_nodes, sizeof(uint64_t))};
    uint64_t total;
    if (!w.color || !w.size)
        st = dsv4_sp_nomem(&c);
    else
        st = expand_check(&c, &w, 1, 0, &total);
    free(w.color);
    free(w.size);
    if (st)
        goto done_doc;

    dsv4_scenario *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(file))) {
        free(s);
        st = dsv4_sp_nomem(&c);
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

