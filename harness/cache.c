/* The scenario harness's data cache and the backend's copy of a layer (harness/cache.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "harness/cache.h"
#include "core/err.h"
#include "core/fileio.h"
#include "core/hash.h"
#include "dsv4moe/gen.h"

#define RUN_CACHE_VERSION "dsv4moe-cache-1"

/* The config fields the generated weights depend on, with the seed. */
static uint64_t weights_key(const dsv4_config *c, uint64_t seed, char *desc, size_t n)
{
    snprintf(desc, n,
             RUN_CACHE_VERSION " weights H=%lld I=%lld E=%lld K=%lld S=%lld hash=%lld V=%lld L=%lld layer=%lld "
                               "topp=%d pred=%d routed=%d shared=%d wscale=%d seed=%llu",
             (long long)c->dim, (long long)c->moe_inter_dim, (long long)c->n_routed_experts,
             (long long)c->n_activated, (long long)c->n_shared_experts, (long long)c->n_hash_layers,
             (long long)c->vocab_size, (long long)c->n_layers, (long long)c->layer, c->top_p < 1.0f,
             (int)c->top_p_predictor, (int)c->routed_format, (int)c->shared_format, (int)c->weight_scale,
             (unsigned long long)seed);
    return dsv4_fnv1a_str(DSV4_FNV_OFFSET, desc);
}

static uint64_t input_key(const dsv4_config *c, uint64_t seed)
{
    char desc[256];
    snprintf(desc, sizeof desc, RUN_CACHE_VERSION " input H=%lld V=%lld seed=%llu", (long long)c->dim,
             (long long)c->vocab_size, (unsigned long long)seed);
    return dsv4_fnv1a_str(DSV4_FNV_OFFSET, desc);
}

/* Opens the cached weights, generating them when absent or unreadable. */
dsv4_status dsv4_h_open_weights(const char *dir, const dsv4_config *cfg, uint64_t seed, int threads,
                                dsv4_checkpoint **ck, dsv4_error *err)
{
    char desc[512], path[4200];
    uint64_t h = weights_key(cfg, seed, desc, sizeof desc);
    snprintf(path, sizeof path, "%s/w-%016llx.safetensors", dir, (unsigned long long)h);
    if (access(path, R_OK) == 0 && dsv4_checkpoint_open(path, ck, NULL) == DSV4_OK)
        return DSV4_OK;
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.seed = seed;
    o.threads = threads;
    dsv4_status st = dsv4_gen_weights(cfg, &o, path, err);
    if (st)
        return st;
    return dsv4_checkpoint_open(path, ck, err);
}

/* Opens the cached input pool of at least `tokens` tokens. */
dsv4_status dsv4_h_open_input(const char *dir, const dsv4_config *cfg, uint64_t seed, int64_t tokens,
                              dsv4_st_file **in, dsv4_error *err)
{
    char path[4200];
    /* Pools grow in powers of two from 256 tokens, so cases of different sizes share one file
       (an element depends only on (seed, index), so a longer pool starts with the shorter one). */
    int64_t pool = 256;
    while (pool < tokens)
        pool *= 2;
    snprintf(path, sizeof path, "%s/in-%016llx-%lld.safetensors", dir, (unsigned long long)input_key(cfg, seed),
             (long long)pool);
    if (access(path, R_OK) == 0 && dsv4_st_open(path, in, NULL) == DSV4_OK)
        return DSV4_OK;
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.seed = seed;
    dsv4_status st = dsv4_gen_input(cfg, &o, pool, path, err);
    if (st)
        return st;
    return dsv4_st_open(path, in, err);
}

/* ---------------- the backend's copy of the layer (key `checkpoint`) ---------------- */

bool dsv4_h_custom_checkpoint(const dsv4_scenario_case *sc)
{
    return sc->checkpoint.layout == DSV4_LAYOUT_STACKED || sc->checkpoint.shards > 1;
}

void dsv4_h_checkpoint_words(const dsv4_scenario_case *sc, char *buf, size_t n)
{
    if (sc->checkpoint.shards > 1)
        snprintf(buf, n, "%s layout in %d files through model.safetensors.index.json, routed experts %s",
                 dsv4_layout_name(sc->checkpoint.layout), sc->checkpoint.shards,
                 sc->checkpoint.experts_last ? "last" : "first");
    else
        snprintf(buf, n, "%s layout in one file", dsv4_layout_name(sc->checkpoint.layout));
}

static bool routed_expert_key(const char *name) { return strstr(name, ".experts.") && !strstr(name, "shared_experts"); }

