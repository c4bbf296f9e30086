/* Scenario files: expansion, names, per-rank lists, and file:line:col errors (docs/scenarios.md). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/plan.h"
#include "dsv4moe_harness/scenario.h"
#include "tests/scenutil.h"

Suite *scenario_suite(void);

static dsv4_scenario *load_ok(const char *text)
{
    dsv4_scenario *s = NULL;
    dsv4_error e;
    dsv4_status st = dsv4_scenario_load_string(text, "t.yaml", &s, &e);
    ck_assert_msg(st == DSV4_OK, "load failed (%d): %s", (int)st, e.message);
    ck_assert_ptr_nonnull(s);
    return s;
}

static const dsv4_scenario_case *by_name(const dsv4_scenario *s, const char *name)
{
    for (size_t i = 0; i < dsv4_scenario_count(s); i++)
        if (!strcmp(dsv4_scenario_get(s, i)->name, name))
            return dsv4_scenario_get(s, i);
    ck_abort_msg("no case named %s", name);
    return NULL;
}

START_TEST(product_with_exclusions_and_names)
{
    dsv4_scenario *s = load_ok("name: m\n"
                               "defaults:\n"
                               "  preset: mini\n"
                               "  layer: 1\n"
                               "axes:\n"
                               "  quant:\n"
                               "    - {routed_format: fp4, shared_format: fp8}\n"
                               "    - {routed_format: bf16, shared_format: bf16, act_quant: none}\n"
                               "  layer: [0, 1]\n"
                               "  topology.ep: [1, 2]\n"
                               "  tokens: [[0], [1], [300]]\n"
                               "exclude:\n"
                               "  - {layer: 0, topology.ep: 2}\n"
                               "  - {quant: 1, tokens: [0]}\n");
    /* 2*2*2*3 = 24; layer 0 & ep 2: 2*3 = 6; quant 1 & tokens [0]: 2*2 = 4, overlapping 1 -> 15 kept */
    ck_assert_uint_eq(dsv4_scenario_product_size(s), 24);
    ck_assert_uint_eq(dsv4_scenario_excluded(s), 9);
    ck_assert_uint_eq(dsv4_scenario_count(s), 15);
    ck_assert_uint_eq(dsv4_scenario_axis_count(s), 4);
    ck_assert_str_eq(dsv4_scenario_axis_name(s, 2), "topology.ep");
    ck_assert_uint_eq(dsv4_scenario_axis_size(s, 3), 3);
    ck_assert_str_eq(dsv4_scenario_name(s), "m");
    /* first axis slowest */
    const dsv4_scenario_case *k = dsv4_scenario_get(s, 0);
    ck_assert_str_eq(k->name, "m/quant=0,layer=0,topology.ep=1,tokens=[0]");
    ck_assert_int_eq(k->line, 5);
    ck_assert_int_eq(k->col, 1);
    ck_assert_int_eq(k->explicit_index, -1);
    ck_assert_ptr_nonnull(k->axis_index);
    k = by_name(s, "m/quant=0,layer=1,topology.ep=2,tokens=[300]");
    ck_assert_int_eq(k->config.layer, 1);
    ck_assert_int_eq(k->topology.ep, 2);
    ck_assert_int_eq(k->tokens[0], 300);
    ck_assert_int_eq(k->config.routed_format, DSV4_FORMAT_FP4);
    ck_assert_int_eq(k->axis_index[0], 0);
    ck_assert_int_eq(k->axis_index[3], 2);
    k = by_name(s, "m/quant=1,layer=1,topology.ep=1,tokens=[1]");
    ck_assert_int_eq(k->config.routed_format, DSV4_FORMAT_BF16);
    ck_assert_int_eq(k->config.shared_format, DSV4_FORMAT_BF16);
    ck_assert_int_eq(k->config.act_quant, DSV4_ACT_QUANT_NONE);
    for (size_t i = 0; i < dsv4_scenario_count(s); i++) {
        k = dsv4_scenario_get(s, i);
        ck_assert_msg(!(k->config.layer == 0 && k->topology.ep == 2), "%s not excluded", k->name);
        ck_assert_msg(!(k->axis_index[0] == 1 && k->tokens[0] == 0), "%s not excluded", k->name);
        ck_assert_int_eq(k->config_status, DSV4_OK);
        ck_assert_ptr_null(k->config_error);
        ck_assert_int_eq(k->expect, DSV4_EXPECT_PASS);
        ck_assert_uint_eq(k->checks, DSV4_CHECK_ALL);
    }
    ck_assert_ptr_null(dsv4_scenario_get(s, 15));
    dsv4_scenario_free(s);
}
END_TEST

