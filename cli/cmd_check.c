/* dsv4moe check: an outside engine's outputs against exported cases (docs/engines.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "cli/cli.h"
#include "dsv4moe_harness/engines.h"

static const char CHECK_HELP[] =
    "usage: dsv4moe check D --outputs O [--report R] [--map NAME=y|topk_ids|topk_weights ...]\n"
    "                     [--sentinel E|-1|absent] [--fp8] [--rounding spec|bf16_ops|fp32] [--no-diagnose]\n"
    "       dsv4moe check D --catalogue --engine CMD [--report R] [--rounding P,...] [--sentinel S] [--fp8]\n\n"
    "Holds an engine's outputs O/<case-id>/output.safetensors against the case folders of D (written by\n"
    "`dsv4moe export`): y (any float dtype, [T, H]; rounded to bf16 when wider) against the reference at\n"
    "the engine's rounding profile (SPEC.md section 10) under the outside-engine rule: DeepGEMM diff\n"
    "< 1e-3 and at most 0.5 %% of the elements beyond atol + rtol |b| + 2^-8 S (atol = rtol = 0.035, S the\n"
    "case's y_terms), on every format; bf16 ULP figures are reported, not judged; and, where the engine\n"
    "writes them, topk_ids as sets per token and topk_weights matched by expert id (|a-b| <= 1e-6 +\n"
    "1e-5 |b|). Writes R/report.json, R/junit.xml and R/report.html as `run` does; each verdict names\n"
    "the profile and counts the elements beyond with S and without. A failing case's verdict ends with the\n"
    "class of the catalogue it likely is (\"likely NAME: ...\"): the output passes against the reference\n"
    "computed that way (docs/engines.md), or \"no known class fits\".\n\n"
    "  --outputs O       the engine's outputs, one folder per case id\n"
    "  --report R        where the reports go (default out/check)\n"
    "  --map NAME=T      read the engine's tensor NAME as y, topk_ids or topk_weights (repeatable)\n"
    "  --sentinel S      how the engine marks a pruned top-p slot: E (default), -1, absent\n"
    "  --fp8             the engine accumulates on FP8 tensor cores: rule outside-fp8-mma (at most 2 %%\n"
    "                    beyond)\n"
    "  --rounding P      the engine's rounding profile: spec (default), bf16_ops (eager PyTorch on a bf16\n"
    "                    model) or fp32 (a model run in fp32, a fused SwiGLU + quantization epilogue); an\n"
    "                    output whose metadata key engine_rounding names a profile is held to that one\n"
    "  --no-diagnose     do not name the likely class of a failing case (naming it computes the case's\n"
    "                    layer once per class)\n"
    "  --catalogue       the detection table: runs the engine command CMD once clean and once per class of\n"
    "                    the catalogue, in each profile (--rounding: a comma list; default all three), and\n"
    "                    checks each run; prints the table (class x profile: cases caught, named, the first)\n"
    "                    and writes it to R/catalogue.md, each run's outputs and log under R/catalogue/\n"
    "  --engine CMD      the engine command for --catalogue, run by sh with {cases}, {outputs}, {class}\n"
    "                    (none: the engine clean) and {rounding} replaced by quoted values\n\n"
    "exit status: 0 every case passed, 1 some case failed, 2 bad input (a case without an output, an\n"
    "unreadable or malformed output or case folder, a profile the case was not exported with: each named);\n"
    "with --catalogue: 0 every class caught and named on every failing case in every profile and the clean\n"
    "engine passing every case, 1 otherwise, 2 a run could not be made (the engine failed: its log named)\n";

int cmd_check(int argc, char **argv)
{
    const char *cmd = "check", *outputs = NULL, *report = "out/check";
    dsv4_check_options co;
    dsv4_check_options_init(&co);
    static const char *const opts[] = {"--outputs", "--report", "--map", "--sentinel", "--rounding", "--engine", NULL};
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .help = CHECK_HELP, .value_opts = opts,
                     .flags = (const char *const[]){"--fp8", "--no-diagnose", "--catalogue", NULL},
                     .positional = true};
    const char *a, *v, *engine = NULL, *roundings = NULL;
    bool catalogue = false;
    while (cli_next_arg(&args, &a, &v)) {
        if (!strcmp(a, "--fp8")) {
            co.fp8_mma = true;
        } else if (!strcmp(a, "--no-diagnose")) {
            co.no_diagnose = true;
        } else if (!strcmp(a, "--catalogue")) {
            catalogue = true;
        } else if (!strcmp(a, "--engine")) {
            engine = v;
        } else if (!strcmp(a, "--outputs")) {
            outputs = v;
        } else if (!strcmp(a, "--report")) {
            report = v;
        } else if (!strcmp(a, "--sentinel")) {
            if (!dsv4_sentinel_parse(v, &co.sentinel))
                return cli_failf(cmd, "--sentinel '%s': not E, -1 or absent", v);
        } else if (!strcmp(a, "--rounding")) {
            roundings = v;
        } else {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || (strcmp(eq + 1, "y") && strcmp(eq + 1, "topk_ids") && strcmp(eq + 1, "topk_weights")))
                return cli_failf(cmd, "--map '%s': not NAME=y, NAME=topk_ids or NAME=topk_weights", v);
            if (co.n_map == DSV4_CHECK_MAP_MAX)
                return cli_failf(cmd, "too many --map options (at most %d)", DSV4_CHECK_MAP_MAX);
            /* argv outlives the call: the name is the text before '=' (copied), the target after it */
            char *from = strndup(v, (size_t)(eq - v));
            if (!from)
                return cli_failf(cmd, "out of memory");
            co.map_from[co.n_map] = from;
            co.map_to[co.n_map++] = eq + 1;
        }
    }
    if (args.status >= 0)
        return args.status;
    int rc = EXIT_OK;
    if (args.nops > 1) {
        rc = cli_failf(cmd, "unexpected argument '%s': one cases folder only", argv[2]);
        goto out;
    }
    const char *dir = args.nops ? argv[1] : NULL;
    unsigned profiles = (1u << DSV4_ROUNDING_COUNT) - 1;
    if (catalogue) {
        if (!dir || !engine || outputs) {
            rc = cli_failf(cmd, "%s (see dsv4moe check --help)",
                           !dir     ? "no cases folder given"
                           : engine ? "--catalogue writes its own outputs: no --outputs"
                                    : "--catalogue needs --engine CMD");
            goto out;
        }
        if (roundings && cli_parse_roundings(cmd, roundings, &profiles) != 0) {
            rc = EXIT_BAD_INPUT;
            goto out;
        }
        rc = cli_check_catalogue(dir, engine, report, &co, profiles);
        goto out;
    }
    if (engine) {
        rc = cli_failf(cmd, "--engine is an option of --catalogue");
        goto out;
    }
    if (roundings) {
        dsv4_error perr;
        if (dsv4_rounding_parse(roundings, &co.rounding, &perr)) {
            rc = cli_failf(cmd, "--%s", perr.message);
            goto out;
        }
    }
    if (!dir || !outputs) {
        rc = cli_failf(cmd, "%s (see dsv4moe check --help)", !dir ? "no cases folder given" : "--outputs O is needed");
        goto out;
    }
    dsv4_error err;
    dsv4_error_clear(&err);
    dsv4_run_results *res = NULL;
    if (dsv4_check_engine(dir, outputs, &co, &res, &err)) {
        rc = cli_fail(cmd, &err);
        goto out;
    }
    char jpath[4200], xpath[4200], hpath[4200];
    snprintf(jpath, sizeof jpath, "%s/report.json", report);
    snprintf(xpath, sizeof xpath, "%s/junit.xml", report);
    snprintf(hpath, sizeof hpath, "%s/report.html", report);
    if (dsv4_mkdir_p(report, &err)) {
        rc = cli_fail(cmd, &err);
    } else if (dsv4_report_json(res, NULL, jpath, &err) || dsv4_report_junit(res, NULL, xpath, &err) ||
               dsv4_report_html(res, hpath, &err)) {
        rc = cli_fail(cmd, &err);
    } else {
        dsv4_run_summary s = dsv4_run_summarize(res);
        for (size_t i = 0; i < dsv4_run_count(res); i++) {
            const dsv4_case_result *c = dsv4_run_get(res, i);
            const char *detail;
            dsv4_case_check(c, DSV4_CHECK_NUMERICS, &detail);
            const char *mem = "";
            bool has_mem = dsv4_case_check(c, DSV4_CHECK_MEMORY, &mem) != DSV4_RESULT_SKIP;
            dsv4_result r = dsv4_case_status(c);
            printf("%-5s %s: %s%s%s\n", r == DSV4_RESULT_PASS ? "pass" : r == DSV4_RESULT_FAIL ? "FAIL" : "ERROR",
                   dsv4_case_name(c), detail, has_mem ? "; " : "", has_mem ? mem : "");
            if (r == DSV4_RESULT_ERROR)
                fprintf(stderr, "dsv4moe check: %s: %s%s%s\n", dsv4_case_name(c), detail, has_mem ? "; " : "",
                        has_mem ? mem : "");
        }
        printf("dsv4moe check: %zu cases: %zu passed, %zu failed, %zu errors\nreports: %s, %s, %s\n", s.cases,
               s.passed, s.failed, s.errors, jpath, xpath, hpath);
        rc = s.errors ? EXIT_BAD_INPUT : s.failed ? EXIT_CHECK_FAILED : EXIT_OK;
    }
    dsv4_run_results_free(res);
out:
    for (int k = 0; k < co.n_map; k++)
        free((char *)co.map_from[k]);
    return rc;
}
