#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dsv4moe/compare.h"
#include "dsv4moe/safetensors.h"

static const char DIFF_HELP[] =
    "usage: dsv4moe diff A.safetensors B.safetensors [--tensor NAME ...]\n\n"
    "Compares the tensors two dumps have in common (or the named ones): BF16 tensors by the\n"
    "SPEC.md section 7 metrics with B as the reference (max |a-b|, max relative error, nMSE,\n"
    "DeepGEMM's diff, bf16 ULP percentiles, elements beyond atol = rtol = 0.035, NaN where B is\n"
    "finite), other dtypes bytewise (elements that differ). So an engine's dump can be held\n"
    "against `dsv4moe ref`.\n\n"
    "  --tensor NAME   compare this tensor (repeatable; default: every common tensor)\n\n"
    "exit status: 0 every tensor within tolerance (BF16: DeepGEMM diff < 1e-3, no NaN where B is\n"
    "finite, at most 0.5 %% of elements beyond atol/rtol; other dtypes: identical), 1 some tensor\n"
    "outside it, 2 bad input (a missing file or tensor, or shapes and dtypes that differ)\n";

/* Compares one tensor pair; returns 0 within tolerance, 1 outside, 2 not comparable. */
static int diff_tensor(const dsv4_tensor_info *a, const dsv4_tensor_info *b)
{
    bool same = a->dtype == b->dtype && a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    if (!same) {
        fprintf(stderr, "dsv4moe diff: tensor '%s': %s with %d dims in %s, %s with %d dims in %s\n", a->name,
                dsv4_dtype_name(a->dtype), a->ndim, a->file, dsv4_dtype_name(b->dtype), b->ndim, b->file);
        return 2;
    }
    if (a->dtype != DSV4_DTYPE_BF16) {
        size_t es = dsv4_dtype_size(a->dtype);
        uint64_t differ = 0;
        for (uint64_t i = 0; i < a->numel; i++)
            differ += memcmp((const char *)a->data + i * es, (const char *)b->data + i * es, es) != 0;
        printf("%-24s %-5s %llu elements, %llu differ\n", a->name, dsv4_dtype_name(a->dtype),
               (unsigned long long)a->numel, (unsigned long long)differ);
        return differ ? 1 : 0;
    }
    /* The mapping may be unaligned: copy into aligned arrays first. */
    uint16_t *x = malloc(a->nbytes + 2), *y = malloc(b->nbytes + 2);
    if (!x || !y) {
        free(x);
        free(y);
        fprintf(stderr, "dsv4moe diff: out of memory for tensor '%s'\n", a->name);
        return 2;
    }
    memcpy(x, a->data, a->nbytes);
    memcpy(y, b->data, b->nbytes);
    dsv4_compare_metrics m;
    bool ok = dsv4_compare_bf16(x, y, (int64_t)a->numel, &m);
    free(x);
    free(y);
    if (!ok) {
        fprintf(stderr, "dsv4moe diff: out of memory comparing tensor '%s'\n", a->name);
        return 2;
    }
    char line[512];
    dsv4_compare_format(&m, line, sizeof line);
    printf("%-24s BF16  %s\n", a->name, line);
    int64_t allowed = m.n / 200 > 1 ? m.n / 200 : 1;
    return m.bad_nonfinite == 0 && m.deepgemm_diff < 1e-3 && m.tol_violations <= allowed ? 0 : 1;
}

int cmd_diff(int argc, char **argv)
{
    const char *cmd = "diff", *pa = NULL, *pb = NULL, *names[64];
    int nn = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf(DIFF_HELP);
            return EXIT_OK;
        } else if (!strcmp(argv[i], "--tensor")) {
            const char *v = cli_value(cmd, argc, argv, &i);
            if (!v)
                return EXIT_BAD_INPUT;
            if (nn == (int)(sizeof names / sizeof names[0]))
                return cli_failf(cmd, "too many --tensor options (at most %zu)", sizeof names / sizeof names[0]);
            names[nn++] = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_failf(cmd, "unknown option '%s' (see dsv4moe diff --help)", argv[i]);
        } else if (!pa) {
            pa = argv[i];
        } else if (!pb) {
            pb = argv[i];
        } else {
            return cli_failf(cmd, "unexpected argument '%s': two files only", argv[i]);
        }
    }
    if (!pa || !pb)
        return cli_failf(cmd, "two files are needed (see dsv4moe diff --help)");
    dsv4_st_file *a = NULL, *b = NULL;
    dsv4_error err;
    dsv4_error_clear(&err);
    if (dsv4_st_open(pa, &a, &err) || dsv4_st_open(pb, &b, &err)) {
        dsv4_st_close(a);
        return cli_fail(cmd, &err);
    }
    int worst = 0, compared = 0;
    if (nn) {
        for (int k = 0; k < nn && worst < 2; k++) {
            const dsv4_tensor_info *ta = dsv4_st_find(a, names[k]), *tb = dsv4_st_find(b, names[k]);
            if (!ta || !tb) {
                fprintf(stderr, "dsv4moe diff: tensor '%s' is missing from %s\n", names[k], !ta ? pa : pb);
                worst = 2;
                break;
            }
            int r = diff_tensor(ta, tb);
            worst = r > worst ? r : worst;
            compared++;
        }
    } else {
        for (size_t k = 0; k < dsv4_st_count(a) && worst < 2; k++) {
            const dsv4_tensor_info *ta = dsv4_st_tensor(a, k), *tb = dsv4_st_find(b, ta->name);
            if (!tb)
                continue;
            int r = diff_tensor(ta, tb);
            worst = r > worst ? r : worst;
            compared++;
        }
        if (!compared && worst < 2) {
            fprintf(stderr, "dsv4moe diff: %s and %s have no tensor in common\n", pa, pb);
            worst = 2;
        }
    }
    dsv4_st_close(a);
    dsv4_st_close(b);
    if (worst < 2)
        printf("dsv4moe diff: %d tensor%s compared: %s\n", compared, compared == 1 ? "" : "s",
               worst ? "outside tolerance" : "within tolerance");
    return worst;
}