START_TEST(explicit_cases_and_refusals)
{
    dsv4_scenario *s = load_ok("name: e\n"
                               "defaults: {layer: 1, topology: {backend: cpu}}\n"
                               "cases:\n"
                               "  - {name: lowlat-prefill, topology: {ep: 2, dp: 2, world: 2, dispatch: low_latency, "
                               "role: prefill}, expect: {refused: \"decode-only\"}, checks: [refusal]}\n"
                               "  - seed: 42\n"
                               "    top_p: 2.0\n"
                               "    expect: pass\n");
    ck_assert_uint_eq(dsv4_scenario_count(s), 2);
    ck_assert_uint_eq(dsv4_scenario_product_size(s), 0);
    const dsv4_scenario_case *k = dsv4_scenario_get(s, 0);
    ck_assert_str_eq(k->name, "e/lowlat-prefill");
    ck_assert_int_eq(k->line, 4);
    ck_assert_int_eq(k->col, 5);
    ck_assert_int_eq(k->explicit_index, 0);
    ck_assert_ptr_null(k->axis_index);
    ck_assert_int_eq(k->expect, DSV4_EXPECT_REFUSED);
    ck_assert_str_eq(k->refused_regex, "decode-only");
    ck_assert_uint_eq(k->checks, DSV4_CHECK_REFUSAL);
    ck_assert_int_eq(k->topology.dispatch, DSV4_DISPATCH_LOW_LATENCY);
    ck_assert_int_eq(k->topology.backend, DSV4_BACKEND_CPU);
    ck_assert_int_eq(k->n_ranks, 2);
    /* the planner agrees */
    dsv4_plan *p = NULL;
    dsv4_error e;
    ck_assert_int_eq(dsv4_plan_create(&k->config, &k->topology, &k->budget, &p, &e), DSV4_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.message, "decode-only"));
    /* an invalid config is kept, with its verdict */
    k = dsv4_scenario_get(s, 1);
    ck_assert_str_eq(k->name, "e/case1");
    ck_assert_int_eq(k->line, 5);
    ck_assert_int_eq(k->seed, 42);
    ck_assert(k->config.top_p == 2.0f);
    ck_assert_int_eq(k->config_status, DSV4_ERR_CONFIG);
    ck_assert_ptr_nonnull(k->config_error);
    ck_assert_ptr_nonnull(strstr(k->config_error, "top_p"));
    ck_assert_ptr_null(k->refused_regex);
    dsv4_scenario_free(s);
}
END_TEST

START_TEST(per_rank_tokens_and_replay)
{
    dsv4_scenario *s = load_ok("name: r\n"
                               "defaults:\n"
                               "  layer: 1\n"
                               "  topology: {world: 4, dp: 4, ep: 4}\n"
                               "  tokens: 5\n"
                               "cases:\n"
                               "  - {name: bcast}\n"
                               "  - {name: each, tokens: [0, 1, 2, 300], replay: [true, false, on, off]}\n"
                               "  - {name: one, tokens: [7], replay: [false]}\n");
    const dsv4_scenario_case *k = by_name(s, "r/bcast");
    ck_assert_int_eq(k->n_ranks, 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(k->tokens[i], 5);
        ck_assert(k->replay[i]);
    }
    k = by_name(s, "r/each");
    ck_assert_int_eq(k->tokens[0], 0);
    ck_assert_int_eq(k->tokens[3], 300);
    ck_assert(k->replay[0] && !k->replay[1] && k->replay[2] && !k->replay[3]);
    k = by_name(s, "r/one");
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(k->tokens[i], 7);
        ck_assert(!k->replay[i]);
    }
    dsv4_scenario_free(s);
}
END_TEST

