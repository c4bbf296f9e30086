/*
 * Fuzz target: the case.json reader of `dsv4moe check` (compare/engines.c, through
 * dsv4_check_engine). The input is written as the case.json of one case folder, sealed with the
 * export's manifest (dsv4_h_manifest_write), and checked against an empty outputs folder: the
 * call must succeed with one case in error or fail with a message, never crash or read without
 * bound.
 */
#include "tests/fuzz/fuzz_common.h"

#include "dsv4moe_harness/engines.h"
#include "compare/engines_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char dir[512], p[700], out[600];
    snprintf(dir, sizeof dir, "%s/casejson", fuzz_dir());
    snprintf(out, sizeof out, "%s/casejson-out", fuzz_dir());
    mkdir(dir, 0700);
    mkdir(out, 0700);
    snprintf(p, sizeof p, "%s/c0", dir);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/c0/case.json", dir);
    if (fuzz_write(p, data, size) != 0)
        return 0;
    dsv4_error err;
    dsv4_error_clear(&err);
    if (dsv4_h_manifest_write(dir, &err) != DSV4_OK)
        return 0;
    dsv4_run_results *res = NULL;
    dsv4_status st = dsv4_check_engine(dir, out, NULL, &res, &err);
    if (st != DSV4_OK && (res || err.message[0] == '\0'))
        abort();
    if (st == DSV4_OK && dsv4_run_count(res) != 1)
        abort();
    dsv4_run_results_free(res);
    return 0;
}
