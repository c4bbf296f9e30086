/*
 * Verifying another engine's MoE layer (dsv4moe_harness/engines.h, docs/engines.md): exported case
 * folders and the check of an engine's outputs against them.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "core/err.h"
#include "core/grow.h"
#include "compare/diagnose.h"
#include "compare/engines_int.h"
#include "core/fileio.h"
#include "compare/results.h"
#include "compare/run_ext.h"
#include "dsv4moe_harness/engines.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/ref.h"

/* A case.json is a few KiB; the cap bounds what a wrong path or a hostile file costs. */
#define CASE_JSON_MAX (1 << 20)

void dsv4_check_options_init(dsv4_check_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->sentinel = DSV4_SENTINEL_E;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------- check ---------------- */


/* The case folders of dir (those holding case.json), sorted. */
static dsv4_status list_cases(const char *dir, char ***names, size_t *n, dsv4_error *err)
{
    dsv4_status st = dsv4_h_case_folders(dir, names, n, err);
    if (!st && *n == 0) {
        free(*names);
        st = dsv4_seterr(err, DSV4_ERR_NOT_FOUND, dir,
                         "no case folder (a folder holding case.json, as dsv4moe export writes them)");
    }
    return st;
}

typedef struct {
    json_t *root;
    const char *name, *title, *scn_name, *scn_file;
    dsv4_config cfg;
    int64_t T;
    uint64_t seed;
    const char *expected[DSV4_ROUNDING_COUNT]; /* file names in the folder; NULL: not exported */
    int64_t bucket;                            /* padded.bucket; 0: not a padded case */
    int64_t ws_bound;                          /* memory.workspace_bound_bytes; -1: none */
    double ws_factor;                          /* memory.factor */
} case_desc;

/* case.json's optional "memory": {"workspace_bound_bytes": N >= 0 or null, "factor": F >= 1}. */
static dsv4_status read_memory(const char *path, json_t *m, case_desc *cd, dsv4_error *err)
{
    cd->ws_bound = -1;
    cd->ws_factor = DSV4_WORKSPACE_FACTOR;
    if (!m)
        return DSV4_OK;
    json_t *b = json_object_get(m, "workspace_bound_bytes"), *f = json_object_get(m, "factor");
    if (!json_is_object(m) || !(json_is_null(b) || (json_is_integer(b) && json_integer_value(b) >= 0)) ||
        !json_is_number(f) || !(json_number_value(f) >= 1.0 && json_number_value(f) <= 1e6))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                           "\"memory\" must be {\"workspace_bound_bytes\": an integer >= 0 or null, \"factor\": a "
                           "number in [1, 1e6]}");
    cd->ws_bound = json_is_integer(b) ? (int64_t)json_integer_value(b) : -1;
    cd->ws_factor = json_number_value(f);
    return DSV4_OK;
}

/* case.json's files.expected_by_rounding: known profiles, plain file names in the folder. */
static dsv4_status read_profiles(const char *path, json_t *files, case_desc *cd, dsv4_error *err)
{
    json_t *by = json_object_get(files, "expected_by_rounding");
    if (!json_is_object(by))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "needs files.expected_by_rounding, an object naming each "
                                                       "exported rounding profile's file (format version 2)");
    const char *key;
    json_t *v;
    json_object_foreach(by, key, v)
    {
        dsv4_rounding r;
        const char *f = json_string_value(v);
        if (dsv4_rounding_parse(key, &r, NULL))
            return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                               "files.expected_by_rounding: '%s' is not a rounding profile (spec, bf16_ops, fp32)", key);
        if (!f || !f[0] || f[0] == '.' || strchr(f, '/'))
            return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                               "files.expected_by_rounding.%s must be a file name in the case folder (no '/', not "
                               "hidden)",
                               key);
        cd->expected[r] = f;
    }
    if (!cd->expected[DSV4_ROUNDING_SPEC])
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "files.expected_by_rounding has no spec profile");
    static const char *const named[] = {"model", "input"};
    for (int i = 0; i < 2; i++) {
        const char *f = json_string_value(json_object_get(files, named[i]));
        if (!f || !f[0] || f[0] == '.' || strchr(f, '/'))
            return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                               "files.%s must be a file name in the case folder (no '/', not hidden)", named[i]);
    }
    return DSV4_OK;
}