START_TEST(dotted_paths_bare_keys_and_mapping_axes)
{
    dsv4_scenario *s = load_ok("name: d\n"
                               "defaults: {layer: 1, config: {swiglu_limit: 10}}\n"
                               "axes:\n"
                               "  config.swiglu_limit: [0, 7.5]\n"
                               "  top_p: [1.0, 0.8]\n"
                               "  budget.device_gib: [80]\n"
                               "  shape:\n"
                               "    - {preset: tiny, topology: {world: 2, dp: 2}, tokens: [3, 4]}\n"
                               "    - {preset: mini, config: {n_activated: 2}, budget: {taken_gib: 1.5}}\n"
                               "exclude:\n"
                               "  - {shape: {preset: tiny}, top_p: 0.8}\n");
    ck_assert_uint_eq(dsv4_scenario_count(s), 6);
    const dsv4_scenario_case *k = by_name(s, "d/config.swiglu_limit=7.5,top_p=1.0,budget.device_gib=80,shape=0");
    ck_assert(k->config.swiglu_limit == 7.5f);
    ck_assert(k->config.top_p == 1.0f);
    ck_assert_str_eq(k->preset, "tiny");
    ck_assert_int_eq(k->config.dim, 128);
    ck_assert_int_eq(k->n_ranks, 2);
    ck_assert_int_eq(k->tokens[1], 4);
    ck_assert_uint_eq(k->budget.device_bytes, 80ull << 30);
    k = by_name(s, "d/config.swiglu_limit=0,top_p=0.8,budget.device_gib=80,shape=1");
    ck_assert(k->config.swiglu_limit == 0.0f);
    ck_assert(k->config.top_p == 0.8f);
    ck_assert_int_eq(k->config.n_activated, 2);
    ck_assert_int_eq(k->config.dim, 256);
    ck_assert_uint_eq(k->budget.taken_bytes, 3ull << 29);
    for (size_t i = 0; i < dsv4_scenario_count(s); i++) {
        k = dsv4_scenario_get(s, i);
        ck_assert_msg(!(!strcmp(k->preset, "tiny") && k->config.top_p < 1.0f), "%s not excluded", k->name);
    }
    dsv4_scenario_free(s);
}
END_TEST

/* Titles: each axis value by what it sets (a label, else its pairs), names unchanged (the ids). */
START_TEST(titles_show_what_values_set)
{
    dsv4_scenario *s = load_ok("name: lab\n"
                               "defaults: {preset: mini, layer: 1}\n"
                               "axes:\n"
                               "  quant:\n"
                               "    - {label: \"routed fp4, shared fp8\", routed_format: fp4, shared_format: fp8}\n"
                               "    - {routed_format: fp8, shared_format: fp8, config: {weight_scale: fp32}}\n"
                               "    - {}\n"
                               "  topology:\n"
                               "    - {label: one rank, world: 1}\n"
                               "    - {world: 2, dp: 2, ep: 2}\n"
                               "  tokens: [[3], [4]]\n"
                               "  sw:\n"
                               "    - {label: \"a;b\", swiglu_limit: 0}\n"
                               "cases:\n"
                               "  - {name: lone, tokens: [2]}\n");
    ck_assert_uint_eq(dsv4_scenario_count(s), 13);
    const dsv4_scenario_case *k = by_name(s, "lab/quant=0,topology=0,tokens=[3],sw=0");
    ck_assert_str_eq(k->title, "lab/quant: routed fp4, shared fp8; topology: one rank; tokens: [3]; sw: a,b");
    ck_assert(k->config.swiglu_limit == 0.0f); /* the label sets nothing, the rest of the value does */
    k = by_name(s, "lab/quant=1,topology=1,tokens=[4],sw=0");
    ck_assert_str_eq(k->title, "lab/quant: routed_format fp8, shared_format fp8, weight_scale fp32; topology: world 2, "
                               "dp 2, ep 2; tokens: [4]; sw: a,b");
    ck_assert_int_eq(k->topology.world_size, 2);
    ck_assert_int_eq(k->config.weight_scale, DSV4_SCALE_FP32);
    k = by_name(s, "lab/quant=2,topology=0,tokens=[3],sw=0");
    ck_assert_str_eq(k->title, "lab/quant: defaults; topology: one rank; tokens: [3]; sw: a,b");
    ck_assert_str_eq(by_name(s, "lab/lone")->title, "lab/lone");
    dsv4_scenario_free(s);
    /* a label is a string of 1 to 80 characters; only an axis value may carry one */
    static const char *const bad[] = {
        "name: b\ndefaults: {layer: 1}\naxes:\n  q:\n    - {label: \"\", swiglu_limit: 0}\n",
        "name: b\ndefaults: {layer: 1}\naxes:\n  q:\n    - {label: [x], swiglu_limit: 0}\n",
        "name: b\ndefaults: {layer: 1}\naxes:\n  q:\n    - {label: "
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx, swiglu_limit: 0}\n",
        "name: b\ndefaults: {layer: 1, label: x}\n",
        "name: b\ndefaults: {layer: 1}\ncases:\n  - {label: x}\n",
        "name: b\ndefaults: {layer: 1}\naxes:\n  config:\n    - {label: x, nokey: 1}\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dsv4_scenario *sb = NULL;
        dsv4_error e;
        ck_assert_msg(dsv4_scenario_load_string(bad[i], "bad.yaml", &sb, &e) == DSV4_ERR_FORMAT, "%zu", i);
        ck_assert_msg(strstr(e.message, "bad.yaml:") != NULL, "%zu: %s", i, e.message);
        ck_assert_msg(i > 2 || strstr(e.message, "label"), "%zu: %s", i, e.message);
    }
}
END_TEST

