/*
 * Verifying another engine's MoE layer (dsv4moe/engines.h, docs/engines.md): exported case
 * folders and the check of an engine's outputs against them.
 */
#include <dirent.h>
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

#include "err.h"
#include "grow.h"
#include "fileio.h"
#include "run_ext.h"
#include "dsv4moe/engines.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/ref.h"

#define CASE_FORMAT "dsv4moe-engine-case"
/* A case.json is a few KiB; the cap bounds what a wrong path or a hostile file costs. */
#define CASE_JSON_MAX (1 << 20)

void dsv4_export_options_init(dsv4_export_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->layout = DSV4_LAYOUT_SPLIT;
    opt->threads = 2;
}

void dsv4_check_options_init(dsv4_check_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->sentinel = DSV4_SENTINEL_E;
}

void dsv4_export_case_id(const char *case_name, int rank, char *buf, size_t size)
{
    if (!buf || !size)
        return;
    size_t n = 0;
    for (const char *p = case_name ? case_name : ""; *p && n + 1 < size; p++) {
        char ch = *p;
        bool keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                    ch == '_' || ch == '=' || ch == ',' || ch == '+' || ch == '-';
        buf[n++] = ch == '/' ? '.' : keep ? ch : '_';
    }
    buf[n] = '\0';
    /* never "." or ".." or a hidden name */
    if (n && buf[0] == '.')
        buf[0] = '_';
    if (rank >= 0 && n < size)
        snprintf(buf + n, size - n, ".rank%d", rank);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------- export ---------------- */

/* The config as JSON: numbers as numbers, true/false as booleans, names as strings. */
static json_t *config_json(const dsv4_config *cfg)
{
    json_t *o = json_object();
    for (const char *const *k = dsv4_config_keys(); o && *k; k++) {
        char v[64], *end = NULL;
        if (dsv4_config_get(cfg, *k, v, sizeof v, NULL))
            continue;
        json_t *j;
        long long iv = strtoll(v, &end, 10);
        if (*v && !*end) {
            j = json_integer(iv);
        } else {
            double dv = strtod(v, &end);
            if (*v && !*end)
                j = json_real(dv);
            else if (!strcmp(v, "true") || !strcmp(v, "false"))
                j = json_boolean(!strcmp(v, "true"));
            else
                j = json_string(v);
        }
        if (!j || json_object_set_new(o, *k, j)) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

static json_t *tolerance_json(void)
{
    json_t *t = json_pack(
        "{s:s, s:s, s:f, s:f, s:f, s:f, s:s, s:f, s:s, s:{s:s, s:f, s:f}, s:{s:s, s:s, s:f, s:f}}", "rule",
        dsv4_tolerance_name(DSV4_TOL_OUTSIDE), "words", dsv4_tolerance_describe(DSV4_TOL_OUTSIDE),
        "deepgemm_diff_below", 1e-3, "atol", DSV4_COMPARE_ATOL, "rtol", DSV4_COMPARE_RTOL, "terms_scale",
        DSV4_COMPARE_TERMS_SCALE, "beyond", "|a - b| > atol + rtol |b| + terms_scale y_terms", "beyond_share_max", 0.005,
        "ulp", "reported, not judged (bf16 ULPs of y)", "fp8_mma", "rule", dsv4_tolerance_name(DSV4_TOL_OUTSIDE_FP8),
        "deepgemm_diff_below", 1e-3, "beyond_share_max", 0.02, "routing", "ids",
        "kept experts compared as sets per token", "reference_sentinel", "E", "weights_atol", DSV4_ROUTING_WEIGHT_ATOL,
        "weights_rtol", DSV4_ROUTING_WEIGHT_RTOL);
    return t;
}

/* The expected file of a rounding profile in a case folder. */
static const char *expected_file(dsv4_rounding r)
{
    static const char *const names[DSV4_ROUNDING_COUNT] = {"expected.safetensors", "expected.bf16_ops.safetensors",
                                                           "expected.fp32.safetensors"};
    return names[r];
}

/* The profiles an export writes: spec always, and those of the mask (0: all). */
static unsigned export_profiles(unsigned mask) { return (mask ? mask : (1u << DSV4_ROUNDING_COUNT) - 1) | 1u; }

/* case.json's "files" and "rounding" members for the profiles of `mask` (export_profiles). */
static json_t *files_json(unsigned mask)
{
    json_t *by = json_object(), *list = json_array();
    json_t *f = json_pack("{s:s, s:s, s:s}", "model", "model.safetensors", "input", "input.safetensors", "expected",
                          expected_file(DSV4_ROUNDING_SPEC));
    bool ok = by && list && f;
    for (int r = 0; ok && r < DSV4_ROUNDING_COUNT; r++)
        if (mask & (1u << r))
            ok = !json_object_set_new(by, dsv4_rounding_name((dsv4_rounding)r), json_string(expected_file((dsv4_rounding)r))) &&
                 !json_array_append_new(list, json_string(dsv4_rounding_name((dsv4_rounding)r)));
    if (ok && !json_object_set_new(f, "expected_by_rounding", by)) {
        by = NULL;
        json_t *out = json_pack("{s:o, s:{s:s, s:o, s:s, s:s}}", "files", f, "rounding", "default", "spec", "profiles",
                                list, "engine_key", "engine_rounding", "terms", "y_terms");
        if (out)
            return out;
        return NULL; /* json_pack's "o" took f and list */
    }
    json_decref(by);
    json_decref(list);
    json_decref(f);
    return NULL;
}

typedef struct {
    const dsv4_scenario *scn;
    const dsv4_scenario_case *sc;
    const dsv4_export_options *o;
    int rank; /* -1: world 1 */
    int64_t T, off;
} export_case;

/* Writes the case.json of one folder. */
static dsv4_status write_case_json(const char *path, const char *id, const export_case *e, const dsv4_ref_output *out,
                                   uint64_t hash, json_t *hashes, dsv4_error *err)
{
    const dsv4_scenario_case *sc = e->sc;
    char hs[32], name[600];
    snprintf(hs, sizeof hs, "%016llx", (unsigned long long)hash);
    if (e->rank >= 0)
        snprintf(name, sizeof name, "%s rank %d", sc->name, e->rank);
    else
        snprintf(name, sizeof name, "%s", sc->name);
    const dsv4_ref_stats *s = &out->stats;
    json_t *root = json_pack(
        "{s:s, s:i, s:s, s:s, s:{s:s, s:s}, s:o, s:i, s:I, s:I, s:I, s:s, s:o, s:[s, s], s:o, "
        "s:{s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I}}",
        "format", CASE_FORMAT, "version", DSV4_ENGINE_FORMAT_VERSION, "case", id, "name", name, "scenario", "name",
        dsv4_scenario_name(e->scn), "file", dsv4_scenario_path(e->scn), "rank",
        e->rank >= 0 ? json_integer(e->rank) : json_null(), "world", sc->n_ranks, "layer", (json_int_t)sc->config.layer,
        "tokens", (json_int_t)e->T, "seed", (json_int_t)sc->seed, "layout", dsv4_layout_name(e->o->layout), "config",
        config_json(&sc->config), "checks", "numerics", "routing", "tolerance", tolerance_json(), "reference", "hash",
        hs, "hash_by_rounding", hashes, "kept_slots", (json_int_t)s->kept_slots, "pruned_slots", (json_int_t)s->pruned_slots, "routed_g_clamped",
        (json_int_t)s->routed_g_clamped, "routed_u_clamped", (json_int_t)s->routed_u_clamped, "shared_g_clamped",
        (json_int_t)s->shared_g_clamped, "shared_u_clamped", (json_int_t)s->shared_u_clamped, "nonfinite_rows",
        (json_int_t)s->nonfinite_rows);
    if (root) { /* the case by what it sets: the scenario's title, with the rank */
        char title[1200];
        snprintf(title, sizeof title, "%s%s", sc->title ? sc->title : sc->name, name + strlen(sc->name));
        json_object_set_new(root, "title", json_string(title));
    }
    json_t *files = root ? files_json(export_profiles(e->o->roundings)) : NULL;
    if (!root || !files || json_object_update(root, files)) {
        json_decref(root);
        json_decref(files);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "cannot build case.json (out of memory)");
    }
    json_decref(files);
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (!text)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "cannot serialise case.json");
    dsv4_status st = dsv4_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return st;
}

/* One folder: model (generated, or linked from `model_src`), input slice, the reference's outputs, case.json. */
static dsv4_status export_one(const char *dir, const export_case *e, const dsv4_st_file *pool, const char *model_src,
                              char *model_out, size_t model_out_size, dsv4_error *err)
{
    const dsv4_config *cfg = &e->sc->config;
    const int64_t H = cfg->dim, K = cfg->n_activated, T = e->T;
    char id[512], folder[4096], path[4300];
    dsv4_export_case_id(e->sc->name, e->rank, id, sizeof id);
    snprintf(folder, sizeof folder, "%s/%s", dir, id);
    dsv4_status st = dsv4_run_ext_mkdir_p(folder, err);
    if (st)
        return st;
    /* the layer */
    snprintf(model_out, model_out_size, "%s/model.safetensors", folder);
    if (model_src)
        unlink(model_out); /* a file of an earlier export in the way of the link */
    if (!model_src || link(model_src, model_out) != 0) {
        dsv4_config gc = *cfg;
        dsv4_gen_options go;
        dsv4_gen_options_init(&go);
        go.seed = e->sc->seed;
        go.threads = e->o->threads;
        go.layout = e->o->layout;
        if (e->o->layout == DSV4_LAYOUT_STACKED) {
            /* HF's keys, bf16, the "model." prefix; the reference quantizes at load as the case says */
            gc.routed_format = gc.shared_format = DSV4_FORMAT_BF16;
            go.model_prefix = true;
        }
        if ((st = dsv4_gen_weights(&gc, &go, model_out, err)))
            return st;
    }
    /* the input slice */
    const dsv4_tensor_info *tx = dsv4_st_find(pool, "x"), *ti = dsv4_st_find(pool, "input_ids");
    if (!tx || !ti || tx->ndim != 2 || tx->shape[0] < e->off + T)
        return dsv4_seterr(err, DSV4_ERR_INTERNAL, "export", "the generated input pool is short");
    uint16_t *x = malloc((size_t)(T * H + 1) * 2), *y = malloc((size_t)(T * H + 1) * 2);
    int32_t *ids = malloc((size_t)(T + 1) * 4), *topk = malloc((size_t)(T * K + 1) * 4);
    float *w = malloc((size_t)(T * K + 1) * 4), *terms = malloc((size_t)(T * H + 1) * 4);
    dsv4_checkpoint *ck = NULL;
    dsv4_ref *ref = NULL;
    dsv4_st_writer *wr = NULL;
    json_t *hashes = json_object();
    if (!x || !y || !ids || !topk || !w || !terms || !hashes) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, id, "out of memory for %lld tokens", (long long)T);
        goto done;
    }
    memcpy(x, (const uint16_t *)tx->data + e->off * H, (size_t)(T * H) * 2);
    memcpy(ids, (const int32_t *)ti->data + e->off, (size_t)T * 4);
    int64_t sx[2] = {T, H}, si[1] = {T}, sk[2] = {T, K};
    snprintf(path, sizeof path, "%s/input.safetensors", folder);
    if ((st = dsv4_st_writer_create(&wr, err)) || (st = dsv4_st_writer_add(wr, "x", DSV4_DTYPE_BF16, 2, sx, x, err)) ||
        (st = dsv4_st_writer_add(wr, "input_ids", DSV4_DTYPE_I32, 1, si, ids, err)) ||
        (st = dsv4_st_writer_write(wr, path, NULL, NULL, err)))
        goto done;
    dsv4_st_writer_free(wr);
    wr = NULL;
    /* the reference on it, at each profile asked for; spec last, so `out` holds its statistics */
    dsv4_ref_output out;
    memset(&out, 0, sizeof out);
    out.y = y;
    out.topk_ids = topk;
    out.topk_weights = w;
    if ((st = dsv4_checkpoint_open(model_out, &ck, err)) || (st = dsv4_ref_create(cfg, ck, e->o->threads, &ref, err)))
        goto done;
    char nexp[32];
    snprintf(nexp, sizeof nexp, "%lld", (long long)cfg->n_routed_experts);
    unsigned mask = export_profiles(e->o->roundings);
    uint64_t hash = 0;
    for (int r = DSV4_ROUNDING_COUNT - 1; r >= 0; r--) {
        if (!(mask & (1u << r)))
            continue;
        const char *rname = dsv4_rounding_name((dsv4_rounding)r);
        char hs[32];
        if ((st = dsv4_ref_set_rounding(ref, (dsv4_rounding)r, err)) ||
            (st = dsv4_ref_forward_terms(ref, T, x, ids, &out, terms, err)))
            goto done;
        hash = dsv4_ref_hash(cfg, T, &out);
        snprintf(hs, sizeof hs, "%016llx", (unsigned long long)hash);
        if (json_object_set_new(hashes, rname, json_string(hs))) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, id, "out of memory");
            goto done;
        }
        snprintf(path, sizeof path, "%s/%s", folder, expected_file((dsv4_rounding)r));
        if ((st = dsv4_st_writer_create(&wr, err)) ||
            (st = dsv4_st_writer_add(wr, "y", DSV4_DTYPE_BF16, 2, sx, y, err)) ||
            (st = dsv4_st_writer_add(wr, "topk_ids", DSV4_DTYPE_I32, 2, sk, topk, err)) ||
            (st = dsv4_st_writer_add(wr, "topk_weights", DSV4_DTYPE_F32, 2, sk, w, err)) ||
            (st = dsv4_st_writer_add(wr, "y_terms", DSV4_DTYPE_F32, 2, sx, terms, err)) ||
            (st = dsv4_st_writer_set_metadata(wr, "n_routed_experts", nexp, err)) ||
            (st = dsv4_st_writer_set_metadata(wr, "rounding", rname, err)) ||
            (st = dsv4_st_writer_write(wr, path, NULL, NULL, err)))
            goto done;
        dsv4_st_writer_free(wr);
        wr = NULL;
    }
    snprintf(path, sizeof path, "%s/case.json", folder);
    st = write_case_json(path, id, e, &out, hash, hashes, err);
    hashes = NULL; /* json_pack took it */