/* Reads and validates case.json; the config from its "config" object. */
static dsv4_status read_case(const char *path, case_desc *cd, dsv4_error *err)
{
    json_error_t je;
    memset(cd, 0, sizeof *cd);
    char *text = NULL;
    size_t len = 0;
    dsv4_status rst = dsv4_read_small_file(path, CASE_JSON_MAX, "a case.json", &text, &len, err);
    if (rst)
        return rst;
    cd->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!cd->root)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "line %d: %s", je.line, je.text);
    json_t *r = cd->root, *fmt = json_object_get(r, "format"), *ver = json_object_get(r, "version");
    json_t *cfg = json_object_get(r, "config"), *tok = json_object_get(r, "tokens");
    json_t *scn = json_object_get(r, "scenario"), *seed = json_object_get(r, "seed");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), DSV4_H_CASE_FORMAT))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "\"format\" is not \"%s\"", DSV4_H_CASE_FORMAT);
    if (json_is_integer(ver) && json_integer_value(ver) == 1)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                           "\"version\" 1: exported before the rounding profiles (SPEC.md section 10); version %d "
                           "adds each profile's expected file with y_terms, which check needs: export the cases again",
                           DSV4_ENGINE_FORMAT_VERSION);
    if (!json_is_integer(ver) || json_integer_value(ver) < 2 || json_integer_value(ver) > DSV4_ENGINE_FORMAT_VERSION)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "\"version\" must be 2 or %d (the format versions this tool "
                           "reads)", DSV4_ENGINE_FORMAT_VERSION);
    json_t *pad = json_object_get(r, "padded"), *pb = json_object_get(pad, "bucket");
    cd->bucket = 0;
    if (pad && (json_integer_value(ver) < 3 || !json_is_object(pad) || !json_is_integer(pb) ||
                !json_is_integer(tok) || json_integer_value(pb) <= json_integer_value(tok) ||
                json_integer_value(pb) > DSV4_REF_MAX_TOKENS))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                           "\"padded\" must be {\"bucket\": B, ...} with B above \"tokens\" (version 3 on)");
    if (pad)
        cd->bucket = json_integer_value(pb);
    if (!json_is_object(cfg) || !json_is_integer(tok) || json_integer_value(tok) < 0)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "needs a \"config\" object and \"tokens\" >= 0");
    cd->T = json_integer_value(tok);
    cd->seed = json_is_integer(seed) ? (uint64_t)json_integer_value(seed) : 0;
    cd->name = json_string_value(json_object_get(r, "name"));
    cd->title = json_string_value(json_object_get(r, "title"));
    cd->scn_name = json_string_value(json_object_get(scn, "name"));
    cd->scn_file = json_string_value(json_object_get(scn, "file"));
    if (!cd->name)
        cd->name = json_string_value(json_object_get(r, "case"));
    if (!cd->name)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "no \"case\" name");
    dsv4_status pst = read_profiles(path, json_object_get(r, "files"), cd, err);
    if (!pst)
        pst = read_memory(path, json_object_get(r, "memory"), cd, err);
    if (pst)
        return pst;
    dsv4_config_init(&cd->cfg);
    const char *key;
    json_t *v;
    json_object_foreach(cfg, key, v)
    {
        char buf[64];
        if (json_is_integer(v))
            snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        else if (json_is_real(v))
            snprintf(buf, sizeof buf, "%.9g", json_real_value(v));
        else if (json_is_boolean(v))
            snprintf(buf, sizeof buf, "%s", json_is_true(v) ? "true" : "false");
        else if (json_is_string(v))
            snprintf(buf, sizeof buf, "%s", json_string_value(v));
        else
            return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "config key '%s' is not a number, boolean or string", key);
        dsv4_error e2;
        dsv4_error_clear(&e2);
        if (dsv4_config_set(&cd->cfg, key, buf, &e2))
            return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "config: %s", e2.message);
    }
    dsv4_error e3;
    dsv4_error_clear(&e3);
    if (dsv4_config_validate(&cd->cfg, &e3))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "config: %s", e3.message);
    return DSV4_OK;
}