START_TEST(anchors_and_aliases)
{
    dsv4_scenario *s = load_ok("name: a\n"
                               "defaults:\n"
                               "  layer: 1\n"
                               "  topology: &topo {world: 2, dp: 2, ep: 2, buckets: &b [1, 2, 4]}\n"
                               "cases:\n"
                               "  - {name: x, topology: *topo}\n"
                               "  - {name: y, topology: {buckets: *b, role: decode}}\n");
    const dsv4_scenario_case *k = by_name(s, "a/y");
    ck_assert_int_eq(k->topology.n_buckets, 3);
    ck_assert_int_eq(k->topology.buckets[2], 4);
    ck_assert_int_eq(k->topology.role, DSV4_ROLE_DECODE);
    ck_assert_int_eq(k->topology.ep, 2);
    dsv4_scenario_free(s);
}
END_TEST

START_TEST(product_refused_before_allocation)
{
    /* 10^7 cases: refused from the axis sizes alone */
    char text[2048];
    int n = snprintf(text, sizeof text, "name: big\ndefaults: {layer: 1}\naxes:\n  seed: [0,1,2,3,4,5,6,7,8,9]\n");
    const char *keys[] = {"n_activated", "top_p_min_keep", "n_hash_layers", "vocab_size", "dim", "moe_inter_dim"};
    for (int a = 0; a < 6; a++)
        n += snprintf(text + n, sizeof text - (size_t)n, "  %s: [1,2,3,4,5,6,7,8,9,10]\n", keys[a]);
    dsv4_scenario *s = NULL;
    dsv4_error e;
    ck_assert_int_eq(dsv4_scenario_load_string(text, "big.yaml", &s, &e), DSV4_ERR_CONFIG);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(e.message, "big.yaml:3:1") && strstr(e.message, "10000000") &&
                      strstr(e.message, "max_cases 10000"),
                  "%s", e.message);
}
END_TEST

typedef struct {
    const char *what;
    const char *text;
    dsv4_status status;
    const char *where;   /* exact file:line:col */
    const char *snippet; /* part of the rule */
} bad_case;

