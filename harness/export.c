/*
 * dsv4_export_scenario (dsv4moe_harness/engines.h, docs/engines.md): the cases of a scenario matrix as
 * self-contained folders an outside engine runs, each built in the run's temporary folder and
 * renamed into place when complete, and the export's manifest written last.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "compare/engines_int.h"
#include "core/err.h"
#include "core/fileio.h"
#include "compare/run_ext.h"
#include "dsv4moe_harness/engines.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/ref.h"

void dsv4_export_options_init(dsv4_export_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->layout = DSV4_LAYOUT_SPLIT;
    opt->threads = 2;
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
        "{s:s, s:s, s:f, s:f, s:f, s:f, s:s, s:f, s:s, s:{s:s, s:f, s:f}, s:{s:s, s:s, s:f, s:f, s:f}}", "rule",
        dsv4_tolerance_name(DSV4_TOL_OUTSIDE), "words", dsv4_tolerance_describe(DSV4_TOL_OUTSIDE),
        "deepgemm_diff_below", 1e-3, "atol", DSV4_COMPARE_ATOL, "rtol", DSV4_COMPARE_RTOL, "terms_scale",
        DSV4_COMPARE_TERMS_SCALE, "beyond", "|a - b| > atol + rtol |b| + terms_scale y_terms", "beyond_share_max", 0.005,
        "ulp", "reported, not judged (bf16 ULPs of y)", "fp8_mma", "rule", dsv4_tolerance_name(DSV4_TOL_OUTSIDE_FP8),
        "deepgemm_diff_below", 1e-3, "beyond_share_max", 0.02, "routing", "ids",
        "kept experts compared as sets per token", "reference_sentinel", "E", "weights_atol", DSV4_ROUTING_WEIGHT_ATOL,
        "weights_rtol", DSV4_ROUTING_WEIGHT_RTOL, "weights_rtol_bf16_ops", DSV4_ROUTING_WEIGHT_RTOL_BF16);
    return t;
}

/* The profiles an export writes: spec always, and those of the mask (0: all). */
static unsigned export_profiles(unsigned mask) { return (mask ? mask : (1u << DSV4_ROUNDING_COUNT) - 1) | 1u; }

