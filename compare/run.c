/*
 * The scenario runner (dsv4moe/run.h): data generation with a cache, the
 * checks of every case, and the JSON and JUnit reports. The rules of each
 * check are in docs/scenarios.md ("Checks").
 */
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "fileio.h"
#include "strbuf.h"
#include "dsv4moe/dist.h"
#include "dsv4moe/engines.h"
#include "dsv4moe/symmetry.h"
#include "dsv4moe/backend.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/ref.h"
#include "dsv4moe/run.h"
#include "err.h"
#include "faults.h"
#include "run_ext.h"

#define RUN_CACHE_VERSION "dsv4moe-cache-1"
/* The clamp must be seen once a case has this many tokens (see docs/scenarios.md). */
#define CLAMP_MIN_TOKENS 8
/* Tokens of the determinism check when rank 0 has none. */
#define DETERMINISM_TOKENS 16

/* ---------------- results ---------------- */

typedef struct {
    dsv4_result r;
    char *detail;
} check_rec;

struct dsv4_case_result {
    char *name;
    char *scn_name, *scn_path; /* the scenario's name and path */
    size_t scn;   /* index into results->scns */
    size_t index; /* in its scenario */
    int line, col, explicit_index;
    int *axis_index; /* [n_axes of its scenario] or NULL */
    dsv4_result status;
    double seconds;
    unsigned requested;
    check_rec checks[DSV4_CHECK_COUNT];
    bool has_metrics;
    dsv4_compare_metrics m;
    dsv4_case_memory mem;
    /* what the case was */
    char *preset;
    dsv4_config cfg;
    dsv4_topology topo;
    int n_ranks;
    int64_t *tokens;
    bool *replay;
    uint64_t seed;
    dsv4_expect expect;
    char *regex;
    char *backend; /* the backend that produced the numerics, or NULL */
    bool has_errors;
    dsv4_case_errors errs; /* the bounded error profile of numerics */
    char *defect;          /* the case's `fault` key, or NULL */
    bool injected;         /* this run had the defect injected */
    size_t twin;           /* index of the clean / injected twin in the results, SIZE_MAX for none */
    char *caught_by;       /* injected runs: the first failing check and its detail */
    bool lost_detail; /* a check's detail (or the backend name) could not be allocated: an error, not a pass */
};

typedef struct {
    char *name, *path;
    size_t n_axes;
    char **axis_names;
} scn_rec;

struct dsv4_run_results {
    dsv4_case_result **cases;
    size_t n, cap;
    scn_rec *scns;
    size_t nscn;
};

const char *dsv4_result_name(dsv4_result r)
{
    switch (r) {
    case DSV4_RESULT_PASS: return "pass";
    case DSV4_RESULT_FAIL: return "fail";
    case DSV4_RESULT_SKIP: return "skip";
    case DSV4_RESULT_ERROR: return "error";
    }
    return "?";
}

void dsv4_run_options_init(dsv4_run_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->cache_dir = NULL;
    opt->backend = -1;
    opt->threads = 2;
}