static const bad_case bad_cases[] = {
    {"bad indentation", "name: x\ndefaults:\n  layer: 1\n   seed: 2\n", DSV4_ERR_FORMAT, "bad.yaml:4:8:",
     "mapping values are not allowed"},
    {"dedent", "name: x\ndefaults:\n  layer: 1\n seed: 2\n", DSV4_ERR_FORMAT, "bad.yaml:4:2:", "did not find expected key"},
    {"unclosed flow", "name: x\ndefaults: {layer: 1\n", DSV4_ERR_FORMAT, "bad.yaml:3:1:", "expected ',' or '}'"},
    {"tab", "name: x\n\tdefaults: {}\n", DSV4_ERR_FORMAT, "bad.yaml:2:1:", "tab"},
    {"unknown top key", "name: x\ndefault: {layer: 1}\n", DSV4_ERR_FORMAT, "bad.yaml:2:1:", "allowed: name, description"},
    {"unknown key", "name: x\ndefaults:\n  layr: 1\n", DSV4_ERR_FORMAT, "bad.yaml:3:3:", "unknown key 'layr' (allowed: preset"},
    {"unknown topology key", "name: x\ndefaults:\n  layer: 1\n  topology: {wrld: 2}\n", DSV4_ERR_FORMAT,
     "bad.yaml:4:14:", "unknown topology key 'wrld' (allowed: world"},
    {"unknown config key", "name: x\ndefaults:\n  config: {topp: 1}\n", DSV4_ERR_FORMAT, "bad.yaml:3:12:",
     "unknown config key 'topp' (allowed: dim"},
    {"wrong type mapping", "name: x\ndefaults:\n  layer: 1\n  topology: [1, 2]\n", DSV4_ERR_FORMAT, "bad.yaml:4:13:",
     "topology: expected a mapping, got a list"},
    {"wrong type integer", "name: x\ndefaults:\n  layer: 1\n  seed: abc\n", DSV4_ERR_FORMAT, "bad.yaml:4:9:",
     "seed: expected an integer"},
    {"wrong type list", "name: x\ndefaults: {layer: 1}\naxes:\n  layer: 3\n", DSV4_ERR_FORMAT, "bad.yaml:4:10:",
     "expected a list"},
    {"tokens mapping", "name: x\ndefaults: {layer: 1, tokens: {a: 1}}\naxes: {}\n", DSV4_ERR_FORMAT,
     "bad.yaml:2:30:", "tokens: expected a list"},
    {"unknown enum", "name: x\ndefaults:\n  layer: 1\n  topology: {role: prefil}\n", DSV4_ERR_FORMAT,
     "bad.yaml:4:20:", "unknown value 'prefil' (one of: prefill, decode, mixed)"},
    {"unknown check", "name: x\ndefaults: {layer: 1, checks: [numerics, speed]}\naxes: {}\n", DSV4_ERR_FORMAT,
     "bad.yaml:2:41:", "unknown value 'speed'"},
    {"unknown preset", "name: x\ndefaults: {layer: 1, preset: huge}\naxes: {}\n", DSV4_ERR_FORMAT, "bad.yaml:2:30:",
     "unknown preset 'huge'"},
    {"bad expect", "name: x\ndefaults: {layer: 1}\ncases:\n  - {expect: fail}\n", DSV4_ERR_FORMAT, "bad.yaml:4:14:",
     "expected 'pass' or a mapping {refused: REGEX}"},
    {"bad regex", "name: x\ndefaults: {layer: 1}\ncases:\n  - {expect: {refused: \"a(\"}}\n", DSV4_ERR_FORMAT,
     "bad.yaml:4:24:", "bad regex"},
    {"bad config value", "name: x\ndefaults:\n  layer: 1\n  config: {top_p: abc}\n", DSV4_ERR_CONFIG,
     "bad.yaml:4:19:", "config field 'top_p': value 'abc' is not a number"},
    {"bad layer value", "name: x\ndefaults: {layer: one}\naxes: {}\n", DSV4_ERR_CONFIG, "bad.yaml:2:19:",
     "'layer': value 'one' is not an integer"},
    {"bad config in axis", "name: x\ndefaults: {layer: 1}\naxes:\n  top_p: [0.5, x]\n", DSV4_ERR_CONFIG,
     "bad.yaml:4:16:", "is not a number"},
    {"tokens of wrong length", "name: x\ndefaults:\n  layer: 1\n  topology: {world: 2, dp: 2}\n  tokens: [1, 2, 3]\naxes: {}\n",
     DSV4_ERR_CONFIG, "bad.yaml:5:11:", "tokens has 3 entries but topology.world is 2"},
    {"replay of wrong length", "name: x\ndefaults: {layer: 1}\ncases:\n  - {replay: [true, false]}\n", DSV4_ERR_CONFIG,
     "bad.yaml:4:14:", "replay has 2 entries but topology.world is 1"},
    {"negative tokens", "name: x\ndefaults: {layer: 1}\naxes:\n  tokens: [[1], [-1]]\n", DSV4_ERR_CONFIG,
     "bad.yaml:4:18:", "outside [0,"},
    {"world out of range", "name: x\ndefaults: {layer: 1, topology: {world: 0}}\naxes: {}\n", DSV4_ERR_CONFIG,
     "bad.yaml:2:40:", "topology.world: 0 is outside [1, 1024]"},
    {"product above max_cases", "name: x\ndefaults: {layer: 1}\naxes:\n  seed: [1, 2, 3]\n  top_p: [0.5, 1.0]\nmax_cases: 5\n",
     DSV4_ERR_CONFIG, "bad.yaml:6:12:", "(3 x 2) is 6 cases, plus 0 explicit cases: above max_cases 5"},
    {"alias cycle", "name: x\ndefaults: &d {config: *d}\n", DSV4_ERR_FORMAT, "bad.yaml:2:11:", "alias cycle"},
    {"undefined alias", "name: x\ndefaults: *nope\n", DSV4_ERR_FORMAT, "bad.yaml:2:11:", "undefined alias"},
    {"merge axis of scalars", "name: x\ndefaults: {layer: 1}\naxes:\n  quant: [fp4, fp8]\n", DSV4_ERR_FORMAT,
     "bad.yaml:4:11:", "must be a mapping"},
    {"merge axis unknown key", "name: x\ndefaults: {layer: 1}\naxes:\n  quant: [{routed_fmt: fp4}]\n", DSV4_ERR_FORMAT,
     "bad.yaml:4:12:", "unknown key 'routed_fmt'"},
    {"duplicate key", "name: x\ndefaults:\n  layer: 1\n  layer: 2\n", DSV4_ERR_FORMAT, "bad.yaml:4:3:",
     "duplicate key 'layer'"},
    {"name in defaults", "name: x\ndefaults: {name: y}\n", DSV4_ERR_FORMAT, "bad.yaml:2:12:", "only allowed in an explicit case"},
    {"no name", "defaults: {layer: 1}\naxes: {}\n", DSV4_ERR_FORMAT, "bad.yaml:1:1:", "no 'name'"},
    {"no cases", "name: x\ndefaults: {layer: 1}\n", DSV4_ERR_FORMAT, "bad.yaml:1:1:", "defines no cases"},
    {"layer unset", "name: x\naxes:\n  seed: [1]\n", DSV4_ERR_CONFIG, "bad.yaml:2:1:", "layer is not set"},
    {"exclude index out of range", "name: x\ndefaults: {layer: 1}\naxes:\n  q: [{top_p: 1}]\nexclude:\n  - {q: 3}\n",
     DSV4_ERR_CONFIG, "bad.yaml:6:9:", "outside [0, 0]"},
    {"duplicate case names", "name: x\ndefaults: {layer: 1}\ncases:\n  - {name: a}\n  - {name: a}\n", DSV4_ERR_FORMAT,
     "bad.yaml:5:5:", "duplicate case name 'x/a'"},
    {"two documents", "name: x\n---\nname: y\n", DSV4_ERR_FORMAT, "bad.yaml:2:1:", "one YAML document"},
    {"root not a mapping", "- 1\n- 2\n", DSV4_ERR_FORMAT, "bad.yaml:1:1:", "a scenario file is a mapping"},
    {"too deep", "name: x\ndescription: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]"
                 "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
     DSV4_ERR_FORMAT, "bad.yaml:2:78:", "nesting deeper than 64"},
    {"invalid utf-8", "name: x\ndescription: \"\xff\xfe\"\n", DSV4_ERR_FORMAT, "bad.yaml:2:15:", "YAML syntax error"},
    {"params with a space", "name: x\ndefaults: {layer: 1}\ncases:\n  - {params: \"route=one, quant=fold\"}\n",
     DSV4_ERR_FORMAT, "bad.yaml:4:14:", "holds a space or control character"},
    {"params as a list", "name: x\ndefaults: {layer: 1}\ncases:\n  - {params: [route=one]}\n", DSV4_ERR_FORMAT,
     "bad.yaml:4:14:", "params: expected a scalar"},
};