/* case.json's "files" and "rounding" members for the profiles of `mask` (export_profiles). */
static json_t *files_json(unsigned mask)
{
    json_t *by = json_object(), *list = json_array();
    json_t *f = json_pack("{s:s, s:s, s:s}", "model", "model.safetensors", "input", "input.safetensors", "expected",
                          dsv4_h_expected_file(DSV4_ROUNDING_SPEC));
    bool ok = by && list && f;
    for (int r = 0; ok && r < DSV4_ROUNDING_COUNT; r++)
        if (mask & (1u << r))
            ok = !json_object_set_new(by, dsv4_rounding_name((dsv4_rounding)r), json_string(dsv4_h_expected_file((dsv4_rounding)r))) &&
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

/* The contract's workspace bound of the case (DSV4_WORKSPACE_FACTOR in dsv4moe_harness/engines.h): the
   planner's figure for one eager step of this rank's tokens (a padded case's bucket) on the CUDA backend, with the scenario's
   topology and budget; -1 when the planner refuses that topology (the case then has no bound). */
static int64_t workspace_bound(const export_case *e)
{
    dsv4_topology t = e->sc->topology;
    t.rank = e->rank >= 0 ? e->rank : 0;
    t.backend = DSV4_BACKEND_CUDA;
    t.cuda_graph = false;
    dsv4_plan *p = NULL;
    if (dsv4_plan_create(&e->sc->config, &t, &e->sc->budget, &p, NULL))
        return -1;
    uint64_t b = dsv4_plan_workspace_bytes(p, e->sc->pad_to ? e->sc->pad_to : e->T, false);
    dsv4_plan_free(p);
    return b > (uint64_t)INT64_MAX ? -1 : (int64_t)b;
}

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
        "format", DSV4_H_CASE_FORMAT, "version", DSV4_ENGINE_FORMAT_VERSION, "case", id, "name", name, "scenario", "name",
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
    int64_t wb = workspace_bound(e);
    json_t *mem = json_pack("{s:o, s:f, s:s}", "workspace_bound_bytes", wb >= 0 ? json_integer(wb) : json_null(),
                            "factor", DSV4_WORKSPACE_FACTOR, "planned_as",
                            "the planner's workspace of one eager step of these tokens on this rank, CUDA backend");
    if (root && e->sc->pad_to &&
        json_object_set_new(root, "padded",
                            json_pack("{s:I, s:s, s:s, s:s}", "bucket", (json_int_t)e->sc->pad_to, "x",
                                      "x_padded: x, then NaN (bf16 0x7FC0) in every padding row", "input_ids",
                                      "input_ids_padded: input_ids, then vocab_size and -1 alternating",
                                      "judged", "the first tokens rows of an output of the bucket's rows")))
        json_decref(root), root = NULL;
    /* the topology the case's rank belongs to: an engine runs a tp > 1 case with that many tensor-parallel
       ranks (every rank of a tp group has the same tokens and the whole layer's output) */
    const dsv4_topology *tp = &e->sc->topology;
    if (root && json_object_set_new(root, "topology",
                                    json_pack("{s:i, s:i, s:i, s:i}", "world", tp->world_size, "tp", tp->tp, "dp",
                                              tp->dp, "ep", tp->ep)))
        json_decref(root), root = NULL;
    if (root && (!mem || json_object_set_new(root, "memory", mem))) {
        json_decref(root);
        root = NULL;
    } else if (!root) {
        json_decref(mem);
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
    char id[512], folder[4800], path[5000];
    dsv4_export_case_id(e->sc->name, e->rank, id, sizeof id);
    snprintf(folder, sizeof folder, "%s/%s", dir, id);
    dsv4_status st = dsv4_mkdir_p(folder, err);
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
    uint16_t *xp = NULL;
    int32_t *ip = NULL;
    json_t *hashes = json_object();
    if (!x || !y || !ids || !topk || !w || !terms || !hashes) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, id, "out of memory for %lld tokens", (long long)T);
        goto done;
    }
    memcpy(x, (const uint16_t *)tx->data + e->off * H, (size_t)(T * H) * 2);
    memcpy(ids, (const int32_t *)ti->data + e->off, (size_t)T * 4);
    int64_t sx[2] = {T, H}, si[1] = {T}, sk[2] = {T, K};
    /* a padded case: the tokens inside a bucket of B rows, the rest hostile padding (NaN x; input ids
       V and -1, alternating: both out of range) */
    int64_t B = e->sc->pad_to, sxp[2] = {B, H}, sip[1] = {B};
    if (B && (!(xp = malloc((size_t)(B * H) * 2)) || !(ip = malloc((size_t)B * 4)))) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, id, "out of memory for a bucket of %lld rows", (long long)B);
        goto done;
    }
    for (int64_t r = 0; r < B; r++) {
        for (int64_t h = 0; h < H; h++)
            xp[r * H + h] = r < T ? x[r * H + h] : (uint16_t)0x7FC0;
        ip[r] = r < T ? ids[r] : (r - T) % 2 ? -1 : (int32_t)cfg->vocab_size;
    }
    snprintf(path, sizeof path, "%s/input.safetensors", folder);
    if ((st = dsv4_st_writer_create(&wr, err)) || (st = dsv4_st_writer_add(wr, "x", DSV4_DTYPE_BF16, 2, sx, x, err)) ||
        (st = dsv4_st_writer_add(wr, "input_ids", DSV4_DTYPE_I32, 1, si, ids, err)) ||
        (B && (st = dsv4_st_writer_add(wr, "x_padded", DSV4_DTYPE_BF16, 2, sxp, xp, err))) ||
        (B && (st = dsv4_st_writer_add(wr, "input_ids_padded", DSV4_DTYPE_I32, 1, sip, ip, err))) ||
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
        snprintf(path, sizeof path, "%s/%s", folder, dsv4_h_expected_file((dsv4_rounding)r));
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
    free(x), free(y), free(ids), free(topk), free(w), free(terms), free(xp), free(ip);
    return st;
}