static char *xstrdup(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static char *xvasprintf(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

static int bit_index(unsigned bit)
{
    for (int i = 0; i < DSV4_CHECK_COUNT; i++)
        if (bit == 1u << i)
            return i;
    return -1;
}

/* Sets a check's result (the first setting wins unless `force`). */
static void set_check(dsv4_case_result *c, unsigned bit, dsv4_result r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_check(dsv4_case_result *c, unsigned bit, dsv4_result r, const char *fmt, ...)
{
    int i = bit_index(bit);
    if (i < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    char *d = xvasprintf(fmt, ap);
    va_end(ap);
    free(c->checks[i].detail);
    c->checks[i].detail = d;
    c->checks[i].r = r;
    if (!d)
        c->lost_detail = true;
}

static bool check_set(const dsv4_case_result *c, unsigned bit) { return c->checks[bit_index(bit)].detail != NULL; }

/* Every requested check not yet decided gets `r` with the detail. */
static void set_rest(dsv4_case_result *c, dsv4_result r, const char *detail)
{
    for (int i = 0; i < DSV4_CHECK_COUNT; i++)
        if ((c->requested & (1u << i)) && !c->checks[i].detail)
            set_check(c, 1u << i, r, "%s", detail);
}

static void case_free(dsv4_case_result *c)
{
    if (!c)
        return;
    free(c->name);
    free(c->scn_name);
    free(c->scn_path);
    free(c->axis_index);
    for (int i = 0; i < DSV4_CHECK_COUNT; i++)
        free(c->checks[i].detail);
    free(c->preset);
    free(c->tokens);
    free(c->replay);
    free(c->regex);
    free(c->backend);
    free(c->defect);
    free(c->caught_by);
    free(c);
}

void dsv4_run_results_free(dsv4_run_results *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        case_free(r->cases[i]);
    free(r->cases);
    for (size_t i = 0; i < r->nscn; i++) {
        free(r->scns[i].name);
        free(r->scns[i].path);
        for (size_t a = 0; a < r->scns[i].n_axes; a++)
            free(r->scns[i].axis_names[a]);
        free(r->scns[i].axis_names);
    }
    free(r->scns);
    free(r);
}

size_t dsv4_run_count(const dsv4_run_results *r) { return r ? r->n : 0; }
const dsv4_case_result *dsv4_run_get(const dsv4_run_results *r, size_t i)
{
    return r && i < r->n ? r->cases[i] : NULL;
}

dsv4_run_summary dsv4_run_summarize(const dsv4_run_results *r)
{
    dsv4_run_summary s;
    memset(&s, 0, sizeof s);
    for (size_t i = 0; r && i < r->n; i++) {
        const dsv4_case_result *c = r->cases[i];
        if (c->injected)
            continue;
        s.cases++;
        s.seconds += c->seconds;
        switch (c->status) {
        case DSV4_RESULT_PASS: s.passed++; break;
        case DSV4_RESULT_FAIL: s.failed++; break;
        case DSV4_RESULT_SKIP: s.skipped++; break;
        case DSV4_RESULT_ERROR: s.errors++; break;
        }
    }
    return s;
}

const char *dsv4_case_name(const dsv4_case_result *c) { return c ? c->name : NULL; }
dsv4_result dsv4_case_status(const dsv4_case_result *c) { return c ? c->status : DSV4_RESULT_ERROR; }
double dsv4_case_seconds(const dsv4_case_result *c) { return c ? c->seconds : 0; }
size_t dsv4_case_index(const dsv4_case_result *c) { return c ? c->index : 0; }

dsv4_result dsv4_case_check(const dsv4_case_result *c, unsigned bit, const char **detail)
{
    int i = bit_index(bit);
    if (!c || i < 0) {
        if (detail)
            *detail = "no such check";
        return DSV4_RESULT_ERROR;
    }
    if (!c->checks[i].detail) {
        if (detail)
            *detail = "not requested";
        return DSV4_RESULT_SKIP;
    }
    if (detail)
        *detail = c->checks[i].detail;
    return c->checks[i].r;
}

bool dsv4_case_metrics(const dsv4_case_result *c, dsv4_compare_metrics *out)
{
    if (!c || !c->has_metrics)
        return false;
    if (out)
        *out = c->m;
    return true;
}

bool dsv4_case_errors_of(const dsv4_case_result *c, dsv4_case_errors *out)
{
    if (!c || !c->has_errors)
        return false;
    if (out)
        *out = c->errs;
    return true;
}

const char *dsv4_case_defect(const dsv4_case_result *c) { return c ? c->defect : NULL; }
bool dsv4_case_injected(const dsv4_case_result *c) { return c && c->injected; }

dsv4_case_memory dsv4_case_memory_of(const dsv4_case_result *c)
{
    dsv4_case_memory m;
    memset(&m, 0, sizeof m);
    return c ? c->mem : m;
}

const char *dsv4_case_scenario(const dsv4_case_result *c) { return c ? c->scn_name : NULL; }
const char *dsv4_case_file(const dsv4_case_result *c) { return c ? c->scn_path : NULL; }

/* ---------------- helpers ---------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

static dsv4_status mkdir_p(const char *path, dsv4_error *err)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "bad cache folder '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char save = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return dsv4_seterr(err, DSV4_ERR_IO, buf, "cannot create folder: %s", strerror(errno));
            buf[i] = save;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return dsv4_seterr(err, DSV4_ERR_IO, path, "not a folder");
    return DSV4_OK;
}

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
    return fnv1a(0xcbf29ce484222325ull, desc);
}

static uint64_t input_key(const dsv4_config *c, uint64_t seed)
{
    char desc[256];
    snprintf(desc, sizeof desc, RUN_CACHE_VERSION " input H=%lld V=%lld seed=%llu", (long long)c->dim,
             (long long)c->vocab_size, (unsigned long long)seed);
    return fnv1a(0xcbf29ce484222325ull, desc);
}

/* Opens the cached weights, generating them when absent or unreadable. */
static dsv4_status open_weights(const char *dir, const dsv4_config *cfg, uint64_t seed, dsv4_checkpoint **ck,
                                dsv4_error *err)
{
    char desc[512], path[4200];
    uint64_t h = weights_key(cfg, seed, desc, sizeof desc);
    snprintf(path, sizeof path, "%s/w-%016llx.safetensors", dir, (unsigned long long)h);
    if (access(path, R_OK) == 0 && dsv4_checkpoint_open(path, ck, NULL) == DSV4_OK)
        return DSV4_OK;
    dsv4_gen_options o;
    dsv4_gen_options_init(&o);
    o.seed = seed;
    o.threads = 2;
    dsv4_status st = dsv4_gen_weights(cfg, &o, path, err);
    if (st)
        return st;
    return dsv4_checkpoint_open(path, ck, err);
}

/* Opens the cached input pool of at least `tokens` tokens. */
static dsv4_status open_input(const char *dir, const dsv4_config *cfg, uint64_t seed, int64_t tokens,
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

static bool all_bf16(const dsv4_config *c)
{
    return c->routed_format == DSV4_FORMAT_BF16 && c->shared_format == DSV4_FORMAT_BF16;
}

/* The per-quant tolerance of the project's own backends (one rule set for run, diff and check:
   dsv4_compare_within): the exact mode's, or SPEC.md section 9's fp8 bound when the plan runs
   gemm fp8; fills why on failure. */
static bool within_tolerance(const dsv4_config *c, dsv4_gemm_mode gemm, const dsv4_compare_metrics *m, char *why,
                             size_t n)
{
    return dsv4_compare_within(all_bf16(c)               ? DSV4_TOL_EXACT_BF16
                               : gemm == DSV4_GEMM_FP8 ? DSV4_TOL_FP8_MMA
                                                       : DSV4_TOL_EXACT_QUANT,
                               m, why, n);
}

static void trace_entry(const dsv4_coll_record *r, char *buf, size_t n)
{
    snprintf(buf, n, "%s seq %llu %s %s count %llu '%s'", dsv4_group_name(r->group), (unsigned long long)r->seq,
             dsv4_coll_op_name(r->op), dsv4_dtype_name(r->dtype), (unsigned long long)r->count, r->tag);
}

static bool same_fingerprint(const dsv4_coll_record *a, const dsv4_coll_record *b)
{
    if (a->group != b->group || a->seq != b->seq || a->op != b->op || a->dtype != b->dtype ||
        strncmp(a->tag, b->tag, DSV4_COMM_TAG_MAX) != 0)
        return false;
    if ((a->op == DSV4_COLL_ALL_REDUCE || a->op == DSV4_COLL_ALL_GATHER) && a->count != b->count)
        return false;
    return true;
}

/* ---------------- the error profile of a comparison ---------------- */

static int32_t bf16_order(uint16_t v) { return (v & 0x8000) ? -(int32_t)(v & 0x7fff) : (int32_t)v; }
static bool bf16_finite(uint16_t v) { return (v & 0x7f80) != 0x7f80; }

/* Bins and the worst elements of a [sum tokens, H] bf16 comparison, ranks one after another. */
static void error_profile(dsv4_case_result *c, const uint16_t *a, const uint16_t *b, const int64_t *tokens, int world,
                          int64_t H)
{
    dsv4_case_errors *E = &c->errs;
    memset(E, 0, sizeof *E);
    int64_t i = 0;
    for (int r = 0; r < world; r++)
        for (int64_t t = 0; t < tokens[r]; t++)
            for (int64_t h = 0; h < H; h++, i++) {
                uint16_t x = a[i], y = b[i];
                double diff;
                int ub, ab;
                if (x == y || (bf16_finite(x) && bf16_finite(y) && bf16_order(x) == bf16_order(y))) {
                    diff = 0, ub = 0, ab = 0;
                } else if (!bf16_finite(x) || !bf16_finite(y)) {
                    diff = INFINITY, ub = DSV4_ERR_BINS - 1, ab = DSV4_ERR_BINS - 1;
                } else {
                    diff = fabs((double)dsv4_bf16_to_f32(x) - (double)dsv4_bf16_to_f32(y));
                    int32_t u = bf16_order(x) - bf16_order(y);
                    ub = 1 + (int)floor(log2((double)(u < 0 ? -u : u)));
                    ub = ub < DSV4_ERR_BINS - 1 ? ub : DSV4_ERR_BINS - 1;
                    ab = diff > 0 ? (int)floor(log10(diff)) + 10 : 1;
                    ab = ab < 1 ? 1 : ab > DSV4_ERR_BINS - 1 ? DSV4_ERR_BINS - 1 : ab;
                }
                E->ulp_bins[ub]++;
                E->abs_bins[ab]++;
                if (ub == 0 || (E->n_worst == DSV4_WORST_MAX && !(diff > E->worst[DSV4_WORST_MAX - 1].diff)))
                    continue;
                /* Insertion into the list kept largest first; an equal diff stays behind (lower index first). */
                int k = E->n_worst < DSV4_WORST_MAX ? E->n_worst++ : DSV4_WORST_MAX - 1;
                while (k > 0 && diff > E->worst[k - 1].diff) {
                    E->worst[k] = E->worst[k - 1];
                    k--;
                }
                E->worst[k] = (dsv4_case_worst){i, r, t, h, dsv4_bf16_to_f32(x), dsv4_bf16_to_f32(y), diff};
            }
    E->n = i;
    c->has_errors = true;
}

/* ---------------- the backend's checkpoint (key `checkpoint`) ---------------- */

static bool custom_checkpoint(const dsv4_scenario_case *sc)
{
    return sc->checkpoint.layout == DSV4_LAYOUT_STACKED || sc->checkpoint.shards > 1;
}

static void checkpoint_words(const dsv4_scenario_case *sc, char *buf, size_t n)
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
static dsv4_status backend_checkpoint_path(const char *dir, const dsv4_config *cfg, const dsv4_scenario_case *sc,
                                           char *src, size_t srcn, char *out, size_t outn, dsv4_error *err)
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
        o.threads = 2;
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
    if ((st = mkdir_p(out, err)))
        return st;
    return write_shards(src, out, sc->checkpoint.shards, sc->checkpoint.experts_last, err);
}

/* Writes every rank's trace as trace_dir/<case id>/rank<r>.jsonl; a failure is the symmetry
   check's error (a trace asked for and not written must not read as a pass). */
static void write_traces(const char *trace_dir, dsv4_case_result *c, const dsv4_dist_rank *ranks, int world)
{
    char id[512], dir[4700], path[4800];
    dsv4_error e;
    dsv4_error_clear(&e);
    dsv4_export_case_id(c->name, -1, id, sizeof id);
    snprintf(dir, sizeof dir, "%s/%s", trace_dir, id);
    dsv4_status st = mkdir_p(dir, &e);
    for (int r = 0; r < world && !st; r++) {
        snprintf(path, sizeof path, "%s/rank%d.jsonl", dir, r);
        st = dsv4_trace_write_jsonl(ranks[r].trace, ranks[r].trace_len, r, world, path, &e);
    }
    if (st)
        set_check(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_ERROR, "writing the collective traces failed: %s", e.message);
}

/* ---------------- one case ---------------- */

typedef struct {
    const dsv4_run_options *o;
    const char *cache;
    int timeout_ms; /* the simulated communicator's deadlock timeout; 0: the driver's default */
} run_ctx;

static int64_t sum_tokens(const dsv4_scenario_case *sc)
{
    int64_t s = 0;
    for (int r = 0; r < sc->n_ranks; r++)
        s += sc->tokens[r];
    return s;
}

/* Slice offsets: tp ranks of one block share their block's slice. */
static void slice_offsets(const dsv4_topology *t, const int64_t *tokens, int n, int64_t *off)
{
    int tp = t->tp >= 1 ? t->tp : 1;
    int64_t o = 0;
    for (int r = 0; r < n; r++) {
        if (r % tp == 0) {
            off[r] = o;
            o += tokens[r];
        } else {
            off[r] = off[r - r % tp];
        }
    }
}

/* Runs the reference on [off, off + T) of the pool. */
static dsv4_status ref_run(dsv4_ref *ref, const dsv4_config *cfg, const uint16_t *x, const int32_t *ids, int64_t off,
                           int64_t T, uint16_t *y, int32_t *topk, float *w, dsv4_ref_stats *stats, dsv4_error *e)
{
    dsv4_ref_output out;
    memset(&out, 0, sizeof out);
    out.y = y;
    out.topk_ids = topk;
    out.topk_weights = w;
    dsv4_status st = dsv4_ref_forward(ref, T, x + off * cfg->dim, ids + off, &out, e);
    if (!st && stats)
        *stats = out.stats;
    return st;
}

static void finish_status(dsv4_case_result *c)
{
    bool any_pass = false, any_fail = false, any_error = false;
    for (int i = 0; i < DSV4_CHECK_COUNT; i++) {
        if (!c->checks[i].detail)
            continue;
        any_pass |= c->checks[i].r == DSV4_RESULT_PASS;
        any_fail |= c->checks[i].r == DSV4_RESULT_FAIL;
        any_error |= c->checks[i].r == DSV4_RESULT_ERROR;
    }
    c->status = any_error || c->lost_detail ? DSV4_RESULT_ERROR
                : any_fail ? DSV4_RESULT_FAIL
                : any_pass ? DSV4_RESULT_PASS
                           : DSV4_RESULT_SKIP;
}

static void run_case(const run_ctx *ctx, const dsv4_scenario_case *sc, dsv4_case_result *c)
{
    const unsigned req = sc->checks;
    c->requested = req;
    const int world = sc->n_ranks;
    dsv4_topology topo = sc->topology;
    if (ctx->o->backend >= 0 && topo.backend != DSV4_BACKEND_CUDA)
        topo.backend = (dsv4_backend_kind)ctx->o->backend;
    c->topo = topo;
    const dsv4_config *cfg = &sc->config;
    dsv4_error e;
    dsv4_error_clear(&e);

    /* ---- plans (refusal) ---- */
    dsv4_plan **plans = calloc((size_t)world, sizeof *plans);
    if (!plans) {
        set_check(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_ERROR, "out of memory");
        set_rest(c, DSV4_RESULT_ERROR, "out of memory");
        finish_status(c);
        return;
    }
    bool refused = false;
    char refusal[DSV4_ERROR_MESSAGE_MAX + 128] = "";
    if (sc->config_status != DSV4_OK) {
        refused = true;
        snprintf(refusal, sizeof refusal, "%s", sc->config_error ? sc->config_error : "invalid config");
    } else {
        for (int r = 0; r < world && !refused; r++) {
            dsv4_topology t = topo;
            t.rank = r;
            if (dsv4_plan_create(cfg, &t, &sc->budget, &plans[r], &e) != DSV4_OK) {
                refused = true;
                snprintf(refusal, sizeof refusal, "rank %d: %s", r, e.message);
            }
        }
    }
    dsv4_checkpoint *ck = NULL, *ckb = NULL; /* the reference's layer; the backend's copy (key checkpoint) */
    dsv4_st_file *in = NULL;
    dsv4_ref *ref1 = NULL, *ref2 = NULL;
    dsv4_backend *be = NULL;
    dsv4_plan *fallback_plan = NULL;
    uint16_t *y = NULL, *yr = NULL;
    int32_t *ids_b = NULL, *ids_r = NULL;
    float *w_b = NULL, *w_r = NULL;
    dsv4_dist_rank *ranks = NULL;
    int64_t *off = NULL;

    if (sc->expect == DSV4_EXPECT_REFUSED) {
        if (!refused) {
            set_check(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL,
                      "expected a refusal matching /%s/, but the plan was accepted on all %d ranks",
                      sc->refused_regex ? sc->refused_regex : "", world);
        } else {
            regex_t re;
            int rc = regcomp(&re, sc->refused_regex ? sc->refused_regex : "", REG_EXTENDED | REG_NOSUB);
            if (rc != 0) {
                set_check(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_ERROR, "refused_regex /%s/ does not compile",
                          sc->refused_regex);
            } else {
                if (regexec(&re, refusal, 0, NULL, 0) == 0)
                    set_check(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_PASS, "refused as expected: %s", refusal);
                else
                    set_check(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL,
                              "refused, but the message does not match /%s/: %s", sc->refused_regex, refusal);
                regfree(&re);
            }
        }
        set_rest(c, DSV4_RESULT_SKIP, "not run: the case expects a refusal");
        goto done;
    }
    if (refused) {
        /* Reported even when the case did not ask for the refusal check. */
        set_check(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_FAIL, "the plan was refused, but the case expects pass: %s",
                  refusal);
        set_rest(c, DSV4_RESULT_SKIP, "not run: the plan was refused");
        goto done;
    }
    if (req & DSV4_CHECK_REFUSAL)
        set_check(c, DSV4_CHECK_REFUSAL, DSV4_RESULT_PASS, "the plan was accepted on all %d ranks, as expected",
                  world);

    /* ---- memory: planned maximum within the budget ---- */
    {
        c->mem.available = UINT64_MAX;
        char bad[512] = "";
        for (int r = 0; r < world; r++) {
            uint64_t mx = dsv4_plan_workspace_max(plans[r]), av = dsv4_plan_budget_available(plans[r]);
            if (mx > c->mem.planned_max)
                c->mem.planned_max = mx;
            if (av < c->mem.available)
                c->mem.available = av;
            if (mx > av && !bad[0])
                snprintf(bad, sizeof bad, "rank %d: planned maximum %llu bytes above the %llu bytes available", r,
                         (unsigned long long)mx, (unsigned long long)av);
        }
        if (bad[0] && (req & DSV4_CHECK_MEMORY))
            set_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_FAIL, "%s", bad);
    }

    const unsigned needs_run = DSV4_CHECK_NUMERICS | DSV4_CHECK_DETERMINISM | DSV4_CHECK_SYMMETRY |
                               DSV4_CHECK_MEMORY | DSV4_CHECK_EMPTY | DSV4_CHECK_CLAMP_EXERCISED;
    if (!(req & needs_run))
        goto done;

    /* ---- data ---- */
    const int64_t total = sum_tokens(sc);
    const int64_t H = cfg->dim, K = cfg->n_activated;
    int64_t pool = total > DETERMINISM_TOKENS ? total : DETERMINISM_TOKENS;
    if (open_weights(ctx->cache, cfg, sc->seed, &ck, &e) || open_input(ctx->cache, cfg, sc->seed, pool, &in, &e)) {
        char msg[DSV4_ERROR_MESSAGE_MAX + 128];
        snprintf(msg, sizeof msg, "data generation failed: %s", e.message);
        set_rest(c, DSV4_RESULT_ERROR, msg);
        goto done;
    }
    /* The backend's copy: the loader is under test, so a copy it will not read fails numerics. */
    char ckwords[160] = "";
    if (custom_checkpoint(sc)) {
        char ckpath[4400], src[4200];
        checkpoint_words(sc, ckwords, sizeof ckwords);
        if (backend_checkpoint_path(ctx->cache, cfg, sc, src, sizeof src, ckpath, sizeof ckpath, &e)) {
            char msg[DSV4_ERROR_MESSAGE_MAX + 256];
            snprintf(msg, sizeof msg, "writing the backend's checkpoint (%s) failed: %s", ckwords, e.message);
            set_rest(c, DSV4_RESULT_ERROR, msg);
            goto done;
        }
        /* The reference reads the one file of the layout (a stacked layer quantizes at load as the
           backend does); the backend its copy. */
        dsv4_checkpoint_close(ck);
        ck = NULL;
        if (dsv4_checkpoint_open(src, &ck, &e) || dsv4_checkpoint_open(ckpath, &ckb, &e)) {
            set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_FAIL, "the layer's checkpoint (%s) does not load: %s",
                      ckwords, e.message);
            set_rest(c, DSV4_RESULT_SKIP, "not run: the checkpoint does not load");
            goto done;
        }
    }
    const dsv4_checkpoint *ck_be = ckb ? ckb : ck;
    const dsv4_tensor_info *tx = dsv4_st_find(in, "x"), *tid = dsv4_st_find(in, "input_ids");
    if (!tx || !tid) {
        set_rest(c, DSV4_RESULT_ERROR, "the input file has no x or input_ids");
        goto done;
    }
    const uint16_t *X = tx->data;
    const int32_t *IDS = tid->data;

    if (dsv4_ref_create(cfg, ck, 1, &ref1, &e)) {
        char msg[DSV4_ERROR_MESSAGE_MAX + 256];
        snprintf(msg, sizeof msg, "the reference would not start%s%s%s: %s", ckb ? " on the layer's checkpoint (" : "",
                 ckwords, ckb ? ")" : "", e.message);
        if (ckb) { /* the loader is under test: a checkpoint it will not bind fails numerics */
            set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_FAIL, "%s", msg);
            set_rest(c, DSV4_RESULT_SKIP, "not run: the reference would not start");
        } else {
            set_rest(c, DSV4_RESULT_ERROR, msg);
        }
        goto done;
    }

    off = calloc((size_t)world, sizeof *off);
    /* The whole case's outputs, rank after rank: y [sum T, H], ids/w [sum T, K]. */
    int64_t all_rows = 0;
    for (int r = 0; r < world; r++)
        all_rows += sc->tokens[r];
    y = calloc((size_t)(all_rows * H + 1), 2);
    yr = calloc((size_t)(all_rows * H + 1), 2);
    ids_b = calloc((size_t)(all_rows * K + 1), 4);
    ids_r = calloc((size_t)(all_rows * K + 1), 4);
    w_b = calloc((size_t)(all_rows * K + 1), 4);
    w_r = calloc((size_t)(all_rows * K + 1), 4);
    if (!off || !y || !yr || !ids_b || !ids_r || !w_b || !w_r) {
        set_rest(c, DSV4_RESULT_ERROR, "out of memory");
        goto done;
    }
    slice_offsets(&topo, sc->tokens, world, off);

    /* ---- the reference on every rank's tokens (numerics, clamp_exercised) ---- */
    dsv4_ref_stats rs_sum;
    memset(&rs_sum, 0, sizeof rs_sum);
    bool ref_ok = true;
    {
        int64_t row = 0;
        for (int r = 0; r < world && ref_ok; r++) {
            dsv4_ref_stats rs;
            if (ref_run(ref1, cfg, X, IDS, off[r], sc->tokens[r], yr + row * H, ids_r + row * K, w_r + row * K, &rs,
                        &e)) {
                char msg[DSV4_ERROR_MESSAGE_MAX + 128];
                snprintf(msg, sizeof msg, "the reference failed on rank %d's tokens: %s", r, e.message);
                set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_ERROR, "%s", msg);
                set_check(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_ERROR, "%s", msg);
                ref_ok = false;
                break;
            }
            rs_sum.tokens += rs.tokens;
            rs_sum.routed_values += rs.routed_values;
            rs_sum.routed_g_clamped += rs.routed_g_clamped;
            rs_sum.routed_u_clamped += rs.routed_u_clamped;
            rs_sum.shared_g_clamped += rs.shared_g_clamped;
            rs_sum.shared_u_clamped += rs.shared_u_clamped;
            row += sc->tokens[r];
        }
    }

    /* ---- clamp_exercised ---- */
    if ((req & DSV4_CHECK_CLAMP_EXERCISED) && ref_ok) {
        if (!(cfg->swiglu_limit > 0))
            set_check(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_SKIP, "not applicable (swiglu_limit 0)");
        else if (rs_sum.tokens < CLAMP_MIN_TOKENS)
            set_check(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_SKIP, "not applicable (T < %d: %lld tokens)",
                      CLAMP_MIN_TOKENS, (long long)rs_sum.tokens);
        else if (rs_sum.routed_g_clamped + rs_sum.routed_u_clamped > 0)
            set_check(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_PASS,
                      "%llu g and %llu u of %llu routed values clamped at L = %g over %lld tokens",
                      (unsigned long long)rs_sum.routed_g_clamped, (unsigned long long)rs_sum.routed_u_clamped,
                      (unsigned long long)rs_sum.routed_values, (double)cfg->swiglu_limit,
                      (long long)rs_sum.tokens);
        else
            set_check(c, DSV4_CHECK_CLAMP_EXERCISED, DSV4_RESULT_FAIL,
                      "no routed g or u value exceeded L = %g in %llu values over %lld tokens: a dropped clamp "
                      "would not be seen",
                      (double)cfg->swiglu_limit, (unsigned long long)rs_sum.routed_values, (long long)rs_sum.tokens);
    }

    /* ---- determinism: the reference at 1 and 2 threads ---- */
    if (req & DSV4_CHECK_DETERMINISM) {
        int64_t T = sc->tokens[0] > 0 ? sc->tokens[0] : DETERMINISM_TOKENS;
        int64_t o = sc->tokens[0] > 0 ? off[0] : 0;
        uint16_t *y1 = calloc((size_t)(T * H), 2), *y2 = calloc((size_t)(T * H), 2);
        int32_t *i1 = calloc((size_t)(T * K), 4), *i2 = calloc((size_t)(T * K), 4);
        float *w1 = calloc((size_t)(T * K), 4), *w2 = calloc((size_t)(T * K), 4);
        if (!y1 || !y2 || !i1 || !i2 || !w1 || !w2) {
            set_check(c, DSV4_CHECK_DETERMINISM, DSV4_RESULT_ERROR, "out of memory");
        } else if (dsv4_ref_create(cfg, ck, 2, &ref2, &e) ||
                   ref_run(ref1, cfg, X, IDS, o, T, y1, i1, w1, NULL, &e) ||
                   ref_run(ref2, cfg, X, IDS, o, T, y2, i2, w2, NULL, &e)) {
            set_check(c, DSV4_CHECK_DETERMINISM, DSV4_RESULT_ERROR, "the reference failed: %s", e.message);
        } else {
            dsv4_ref_output a = {.y = y1, .topk_ids = i1, .topk_weights = w1};
            dsv4_ref_output b = {.y = y2, .topk_ids = i2, .topk_weights = w2};
            uint64_t h1 = dsv4_ref_hash(cfg, T, &a), h2 = dsv4_ref_hash(cfg, T, &b);
            if (h1 == h2)
                set_check(c, DSV4_CHECK_DETERMINISM, DSV4_RESULT_PASS,
                          "hash %016llx at 1 and 2 threads over %lld tokens", (unsigned long long)h1, (long long)T);
            else
                set_check(c, DSV4_CHECK_DETERMINISM, DSV4_RESULT_FAIL,
                          "hash %016llx at 1 thread, %016llx at 2 threads over %lld tokens", (unsigned long long)h1,
                          (unsigned long long)h2, (long long)T);
        }
        free(y1), free(y2), free(i1), free(i2), free(w1), free(w2);
    }

    const unsigned after = DSV4_CHECK_NUMERICS | DSV4_CHECK_SYMMETRY | DSV4_CHECK_MEMORY | DSV4_CHECK_EMPTY;
    if (!(req & after))
        goto done;

    if (world == 1) {
        /* ---- one rank: the backend against the reference ---- */
        if (req & DSV4_CHECK_SYMMETRY)
            set_check(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_SKIP, "not applicable (one rank)");
        const int64_t T = sc->tokens[0];
        const dsv4_plan *plan = plans[0];
        const char *note = "";
        /* The registry says whether this library holds the backend and this machine runs it. */
        dsv4_backend_info info;
        if (dsv4_backend_info_of(topo.backend, &info, &e) == DSV4_OK && !info.available) {
            if (topo.backend == DSV4_BACKEND_CUDA) {
                /* The plan's half of memory holds without a device; the measured peak needs CUDA. */
                if ((req & DSV4_CHECK_MEMORY) && !check_set(c, DSV4_CHECK_MEMORY))
                    set_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_PASS,
                              "planned maximum %llu <= available %llu (the measured peak needs the cuda backend: %s)",
                              (unsigned long long)c->mem.planned_max, (unsigned long long)c->mem.available,
                              info.why);
                set_rest(c, DSV4_RESULT_SKIP, info.built ? "skipped: no CUDA device on this machine"
                                                         : "skipped: no CUDA in this build");
                goto done;
            }
            /* Any other backend missing here: the reference stands in, and says so. */
            dsv4_topology t = topo;
            t.backend = DSV4_BACKEND_REF;
            if (dsv4_plan_create(cfg, &t, &sc->budget, &fallback_plan, &e) == DSV4_OK) {
                plan = fallback_plan;
                note = " (backend unavailable here: ref stood in)";
            }
        }
        dsv4_status st = dsv4_backend_create(plan, ck_be, ctx->o->threads, &be, &e);
        if (st) {
            char msg[DSV4_ERROR_MESSAGE_MAX + 256];
            snprintf(msg, sizeof msg, "the %s backend would not start%s%s%s: %s", dsv4_backend_kind_name(topo.backend),
                     ckb ? " on its checkpoint (" : "", ckwords, ckb ? ")" : "", e.message);
            if (ckb) { /* the loader under test refused a checkpoint that the reference reads */
                set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_FAIL, "%s", msg);
                set_rest(c, DSV4_RESULT_SKIP, "not run: the backend would not start");
            } else {
                set_rest(c, DSV4_RESULT_ERROR, msg);
            }
            goto done;
        }
        free(c->backend);
        c->backend = xstrdup(dsv4_backend_name(be));
        c->lost_detail |= !c->backend;
        dsv4_forward_out fo = {.y = y, .topk_ids = ids_b, .topk_weights = w_b};
        st = dsv4_backend_forward(be, T, X + off[0] * H, IDS + off[0], &fo, &e);
        dsv4_backend_stats bs = dsv4_backend_get_stats(be);
        bool replay = topo.cuda_graph && sc->replay[0] && dsv4_plan_can_replay(plan, T);
        c->mem.planned_step = dsv4_plan_workspace_bytes(plan, T, replay);
        c->mem.peak = bs.workspace_peak;
        c->mem.measured = true;
        if (st) {
            char msg[DSV4_ERROR_MESSAGE_MAX + 128];
            snprintf(msg, sizeof msg, "the %s backend failed at T = %lld: %s", dsv4_backend_name(be), (long long)T,
                     e.message);
            set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_FAIL, "%s", msg);
            set_check(c, DSV4_CHECK_EMPTY, T == 0 ? DSV4_RESULT_FAIL : DSV4_RESULT_SKIP, "%s", msg);
            set_rest(c, DSV4_RESULT_SKIP, "not run: the backend failed");
            goto done;
        }
        if ((req & DSV4_CHECK_NUMERICS) && ref_ok) {
            if (T == 0) {
                set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_PASS, "nothing to compare (0 tokens)%s", note);
            } else if (!dsv4_compare_bf16(y, yr, T * H, &c->m)) {
                set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_ERROR, "comparison failed (out of memory)");
            } else {
                c->has_metrics = true;
                error_profile(c, y, yr, sc->tokens, 1, H);
                char line[512], why[256];
                dsv4_compare_format(&c->m, line, sizeof line);
                if (within_tolerance(cfg, dsv4_plan_gemm(plan), &c->m, why, sizeof why))
                    set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_PASS, "%s vs ref%s: %s", dsv4_backend_name(be),
                              note, line);
                else
                    set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_FAIL, "%s vs ref%s: %s; %s",
                              dsv4_backend_name(be), note, why, line);
            }
        }
        if ((req & DSV4_CHECK_MEMORY) && !check_set(c, DSV4_CHECK_MEMORY)) {
            if (bs.workspace_peak <= c->mem.planned_step)
                set_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_PASS,
                          "planned maximum %llu <= available %llu; measured peak %llu <= planned %llu for T = %lld%s",
                          (unsigned long long)c->mem.planned_max, (unsigned long long)c->mem.available,
                          (unsigned long long)bs.workspace_peak, (unsigned long long)c->mem.planned_step,
                          (long long)T, bs.workspace_peak == 0 ? " (the backend measured nothing)" : "");
            else
                set_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_FAIL,
                          "measured peak %llu bytes above the %llu planned for T = %lld (%s backend)",
                          (unsigned long long)bs.workspace_peak, (unsigned long long)c->mem.planned_step,
                          (long long)T, dsv4_backend_name(be));
        }
        if (req & DSV4_CHECK_EMPTY) {
            if (T != 0)
                set_check(c, DSV4_CHECK_EMPTY, DSV4_RESULT_SKIP, "not applicable (no rank with 0 tokens)");
            else if (bs.launches == 0)
                set_check(c, DSV4_CHECK_EMPTY, DSV4_RESULT_PASS,
                          "T = 0: the %s backend returned with 0 launches (%llu empty groups skipped)",
                          dsv4_backend_name(be), (unsigned long long)bs.empty_skips);
            else
                set_check(c, DSV4_CHECK_EMPTY, DSV4_RESULT_FAIL, "T = 0: the %s backend launched %llu groups",
                          dsv4_backend_name(be), (unsigned long long)bs.launches);
        }
        goto done;
    }

    /* ---- several ranks: the distributed driver, each rank running its plan's backend's stages ---- */
    if (world > DSV4_COMM_MAX_RANKS) {
        char msg[128];
        snprintf(msg, sizeof msg, "not run: world %d above the %d ranks the simulator holds", world,
                 DSV4_COMM_MAX_RANKS);
        set_rest(c, DSV4_RESULT_SKIP, msg);
        goto done;
    }
    ranks = calloc((size_t)world, sizeof *ranks);
    if (!ranks) {
        set_rest(c, DSV4_RESULT_ERROR, "out of memory");
        goto done;
    }
    {
        int64_t row = 0;
        for (int r = 0; r < world; r++) {
            ranks[r].tokens = sc->tokens[r];
            ranks[r].x = X + off[r] * H;
            ranks[r].input_ids = IDS + off[r];
            ranks[r].can_replay = sc->replay[r];
            ranks[r].y = y + row * H;
            ranks[r].topk_ids = ids_b + row * K;
            ranks[r].topk_weights = w_b + row * K;
            row += sc->tokens[r];
        }
    }
    dsv4_dist_options dopt;
    dsv4_dist_options_init(&dopt);
    if (ctx->timeout_ms > 0)
        dopt.timeout_ms = ctx->timeout_ms;
    /* A backend this library or machine lacks (cuda without `make cuda` or a device): the cpu
       backend's stages compute the plan's step (its protocol, replay decision and chunks). */
    dsv4_backend_info binfo;
    const char *standin = "";
    if (dsv4_backend_info_of(topo.backend, &binfo, &e) == DSV4_OK && !binfo.available) {
        dopt.compute_backend = DSV4_BACKEND_CPU;
        standin = " (cpu stages standing in: the plan's backend is not available here)";
    }
    const char *computed = dsv4_backend_kind_name(dopt.compute_backend >= 0 ? (dsv4_backend_kind)dopt.compute_backend
                                                                            : topo.backend);
    char ran_on[64];
    snprintf(ran_on, sizeof ran_on, "dist:%s", computed);
    free(c->backend);
    c->backend = xstrdup(ran_on);
    c->lost_detail |= !c->backend;
    dsv4_status dst = dsv4_dist_forward(cfg, ck_be, &topo, &sc->budget, &dopt, ranks, &e);
    char dmsg[DSV4_ERROR_MESSAGE_MAX + 128] = "";
    if (dst)
        snprintf(dmsg, sizeof dmsg, "the distributed step failed: %s", e.message);

    /* numerics */
    if (req & DSV4_CHECK_NUMERICS) {
        if (dst) {
            set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_FAIL, "%s", dmsg);
        } else if (ref_ok) {
            /* tp = 1: every rank bit-identical to the computing backend's single-rank counterpart
               (dsv4_dist_single_rank: the same stages over the same groups on one rank); every
               rank within tolerance of the reference. */
            bool bitwise = topo.tp <= 1, cmp_oom = false;
            char bad[DSV4_ERROR_MESSAGE_MAX + 256] = "";
            uint16_t *ys = bitwise ? calloc((size_t)(all_rows * H + 1), sizeof *ys) : NULL;
            if (bitwise && !ys) {
                cmp_oom = true;
            } else if (bitwise) {
                dsv4_dist_rank *one = calloc((size_t)world, sizeof *one);
                if (!one) {
                    cmp_oom = true;
                } else {
                    int64_t row = 0;
                    for (int r = 0; r < world; r++) {
                        one[r] = ranks[r];
                        one[r].y = ys + row * H;
                        one[r].topk_ids = NULL;
                        one[r].topk_weights = NULL;
                        one[r].trace = NULL;
                        row += sc->tokens[r];
                    }
                    dsv4_error e1;
                    if (dsv4_dist_single_rank(cfg, ck_be, &topo, &sc->budget, &dopt, one, &e1) != DSV4_OK)
                        snprintf(bad, sizeof bad, "the %s backend's single-rank counterpart failed: %s", computed,
                                 e1.message);
                    free(one);
                }
            }
            int64_t row = 0;
            for (int r = 0; r < world && !bad[0] && !cmp_oom; r++) {
                int64_t n = sc->tokens[r] * H;
                if (bitwise && memcmp(y + row * H, ys + row * H, (size_t)n * 2) != 0) {
                    int64_t i = 0;
                    while (i < n && y[row * H + i] == ys[row * H + i])
                        i++;
                    snprintf(bad, sizeof bad,
                             "rank %d differs from the %s backend on one rank (ep sharding must be bit-identical): "
                             "first at token %lld channel %lld: 0x%04x vs 0x%04x",
                             r, computed, (long long)(i / H), (long long)(i % H), y[row * H + i], ys[row * H + i]);
                }
                dsv4_compare_metrics m;
                char why[256];
                if (!bad[0] && n > 0 && !dsv4_compare_bf16(y + row * H, yr + row * H, n, &m))
                    cmp_oom = true;
                else if (!bad[0] && n > 0 &&
                         !within_tolerance(cfg, dopt.compute_backend >= 0 ? DSV4_GEMM_EXACT : dsv4_plan_gemm(plans[0]),
                                           &m, why, sizeof why)) /* a stand-in computes gemm exact */
                    snprintf(bad, sizeof bad, "rank %d vs ref: %s", r, why);
                row += sc->tokens[r];
            }
            free(ys);
            if (all_rows > 0 && dsv4_compare_bf16(y, yr, all_rows * H, &c->m)) {
                c->has_metrics = true;
                error_profile(c, y, yr, sc->tokens, world, H);
            } else if (all_rows > 0)
                cmp_oom = true;
            char line[512] = "nothing compared (0 tokens)";
            if (c->has_metrics)
                dsv4_compare_format(&c->m, line, sizeof line);
            if (cmp_oom) /* a comparison that did not run must not read as a pass */
                set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_ERROR, "comparison failed (out of memory)");
            else if (bad[0])
                set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_FAIL, "%s%s; all ranks vs ref: %s", bad, standin, line);
            else if (bitwise)
                set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_PASS,
                          "%d ranks of %s bit-identical to %s on one rank%s; vs ref: %s", world, computed, computed,
                          standin, line);
            else
                set_check(c, DSV4_CHECK_NUMERICS, DSV4_RESULT_PASS, "%d ranks of %s (tp %d) within tolerance of ref%s: %s",
                          world, computed, topo.tp, standin, line);
        }
    }

    /* the ranks' traces for dsv4moe symmetry (options.trace_dir) */
    if (ctx->o->trace_dir && ctx->o->trace_dir[0] && !c->injected)
        write_traces(ctx->o->trace_dir, c, ranks, world);

    /* symmetry */
    if (req & DSV4_CHECK_SYMMETRY) {
        char bad[1024] = "";
        for (int r = 1; r < world && !bad[0]; r++) {
            size_t n0 = ranks[0].trace_len, nr = ranks[r].trace_len, n = n0 < nr ? n0 : nr;
            size_t i = 0;
            while (i < n && same_fingerprint(&ranks[0].trace[i], &ranks[r].trace[i]))
                i++;
            if (i < n || n0 != nr) {
                char a[192] = "(none)", b[192] = "(none)";
                if (i < n0)
                    trace_entry(&ranks[0].trace[i], a, sizeof a);
                if (i < nr)
                    trace_entry(&ranks[r].trace[i], b, sizeof b);
                snprintf(bad, sizeof bad,
                         "collective #%zu differs: rank 0 [%s] vs rank %d [%s] (rank 0 issued %zu, rank %d %zu)", i, a,
                         r, b, n0, r, nr);
            }
        }
        if (bad[0])
            set_check(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_FAIL, "%s%s%s", bad, dst ? "; " : "", dst ? dmsg : "");
        else if (dst)
            set_check(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_FAIL, "%s", dmsg);
        else
            set_check(c, DSV4_CHECK_SYMMETRY, DSV4_RESULT_PASS, "%d ranks issued the same %zu collectives", world,
                      ranks[0].trace_len);
    }

    /* memory: measured peak within the step's plan */
    {
        char bad[512] = "";
        for (int r = 0; r < world; r++) {
            if (ranks[r].workspace_planned > c->mem.planned_step)
                c->mem.planned_step = ranks[r].workspace_planned;
            if (ranks[r].workspace_peak > c->mem.peak)
                c->mem.peak = ranks[r].workspace_peak;
            if (ranks[r].workspace_peak > ranks[r].workspace_planned && !bad[0])
                snprintf(bad, sizeof bad, "rank %d: measured peak %llu bytes above the %llu planned for the step", r,
                         (unsigned long long)ranks[r].workspace_peak, (unsigned long long)ranks[r].workspace_planned);
        }
        c->mem.measured = dst == DSV4_OK;
        if ((req & DSV4_CHECK_MEMORY) && !check_set(c, DSV4_CHECK_MEMORY)) {
            if (dst)
                set_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_FAIL, "%s", dmsg);
            else if (bad[0])
                set_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_FAIL, "%s", bad);
            else
                set_check(c, DSV4_CHECK_MEMORY, DSV4_RESULT_PASS,
                          "planned maximum %llu <= available %llu on every rank; measured peak %llu <= planned %llu",
                          (unsigned long long)c->mem.planned_max, (unsigned long long)c->mem.available,
                          (unsigned long long)c->mem.peak, (unsigned long long)c->mem.planned_step);
        }
    }

    /* empty */
    if (req & DSV4_CHECK_EMPTY) {
        int n_empty = 0, ref_rank = -1;
        for (int r = 0; r < world; r++) {
            if (sc->tokens[r] == 0)
                n_empty++;
            else if (ref_rank < 0)
                ref_rank = r;
        }
        if (n_empty == 0) {
            set_check(c, DSV4_CHECK_EMPTY, DSV4_RESULT_SKIP, "not applicable (no rank with 0 tokens)");
        } else if (dst) {
            set_check(c, DSV4_CHECK_EMPTY, DSV4_RESULT_FAIL, "%s", dmsg);
        } else {
            if (ref_rank < 0)
                ref_rank = 0; /* every rank empty: they must still agree with each other */
            char bad[256] = "";
            for (int r = 0; r < world && !bad[0]; r++)
                if (sc->tokens[r] == 0 && ranks[r].trace_len != ranks[ref_rank].trace_len)
                    snprintf(bad, sizeof bad, "rank %d (0 tokens) issued %zu collectives, rank %d issued %zu", r,
                             ranks[r].trace_len, ref_rank, ranks[ref_rank].trace_len);
            /* A step whose largest rank holds 0 tokens has 0 chunks: anything run is a zero-size launch. */
            for (int r = 0; r < world && !bad[0]; r++)
                if (ranks[r].step_max_tokens == 0 && ranks[r].chunks > 0)
                    snprintf(bad, sizeof bad,
                             "every rank had 0 tokens, yet rank %d ran %lld chunks of 0 rows (a zero-size launch)", r,
                             (long long)ranks[r].chunks);
            if (bad[0])
                set_check(c, DSV4_CHECK_EMPTY, DSV4_RESULT_FAIL, "%s", bad);
            else
                set_check(c, DSV4_CHECK_EMPTY, DSV4_RESULT_PASS,
                          "%d of %d ranks had 0 tokens and took part in all %zu collectives", n_empty, world,
                          ranks[ref_rank].trace_len);
        }
    }