/* The engine's tensor for one of our names, through the name map. */
static const dsv4_tensor_info *find_mapped(const dsv4_st_file *f, const dsv4_check_options *o, const char *ours)
{
    for (int i = 0; i < o->n_map; i++)
        if (o->map_to[i] && !strcmp(o->map_to[i], ours))
            return dsv4_st_find(f, o->map_from[i]);
    return dsv4_st_find(f, ours);
}

/* y of the engine as bf16 [T, H] (rounded to nearest even when its dtype is wider). */
static uint16_t *y_bf16(const dsv4_tensor_info *t)
{
    uint16_t *o = malloc((size_t)t->numel * 2 + 2);
    if (!o)
        return NULL;
    for (uint64_t i = 0; i < t->numel; i++) {
        if (t->dtype == DSV4_DTYPE_BF16)
            memcpy(&o[i], (const char *)t->data + 2 * i, 2);
        else
            o[i] = dsv4_f32_to_bf16((float)dsv4_float_value(t->dtype, t->data, (int64_t)i));
    }
    return o;
}

/* The case's expected outputs at profile `rnd`: y BF16, topk_ids, topk_weights and y_terms F32, all of
   [T, ...]; y and y_terms copied out (the mapping may be unaligned). NULL with msg set when they do not fit. */
static dsv4_st_file *open_expected(const char *path, int64_t T, int64_t H, uint16_t **y, float **terms,
                                   const dsv4_tensor_info **ids, const dsv4_tensor_info **w, char *msg, size_t size)
{
    dsv4_st_file *f = NULL;
    dsv4_error e;
    dsv4_error_clear(&e);
    if (dsv4_st_open(path, &f, &e)) {
        snprintf(msg, size, "the case's expected outputs do not load: %s", e.message);
        return NULL;
    }
    const dsv4_tensor_info *ye = dsv4_st_find(f, "y"), *te = dsv4_st_find(f, "y_terms");
    *ids = dsv4_st_find(f, "topk_ids");
    *w = dsv4_st_find(f, "topk_weights");
    if (!ye || ye->ndim != 2 || ye->shape[0] != T || ye->shape[1] != H || ye->dtype != DSV4_DTYPE_BF16 || !*ids ||
        !*w) {
        snprintf(msg, size, "%s: not the y BF16 [%lld, %lld], topk_ids and topk_weights of the case", path,
                 (long long)T, (long long)H);
        goto fail;
    }
    if (!te || te->ndim != 2 || te->shape[0] != T || te->shape[1] != H || te->dtype != DSV4_DTYPE_F32) {
        char sh[96] = "absent";
        if (te)
            dsv4_tensor_shape_str(te, sh, sizeof sh);
        snprintf(msg, size, "%s: y_terms must be F32 [%lld, %lld] (SPEC.md section 10.2); found %s%s%s", path,
                 (long long)T, (long long)H, te ? dsv4_dtype_name(te->dtype) : "", te ? " " : "", sh);
        goto fail;
    }
    *y = malloc((size_t)(T * H) * sizeof **y + 2);
    *terms = malloc((size_t)(T * H) * sizeof **terms + 4);
    if (!*y || !*terms) {
        snprintf(msg, size, "out of memory");
        goto fail;
    }
    memcpy(*y, ye->data, (size_t)(T * H) * sizeof **y);
    memcpy(*terms, te->data, (size_t)(T * H) * sizeof **terms);
    for (int64_t i = 0; i < T * H; i++)
        if (!((*terms)[i] >= 0.0f) && isfinite(dsv4_bf16_to_f32((*y)[i]))) {
            snprintf(msg, size, "%s: y_terms[%lld, %lld] is %g where y is finite; a term bound is >= 0", path,
                     (long long)(i / H), (long long)(i % H), (double)(*terms)[i]);
            goto fail;
        }
    return f;
fail:
    free(*y);
    free(*terms);
    *y = NULL;
    *terms = NULL;
    dsv4_st_close(f);
    return NULL;
}

/* The engine's rounding profile: its output's engine_rounding, else the option's. False with msg set
   when the metadata names no profile or the case was not exported with it. */
