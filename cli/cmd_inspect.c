#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "dsv4moe/safetensors.h"

static const char INSPECT_HELP[] =
    "usage: dsv4moe inspect PATH [--quiet]\n\n"
    "Validates a safetensors file, a checkpoint folder (with or without\n"
    "model.safetensors.index.json) or an index file, and lists every tensor with its\n"
    "dtype, shape and size, the files, and the detected layout.\n\n"
    "  --quiet   print the summary only, not the tensor list\n";

int cmd_inspect(int argc, char **argv)
{
    const char *cmd = "inspect", *path = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(INSPECT_HELP, stdout);
            return EXIT_OK;
        } else if (!strcmp(argv[i], "--quiet")) {
            quiet = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_failf(cmd, "unknown option '%s' (see dsv4moe inspect --help)", argv[i]);
        } else if (path) {
            return cli_failf(cmd, "one PATH only ('%s' and '%s')", path, argv[i]);
        } else {
            path = argv[i];
        }
    }
    if (!path)
        return cli_failf(cmd, "missing PATH (see dsv4moe inspect --help)");
    dsv4_checkpoint *ck = NULL;
    dsv4_error err;
    dsv4_error_clear(&err);
    if (dsv4_checkpoint_open(path, &ck, &err))
        return cli_fail(cmd, &err);
    cli_print_skipped(cmd, ck);
    size_t nt = dsv4_checkpoint_tensor_count(ck), nf = dsv4_checkpoint_file_count(ck);
    uint64_t bytes = 0;
    for (size_t i = 0; i < nt; i++)
        bytes += dsv4_checkpoint_tensor_meta(ck, i)->nbytes;
    const char *prefix = dsv4_checkpoint_prefix(ck);
    printf("%s: %zu file%s, %zu tensors, %llu bytes of data, layout %s%s%s%s\n", path, nf, nf == 1 ? "" : "s", nt,
           (unsigned long long)bytes, dsv4_layout_name(dsv4_checkpoint_layout(ck)), prefix[0] ? " (prefix '" : "",
           prefix, prefix[0] ? "')" : "");
    char esc[4096];
    for (size_t f = 0; f < nf; f++)
        printf("  file %s\n", cli_esc(dsv4_checkpoint_file_path(ck, f), esc, sizeof esc));
    if (!quiet) {
        for (size_t i = 0; i < nt; i++) {
            const dsv4_tensor_info *t = dsv4_checkpoint_tensor_meta(ck, i);
            char shape[160];
            size_t off = (size_t)snprintf(shape, sizeof shape, "[");
            for (int d = 0; d < t->ndim && off < sizeof shape; d++)
                off += (size_t)snprintf(shape + off, sizeof shape - off, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
            if (off < sizeof shape)
                snprintf(shape + off, sizeof shape - off, "]");
            printf("  %-56s %-8s %-22s %llu\n", cli_esc(t->name, esc, sizeof esc), dsv4_dtype_name(t->dtype), shape,
                   (unsigned long long)t->nbytes);
        }
    }
    dsv4_checkpoint_close(ck);
    return EXIT_OK;
}
