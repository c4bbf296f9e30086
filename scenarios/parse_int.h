/*
 * Internal to the scenario parser (scenarios/parse.c: loading, expansion, the scenario;
 * scenarios/fields.c: the case fields and their drafts): the parse context, the draft of a case,
 * the YAML helpers both use. Not an installed header.
 */
#ifndef DSV4MOE_SCENARIOS_PARSE_INT_H
#define DSV4MOE_SCENARIOS_PARSE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "dsv4moe_harness/scenario.h"
#include "core/err.h"
#include "core/strbuf.h" /* dsv4_join_names */

#define MAX_FILE_BYTES (16u << 20)
#define MAX_MAP_PAIRS 256
#define MAX_AXES 64
#define MAX_CFG_KEYS 48
#define CFG_VALUE_MAX 64
#define REGEX_MAX 512
#define CASE_NAME_MAX 128
#define PARAMS_MAX 256 /* a case's backend params, with the terminating NUL */
#define LABEL_MAX 64
/* The most characters of an axis value's `label:` (its text in titles). */
#define LABEL_TEXT_MAX 80

#define PAIRS(n) (size_t)((n)->data.mapping.pairs.top - (n)->data.mapping.pairs.start)
#define ITEMS(n) (size_t)((n)->data.sequence.items.top - (n)->data.sequence.items.start)

/* ---------------- context and errors (parse.c) ---------------- */

typedef struct {
    const char *file; /* name used in messages */
    const char *text;
    size_t len;
    yaml_document_t *doc;
    dsv4_error *err;
} ctx;

/* A DSV4_ERR_* error at FILE:LINE:COL of mark m; returns st. */
dsv4_status dsv4_sp_fail(ctx *c, dsv4_status st, yaml_mark_t m, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
dsv4_status dsv4_sp_nomem(ctx *c);
static inline yaml_node_t *get(ctx *c, int id) { return yaml_document_get_node(c->doc, id); }
static inline const char *sval(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }
bool dsv4_sp_is_null(const yaml_node_t *n);
const char *dsv4_sp_type_name(const yaml_node_t *n);
/* A printable, shortened copy of a scalar for messages. */
const char *dsv4_sp_shown(const yaml_node_t *n, char *buf, size_t size);
/* An error naming `what` unless n is of type t. */
dsv4_status dsv4_sp_want(ctx *c, const yaml_node_t *n, yaml_node_type_t t, const char *what);
/* A mapping of at most MAX_MAP_PAIRS scalar keys. */
dsv4_status dsv4_sp_check_mapping(ctx *c, const yaml_node_t *n, const char *what);

/* ---------------- scalars and drafts (fields.c) ---------------- */

dsv4_status dsv4_sp_get_int(ctx *c, const yaml_node_t *n, const char *what, int64_t lo, int64_t hi, int64_t *out);
/* The index of s in the NULL-terminated names, -1 when absent. */
int dsv4_sp_list_index(const char *const *names, const char *s);
/* The defects of the review by finding number (7 is the desync of 3: it names f03), NULL-terminated. */
extern const char *const dsv4_sp_review_ids[];

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
    int64_t pad_to;        /* 0: none */
    yaml_mark_t pad_mark;
    unsigned checks;
    dsv4_expect expect;
    char regex[REGEX_MAX];
    bool has_name;
    char name[CASE_NAME_MAX];
    const char *defect; /* static, from review_ids; NULL: none */
    dsv4_scenario_checkpoint ckpt;
    char params[PARAMS_MAX]; /* the backend's params ("": its defaults) */
} draft;

void dsv4_sp_draft_init(draft *d);
int dsv4_sp_cfg_key_index(const char *key);
/* Is `key` a case field (top-level field, dotted path with a known prefix, or bare config key)? */
bool dsv4_sp_is_field(const char *key);
dsv4_status dsv4_sp_apply_field(ctx *c, draft *d, const char *key, const yaml_node_t *keynode, const yaml_node_t *v,
                                bool allow_name);
dsv4_status dsv4_sp_apply_map(ctx *c, draft *d, const yaml_node_t *m, const char *what, bool allow_name);
dsv4_status dsv4_sp_draft_config(const draft *d, dsv4_config *cfg, dsv4_error *e);
bool dsv4_sp_draft_equal(const draft *a, const draft *b);

#endif
