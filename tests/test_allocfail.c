/*
 * Allocation-failure injection (docs/reliability.md). The test binary is
 * linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,
 * --wrap=free, so every call of those from an object linked statically (the
 * library's .a and the tests) goes through the __wrap_ functions below; jansson's
 * allocations are tracked for leaks (json_set_alloc_funcs) but not failed (see
 * af_json_malloc). libyaml, OpenBLAS and
 * libc's own internals (fopen, qsort, pthread) are shared libraries and are
 * not reached: their failures are not injected.
 *
 * The sweep runs one representative workflow (config, plan, weight
 * generation, checkpoint load, ref and cpu forwards, scenario parse, run and
 * the three reports) once to count its allocations, then again for every n,
 * failing the n-th allocation, until a run completes without reaching n.
 * Each failing run must return an error status (or record the case as
 * errored), free every allocation it made (tracked here, pointer by pointer)
 * and leave the report files as they were before.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4moe/backend.h"
#include "dsv4moe/config.h"
#include "dsv4moe/gen.h"
#include "dsv4moe/plan.h"
#include "dsv4moe/ref.h"
#include "dsv4moe_harness/run.h"
#include "dsv4moe/safetensors.h"
#include "dsv4moe_harness/scenario.h"
#include "tests/testutil.h"

Suite *allocfail_suite(void);

/* ---------------- the wrappers ---------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
void __wrap_free(void *p);

static atomic_bool af_active;   /* counting and tracking on */
static atomic_bool af_wrapped;  /* set by any wrapper: the link really wraps */
static atomic_ullong af_count;  /* allocations seen since af_begin */
static atomic_ullong af_fail_at; /* 0: never */
static atomic_ullong af_failed; /* injected failures */

/* Live allocations made while active: an open-addressed set of pointers. */
#define AF_SLOTS (1u << 18)
static void *af_set[AF_SLOTS];
static size_t af_live;
static pthread_mutex_t af_mu = PTHREAD_MUTEX_INITIALIZER;
static void *const AF_TOMB = (void *)&af_set;

static size_t af_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (AF_SLOTS - 1);
}

static void af_track(void *p)
{
    pthread_mutex_lock(&af_mu);
    size_t i = af_hash(p);
    while (af_set[i] && af_set[i] != AF_TOMB)
        i = (i + 1) & (AF_SLOTS - 1);
    af_set[i] = p;
    af_live++;
    pthread_mutex_unlock(&af_mu);
}

static void af_untrack(void *p)
{
    pthread_mutex_lock(&af_mu);
    for (size_t i = af_hash(p), k = 0; af_set[i] && k < AF_SLOTS; i = (i + 1) & (AF_SLOTS - 1), k++)
        if (af_set[i] == p) {
            af_set[i] = AF_TOMB;
            af_live--;
            break;
        }
    pthread_mutex_unlock(&af_mu);
}

/* True when this call is the one to fail. */
static bool af_should_fail(void)
{
    atomic_store(&af_wrapped, true);
    if (!atomic_load(&af_active))
        return false;
    unsigned long long n = atomic_fetch_add(&af_count, 1) + 1;
    if (n == atomic_load(&af_fail_at)) {
        atomic_fetch_add(&af_failed, 1);
        if (getenv("DSV4_ALLOCFAIL_TRACE")) { /* where the injected failure lands, for debugging */
            fprintf(stderr, "allocfail: failing allocation %llu\n", n);
            void *bt[32];
            backtrace_symbols_fd(bt, backtrace(bt, 32), 2);
        }
        return true;
    }
    return false;
}

static void *af_result(void *p)
{
    if (p && atomic_load(&af_active))
        af_track(p);
    return p;
}

