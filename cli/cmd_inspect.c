#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "dsv4moe/formats.h"
#include "dsv4moe/safetensors.h"

static const char INSPECT_HELP[] =
    "usage: dsv4moe inspect PATH [--quiet]\n\n"
    "Validates a safetensors file, a checkpoint folder (with or without\n"
    "model.safetensors.index.json) or an index file, and lists every tensor with its\n"
    "dtype, shape and size, the files, and the detected layout. For fp4 weights (I8 codes with\n"
    "F8_E8M0 1x32 scales) it also counts the 128-groups whose scales the gemm fp8 mode cannot\n"
    "convert to e4m3 exactly (their experts run on the exact kernels; docs/cuda.md).\n\n"
    "  --quiet   print the summary only, not the tensor list\n";

int cmd_inspect(int argc, char **argv)
{
    const char *cmd = "inspect";
    int quiet = 0;
    cli_args args = {.cmd = cmd, .argc = argc, .argv = argv, .help = INSPECT_HELP,
                     .flags = (const char *const[]){"--quiet", NULL}, .positional = true};
    const char *opt, *v;
    while (cli_next_arg(&args, &opt, &v))
        quiet = 1; /* --quiet, the only option */
    if (args.status >= 0)
        return args.status;
    if (args.nops > 1)
        return cli_failf(cmd, "one PATH only ('%s' and '%s')", argv[1], argv[2]);
    const char *path = args.nops ? argv[1] : NULL; /* the operand */
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
    /* fp4 weights under gemm fp8 (SPEC.md section 9): 128-groups past the exact conversion bound */
    uint64_t fp4_tensors = 0, groups = 0, beyond = 0, beyond_tensors = 0;
    for (size_t i = 0; i < nt; i++) {
        const dsv4_tensor_info *m = dsv4_checkpoint_tensor_meta(ck, i);
        size_t len = strlen(m->name);
        if (m->dtype != DSV4_DTYPE_F8_E8M0 || m->ndim != 2 || m->shape[1] % 4 || len < 6 ||
            strcmp(m->name + len - 6, ".scale") || len + 2 > sizeof esc)
            continue;
        memcpy(esc, m->name, len - 6);
        strcpy(esc + len - 6, ".weight");
        const dsv4_tensor_info *w = dsv4_checkpoint_find_meta(ck, esc);
        if (!w || w->dtype != DSV4_DTYPE_I8 || w->ndim != 2 || w->shape[0] != m->shape[0] ||
            w->shape[1] != 16 * m->shape[1])
            continue; /* not packed fp4 with 1x32 scales */
        const dsv4_tensor_info *t = dsv4_checkpoint_tensor(ck, i);
        if (!t) {
            dsv4_checkpoint_close(ck);
            return cli_failf(cmd, "cannot read '%s' (it changed or is truncated)", cli_esc(m->name, esc, sizeof esc));
        }
        int64_t b = dsv4_fp4_scales_beyond_e4m3(t->data, m->shape[0], 32 * m->shape[1]);
        fp4_tensors++;
        groups += (uint64_t)(m->shape[0] * (m->shape[1] / 4));
        beyond += (uint64_t)b;
        beyond_tensors += b > 0;
        if (b > 0 && beyond_tensors <= 8)
            printf("  gemm fp8: %s has %lld 128-groups beyond the exact e4m3 bound (scale spread > %d)\n",
                   cli_esc(m->name, esc, sizeof esc), (long long)b, DSV4_FP4_TO_FP8_SPREAD);
    }
    if (fp4_tensors)
        printf("fp4 weights for gemm fp8: %llu tensors, %llu 128-groups, %llu beyond the exact bound in %llu "
               "tensors%s\n",
               (unsigned long long)fp4_tensors, (unsigned long long)groups, (unsigned long long)beyond,
               (unsigned long long)beyond_tensors, beyond ? " (those experts run on the exact kernels)" : "");
    dsv4_checkpoint_close(ck);
    return EXIT_OK;
}