START_TEST(malformed_inputs)
{
    const bad_case *b = &bad_cases[_i];
    dsv4_scenario *s = (dsv4_scenario *)1;
    dsv4_error e;
    dsv4_status st = dsv4_scenario_load_string(b->text, "bad.yaml", &s, &e);
    ck_assert_msg(st == b->status, "%s: status %d, expected %d: %s", b->what, (int)st, (int)b->status, e.message);
    ck_assert_msg(s == NULL, "%s: out not NULL", b->what);
    ck_assert_int_eq(e.status, st);
    ck_assert_msg(!strncmp(e.message, b->where, strlen(b->where)), "%s: expected '%s' at the start of: %s", b->what,
                  b->where, e.message);
    ck_assert_msg(strstr(e.message, b->snippet), "%s: expected '%s' in: %s", b->what, b->snippet, e.message);
}
END_TEST

START_TEST(alias_bomb)
{
    /* billion laughs: 10 levels of 10 aliases each */
    char text[4096];
    int n = snprintf(text, sizeof text, "name: x\na0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for (int l = 1; l < 10; l++) {
        n += snprintf(text + n, sizeof text - (size_t)n, "a%d: &a%d [", l, l);
        for (int j = 0; j < 10; j++)
            n += snprintf(text + n, sizeof text - (size_t)n, "%s*a%d", j ? ", " : "", l - 1);
        n += snprintf(text + n, sizeof text - (size_t)n, "]\n");
    }
    dsv4_scenario *s = NULL;
    dsv4_error e;
    ck_assert_int_eq(dsv4_scenario_load_string(text, "bad.yaml", &s, &e), DSV4_ERR_FORMAT);
    ck_assert_ptr_null(s);
    /* a5 (line 7) is the first anchor expanding to more than 10^6 nodes */
    ck_assert_msg(!strncmp(e.message, "bad.yaml:7:5:", 13) && strstr(e.message, "alias expansion too large"), "%s",
                  e.message);
}
END_TEST