void *__wrap_malloc(size_t n)
{
    if (af_should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    return af_result(__real_malloc(n));
}

void *__wrap_calloc(size_t n, size_t m)
{
    if (af_should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    return af_result(__real_calloc(n, m));
}

void *__wrap_realloc(void *p, size_t n)
{
    if (af_should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    void *q = __real_realloc(p, n);
    if (q && p && atomic_load(&af_active))
        af_untrack(p);
    return af_result(q);
}

/* jansson's allocator: tracked for leaks, never failed. jansson 2.14 does not survive its own
   allocation failures (an injected failure inside json_dumps dropped a character of the output and
   then corrupted the heap; one inside json_loads corrupted the heap), so failing them would test
   jansson, not this library. */
static void *af_json_malloc(size_t n) { return af_result(__real_malloc(n)); }

char *__wrap_strdup(const char *s)
{
    if (af_should_fail()) {
        errno = ENOMEM;
        return NULL;
    }
    return af_result(__real_strdup(s));
}

void __wrap_free(void *p)
{
    if (p && atomic_load(&af_active))
        af_untrack(p);
    __real_free(p);
}

static void af_begin(unsigned long long fail_at)
{
    pthread_mutex_lock(&af_mu);
    memset(af_set, 0, sizeof af_set);
    af_live = 0;
    pthread_mutex_unlock(&af_mu);
    atomic_store(&af_count, 0);
    atomic_store(&af_failed, 0);
    atomic_store(&af_fail_at, fail_at);
    json_set_alloc_funcs(af_json_malloc, __wrap_free);
    atomic_store(&af_active, true);
}

/* Ends a run; returns the number of allocations still live. */
static size_t af_end(void)
{
    atomic_store(&af_active, false);
    json_set_alloc_funcs(malloc, free);
    pthread_mutex_lock(&af_mu);
    size_t live = af_live;
    pthread_mutex_unlock(&af_mu);
    return live;
}

/* ---------------- the representative workflow ---------------- */

static const char *const scenario_text = "name: af\n"
                                         "defaults:\n"
                                         "  preset: tiny\n"
                                         "  layer: 1\n"
                                         "  topology: {world: 1, tp: 1, dp: 1, ep: 1, backend: cpu}\n"
                                         "  tokens: [5]\n"
                                         "  seed: 3\n"
                                         "  checks: [numerics, determinism, memory, empty]\n"
                                         "  expect: pass\n"
                                         "axes:\n"
                                         "  topology:\n"
                                         "    - {backend: cpu}\n"
                                         "    - {backend: ref}\n"
                                         "    - {world: 2, dp: 2, ep: 2}\n";

static const char *const report_names[3] = {"report.json", "junit.xml", "report.html"};
static const char previous[] = "previous report\n";

static char af_root[512];

static void rm_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        rm_tree(p);
    }
    closedir(d);
    rmdir(path);
}

static void prepare_dirs(void)
{
    tu_path(af_root, sizeof af_root, "allocfail");
    rm_tree(af_root);
    ck_assert_int_eq(mkdir(af_root, 0755), 0);
    char p[1024];
    for (int u = 0; u < 2; u++) {
        snprintf(p, sizeof p, "%s/%s", af_root, u ? "unit" : "reports");
        ck_assert_int_eq(mkdir(p, 0755), 0);
        for (int i = 0; i < 3; i++) {
            snprintf(p, sizeof p, "%s/%s/%s", af_root, u ? "unit" : "reports", report_names[i]);
            ck_assert_int_eq(tu_write_file(p, previous, sizeof previous - 1), 0);
        }
    }
}

/* Each report is either the previous text (untouched) or a complete new report; nothing else in the folder.
   unit/ is written by dsv4_report_write_all: all three old or all three new (written[3]). */
static void check_reports(const bool written[4], unsigned long long n)
{
    char p[1024];
    for (int k = 0; k < 6; k++) {
        int i = k % 3;
        bool w = k < 3 ? written[i] : written[3];
        snprintf(p, sizeof p, "%s/%s/%s", af_root, k < 3 ? "reports" : "unit", report_names[i]);
        FILE *f = fopen(p, "rb");
        ck_assert_msg(f, "n=%llu: %s is gone", n, report_names[i]);
        char buf[64] = {0};
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        bool old = got == sizeof previous - 1 && !memcmp(buf, previous, got);
        if (!w)
            ck_assert_msg(old, "n=%llu: %s changed although its writer failed", n, report_names[i]);
        else
            ck_assert_msg(!old && got > 16, "n=%llu: %s not rewritten", n, report_names[i]);
    }
    for (int u = 0; u < 2; u++) {
        snprintf(p, sizeof p, "%s/%s", af_root, u ? "unit" : "reports");
        DIR *d = opendir(p);
        ck_assert_ptr_nonnull(d);
        int entries = 0;
        struct dirent *de;
        while ((de = readdir(d)))
            entries += de->d_name[0] != '.';
        closedir(d);
        ck_assert_msg(entries == 3, "n=%llu: %d entries in %s (a temporary file left?)", n, entries, p);
    }
}

/* report.json without its timings (the only field that differs between two clean runs). */
static void strip_seconds(json_t *v)
{
    if (json_is_object(v)) {
        json_object_del(v, "seconds");
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) strip_seconds(x);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) strip_seconds(x);
    }
}

static json_t *load_report(void)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/reports/report.json", af_root);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    ck_assert_msg(j, "report.json does not parse: %s", je.text);
    strip_seconds(j);
    return j;
}

