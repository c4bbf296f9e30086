/*
 * dsv4moe: scenario files (YAML matrices of cases; the schema is docs/scenarios.md).
 *
 * dsv4_scenario_load() parses one file and expands it into a flat list of
 * cases: the cartesian product of the axes applied over the defaults, minus
 * the exclusions, then the explicit cases. Each case is fully resolved (a
 * config from its preset and overrides, a topology, a budget, per-rank token
 * counts and replay flags, the checks to run and the expectation).
 *
 * Configs are kept even when dsv4_config_validate() rejects them (a runner's
 * refusal check needs them); the verdict is stored per case. Everything the
 * file itself gets wrong (YAML syntax, unknown keys, wrong types, unknown
 * enum names, unparseable config values, token lists of the wrong length, a
 * product above max_cases, alias bombs) is an error of the load, with a
 * message that starts with "file:line:col".
 */
#ifndef DSV4MOE_SCENARIO_H
#define DSV4MOE_SCENARIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dsv4moe/api.h"
#include "dsv4moe/config.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The checks a case asks for (bits of dsv4_scenario_case.checks). */
typedef enum dsv4_check {
    DSV4_CHECK_NUMERICS = 1u << 0,
    DSV4_CHECK_DETERMINISM = 1u << 1,
    DSV4_CHECK_SYMMETRY = 1u << 2,
    DSV4_CHECK_MEMORY = 1u << 3,
    DSV4_CHECK_EMPTY = 1u << 4,
    DSV4_CHECK_CLAMP_EXERCISED = 1u << 5,
    DSV4_CHECK_REFUSAL = 1u << 6
} dsv4_check;

#define DSV4_CHECK_COUNT 7
#define DSV4_CHECK_ALL ((1u << DSV4_CHECK_COUNT) - 1u)

/* Name of one check bit ("numerics", ...), "?" for anything else. */
DSV4_API const char *dsv4_check_name(unsigned check_bit);

typedef enum dsv4_expect {
    DSV4_EXPECT_PASS = 0,   /* the plan is created and every check passes */
    DSV4_EXPECT_REFUSED = 1 /* dsv4_plan_create refuses, its message matching refused_regex */
} dsv4_expect;

/* Largest topology.world a scenario accepts (the planner itself allows fewer). */
#define DSV4_SCENARIO_MAX_WORLD 1024
/* Default and hard upper limit of max_cases. */
#define DSV4_SCENARIO_DEFAULT_MAX_CASES 10000
#define DSV4_SCENARIO_MAX_CASES_LIMIT 1000000
/* Billion-laughs guard: the document with every alias expanded may hold at most this many nodes. */
#define DSV4_SCENARIO_MAX_EXPANDED_NODES 1000000
/* Deepest nesting of collections accepted. */
#define DSV4_SCENARIO_MAX_DEPTH 64

/* Most files a case's checkpoint may be written as. */
#define DSV4_SCENARIO_MAX_SHARDS 16

/*
 * How the backend's copy of a case's layer is stored (key `checkpoint`): the
 * reference always reads the one split-layout file; the backend (and the
 * distributed driver) read this one, so the loader is part of what is tested.
 */
typedef struct dsv4_scenario_checkpoint {
    dsv4_layout layout; /* DSV4_LAYOUT_SPLIT (default) or DSV4_LAYOUT_STACKED (bf16, quantized at load) */
    int shards;         /* 1 (default): one file; n > 1: n files and model.safetensors.index.json */
    bool experts_last;  /* shards > 1: the routed experts' tensors in the last files (default: the first),
                           the router and the shared expert in the other end's file */
} dsv4_scenario_checkpoint;