/* The most characters of a case id (a folder name; file systems take 255 bytes, and the staging
   names add a few). */
#define CASE_ID_MAX 200

/* Removes the run's staging folder: its files and, one level down, its case folders' files (all
   created by this run in a folder made by mkdtemp; links are removed, never followed). */
static void remove_stage(const char *stage)
{
    DIR *d = opendir(stage);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char p[4600];
        snprintf(p, sizeof p, "%s/%s", stage, de->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            DIR *d2 = opendir(p);
            struct dirent *e2;
            while (d2 && (e2 = readdir(d2))) {
                char q[4900];
                snprintf(q, sizeof q, "%s/%s", p, e2->d_name);
                if (strcmp(e2->d_name, ".") && strcmp(e2->d_name, ".."))
                    unlink(q);
            }
            if (d2)
                closedir(d2);
            rmdir(p);
        } else {
            unlink(p);
        }
    }
    if (d)
        closedir(d);
    rmdir(stage);
}

/* Moves the complete case folder stage/id into dir/id; a folder of an earlier export there is
   replaced (moved aside into the stage first, removed with it). */
static dsv4_status place_case(const char *dir, const char *stage, const char *id, dsv4_error *err)
{
    char from[4600], to[4600], old[4700];
    snprintf(from, sizeof from, "%s/%s", stage, id);
    snprintf(to, sizeof to, "%s/%s", dir, id);
    snprintf(old, sizeof old, "%s/old.%s", stage, id);
    struct stat sb;
    if (lstat(to, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return dsv4_seterr(err, DSV4_ERR_IO, to, "is %s: an export refuses to write through or over it",
                               dsv4_file_kind(sb.st_mode));
        if (rename(to, old) != 0)
            return dsv4_seterr(err, DSV4_ERR_IO, to, "cannot move the earlier export's folder aside: %s",
                               strerror(errno));
    }
    if (rename(from, to) != 0)
        return dsv4_seterr(err, DSV4_ERR_IO, to, "cannot move the case folder into place: %s", strerror(errno));
    return dsv4_fsync_dir(dir, err);
}

/* One case (or rank) of the run, found before anything is written. */
typedef struct {
    size_t i;          /* index in the scenario */
    int rank;          /* -1: world 1 */
    char id[CASE_ID_MAX + 16];
} planned;

/* Every case id of the run: checked for length, for collisions (two cases whose names sanitize to one id)
   and against what is in dir (a link or a non-folder in a case's place is refused). */
static dsv4_status plan_ids(const dsv4_scenario *scn, const char *dir, const dsv4_export_options *opt, planned **out,
                            size_t *n, size_t *left_out, dsv4_error *err)
{
    planned *p = NULL;
    size_t k = 0, cap = 0, nl = 0;
    dsv4_status st = DSV4_OK;
    for (size_t i = 0; i < dsv4_scenario_count(scn) && !st; i++) {
        const dsv4_scenario_case *sc = dsv4_scenario_get(scn, i);
        if (opt->filter && !strstr(sc->name, opt->filter))
            continue;
        if (sc->expect != DSV4_EXPECT_PASS || sc->config_status != DSV4_OK) {
            nl++;
            continue;
        }
        for (int r = 0; r < sc->n_ranks && !st; r++) {
            if (k == cap) {
                cap = cap ? 2 * cap : 32;
                planned *np = realloc(p, cap * sizeof *np);
                if (!np) {
                    st = dsv4_seterr(err, DSV4_ERR_NOMEM, "export", "out of memory");
                    break;
                }
                p = np;
            }
            planned *q = &p[k];
            q->i = i;
            q->rank = sc->n_ranks == 1 ? -1 : r;
            char full[2048];
            dsv4_export_case_id(sc->name, q->rank, full, sizeof full);
            if (strlen(full) > CASE_ID_MAX) {
                st = dsv4_seterr(err, DSV4_ERR_FORMAT, sc->name,
                                 "the case id '%.60s...' is %zu characters; a case folder's name is at most %d",
                                 full, strlen(full), CASE_ID_MAX);
                break;
            }
            memcpy(q->id, full, strlen(full) + 1); /* at most CASE_ID_MAX + 1 bytes: checked above */
            for (size_t j = 0; j < k && !st; j++)
                if (!strcmp(p[j].id, q->id))
                    st = dsv4_seterr(err, DSV4_ERR_FORMAT, sc->name,
                                     "its case id '%s' is also the id of case '%s' (names differing only in characters "
                                     "a folder name cannot hold): rename one",
                                     q->id, dsv4_scenario_get(scn, p[j].i)->name);
            char path[4600];
            struct stat sb;
            snprintf(path, sizeof path, "%s/%s", dir, q->id);
            if (!st && lstat(path, &sb) == 0 && !S_ISDIR(sb.st_mode))
                st = dsv4_seterr(err, DSV4_ERR_IO, path, "is %s: an export refuses to write through or over it",
                                 dsv4_file_kind(sb.st_mode));
            k += !st;
        }
    }
    if (st) {
        free(p);
        return st;
    }
    *out = p;
    *n = k;
    *left_out = nl;
    return DSV4_OK;
}

/* The caller's options (NULL: the defaults) checked and copied into *o. */
static dsv4_status export_options(const dsv4_export_options *opt, dsv4_export_options *o, dsv4_error *err)
{
    dsv4_export_options_init(o);
    /* the sizes before `roundings` (callers built against format version 1) and before `progress` still work */
    if (opt && opt->struct_size != sizeof *opt && opt->struct_size != offsetof(dsv4_export_options, roundings) &&
        opt->struct_size != offsetof(dsv4_export_options, progress))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "options struct_size %u unknown (expected %zu)",
                           opt->struct_size, sizeof *opt);
    if (opt)
        memcpy(o, opt, opt->struct_size);
    if (o->roundings >> DSV4_ROUNDING_COUNT)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "roundings mask 0x%x names no profile past bit %d",
                           o->roundings, DSV4_ROUNDING_COUNT - 1);
    if (o->layout != DSV4_LAYOUT_SPLIT && o->layout != DSV4_LAYOUT_STACKED)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "layout %d is not split or stacked", (int)o->layout);
    if (o->threads < 1 || o->threads > 256)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "threads %d is outside [1, 256]", o->threads);
    return DSV4_OK;
}