typedef struct wf_result {
    dsv4_status st;      /* the first error, DSV4_OK when all went through */
    const char *step;    /* where it stopped */
    char message[DSV4_ERROR_MESSAGE_MAX];
    int case_errors;     /* cases recorded as DSV4_RESULT_ERROR */
    int case_pass;       /* cases that passed or were self-compared (no check failed) */
    bool written[4]; /* which report writers succeeded; [3]: dsv4_report_write_all */
} wf_result;

#define STEP(name, call)                                                                                              \
    do {                                                                                                              \
        r.step = name;                                                                                                \
        if ((r.st = (call)) != DSV4_OK) {                                                                             \
            snprintf(r.message, sizeof r.message, "%s", e.message);                                                   \
            goto out;                                                                                                 \
        }                                                                                                             \
    } while (0)

/* Everything that may allocate happens between af_begin and af_end. */
static wf_result workflow(void)
{
    wf_result r = {DSV4_OK, "", "", 0, 0, {false, false, false}};
    dsv4_error e;
    dsv4_error_clear(&e);
    dsv4_config cfg;
    dsv4_plan *plan = NULL;
    dsv4_checkpoint *ck = NULL;
    dsv4_st_file *in = NULL;
    dsv4_ref *ref = NULL;
    dsv4_backend *be = NULL;
    dsv4_scenario *scn = NULL;
    dsv4_run_results *res = NULL;
    char wpath[1024], ipath[1024], cache[1024], rp[1024];
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", af_root);
    snprintf(ipath, sizeof ipath, "%s/in.safetensors", af_root);
    snprintf(cache, sizeof cache, "%s/cache", af_root);
    unlink(wpath);
    unlink(ipath);
    rm_tree(cache);

    STEP("config", dsv4_config_preset("tiny", &cfg, &e));
    STEP("config set", dsv4_config_set_kv(&cfg, "layer=1", &e));
    STEP("config validate", dsv4_config_validate(&cfg, &e));
    dsv4_topology topo;
    dsv4_budget budget;
    dsv4_topology_init(&topo);
    dsv4_budget_init(&budget);
    topo.backend = DSV4_BACKEND_CPU;
    topo.host_threads = 1;
    STEP("plan", dsv4_plan_create(&cfg, &topo, &budget, &plan, &e));
    dsv4_gen_options go;
    dsv4_gen_options_init(&go);
    STEP("gen weights", dsv4_gen_weights(&cfg, &go, wpath, &e));
    STEP("gen input", dsv4_gen_input(&cfg, &go, 5, ipath, &e));
    STEP("checkpoint", dsv4_checkpoint_open(wpath, &ck, &e));
    STEP("input", dsv4_st_open(ipath, &in, &e));
    const dsv4_tensor_info *x = dsv4_st_find(in, "x"), *ids = dsv4_st_find(in, "input_ids");
    if (!x || !ids) { /* no Check assertion while counting: Check's own allocations are wrapped too */
        r.st = DSV4_ERR_INTERNAL;
        snprintf(r.message, sizeof r.message, "the generated input lacks x or input_ids");
        goto out;
    }
    STEP("ref create", dsv4_ref_create(&cfg, ck, 1, &ref, &e));
    uint16_t y[5 * 128];
    dsv4_ref_output ro = {0};
    ro.y = y;
    STEP("ref forward", dsv4_ref_forward(ref, 5, x->data, ids->data, &ro, &e));
    float terms[5 * 128]; /* the fp32 profile with y_terms (SPEC.md section 10) */
    STEP("ref rounding", dsv4_ref_set_rounding(ref, DSV4_ROUNDING_FP32, &e));
    STEP("ref forward terms", dsv4_ref_forward_terms(ref, 5, x->data, ids->data, &ro, terms, &e));
    STEP("cpu create", dsv4_backend_create(plan, ck, 1, &be, &e));
    dsv4_forward_out fo = {0};
    uint16_t y2[5 * 128];
    fo.y = y2;
    STEP("cpu forward", dsv4_backend_forward(be, 5, x->data, ids->data, &fo, &e));

    STEP("scenario parse", dsv4_scenario_load_string(scenario_text, "af.yaml", &scn, &e));
    dsv4_run_options o;
    dsv4_run_options_init(&o);
    o.cache_dir = cache;
    o.threads = 1;
    STEP("scenario run", dsv4_run_scenario(scn, &o, &res, &e));
    for (size_t i = 0; i < dsv4_run_count(res); i++) {
        dsv4_result cs = dsv4_case_status(dsv4_run_get(res, i));
        r.case_errors += cs == DSV4_RESULT_ERROR;
        r.case_pass += cs == DSV4_RESULT_PASS || cs == DSV4_RESULT_SELF;
    }
    snprintf(rp, sizeof rp, "%s/reports/%s", af_root, report_names[0]);
    STEP("report json", dsv4_report_json(res, scn, rp, &e));
    r.written[0] = true;
    snprintf(rp, sizeof rp, "%s/reports/%s", af_root, report_names[1]);
    STEP("report junit", dsv4_report_junit(res, scn, rp, &e));
    r.written[1] = true;
    snprintf(rp, sizeof rp, "%s/reports/%s", af_root, report_names[2]);
    STEP("report html", dsv4_report_html(res, rp, &e));
    r.written[2] = true;
    snprintf(rp, sizeof rp, "%s/unit", af_root);
    STEP("reports as one unit", dsv4_report_write_all(res, rp, &e));
    r.written[3] = true;
out:
    dsv4_run_results_free(res);
    dsv4_scenario_free(scn);
    dsv4_backend_free(be);
    dsv4_ref_free(ref);
    dsv4_st_close(in);
    dsv4_checkpoint_close(ck);
    dsv4_plan_free(plan);
    return r;
}