done:
    json_decref(hashes);
    dsv4_st_writer_free(wr);
    dsv4_ref_free(ref);
    dsv4_checkpoint_close(ck);
    free(x), free(y), free(ids), free(topk), free(w), free(terms);
    return st;
}

dsv4_status dsv4_export_scenario(const dsv4_scenario *scn, const char *dir, const dsv4_export_options *opt,
                                 size_t *written, size_t *left_out, dsv4_error *err)
{
    dsv4_export_options o;
    dsv4_export_options_init(&o);
    if (!scn || !dir || !dir[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "scenario and folder must be given");
    /* the size before `roundings` (callers built against format version 1) still works */
    if (opt && opt->struct_size != sizeof *opt && opt->struct_size != offsetof(dsv4_export_options, roundings))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "options struct_size %u unknown (expected %zu)",
                           opt->struct_size, sizeof *opt);
    if (opt)
        memcpy(&o, opt, opt->struct_size);
    opt = &o;
    if (opt->roundings >> DSV4_ROUNDING_COUNT)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "roundings mask 0x%x names no profile past bit %d",
                           opt->roundings, DSV4_ROUNDING_COUNT - 1);
    if (opt->layout != DSV4_LAYOUT_SPLIT && opt->layout != DSV4_LAYOUT_STACKED)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "layout %d is not split or stacked", (int)opt->layout);
    if (opt->threads < 1 || opt->threads > 256)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "threads %d is outside [1, 256]", opt->threads);
    dsv4_status st = dsv4_run_ext_mkdir_p(dir, err);
    if (st)
        return st;
    size_t nw = 0, nl = 0;
    char pool_path[4200];
    snprintf(pool_path, sizeof pool_path, "%s/.input-pool.safetensors", dir);
    for (size_t i = 0; i < dsv4_scenario_count(scn) && !st; i++) {
        const dsv4_scenario_case *sc = dsv4_scenario_get(scn, i);
        if (opt->filter && !strstr(sc->name, opt->filter))
            continue;
        if (sc->expect != DSV4_EXPECT_PASS || sc->config_status != DSV4_OK) {
            nl++;
            continue;
        }
        int world = sc->n_ranks;
        int64_t *off = calloc((size_t)world, sizeof *off);
        if (!off)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, "export", "out of memory");
        dsv4_run_ext_slices(&sc->topology, sc->tokens, world, off);
        int64_t rows = 0;
        for (int r = 0; r < world; r++)
            rows = off[r] + sc->tokens[r] > rows ? off[r] + sc->tokens[r] : rows;
        /* The case's tokens as `run` slices them: rank r's rows [off[r], off[r] + tokens[r]) of one pool. */
        dsv4_gen_options go;
        dsv4_gen_options_init(&go);
        go.seed = sc->seed;
        dsv4_st_file *pool = NULL;
        st = dsv4_gen_input(&sc->config, &go, rows, pool_path, err);
        if (!st)
            st = dsv4_st_open(pool_path, &pool, err);
        char first_model[4400] = "", model[4400];
        for (int r = 0; r < world && !st; r++) {
            export_case e = {scn, sc, opt, world == 1 ? -1 : r, sc->tokens[r], off[r]};
            st = export_one(dir, &e, pool, first_model[0] ? first_model : NULL, model, sizeof model, err);
            if (!st && !first_model[0])
                snprintf(first_model, sizeof first_model, "%s", model);
            nw += !st;
        }
        dsv4_st_close(pool);
        unlink(pool_path);
        free(off);
    }
    if (written)
        *written = nw;
    if (left_out)
        *left_out = nl;
    return st;
}