static bool engine_profile(const dsv4_st_file *fo, const char *out_path, const case_desc *cd,
                           const dsv4_check_options *o, dsv4_rounding *rnd, bool *declared, char *msg, size_t size)
{
    const char *er = dsv4_st_metadata(fo, "engine_rounding");
    *rnd = o->rounding;
    *declared = er != NULL;
    if (er && dsv4_rounding_parse(er, rnd, NULL)) {
        snprintf(msg, size, "%s: metadata engine_rounding '%.64s' is not a rounding profile (spec, bf16_ops, fp32)",
                 out_path, er);
        return false;
    }
    if (cd->expected[*rnd])
        return true;
    size_t len = (size_t)snprintf(msg, size, "the case was exported without rounding %s (it has:",
                                  dsv4_rounding_name(*rnd));
    for (int r = 0; r < DSV4_ROUNDING_COUNT && len < size; r++)
        if (cd->expected[r])
            len += (size_t)snprintf(msg + len, size - len, " %s", dsv4_rounding_name((dsv4_rounding)r));
    if (len < size)
        snprintf(msg + len, size - len, "); export with --rounding naming it");
    return false;
}

/* The memory check of a case whose output reports its peak workspace (metadata peak_workspace_bytes,
   DSV4_WORKSPACE_FACTOR): none without the case's bound. */
static void memory_check(dsv4_case_result *c, const case_desc *cd, const dsv4_check_options *o, const char *out_path,
                         const char *pw)
{
    char msg[1400], a[32], b[32];
    const char *p = pw;
    while (*p >= '0' && *p <= '9')
        p++;
    errno = 0;
    unsigned long long v = p != pw && !*p && p - pw <= 19 ? strtoull(pw, NULL, 10) : 0;
    if (p == pw || *p || p - pw > 19 || errno) {
        snprintf(msg, sizeof msg, "%.1200s: metadata peak_workspace_bytes '%.40s' is not a decimal byte count (at most "
                                  "19 digits)", out_path, pw);
        dsv4_run_ext_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_ERROR, msg);
        return;
    }
    if (cd->ws_bound < 0)
        return;
    double bound = (double)cd->ws_bound, ratio = bound > 0 ? (double)v / bound : (v ? INFINITY : 0.0);
    bool ok = (double)v <= cd->ws_factor * bound;
    size_t len = (size_t)snprintf(msg, sizeof msg,
                                  "memory: peak workspace %s (%llu bytes), %.2fx the contract's bound %s (%lld bytes: the "
                                  "planner's for %lld tokens on this rank); %s %gx",
                                  dsv4_h_human_bytes(v, a, sizeof a), v, ratio,
                                  dsv4_h_human_bytes((uint64_t)cd->ws_bound, b, sizeof b),
                                  (long long)cd->ws_bound, (long long)cd->T, ok ? "within" : "over", cd->ws_factor);
    for (size_t i = 0; !ok && !o->no_diagnose && i < dsv4_check_class_count() && len < sizeof msg; i++) {
        const dsv4_check_class *k = dsv4_check_class_at(i);
        if (!strcmp(k->name, DSV4_H_MEMORY_CLASS))
            snprintf(msg + len, sizeof msg - len, "; likely %s: %s (%s)", k->name, k->what, k->source);
    }
    dsv4_run_ext_check(c, DSV4_CHECK_MEMORY, ok ? DSV4_RESULT_PASS : DSV4_RESULT_FAIL, msg);
}