/* The first n where DSV4_ALLOCFAIL_STRIDE > 1 thins the sweep (every stride-th n, plus the first 64). */
static unsigned long long stride(void)
{
    const char *s = getenv("DSV4_ALLOCFAIL_STRIDE");
    long v = s ? strtol(s, NULL, 10) : 1;
    return v > 1 ? (unsigned long long)v : 1;
}

START_TEST(every_allocation_failure_is_clean)
{
    prepare_dirs();
    af_begin(0);
    wf_result clean = workflow();
    size_t live = af_end();
    unsigned long long total = atomic_load(&af_count);
    ck_assert_msg(atomic_load(&af_wrapped), "the test binary is not linked with -Wl,--wrap=malloc,...");
    ck_assert_msg(clean.st == DSV4_OK, "clean run failed at %s: %s", clean.step, clean.message);
    ck_assert_int_eq(clean.case_errors, 0);
    ck_assert_int_gt(clean.case_pass, 0);
    ck_assert_msg(live == 0, "clean run leaves %zu allocations", live);
    ck_assert_uint_gt(total, 100);
    check_reports(clean.written, 0);
    json_t *clean_report = load_report();

    const char *from = getenv("DSV4_ALLOCFAIL_FROM"); /* debugging: start the sweep there */
    unsigned long long step = stride(), n = from ? strtoull(from, NULL, 10) : 1, runs = 0, reached = 0, recovered = 0;
    for (;; n += n < 64 ? 1 : step) {
        prepare_dirs();
        af_begin(n);
        wf_result r = workflow();
        live = af_end();
        runs++;
        if (atomic_load(&af_failed) == 0) {
            /* this run allocated fewer than n times: the sweep has covered every allocation */
            ck_assert_msg(r.st == DSV4_OK, "n=%llu: no failure injected, yet %s failed: %s", n, r.step, r.message);
            reached = atomic_load(&af_count);
            break;
        }
        ck_assert_msg(live == 0, "n=%llu: %zu allocations leaked (stopped at '%s': %s)", n, live, r.step,
                      r.message);
        if (r.st == DSV4_OK && r.case_errors == 0 && r.case_pass == clean.case_pass) {
            /* Recovered (the runner regenerating a cache file it could not open, say):
               acceptable only when the outcome is exactly the clean run's. */
            json_t *rep = load_report();
            if (!json_equal(rep, clean_report)) { /* keep both for a diff */
                char p[1024];
                snprintf(p, sizeof p, "%s-clean.json", af_root);
                json_dump_file(clean_report, p, JSON_INDENT(1) | JSON_SORT_KEYS);
                snprintf(p, sizeof p, "%s-n%llu.json", af_root, n);
                json_dump_file(rep, p, JSON_INDENT(1) | JSON_SORT_KEYS);
            }
            ck_assert_msg(json_equal(rep, clean_report),
                          "n=%llu: the failed allocation went unnoticed, and report.json differs from the clean "
                          "run's", n);
            json_decref(rep);
            recovered++;
        }
        if (r.st != DSV4_OK)
            ck_assert_msg(r.message[0] != '\0', "n=%llu: %s failed without a message", n, r.step);
        check_reports(r.written, n);
        ck_assert_uint_lt(n, 10 * total + 1000); /* a run that keeps allocating more would never end */
    }
    fprintf(stderr,
            "allocfail: %llu allocations in the clean run, %llu runs, the last reached n = %llu (stride %llu); "
            "%llu recovered to the clean outcome\n",
            total, runs, reached, step, recovered);
    json_decref(clean_report);
}
END_TEST

Suite *allocfail_suite(void)
{
    Suite *s = suite_create("allocfail");
    TCase *tc = tcase_create("sweep");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, every_allocation_failure_is_clean);
    suite_add_tcase(s, tc);
    return s;
}
