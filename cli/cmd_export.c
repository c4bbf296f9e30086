/* dsv4moe export: a scenario matrix's cases as folders an outside engine runs (docs/engines.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dsv4moe_harness/engines.h"
#include "dsv4moe_harness/scenario.h"

static const char EXPORT_HELP[] =
    "usage: dsv4moe export FILE.yaml... --dir D [--layout split|stacked] [--filter SUBSTRING] [--threads N]\n"
    "                      [--rounding LIST] [--quiet]\n\n"
    "Writes every world-1 case of the scenario files, and each rank of their multi-rank cases, that\n"
    "expects a pass, as a folder D/<case-id>/ (docs/engines.md, format version 2):\n"
    "  model.safetensors     the layer's checkpoint in the chosen layout with the real key names\n"
    "  input.safetensors     x BF16 [T, H], input_ids I32 [T]\n"
    "  expected.safetensors  the reference's y BF16 [T, H], topk_ids I32 [T, K], topk_weights F32 [T, K]\n"
    "                        and y_terms F32 [T, H] (SPEC.md section 10.2) at the rounding profile spec\n"
    "  expected.P.safetensors  the same at the profiles bf16_ops and fp32 (SPEC.md section 10.1)\n"
    "  case.json             the case id, layer, every config key, the files of each profile, the checks\n"
    "                        and the tolerance\n"
    "An engine runs each folder and writes O/<case-id>/output.safetensors; `dsv4moe check D --outputs O`\n"
    "gives the verdicts.\n\n"
    "  --dir D           where the case folders go (created)\n"
    "  --layout L        split (default: the official release's keys and formats) or stacked (HF\n"
    "                    transformers' keys, model.layers.N.mlp.*, bf16; the reference quantizes it at\n"
    "                    load as the case's formats say, so a bf16-computing engine matches the bf16 cases)\n"
    "  --filter S        only cases whose name contains S\n"
    "  --threads N       the reference's threads (default 2; the outputs do not depend on it)\n"
    "  --rounding LIST   the profiles to write, comma-separated: spec, bf16_ops, fp32 (default all three;\n"
    "                    spec is always written)\n"
    "  --quiet           no progress line (shown on a terminal: the folders written and the time left)\n\n"
    "exit status: 0 written, 2 bad input (a scenario file, an option, a folder that cannot be written)\n";

/* The progress line: folders of the current file, its case id. */
static void on_progress(void *user, size_t done, size_t total, const char *case_id)
{
    cli_progress_count(user, done, total, case_id);
}

int cmd_export(int argc, char **argv)
{
    const char *cmd = "export", *dir = NULL, *filter = NULL;
    dsv4_export_options eo;
    dsv4_export_options_init(&eo);
    int64_t threads = 2;
    static const char *const opts[] = {"--dir", "--layout", "--filter", "--threads", "--rounding", NULL};
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .help = EXPORT_HELP, .value_opts = opts,
                     .flags = (const char *const[]){"--quiet", NULL}, .positional = true};
    const char *a, *v;
    bool quiet = false;
    while (cli_next_arg(&args, &a, &v)) {
        if (!strcmp(a, "--quiet"))
            quiet = true;
        else if (!strcmp(a, "--dir"))
            dir = v;
        else if (!strcmp(a, "--filter"))
            filter = v;
        else if (!strcmp(a, "--layout")) {
            if (cli_parse_layout(cmd, v, &eo.layout))
                return EXIT_BAD_INPUT;
        } else if (!strcmp(a, "--rounding")) {
            if (cli_parse_roundings(cmd, v, &eo.roundings))
                return EXIT_BAD_INPUT;
        } else if (cli_parse_i64(cmd, a, v, 1, 256, &threads))
            return EXIT_BAD_INPUT;
    }
    if (args.status >= 0)
        return args.status;
    eo.threads = (int)threads;
    eo.filter = filter;
    if (!args.nops || !dir)
        return cli_failf(cmd, "%s (see dsv4moe export --help)", !args.nops ? "no scenario file given" : "--dir D is needed");
    dsv4_scenario **scns;
    int rc = cli_load_scenarios(&args, &scns);
    if (rc)
        return rc;
    /* the case folders of every file of the call, distinct, before the first file is exported */
    dsv4_error cerr;
    dsv4_error_clear(&cerr);
    if (dsv4_export_check_ids((const dsv4_scenario *const *)scns, (size_t)args.nops, dir, &eo, &cerr)) {
        cli_free_scenarios(scns, args.nops);
        return cli_fail(cmd, &cerr);
    }
    size_t total = 0, skipped = 0;
    cli_progress prog;
    cli_progress_start(&prog, "dsv4moe export", quiet);
    eo.progress = on_progress;
    eo.progress_user = &prog;
    for (int f = 0; f < args.nops && rc == EXIT_OK; f++) {
        dsv4_error err;
        dsv4_error_clear(&err);
        size_t w = 0, l = 0;
        dsv4_status st = dsv4_export_scenario(scns[f], dir, &eo, &w, &l, &err);
        total += w;
        skipped += l;
        cli_progress_end(&prog);
        if (st) {
            fprintf(stderr, "dsv4moe export: %s: %s\n", argv[1 + f], err.message); /* the operands */
            rc = EXIT_BAD_INPUT;
        }
    }
    if (rc == EXIT_OK) {
        if (!total)
            rc = cli_failf(cmd, "no case exported%s%s%s", filter ? " (--filter '" : "", filter ? filter : "",
                           filter ? "')" : "");
        else
            printf("dsv4moe export: %zu case folder%s in %s (%zu case%s left out: refusals or invalid configs)\n",
                   total, total == 1 ? "" : "s", dir, skipped, skipped == 1 ? "" : "s");
    }
    cli_free_scenarios(scns, args.nops);
    return rc;
}