dsv4_status dsv4_export_check_ids(const dsv4_scenario *const *scns, size_t n, const char *dir,
                                  const dsv4_export_options *opt, dsv4_error *err)
{
    dsv4_export_options o;
    dsv4_status st = export_options(opt, &o, err);
    if (st)
        return st;
    if (!scns || !dir || !dir[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "scenarios and folder must be given");
    planned **plan = calloc(n + 1, sizeof *plan);
    size_t *np = calloc(n + 1, sizeof *np), nl;
    if (!plan || !np)
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, "export", "out of memory");
    for (size_t f = 0; f < n && !st; f++) {
        if (!scns[f])
            st = dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "scenario %zu is NULL", f);
        else
            st = plan_ids(scns[f], dir, &o, &plan[f], &np[f], &nl, err); /* within the file, and dir */
        for (size_t g = 0; g < f && !st; g++) /* against every earlier file */
            for (size_t a = 0; a < np[f] && !st; a++)
                for (size_t b = 0; b < np[g] && !st; b++)
                    if (!strcmp(plan[f][a].id, plan[g][b].id))
                        st = dsv4_seterr(err, DSV4_ERR_FORMAT, dsv4_scenario_path(scns[f]),
                                         "case '%s' has the case id '%s' of case '%s' of %s: rename one",
                                         dsv4_scenario_get(scns[f], plan[f][a].i)->name, plan[f][a].id,
                                         dsv4_scenario_get(scns[g], plan[g][b].i)->name, dsv4_scenario_path(scns[g]));
    }
    for (size_t f = 0; plan && f < n; f++)
        free(plan[f]);
    free(plan);
    free(np);
    return st;
}