/* Writes the tensors of `src` as `shards` files and an index into the folder `dir` (the index last, so
   a folder with an index is complete). The routed experts' tensors go round-robin into shards - 1 files
   (the first ones, or the last ones when experts_last), every other tensor into the remaining one. */
static dsv4_status write_shards(const char *src_path, const char *dir, int shards, bool experts_last, dsv4_error *err)
{
    dsv4_st_file *src = NULL;
    dsv4_status st = dsv4_st_open(src_path, &src, err);
    if (st)
        return st;
    size_t n = dsv4_st_count(src);
    int nexp = shards - 1, other = experts_last ? 0 : shards - 1;
    int *file_of = calloc(n + 1, sizeof *file_of);
    dsv4_st_writer **w = calloc((size_t)shards, sizeof *w);
    json_t *root = json_object(), *map = json_object();
    char path[4700], name[64];
    if (!file_of || !w || !root || !map) {
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
        goto done;
    }
    json_object_set(root, "weight_map", map);
    size_t rr = 0;
    for (size_t i = 0; i < n; i++) {
        const dsv4_tensor_info *t = dsv4_st_tensor(src, i);
        file_of[i] = routed_expert_key(t->name) ? (int)(rr++ % (size_t)nexp) + (experts_last ? 1 : 0) : other;
    }
    for (size_t i = 0; i < n && !st; i++) {
        const dsv4_tensor_info *t = dsv4_st_tensor(src, i);
        int f = file_of[i];
        if (!w[f] && (st = dsv4_st_writer_create(&w[f], err)))
            break;
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, shards);
        if (!(st = dsv4_st_writer_add(w[f], t->name, t->dtype, t->ndim, t->shape, t->data, err)) &&
            json_object_set_new(map, t->name, json_string(name)))
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, t->name, "out of memory while building the shard index");
    }
    for (int f = 0; f < shards && !st; f++) {
        if (!w[f])
            continue;
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, f + 1, shards);
        st = dsv4_st_writer_write(w[f], path, NULL, NULL, err);
    }
    if (!st) {
        char *text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        st = text ? dsv4_write_file_atomic(path, text, strlen(text), err)
                  : dsv4_seterr(err, DSV4_ERR_NOMEM, path, "cannot serialise the index");
        free(text);
    }
done:
    for (int f = 0; w && f < shards; f++)
        dsv4_st_writer_free(w[f]);
    free(w);
    free(file_of);
    json_decref(map);
    json_decref(root);
    dsv4_st_close(src);
    return st;
}

/* The path of the backend's copy of the layer (generated or written on demand into the cache). */
dsv4_status dsv4_h_backend_checkpoint_path(const char *dir, const dsv4_config *cfg, const dsv4_scenario_case *sc,
                                           int threads, char *src, size_t srcn, char *out, size_t outn,
                                           dsv4_error *err)
{
    char desc[512];
    bool stacked = sc->checkpoint.layout == DSV4_LAYOUT_STACKED;
    /* The stacked layout holds the same layer in bf16 (dsv4moe/gen.h); the backend quantizes it at load. */
    dsv4_config gc = *cfg;
    if (stacked)
        gc.routed_format = gc.shared_format = DSV4_FORMAT_BF16;
    uint64_t h = weights_key(&gc, sc->seed, desc, sizeof desc);
    snprintf(src, srcn, "%s/w-%016llx%s.safetensors", dir, (unsigned long long)h, stacked ? "-stacked" : "");
    dsv4_status st;
    if (access(src, R_OK) != 0) {
        dsv4_gen_options o;
        dsv4_gen_options_init(&o);
        o.seed = sc->seed;
        o.threads = threads;
        o.layout = stacked ? DSV4_LAYOUT_STACKED : DSV4_LAYOUT_SPLIT;
        if ((st = dsv4_gen_weights(&gc, &o, src, err)))
            return st;
    }
    if (sc->checkpoint.shards <= 1) {
        snprintf(out, outn, "%s", src);
        return DSV4_OK;
    }
    char idx[4700];
    snprintf(out, outn, "%s/ck-%016llx-%s-%d-%s", dir, (unsigned long long)h, dsv4_layout_name(sc->checkpoint.layout),
             sc->checkpoint.shards, sc->checkpoint.experts_last ? "experts-last" : "experts-first");
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", out);
    if (access(idx, R_OK) == 0)
        return DSV4_OK;
    if ((st = dsv4_mkdir_p(out, err)))
        return st;
    return write_shards(src, out, sc->checkpoint.shards, sc->checkpoint.experts_last, err);
}

