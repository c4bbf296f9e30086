/* The planner's outputs and refusals pinned: every rank of every case of the scenario matrices
   (the files of scenarios/ and tests/smoke.yaml) planned, and a product of topologies on two layers of
   v4-flash, are printed the way `dsv4moe plan` reads them (the explanation, the workspace of a
   step at a few token counts, the weights, the ranges) or as the refusal's message, and the text
   is compared byte for byte with tests/data/plan_golden.txt. A change of the planner or of a
   backend's memory model that moves a figure or a message shows here as the first line that
   differs; DSV4MOE_GOLDEN_WRITE=PATH writes the text where the change is meant. Builds with
   CUDA skip it: their cuda plans carry the device layouts' memory model and weight bytes. */
#include <check.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4moe/config.h"
#include "dsv4moe/plan.h"
#include "dsv4moe_harness/scenario.h"
#include "core/fileio.h"
#include "core/hash.h"
#include "core/strbuf.h"
#include "tests/testutil.h"

Suite *plangolden_suite(void);

/* One rank's plan: its figures, or the refusal. */
static void put_plan(dsv4_strbuf *b, const dsv4_config *cfg, const dsv4_topology *t, const dsv4_budget *bud)
{
    dsv4_plan *p = NULL;
    dsv4_error e;
    dsv4_status st = dsv4_plan_create(cfg, t, bud, &p, &e);
    if (st) {
        dsv4_sb_printf(b, "  refused (%s): %s\n", dsv4_status_str(st), e.message);
        return;
    }
    dsv4_sb_printf(b, "%s", dsv4_plan_explain(p));
    int64_t mx = t->max_tokens_per_rank, ch = dsv4_plan_chunk_tokens(p);
    const int64_t at[] = {0, 1, 7, ch, mx};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
        dsv4_sb_printf(b, "  T %" PRId64 ": eager %" PRIu64 " (%s, %" PRId64 " chunks), replay %" PRIu64 " (%s)\n", at[i],
             dsv4_plan_workspace_bytes(p, at[i], false), dsv4_executor_kind_name(dsv4_plan_executor(p, at[i], false)),
             dsv4_plan_chunks(p, at[i]), dsv4_plan_workspace_bytes(p, at[i], true),
             dsv4_executor_kind_name(dsv4_plan_executor(p, at[i], true)));
    dsv4_sb_printf(b, "  max %" PRIu64 " of %" PRIu64 ", weights %" PRIu64 ", gemm %s, router %s, experts %" PRId64 "+%" PRId64
            ", inter %" PRId64 "+%" PRId64 "\n",
         dsv4_plan_workspace_max(p), dsv4_plan_budget_available(p), dsv4_plan_weight_bytes(p),
         dsv4_gemm_mode_name(dsv4_plan_gemm(p)), dsv4_router_kind_name(dsv4_plan_router(p)),
         dsv4_plan_expert_first(p), dsv4_plan_expert_count(p), dsv4_plan_inter_first(p), dsv4_plan_inter_count(p));
    dsv4_plan_free(p);
}

/* The whole text, for a reader of a failure (written next to the test's files). */
static dsv4_strbuf full;

/* A block: its body's FNV-1a 64 after the head, or the body itself where it is a refusal (the
   messages are what the pin is for). The full text goes to `full`. */
static void emit(dsv4_strbuf *b, const char *head, dsv4_strbuf *body)
{
    const char *s = body->s ? body->s : "";
    dsv4_sb_printf(&full, "%s\n%s", head, s);
    if (!strncmp(s, "  refused", 9)) {
        dsv4_sb_printf(b, "%s\n%s", head, s);
    } else {
        uint64_t h = dsv4_fnv1a(DSV4_FNV_OFFSET, s, body->n);
        dsv4_sb_printf(b, "%s #%016" PRIx64 "\n", head, h);
    }
    free(body->s);
    *body = (dsv4_strbuf){0};
}