done:
    if (ranks)
        for (int r = 0; r < world; r++)
            dsv4_dist_rank_release(&ranks[r]);
    free(ranks);
    free(off);
    free(y), free(yr), free(ids_b), free(ids_r), free(w_b), free(w_r);
    dsv4_backend_free(be);
    dsv4_plan_free(fallback_plan);
    dsv4_ref_free(ref1);
    dsv4_ref_free(ref2);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ckb);
    dsv4_checkpoint_close(ck);
    for (int r = 0; r < world; r++)
        dsv4_plan_free(plans[r]);
    free(plans);
    if (c->mem.available == UINT64_MAX)
        c->mem.available = 0;
    finish_status(c);
}

#ifdef DSV4_FAULTS
static char *injected_verdict(const dsv4_case_result *c);
#endif

/* ---------------- the scenario ---------------- */

static dsv4_case_result *new_case(const dsv4_scenario *scn, size_t scn_index, size_t i, const dsv4_scenario_case *sc)
{
    dsv4_case_result *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->name = xstrdup(sc->name);
    c->scn_name = xstrdup(dsv4_scenario_name(scn));
    c->scn_path = xstrdup(dsv4_scenario_path(scn));
    c->scn = scn_index;
    c->index = i;
    c->line = sc->line;
    c->col = sc->col;
    c->explicit_index = sc->explicit_index;
    size_t na = dsv4_scenario_axis_count(scn);
    if (sc->axis_index && na) {
        c->axis_index = malloc(na * sizeof *c->axis_index);
        if (c->axis_index)
            memcpy(c->axis_index, sc->axis_index, na * sizeof *c->axis_index);
    }
    c->preset = xstrdup(sc->preset);
    c->cfg = sc->config;
    c->topo = sc->topology;
    c->n_ranks = sc->n_ranks;
    c->tokens = malloc((size_t)sc->n_ranks * sizeof *c->tokens);
    c->replay = malloc((size_t)sc->n_ranks * sizeof *c->replay);
    c->seed = sc->seed;
    c->expect = sc->expect;
    c->regex = xstrdup(sc->refused_regex);
    c->defect = xstrdup(sc->fault);
    c->twin = SIZE_MAX;
    if ((sc->fault && !c->defect) || !c->name || !c->scn_name || !c->scn_path || !c->tokens || !c->replay ||
        (na && sc->axis_index && !c->axis_index) || (sc->preset && !c->preset) || (sc->refused_regex && !c->regex)) {
        case_free(c);
        return NULL;
    }
    memcpy(c->tokens, sc->tokens, (size_t)sc->n_ranks * sizeof *c->tokens);
    memcpy(c->replay, sc->replay, (size_t)sc->n_ranks * sizeof *c->replay);
    return c;
}