/* ---------------- check ---------------- */

static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The case folders of dir (those holding case.json), sorted. */
static dsv4_status list_cases(const char *dir, char ***names, size_t *n, dsv4_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return dsv4_seterr(err, DSV4_ERR_IO, dir, "cannot read the cases folder: %s", strerror(errno));
    char **v = NULL;
    size_t k = 0, cap = 0;
    struct dirent *de;
    dsv4_status st = DSV4_OK;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char p[4600];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s/case.json", dir, de->d_name);
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        char **nv = dsv4_grow(v, &cap, k + 1, sizeof *nv, 32);
        if (!nv) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
            break;
        }
        v = nv;
        if (!(v[k] = strdup(de->d_name))) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
            break;
        }
        k++;
    }
    closedir(d);
    if (!st && k == 0)
        st = dsv4_seterr(err, DSV4_ERR_NOT_FOUND, dir,
                         "no case folder (a folder holding case.json, as dsv4moe export writes them)");
    if (st) {
        for (size_t i = 0; i < k; i++)
            free(v[i]);
        free(v);
        return st;
    }
    qsort(v, k, sizeof *v, str_cmp);
    *names = v;
    *n = k;
    return DSV4_OK;
}

typedef struct {
    json_t *root;
    const char *name, *title, *scn_name, *scn_file;
    dsv4_config cfg;
    int64_t T;
    uint64_t seed;
    const char *expected[DSV4_ROUNDING_COUNT]; /* file names in the folder; NULL: not exported */
} case_desc;

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
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), CASE_FORMAT))
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "\"format\" is not \"%s\"", CASE_FORMAT);
    if (json_is_integer(ver) && json_integer_value(ver) == 1)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path,
                           "\"version\" 1: exported before the rounding profiles (SPEC.md section 10); version %d "
                           "adds each profile's expected file with y_terms, which check needs: export the cases again",
                           DSV4_ENGINE_FORMAT_VERSION);
    if (!json_is_integer(ver) || json_integer_value(ver) != DSV4_ENGINE_FORMAT_VERSION)
        return dsv4_seterr(err, DSV4_ERR_FORMAT, path, "\"version\" must be %d (this tool's format version)",
                           DSV4_ENGINE_FORMAT_VERSION);
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
        if (!dsv4_compare_routing_tensors(cd->cfg.n_routed_experts, io, wo ? wo : NULL, o->sentinel, ie,
                                          wo ? we : NULL, &rm, rmsg, sizeof rmsg)) {
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
    if (ok && rok)
        snprintf(msg, sizeof msg, "%s; y %s; %s", head, T ? line : "nothing compared (0 tokens)", rline);
    else
        snprintf(msg, sizeof msg, "%s; %s%s%s; y %s; %s", head, why, why[0] && rwhy[0] ? "; " : "", rwhy, line, rline);
    dsv4_run_ext_check(c, NUM, ok && rok ? DSV4_RESULT_PASS : DSV4_RESULT_FAIL, msg);
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
    if (opt && opt->struct_size != sizeof *opt && opt->struct_size != offsetof(dsv4_check_options, rounding))
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