static void put_scenario(dsv4_strbuf *b, const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", tu_src_dir(), rel);
    dsv4_scenario *s = NULL;
    dsv4_error e;
    ck_assert_msg(dsv4_scenario_load(path, &s, &e) == DSV4_OK, "%s", e.message);
    for (size_t i = 0; i < dsv4_scenario_count(s); i++) {
        const dsv4_scenario_case *c = dsv4_scenario_get(s, i);
        if (c->config_status) {
            dsv4_sb_printf(b, "== %s: config refused: %s\n", c->name, c->config_error);
            continue;
        }
        for (int r = 0; r < c->n_ranks; r++) {
            dsv4_topology t = c->topology;
            t.rank = r;
            dsv4_strbuf body = {0};
            put_plan(&body, &c->config, &t, &c->budget);
            char head[512];
            snprintf(head, sizeof head, "== %s rank %d", c->name, r);
            emit(b, head, &body);
        }
    }
    dsv4_scenario_free(s);
}

/* The product: backends, sm, graphs, executors, dispatch, role, shardings and two budgets on a
   dense and a hash layer; a line per topology, the messages numbered once. */
static void put_product(dsv4_strbuf *b)
{
    static const int shard[][4] = {{1, 1, 1, 1}, {2, 1, 2, 1}, {1, 2, 2, 2}, {2, 2, 4, 2}, {1, 4, 4, 4}, {3, 1, 3, 1},
                                   {1, 8, 8, 8}, {1, 2, 2, 1}}; /* tp, dp, world, ep */
    static const int sms[] = {80, 90, 100, 120};
    static const char *const presets[] = {"v4-flash", "mini"};
    static const int64_t layers[] = {2, 0};
    enum { MAXMSG = 256 };
    char *msgs[MAXMSG];
    int nmsg = 0;
    for (int pr = 0; pr < 2; pr++)
        for (int l = 0; l < 2; l++) {
            dsv4_config cfg;
            ck_assert_int_eq(dsv4_config_preset(presets[pr], &cfg, NULL), DSV4_OK);
            cfg.layer = layers[l];
            for (int be = 0; be < 3; be++)
                for (size_t sm = 0; sm < sizeof sms / sizeof sms[0]; sm++) {
                    if (be != DSV4_BACKEND_CUDA && sm != 1)
                        continue;
                    dsv4_strbuf body = {0};
                    for (int g = 0; g < 2; g++)
                        for (int ex = 0; ex < 4; ex++)
                            for (int d = 0; d < 4; d++)
                                for (int role = 0; role < 3; role += 1 + (g == 0))
                                    for (size_t sh = 0; sh < sizeof shard / sizeof shard[0]; sh++)
                                        for (int bu = 0; bu < 2; bu++) {
                                            dsv4_topology t;
                                            dsv4_topology_init(&t);
                                            t.backend = (dsv4_backend_kind)be;
                                            t.sm = sms[sm];
                                            t.cuda_graph = g;
                                            if (g)
                                                for (int64_t k = 1; k <= 256; k *= 2)
                                                    t.buckets[t.n_buckets++] = k;
                                            t.executor = (dsv4_executor_req)ex;
                                            t.dispatch = (dsv4_dispatch_req)d;
                                            t.role = (dsv4_role)role;
                                            t.tp = shard[sh][0], t.dp = shard[sh][1], t.world_size = shard[sh][2];
                                            t.ep = shard[sh][3];
                                            t.rank = t.world_size - 1;
                                            dsv4_budget bud;
                                            dsv4_budget_init(&bud);
                                            if (bu)
                                                bud.taken_bytes = bud.device_bytes - (UINT64_C(4) << 30) -
                                                                  (pr ? UINT64_C(20) << 20 : UINT64_C(600) << 20);
                                            dsv4_sb_printf(&body, "%d %d %d %d %zu %d: ", g, ex, d, role, sh, bu);
                                            dsv4_plan *p = NULL;
                                            dsv4_error e;
                                            dsv4_status st = dsv4_plan_create(&cfg, &t, &bud, &p, &e);
                                            if (!st) {
                                                dsv4_sb_printf(&body, "chunk %" PRId64 " max %" PRIu64 " %s/%s\n",
                                                     dsv4_plan_chunk_tokens(p), dsv4_plan_workspace_max(p),
                                                     dsv4_executor_kind_name(dsv4_plan_executor(p, 1, false)),
                                                     dsv4_executor_kind_name(dsv4_plan_executor(p, 1, true)));
                                                dsv4_plan_free(p);
                                                continue;
                                            }
                                            int m = 0;
                                            while (m < nmsg && strcmp(msgs[m], e.message))
                                                m++;
                                            if (m == nmsg) {
                                                ck_assert_int_lt(nmsg, MAXMSG);
                                                msgs[nmsg++] = strdup(e.message);
                                            }
                                            dsv4_sb_printf(&body, "%s #%d\n", dsv4_status_str(st), m);
                                        }
                    char head[128];
                    snprintf(head, sizeof head, "## %s layer %" PRId64 " backend %s sm %d", presets[pr], layers[l],
                             dsv4_backend_kind_name((dsv4_backend_kind)be), sms[sm]);
                    emit(b, head, &body);
                }
        }
    dsv4_sb_printf(b, "## messages\n");
    for (int m = 0; m < nmsg; m++) {
        dsv4_sb_printf(b, "#%d %s\n", m, msgs[m]);
        free(msgs[m]);
    }
}

