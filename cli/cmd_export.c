/* dsv4moe export: a scenario matrix's cases as folders an outside engine runs (docs/engines.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dsv4moe/engines.h"
#include "dsv4moe/scenario.h"

static const char EXPORT_HELP[] =
    "usage: dsv4moe export FILE.yaml... --dir D [--layout split|stacked] [--filter SUBSTRING] [--threads N]\n"
    "                      [--rounding LIST]\n\n"
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
    "                    spec is always written)\n\n"
    "exit status: 0 written, 2 bad input (a scenario file, an option, a folder that cannot be written)\n";

/* The case folders of every file of the call must be distinct: the library checks the cases of one
   scenario; two files whose cases sanitize to one id would otherwise write one folder twice. */
static int ids_unique(dsv4_scenario *const *scns, int n, char **argv, const char *filter)
{
    size_t cap = 0, k = 0;
    struct {
        char id[512];
        const char *name;
        int file;
    } *seen = NULL;
    int rc = EXIT_OK;
    for (int f = 0; f < n && !rc; f++)
        for (size_t i = 0; i < dsv4_scenario_count(scns[f]) && !rc; i++) {
            const dsv4_scenario_case *sc = dsv4_scenario_get(scns[f], i);
            if ((filter && !strstr(sc->name, filter)) || sc->expect != DSV4_EXPECT_PASS || sc->config_status)
                continue;
            for (int r = 0; r < sc->n_ranks && !rc; r++) {
                if (k == cap) {
                    cap = cap ? 2 * cap : 64;
                    void *ns = realloc(seen, cap * sizeof *seen);
                    if (!ns) {
                        rc = cli_failf("export", "out of memory");
                        break;
                    }
                    seen = ns;
                }
                dsv4_export_case_id(sc->name, sc->n_ranks == 1 ? -1 : r, seen[k].id, sizeof seen[k].id);
                seen[k].name = sc->name;
                seen[k].file = f;
                for (size_t j = 0; j < k && !rc; j++)
                    if (seen[j].file != f && !strcmp(seen[j].id, seen[k].id))
                        rc = cli_failf("export", "%s: case '%s' has the case id '%s' of case '%s' of %s: rename one",
                                       argv[1 + f], sc->name, seen[k].id, seen[j].name, argv[1 + seen[j].file]);
                k++;
            }
        }
    free(seen);
    return rc;
}

int cmd_export(int argc, char **argv)
{
    const char *cmd = "export", *dir = NULL, *filter = NULL;
    dsv4_export_options eo;
    dsv4_export_options_init(&eo);
    int64_t threads = 2;
    static const char *const opts[] = {"--dir", "--layout", "--filter", "--threads", "--rounding", NULL};
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .help = EXPORT_HELP, .value_opts = opts,
                     .positional = true};
    const char *a, *v;
    while (cli_next_arg(&args, &a, &v)) {
        if (!strcmp(a, "--dir"))
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
    if ((rc = ids_unique(scns, args.nops, argv, filter))) {
        cli_free_scenarios(scns, args.nops);
        return rc;
    }
    size_t total = 0, skipped = 0;
    for (int f = 0; f < args.nops && rc == EXIT_OK; f++) {
        dsv4_error err;
        dsv4_error_clear(&err);
        size_t w = 0, l = 0;
        dsv4_status st = dsv4_export_scenario(scns[f], dir, &eo, &w, &l, &err);
        total += w;
        skipped += l;
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