/* Room for `extra` more cases in R->cases. */
static bool grow_cases(dsv4_run_results *R, size_t extra)
{
    if (R->n + extra <= R->cap)
        return true;
    size_t cap = R->cap ? R->cap * 2 : 64;
    dsv4_case_result **nc = realloc(R->cases, cap * sizeof *nc);
    if (!nc)
        return false;
    R->cases = nc;
    R->cap = cap;
    return true;
}

dsv4_status dsv4_run_scenario(const dsv4_scenario *scn, const dsv4_run_options *opts, dsv4_run_results **results,
                              dsv4_error *err)
{
    if (!scn || !results)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "scenario and results must not be NULL");
    dsv4_run_options defaults;
    dsv4_run_options_init(&defaults);
    if (!opts)
        opts = &defaults;
    if (opts->struct_size != sizeof(dsv4_run_options))
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "options struct_size %u unknown (expected %zu)",
                           opts->struct_size, sizeof(dsv4_run_options));
    if (opts->threads < 1 || opts->threads > 256)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "threads %d is outside [1, 256]", opts->threads);
    if (opts->backend != -1 && opts->backend != DSV4_BACKEND_REF && opts->backend != DSV4_BACKEND_CPU &&
        opts->backend != DSV4_BACKEND_CUDA)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "run", "backend %d is not -1, ref, cpu or cuda", opts->backend);
