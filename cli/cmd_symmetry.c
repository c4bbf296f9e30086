/* dsv4moe symmetry: per-rank collective traces of an engine, compared (docs/engines.md). */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "dsv4moe_harness/symmetry.h"

static const char SYMMETRY_HELP[] =
    "usage: dsv4moe symmetry TRACE TRACE...\n\n"
    "Checks that every rank issued the same collectives in the same order: per process group, each\n"
    "member rank's sequence against the group's lowest rank (sequence number, op, dtype, element count\n"
    "where it must agree, and the tag in the project's traces). Prints the first divergence naming\n"
    "both ranks and both collectives: the class of bug where one rank enters a collective (or a graph\n"
    "capture) the others never reach. One file per rank, in either format (detected from the content):\n"
    "  - the JSONL trace of the project's communicators (docs/engines.md, \"Collective traces\");\n"
    "  - PyTorch's NCCL flight-recorder dump in JSON (torch._C._distributed_c10d._dump_nccl_trace_json(),\n"
    "    or TORCH_NCCL_DEBUG_INFO_TEMP_FILE files); its rank comes from the digits ending the file name,\n"
    "    else from its position among the arguments.\n\n"
    "exit status: 0 the same everywhere, 1 a divergence, 2 bad input (an unreadable or malformed\n"
    "trace, fewer than two, mixed formats, a rank given twice)\n";

int cmd_symmetry(int argc, char **argv)
{
    const char *cmd = "symmetry";
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .help = SYMMETRY_HELP, .positional = true};
    const char *opt, *v;
    while (cli_next_arg(&args, &opt, &v)) /* no option: every argument is a trace or --help */
        ;
    if (args.status >= 0)
        return args.status;
    const int n = args.nops; /* the traces, at argv[1 .. n] */
    if (n < 2)
        return cli_failf(cmd, "at least two traces (one per rank) are needed (see dsv4moe symmetry --help)");
    dsv4_trace **t = calloc((size_t)n, sizeof *t);
    if (!t)
        return cli_failf(cmd, "out of memory");
    dsv4_error err;
    dsv4_error_clear(&err);
    int rc = EXIT_OK, k = 0;
    for (int i = 1; i <= n && rc == EXIT_OK; i++) {
        if (dsv4_trace_load(argv[i], k, &t[k], &err))
            rc = cli_fail(cmd, &err);
        else
            k++;
    }
    if (rc == EXIT_OK) {
        dsv4_symmetry_result r;
        if (dsv4_trace_symmetry((const dsv4_trace *const *)t, (size_t)n, &r, &err)) {
            rc = cli_fail(cmd, &err);
        } else {
            printf("dsv4moe symmetry: %d %s traces: %s\n", n,
                   dsv4_trace_format_of(t[0]) == DSV4_TRACE_JSONL ? "JSONL" : "flight-recorder",
                   r.same ? "the same" : "DIVERGE");
            printf("  %s\n", r.detail);
            rc = r.same ? EXIT_OK : EXIT_CHECK_FAILED;
        }
    }
    for (int i = 0; i < k; i++)
        dsv4_trace_free(t[i]);
    free(t);
    return rc;
}