/* Checks one case; fills c's numerics check. */
static void check_case(const char *cases_dir, const char *outputs_dir, const char *id, const case_desc *cd,
                       const dsv4_check_options *o, dsv4_case_result *c)
{
    char exp_path[2048], out_path[2048], msg[6144];
    const unsigned NUM = DSV4_CHECK_NUMERICS;
    if ((size_t)snprintf(out_path, sizeof out_path, "%s/%s/output.safetensors", outputs_dir, id) >= sizeof out_path) {
        dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, "the case path is too long");
        return;
    }
    dsv4_st_file *fe = NULL, *fo = NULL;
    dsv4_error e;
    dsv4_error_clear(&e);
    uint16_t *ya = NULL, *yb = NULL;
    float *terms = NULL;
    const int64_t T = cd->T, H = cd->cfg.dim;
    dsv4_tolerance rule = o->fp8_mma ? DSV4_TOL_OUTSIDE_FP8 : DSV4_TOL_OUTSIDE;
    if (access(out_path, F_OK) != 0) {
        snprintf(msg, sizeof msg, "no output: %s does not exist (a case without an output is an error, not a skip)",
                 out_path);
        dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, msg);
        goto done;
    }
    if (dsv4_st_open(out_path, &fo, &e)) {
        snprintf(msg, sizeof msg, "the output does not load: %s", e.message);
        dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, msg);
        goto done;
    }
    dsv4_rounding rnd;
    bool declared;
    if (!engine_profile(fo, out_path, cd, o, &rnd, &declared, msg, sizeof msg)) {
        dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, msg);
        goto done;
    }
    const dsv4_tensor_info *ie, *we;
    if ((size_t)snprintf(exp_path, sizeof exp_path, "%s/%s/%s", cases_dir, id, cd->expected[rnd]) >= sizeof exp_path)
        snprintf(msg, sizeof msg, "the case path is too long");
    else
        fe = open_expected(exp_path, T, H, &yb, &terms, &ie, &we, msg, sizeof msg);
    if (!fe) {
        dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, msg);
        goto done;
    }
    const dsv4_tensor_info *yo = find_mapped(fo, o, "y"), *io = find_mapped(fo, o, "topk_ids"),
                           *wo = find_mapped(fo, o, "topk_weights");
    if (!yo) {
        size_t len = (size_t)snprintf(msg, sizeof msg, "%s has no tensor y (names:", out_path);
        for (size_t k = 0; k < dsv4_st_count(fo) && len < sizeof msg; k++)
            len += (size_t)snprintf(msg + len, sizeof msg - len, " %s", dsv4_st_tensor(fo, k)->name);
        if (len < sizeof msg)
            snprintf(msg + len, sizeof msg - len, "); name the engine's output with --map NAME=y");
        dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, msg);
        goto done;
    }
    /* a padded case: the engine may give the whole bucket; the first T rows are the tokens' */
    dsv4_tensor_info rows[3];
    const dsv4_tensor_info **given[3] = {&yo, &io, &wo};
    for (int k = 0; k < 3 && cd->bucket; k++)
        if (*given[k] && (*given[k])->ndim == 2 && (*given[k])->shape[0] == cd->bucket) {
            rows[k] = **given[k];
            rows[k].shape[0] = T;
            rows[k].numel = (uint64_t)T * (uint64_t)rows[k].shape[1];
            rows[k].nbytes = (*given[k])->nbytes / (uint64_t)cd->bucket * (uint64_t)T;
            *given[k] = &rows[k];
        }
    if (yo->ndim != 2 || yo->shape[0] != T || yo->shape[1] != H || !dsv4_compare_dtype_ok(yo->dtype)) {
        char s[96];
        dsv4_tensor_shape_str(yo, s, sizeof s);
        snprintf(msg, sizeof msg, "%s: tensor '%s' is %s %s; the case needs a float tensor [%lld, %lld]", out_path,
                 yo->name, dsv4_dtype_name(yo->dtype), s, (long long)T, (long long)H);
        dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, msg);
        goto done;
    }
    if (wo && !io) {
        snprintf(msg, sizeof msg,
                 "%s: topk_weights without topk_ids (weights are matched by expert id; give both or neither)",
                 out_path);
        dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, msg);
        goto done;
    }
    dsv4_compare_metrics m;
    if (!(ya = y_bf16(yo)) || !dsv4_compare_bf16(ya, yb, T * H, &m)) {
        dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, "comparison failed (out of memory)");
        goto done;
    }
    dsv4_run_ext_numerics(c, &m, ya, yb, T, H);
    int64_t beyond = dsv4_compare_beyond_terms(ya, yb, terms, T * H);
    dsv4_run_ext_outside(c, dsv4_rounding_name(rnd), beyond);
    char line[512], why[768] = "", rline[256] = "routing not given by the engine", rwhy[768] = "";
    dsv4_compare_format(&m, line, sizeof line);
    bool ok = dsv4_compare_within_beyond(rule, &m, beyond, why, sizeof why);
    bool rok = true;
    if (io) {
        dsv4_routing_metrics rm;
        char rmsg[768];
        /* an engine at bf16_ops runs its router in bf16 too: its weights get that rounding's rtol */
        double wrtol = rnd == DSV4_ROUNDING_BF16_OPS ? DSV4_ROUTING_WEIGHT_RTOL_BF16 : DSV4_ROUTING_WEIGHT_RTOL;
        if (!dsv4_compare_routing_tensors_rtol(cd->cfg.n_routed_experts, io, wo ? wo : NULL, o->sentinel, ie,
                                               wo ? we : NULL, wrtol, &rm, rmsg, sizeof rmsg)) {
            snprintf(msg, sizeof msg, "%s: %s", out_path, rmsg);
            dsv4_run_ext_check(c, NUM, DSV4_RESULT_ERROR, msg);
            goto done;
        }
        char rl[200];
        dsv4_routing_format(&rm, rl, sizeof rl);
        snprintf(rline, sizeof rline, "routing (sets per token, sentinel %s): %s", dsv4_sentinel_name(o->sentinel),
                 rl);
        rok = dsv4_routing_within(&rm, rwhy, sizeof rwhy);
    }
    const char *engine = dsv4_st_metadata(fo, "engine");
    dsv4_run_ext_ran_on(c, engine);
    char head[256];
    snprintf(head, sizeof head, "%s vs ref (rule %s, rounding %s%s): y beyond %lld with S, %lld without",
             engine ? engine : "engine", dsv4_tolerance_name(rule), dsv4_rounding_name(rnd),
             declared ? " from the output's engine_rounding" : "", (long long)beyond, (long long)m.tol_violations);
    char likely[768] = "";
    if (!(ok && rok) && !o->no_diagnose) {
        int32_t *ids_ref = malloc((size_t)ie->nbytes + 4);
        if (ids_ref && ie->dtype == DSV4_DTYPE_I32 && ie->numel == (uint64_t)(T * cd->cfg.n_activated)) {
            memcpy(ids_ref, ie->data, (size_t)ie->nbytes);
            char cdir[2100];
            snprintf(cdir, sizeof cdir, "%s/%s", cases_dir, id);
            dsv4_h_failure f = {.case_dir = cdir, .cfg = &cd->cfg, .T = T, .rounding = rnd, .rule = rule, .y = ya,
                                .y_ref = yb, .terms_ref = terms, .ids_ref = ids_ref, .ids = io, .routing_ok = rok,
                                .padded = cd->bucket > 0, .bad_nonfinite = m.bad_nonfinite,
                                .weights = wo, .sentinel = o->sentinel,
                                .weights_rtol = rnd == DSV4_ROUNDING_BF16_OPS ? DSV4_ROUTING_WEIGHT_RTOL_BF16
                                                                              : DSV4_ROUTING_WEIGHT_RTOL,
                                .beyond = beyond};
            char d[700];
            dsv4_h_diagnose(&f, d, sizeof d);
            snprintf(likely, sizeof likely, "; %s", d);
        }
        free(ids_ref);
    }
    if (ok && rok)
        snprintf(msg, sizeof msg, "%s; y %s; %s", head, T ? line : "nothing compared (0 tokens)", rline);
    else
        snprintf(msg, sizeof msg, "%s; %s%s%s; y %s; %s%s", head, why, why[0] && rwhy[0] ? "; " : "", rwhy, line, rline,
                 likely);
    dsv4_run_ext_check(c, NUM, ok && rok ? DSV4_RESULT_PASS : DSV4_RESULT_FAIL, msg);
    const char *pw = dsv4_st_metadata(fo, "peak_workspace_bytes");
    if (pw)
        memory_check(c, cd, o, out_path, pw);