#ifndef DSV4_FAULTS
    if (opts->faults)
        return dsv4_seterr(err, DSV4_ERR_UNSUPPORTED, "run",
                           "options.faults: the defect catalogue is compiled only into the fault build (make faults: "
                           "build/faults/libdsv4moe.a and build/faults/dsv4moe)");
#endif
    run_ctx ctx = {opts, opts->cache_dir && opts->cache_dir[0] ? opts->cache_dir : "out/cache", 0};
    dsv4_status st = mkdir_p(ctx.cache, err);
    if (st)
        return st;

    bool created = false;
    dsv4_run_results *R = *results;
    if (!R) {
        R = calloc(1, sizeof *R);
        if (!R)
            return dsv4_seterr(err, DSV4_ERR_NOMEM, "run", "out of memory");
        created = true;
    }
    /* Record the scenario. */
    scn_rec *ns = realloc(R->scns, (R->nscn + 1) * sizeof *ns);
    if (!ns)
        goto nomem;
    R->scns = ns;
    scn_rec *sr = &R->scns[R->nscn];
    memset(sr, 0, sizeof *sr);
    sr->name = xstrdup(dsv4_scenario_name(scn));
    sr->path = xstrdup(dsv4_scenario_path(scn));
    sr->n_axes = dsv4_scenario_axis_count(scn);
    sr->axis_names = calloc(sr->n_axes + 1, sizeof *sr->axis_names);
    if (!sr->name || !sr->path || !sr->axis_names)
        goto nomem_scn;
    for (size_t a = 0; a < sr->n_axes; a++)
        if (!(sr->axis_names[a] = xstrdup(dsv4_scenario_axis_name(scn, a))))
            goto nomem_scn;
    size_t scn_index = R->nscn++;

    size_t n = dsv4_scenario_count(scn), total = 0, done = 0;
    for (size_t i = 0; i < n; i++) {
        const dsv4_scenario_case *sc = dsv4_scenario_get(scn, i);
        if (!opts->filter || strstr(sc->name, opts->filter))
            total += opts->faults && sc->fault ? 2 : 1;
    }
    for (size_t i = 0; i < n; i++) {
        const dsv4_scenario_case *sc = dsv4_scenario_get(scn, i);
        if (opts->filter && !strstr(sc->name, opts->filter))
            continue;
        if (!grow_cases(R, 2))
            goto nomem;
        dsv4_case_result *c = new_case(scn, scn_index, i, sc);
        if (!c)
            goto nomem;
        double t0 = now_s();
        run_case(&ctx, sc, c);
        c->seconds = now_s() - t0;
        R->cases[R->n++] = c;
        done++;
        if (opts->progress)
            opts->progress(opts->progress_user, done, total, c);
#ifdef DSV4_FAULTS
        if (opts->faults && sc->fault) {
            /* The same case again with its defect injected (core/faults.h), as a result of its own. */
            dsv4_case_result *f = new_case(scn, scn_index, i, sc);
            if (!f)
                goto nomem;
            f->injected = true;
            /* A desync injected on purpose need not wait the full deadlock timeout to be reported. */
            run_ctx fctx = ctx;
            fctx.timeout_ms = 1000;
            dsv4_fault_set(dsv4_fault_parse(sc->fault));
            t0 = now_s();
            run_case(&fctx, sc, f);
            f->seconds = now_s() - t0;
            dsv4_fault_set(DSV4_FAULT_NONE);
            f->caught_by = injected_verdict(f);
            c->twin = R->n;
            f->twin = R->n - 1;
            R->cases[R->n++] = f;
            done++;
            if (opts->progress)
                opts->progress(opts->progress_user, done, total, f);
        }
#endif
    }
    *results = R;
    return DSV4_OK;