typedef struct dsv4_scenario_case {
    const char *name;       /* "<file name>/<axis=value,...>" or "<file name>/<case name>" */
    const char *preset;     /* the dsv4_config preset it starts from */
    dsv4_config config;     /* preset + overrides (possibly invalid) */
    dsv4_status config_status; /* dsv4_config_validate(&config) */
    const char *config_error;  /* its message, NULL when config_status is DSV4_OK */
    dsv4_topology topology; /* rank 0; world_size ranks in all */
    dsv4_budget budget;
    int n_ranks;            /* == topology.world_size */
    const int64_t *tokens;  /* [n_ranks] tokens per rank (broadcast from one value when given one) */
    const bool *replay;     /* [n_ranks] graph eligibility per rank */
    uint64_t seed;
    unsigned checks;        /* dsv4_check bits */
    dsv4_expect expect;
    const char *refused_regex; /* POSIX extended regex (expect refused), NULL otherwise */
    int line, col;          /* where the case is defined: the axes key (product) or the case mapping */
    int explicit_index;     /* index in `cases`, or -1 for a case of the axes product */
    const int *axis_index;  /* [n_axes of the scenario] value index per axis (product cases), else NULL */
    dsv4_scenario_checkpoint checkpoint;
    /* What the case is, for people: "<file name>/<axis>: <value>; <axis>: <value>..." with each
       value shown by what it sets (a mapping value by its `label:`, else its pairs as "key value,
       ..."; never ';'); the name itself for explicit cases. Reports and JUnit show it; the name
       stays the case's id (export folders, --filter). */
    const char *title;
    /* `pad_to: B` (export only; 0: none): the case folder also holds its input inside a bucket of B
       rows, the rows past the tokens hostile padding (docs/engines.md, "Padded cases"); B exceeds
       every rank's tokens. */
    int64_t pad_to;
    /* `params: LIST` (NULL: none): the backend's own parameters on every rank
       (dsv4_backend_options.params, e.g. the cuda kernel variants of docs/cuda.md), checked when
       the backend starts: a list it refuses makes the case an error naming the key. Not given to a
       backend standing in for one this build or machine lacks. */
    const char *params;
} dsv4_scenario_case;

typedef struct dsv4_scenario dsv4_scenario;

/*
 * Loads and expands a scenario file. On success *out owns everything;
 * on error *out is NULL, nothing is leaked and err names file:line:col:
 *   DSV4_ERR_IO      the file cannot be read;
 *   DSV4_ERR_FORMAT  YAML syntax, unknown keys, wrong types, unknown names,
 *                    alias bombs or cycles, nesting too deep;
 *   DSV4_ERR_CONFIG  unparseable config values, token/replay lists whose length
 *                    is neither 1 nor world, world out of range, a product above max_cases.
 */
DSV4_API dsv4_status dsv4_scenario_load(const char *path, dsv4_scenario **out, dsv4_error *err);

/* The same from text; `name_for_errors` plays the part of the path (messages, case names). */
DSV4_API dsv4_status dsv4_scenario_load_string(const char *text, const char *name_for_errors, dsv4_scenario **out,
                                               dsv4_error *err);

/* NULL is a no-op. */
DSV4_API void dsv4_scenario_free(dsv4_scenario *scn);

/* The file's `name`. */
DSV4_API const char *dsv4_scenario_name(const dsv4_scenario *scn);
/* The path (or name_for_errors) it was loaded from. */
DSV4_API const char *dsv4_scenario_path(const dsv4_scenario *scn);
DSV4_API size_t dsv4_scenario_count(const dsv4_scenario *scn);
/* NULL when i >= count. */
DSV4_API const dsv4_scenario_case *dsv4_scenario_get(const dsv4_scenario *scn, size_t i);
/* The axes in file order (names as written). */
DSV4_API size_t dsv4_scenario_axis_count(const dsv4_scenario *scn);
DSV4_API const char *dsv4_scenario_axis_name(const dsv4_scenario *scn, size_t axis);
/* Number of values of one axis (0 for an out-of-range axis). */
DSV4_API size_t dsv4_scenario_axis_size(const dsv4_scenario *scn, size_t axis);
/* Size of the product before exclusions, and the number of product cases dropped by `exclude`. */
DSV4_API size_t dsv4_scenario_product_size(const dsv4_scenario *scn);
DSV4_API size_t dsv4_scenario_excluded(const dsv4_scenario *scn);
DSV4_API int dsv4_scenario_max_cases(const dsv4_scenario *scn);

#ifdef __cplusplus
}
#endif
#endif