done:
    free(ya);
    free(yb);
    free(terms);
    dsv4_st_close(fe);
    dsv4_st_close(fo);
}

dsv4_status dsv4_check_engine(const char *cases_dir, const char *outputs_dir, const dsv4_check_options *opt,
                              dsv4_run_results **results, dsv4_error *err)
{
    dsv4_check_options co;
    dsv4_check_options_init(&co);
    if (!cases_dir || !outputs_dir || !results)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "check", "cases folder, outputs folder and results are needed");
    *results = NULL;
    /* the size before `rounding` (callers built against format version 1: rounding spec) still works */
    if (opt && opt->struct_size != sizeof *opt && opt->struct_size != offsetof(dsv4_check_options, rounding) &&
        opt->struct_size != offsetof(dsv4_check_options, no_diagnose))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "check", "options struct_size %u unknown (expected %zu)",
                           opt->struct_size, sizeof *opt);
    if (opt)
        memcpy(&co, opt, opt->struct_size);
    opt = &co;
    if (!dsv4_rounding_name(opt->rounding))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "check", "rounding %d is not a profile (spec, bf16_ops, fp32)",
                           (int)opt->rounding);
    if (opt->n_map < 0 || opt->n_map > DSV4_CHECK_MAP_MAX)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "check", "n_map %d is outside [0, %d]", opt->n_map,
                           DSV4_CHECK_MAP_MAX);
    for (int i = 0; i < opt->n_map; i++)
        if (!opt->map_from[i] || !opt->map_to[i] ||
            (strcmp(opt->map_to[i], "y") && strcmp(opt->map_to[i], "topk_ids") &&
             strcmp(opt->map_to[i], "topk_weights")))
            return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "check", "map %d: the target must be y, topk_ids or "
                                                                  "topk_weights", i);
    struct stat sb;
    if (stat(outputs_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dsv4_seterr(err, DSV4_ERR_IO, outputs_dir, "the outputs folder does not exist or is not a folder");
    char **names = NULL;
    size_t n = 0;
    dsv4_status st = list_cases(cases_dir, &names, &n, err);
    if (st)
        return st;
    /* only a complete export, as it was written: no case missing, added or altered */
    if ((st = dsv4_h_manifest_verify(cases_dir, names, n, err))) {
        for (size_t i = 0; i < n; i++)
            free(names[i]);
        free(names);
        return st;
    }
    dsv4_run_results *R = NULL;
    /* scenario records: one per distinct (name, file) of the cases */
    char **sn = calloc(n, sizeof *sn), **sf = calloc(n, sizeof *sf);
    size_t *sidx = calloc(n, sizeof *sidx), nsc = 0;
    if (!sn || !sf || !sidx)
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, "check", "out of memory");
    for (size_t i = 0; i < n && !st; i++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s/case.json", cases_dir, names[i]);
        case_desc cd;
        if ((st = read_case(path, &cd, err))) {
            json_decref(cd.root);
            break;
        }
        const char *scn_name = cd.scn_name ? cd.scn_name : "check", *scn_file = cd.scn_file ? cd.scn_file : cases_dir;
        size_t s = 0;
        while (s < nsc && (strcmp(sn[s], scn_name) || strcmp(sf[s], scn_file)))
            s++;
        if (s == nsc) {
            size_t k = dsv4_run_ext_scenario(&R, scn_name, scn_file);
            sn[nsc] = strdup(scn_name);
            sf[nsc] = strdup(scn_file);
            sidx[nsc] = k;
            if (k == SIZE_MAX || !sn[nsc] || !sf[nsc]) {
                json_decref(cd.root);
                free(sn[nsc]), free(sf[nsc]);
                st = dsv4_seterr(err, DSV4_ERR_NOMEM, "check", "out of memory");
                break;
            }
            nsc++;
        }
        double t0 = now_s();
        dsv4_case_result *c =
            dsv4_run_ext_case(R, sidx[s], i, cd.name, &cd.cfg, 1, &cd.T, cd.seed, "engine");
        if (!c) {
            json_decref(cd.root);
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, "check", "out of memory");
            break;
        }
        dsv4_run_ext_title(c, cd.title);
        check_case(cases_dir, outputs_dir, names[i], &cd, opt, c);
        dsv4_run_ext_finish(c, now_s() - t0);
        json_decref(cd.root);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    for (size_t i = 0; i < nsc; i++)
        free(sn[i]), free(sf[i]);
    free(sn), free(sf), free(sidx);
    if (st) {
        dsv4_run_results_free(R);
        return st;
    }
    *results = R;
    return DSV4_OK;
}