nomem_scn:
    /* Drop the half-recorded scenario, so a result set appended to stays whole. */
    free(sr->name);
    free(sr->path);
    for (size_t a = 0; sr->axis_names && a < sr->n_axes; a++)
        free(sr->axis_names[a]);
    free(sr->axis_names);
nomem:
    if (created)
        dsv4_run_results_free(R);
    else
        *results = R;
    return dsv4_seterr(err, DSV4_ERR_NOMEM, "run", "out of memory");
}

/* Every insertion into the report's JSON tree goes through jset / japp: jansson returns -1 when the
   value is NULL (its own allocation failed) or the insertion cannot allocate, and a report with a
   field missing must never be written, so a failure sticks until dsv4_report_json checks it. */
static _Thread_local bool j_failed;
static void jset(json_t *o, const char *key, json_t *v)
{
    if (json_object_set_new(o, key, v))
        j_failed = true;
}
static void japp(json_t *a, json_t *v)
{
    if (json_array_append_new(a, v))
        j_failed = true;
}

#ifdef DSV4_FAULTS
/* ---------------- the defect catalogue (fault build) ---------------- */

/* "check result: detail" of the first failing (then erroring) check of an injected run, "" if none. */
static char *injected_verdict(const dsv4_case_result *c)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < DSV4_CHECK_COUNT; i++) {
            dsv4_result want = pass == 0 ? DSV4_RESULT_FAIL : DSV4_RESULT_ERROR;
            if (c->checks[i].detail && c->checks[i].r == want) {
                const char *nm = dsv4_check_name(1u << i), *rn = dsv4_result_name(want);
                size_t len = strlen(nm) + strlen(rn) + strlen(c->checks[i].detail) + 4;
                char *s = malloc(len);
                if (s)
                    snprintf(s, len, "%s %s: %s", nm, rn, c->checks[i].detail);
                return s;
            }
        }
    return xstrdup("");
}

size_t dsv4_run_fault_rows(const dsv4_run_results *R, dsv4_fault_row *rows, size_t max)
{
    size_t k = 0;
    for (size_t i = 0; R && i < R->n; i++) {
        const dsv4_case_result *c = R->cases[i];
        if (c->injected || !c->defect || c->twin >= R->n)
            continue;
        const dsv4_case_result *f = R->cases[c->twin];
        if (rows && k < max) {
            dsv4_fault_id id = dsv4_fault_parse(c->defect);
            dsv4_fault_row *w = &rows[k];
            w->fault = c->defect;
            w->findings = dsv4_fault_findings(id);
            w->summary = dsv4_fault_describe(id);
            w->where = dsv4_fault_where(id);
            w->case_name = c->name;
            w->clean = c->status;
            w->injected = f->status;
            w->caught = c->status == DSV4_RESULT_PASS &&
                        (f->status == DSV4_RESULT_FAIL || f->status == DSV4_RESULT_ERROR);
            w->caught_by = f->caught_by ? f->caught_by : "";
        }
        k++;
    }
    return k;
}

dsv4_fault_summary dsv4_run_fault_summary(const dsv4_run_results *R)
{
    dsv4_fault_summary s;
    memset(&s, 0, sizeof s);
    bool named[DSV4_FAULT_END] = {0}, missed[DSV4_FAULT_END] = {0};
    for (size_t i = 0; R && i < R->n; i++) {
        const dsv4_case_result *c = R->cases[i];
        if (c->injected)
            continue;
        s.clean_runs++;
        s.false_failures += c->status == DSV4_RESULT_FAIL || c->status == DSV4_RESULT_ERROR;
        dsv4_fault_id id = dsv4_fault_parse(c->defect);
        if (id == DSV4_FAULT_NONE || c->twin >= R->n)
            continue;
        const dsv4_case_result *f = R->cases[c->twin];
        named[id] = true;
        missed[id] |= !(c->status == DSV4_RESULT_PASS &&
                        (f->status == DSV4_RESULT_FAIL || f->status == DSV4_RESULT_ERROR));
    }
    for (int id = 0; id < DSV4_FAULT_END; id++) {
        s.defects += named[id];
        s.caught += named[id] && !missed[id];
    }
    return s;
}

static json_t *fault_table_json(const dsv4_run_results *R)
{
    size_t n = dsv4_run_fault_rows(R, NULL, 0);
    dsv4_fault_row *rows = calloc(n + 1, sizeof *rows);
    json_t *o = json_object(), *arr = json_array();
    if (!rows) {
        j_failed = true;
        return o;
    }
    dsv4_run_fault_rows(R, rows, n);
    for (size_t i = 0; i < n; i++) {
        json_t *r = json_object();
        jset(r, "fault", json_string(rows[i].fault));
        jset(r, "findings", json_string(rows[i].findings));
        jset(r, "defect", json_string(rows[i].summary));
        jset(r, "injected_at", json_string(rows[i].where));
        jset(r, "case", json_string(rows[i].case_name));
        jset(r, "clean", json_string(dsv4_result_name(rows[i].clean)));
        jset(r, "injected", json_string(dsv4_result_name(rows[i].injected)));
        jset(r, "caught", json_boolean(rows[i].caught));
        jset(r, "caught_by", json_string(rows[i].caught_by));
        japp(arr, r);
    }
    free(rows);
    dsv4_fault_summary s = dsv4_run_fault_summary(R);
    jset(o, "defects", json_integer((json_int_t)s.defects));
    jset(o, "caught", json_integer((json_int_t)s.caught));
    jset(o, "clean_runs", json_integer((json_int_t)s.clean_runs));
    jset(o, "false_failures", json_integer((json_int_t)s.false_failures));
    jset(o, "rows", arr);
    return o;
}
#endif

/* ---------------- reports ---------------- */


static bool case_in(const dsv4_case_result *c, const dsv4_scenario *scn)
{
    return !scn || (!strcmp(c->scn_name, dsv4_scenario_name(scn)) && !strcmp(c->scn_path, dsv4_scenario_path(scn)));
}

static json_t *jreal(double v) { return isfinite(v) ? json_real(v) : json_null(); }
static json_t *jstr(const char *s) { return s ? json_string(s) : json_null(); }
static json_t *ju64(uint64_t v) { return json_integer((json_int_t)v); }

static json_t *metrics_json(const dsv4_compare_metrics *m)
{
    json_t *o = json_object();
    jset(o, "n", json_integer(m->n));
    jset(o, "max_abs", jreal(m->max_abs));
    jset(o, "max_rel", jreal(m->max_rel));
    jset(o, "nmse", jreal(m->nmse));
    jset(o, "deepgemm_diff", jreal(m->deepgemm_diff));
    jset(o, "rms_ref", jreal(m->rms_ref));
    jset(o, "ulp_p50", ju64(m->ulp_p50));
    jset(o, "ulp_p90", ju64(m->ulp_p90));
    jset(o, "ulp_p99", ju64(m->ulp_p99));
    jset(o, "ulp_p999", ju64(m->ulp_p999));
    jset(o, "ulp_max", ju64(m->ulp_max));
    jset(o, "ulp_nonzero", json_integer(m->ulp_nonzero));
    jset(o, "tol_violations", json_integer(m->tol_violations));
    jset(o, "bad_nonfinite", json_integer(m->bad_nonfinite));
    jset(o, "ref_nonfinite", json_integer(m->ref_nonfinite));
    jset(o, "finite_ok", json_boolean(m->finite_ok));
    return o;
}