dsv4_status dsv4_export_scenario(const dsv4_scenario *scn, const char *dir, const dsv4_export_options *opt,
                                 size_t *written, size_t *left_out, dsv4_error *err)
{
    dsv4_export_options o;
    if (written)
        *written = 0;
    if (left_out)
        *left_out = 0;
    if (!scn || !dir || !dir[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "export", "scenario and folder must be given");
    dsv4_status st = export_options(opt, &o, err);
    if (st)
        return st;
    opt = &o;
    st = dsv4_mkdir_p(dir, err);
    if (st)
        return st;
    planned *plan = NULL;
    size_t np = 0, nl = 0, nw = 0;
    if ((st = plan_ids(scn, dir, opt, &plan, &np, &nl, err)))
        return st;
    /* The manifest of an earlier export stops vouching for the folder now: one that fails leaves none. */
    char man[4200], stage[4200];
    snprintf(man, sizeof man, "%s/%s", dir, DSV4_H_MANIFEST);
    struct stat sb;
    if (lstat(man, &sb) == 0 && (!S_ISREG(sb.st_mode) || unlink(man) != 0)) {
        st = dsv4_seterr(err, DSV4_ERR_IO, man, "is %s and cannot be replaced", dsv4_file_kind(sb.st_mode));
        free(plan);
        return st;
    }
    /* Each case is built in the run's staging folder and renamed into place when complete. */
    snprintf(stage, sizeof stage, "%s/.export-XXXXXX", dir);
    if (!mkdtemp(stage)) {
        st = dsv4_seterr(err, DSV4_ERR_IO, dir, "cannot create a staging folder: %s", strerror(errno));
        free(plan);
        return st;
    }
    char pool_path[4400];
    snprintf(pool_path, sizeof pool_path, "%s/input-pool.safetensors", stage);
    for (size_t a = 0; a < np && !st;) {
        const dsv4_scenario_case *sc = dsv4_scenario_get(scn, plan[a].i);
        int world = sc->n_ranks;
        int64_t *off = calloc((size_t)world, sizeof *off);
        if (!off) {
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, "export", "out of memory");
            break;
        }
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
        char first_model[4700] = "", model[4900];
        for (int r = 0; r < world && !st; r++, a++) {
            export_case e = {scn, sc, opt, world == 1 ? -1 : r, sc->tokens[r], off[r]};
            st = export_one(stage, &e, pool, first_model[0] ? first_model : NULL, model, sizeof model, err);
            if (!st)
                st = place_case(dir, stage, plan[a].id, err);
            if (!st && !first_model[0]) /* the ranks of a case share the layer: linked to the first one placed */
                snprintf(first_model, sizeof first_model, "%s/%s/model.safetensors", dir, plan[a].id);
            nw += !st;
            if (!st && o.progress)
                o.progress(o.progress_user, nw, np, plan[a].id);
        }
        dsv4_st_close(pool);
        unlink(pool_path);
        free(off);
    }
    remove_stage(stage);
    free(plan);
    if (!st)
        st = dsv4_h_manifest_write(dir, err);
    if (written)
        *written = nw;
    if (left_out)
        *left_out = nl;
    return st;
}