START_TEST(file_errors_name_the_path)
{
    char path[512];
    tu_path(path, sizeof path, "bad.yaml");
    const char *text = "name: x\ndefaults:\n  layer: 1\n  topology: {ep: two}\n";
    ck_assert_int_eq(tu_write_file(path, text, strlen(text)), 0);
    dsv4_scenario *s = NULL;
    dsv4_error e;
    ck_assert_int_eq(dsv4_scenario_load(path, &s, &e), DSV4_ERR_FORMAT);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(e.message, "bad.yaml:4:18: topology.ep: expected an integer, got 'two'"), "%s", e.message);
    ck_assert_int_eq(dsv4_scenario_load("/nonexistent/x.yaml", &s, &e), DSV4_ERR_IO);
    ck_assert_int_eq(dsv4_scenario_load_string(NULL, "x", &s, &e), DSV4_ERR_INVALID_ARG);
    dsv4_scenario_free(NULL);
}
END_TEST

START_TEST(ci_matrix_loads)
{
    dsv4_scenario *s = tu_scenario_file("scenarios/ci.yaml");
    dsv4_error e;
    ck_assert_str_eq(dsv4_scenario_name(s), "ci");
    ck_assert_uint_eq(dsv4_scenario_product_size(s), 36);
    ck_assert_uint_eq(dsv4_scenario_excluded(s), 18);
    ck_assert_uint_eq(dsv4_scenario_count(s), 21);
    int refused = 0, mixed = 0, ep2 = 0, empty = 0;
    for (size_t i = 0; i < dsv4_scenario_count(s); i++) {
        const dsv4_scenario_case *k = dsv4_scenario_get(s, i);
        ck_assert_msg(k->config_status == DSV4_OK, "%s: %s", k->name, k->config_error);
        /* every expectation agrees with the planner on rank 0 */
        dsv4_plan *p = NULL;
        dsv4_status st = dsv4_plan_create(&k->config, &k->topology, &k->budget, &p, &e);
        dsv4_plan_free(p);
        if (k->expect == DSV4_EXPECT_REFUSED) {
            refused++;
            ck_assert_msg(st == DSV4_ERR_REFUSED && strstr(e.message, k->refused_regex), "%s: %s", k->name,
                          st ? e.message : "planned");
        } else {
            ck_assert_msg(st == DSV4_OK, "%s: %s", k->name, e.message);
        }
        mixed += k->n_ranks == 2 && k->replay[0] != k->replay[1];
        ep2 += k->topology.ep == 2;
        empty += k->tokens[0] == 0;
    }
    ck_assert_int_eq(refused, 2);
    ck_assert_int_eq(mixed, 1);
    ck_assert_int_ge(ep2, 9);
    ck_assert_int_eq(empty, 4);
    dsv4_scenario_free(s);
}
END_TEST

Suite *scenario_suite(void)
{
    Suite *s = suite_create("scenario");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, product_with_exclusions_and_names);
    tcase_add_test(tc, explicit_cases_and_refusals);
    tcase_add_test(tc, per_rank_tokens_and_replay);
    tcase_add_test(tc, dotted_paths_bare_keys_and_mapping_axes);
    tcase_add_test(tc, anchors_and_aliases);
    tcase_add_test(tc, titles_show_what_values_set);
    tcase_add_test(tc, product_refused_before_allocation);
    tcase_add_loop_test(tc, malformed_inputs, 0, (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_test(tc, alias_bomb);
    tcase_add_test(tc, file_errors_name_the_path);
    tcase_add_test(tc, ci_matrix_loads);
    suite_add_tcase(s, tc);
    return s;
}