static json_t *bins_json(const uint64_t *v)
{
    json_t *a = json_array();
    for (int i = 0; i < DSV4_ERR_BINS; i++)
        japp(a, ju64(v[i]));
    return a;
}

static json_t *errors_json(const dsv4_case_errors *E)
{
    json_t *o = json_object(), *w = json_array();
    jset(o, "n", json_integer(E->n));
    jset(o, "ulp_bins", bins_json(E->ulp_bins));
    jset(o, "ulp_bin_rule", json_string("0: 0 ulp; i in 1..14: [2^(i-1), 2^i) ulp; 15: >= 2^14 or "
                                                       "non-finite"));
    jset(o, "abs_bins", bins_json(E->abs_bins));
    jset(o, "abs_bin_rule", json_string("0: |a-b| = 0; i in 1..14: [1e(i-10), 1e(i-9)) (1: also "
                                                       "smaller); 15: >= 1e5 or non-finite"));
    for (int i = 0; i < E->n_worst; i++) {
        const dsv4_case_worst *x = &E->worst[i];
        json_t *e = json_object();
        jset(e, "index", json_integer(x->index));
        jset(e, "rank", json_integer(x->rank));
        jset(e, "token", json_integer(x->token));
        jset(e, "column", json_integer(x->column));
        jset(e, "a", jreal(x->a));
        jset(e, "b", jreal(x->b));
        jset(e, "diff", jreal(x->diff));
        japp(w, e);
    }
    jset(o, "worst", w);
    return o;
}

static json_t *case_json(const dsv4_run_results *R, const dsv4_case_result *c)
{
    json_t *o = json_object();
    jset(o, "name", jstr(c->name));
    jset(o, "scenario", jstr(c->scn_name));
    jset(o, "file", jstr(c->scn_path));
    jset(o, "index", json_integer((json_int_t)c->index));
    jset(o, "line", json_integer(c->line));
    jset(o, "col", json_integer(c->col));
    jset(o, "status", json_string(dsv4_result_name(c->status)));
    jset(o, "seconds", jreal(c->seconds));
    json_t *axes = json_array();
    const scn_rec *sr = &R->scns[c->scn];
    if (c->axis_index)
        for (size_t a = 0; a < sr->n_axes; a++) {
            json_t *ax = json_object();
            jset(ax, "name", jstr(sr->axis_names[a]));
            jset(ax, "index", json_integer(c->axis_index[a]));
            japp(axes, ax);
        }
    jset(o, "axes", axes);
    jset(o, "explicit_index", c->explicit_index >= 0 ? json_integer(c->explicit_index) : json_null());
    jset(o, "preset", jstr(c->preset));
    jset(o, "layer", json_integer(c->cfg.layer));
    json_t *cf = json_object();
    jset(cf, "routed_format", json_string(dsv4_weight_format_name(c->cfg.routed_format)));
    jset(cf, "shared_format", json_string(dsv4_weight_format_name(c->cfg.shared_format)));
    jset(cf, "act_quant", json_string(dsv4_act_quant_name(c->cfg.act_quant)));
    jset(cf, "swiglu_limit", jreal(c->cfg.swiglu_limit));
    jset(cf, "top_p", jreal(c->cfg.top_p));
    jset(o, "config", cf);
    json_t *t = json_object();
    jset(t, "world", json_integer(c->topo.world_size));
    jset(t, "tp", json_integer(c->topo.tp));
    jset(t, "dp", json_integer(c->topo.dp));
    jset(t, "ep", json_integer(c->topo.ep));
    jset(t, "role", json_string(dsv4_role_name(c->topo.role)));
    jset(t, "backend", json_string(dsv4_backend_kind_name(c->topo.backend)));
    jset(t, "sm", json_integer(c->topo.sm));
    jset(t, "graph", json_boolean(c->topo.cuda_graph));
    jset(o, "topology", t);
    jset(o, "ran_on", jstr(c->backend));
    json_t *tok = json_array(), *rep = json_array();
    for (int r = 0; r < c->n_ranks; r++) {
        japp(tok, json_integer(c->tokens[r]));
        japp(rep, json_boolean(c->replay[r]));
    }
    jset(o, "tokens", tok);
    jset(o, "replay", rep);
    jset(o, "seed", ju64(c->seed));
    jset(o, "expect", json_string(c->expect == DSV4_EXPECT_REFUSED ? "refused" : "pass"));
    jset(o, "refused_regex", jstr(c->regex));
    json_t *checks = json_array();
    for (int i = 0; i < DSV4_CHECK_COUNT; i++) {
        if (!c->checks[i].detail)
            continue;
        json_t *ck = json_object();
        jset(ck, "name", json_string(dsv4_check_name(1u << i)));
        jset(ck, "requested", json_boolean((c->requested >> i) & 1u));
        jset(ck, "result", json_string(dsv4_result_name(c->checks[i].r)));
        jset(ck, "detail", json_string(c->checks[i].detail));
        japp(checks, ck);
    }
    jset(o, "checks", checks);
    jset(o, "metrics", c->has_metrics ? metrics_json(&c->m) : json_null());
    jset(o, "errors", c->has_errors ? errors_json(&c->errs) : json_null());
    jset(o, "defect", jstr(c->defect));
    jset(o, "injected", json_boolean(c->injected));
    json_t *mem = json_object();
    jset(mem, "available", ju64(c->mem.available));
    jset(mem, "planned_max", ju64(c->mem.planned_max));
    jset(mem, "planned_step", ju64(c->mem.planned_step));
    jset(mem, "peak", c->mem.measured ? ju64(c->mem.peak) : json_null());
    jset(o, "memory", mem);
    return o;
}

dsv4_status dsv4_report_json(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path, dsv4_error *err)
{
    dsv4_outfile o;
    dsv4_status st = dsv4_report_json_stage(R, scn, path, &o, err);
    return st ? st : dsv4_out_commit(&o, err);
}

dsv4_status dsv4_report_json_stage(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path,
                                   dsv4_outfile *o, dsv4_error *err)
{
    if (!R || !path)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "report", "results and path must not be NULL");
    j_failed = false;
    json_t *root = json_object();
    jset(root, "tool", json_string("dsv4moe"));
    jset(root, "version", json_string(DSV4_VERSION));
    jset(root, "report_version", json_integer(1));
    dsv4_run_summary s;
    memset(&s, 0, sizeof s);
    json_t *cases = json_array();
    for (size_t i = 0; i < R->n; i++) {
        const dsv4_case_result *c = R->cases[i];
        if (!case_in(c, scn))
            continue;
        japp(cases, case_json(R, c));
        if (c->injected)
            continue;
        s.cases++;
        s.seconds += c->seconds;
        s.passed += c->status == DSV4_RESULT_PASS;
        s.failed += c->status == DSV4_RESULT_FAIL;
        s.skipped += c->status == DSV4_RESULT_SKIP;
        s.errors += c->status == DSV4_RESULT_ERROR;
    }
    json_t *sum = json_object();
    jset(sum, "cases", json_integer((json_int_t)s.cases));
    jset(sum, "passed", json_integer((json_int_t)s.passed));
    jset(sum, "failed", json_integer((json_int_t)s.failed));
    jset(sum, "skipped", json_integer((json_int_t)s.skipped));
    jset(sum, "errors", json_integer((json_int_t)s.errors));
    jset(sum, "seconds", jreal(s.seconds));
    jset(root, "summary", sum);
    json_t *scns = json_array();
    for (size_t i = 0; i < R->nscn; i++) {
        if (scn && (strcmp(R->scns[i].name, dsv4_scenario_name(scn)) || strcmp(R->scns[i].path, dsv4_scenario_path(scn))))
            continue;
        json_t *so = json_object(), *axes = json_array();
        jset(so, "name", jstr(R->scns[i].name));
        jset(so, "file", jstr(R->scns[i].path));
        for (size_t a = 0; a < R->scns[i].n_axes; a++)
            japp(axes, jstr(R->scns[i].axis_names[a]));
        jset(so, "axes", axes);
        japp(scns, so);
    }
    jset(root, "scenarios", scns);
#ifdef DSV4_FAULTS
    if (dsv4_run_fault_rows(R, NULL, 0) > 0)
        jset(root, "fault_table", fault_table_json(R));
#endif
    jset(root, "cases", cases);
    if (j_failed) {
        json_decref(root);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory while building the report (nothing written)");
    }
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "cannot serialise the report");
    size_t len = strlen(text);
    char *withnl = realloc(text, len + 2);
    if (!withnl) {
        free(text);
        return dsv4_seterr(err, DSV4_ERR_NOMEM, path, "out of memory");
    }
    withnl[len] = '\n';
    withnl[len + 1] = '\0';
    dsv4_status st = dsv4_out_begin(o, path, err);
    if (!st)
        st = dsv4_out_write(o, withnl, len + 1, err);
    free(withnl);
    return st;
}

/* XML text or attribute value: the five entities escaped, characters XML 1.0 forbids dropped
   (control characters other than tab, newline, carriage return; bytes of invalid UTF-8 become '?'). */
static void sb_xml(dsv4_strbuf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p) {
        unsigned char ch = *p;
        const char *ent = NULL;
        switch (ch) {
        case '&': ent = "&amp;"; break;
        case '<': ent = "&lt;"; break;
        case '>': ent = "&gt;"; break;
        case '"': ent = "&quot;"; break;
        case '\'': ent = "&apos;"; break;
        case '\t': ent = "&#9;"; break;
        case '\n': ent = "&#10;"; break;
        case '\r': ent = "&#13;"; break;
        default: break;
        }
        if (ent) {
            dsv4_sb_put(b, ent, strlen(ent));
            p++;
            continue;
        }
        if (ch < 0x20 || ch == 0x7f) {
            p++;
            continue;
        }
        if (ch < 0x80) {
            dsv4_sb_put(b, (const char *)p, 1);
            p++;
            continue;
        }
        /* UTF-8: copy a well-formed sequence, else '?' */
        int len = ch >= 0xf0 && ch < 0xf5 ? 4 : ch >= 0xe0 ? 3 : ch >= 0xc2 && ch < 0xe0 ? 2 : 0;
        bool ok = len > 0;
        for (int k = 1; ok && k < len; k++)
            ok = (p[k] & 0xc0) == 0x80;
        if (ok) {
            dsv4_sb_put(b, (const char *)p, (size_t)len);
            p += len;
        } else {
            dsv4_sb_put(b, "?", 1);
            p++;
        }
    }
}

