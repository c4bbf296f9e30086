/* dsv4moe plan: print the execution plan of one rank, or the planner's refusal. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dsv4moe/plan.h"

static const char PLAN_HELP[] =
    "usage: dsv4moe plan [--preset P | --config FILE] --layer N [--set KEY=VALUE ...]\n"
    "                    [--world N --tp N --dp N --ep N --rank N] [--role prefill|decode|mixed]\n"
    "                    [--backend ref|cpu|cuda --sm N --graph on|off --buckets 1,2,4,...]\n"
    "                    [--max-tokens N --chunk N] [--dispatch D] [--executor X]\n"
    "                    [--device-gib G --reserve-mb M --taken-gib G] [--tokens T ...]\n\n"
    "Plans one rank of a MoE layer (docs/planner.md) and prints every choice, the workspace of a\n"
    "step at a few token counts T (the largest rank's tokens) and the maximum against the budget.\n"
    "A topology the planner refuses prints the refusal, naming the settings, and exits 2.\n\n"
    "%s"
    "  --world N            world_size, ranks in all (default tp x dp)\n"
    "  --tp N               tensor-parallel ranks: moe_inter_dim sharded over tp (default 1)\n"
    "  --dp N               data-parallel ranks (default 1)\n"
    "  --ep N               expert-parallel ranks, dividing world_size (default 1)\n"
    "  --rank N             the rank to plan (default 0)\n"
    "  --role R             prefill (default), decode, or mixed (prefill and decode on one instance)\n"
    "  --backend B          ref (default), cpu or cuda\n"
    "  --sm N               the CUDA architecture: 90, 100, 103 or 120 (default 90; cuda only)\n"
    "  --graph on|off       CUDA graph capture and replay (default off; cuda only)\n"
    "  --buckets LIST       capture buckets, tokens per rank, ascending (default with --graph on:\n"
    "                       1,2,4,8,16,32,64,128,256)\n"
    "  --max-tokens N       max_tokens_per_rank (default 4096)\n"
    "  --chunk N            chunk_tokens: a multiple of 128 or max_tokens (default 0: the planner chooses)\n"
    "  --dispatch D         auto (default), all_gather, all_to_all or low_latency (decode only)\n"
    "  --executor X         auto (default), contiguous, masked or per_token\n"
    "  --device-gib G       device memory in GiB (default 80)\n"
    "  --reserve-mb M       the runtime reserve asked for, MiB; the reserve is max(M MiB, 2 GiB,\n"
    "                       5%% of the device) (default 1024)\n"
    "  --taken-gib G        memory already taken by weights, KV cache, ... in GiB (default 0)\n"
    "  --tokens T           also show the workspace at T tokens; repeatable\n";

static int parse_gib(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || !isfinite(v) || v < 0 || v > 1048576.0)
        return cli_failf(cmd, "option %s: '%s' is not a number of GiB in [0, 1048576]", opt, s), -1;
    *out = (uint64_t)(v * 1073741824.0);
    return 0;
}

static int parse_buckets(const char *cmd, const char *s, dsv4_topology *t)
{
    char buf[512];
    if (strlen(s) >= sizeof buf)
        return cli_failf(cmd, "option --buckets: list too long"), -1;
    strcpy(buf, s);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == DSV4_MAX_BUCKETS)
            return cli_failf(cmd, "option --buckets: at most %d buckets", DSV4_MAX_BUCKETS), -1;
        int64_t v;
        if (cli_parse_i64(cmd, "--buckets", tok, 1, INT64_C(1) << 40, &v))
            return -1;
        t->buckets[n++] = v;
    }
    if (!n)
        return cli_failf(cmd, "option --buckets: give at least one bucket"), -1;
    t->n_buckets = n;
    return 0;
}

static int pick(const char *cmd, const char *opt, const char *s, const char *const *names, int *out)
{
    for (int k = 0; names[k]; k++)
        if (!strcmp(s, names[k])) {
            *out = k;
            return 0;
        }
    char list[256] = "";
    for (int k = 0; names[k]; k++) {
        strncat(list, names[k], sizeof list - strlen(list) - 1);
        if (names[k + 1])
            strncat(list, ", ", sizeof list - strlen(list) - 1);
    }
    cli_failf(cmd, "option %s: '%s' is not one of %s", opt, s, list);
    return -1;
}

static void human(char *buf, size_t n, uint64_t v)
{
    if (v >= (UINT64_C(1) << 30))
        snprintf(buf, n, "%.2f GiB", (double)v / 1073741824.0);
    else if (v >= (UINT64_C(1) << 20))
        snprintf(buf, n, "%.1f MiB", (double)v / 1048576.0);
    else if (v >= 1024)
        snprintf(buf, n, "%.1f KiB", (double)v / 1024.0);
    else
        snprintf(buf, n, "%llu B", (unsigned long long)v);
}

static void add_t(int64_t *ts, int *nt, int cap, int64_t v)
{
    if (v < 0)
        return;
    for (int k = 0; k < *nt; k++)
        if (ts[k] == v)
            return;
    if (*nt < cap)
        ts[(*nt)++] = v;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int cmd_plan(int argc, char **argv)
{
    const char *cmd = "plan";
    static const char *const roles[] = {"prefill", "decode", "mixed", NULL};
    static const char *const backends[] = {"ref", "cpu", "cuda", NULL};
    static const char *const onoff[] = {"off", "on", NULL};
    static const char *const dispatches[] = {"auto", "all_gather", "all_to_all", "low_latency", NULL};
    static const char *const executors[] = {"auto", "contiguous", "masked", "per_token", NULL};
    cli_config_opts co = {0};
    dsv4_topology topo;
    dsv4_budget budget;
    dsv4_topology_init(&topo);
    dsv4_budget_init(&budget);
    int64_t world = 0, v;
    bool buckets_given = false;
    int64_t extra[64];
    int nextra = 0;
    static const char *const value_opts[] = {"--world", "--tp", "--dp", "--ep", "--rank", "--sm", "--role", "--backend", "--graph", "--buckets", "--max-tokens", "--chunk", "--dispatch", "--executor", "--device-gib", "--taken-gib", "--reserve-mb", "--tokens", NULL};
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .co = &co, .help = PLAN_HELP, .value_opts = value_opts};
    const char *a, *val;
    while (cli_next_arg(&args, &a, &val)) {
        int e = 0, k;
        if (!strcmp(a, "--world")) {
            e = cli_parse_i64(cmd, a, val, 1, 1 << 20, &world);
        } else if (!strcmp(a, "--tp") || !strcmp(a, "--dp") || !strcmp(a, "--ep") || !strcmp(a, "--rank") ||
                   !strcmp(a, "--sm")) {
            e = cli_parse_i64(cmd, a, val, !strcmp(a, "--rank") ? 0 : 1, 1 << 20, &v);
            int *dst = !strcmp(a, "--tp") ? &topo.tp : !strcmp(a, "--dp") ? &topo.dp : !strcmp(a, "--ep") ? &topo.ep
                       : !strcmp(a, "--rank")                            ? &topo.rank
                                                                         : &topo.sm;
            if (!e)
                *dst = (int)v;
        } else if (!strcmp(a, "--role")) {
            if (!(e = pick(cmd, a, val, roles, &k)))
                topo.role = (dsv4_role)k;
        } else if (!strcmp(a, "--backend")) {
            if (!(e = pick(cmd, a, val, backends, &k)))
                topo.backend = (dsv4_backend_kind)k;
        } else if (!strcmp(a, "--graph")) {
            if (!(e = pick(cmd, a, val, onoff, &k)))
                topo.cuda_graph = k == 1;
        } else if (!strcmp(a, "--buckets")) {
            e = parse_buckets(cmd, val, &topo);
            buckets_given = true;
        } else if (!strcmp(a, "--max-tokens")) {
            e = cli_parse_i64(cmd, a, val, 1, INT64_C(1) << 40, &topo.max_tokens_per_rank);
        } else if (!strcmp(a, "--chunk")) {
            e = cli_parse_i64(cmd, a, val, 0, INT64_C(1) << 40, &topo.chunk_tokens);
        } else if (!strcmp(a, "--dispatch")) {
            if (!(e = pick(cmd, a, val, dispatches, &k)))
                topo.dispatch = (dsv4_dispatch_req)k;
        } else if (!strcmp(a, "--executor")) {
            if (!(e = pick(cmd, a, val, executors, &k)))
                topo.executor = (dsv4_executor_req)k;
        } else if (!strcmp(a, "--device-gib")) {
            e = parse_gib(cmd, a, val, &budget.device_bytes);
        } else if (!strcmp(a, "--taken-gib")) {
            e = parse_gib(cmd, a, val, &budget.taken_bytes);
        } else if (!strcmp(a, "--reserve-mb")) {
            e = cli_parse_i64(cmd, a, val, 0, INT64_C(1) << 40, &v);
            if (!e)
                budget.reserve_mb = (uint64_t)v;
        } else if (!strcmp(a, "--tokens")) {
            e = cli_parse_i64(cmd, a, val, 0, INT64_C(1) << 40, &v);
            if (!e && nextra == (int)(sizeof extra / sizeof extra[0]))
                return cli_failf(cmd, "too many --tokens options (at most %zu)", sizeof extra / sizeof extra[0]);
            if (!e)
                extra[nextra++] = v;
        } else {
            return cli_failf(cmd, "unknown option '%s' (see dsv4moe plan --help)", a);
        }
        if (e)
            return EXIT_BAD_INPUT;
    }
    if (args.status >= 0)
        return args.status;
    topo.world_size = world ? (int)world : topo.tp * topo.dp;
    if (topo.cuda_graph && !buckets_given) {
        static const int64_t def[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
        topo.n_buckets = 0;
        for (size_t k = 0; k < sizeof def / sizeof def[0]; k++)
            if (def[k] <= topo.max_tokens_per_rank)
                topo.buckets[topo.n_buckets++] = def[k];
    }
    dsv4_config cfg;
    int rc = cli_config_build(cmd, &co, &cfg);
    if (rc)
        return rc;
    dsv4_error err;
    dsv4_error_clear(&err);
    dsv4_plan *plan = NULL;
    if (dsv4_plan_create(&cfg, &topo, &budget, &plan, &err))
        return cli_fail(cmd, &err);

    fputs(dsv4_plan_explain(plan), stdout);
    int64_t ts[96];
    int nt = 0, cap = (int)(sizeof ts / sizeof ts[0]);
    int64_t chunk = dsv4_plan_chunk_tokens(plan), bmax = topo.cuda_graph ? topo.buckets[topo.n_buckets - 1] : -1;
    add_t(ts, &nt, cap, 0);
    add_t(ts, &nt, cap, 1);
    add_t(ts, &nt, cap, bmax);
    add_t(ts, &nt, cap, chunk);
    add_t(ts, &nt, cap, topo.max_tokens_per_rank);
    for (int k = 0; k < nextra; k++)
        add_t(ts, &nt, cap, extra[k]);
    qsort(ts, (size_t)nt, sizeof ts[0], cmp_i64);
    printf("\nworkspace per step (T = the largest rank's tokens):\n");
    printf("  %10s %7s  %-10s %14s  %-8s %-10s %14s\n", "T", "chunks", "eager", "eager bytes", "replay", "graph",
           "graph bytes");
    for (int k = 0; k < nt; k++) {
        int64_t t = ts[k];
        bool rep = dsv4_plan_can_replay(plan, t);
        char eb[32], gb[32];
        human(eb, sizeof eb, dsv4_plan_workspace_bytes(plan, t, false));
        if (rep)
            human(gb, sizeof gb, dsv4_plan_workspace_bytes(plan, t, true));
        printf("  %10lld %7lld  %-10s %14s  %-8s %-10s %14s\n", (long long)t, (long long)dsv4_plan_chunks(plan, t),
               dsv4_executor_kind_name(dsv4_plan_executor(plan, t, false)), eb, rep ? "yes" : "no",
               rep ? dsv4_executor_kind_name(dsv4_plan_executor(plan, t, true)) : "-", rep ? gb : "-");
    }
    uint64_t wmax = dsv4_plan_workspace_max(plan), avail = dsv4_plan_budget_available(plan);
    char wm[32], av[32];
    human(wm, sizeof wm, wmax);
    human(av, sizeof av, avail);
    printf("\nmax workspace %llu bytes (%s) of %llu available (%s)\n", (unsigned long long)wmax, wm,
           (unsigned long long)avail, av);
    dsv4_plan_free(plan);
    return EXIT_OK;
}