static void write_text(const char *path, const dsv4_strbuf *t)
{
    dsv4_error e;
    ck_assert_msg(!t->oom, "out of memory building %s", path);
    ck_assert_msg(dsv4_write_file_atomic(path, t->s, t->n, &e) == DSV4_OK, "%s", e.message);
}

START_TEST(outputs_and_refusals_unchanged)
{
#ifdef DSV4_WITH_CUDA
    return;
#endif
    dsv4_strbuf b = {0};
    static const char *const files[] = {"scenarios/ci.yaml", "scenarios/default.yaml", "scenarios/engines.yaml",
                                        "scenarios/gpu.yaml", "scenarios/seed-review.yaml", "tests/smoke.yaml"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        dsv4_sb_printf(&b, "# %s\n", files[i]);
        put_scenario(&b, files[i]);
    }
    put_product(&b);
    const char *w = getenv("DSV4MOE_GOLDEN_WRITE");
    char fullpath[1024];
    tu_path(fullpath, sizeof fullpath, "plan_golden.full.txt");
    write_text(fullpath, &full);
    if (w && *w)
        write_text(w, &b);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/plan_golden.txt", tu_src_dir());
    size_t glen = 0;
    unsigned char *gs = tu_slurp(path, &glen);
    ck_assert_msg(gs != NULL, "%s is missing (DSV4MOE_GOLDEN_WRITE=PATH writes it)", path);
    dsv4_strbuf g = {(char *)gs, glen, glen, false};
    /* The first line that differs, with its number. */
    size_t i = 0, line = 1, start = 0;
    while (i < b.n && i < g.n && b.s[i] == g.s[i]) {
        if (b.s[i] == '\n')
            line++, start = i + 1;
        i++;
    }
    if (i < b.n || i < g.n) {
        const char *ea = strchr(b.s + start, '\n'), *eg = g.s ? strchr(g.s + start, '\n') : NULL;
        ck_abort_msg("plan_golden.txt line %zu differs (every figure and message now: %s):\n  now:    %.*s\n"
                     "  pinned: %.*s", line, fullpath,
                     (int)(ea ? ea - (b.s + start) : (ptrdiff_t)(b.n - start)), b.s + start,
                     (int)(eg ? eg - (g.s + start) : (ptrdiff_t)(g.n > start ? g.n - start : 0)),
                     g.s ? g.s + start : "");
    }
    free(b.s);
    free(g.s);
    free(full.s);
    full = (dsv4_strbuf){0};
}
END_TEST

Suite *plangolden_suite(void)
{
    Suite *s = suite_create("plangolden");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, outputs_and_refusals_unchanged);
    suite_add_tcase(s, tc);
    return s;
}