static void junit_case(dsv4_strbuf *b, const dsv4_case_result *c)
{
    dsv4_sb_printf(b, "    <testcase classname=\"");
    sb_xml(b, c->scn_name);
    dsv4_sb_printf(b, "\" name=\"");
    sb_xml(b, c->name);
    dsv4_sb_printf(b, "\" file=\"");
    sb_xml(b, c->scn_path);
    dsv4_sb_printf(b, "\" line=\"%d\" time=\"%.3f\">\n", c->line, c->seconds);
    if (c->status == DSV4_RESULT_FAIL || c->status == DSV4_RESULT_ERROR) {
        dsv4_result want = c->status;
        const char *elem = want == DSV4_RESULT_FAIL ? "failure" : "error";
        /* The message names the failing checks; the text holds each one's detail. */
        dsv4_strbuf names = {0};
        for (int i = 0; i < DSV4_CHECK_COUNT; i++)
            if (c->checks[i].detail && c->checks[i].r == want)
                dsv4_sb_printf(&names, "%s%s", names.n ? ", " : "", dsv4_check_name(1u << i));
        dsv4_sb_printf(b, "      <%s type=\"check\" message=\"", elem);
        sb_xml(b, names.s ? names.s : "");
        dsv4_sb_printf(b, "\">");
        free(names.s);
        for (int i = 0; i < DSV4_CHECK_COUNT; i++)
            if (c->checks[i].detail && c->checks[i].r == want) {
                sb_xml(b, dsv4_check_name(1u << i));
                dsv4_sb_put(b, ": ", 2);
                sb_xml(b, c->checks[i].detail);
                dsv4_sb_put(b, "&#10;", 5);
            }
        dsv4_sb_printf(b, "</%s>\n", elem);
    } else if (c->status == DSV4_RESULT_SKIP) {
        const char *why = "every check skipped";
        for (int i = 0; i < DSV4_CHECK_COUNT; i++)
            if (c->checks[i].detail) {
                why = c->checks[i].detail;
                break;
            }
        dsv4_sb_printf(b, "      <skipped message=\"");
        sb_xml(b, why);
        dsv4_sb_printf(b, "\"/>\n");
    }
    dsv4_sb_printf(b, "      <system-out>");
    for (int i = 0; i < DSV4_CHECK_COUNT; i++)
        if (c->checks[i].detail) {
            sb_xml(b, dsv4_check_name(1u << i));
            dsv4_sb_put(b, " ", 1);
            sb_xml(b, dsv4_result_name(c->checks[i].r));
            dsv4_sb_put(b, ": ", 2);
            sb_xml(b, c->checks[i].detail);
            dsv4_sb_put(b, "&#10;", 5);
        }
    dsv4_sb_printf(b, "</system-out>\n    </testcase>\n");
}

dsv4_status dsv4_report_junit(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path, dsv4_error *err)
{
    dsv4_outfile o;
    dsv4_status st = dsv4_report_junit_stage(R, scn, path, &o, err);
    return st ? st : dsv4_out_commit(&o, err);
}

dsv4_status dsv4_report_junit_stage(const dsv4_run_results *R, const dsv4_scenario *scn, const char *path,
                                    dsv4_outfile *o, dsv4_error *err)
{
    if (!R || !path)
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "report", "results and path must not be NULL");
    dsv4_strbuf b = {0};
    dsv4_run_summary all;
    memset(&all, 0, sizeof all);
    for (size_t i = 0; i < R->n; i++) {
        const dsv4_case_result *c = R->cases[i];
        if (!case_in(c, scn) || c->injected)
            continue;
        all.cases++;
        all.seconds += c->seconds;
        all.failed += c->status == DSV4_RESULT_FAIL;
        all.skipped += c->status == DSV4_RESULT_SKIP;
        all.errors += c->status == DSV4_RESULT_ERROR;
    }
    dsv4_sb_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    dsv4_sb_printf(&b, "<testsuites name=\"dsv4moe\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\" "
                  "time=\"%.3f\">\n",
              all.cases, all.failed, all.errors, all.skipped, all.seconds);
    for (size_t k = 0; k < R->nscn; k++) {
        const scn_rec *sr = &R->scns[k];
        if (scn && (strcmp(sr->name, dsv4_scenario_name(scn)) || strcmp(sr->path, dsv4_scenario_path(scn))))
            continue;
        dsv4_run_summary s;
        memset(&s, 0, sizeof s);
        for (size_t i = 0; i < R->n; i++) {
            const dsv4_case_result *c = R->cases[i];
            if (c->scn != k || c->injected)
                continue;
            s.cases++;
            s.seconds += c->seconds;
            s.failed += c->status == DSV4_RESULT_FAIL;
            s.skipped += c->status == DSV4_RESULT_SKIP;
            s.errors += c->status == DSV4_RESULT_ERROR;
        }
        dsv4_sb_printf(&b, "  <testsuite name=\"");
        sb_xml(&b, sr->name);
        dsv4_sb_printf(&b, "\" file=\"");
        sb_xml(&b, sr->path);
        dsv4_sb_printf(&b, "\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"%zu\" time=\"%.3f\">\n", s.cases,
                  s.failed, s.errors, s.skipped, s.seconds);
        for (size_t i = 0; i < R->n; i++)
            if (R->cases[i]->scn == k && !R->cases[i]->injected)
                junit_case(&b, R->cases[i]);
        dsv4_sb_printf(&b, "  </testsuite>\n");
    }
    dsv4_sb_printf(&b, "</testsuites>\n");
    return dsv4_sb_stage(&b, path, o, err);
}

/* Joins dir and name into a new string; NULL when out of memory. */
static char *dir_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

dsv4_status dsv4_report_write_all(const dsv4_run_results *R, const char *dir, dsv4_error *err)
{
    if (!R || !dir || !dir[0])
        return dsv4_seterr(err, DSV4_ERR_INVALID_ARG, "report", "results and folder must not be NULL or empty");
    static const char *const names[3] = {"report.json", "junit.xml", "report.html"};
    char *paths[4] = {NULL, NULL, NULL, NULL};
    dsv4_outfile o[3];
    size_t staged = 0;
    dsv4_status st = DSV4_OK;
    for (int i = 0; i < 3 && !st; i++)
        if (!(paths[i] = dir_join(dir, names[i])))
            st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
    if (!st && !(paths[3] = dir_join(dir, DSV4_REPORT_LOCK)))
        st = dsv4_seterr(err, DSV4_ERR_NOMEM, dir, "out of memory");
    if (!st && !(st = dsv4_report_json_stage(R, NULL, paths[0], &o[0], err)))
        staged++;
    if (!st && !(st = dsv4_report_junit_stage(R, NULL, paths[1], &o[1], err)))
        staged++;
    if (!st && !(st = dsv4_report_html_stage(R, paths[2], &o[2], err)))
        staged++;
    if (!st)
        st = dsv4_out_commit_all(o, 3, paths[3], err);
    else
        for (size_t i = 0; i < staged; i++)
            dsv4_out_abort(&o[i]);
    for (int i = 0; i < 4; i++)
        free(paths[i]);
    return st;
}

/* ---------------- results built outside the runner (run_ext.h, dsv4moe check) ---------------- */

size_t dsv4_run_ext_scenario(dsv4_run_results **RP, const char *name, const char *path)
{
    if (!RP)
        return SIZE_MAX;
    dsv4_run_results *R = *RP;
    bool created = !R;
    if (created && !(R = calloc(1, sizeof *R)))
        return SIZE_MAX;
    scn_rec *ns = realloc(R->scns, (R->nscn + 1) * sizeof *ns);
    if (ns)
        R->scns = ns;
    scn_rec rec = {xstrdup(name), xstrdup(path), 0, calloc(1, sizeof(char *))};
    if (!ns || !rec.name || !rec.path || !rec.axis_names) {
        free(rec.name), free(rec.path), free(rec.axis_names);
        if (created)
            dsv4_run_results_free(R);
        return SIZE_MAX;
    }
    R->scns[R->nscn] = rec;
    *RP = R;
    return R->nscn++;
}

dsv4_case_result *dsv4_run_ext_case(dsv4_run_results *R, size_t scn, size_t index, const char *name,
                                    const dsv4_config *cfg, int n_ranks, const int64_t *tokens, uint64_t seed,
                                    const char *ran_on)
{
    if (!R || scn >= R->nscn || n_ranks < 1 || !grow_cases(R, 1))
        return NULL;
    dsv4_case_result *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->name = xstrdup(name);
    c->scn_name = xstrdup(R->scns[scn].name);
    c->scn_path = xstrdup(R->scns[scn].path);
    c->scn = scn;
    c->index = index;
    c->explicit_index = -1;
    c->cfg = *cfg;
    c->topo.world_size = n_ranks;
    c->topo.tp = c->topo.dp = c->topo.ep = 1;
    c->n_ranks = n_ranks;
    c->tokens = malloc((size_t)n_ranks * sizeof *c->tokens);
    c->replay = calloc((size_t)n_ranks, sizeof *c->replay);
    c->seed = seed;
    c->twin = SIZE_MAX;
    c->backend = xstrdup(ran_on);
    if (!c->name || !c->scn_name || !c->scn_path || !c->tokens || !c->replay || (ran_on && !c->backend)) {
        case_free(c);
        return NULL;
    }
    memcpy(c->tokens, tokens, (size_t)n_ranks * sizeof *c->tokens);
    R->cases[R->n++] = c;
    return c;
}

void dsv4_run_ext_ran_on(dsv4_case_result *c, const char *ran_on)
{
    char *n = ran_on ? xstrdup(ran_on) : NULL;
    if (!c || !n) {
        free(n);
        return;
    }
    free(c->backend);
    c->backend = n;
}

void dsv4_run_ext_check(dsv4_case_result *c, unsigned check_bit, dsv4_result r, const char *detail)
{
    if (!c || bit_index(check_bit) < 0 || check_set(c, check_bit))
        return;
    c->requested |= check_bit;
    set_check(c, check_bit, r, "%s", detail ? detail : "");
}

void dsv4_run_ext_numerics(dsv4_case_result *c, const dsv4_compare_metrics *m, const uint16_t *a, const uint16_t *b,
                           int64_t T, int64_t H)
{
    if (!c || !m)
        return;
    c->m = *m;
    c->has_metrics = true;
    if (a && b && T > 0)
        error_profile(c, a, b, &T, 1, H);
}

void dsv4_run_ext_finish(dsv4_case_result *c, double seconds)
{
    if (!c)
        return;
    c->seconds = seconds;
    finish_status(c);
}

dsv4_status dsv4_run_ext_mkdir_p(const char *path, dsv4_error *err) { return mkdir_p(path, err); }

void dsv4_run_ext_slices(const dsv4_topology *t, const int64_t *tokens, int n, int64_t *off)
{
    slice_offsets(t, tokens, n, off);
}
